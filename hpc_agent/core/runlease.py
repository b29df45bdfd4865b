"""The run-directory lease: at most one live attempt trains in a run directory.

Two attempts training in one run directory (a duplicate resubmission, a requeue racing a resubmission,
a person running ``submit`` twice by hand) would write the same checkpoints and TensorBoard files and
corrupt each other. So global rank 0 of every attempt takes ``<run dir>/train.lease``
(:func:`hpc_agent.core.rundir.lease_path`) before it trains, renews its heartbeat while it trains, and
releases it when it ends.

What to do about a lease found there (take it, take it over, watch it, refuse) is decided by the pure rules
in :mod:`hpc_agent.core.lease_rules`; this module reads and writes the file and keeps the heartbeat.

NFS: a new lease is published exclusively (:func:`hpc_agent.core.nfs_files.publish_exclusive`). A stale lease is
taken over by renaming it aside (only one taker can move a given file), checking that what was moved is what
was judged, publishing ours exclusively, and re-reading to confirm we won. A ``flock`` on the run directory
serialises takers where the file system supports it; where it does not (NFS without a lock daemon),
link/rename still decide. No torch here: ``launch/train.py`` calls it.
"""
from __future__ import annotations

import fcntl
import os
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional

from hpc_agent.core.filemodes import make_dir
from hpc_agent.core.fsutil import pid_alive
from hpc_agent.core.lease_rules import (LOCAL_PREFIX, REFUSE, TAKE, TAKEOVER, UNKNOWN_JOB, WAIT, Holder,
                                        LeaseWaitCancelled, RunDirBusy, Verdict, judge, me_from_env, settings_from_env,
                                        stale_after_s)
from hpc_agent.core.nfs_files import DirectoryLock, move_aside_if_matching, publish_exclusive

LEASE_MAX_BYTES = 64 << 10


def read_holder(path: Path) -> Optional[Holder]:
    """The lease in ``path``: None when there is none; a placeholder holder (job ``?``, heartbeat = the file's
    mtime) when the file is not a valid lease (half written by an O_EXCL publisher, a link, garbage)."""
    from hpc_agent.core.rundir import UnsafeFile, read_bounded

    try:
        data = read_bounded(path, LEASE_MAX_BYTES)
    except FileNotFoundError:
        return None
    except (UnsafeFile, OSError):
        data = b""
    holder = Holder.from_json(data.decode("utf-8", errors="replace")) if data else None
    if holder is not None:
        return holder
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    return Holder(job_id=UNKNOWN_JOB, attempt=0, host="?", pid=0, heartbeat=info.st_mtime, started=info.st_mtime,
                  token=f"unreadable:{info.st_ino}:{info.st_mtime_ns}:{info.st_size}")


def move_aside_if(path: Path, expected: tuple[str, float], tag: str) -> bool:
    """Atomically take ``path`` out of the way if it still holds the lease observed as ``expected``
    ((token, heartbeat)). Only one of several concurrent callers can move a given file."""
    def still_judged(aside: Path) -> bool:
        moved = read_holder(aside)
        return moved is not None and moved.observed() == expected

    return move_aside_if_matching(path, still_judged, tag)


class RunLease:
    """The lease of one run directory for this process: :meth:`acquire`, then :meth:`start_heartbeat`,
    :meth:`release` at the end (``with lease.held(): ...`` does all three)."""

    def __init__(self, path: Path, me: Optional[Holder] = None, *, heartbeat_s: Optional[float] = None,
                 stale_s: Optional[float] = None, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 pid_alive: Callable[[int], bool] = pid_alive, flock: Callable = fcntl.flock,
                 log: Callable[[str], None] = lambda line: None):
        env_heartbeat, env_stale = settings_from_env()
        self.path = Path(path)
        self.heartbeat_s = heartbeat_s or env_heartbeat
        self.stale_s = stale_s or (stale_after_s(self.heartbeat_s) if heartbeat_s else env_stale)
        self.clock, self.monotonic, self.sleep, self.pid_alive, self.flock = clock, monotonic, sleep, pid_alive, flock
        self.me = me or me_from_env(now=clock())
        self.log = log
        self.poll_s = max(0.2, min(self.heartbeat_s / 3.0, 5.0))
        self.held = False
        self.lost_to: Optional[Holder] = None
        self.lock_note = ""
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._io = threading.Lock()

    # ---- take ----------------------------------------------------------------------------------------
    def acquire(self, cancelled: Callable[[], bool] = lambda: False) -> Verdict:
        """Take the lease (waiting at most about one staleness period for a holder to show it is alive);
        the verdict says how. Raises :class:`RunDirBusy` when a live attempt of another job holds it."""
        make_dir(self.path.parent)
        seen: object = _NOTHING  # what the previous read found: (token, heartbeat), None, or nothing yet
        began = watch_start = self.monotonic()
        renewal_seen = False
        while True:
            with DirectoryLock(self.path.parent, self.flock) as lock:
                if lock.note and not self.lock_note:
                    self.lock_note = lock.note
                    self.log(f"run lease: {lock.note}")
                current = read_holder(self.path)
                observed = current.observed() if current is not None else None
                if seen is not _NOTHING and observed != seen:
                    renewal_seen = current is not None  # it was renewed or taken while we watched
                    watch_start = self.monotonic()
                seen = observed
                now = self.clock()
                # Only for a holder outside Slurm on this host (a local run killed with SIGKILL): a job's pid may
                # live in a container's pid namespace, invisible from here, so for Slurm jobs only the heartbeat counts.
                alive = (self.pid_alive(current.pid)
                         if current is not None and current.host == self.me.host
                         and current.job_id.startswith(LOCAL_PREFIX) else None)
                verdict = judge(current, self.me, now, self.stale_s, holder_alive=alive, renewal_seen=renewal_seen,
                                watched_s=self.monotonic() - watch_start)
                if verdict.action == REFUSE:
                    raise RunDirBusy(self.path, verdict, self.monotonic() - began, self.stale_s, now)
                if verdict.action in (TAKE, TAKEOVER) and self._take(current):
                    self.held = True
                    return verdict
            if cancelled():
                raise LeaseWaitCancelled(verdict.reason)
            # WAIT: look again later. A lost race (someone else published first, or the lease changed under
            # us) looks again almost at once: the next read judges the winner.
            self.sleep(self.poll_s if verdict.action == WAIT else min(self.poll_s, 0.05))

    def _record(self) -> Holder:
        now = self.clock()
        self.me = replace(self.me, heartbeat=now)
        return self.me

    def _take(self, current: Optional[Holder]) -> bool:
        if current is not None and current.token == self.me.token:
            return True
        tag = self.me.token[:12]
        if current is not None and not move_aside_if(self.path, current.observed(), tag):
            return False
        if not publish_exclusive(self.path, self._record().to_json(), tag):
            return False
        confirmed = read_holder(self.path)  # re-read: on NFS only what the server now holds counts
        return confirmed is not None and confirmed.token == self.me.token

    # ---- keep ----------------------------------------------------------------------------------------
    def renew(self) -> bool:
        """Stamp a new heartbeat; False (and ``lost_to`` set) when the lease is no longer ours."""
        from hpc_agent.core.fsutil import atomic_write_text

        with self._io:
            if not self.held:
                return False
            current = read_holder(self.path)
            if current is None or current.token != self.me.token:
                self.held, self.lost_to = False, current
                return False
            atomic_write_text(self.path, self._record().to_json())
            return True

    def start_heartbeat(self, on_lost: Optional[Callable[[Optional[Holder]], None]] = None) -> None:
        """Renew every ``heartbeat_s`` in a daemon thread until :meth:`release` (or the lease is lost)."""
        def loop() -> None:
            while not self._stop.wait(self.heartbeat_s):
                try:
                    if not self.renew():
                        if on_lost is not None:
                            on_lost(self.lost_to)
                        return
                except OSError as exc:  # a hiccup of the file system: try again next beat
                    self.log(f"run lease: heartbeat not written ({exc}); retrying in {self.heartbeat_s:g} s")

        self._stop.clear()
        self._thread = threading.Thread(target=loop, name="hpc-agent-run-lease", daemon=True)
        self._thread.start()

    # ---- give back -----------------------------------------------------------------------------------
    def release(self) -> bool:
        """Stop the heartbeat and remove the lease if it is still ours; True if we removed it."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        with self._io:
            if not self.held:
                return False
            self.held = False
            current = read_holder(self.path)
            if current is None or current.token != self.me.token:
                return False
            return move_aside_if(self.path, current.observed(), self.me.token[:12] + ".release")


_NOTHING = object()

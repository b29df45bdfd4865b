"""The rank's heartbeat thread and its stack-dump signal (format: ``hpc_agent.core.heartbeat_format``; judge:
``hpc_agent.diagnosis.hang``).

A daemon thread rewrites ``heartbeat/rank-R.json`` atomically every ``interval_s``. The main thread only
assigns attributes (a phase change, a step done: one tuple each), so a main thread stuck in a sleep, a
collective or a lock shows as a beat whose ``written_at`` advances while ``step_at`` does not; a process
frozen with the GIL held shows as a beat whose ``written_at`` stops. ``start()`` also registers
faulthandler on ``STACK_SIGNAL`` (SIGURG), so the watcher can ask every rank for its Python stacks; the
dumps go to ``stacks/rank-R.txt`` (written by faulthandler's C handler, which needs no GIL).

Nothing here may fail the training: a write that fails is logged once and retried at the next beat.
"""
from __future__ import annotations

import faulthandler
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import IO, Mapping, Optional, Tuple

from hpc_agent.core import rundir
from hpc_agent.core.filemodes import make_dir, open_created
from hpc_agent.core.fsutil import atomic_write_text
from hpc_agent.core.heartbeat_format import PHASES, RECENT_STEPS, STACK_SIGNAL, STACK_SIGNAL_NAME, Beat, encode
from hpc_agent.core.lease_rules import LOCAL_PREFIX, job_identity

DEFAULT_INTERVAL_S = 5.0  # resilience.heartbeat_s's default, used until the config is loaded
FINAL_WRITE_WAIT_S = 1.0  # stop() waits at most this for a write in flight (a dead file system must not hold the exit)


def rank_and_world(environ: Mapping[str, str] = os.environ) -> Tuple[int, int]:
    """This process's rank and world from the environment alone (before torch or the config are loaded):
    submitit's local executor, Slurm, then torchrun variables; 0/1 when none is set."""
    for rank_var, world_var in (("SUBMITIT_LOCAL_GLOBALID", "SUBMITIT_LOCAL_NTASKS"), ("SLURM_PROCID", "SLURM_NTASKS"),
                                ("RANK", "WORLD_SIZE")):
        rank, world = environ.get(rank_var, ""), environ.get(world_var, "")
        if rank.isdigit() and world.isdigit() and int(rank) < int(world):
            return int(rank), int(world)
    return 0, 1


class Heartbeat:
    """One rank's heartbeat. Main-thread calls (``phase``, ``stepped``, ``resumed_at``) are attribute writes."""

    def __init__(self, run_dir: Path, rank: int, world: int, interval_s: float = DEFAULT_INTERVAL_S,
                 environ: Mapping[str, str] = os.environ):
        self.run_dir, self.rank, self.world = Path(run_dir), int(rank), int(world)
        self.interval_s = float(interval_s)
        job, attempt = job_identity(environ)
        # Every rank of a job must name the same job (the judge groups ranks by it): no pid in it.
        local = environ.get("SUBMITIT_LOCAL_JOB_ID", "")
        self.job_id = job or (f"{LOCAL_PREFIX}{local}" if local else "local")
        self.attempt = attempt
        self.host = environ.get("SLURMD_NODENAME") or socket.gethostname()
        now = time.time()
        self.started_at = now
        self._phase: Tuple[str, float] = ("starting", now)
        self._progress: Tuple[int, Optional[float], int, Tuple[float, ...]] = (0, None, 0, ())  # step, at, start, recent
        self._lock = threading.Lock()  # one write at a time; the final beat is the last one
        self._wake = threading.Event()
        self._stopped = False
        self._thread: Optional[threading.Thread] = None
        self._stack_file: Optional[IO[str]] = None
        self._complained: set = set()  # what was logged already: each failure once

    # --- main thread: cheap ------------------------------------------------------------------------------
    def phase(self, name: str) -> None:
        if name not in PHASES:
            raise ValueError(f"unknown heartbeat phase {name!r}; one of {', '.join(PHASES)}")
        if name != self._phase[0]:
            self._phase = (name, time.time())

    def stepped(self, step: int, seconds: float) -> None:
        """Optimizer step ``step`` completed, taking ``seconds``."""
        _, _, start, recent = self._progress
        self._progress = (int(step), time.time(), start, recent[-(RECENT_STEPS - 1):] + (float(seconds),))
        if self._phase[0] != "training":
            self._phase = ("training", time.time())

    def resumed_at(self, step: int) -> None:
        """This attempt (re)starts training from ``step``. After steps already done in this process (an
        in-job restart), the start-up budget starts again too."""
        if self._progress[1] is not None:
            self.started_at = time.time()
        self._progress = (int(step), None, int(step), ())

    def set_interval(self, seconds: float) -> None:
        """``resilience.heartbeat_s`` once the config is loaded (the default until then)."""
        shorter = float(seconds) < self.interval_s
        self.interval_s = float(seconds)
        if shorter:
            self._wake.set()  # the thread sleeps on the old interval: write now, then follow the new one

    @property
    def step(self) -> int:
        return self._progress[0]

    # --- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> "Heartbeat":
        self._open_stacks()
        self._thread = threading.Thread(target=self._loop, name="hpc-agent-heartbeat", daemon=True)
        self._thread.start()
        return self

    def stop(self, final_phase: Optional[str] = "done") -> None:
        """The final beat (none when ``final_phase`` is None), then no more; unregisters the stack dump.
        Never waits long: exit paths call it."""
        if final_phase in PHASES:
            self._phase = (final_phase, time.time())
        self._wake.set()
        if self._lock.acquire(timeout=FINAL_WRITE_WAIT_S):
            try:
                if not self._stopped:
                    self._stopped = True
                    if final_phase is not None:
                        self._write()
            finally:
                self._lock.release()
        self._stopped = True
        self._close_stacks()

    def beat(self) -> Beat:
        phase, since = self._phase
        step, step_at, start, recent = self._progress
        return Beat(job_id=self.job_id, attempt=self.attempt, rank=self.rank, world=self.world, host=self.host,
                    pid=os.getpid(), phase=phase, phase_since=since, step=step, step_at=step_at, start_step=start,
                    recent_step_s=tuple(s for s in recent if 0.0 <= s <= 1e7),  # no NaN: it would spoil every beat
                    started_at=self.started_at, written_at=time.time(),
                    interval_s=self.interval_s)

    # --- writer thread -----------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stopped:
            with self._lock:
                if self._stopped:
                    return
                self._write()
            self._wake.wait(max(0.01, self.interval_s))
            self._wake.clear()  # set by stop() (then _stopped ends the loop) or by a shorter interval

    def _write(self) -> None:
        try:
            atomic_write_text(rundir.heartbeat_path(self.run_dir, self.rank), encode(self.beat()).decode())
        except Exception as exc:  # noqa: BLE001 - a heartbeat must never fail the training
            self._complain("write", f"cannot write heartbeat {rundir.heartbeat_path(self.run_dir, self.rank)}: {exc}")

    def _open_stacks(self) -> None:
        path = rundir.stack_path(self.run_dir, self.rank)
        try:
            make_dir(path.parent)
            handle = os.fdopen(open_created(path, os.O_WRONLY | os.O_TRUNC | os.O_APPEND), "w")
            handle.write(f"# job {self.job_id} attempt {self.attempt} rank {self.rank} host {self.host} "
                         f"pid {os.getpid()}\n")
            handle.flush()
            # chain=False: SIGURG's default action is to ignore it; the file object must stay open.
            faulthandler.register(STACK_SIGNAL, file=handle, all_threads=True, chain=False)
            _unregister_in_forked_children()
            self._stack_file = handle
        except Exception as exc:  # noqa: BLE001
            self._complain("stacks", f"no stack dumps on SIG{STACK_SIGNAL_NAME}: {path}: {exc}")

    def _close_stacks(self) -> None:
        handle, self._stack_file = self._stack_file, None
        if handle is not None:
            try:
                faulthandler.unregister(STACK_SIGNAL)
                handle.close()
            except Exception:  # noqa: BLE001
                pass

    def _complain(self, what: str, text: str) -> None:
        if what not in self._complained:
            self._complained.add(what)
            print(f"[hpc_agent] {text} (said once; training goes on)", file=sys.stderr, flush=True)


_fork_hook = False


def _unregister_in_forked_children() -> None:
    """A forked child (a data-loader worker) inherits the registration and the file: its dump would
    interleave with its parent's. It gets SIGURG's default action (ignore) instead."""
    global _fork_hook
    if not _fork_hook and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=lambda: faulthandler.unregister(STACK_SIGNAL))
        _fork_hook = True


class _Off:
    """What :func:`current` gives where no heartbeat runs (unit tests building a Trainer directly)."""

    def phase(self, name: str) -> None:
        pass

    def stepped(self, step: int, seconds: float) -> None:
        pass

    def resumed_at(self, step: int) -> None:
        pass

    def set_interval(self, seconds: float) -> None:
        pass


_active: Optional[Heartbeat] = None


def start(run_dir: Path, environ: Mapping[str, str] = os.environ) -> Heartbeat:
    """Start this process's heartbeat (rank and world from the environment) and make it :func:`current`."""
    global _active
    rank, world = rank_and_world(environ)
    _active = Heartbeat(run_dir, rank, world, DEFAULT_INTERVAL_S, environ).start()
    return _active


def current():
    """The running heartbeat, or a no-op one: engine code calls ``current().phase(...)`` unconditionally."""
    return _active if _active is not None and not _active._stopped else _Off()


def stop(final_phase: Optional[str] = "done") -> None:
    global _active
    if _active is not None:
        _active.stop(final_phase)
        _active = None

"""The rules of the run-directory lease (:mod:`hpc_agent.core.runlease`): who holds it, and what to do about it.

A lease file is JSON (:class:`Holder`): job id, attempt (``SLURM_RESTART_COUNT``), host, pid, heartbeat
time, and a token unique to this take. The rules (:func:`judge`, a pure function tested with a table):

- no lease, or our own -> take it;
- a lease of the *same* Slurm job id -> take it over: it is an earlier attempt of this job (requeued,
  restarted), and Slurm ended that attempt before it started this one;
- a heartbeat older than the staleness (:func:`stale_after_s`: max(3 x heartbeat interval, 60 s)), or a
  holder outside Slurm (``local-<host>-<pid>``) on this host whose pid is gone -> take it over;
- a fresh lease of a *different* job -> watch it. A renewal (or a new take) seen while watching proves
  a live holder: refuse (:class:`RunDirBusy`; ``launch/train.py`` exits with ``EXIT_RUN_DIR_BUSY``).
  No renewal for a whole staleness period (measured on our own monotonic clock, so a node whose clock
  runs ahead cannot keep a dead lease alive) -> take it over. A job that died without releasing (SIGKILL,
  node failure) therefore delays the next attempt by at most the staleness, and never stops it.

Settings: ``HPC_AGENT_LEASE_HEARTBEAT_S`` (default 15 s) and ``HPC_AGENT_LEASE_STALE_S`` (default
max(3 x heartbeat, 60 s)). No file I/O here: :mod:`hpc_agent.core.runlease` reads and writes the lease.
"""
from __future__ import annotations

import json
import os
import socket
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Mapping, Optional

from hpc_agent.core import json_safe

_LEASE_LIMITS = json_safe.Limits(max_depth=4, max_line_bytes=64 << 10)
"""A lease is one flat object (the job can write its run dir: bounded before it is parsed)."""

DEFAULT_HEARTBEAT_S = 15.0
MIN_STALE_S = 60.0
ENV_HEARTBEAT_S = "HPC_AGENT_LEASE_HEARTBEAT_S"
ENV_STALE_S = "HPC_AGENT_LEASE_STALE_S"

TAKE, TAKEOVER, WAIT, REFUSE = "take", "takeover", "wait", "refuse"
UNKNOWN_JOB = "?"
LOCAL_PREFIX = "local-"  # the job id of a process outside Slurm: local-<host>-<pid>


def stale_after_s(heartbeat_s: float, override: Optional[float] = None) -> float:
    """How old a heartbeat may be before its lease is free: ``override`` if set, else max(3 x interval, 60 s)."""
    if override is not None and override > 0:
        return float(override)
    return max(3.0 * heartbeat_s, MIN_STALE_S)


def settings_from_env(environ: Mapping[str, str] = os.environ) -> tuple[float, float]:
    """(heartbeat interval, staleness) in seconds from the environment, with the defaults."""
    def number(name: str) -> Optional[float]:
        try:
            value = float(environ.get(name, "") or "nan")
        except ValueError:
            return None
        return value if value == value and value > 0 else None

    heartbeat = number(ENV_HEARTBEAT_S) or DEFAULT_HEARTBEAT_S
    return heartbeat, stale_after_s(heartbeat, number(ENV_STALE_S))


def job_identity(environ: Mapping[str, str] = os.environ) -> tuple[Optional[str], int]:
    """This job's id (``<array>_<index>`` for an array task, as scontrol names it) and its restart count
    (``SLURM_RESTART_COUNT``: unset on the first run, 1, 2, ... after requeues). None outside Slurm."""
    array, task = environ.get("SLURM_ARRAY_JOB_ID"), environ.get("SLURM_ARRAY_TASK_ID")
    job = f"{array}_{task}" if array and task else (environ.get("SLURM_JOB_ID") or None)
    try:
        attempt = int(environ.get("SLURM_RESTART_COUNT") or 0)
    except ValueError:
        attempt = 0
    return job, attempt


@dataclass(frozen=True)
class Holder:
    """What a lease file says (``job_id`` ``"?"`` and ``token`` ``""`` for a file that is not a valid lease)."""
    job_id: str
    attempt: int
    host: str
    pid: int
    heartbeat: float
    """Wall-clock time (``time.time()`` of the holder's node) of the last renewal."""
    started: float
    token: str

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Optional["Holder"]:
        try:
            data, problem = json_safe.loads_object(text, _LEASE_LIMITS)
            if problem:
                return None
            return cls(job_id=str(data["job_id"]), attempt=int(data.get("attempt", 0)), host=str(data["host"]),
                       pid=int(data["pid"]), heartbeat=float(data["heartbeat"]),
                       started=float(data.get("started", data["heartbeat"])), token=str(data["token"]))
        except (ValueError, TypeError, KeyError, AttributeError):
            return None

    def describe(self, now: float) -> str:
        return (f"job {self.job_id} (attempt {self.attempt}) on {self.host} pid {self.pid}, "
                f"heartbeat {max(0.0, now - self.heartbeat):.0f} s ago")

    def observed(self) -> tuple[str, float]:
        return self.token, self.heartbeat


def me_from_env(environ: Mapping[str, str] = os.environ, now: Optional[float] = None,
                host: Optional[str] = None, pid: Optional[int] = None) -> Holder:
    """The lease this process would hold. Outside Slurm the job id is ``local-<host>-<pid>``."""
    job, attempt = job_identity(environ)
    host = host or environ.get("SLURMD_NODENAME") or socket.gethostname()
    pid = os.getpid() if pid is None else pid
    now = time.time() if now is None else now
    return Holder(job_id=job or f"{LOCAL_PREFIX}{host}-{pid}", attempt=attempt, host=host, pid=pid, heartbeat=now,
                  started=now, token=uuid.uuid4().hex)


@dataclass(frozen=True)
class Verdict:
    action: str
    """TAKE, TAKEOVER, WAIT or REFUSE."""
    reason: str
    holder: Optional[Holder] = None
    age_s: Optional[float] = None


def judge(current: Optional[Holder], me: Holder, now: float, stale_s: float, *,
          holder_alive: Optional[bool] = None, renewal_seen: bool = False, watched_s: float = 0.0) -> Verdict:
    """What to do about the lease ``current`` (None: no lease file).

    ``holder_alive``: whether the holder's pid exists, when it runs on this host (None: cannot tell);
    ``renewal_seen``: the lease changed while we watched it (a renewal or a new take: a live holder);
    ``watched_s``: how long we have watched it unchanged, on our own monotonic clock."""
    if current is None:
        return Verdict(TAKE, "no lease")
    age = now - current.heartbeat
    if current.token == me.token:
        return Verdict(TAKE, "the lease is already ours", current, age)
    if current.job_id == me.job_id:
        return Verdict(TAKEOVER, f"held by an earlier attempt of this job ({current.job_id} attempt "
                                 f"{current.attempt}, now attempt {me.attempt}): Slurm ended it before starting this one",
                       current, age)
    if age > stale_s:
        return Verdict(TAKEOVER, f"stale: heartbeat {age:.0f} s old (stale after {stale_s:.0f} s)", current, age)
    if holder_alive is False:
        return Verdict(TAKEOVER, f"holder pid {current.pid} on this host ({current.host}) no longer exists",
                       current, age)
    if renewal_seen:
        return Verdict(REFUSE, f"held by live {current.describe(now)}", current, age)
    if watched_s >= stale_s:
        return Verdict(TAKEOVER, f"no renewal in {watched_s:.0f} s of watching (stale after {stale_s:.0f} s; "
                                 f"its heartbeat stamp reads {age:.0f} s old: clock skew?)", current, age)
    return Verdict(WAIT, f"held by {current.describe(now)}: watching for a renewal", current, age)


class RunDirBusy(RuntimeError):
    """Another live attempt holds the run directory."""

    def __init__(self, path: Path, verdict: Verdict, watched_s: float, stale_s: float, now: float):
        self.path, self.verdict, self.watched_s, self.stale_s = Path(path), verdict, watched_s, stale_s
        holder = verdict.holder
        assert holder is not None
        self.holder = holder
        self.line = (f"run directory busy: {self.path} is held by {holder.describe(now)} (renewed while this "
                     f"attempt watched for {watched_s:.0f} s), so this attempt does not train: two attempts would "
                     f"write the same checkpoints. If job {holder.job_id} should not run, scancel it; this run "
                     f"continues in it. A lease whose holder died frees itself {stale_s:.0f} s after its last "
                     f"heartbeat")
        super().__init__(self.line)


class LeaseWaitCancelled(RuntimeError):
    """``cancelled()`` turned true (a signal) while watching another holder's lease."""


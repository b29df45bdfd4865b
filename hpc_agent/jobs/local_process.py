"""What the machine says about a local-executor job (``submit --executor local``): is its process alive, and what
did its result files say. The I/O half of :mod:`hpc_agent.diagnosis.local_job`, which judges the facts.

The job id the ledger records for a local job is the pid of submitit's controller (``python -m
submitit.local._local <run dir>/slurm``, or the shell that runs the setup lines before it), on the machine
``submit`` ran on. A pid is reused once its process is gone, so a live pid counts as this job only when its
command line names the job's ``slurm/`` folder (Linux ``/proc``); where there is no ``/proc`` the check is
``os.kill(pid, 0)`` and the report says so. Nothing here signals, waits on or changes a process.

Result files are job-written pickles: each is read bounded, regular files only, no link followed below the run
directory, and by its opcodes alone (``hpc_agent.core.pickle_scan``): never unpickled.
"""
from __future__ import annotations

import datetime as _dt
import os
import socket
from pathlib import Path
from typing import Optional, Sequence, Tuple

from hpc_agent.core import rundir
from hpc_agent.core.pickle_scan import result_tag
from hpc_agent.core.rundir import LogText
from hpc_agent.diagnosis.local_job import LocalFacts, host_of

PROC = Path("/proc")
CMDLINE_MAX_BYTES = 64 << 10


def _proc_read(path: Path) -> Optional[bytes]:
    """A ``/proc`` file, bounded; None when the process is gone (or the file cannot be read)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        return os.read(fd, CMDLINE_MAX_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)


def process_alive(pid: str, marker: str, proc: Path = PROC) -> Tuple[Optional[bool], str]:
    """``(alive, how it was judged)``: True only for a live, non-zombie process whose command line contains
    ``marker`` (the job's ``slurm/`` folder) where ``/proc`` exists; None when it cannot be told."""
    if not pid.isdigit() or int(pid) <= 1:
        return None, f"{pid!r} is not a process id"
    if proc.is_dir():
        stat = _proc_read(proc / pid / "stat")
        if stat is None:
            return False, f"no process {pid} on this host"
        state = stat.rpartition(b")")[2].split()[:1]
        if state == [b"Z"]:
            return False, f"process {pid} has exited (a zombie its parent has not reaped yet)"
        cmdline = _proc_read(proc / pid / "cmdline") or b""
        if marker.encode() in cmdline:
            return True, f"process {pid} is alive (its command line names {marker})"
        return False, f"process {pid} is gone: the id now belongs to another program"
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False, f"no process {pid} on this host (os.kill({pid}, 0))"
    except PermissionError:
        return False, f"process {pid} belongs to another user: the job's process is gone (its id was reused)"
    except OSError as exc:
        return None, f"process {pid} not checked: {exc}"
    return True, f"a process {pid} is alive (os.kill({pid}, 0); no /proc here to check it is the job's)"


def result_tags(run_dir: Path, pid: str, ranks: Sequence[int]) -> Tuple[Tuple[int, str], ...]:
    """``(rank, first string)`` of each rank's result file that exists; ``""`` for one that cannot be read
    (a link, a FIFO, too big, not a pickle)."""
    found = []
    for rank in ranks:
        path = rundir.result_path(run_dir, pid, rank)
        try:
            os.lstat(path)
        except OSError:
            continue
        found.append((rank, result_tag(path, within=run_dir) or ""))
    return tuple(found)


def local_facts(run_dir: Path, pid: str, logs: Sequence[LogText], ranks: Sequence[int],
                submitted_at: Optional[float] = None) -> LocalFacts:
    """The facts about local job ``pid`` of the run in ``run_dir`` (``logs``: its logs, already read)."""
    here = socket.gethostname()
    host = host_of(logs, pid)
    if host is not None and host.split(".")[0] != here.split(".")[0]:
        alive: Optional[bool] = None
        how = f"it ran on {host}, not on this host ({here}): whether process {pid} is alive cannot be checked here"
    else:
        alive, how = process_alive(pid, str(rundir.slurm_dir(run_dir)))
    when = _dt.datetime.fromtimestamp(submitted_at).isoformat(timespec="seconds") if submitted_at else ""
    return LocalFacts(pid, alive, how, result_tags(run_dir, pid, ranks or (0,)), when)

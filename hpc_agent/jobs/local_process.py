"""What the machine says about a local-executor job (``submit --executor local``): is its process alive, and what
did its result files say. The I/O half of :mod:`hpc_agent.diagnosis.local_job`, which judges the facts.

The job id the ledger records for a local job is the pid of submitit's controller (``python -m
submitit.local._local <run dir>/slurm``, or the shell that runs the setup lines before it), on the machine
``submit`` ran on. A pid is reused once its process is gone, so a live pid counts as this job only when its
command line names the job's ``slurm/`` folder (Linux ``/proc``); where there is no ``/proc`` the check is
``os.kill(pid, 0)`` and the report says so.

The watcher follows a local job from here too (:func:`observe_local`: its one attempt, as sacct would show it),
and carries out a cancel or a stack request by signalling the job's processes (:func:`signal_job`): the ledger's
pid and its descendants, each only while its command line names the job's ``slurm/`` folder. Not the process
group: submitit starts the job in the group of the command that submitted it (``submit --wait``, a sweep), which
a group signal would hit too.

Result files are job-written pickles: each is read bounded, regular files only, no link followed below the run
directory, and by its opcodes alone (``hpc_agent.core.pickle_scan``): never unpickled.
"""
from __future__ import annotations

import datetime as _dt
import os
import socket
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from hpc_agent.core import rundir
from hpc_agent.core.pickle_scan import result_tag
from hpc_agent.core.read_caps import DEFAULT_CAPS, ReadCaps
from hpc_agent.core.rundir import LogText
from hpc_agent.diagnosis.local_job import LocalFacts, host_of, local_attempt, local_state
from hpc_agent.slurm.sacct import Attempt

PROC = Path("/proc")
CMDLINE_MAX_BYTES = 64 << 10
TAIL_BYTES = 256 * 1024  # the log tail read for the exit line (what the watcher reads of a Slurm job's log)
MAX_PROCESSES = 100_000  # /proc entries looked at when walking a job's process tree


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


def marker_of(run_dir: Path) -> str:
    """What a local job's processes carry on their command line: the run's ``slurm/`` folder."""
    return str(rundir.slurm_dir(Path(run_dir)))


def ended_at(run_dir: Path, pid: str, ranks: Sequence[int]) -> Optional[float]:
    """When local job ``pid`` ended: the newest mtime of its result files and logs (one ``lstat`` each, regular
    files only); None without any."""
    times = []
    for rank in ranks or (0,):
        for path in (rundir.result_path(run_dir, pid, rank), rundir.log_paths(run_dir, pid, rank + 1)[rank]):
            try:
                info = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                times.append(info.st_mtime)
    return max(times) if times else None


@dataclass(frozen=True)
class LocalObservation:
    """A local job seen by the watcher: its attempt (None while its state is unknown), whether that attempt is
    final (the process is gone: nothing it wrote changes any more) and the lines its state rests on."""

    attempt: Optional[Attempt]
    final: bool
    basis: Tuple[str, ...] = ()


def observe_local(run_dir: Path, pid: str, started_at: Optional[float],
                  caps: ReadCaps = DEFAULT_CAPS) -> LocalObservation:
    """Local job ``pid`` of the run in ``run_dir`` as one sacct-like attempt. A live process costs two small
    ``/proc`` reads; only a process found gone has its result files and log tails read (bounded), once."""
    here = socket.gethostname()
    alive, how = process_alive(pid, marker_of(run_dir))
    if alive:
        facts = LocalFacts(pid, True, how)
        state, code, basis = local_state(facts, ())
        return LocalObservation(local_attempt(pid, state, code, started_at, None, here), False, tuple(basis))
    logs: List[LogText] = []
    choice = rundir.find_logs(run_dir, pid, caps=caps)
    for _, got in rundir.tail_logs(choice.paths, TAIL_BYTES, caps, within=run_dir):
        if isinstance(got, LogText):
            logs.append(got)
    ranks = sorted({rank for log in logs if (rank := rundir.rank_of(Path(log.name))) is not None}) or [0]
    facts = local_facts(run_dir, pid, logs, ranks, started_at)
    state, code, basis = local_state(facts, logs)
    host = host_of(logs, pid) or here
    attempt = local_attempt(pid, state, code, started_at, ended_at(run_dir, pid, ranks), host)
    return LocalObservation(attempt, facts.alive is False and attempt is not None, tuple(basis))


def _parents(proc: Path) -> Dict[int, List[int]]:
    """parent pid -> child pids, from ``/proc/*/stat`` (bounded: :data:`MAX_PROCESSES` entries)."""
    children: Dict[int, List[int]] = {}
    try:
        entries = os.scandir(proc)
    except OSError:
        return children
    with entries:
        for n, entry in enumerate(entries):
            if n >= MAX_PROCESSES:
                break
            if not entry.name.isdigit():
                continue
            text = _proc_read(proc / entry.name / "stat")
            if text is None:
                continue
            fields = text.rpartition(b")")[2].split()
            if len(fields) >= 2 and fields[1].isdigit():
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    return children


def job_processes(pid: str, marker: str, proc: Path = PROC) -> List[int]:
    """The live processes of local job ``pid``: it and its descendants whose command line names ``marker``
    (the shell running the setup lines, submitit's controller, each rank), parents first. [] when ``pid`` is
    not the job's (gone, reused by another program) or there is no ``/proc``."""
    if not pid.isdigit() or int(pid) <= 1 or process_alive(pid, marker, proc)[0] is not True or not proc.is_dir():
        return []
    tree = _parents(proc)
    found, todo = [], [int(pid)]
    while todo and len(found) < MAX_PROCESSES:
        current = todo.pop(0)
        cmdline = _proc_read(proc / str(current) / "cmdline") or b""
        if marker.encode() not in cmdline:
            continue  # not the job's (a helper the rank started is signalled by the rank, not by us)
        found.append(current)
        todo.extend(sorted(tree.get(current, ())))
    return found


def signal_job(run_dir: Path, pid: str, sig: int, proc: Path = PROC) -> List[int]:
    """Send ``sig`` to each process of local job ``pid`` (:func:`job_processes`); returns the pids signalled.
    A process that ended meanwhile is skipped."""
    sent = []
    for target in job_processes(pid, marker_of(run_dir), proc):
        try:
            os.kill(target, sig)
        except OSError:
            continue
        sent.append(target)
    return sent


def find_job(run_dir: Path, proc: Path = PROC) -> Optional[str]:
    """The pid of a live local job of this run that the ledger may not know (its submitter died between starting
    it and recording it): the first process whose command line names the run's ``slurm/`` folder and whose
    parent's does not, and that runs submitit. None without one, or without ``/proc``."""
    marker = marker_of(run_dir).encode()
    tree = _parents(proc)
    parent_of = {child: parent for parent, kids in tree.items() for child in kids}
    tops = []
    for pid in sorted(parent_of):
        cmdline = _proc_read(proc / str(pid) / "cmdline") or b""
        if marker in cmdline and b"submitit" in cmdline and \
                marker not in (_proc_read(proc / str(parent_of[pid]) / "cmdline") or b""):
            tops.append(pid)
    return str(tops[0]) if tops else None

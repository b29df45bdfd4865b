"""The run directory: every path and file name in it, and the only safe way to read what a job wrote.

Layout (one home for it; nothing else spells these names)::

    <runs root>/<run id>/
        config.yaml          the config the next attempt trains with (rewritten by a resubmission)
        config.<n>.yaml      the config of submission n (history)
        run.json             job ids, log paths, TensorBoard dir (for people and `review`)
        events.jsonl         the audit trail, written from the ledger's effect journal
        train.lease          which job trains in this directory now (job id, heartbeat)
        tb/                  TensorBoard event files
        checkpoints/         DeepSpeed checkpoints, one folder per step
        slurm/               submitit's logs: <job id>_<rank>_log.out / .err; its result files
                             <job id>_<rank>_result.pkl (read by opcode only: hpc_agent.core.pickle_scan)
        heartbeat/           rank-RRRRR.json: each rank's latest beat (step, phase, times; hpc_agent.core.heartbeat_format)
        stacks/              rank-RRRRR.txt: a header line, then each Python stack dump asked for with SIGURG
        journal/in_job.jsonl the job's own repairs (in-job recovery), one JSON line each
        deepspeed/           ds_config.<job id>.<attempt>.json: the DeepSpeed config of each command-mode
                             attempt (train.command; launch/command.py), as $HPC_AGENT_DS_CONFIG
        code/                the snapshot of your code taken at submit (hpc_agent.jobs.code_snapshot), with
                             MANIFEST.json; first on the job's PYTHONPATH in every attempt
        lib/                 a container job only: hpc_agent's job-side packages (hpc_agent, launch, submitit,
                             cloudpickle) copied at each submission, with MANIFEST.json; on the container's
                             PYTHONPATH instead of the host's site-packages (hpc_agent.jobs.container_lib)
        sbatch_templates/    <name>.yaml: a copy of the project's own template that submit used, so every
                             resubmission uses it too (only for a non-shipped one; hpc_agent.core.paths)

A job can write anything into its run directory, and a user can replace a file by a FIFO or by a link
to ``/dev/zero``. So files here are read as untrusted input: regular files only (``O_NOFOLLOW``,
``S_ISREG``), opened non-blocking (a FIFO never blocks the reader), and never more than a byte cap.
``O_NOFOLLOW`` guards only the last part of a path, so a reader given ``within`` (the run dir) opens its
file one component at a time from there, ``O_NOFOLLOW`` at each (``hpc_agent.core.fsutil.open_beneath``): a
``journal/`` or ``heartbeat/`` that is a link to another run's is refused, not followed. JSON read from here
is parsed by ``hpc_agent.core.json_safe`` (:func:`read_json`, :func:`read_json_lines`): depth and size
capped, a named problem instead of an exception. Folder walks (``slurm/``, ``tb/``, ``checkpoints/``) are
checked by their readers (:func:`find_logs`, ``metrics.tb_reader``, ``checkpoint_format.scan``), which skip
or refuse a link, saying so.
What hpc_agent writes here is created ``0600``/``0700`` (see ``hpc_agent.core.filemodes``).
"""
from __future__ import annotations

import errno
import fnmatch
import heapq
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from hpc_agent.core import heartbeat_format, json_safe
from hpc_agent.core.fsutil import LinkInPath, open_beneath
from hpc_agent.core.read_caps import DEFAULT_CAPS, ReadCaps, over_cap

CONFIG = "config.yaml"
PAUSE_FILE = "watch.paused"
"""In the runs root (each run dir's parent): the kill switch (``hpc_agent.state.killswitch``). Any entry at that
name pauses, even a dangling link. The watcher, submit, the sweep and the job's batch shell all look for it."""
RUN_JSON = "run.json"
EVENTS = "events.jsonl"
LEASE = "train.lease"
TB = "tb"
CHECKPOINTS = "checkpoints"
SLURM = "slurm"
DEEPSPEED = "deepspeed"
HEARTBEAT = "heartbeat"
STACKS = "stacks"
CODE = "code"
CODE_MANIFEST = "MANIFEST.json"
LIB = "lib"
MARKERS = (CONFIG, RUN_JSON, TB, EVENTS)  # any one of them makes a folder a run directory

CONFIG_MAX_BYTES = 4 << 20   # a resolved config is a few KiB; anything near this is not one
JSON_MAX_BYTES = 16 << 20
STACKS_TAIL_BYTES = 64 << 10  # the newest dumps; a dump of a few dozen threads is a few KiB
MAX_RANK_FILES = 4096         # heartbeat/stack files read per run (more ranks than any job here has)


class UnsafeFile(OSError):
    """A run-directory file that must not be read: a link, a FIFO, a device, or too big to be what it claims."""


def config_path(run_dir: Path) -> Path:
    return Path(run_dir) / CONFIG


def config_history_path(run_dir: Path, n: int) -> Path:
    return Path(run_dir) / f"config.{n}.yaml"


def run_json_path(run_dir: Path) -> Path:
    return Path(run_dir) / RUN_JSON


def events_path(run_dir: Path) -> Path:
    return Path(run_dir) / EVENTS


def lease_path(run_dir: Path) -> Path:
    return Path(run_dir) / LEASE


def tb_dir(run_dir: Path) -> Path:
    return Path(run_dir) / TB


def checkpoints_dir(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINTS


def slurm_dir(run_dir: Path) -> Path:
    return Path(run_dir) / SLURM


def code_dir(run_dir: Path) -> Path:
    return Path(run_dir) / CODE


def lib_dir(run_dir: Path) -> Path:
    return Path(run_dir) / LIB


def ds_config_path(run_dir: Path, job_id: str, attempt: int) -> Path:
    """The DeepSpeed config a command-mode attempt hands its script (one file per attempt: the watcher's
    repairs change it between attempts, and each attempt's stays to compare)."""
    return Path(run_dir) / DEEPSPEED / f"ds_config.{job_id}.{int(attempt)}.json"


def heartbeat_dir(run_dir: Path) -> Path:
    return Path(run_dir) / HEARTBEAT


def heartbeat_path(run_dir: Path, rank: int) -> Path:
    return heartbeat_dir(run_dir) / f"rank-{int(rank):05d}.json"


def stacks_dir(run_dir: Path) -> Path:
    return Path(run_dir) / STACKS


def stack_path(run_dir: Path, rank: int) -> Path:
    return stacks_dir(run_dir) / f"rank-{int(rank):05d}.txt"


def in_job_journal_path(run_dir: Path) -> Path:
    """The job's own repairs, one JSON line each (written by launch/recovery.py, read by hpc_agent/core/in_job_journal.py)."""
    return Path(run_dir) / "journal" / "in_job.jsonl"


def is_run_dir(path: Path) -> bool:
    return any((Path(path) / name).exists() for name in MARKERS)


def log_paths(run_dir: Path, job_id: str, ranks: int) -> List[Path]:
    """Where submitit writes each rank's stdout for this job."""
    return [slurm_dir(run_dir) / f"{job_id}_{rank}_log.out" for rank in range(ranks)]


def result_path(run_dir: Path, job_id: str, rank: int) -> Path:
    """Where submitit writes a rank's result (``("success", value)`` or ``("error", traceback)``): a pickle the
    job writes, so it is never unpickled (:func:`hpc_agent.core.pickle_scan.result_tag`)."""
    return slurm_dir(run_dir) / f"{job_id}_{rank}_result.pkl"


def rank_of(path: Path) -> Optional[int]:
    """The rank in a submitit log's name (``<job>_<rank>_log.out``), or None for another name."""
    m = re.search(r"_(\d+)_log\.\w+$", Path(path).name)
    return int(m.group(1)) if m else None


def _rank_order(path: Path) -> Tuple[int, str]:
    rank = rank_of(path)
    return (rank if rank is not None else 1 << 30, path.name)


_LOG_SUFFIXES = ("_log.out", "_log.err")


@dataclass(frozen=True)
class LogChoice:
    """The logs :func:`find_logs` picked, by rank, and what was left out (``notes``: the caps it met)."""

    paths: Tuple[Path, ...]
    notes: Tuple[str, ...] = ()


def _newest_by_rank(found: List[Tuple[int, Path]], caps: ReadCaps) -> Tuple[List[Path], Tuple[str, ...]]:
    """The logs of the ``caps.rank_logs`` ranks whose newest file is newest (``found``: (mtime_ns, path))."""
    ranks: Dict[int, List[Tuple[int, Path]]] = {}
    for mtime, path in found:
        ranks.setdefault(_rank_order(path)[0], []).append((mtime, path))
    notes: Tuple[str, ...] = ()
    if len(ranks) > caps.rank_logs:
        kept = heapq.nlargest(caps.rank_logs, ranks, key=lambda r: (max(m for m, _ in ranks[r]), -r))
        picked = ", ".join(map(str, sorted(kept)))
        notes = (over_cap("rank_logs", caps.rank_logs, f"{len(ranks)} ranks have logs; read the newest "
                                                        f"{caps.rank_logs} by mtime (ranks {picked})"),)
        ranks = {r: ranks[r] for r in kept}
    return sorted((p for files in ranks.values() for _, p in files), key=_rank_order), notes


def _scan_logs(folder: Path, match: Callable[[str], bool], caps: ReadCaps) -> Tuple[List[Tuple[int, Path]], bool]:
    """(mtime_ns, path) of the entries of ``folder`` whose name ``match`` accepts, one ``lstat`` each, and
    whether the listing stopped at ``caps.listing`` entries."""
    found: List[Tuple[int, Path]] = []
    try:
        with os.scandir(folder) as entries:
            for seen, entry in enumerate(entries):
                if seen >= caps.listing:
                    return found, True
                if match(entry.name):
                    try:
                        found.append((entry.stat(follow_symlinks=False).st_mtime_ns, Path(entry.path)))
                    except OSError:
                        continue
    except OSError:
        pass
    return found, False


def find_logs(run_dir: Optional[Path], job_key: str, stdout_pattern: Optional[str] = None,
              caps: ReadCaps = DEFAULT_CAPS) -> LogChoice:
    """The job's logs: ``<run dir>/slurm/<jobid>_<rank>_log.out`` (submitit's layout), else the StdOut path.

    Within ``caps`` (hpc_agent/core/read_caps.py): at most ``caps.listing`` entries of the folder are looked at
    and the logs of the newest ``caps.rank_logs`` ranks by mtime are returned; what was left out is in
    :attr:`LogChoice.notes`. Links are not followed out of the run directory: a ``slurm/`` that is a link is
    returned itself (not searched), and a log that is a link is returned as found, so that the reader
    (:func:`tail_log`) refuses either with :class:`UnsafeFile` naming it."""
    found: List[Tuple[int, Path]] = []
    cut = False
    base = job_key.split("_")[0]
    if run_dir is not None:
        folder = slurm_dir(run_dir)
        if folder.is_symlink():
            return LogChoice((folder,))
        prefix = f"{job_key}_"  # submitit's <job>_<rank>_log.out / .err
        found, cut = _scan_logs(folder, lambda name: name.startswith(prefix) and name.endswith(_LOG_SUFFIXES), caps)
    if not found and stdout_pattern:
        # Slurm filename patterns: %j job id, %A array master id; %t task, %a array index etc. vary -> glob.
        pattern = stdout_pattern.replace("%j", base).replace("%A", base)
        pattern = re.sub(r"%\d*[a-zA-Z]", "*", pattern)
        parent = Path(pattern).parent
        glob = Path(pattern).name
        found, cut = (_scan_logs(parent, lambda name: fnmatch.fnmatchcase(name, glob), caps) if parent.is_dir()
                      else ([], False))
    paths, notes = _newest_by_rank(found, caps)
    if cut:
        notes += (over_cap("listing", caps.listing, f"the logs' folder has more entries; looked at the first "
                                                    f"{caps.listing}"),)
    return LogChoice(tuple(paths), notes)


def tail_logs(paths: Sequence[Path], tail_bytes: int, caps: ReadCaps = DEFAULT_CAPS, within: Optional[Path] = None
              ) -> Iterator[Tuple[Path, Union[LogText, OSError, str]]]:
    """Each log's tail (:func:`tail_log`, at most ``tail_bytes``; with ``within``, no link followed below that
    run dir), or the OSError that refused it, while the run's ``caps.run_bytes`` last; then, if logs were left
    unread, ``(path, note)`` once for the first of them."""
    left = caps.run_bytes
    for i, path in enumerate(paths):
        if left <= 0:
            yield path, over_cap("run_bytes", caps.run_bytes, f"{len(paths) - i} log(s) not read, the run's "
                                                              "log bytes are spent")
            return
        try:
            log = tail_log(path, min(tail_bytes, left), within)
        except OSError as exc:
            yield path, exc
            continue
        left -= min(tail_bytes, left)
        yield path, log


# --- bounded, regular-file-only reads -------------------------------------------------------------------
def _open_regular(path: Path, within: Optional[Path] = None) -> Tuple[int, int]:
    """An fd on ``path`` and its size, refusing links (O_NOFOLLOW; with ``within``, the run dir, at every
    component below it: :func:`hpc_agent.core.fsutil.open_beneath`), FIFOs (opened O_NONBLOCK, so the open
    itself never waits for a writer) and devices."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags) if within is None else open_beneath(within, path, flags)
    except LinkInPath as exc:
        raise UnsafeFile(exc.errno, exc.strerror) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeFile(exc.errno, f"{path} is a symbolic link; not following it") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeFile(errno.EINVAL, f"{path} is not a regular file ({_kind(info.st_mode)}); not reading it")
    except BaseException:
        os.close(fd)
        raise
    return fd, info.st_size


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


def read_bounded(path: Path, max_bytes: int, within: Optional[Path] = None) -> bytes:
    """The whole file, which must be a regular file of at most ``max_bytes`` (else :class:`UnsafeFile`).
    ``within``: the run dir ``path`` is in; no link is followed at any component below it."""
    fd, size = _open_regular(Path(path), within)
    try:
        if size > max_bytes:
            raise UnsafeFile(errno.EFBIG, f"{path} is {size} bytes, more than the {max_bytes} a {Path(path).name} "
                                          "can be; not reading it")
        data = os.read(fd, max_bytes + 1)
    finally:
        os.close(fd)
    if len(data) > max_bytes:  # grew between fstat and read
        raise UnsafeFile(errno.EFBIG, f"{path} grew past {max_bytes} bytes while being read")
    return data


def read_text(path: Path, max_bytes: int = CONFIG_MAX_BYTES, within: Optional[Path] = None) -> str:
    return read_bounded(path, max_bytes, within).decode("utf-8", errors="replace")


def read_tail(path: Path, max_bytes: int, within: Optional[Path] = None) -> Tuple[str, bool]:
    """The last ``max_bytes`` of a regular file as text, and whether it was cut (the file is longer).
    ``within``: the run dir ``path`` is in; no link is followed at any component below it."""
    fd, size = _open_regular(Path(path), within)
    try:
        start = max(0, size - max_bytes)
        data = os.pread(fd, max_bytes, start)
    finally:
        os.close(fd)
    text = data.decode("utf-8", errors="replace")
    if start > 0 and "\n" in text:
        text = text.split("\n", 1)[1]  # the first line was cut in the middle
    return text, start > 0


@dataclass(frozen=True)
class LogText:
    """The (tail of the) text of one log file; ``name`` is shown in evidence and may carry the rank."""

    name: str
    text: str
    line_numbers: Tuple[int, ...] = ()
    """File line number of each line of ``text`` when it is a piece of a longer log; empty: 1, 2, 3..."""
    truncated: bool = False
    """``text`` is a tail that does not start at the beginning of the file: the lines before its first
    attempt-start marker belong to an earlier attempt."""

    def numbered_lines(self) -> Iterator[Tuple[int, str]]:
        for i, line in enumerate(self.text.splitlines()):
            yield (self.line_numbers[i] if i < len(self.line_numbers) else i + 1), line


def tail_log(path: Path, max_bytes: int, within: Optional[Path] = None) -> LogText:
    """The last ``max_bytes`` of a log as a :class:`LogText` that knows whether it is cut."""
    text, cut = read_tail(path, max_bytes, within)
    return LogText(Path(path).name, text, truncated=cut)


# --- run.json ----------------------------------------------------------------------------------------
def submit_workdir(run_dir: Path) -> str:
    """Where a command-mode job runs its command, and a container job's working directory: the directory the
    first submit ran in, kept in ``run.json``
    (its one home: the watcher resubmits from wherever it runs); this directory before the first submit."""
    try:
        recorded = read_run_json(run_dir).get(WORKDIR)
    except (OSError, ValueError):
        recorded = None
    return recorded if isinstance(recorded, str) and recorded else os.getcwd()


WORKDIR = "workdir"
"""run.json's key for the directory the first submit ran in (:func:`submit_workdir`)."""


RUN_JSON_TYPES: Dict[str, Tuple[type, ...]] = {
    "run_id": (str,), "job_name": (str,), "executor": (str,), "job_ids": (list,), "config": (str,),
    "logs": (list,), "tensorboard": (str,), "updated_at": (str,), "submitted_at": (str,), WORKDIR: (str,),
    "code_snapshot": (dict, str),
}
"""run.json's keys and the types they may hold (a job can rewrite the file: anything else is a problem)."""


def run_json_problem(info: Any) -> Optional[str]:
    """What is wrong with a parsed run.json (a type a key must not have), or None. Pure."""
    if not isinstance(info, dict):
        return f"holds {type(info).__name__}, not an object"
    for key, types in RUN_JSON_TYPES.items():
        if key in info and not isinstance(info[key], types):
            return f"{key} is {type(info[key]).__name__}, not {' or '.join(t.__name__ for t in types)}"
    for key in ("job_ids", "logs"):
        if any(not isinstance(v, str) for v in info.get(key, [])):
            return f"{key} holds something that is not a string"
    return None


def read_json(path: Path, max_bytes: int = JSON_MAX_BYTES, within: Optional[Path] = None,
              limits: json_safe.Limits = json_safe.DEFAULT) -> Tuple[Dict[str, Any], Optional[str]]:
    """A JSON object a job or another user may have written: ``(object, None)``, ``({}, None)`` when the
    file does not exist, or ``({}, problem)`` naming the path. Bounded (bytes, depth), regular file only,
    no link followed below ``within``. Never raises."""
    try:
        data = read_bounded(path, max_bytes, within)
    except FileNotFoundError:
        return {}, None
    except OSError as exc:
        return {}, f"{path}: {exc.strerror or exc}"
    info, problem = json_safe.loads_object(data, json_safe.Limits(**{**limits.__dict__, "max_line_bytes": max_bytes}))
    return info, (f"{path}: {problem}" if problem else None)


def read_json_lines(path: Path, max_bytes: int = JSON_MAX_BYTES, within: Optional[Path] = None,
                    limits: json_safe.Limits = json_safe.DEFAULT, complete_only: bool = False
                    ) -> Tuple[List[Any], List[str]]:
    """The JSON values of the last ``max_bytes`` of a JSON-lines file (``events.jsonl``, the in-job journal),
    and one problem per line that is not JSON within ``limits`` (or one for a file that cannot be read:
    a link, a FIFO). ``([], [])`` when it does not exist. Never raises."""
    try:
        text, _ = read_tail(path, max_bytes, within)
    except FileNotFoundError:
        return [], []
    except OSError as exc:
        return [], [f"{path}: {exc.strerror or exc}"]
    except (MemoryError, ValueError) as exc:
        return [], [f"{path}: not read ({type(exc).__name__})"]
    values, problems = json_safe.parse_lines(text, limits, complete_only)
    return [v for _, v in values], problems


def read_run_json(run_dir: Path) -> Dict[str, Any]:
    """``run.json`` as a dict ({} if absent). The job can write its run dir, so: bounded (bytes, depth),
    regular file only, no link followed; ValueError naming the problem (not JSON, a key of the wrong type)."""
    path = run_json_path(run_dir)
    try:
        data = read_bounded(path, JSON_MAX_BYTES, within=Path(run_dir))  # UnsafeFile (an OSError): a link, a FIFO
    except FileNotFoundError:
        return {}
    info, problem = json_safe.loads_object(data, json_safe.Limits(max_line_bytes=JSON_MAX_BYTES))
    problem = problem or run_json_problem(info)
    if problem:
        raise ValueError(f"{path}: {problem}")
    return info


# --- what the live job says about itself ----------------------------------------------------------------
_RANK_NAME = {suffix: re.compile(r"rank-(\d{1,7})" + re.escape(suffix)) for suffix in (".json", ".txt")}
_FOLDER_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def _open_rank_folder(run_dir: Path, name: str) -> Optional[int]:
    """An fd on the folder ``name`` of the run dir (heartbeat/, stacks/), reached without following a link at
    any level; None when it cannot be."""
    try:  # what open_beneath does for one component, in one call: the run dir as given, no link at ``name``
        return os.open(os.path.join(os.fspath(run_dir), name), _FOLDER_FLAGS)
    except OSError:
        return None


def _rank_names(fd: int, suffix: str) -> List[Tuple[int, str]]:
    """``(rank, name)`` of the ``rank-RRRRR<suffix>`` entries of the folder open on ``fd``, by rank; at most
    MAX_RANK_FILES, and a folder stuffed with names is not read to its end."""
    found: List[Tuple[int, str]] = []
    match = _RANK_NAME[suffix].fullmatch
    try:
        with os.scandir(fd) as entries:
            for seen, entry in enumerate(entries):
                m = match(entry.name)
                if m:
                    found.append((int(m.group(1)), entry.name))
                if len(found) >= MAX_RANK_FILES or seen >= 4 * MAX_RANK_FILES:
                    break
    except OSError:
        return []
    return sorted(found)


def _rank_files(run_dir: Path, folder: Path, suffix: str) -> List[Tuple[int, Path]]:
    """``rank-RRRRR<suffix>`` files of a folder of the run dir that is not a link, by rank; at most
    MAX_RANK_FILES. The folder is opened from the run dir without following a link at any level."""
    fd = _open_rank_folder(run_dir, Path(folder).name)
    if fd is None:
        return []
    try:
        return [(rank, folder / name) for rank, name in _rank_names(fd, suffix)]
    finally:
        os.close(fd)


def _read_in(folder_fd: int, name: str, max_bytes: int) -> bytes:
    """A regular file of the open folder, of at most ``max_bytes`` (OSError otherwise): opened with O_NOFOLLOW
    (a link is refused) and O_NONBLOCK (a FIFO never blocks), checked with fstat, read once."""
    fd = os.open(name, _READ_FLAGS, dir_fd=folder_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > max_bytes:
            raise OSError(errno.EINVAL, f"{name}: not a regular file of at most {max_bytes} bytes")
        data = os.read(fd, max_bytes + 1)
    finally:
        os.close(fd)
    if len(data) > max_bytes:  # grew between fstat and read
        raise OSError(errno.EFBIG, f"{name} grew past {max_bytes} bytes while being read")
    return data


def read_heartbeats(run_dir: Path) -> List[heartbeat_format.Beat]:
    """Every rank's latest beat, by rank. Links (at any level below the run dir), non-regular, oversized
    and malformed files are skipped (a half-written beat cannot be seen: the job replaces the file atomically).
    The folder is opened once (no link followed from the run dir down) and each beat read from that fd: the
    watcher reads every running run's beats every tick, so this path is kept to a few system calls a file."""
    fd = _open_rank_folder(run_dir, HEARTBEAT)
    if fd is None:
        return []
    beats: List[heartbeat_format.Beat] = []
    try:
        for rank, name in _rank_names(fd, ".json"):
            try:
                beat = heartbeat_format.decode(_read_in(fd, name, heartbeat_format.MAX_BYTES))
            except (OSError, ValueError):
                continue
            if beat.rank == rank:  # a file copied to another rank's name says nothing about that rank
                beats.append(beat)
    finally:
        os.close(fd)
    return beats


def read_stacks(run_dir: Path) -> Dict[int, str]:
    """rank -> the last STACKS_TAIL_BYTES of its stack file (header line and faulthandler dumps)."""
    stacks: Dict[int, str] = {}
    for rank, path in _rank_files(Path(run_dir), stacks_dir(run_dir), ".txt"):
        try:
            stacks[rank] = read_tail(path, STACKS_TAIL_BYTES, Path(run_dir))[0]
        except OSError:
            continue
    return stacks

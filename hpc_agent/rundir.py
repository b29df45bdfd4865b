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
        slurm/               submitit's logs: <job id>_<rank>_log.out / .err

A job can write anything into its run directory, and a user can replace a file by a FIFO or by a link
to ``/dev/zero``. So files here are read as untrusted input: regular files only (``O_NOFOLLOW``,
``S_ISREG``), opened non-blocking (a FIFO never blocks the reader), and never more than a byte cap.
``O_NOFOLLOW`` guards only the last part of a path, so the folders a job could swap for a link to
elsewhere (``slurm/``, ``tb/``, ``checkpoints/`` and what is in them) are checked by their readers
(:func:`find_logs`, ``metrics.tb_reader``, ``checkpoints.scan``), which skip or refuse a link, saying so.
What hpc_agent writes here is created ``0600``/``0700`` (see ``hpc_agent.filemodes``).
"""
from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path
from typing import List, Optional, Tuple

from hpc_agent.diagnosis.logscan import LogText

CONFIG = "config.yaml"
RUN_JSON = "run.json"
EVENTS = "events.jsonl"
LEASE = "train.lease"
TB = "tb"
CHECKPOINTS = "checkpoints"
SLURM = "slurm"
MARKERS = (CONFIG, RUN_JSON, TB, EVENTS)  # any one of them makes a folder a run directory

CONFIG_MAX_BYTES = 4 << 20   # a resolved config is a few KiB; anything near this is not one
JSON_MAX_BYTES = 16 << 20


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


def is_run_dir(path: Path) -> bool:
    return any((Path(path) / name).exists() for name in MARKERS)


def log_paths(run_dir: Path, job_id: str, ranks: int) -> List[Path]:
    """Where submitit writes each rank's stdout for this job."""
    return [slurm_dir(run_dir) / f"{job_id}_{rank}_log.out" for rank in range(ranks)]


def _rank_order(path: Path) -> Tuple[int, str]:
    m = re.search(r"_(\d+)_log\.\w+$", path.name)
    return (int(m.group(1)) if m else 1 << 30, path.name)


def find_logs(run_dir: Optional[Path], job_key: str, stdout_pattern: Optional[str] = None) -> List[Path]:
    """The job's logs: ``<run dir>/slurm/<jobid>_<rank>_log.out`` (submitit's layout), else the StdOut path.

    Links are not followed out of the run directory: a ``slurm/`` that is a link is returned itself (not
    searched), and a log that is a link is returned as found, so that the reader (:func:`tail_log`)
    refuses either with :class:`UnsafeFile` naming it."""
    found: List[Path] = []
    base = job_key.split("_")[0]
    if run_dir is not None:
        folder = slurm_dir(run_dir)
        if folder.is_symlink():
            return [folder]
        found = sorted({*folder.glob(f"{job_key}_*_log.out"), *folder.glob(f"{job_key}_*_log.err")}, key=_rank_order)
    if not found and stdout_pattern:
        # Slurm filename patterns: %j job id, %A array master id; %t task, %a array index etc. vary -> glob.
        pattern = stdout_pattern.replace("%j", base).replace("%A", base)
        pattern = re.sub(r"%\d*[a-zA-Z]", "*", pattern)
        parent = Path(pattern).parent
        found = sorted(parent.glob(Path(pattern).name), key=_rank_order) if parent.is_dir() else []
    return found


# --- bounded, regular-file-only reads -------------------------------------------------------------------
def _open_regular(path: Path) -> Tuple[int, int]:
    """An fd on ``path`` and its size, refusing links (O_NOFOLLOW), FIFOs (opened O_NONBLOCK, so the open
    itself never waits for a writer) and devices."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
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


def read_bounded(path: Path, max_bytes: int) -> bytes:
    """The whole file, which must be a regular file of at most ``max_bytes`` (else :class:`UnsafeFile`)."""
    fd, size = _open_regular(Path(path))
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


def read_text(path: Path, max_bytes: int = CONFIG_MAX_BYTES) -> str:
    return read_bounded(path, max_bytes).decode("utf-8", errors="replace")


def read_tail(path: Path, max_bytes: int) -> Tuple[str, bool]:
    """The last ``max_bytes`` of a regular file as text, and whether it was cut (the file is longer)."""
    fd, size = _open_regular(Path(path))
    try:
        start = max(0, size - max_bytes)
        data = os.pread(fd, max_bytes, start)
    finally:
        os.close(fd)
    text = data.decode("utf-8", errors="replace")
    if start > 0 and "\n" in text:
        text = text.split("\n", 1)[1]  # the first line was cut in the middle
    return text, start > 0


def tail_log(path: Path, max_bytes: int) -> LogText:
    """The last ``max_bytes`` of a log as a :class:`LogText` that knows whether it is cut."""
    text, cut = read_tail(path, max_bytes)
    return LogText(Path(path).name, text, truncated=cut)


def load_config(run_dir: Path):
    """The run's ``config.yaml``, read bounded and regular-file-only, then validated like any snapshot."""
    from hpc_agent.config.load import load_snapshot_text

    return load_snapshot_text(read_text(config_path(run_dir)), source=str(config_path(run_dir)))

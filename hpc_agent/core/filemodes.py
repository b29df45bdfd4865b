"""Who may read what hpc_agent writes: least privilege, set explicitly (never left to the user's umask).

The rule, one home for it:

* A file is ``0600`` and a directory ``0700``: nobody but the owner reads the ledger, ``events.jsonl``,
  the leases, configs, logs or checkpoints.
* Where the owner chose to share with the group, a file is ``0640`` and a directory ``0750``. The choice
  is ``run.group_readable`` (config), applied when ``submit`` creates the runs root and the run directory.
  After that **the folder decides**: every writer (submit, the watcher, the job, the lease) gives a new
  file or sub-folder the group bits of the folder it is created in, so no process needs the config to
  get it right, and the watcher follows the runs root's own mode for the ledger and its locks.
* A folder is "shared with its group" only when its group may enter and read it and others may not
  (``g+rx``, ``o-rwx``: what hpc_agent makes, or a project directory such as ``2770``). A folder that
  others may enter (``0755``: a plain ``mkdir`` under umask 022) says nothing about sharing, so what is
  created in it stays private. Nothing hpc_agent creates is ever readable by others.

``mkdir(mode)`` and ``open(mode)`` are masked by the umask, so every creation here is followed by an
explicit ``chmod``/``fchmod``. Files that third-party code creates (submitit's pickles and logs, Slurm's
output files, TensorBoard's and DeepSpeed's files) get the same modes from :func:`restricted_umask`,
which the submitter holds around submitit (the local job inherits it, and ``sbatch`` hands it to the
Slurm job as ``SLURM_UMASK``); the job also sets its own files' modes where that is cheap.
"""
from __future__ import annotations

import os
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

PRIVATE_FILE, PRIVATE_DIR = 0o600, 0o700
GROUP_FILE, GROUP_DIR = 0o640, 0o750


# --- the rule (pure) -------------------------------------------------------------------------------------
def shared_with_group(dir_mode: int) -> bool:
    """Whether a folder of this mode is shared with its group alone (``g+rx`` and no bit for others)."""
    return dir_mode & 0o050 == 0o050 and dir_mode & 0o007 == 0


def file_mode(group: bool) -> int:
    return GROUP_FILE if group else PRIVATE_FILE


def dir_mode(group: bool) -> int:
    return GROUP_DIR if group else PRIVATE_DIR


def umask_for(group: bool) -> int:
    """The umask under which third-party code creates files of the right mode (077 or 027)."""
    return 0o027 if group else 0o077


# --- reading a folder's choice --------------------------------------------------------------------------
def group_of(folder: str | os.PathLike) -> bool:
    """Whether what is created in ``folder`` may be group-readable (False when it cannot be read)."""
    try:
        return shared_with_group(os.stat(folder).st_mode)
    except OSError:
        return False


def file_mode_in(folder: str | os.PathLike) -> int:
    return file_mode(group_of(folder))


# --- creating with the mode -----------------------------------------------------------------------------
def set_mode(target: int | str | os.PathLike, mode: int) -> None:
    """``fchmod``/``chmod`` to ``mode`` unless it is already that (a directory keeps its setgid bit, so a
    project directory's group still applies below it)."""
    info = os.fstat(target) if isinstance(target, int) else os.stat(target)
    wanted = mode | (info.st_mode & stat.S_ISGID if stat.S_ISDIR(info.st_mode) else 0)
    if stat.S_IMODE(info.st_mode) != wanted:
        (os.fchmod if isinstance(target, int) else os.chmod)(target, wanted)


def make_dir(path: str | os.PathLike, group: Optional[bool] = None, exist_ok: bool = True) -> Path:
    """Create ``path`` and its missing parents, each ``0700`` (``0750`` where ``group`` says so, or, when
    ``group`` is None, where the folder it is created in is shared with its group). Folders that exist
    already keep their mode: they are the user's."""
    path = Path(path)
    missing = []
    probe = path
    while not probe.exists() and not probe.is_symlink() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    if not missing:
        if not exist_ok:
            raise FileExistsError(f"{path} exists")
        if not path.is_dir():
            raise NotADirectoryError(f"{path} exists and is not a directory")
        return path
    for folder in reversed(missing):
        share = group if group is not None else group_of(folder.parent)
        try:
            os.mkdir(folder, dir_mode(share))
        except FileExistsError:  # made by someone else meanwhile: theirs, mode and all
            if folder == path and not exist_ok:
                raise
            continue
        set_mode(folder, dir_mode(share))  # mkdir's mode was masked by the umask
    return path


def open_created(path: str | os.PathLike, flags: int, mode: Optional[int] = None) -> int:
    """``os.open(path, flags | O_CREAT)`` with the mode the folder calls for (or ``mode``), set with
    ``fchmod`` so the umask cannot widen or narrow it. Links are never followed (``O_NOFOLLOW``)."""
    mode = file_mode_in(Path(path).parent) if mode is None else mode
    fd = os.open(path, flags | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0), mode)
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            set_mode(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextmanager
def restricted_umask(group: bool) -> Iterator[None]:
    """Hold the umask that gives third-party code's files our modes (see the module doc). The umask is
    per process: held only around a submission, and it never opens anything to others."""
    old = os.umask(umask_for(group))
    try:
        yield
    finally:
        os.umask(old)


# --- who else can write: the trust checks (docs/security.md) ---------------------------------------------
SHARED_ROOT_ENV = "HPC_AGENT_SHARED_RUNS_ROOT"
"""Set to 1 to opt a group-writable runs root in for ``watch`` (``submit`` takes ``run.group_readable: true``)."""


def others_may_write(mode: int) -> Optional[str]:
    """Who besides the owner may create, rename or delete entries in a folder of this mode (None: nobody)."""
    return "every user" if mode & 0o002 else "its group" if mode & 0o020 else None


def runs_root_problem(mode: int, opted_in: bool) -> Optional[str]:
    """Why a runs root of this mode may not be used, or None. A root others may write is refused unless
    its owner opted in to a group-shared root; even then one that every user may write, without the sticky
    bit, is refused (anyone could swap a run directory)."""
    who = others_may_write(mode)
    if who is None:
        return None
    sticky = bool(mode & stat.S_ISVTX)
    if opted_in and (who == "its group" or sticky):
        return None
    return (f"{who} can write it (mode {stat.S_IMODE(mode):04o}), so another user could rename a run directory and "
            f"plant files the watcher reads. Use a private runs root (chmod g-w,o-w), or, for a project directory "
            f"shared on purpose, opt in: run.group_readable: true for submit, {SHARED_ROOT_ENV}=1 (or "
            f"--shared-runs-root) for watch" + ("" if who == "its group" or sticky else
                                               "; a world-writable root also needs the sticky bit (chmod +t)"))


def check_runs_root(path: str | os.PathLike, opted_in: bool) -> Optional[str]:
    """:func:`runs_root_problem` of an existing folder (None when it does not exist yet: submit makes it 0700)."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    problem = runs_root_problem(info.st_mode, opted_in)
    return None if problem is None else f"runs root {path}: {problem}"


def owned_problem(info: os.stat_result, uid: int, what: str) -> Optional[str]:
    """Why a file or folder, by its ``lstat``, is not ours to trust: a link, another owner, or writable by
    others (None: it is ours alone to write)."""
    if stat.S_ISLNK(info.st_mode):
        return f"{what} is a symbolic link"
    if info.st_uid != uid:
        return f"{what} is owned by uid {info.st_uid}, not by this user (uid {uid})"
    if info.st_mode & 0o022:
        return f"{what} is writable by {'every user' if info.st_mode & 0o002 else 'its group'}"
    return None


def run_dir_problem(run_dir: str | os.PathLike) -> Optional[str]:
    """Why the watcher must not act in this run directory (None: it is this user's, and nobody else may
    write it). A directory renamed away and replaced by another user's, or a link to one, is caught here."""
    try:
        info = os.lstat(run_dir)
    except FileNotFoundError:
        return None  # gone: the readers say so
    except OSError as exc:
        return f"run directory {run_dir}: {exc.strerror or exc}"
    if not stat.S_ISDIR(info.st_mode) and not stat.S_ISLNK(info.st_mode):
        return f"run directory {run_dir} is not a directory"
    problem = owned_problem(info, os.geteuid(), f"run directory {run_dir}")
    return None if problem is None else problem + ": not followed (docs/security.md)"

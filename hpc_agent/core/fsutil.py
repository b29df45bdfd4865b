"""Crash-safe file writes (a reader sees the old file or the new one, never half of one), the
single-instance lock of the long-running commands, and what kind of file system a path is on (network
file systems need care: no SQLite WAL, ``flock`` may fail with ENOLCK)."""
from __future__ import annotations

import atexit
import errno
import fcntl
import json
import os
import socket
import sys
import tempfile
from pathlib import Path
from typing import IO, Any, List, Optional, Tuple

from hpc_agent.core.filemodes import file_mode_in, make_dir, open_created, set_mode


def fsync(path: str | os.PathLike) -> None:
    """Flush a file's or a folder's data to disk (a folder: the names created or renamed in it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write to a temp file in the same directory, fsync it, then ``os.replace`` it into place. The file
    gets the mode its folder calls for (``0600``, or ``0640`` in a group-shared folder: hpc_agent.core.filemodes)."""
    path = Path(path)
    make_dir(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        set_mode(fd, file_mode_in(path.parent))
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def atomic_write_json(path: str | os.PathLike, data: Any) -> Path:
    return atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


# flock errors that mean "this file system cannot lock" (NFS without a lock daemon: ENOLCK), not "held".
_NO_FLOCK = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS})


def hold_lock(path: str | os.PathLike) -> Optional[IO[str]]:
    """Take the exclusive lock on ``path`` without waiting and write our pid into it; the open file holds
    the lock until the process ends (the kernel drops it even after SIGKILL, so no stale lock). None when
    another process holds it.

    Where ``flock`` itself fails (ENOLCK: NFS mounted without a lock daemon) the lock is an exclusively
    created ``<path>.owner`` file holding ``pid host`` instead (see :func:`_hold_owner_file`), removed when
    the returned handle is closed or the process exits."""
    # "a+", not "w": that would empty the pid of the holder before we know we lost
    handle = os.fdopen(open_created(path, os.O_RDWR | os.O_APPEND), "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    except OSError as exc:
        if exc.errno not in _NO_FLOCK:
            handle.close()
            raise
        return _hold_owner_file(Path(path), handle, exc)
    _write_pid(handle)
    return handle


def _write_pid(handle: IO[str]) -> None:
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()


def owner_path(path: Path) -> Path:
    return Path(path).with_name(Path(path).name + ".owner")


class _OwnerFileLock:
    """The open lock file, whose ``close()`` also removes the ``.owner`` file that is the lock."""

    def __init__(self, handle: IO[str], owner: Path, text: str):
        self._handle, self._owner, self._text = handle, owner, text
        atexit.register(self.close)

    def close(self) -> None:
        try:
            if self._owner.read_text() == self._text:  # still ours
                self._owner.unlink()
        except OSError:
            pass
        self._handle.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)


def _hold_owner_file(path: Path, handle: IO[str], why: OSError) -> Optional[IO[str]]:
    """The lock without flock: ``<path>.owner`` created with O_CREAT|O_EXCL (atomic on NFS v3+) holding
    ``pid host``. A file left by a dead process of *this* host is removed and the take retried; one of
    another host cannot be checked, so it is reported (with the file to delete) and counts as held."""
    owner = owner_path(path)
    me = f"{os.getpid()} {socket.gethostname()}\n"
    for _ in range(3):
        try:
            fd = open_created(owner, os.O_WRONLY | os.O_EXCL)
        except FileExistsError:
            text = _read_small(owner)
            pid, _, host = text.strip().partition(" ")
            if host == socket.gethostname() and pid.isdigit() and not pid_alive(int(pid)):
                try:  # its holder died without closing (SIGKILL): take it aside, then try again
                    aside = owner.with_name(f"{owner.name}.{os.getpid()}.stale")
                    os.rename(owner, aside)
                    os.unlink(aside)
                except FileNotFoundError:
                    pass
                continue
            if host and host != socket.gethostname():
                print(f"hpc_agent: flock does not work on {path.parent} ({errno.errorcode.get(why.errno, why.errno)}: "
                      f"{filesystem_type(path.parent)} without a lock daemon?), so {owner} is the lock; it names "
                      f"pid {pid} on {host}, which cannot be checked from here: if that process is gone, delete "
                      f"{owner}", file=sys.stderr)
            handle.close()
            return None
        with os.fdopen(fd, "w") as out:
            out.write(me)
            out.flush()
            os.fsync(out.fileno())
        _write_pid(handle)
        return _OwnerFileLock(handle, owner, me)  # type: ignore[return-value]
    handle.close()
    return None


def _read_small(path: Path) -> str:
    try:
        with open(path, "r", errors="replace") as fh:
            return fh.read(4096)
    except OSError:
        return ""


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host (one home: locks and leases use it)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --- what file system a path is on ----------------------------------------------------------------------
NETWORK_FS = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph", "glusterfs", "afs", "panfs",
    "orangefs", "pvfs2", "wekafs", "9p", "vboxsf", "ocfs2", "gfs2", "davfs", "ncpfs", "coda",
})
"""File systems shared over the network (or by several hosts), where mmap'ed shared memory and byte-range
locks are missing or unreliable."""
LOCAL_FUSE = frozenset({"fuse.lxcfs", "fuse.fuse-overlayfs", "fuse.portal", "fuse.gvfsd-fuse"})


def _unescape(field: str) -> str:
    """Mount paths in /proc escape space, tab, newline and backslash as octal (``\\040``)."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 4 <= len(field) and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mounts(text: str) -> List[Tuple[str, str]]:
    """(mount point, fs type) per mount, in the order listed, from ``/proc/self/mountinfo`` or
    ``/proc/mounts`` text (the format is told per line). Lines that fit neither are skipped."""
    found: List[Tuple[str, str]] = []
    for line in text.splitlines():
        fields = line.split()
        if not fields:
            continue
        if fields[0].isdigit() and "-" in fields:  # mountinfo: id parent dev root point opts [tags] - type src
            sep = fields.index("-")
            if sep >= 6 and sep + 1 < len(fields) and fields[4].startswith("/"):
                found.append((_unescape(fields[4]), fields[sep + 1]))
        elif len(fields) >= 4 and fields[1].startswith("/"):  # /proc/mounts: source point type opts dump pass
            found.append((_unescape(fields[1]), fields[2]))
    return found


def fs_type_for(path: str, mounts: List[Tuple[str, str]]) -> str:
    """The fs type of the longest mount point that is ``path`` or a folder above it (the last listed wins
    among equals: a later mount covers an earlier one); ``"unknown"`` when none matches."""
    best, best_len = "unknown", -1
    path = "/" + path.strip("/") if path not in ("", "/") else "/"
    for point, fstype in mounts:
        point = "/" + point.strip("/") if point not in ("", "/") else "/"
        inside = point == "/" or path == point or path.startswith(point + "/")
        if inside and len(point) >= best_len:
            best, best_len = fstype, len(point)
    return best


def _existing(path: Path) -> Path:
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return Path(os.path.realpath(path))


def filesystem_type(path: str | os.PathLike, mountinfo: Optional[str] = None) -> str:
    """The file system type of ``path`` (``ext4``, ``nfs4``, ``lustre``, ...; the nearest existing folder
    for a path not created yet), from ``/proc/self/mountinfo`` (else ``/proc/mounts``); ``"unknown"`` where
    neither can be read (not Linux)."""
    if mountinfo is None:
        for source in ("/proc/self/mountinfo", "/proc/mounts"):
            try:
                mountinfo = Path(source).read_text(errors="replace")
                break
            except OSError:
                continue
        else:
            return "unknown"
    return fs_type_for(str(_existing(Path(path))), parse_mounts(mountinfo))


def is_network_type(fstype: str) -> bool:
    fstype = fstype.lower()
    return (fstype in NETWORK_FS or fstype.startswith("nfs")
            or (fstype.startswith("fuse.") and fstype not in LOCAL_FUSE))


def is_network_fs(path: str | os.PathLike, mountinfo: Optional[str] = None) -> bool:
    """Whether ``path`` is on a network (or cluster, or FUSE) file system: NFS, Lustre, GPFS, BeeGFS, CIFS, sshfs..."""
    return is_network_type(filesystem_type(path, mountinfo))


def sqlite_journal_mode(path: str | os.PathLike, mountinfo: Optional[str] = None) -> Tuple[str, str]:
    """The SQLite journal mode for a database at or under ``path`` and why: ``WAL`` on a local file system,
    ``DELETE`` on a network one (WAL's ``-shm`` index is shared memory through mmap, which NFS and friends
    do not share between hosts: readers on two nodes would corrupt it) or where the type cannot be told."""
    fstype = filesystem_type(path, mountinfo)
    if fstype == "unknown":
        return "DELETE", (f"cannot tell the file system of {path}: DELETE journal, which is safe everywhere "
                          "(WAL needs shared memory that network file systems do not provide)")
    if is_network_type(fstype):
        return "DELETE", (f"runs root is on {fstype}: SQLite WAL needs shared memory that network filesystems "
                          "do not provide")
    return "WAL", f"runs root is on local {fstype}: WAL lets readers go on while the watcher writes"


# --- opening a path inside a directory others can write, without following a link at any level -----------
class LinkInPath(OSError):
    """A component of a path below its root is a symbolic link (or not a directory where one is needed)."""


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def _parts_below(root: Path, path: Path) -> List[str]:
    """The components of ``path`` below ``root`` (``path`` relative to ``root``, or absolute under it)."""
    path = Path(path)
    if path.is_absolute():
        try:
            path = path.relative_to(root)
        except ValueError:
            raise LinkInPath(errno.EXDEV, f"{path} is not inside {root}") from None
    parts = [p for p in path.parts if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise LinkInPath(errno.EXDEV, f"{path} climbs out of {root} (..)")
    return parts


def open_beneath(root: str | os.PathLike, path: str | os.PathLike, flags: int = os.O_RDONLY) -> int:
    """An fd on ``path`` (relative to ``root``, or an absolute path under it), reached one component at a
    time from ``root`` with ``O_NOFOLLOW`` at every level (``openat``): a folder inside ``root`` that is a
    link to elsewhere (another run's ``journal/``) is refused with :class:`LinkInPath`, not followed.
    ``root`` itself is opened as given (the caller's trusted path: the ledger's run dir). ``flags`` apply to
    the last component, always with O_NOFOLLOW; the caller checks what kind of file it got."""
    root = Path(root)
    parts = _parts_below(root, Path(path))
    fd = os.open(root, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            try:
                nxt = os.open(part, (flags if last else os.O_RDONLY | _DIRECTORY) | _NOFOLLOW | _CLOEXEC, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR) or (exc.errno == errno.EMLINK and not last):
                    where = root.joinpath(*parts[:i + 1])
                    what = "a symbolic link" if last or exc.errno != errno.ENOTDIR else "a symbolic link or not a folder"
                    reading = "" if last else f" (reading {root.joinpath(*parts)})"
                    raise LinkInPath(exc.errno, f"{where} is {what}; not following it{reading}") from None
                raise
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise

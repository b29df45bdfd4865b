"""File primitives that stay correct on NFS, for claims that several hosts race for (the run lease).

Nothing here relies on ``flock`` alone. :func:`publish_exclusive` creates a file only if its name is free, by
writing a temp file and ``os.link``-ing it to the name (atomic on NFS; a reply lost to a retransmit is
recognised by the temp file's link count), or by ``O_CREAT|O_EXCL`` where hard links are not supported.
:func:`move_aside_if_matching` takes a file out of the way with ``os.rename`` (only one of several
concurrent callers can move a given file) and puts it back unless it is still what the caller judged.
:class:`DirectoryLock` is an advisory ``flock`` on a directory where the file system supports one;
``ENOLCK`` (NFS without a lock daemon) and friends only skip that extra guard.
"""
from __future__ import annotations

import errno
import fcntl
import os
import time
from pathlib import Path
from typing import Callable, Optional

from hpc_agent.core.filemodes import open_created

# flock errors that mean "this file system cannot lock", not "someone holds it".
NO_LOCK_ERRNOS = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EBADF, errno.EINVAL, errno.ENOSYS})
# os.link errors that mean "no hard links here": publish with O_CREAT|O_EXCL instead.
NO_LINK_ERRNOS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EMLINK})


def _write_new(path: Path, text: str, flags: int) -> None:
    """Open with ``flags`` (creating, with the folder's mode: hpc_agent.core.filemodes), write ``text``, fsync
    (the lease must be on disk before it counts)."""
    fd = open_created(path, os.O_WRONLY | flags)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_temp(path: Path, text: str, tag: str) -> Path:
    tmp = path.with_name(f".{path.name}.{tag}.tmp")
    _write_new(tmp, text, os.O_TRUNC)
    return tmp


def _create_exclusive(path: Path, text: str) -> bool:
    try:
        _write_new(path, text, os.O_EXCL)
    except FileExistsError:
        return False
    return True


def publish_exclusive(path: Path, text: str, tag: str, link: Callable[[str, str], None] = os.link) -> bool:
    """Create ``path`` holding ``text`` only if it does not exist: True if we created it."""
    tmp = _write_temp(path, text, tag)
    try:
        try:
            link(str(tmp), str(path))
            return True
        except FileExistsError:
            return False
        except OSError as exc:
            try:  # NFS: the link was made but its reply was lost and the retransmit answered EEXIST/other
                if os.stat(tmp).st_nlink == 2:
                    return True
            except OSError:
                pass
            if exc.errno in NO_LINK_ERRNOS:
                return _create_exclusive(path, text)
            raise
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass


def _restore(aside: Path, path: Path) -> None:
    """Put a file moved aside back under its name, unless something else already took the name."""
    try:
        os.link(aside, path)
    except FileExistsError:
        pass
    except OSError as exc:
        if exc.errno not in NO_LINK_ERRNOS:
            raise
        try:
            if not path.exists():
                os.rename(aside, path)
                return
        except OSError:
            pass
    try:
        os.unlink(aside)
    except FileNotFoundError:
        pass


def move_aside_if_matching(path: Path, matches: Callable[[Path], bool], tag: str) -> bool:
    """Atomically take ``path`` out of the way if ``matches`` says the moved file is still the one the caller
    judged. Only one of several concurrent callers can move a given file; a file that does not match is put
    back under its name (unless something else already took the name)."""
    aside = path.with_name(f".{path.name}.{tag}.aside")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return False
    if not matches(aside):
        _restore(aside, path)  # it changed since it was judged (renewed, or already taken over): not ours to remove
        return False
    os.unlink(aside)
    return True


class DirectoryLock:
    """An advisory flock on ``folder`` (the run directory, around judge-and-take) where the file system supports
    one; ``note`` says why it does not hold one (unsupported, or busy past ``timeout_s``)."""

    def __init__(self, folder: Path, flock: Callable = fcntl.flock, timeout_s: float = 10.0):
        self.folder, self.flock, self.timeout_s = folder, flock, timeout_s
        self.fd: Optional[int] = None
        self.note = ""

    def __enter__(self) -> "DirectoryLock":
        try:
            fd = os.open(self.folder, os.O_RDONLY)
        except OSError as exc:
            self.note = f"cannot open {self.folder} to lock it ({exc.strerror})"
            return self
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                self.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self.fd = fd
                return self
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    self.note = "directory lock busy; relying on link/rename"
                    break
                time.sleep(0.05)
            except OSError as exc:
                if exc.errno not in NO_LOCK_ERRNOS:
                    os.close(fd)
                    raise
                self.note = (f"flock unavailable here ({errno.errorcode.get(exc.errno, exc.errno)}: NFS without a "
                             "lock daemon?); relying on link/rename")
                break
        os.close(fd)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            try:
                self.flock(self.fd, fcntl.LOCK_UN)
            except OSError:
                pass
            os.close(self.fd)
            self.fd = None


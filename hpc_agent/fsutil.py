"""Crash-safe file writes (a reader sees the old file or the new one, never half of one) and the
single-instance lock of the long-running commands."""
from __future__ import annotations

import fcntl
import json
import os
import tempfile
from pathlib import Path
from typing import IO, Any, Optional


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write to a temp file in the same directory, fsync it, then ``os.replace`` it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
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


def hold_lock(path: str | os.PathLike) -> Optional[IO[str]]:
    """Take the exclusive lock on ``path`` without waiting and write our pid into it; the open file holds
    the lock until the process ends (the kernel drops it even after SIGKILL, so no stale lock). None when
    another process holds it."""
    handle = open(path, "a+")  # not "w": that would empty the pid of the holder before we know we lost
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle

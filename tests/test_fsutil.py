"""fsutil: atomic writes and the single-instance lock of watch and sweep."""
from __future__ import annotations

import os

from hpc_agent.fsutil import atomic_write_json, atomic_write_text, hold_lock


def test_hold_lock_is_exclusive_and_released_on_close(tmp_path):
    path = tmp_path / "watch.lock"
    first = hold_lock(path)
    assert first is not None and path.read_text() == f"{os.getpid()}\n"
    assert hold_lock(path) is None  # a second holder (another open file) is refused...
    assert path.read_text() == f"{os.getpid()}\n"  # ...without emptying the holder's pid
    first.close()
    again = hold_lock(path)
    assert again is not None
    again.close()


def test_atomic_writes_leave_no_temp_files(tmp_path):
    atomic_write_text(tmp_path / "a" / "x.txt", "hello")
    atomic_write_json(tmp_path / "a" / "y.json", {"k": 1})
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["x.txt", "y.json"]
    assert (tmp_path / "a" / "x.txt").read_text() == "hello"

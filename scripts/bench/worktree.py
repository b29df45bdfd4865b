"""A detached git worktree of another revision, for the benchmarks that compare this checkout with it in one run
(``login``, ``step_overhead``, ``snapshot``: ``--baseline REV``)."""
from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def worktree(rev: str, path: Path) -> Iterator[Path]:
    """A detached git worktree of ``rev`` at ``path`` (this checkout's history), removed at the end."""
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(path), rev],
                   check=True, capture_output=True, timeout=120)
    try:
        yield path
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(path)],
                       capture_output=True, timeout=120)

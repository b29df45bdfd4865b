"""What the login node needs to know about a run's checkpoints: which are complete, and rollback.

The checkpoint format (completion markers, verification) belongs to ``launch/checkpoint.py``; its
scanning and verification functions are plain Python (no torch), so the watcher reuses them instead
of keeping a second copy of the rules.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional

ASIDE = "set_aside"


def complete_steps(run_dir: Path) -> List[int]:
    """Steps of the checkpoints a resume could use, oldest first."""
    from launch.checkpoint import problem, scan

    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(c.step for c in scan(root) if problem(c) is None)


def set_aside_after(run_dir: Path, keep_step: Optional[int], before_step: Optional[int]) -> List[str]:
    """Roll back: move checkpoints newer than ``keep_step`` (or at/after ``before_step``) into
    ``checkpoints/set_aside/`` so the next attempt resumes from the older one. Nothing is deleted."""
    from launch.checkpoint import scan

    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    moved = []
    for cand in scan(root):
        too_new = (keep_step is not None and cand.step > keep_step) or (
            keep_step is None and before_step is not None and cand.step >= before_step)
        if too_new:
            target = root / ASIDE / cand.name
            target.parent.mkdir(exist_ok=True)
            os.replace(root / cand.name, target)
            moved.append(cand.name)
    return sorted(moved)

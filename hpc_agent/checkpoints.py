"""The checkpoint format's rules, shared by the job (``launch/checkpoint.py``, which writes checkpoints)
and the login node (watcher, review, chaos): completion markers, which checkpoint a resume may use,
retention, and the watcher's rollback. Plain Python, no torch.

Layout: ``<run_dir>/checkpoints/step_00000040/`` is one DeepSpeed checkpoint. It counts only when it
holds ``COMPLETE.json``, which rank 0 writes last, after every rank has written, fsynced and reported
its files (name and size). A checkpoint is usable when its marker parses, names the same step, and every
file it lists exists with the recorded size, so a truncated or missing shard or a missing marker makes
the resume fall back to the previous one (same-size corruption is not detected: hashing multi-GB shards
would cost more than it saves). The pure half (:func:`problem`, :func:`select`, :func:`retention`)
works on :class:`Candidate` records; :func:`scan` builds them from the disk.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from hpc_agent import rundir

ASIDE = "set_aside"
MARKER = "COMPLETE.json"
MARKER_VERSION = 1
_TAG_RE = re.compile(r"^step_(\d{8,})$")


def tag_for(step: int) -> str:
    return f"step_{step:08d}"


def step_of(name: str) -> Optional[int]:
    match = _TAG_RE.match(name)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class Candidate:
    """What is on disk for one checkpoint directory."""

    name: str
    step: int
    marker: Optional[Dict[str, Any]] = None
    """The parsed marker; None when there is none (or it could not be parsed: see marker_error)."""
    marker_error: Optional[str] = None
    sizes: Dict[str, int] = field(default_factory=dict)
    """Files actually present (relative path -> bytes), the marker excluded."""


@dataclass(frozen=True)
class Selection:
    chosen: Optional[Candidate]
    skipped: List[Tuple[str, str]]
    """(name, why) for every checkpoint newer than the chosen one, newest first."""

    def lines(self) -> List[str]:
        out = [f"skipping checkpoint {name}: {why}" for name, why in self.skipped]
        if self.chosen is not None:
            out.append(f"resuming from checkpoint {self.chosen.name} (step {self.chosen.step})")
        elif self.skipped:
            out.append("no usable checkpoint: starting from step 0")
        return out


def problem(c: Candidate) -> Optional[str]:
    """Why ``c`` cannot be resumed from, or None when it can."""
    if c.marker_error:
        return f"{MARKER} is unreadable ({c.marker_error})"
    if c.marker is None:
        return f"no {MARKER} (the save did not finish on every rank)"
    if c.marker.get("step") != c.step:
        return f"{MARKER} names step {c.marker.get('step')!r}, the directory step {c.step}"
    files = c.marker.get("files")
    if not isinstance(files, dict) or not files:
        return f"{MARKER} lists no files"
    for rel, size in sorted(files.items()):
        if rel not in c.sizes:
            return f"{rel} is missing"
        if c.sizes[rel] != size:
            return f"{rel} has {c.sizes[rel]} bytes, {MARKER} recorded {size} (truncated or rewritten)"
    return None


def select(candidates: Sequence[Candidate]) -> Selection:
    """The newest usable checkpoint, and the newer ones passed over with the reason."""
    skipped: List[Tuple[str, str]] = []
    for c in sorted(candidates, key=lambda c: c.step, reverse=True):
        why = problem(c)
        if why is None:
            return Selection(c, skipped)
        skipped.append((c.name, why))
    return Selection(None, skipped)


def retention(candidates: Sequence[Candidate], keep: int) -> List[str]:
    """Names to delete: complete ones beyond the newest ``keep`` (the newest is always kept), and
    incomplete ones older than the newest complete one (newer incomplete ones are left for a
    post-mortem; a later save of the same step replaces them)."""
    complete = sorted((c for c in candidates if problem(c) is None), key=lambda c: c.step)
    if not complete:
        return []
    newest = complete[-1].step
    doomed = [c.name for c in complete[:-max(1, keep)]]
    doomed += [c.name for c in candidates if problem(c) is not None and c.step < newest]
    return sorted(doomed, key=lambda n: step_of(n) or 0)


def files_of(directory: Path) -> Dict[str, int]:
    """Files of a checkpoint directory (relative path -> bytes), the marker and its temp files excluded."""
    out: Dict[str, int] = {}
    for path in directory.rglob("*"):
        if path.is_file() and path.name != MARKER and not path.name.startswith(f".{MARKER}."):
            out[path.relative_to(directory).as_posix()] = path.stat().st_size
    return out


def read_candidate(directory: Path) -> Optional[Candidate]:
    step = step_of(directory.name)
    if step is None or not directory.is_dir():
        return None
    marker, error = None, None
    marker_path = directory / MARKER
    if marker_path.exists():
        try:
            marker = json.loads(marker_path.read_text())
            if not isinstance(marker, dict):
                marker, error = None, "not a JSON object"
        except (OSError, ValueError) as exc:
            error = f"{exc.__class__.__name__}: {exc}"
    return Candidate(directory.name, step, marker, error, files_of(directory))


def scan(root: Path) -> List[Candidate]:
    if not root.is_dir():
        return []
    found = (read_candidate(p) for p in root.iterdir())
    return sorted((c for c in found if c is not None), key=lambda c: c.step)


def complete_steps(run_dir: Path) -> List[int]:
    """Steps of the checkpoints a resume could use, oldest first."""
    root = rundir.checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    return sorted(c.step for c in scan(root) if problem(c) is None)


def set_aside_after(run_dir: Path, keep_step: Optional[int], before_step: Optional[int]) -> List[str]:
    """Roll back: move checkpoints newer than ``keep_step`` (or at/after ``before_step``) into
    ``checkpoints/set_aside/`` so the next attempt resumes from the older one. Nothing is deleted."""
    root = rundir.checkpoints_dir(run_dir)
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

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

Snapshots (``launch/snapshot.py``, ``resilience.snapshot_every``) are written in the same layout and with
the same marker, asynchronously, as ``checkpoints/snap_00000042/``. A resume takes whichever usable one
has the highest step (a full checkpoint wins a tie); retention keeps only the newest complete snapshot,
and only while it is newer than the newest complete checkpoint.
"""
from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from hpc_agent.core import json_safe, rundir
from hpc_agent.core.filemodes import make_dir

ASIDE = "set_aside"
MARKER = "COMPLETE.json"
MARKER_VERSION = 1
SNAP_PREFIX = "snap_"
_TAG_RE = re.compile(r"^(?:step|snap)_(\d{8,})$")


def tag_for(step: int) -> str:
    return f"step_{step:08d}"


def snap_tag_for(step: int) -> str:
    return f"{SNAP_PREFIX}{step:08d}"


def step_of(name: str) -> Optional[int]:
    """The step of a checkpoint or snapshot directory name; None for anything else."""
    match = _TAG_RE.match(name)
    return int(match.group(1)) if match else None


def is_snapshot(name: str) -> bool:
    return name.startswith(SNAP_PREFIX)


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
    links: Tuple[str, ...] = ()
    """Symbolic links in it (or the directory itself, by its name, when it is one): never followed, since
    a job-planted link can point out of the run directory; a checkpoint holding one is not usable."""


@dataclass(frozen=True)
class Selection:
    chosen: Optional[Candidate]
    skipped: List[Tuple[str, str]]
    """(name, why) for every checkpoint newer than the chosen one, newest first."""

    def lines(self) -> List[str]:
        out = [f"skipping checkpoint {name}: {why}" for name, why in self.skipped]
        if self.chosen is not None:
            kind = "snapshot" if is_snapshot(self.chosen.name) else "checkpoint"
            out.append(f"resuming from {kind} {self.chosen.name} (step {self.chosen.step})")
        elif self.skipped:
            out.append("no usable checkpoint: starting from step 0")
        return out


def problem(c: Candidate) -> Optional[str]:
    """Why ``c`` cannot be resumed from, or None when it can."""
    if c.links:
        return f"{', '.join(c.links)}: symbolic link, not followed out of the run directory"
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
    """The newest usable checkpoint or snapshot (a checkpoint wins a tie), and the newer ones passed over
    with the reason."""
    skipped: List[Tuple[str, str]] = []
    for c in sorted(candidates, key=lambda c: (c.step, not is_snapshot(c.name)), reverse=True):
        why = problem(c)
        if why is None:
            return Selection(c, skipped)
        skipped.append((c.name, why))
    return Selection(None, skipped)


def retention(candidates: Sequence[Candidate], keep: int) -> List[str]:
    """Names to delete. Checkpoints: complete ones beyond the newest ``keep`` (the newest is always kept),
    and incomplete ones older than the newest complete one (newer incomplete ones are left for a
    post-mortem; a later save of the same step replaces them). Snapshots: every one but the newest
    complete snapshot, which goes too once a complete checkpoint of its step or later exists; incomplete
    ones newer than everything complete stay (one may be in flight)."""
    snaps = [c for c in candidates if is_snapshot(c.name)]
    ckpts = [c for c in candidates if not is_snapshot(c.name)]
    complete = sorted((c for c in ckpts if problem(c) is None), key=lambda c: c.step)
    doomed: List[str] = []
    if complete:
        doomed += [c.name for c in complete[:-max(1, keep)]]
        doomed += [c.name for c in ckpts if problem(c) is not None and c.step < complete[-1].step]
    newest_ckpt = complete[-1].step if complete else -1
    complete_snaps = sorted((c for c in snaps if problem(c) is None), key=lambda c: c.step)
    kept = complete_snaps[-1] if complete_snaps and complete_snaps[-1].step > newest_ckpt else None
    newest_any = max([newest_ckpt] + [c.step for c in complete_snaps])
    for c in snaps:
        if c is kept:
            continue
        if problem(c) is None or c.step < newest_any:
            doomed.append(c.name)
    return sorted(doomed, key=lambda n: (step_of(n) or 0, n))


def walk(directory: Path) -> Tuple[Dict[str, int], List[str]]:
    """Regular files under ``directory`` (relative path -> bytes) and the links met (relative paths), walked
    without following any link; the marker and its temp files excluded."""
    files: Dict[str, int] = {}
    links: List[str] = []
    for top, dirs, names in os.walk(directory):  # os.walk does not descend into links to folders
        for name in dirs + names:
            path = Path(top) / name
            rel = path.relative_to(directory).as_posix()
            try:
                info = os.lstat(path)
            except FileNotFoundError:  # deleted meanwhile: the job's retention runs while others scan
                continue
            if stat.S_ISLNK(info.st_mode):
                links.append(rel)
            elif stat.S_ISREG(info.st_mode) and name != MARKER and not name.startswith(f".{MARKER}."):
                files[rel] = info.st_size
    return files, sorted(links)


def files_of(directory: Path) -> Dict[str, int]:
    """Files of a checkpoint directory (relative path -> bytes), the marker and its temp files excluded;
    links are not files of it (:func:`walk`)."""
    return walk(directory)[0]


def read_candidate(directory: Path) -> Optional[Candidate]:
    step = step_of(directory.name)
    if step is None:
        return None
    if directory.is_symlink():  # a checkpoint "directory" pointing elsewhere: listed, never read
        return Candidate(directory.name, step, links=(directory.name,))
    if not directory.is_dir():
        return None
    marker, error = None, None
    marker_path = directory / MARKER
    if marker_path.exists() or marker_path.is_symlink():
        try:  # bounded, regular file only (a link is refused): the job writes this directory
            marker, problem = json_safe.loads_object(rundir.read_bounded(marker_path, rundir.JSON_MAX_BYTES))
            if problem:
                marker, error = None, problem
        except (OSError, ValueError) as exc:
            error = f"{exc.__class__.__name__}: {exc}"
    sizes, links = walk(directory)
    return Candidate(directory.name, step, marker, error, sizes, tuple(links))


def scan(root: Path) -> List[Candidate]:
    """The checkpoints under ``root``; :class:`hpc_agent.core.rundir.UnsafeFile` when ``root`` is a link (resuming
    from, or saving into, a folder outside the run directory is refused)."""
    if root.is_symlink():
        raise rundir.UnsafeFile(errno.ELOOP, f"{root} is a symbolic link; not following it out of the run directory")
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
    ``checkpoints/set_aside/`` so the next attempt resumes from the older one. Nothing is deleted: a second
    rollback past a step that was trained again (and saved under the same tag) keeps both, the later one
    as ``<tag>.2`` (``.3``, ...). Returns the tags moved."""
    root = rundir.checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    moved = []
    for cand in scan(root):
        too_new = (keep_step is not None and cand.step > keep_step) or (
            keep_step is None and before_step is not None and cand.step >= before_step)
        if too_new:
            make_dir(root / ASIDE)
            target, n = root / ASIDE / cand.name, 1
            while os.path.lexists(target):
                n += 1
                target = root / ASIDE / f"{cand.name}.{n}"
            os.replace(root / cand.name, target)
            moved.append(cand.name)
    return sorted(moved)

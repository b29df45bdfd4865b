"""Atomic checkpoints: completion markers, selection of the one to resume from, retention.

Layout: ``<run_dir>/checkpoints/step_00000040/`` is one DeepSpeed checkpoint (``engine.save_checkpoint``
with that tag: ``mp_rank_00_model_states.pt`` plus one ``*zero_pp_rank_<r>_*`` file per rank and
ZeRO stage). It counts only when it holds ``COMPLETE.json``, which rank 0 writes *last*, after every
rank has written, fsynced and reported its files (name and size). DeepSpeed's own ``latest`` file is
not written (``save_latest=False``) and never read: rank 0 writes it without waiting for the other
ranks, so after a crash it can name a torn checkpoint.

A checkpoint is usable when its marker parses, names the same step, and every file it lists exists
with the recorded size; so a truncated shard, a missing shard or a missing marker makes the resume
fall back to the previous checkpoint. (Same-size corruption is not detected: hashing multi-GB
shards would cost more than it saves.)

The pure half (:func:`problem`, :func:`select`, :func:`retention`) works on :class:`Candidate`
records; :func:`scan` builds them from the disk.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from hpc_agent.fsutil import atomic_write_json

MARKER = "COMPLETE.json"
MARKER_VERSION = 1
CONFIRM_WAIT_S = 10.0
"""How long rank 0 waits for other ranks' files to show up with their reported sizes."""
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


# ---- disk -------------------------------------------------------------------------------------

def _files(directory: Path) -> Dict[str, int]:
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
    return Candidate(directory.name, step, marker, error, _files(directory))


def scan(root: Path) -> List[Candidate]:
    if not root.is_dir():
        return []
    found = (read_candidate(p) for p in root.iterdir())
    return sorted((c for c in found if c is not None), key=lambda c: c.step)


def owned_by(name: str, rank: int) -> bool:
    """Whether DeepSpeed's file ``name`` is written by ``rank``: per-rank ZeRO files carry
    ``pp_rank_<r>_``; the rest (``mp_rank_00_model_states.pt``) come from rank 0."""
    match = re.search(r"pp_rank_(\d+)_", name)
    return int(match.group(1)) == rank if match else rank == 0


def fsync_own_files(tag_dir: Path, rank: int) -> Dict[str, int]:
    """Flush this rank's files to stable storage; returns them with their sizes."""
    mine = {}
    for rel, size in _files(tag_dir).items():
        if owned_by(Path(rel).name, rank):
            fd = os.open(tag_dir / rel, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            mine[rel] = size
    return mine


def _unconfirmed(tag_dir: Path, files: Dict[str, int]) -> Dict[str, Any]:
    """Reported files whose size rank 0 cannot confirm. Each is opened, not just stat()ed: on NFS an
    open revalidates cached attributes (close-to-open consistency) where a stat may not. Retried
    briefly, since another node's writes can take a moment to show."""
    deadline = time.monotonic() + CONFIRM_WAIT_S
    while True:
        lost: Dict[str, Any] = {}
        for rel, size in files.items():
            try:
                fd = os.open(tag_dir / rel, os.O_RDONLY)
                try:
                    seen = os.fstat(fd).st_size
                finally:
                    os.close(fd)
            except FileNotFoundError:
                seen = "missing"
            if seen != size:
                lost[rel] = f"{seen} bytes on disk, {size} reported" if seen != "missing" else "missing"
        if not lost or time.monotonic() > deadline:
            return lost
        time.sleep(0.5)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(engine: Any, root: Path, step: int, client_state: Dict[str, Any], layout: Dict[str, Any],
         rank: int, barrier: Callable[[], None], gather: Callable[[Any], List[Any]]) -> Tuple[str, float]:
    """Save a complete checkpoint of ``step`` from every rank; returns (tag, seconds)."""
    start = time.perf_counter()
    tag = tag_for(step)
    tag_dir = root / tag
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        if tag_dir.exists():  # torn leftover of an attempt that died while saving this step
            shutil.rmtree(tag_dir)
    barrier()
    engine.save_checkpoint(str(root), tag=tag, client_state=client_state, save_latest=False)
    reported = gather(fsync_own_files(tag_dir, rank))
    if rank == 0:
        files: Dict[str, int] = {}
        for part in reported:
            files.update(part)
        lost = _unconfirmed(tag_dir, files)
        if lost:  # shared file system out of sync: better no marker than a false one
            raise RuntimeError(f"checkpoint {tag}: files reported by the ranks do not match the disk: {lost}")
        atomic_write_json(tag_dir / MARKER, {"version": MARKER_VERSION, "step": step, "tag": tag,
                                             "files": files, "layout": layout, "written_at": time.time()})
        _fsync_dir(tag_dir)
    barrier()
    return tag, time.perf_counter() - start


def apply_retention(root: Path, keep: int) -> List[str]:
    """Delete what :func:`retention` says (rank 0 only); returns the deleted names."""
    doomed = retention(scan(root), keep)
    for name in doomed:
        shutil.rmtree(root / name, ignore_errors=True)
    return doomed

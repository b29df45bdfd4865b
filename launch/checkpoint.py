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

The rules (:func:`problem`, :func:`select`, :func:`retention`, :func:`scan`) live in
``hpc_agent.core.checkpoint_format`` and are re-exported here; this module writes checkpoints.
"""
from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from hpc_agent.core.checkpoint_format import MARKER, MARKER_VERSION, files_of, retention, scan, tag_for
from hpc_agent.core.filemodes import dir_mode, file_mode_in, group_of, make_dir, set_mode
from hpc_agent.core.fsutil import atomic_write_json, fsync

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # a file of a checkpoint is never a link out of the run directory

CONFIRM_WAIT_S = 10.0
"""How long rank 0 waits for other ranks' files to show up with their reported sizes."""


def owned_by(name: str, rank: int) -> bool:
    """Whether DeepSpeed's file ``name`` is written by ``rank``: per-rank ZeRO files carry
    ``pp_rank_<r>_``; the rest (``mp_rank_00_model_states.pt``) come from rank 0."""
    match = re.search(r"pp_rank_(\d+)_", name)
    return int(match.group(1)) == rank if match else rank == 0


def fsync_own_files(tag_dir: Path, rank: int) -> Dict[str, int]:
    """Flush this rank's files to stable storage, with the mode the checkpoints folder calls for (DeepSpeed
    creates them under the umask: hpc_agent.core.filemodes); returns them with their sizes. Links are no files
    of a checkpoint (:func:`files_of`) and are never opened."""
    mine = {}
    mode = file_mode_in(tag_dir.parent)
    for rel, size in files_of(tag_dir).items():
        if owned_by(Path(rel).name, rank):
            fd = os.open(tag_dir / rel, os.O_RDONLY | _NOFOLLOW)
            try:
                set_mode(fd, mode)
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
                fd = os.open(tag_dir / rel, os.O_RDONLY | _NOFOLLOW)
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


def save(engine: Any, root: Path, step: int, client_state: Dict[str, Any], layout: Dict[str, Any],
         rank: int, barrier: Callable[[], None], gather: Callable[[Any], List[Any]],
         before_marker: Optional[Callable[[int, Path], None]] = None) -> Tuple[str, float]:
    """Save a complete checkpoint of ``step`` from every rank; returns (tag, seconds).

    ``before_marker(step, tag_dir)`` runs on rank 0 after every rank's files are confirmed and before the
    marker is written: the chaos driver's kill-during-save injection point (launch/chaos_trigger.py)."""
    start = time.perf_counter()
    tag = tag_for(step)
    tag_dir = root / tag
    if rank == 0:
        make_dir(root)
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
        set_mode(tag_dir, dir_mode(group_of(root)))  # made by DeepSpeed under the umask
        if before_marker is not None:
            before_marker(step, tag_dir)
        write_marker(tag_dir, step, files, layout)
    barrier()
    return tag, time.perf_counter() - start


def write_marker(tag_dir: Path, step: int, files: Dict[str, int], layout: Dict[str, Any], **extra: Any) -> None:
    """Write ``COMPLETE.json`` (the last file of a checkpoint or snapshot) and fsync its directory."""
    atomic_write_json(tag_dir / MARKER, {"version": MARKER_VERSION, "step": step, "tag": tag_dir.name,
                                         "files": files, "layout": layout, "written_at": time.time(), **extra})
    fsync(tag_dir)


def apply_retention(root: Path, keep: int) -> List[str]:
    """Delete what :func:`retention` says (rank 0 only); returns the deleted names."""
    doomed = retention(scan(root), keep)
    for name in doomed:
        shutil.rmtree(root / name, ignore_errors=True)
    return doomed

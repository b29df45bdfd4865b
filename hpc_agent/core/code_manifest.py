"""The code snapshot as every attempt of a run reads it: ``<run dir>/code/`` and its ``MANIFEST.json``.

``submit`` takes the snapshot (``hpc_agent/jobs/code_snapshot.py``: what is copied, bounded, with the manifest);
the job reads it back here: :func:`activate` puts the copy first on ``sys.path``, :func:`snapshot_argv` points
a command-mode script word at its copy, and :func:`snapshot_workdir` says where in the copy the command runs.
:func:`digest` is the manifest's sha256, so anyone can check a copy against it (:func:`hash_tree`).
"""
from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from hpc_agent.core import rundir


def digest_update(h: Any, rel: str, data: bytes) -> None:
    """One entry of :func:`digest`: ``path NUL size(8 bytes) content``."""
    h.update(rel.encode("utf-8", "surrogateescape") + b"\0" + len(data).to_bytes(8, "big") + data)


def link_entry(rel: str, target: str) -> Tuple[str, bytes]:
    """A link's entry in :func:`digest`: its path with ``NUL symlink`` (no file's path holds a NUL), its target."""
    return f"{rel}\0symlink", target.encode("utf-8", "surrogateescape")


def digest(entries: Iterable[Tuple[str, bytes]]) -> str:
    """sha256 over (relative path, content) pairs in path order: ``path NUL size(8 bytes) content`` each
    (a link: :func:`link_entry`)."""
    h = hashlib.sha256()
    for rel, data in sorted(entries, key=lambda e: e[0]):
        digest_update(h, rel, data)
    return h.hexdigest()


def snapshot_argv(argv: Sequence[str], manifest: Dict[str, Any], code_dir: Path) -> List[str]:
    """``train.command`` pointed at the snapshot: the script word replaced by its copy (else unchanged)."""
    out = [str(word) for word in argv]
    index, script = manifest.get("argv_index"), manifest.get("script")
    if isinstance(index, int) and isinstance(script, str) and _inside(script) and 0 <= index < len(out):
        out[index] = str(Path(code_dir) / script)
    return out


def snapshot_workdir(manifest: Dict[str, Any], code_dir: Path) -> Optional[str]:
    """Where the command runs: the copy of the submit's folder inside the snapshot (None: it was outside the
    project, so the command runs in the submit's folder itself)."""
    rel = manifest.get("workdir")
    if not isinstance(rel, str) or not _inside(rel):
        return None
    return str(Path(code_dir)) if rel == "." else str(Path(code_dir) / rel)


def _inside(rel: str) -> bool:
    """A relative path that stays below the folder it is joined to (the manifest is in a job-writable dir)."""
    parts = Path(rel).parts
    return bool(rel) and not Path(rel).is_absolute() and ".." not in parts


def hash_tree(code_dir: Path) -> Tuple[str, int, int]:
    """(sha256, files, bytes) of a snapshot folder as it is now (its manifest left out, links not followed):
    compare with it."""
    code_dir = Path(code_dir)
    entries = []
    files = size = 0
    for here, dirs, names in os.walk(code_dir, followlinks=False):
        for name in dirs + names:
            path = Path(here, name)
            rel = path.relative_to(code_dir).as_posix()
            if path.is_symlink():
                entries.append(link_entry(rel, os.readlink(path)))
            elif path.is_file() and rel != rundir.CODE_MANIFEST:
                data = path.read_bytes()
                entries.append((rel, data))
                files, size = files + 1, size + len(data)
    return digest(entries), files, size


def read_manifest(run_dir: Path) -> Optional[Dict[str, Any]]:
    """The run's snapshot manifest, or None when it has none."""
    from hpc_agent.core import json_safe

    path = rundir.code_dir(run_dir) / rundir.CODE_MANIFEST
    if not path.exists():
        return None
    info, problem = json_safe.loads_object(rundir.read_bounded(path, 1 << 20, within=Path(run_dir)))
    return None if problem else info


def activate(cfg: Any, run_dir: Path) -> Optional[Dict[str, Any]]:
    """In the job: put the snapshot first on sys.path (ahead of the working directory, which
    ``python -m`` puts before PYTHONPATH); the manifest, or None when the run has no snapshot."""
    if not getattr(cfg.train, "snapshot_code", False):
        return None
    manifest = read_manifest(run_dir)
    if manifest is None:
        return None
    code = str(rundir.code_dir(run_dir))
    while code in sys.path:
        sys.path.remove(code)
    sys.path.insert(0, code)
    return manifest

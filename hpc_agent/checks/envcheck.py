"""The doctor's checks of this Python environment: are DeepSpeed's ops prepared, is a build lock stuck?

Login-node code: torch and DeepSpeed are not imported; their versions come from the installed metadata,
which is what ``launch/ops.py`` compares too (``torch.__version__`` is the metadata version).
"""
from __future__ import annotations

import importlib.metadata as metadata
import os
import sys
from pathlib import Path
from typing import Callable, List, Mapping, Optional, Tuple

from hpc_agent.core.ops_cache import (MANIFEST, find_build_locks, ops_dir, python_tag, read_manifest,
                                      torch_extensions_roots)

OK, WARN, FAIL = "OK", "WARN", "FAIL"
Result = Tuple[str, str, str]
"""(level, check name, detail): the doctor wraps these in its own Check."""


def _version(dist: str) -> Optional[str]:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def check_deepspeed_ops(environ: Mapping[str, str] = os.environ, version: Callable[[str], Optional[str]] = _version,
                        prefix: str = sys.prefix) -> Result:
    """Is there a prepared ops set for this Python, torch and DeepSpeed (any accelerator)?"""
    torch_v, ds_v = version("torch"), version("deepspeed")
    if not torch_v or not ds_v:
        missing = " and ".join(d for d, v in (("torch", torch_v), ("deepspeed", ds_v)) if not v)
        return WARN, "deepspeed ops", f"{missing} not installed in this Python ({sys.executable}): cannot check"
    root = ops_dir(environ, prefix)
    wanted = (python_tag(), torch_v, ds_v)
    matches, others = [], []
    for entry in sorted(root.iterdir()) if root.is_dir() else []:
        ops, runtime, why = read_manifest(entry / MANIFEST)
        if why:
            continue
        if (runtime.get("python"), runtime.get("torch"), runtime.get("deepspeed")) == wanted:
            matches.append(f"{runtime.get('accelerator')}: {', '.join(sorted(ops)) or 'no op needed'}")
        else:
            others.append(entry.name)
    if matches:
        return OK, "deepspeed ops", f"prepared in {root} ({'; '.join(matches)}): jobs load them, nothing compiles"
    seen = f"; prepared there for other versions: {', '.join(others)}" if others else ""
    return FAIL, "deepspeed ops", (f"none prepared for Python {wanted[0]}, torch {torch_v}, DeepSpeed {ds_v} in "
                                   f"{root}{seen}: jobs would exit 72 at start. Fix: {sys.executable} -m "
                                   "hpc_agent.prepare")


def check_build_locks(environ: Mapping[str, str] = os.environ, prefix: str = sys.prefix,
                      now: Optional[float] = None) -> List[Result]:
    """torch's build ``lock`` files: one left by a killed build makes every later build of that op (and
    any DeepSpeed use outside hpc_agent's jobs) wait forever without a word."""
    roots = torch_extensions_roots(environ) + [ops_dir(environ, prefix)]
    results: List[Result] = []
    for lock in find_build_locks(roots, now):
        minutes = lock.age_s / 60
        if lock.stale:
            results.append((WARN, "build lock", f"stale torch extension lock {lock.path} ({minutes:.0f} min old, "
                                                f"left by a killed build): builds of that op wait on it forever. "
                                                f"Fix: {lock.fix()}"))
        else:
            results.append((WARN, "build lock", f"torch extension lock {lock.path} ({minutes:.1f} min old): a build "
                                                "is running, or was killed; if it is still there in 15 min: "
                                                f"{lock.fix()}"))
    if not results:
        where = ", ".join(str(r) for r in roots if Path(r).is_dir()) or "no build directory yet"
        results.append((OK, "build lock", f"no torch extension build lock ({where})"))
    return results

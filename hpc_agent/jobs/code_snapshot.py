"""The code snapshot: a copy of your code taken at submit, run by every attempt of the run.

A requeue can start a day after the submit; by then the checkout holds other code. So submit copies the
code the job imports into ``<run dir>/code/`` (``hpc_agent.core.rundir``) and the job puts that folder first on
its path (``PYTHONPATH`` in the job script, and ``code_manifest.activate`` ahead of the job's working directory).
Resubmissions by the watcher reuse the run's snapshot: only ``hpc_agent.submit`` takes one.

What is copied:

* ``train.workload: pkg.mod:build``: the top-level package ``pkg`` (its folder, any file but the skipped
  ones) or module (``pkg.py``), found with ``importlib`` *without importing it* (it may import torch).
* ``train.command``: the folder of the first word that is an existing ``.py`` file under the submit's
  folder: its ``*.py`` files and, recursively, its package folders (those with ``__init__.py``), ``*.py``
  only. ``code_manifest.snapshot_argv`` points that word at the copy.

Skipped: hidden files and folders, ``__pycache__``, ``*.pyc``, virtualenvs (``pyvenv.cfg``), the runs
root, and links (never followed). Bounded (:data:`MAX_FILES`, :data:`MAX_BYTES`). ``MANIFEST.json`` records
the source, the sha256 (``code_manifest.digest``), the counts and, in command mode, which argv word is the script.
"""
from __future__ import annotations

import datetime as _dt
import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass
from importlib.machinery import PathFinder
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from hpc_agent.config.problems import ConfigError, Problem
from hpc_agent.config.user_code import is_reference
from hpc_agent.core import rundir
from hpc_agent.core.code_manifest import digest, read_manifest

MAX_FILES = 2000
MAX_BYTES = 50 << 20
MAX_SCANNED = 100_000  # entries looked at while walking: a folder of data must not stall the submit
OPT_OUT = "set train.snapshot_code=false to import it live instead (docs/your_model.md)"


@dataclass(frozen=True)
class Plan:
    """What to copy: ``files`` are (source file, path relative to the code folder), sorted by the latter."""

    key: str                 # the config key a problem is reported on
    source: Path             # the package folder, module file, or the script's folder
    kind: str                # package | module | project
    files: Tuple[Tuple[Path, str], ...]
    bytes: int
    script: Optional[str] = None       # command mode: the script, relative to the code folder
    argv_index: Optional[int] = None   # command mode: which argv word is the script


# ---- pure rules ----------------------------------------------------------------------------------------


def wanted(cfg: Any) -> bool:
    """Whether this config runs the user's code from a snapshot."""
    t = cfg.train
    return bool(t.snapshot_code) and (bool(getattr(t, "command", None)) or is_reference(t.workload))


def skip_reason(path: Path, is_dir: bool, excluded: Sequence[Path] = ()) -> Optional[str]:
    """Why an entry is left out of a snapshot (None: copy it). Links are checked by the walker."""
    name = path.name
    if name.startswith("."):
        return "hidden"
    if is_dir:
        if name == "__pycache__":
            return "cache"
        if (path / "pyvenv.cfg").exists():
            return "virtualenv"
        if any(path == ex for ex in excluded):
            return "runs root"
        return None
    return "bytecode" if name.endswith((".pyc", ".pyo")) else None


def bounds_problem(key: str, source: Path, files: int, size: int) -> Optional[Problem]:
    if files > MAX_FILES or size > MAX_BYTES:
        return Problem(key, str(source), f"code small enough to snapshot (at most {MAX_FILES} files and "
                                         f"{MAX_BYTES >> 20} MB; it has {'more than ' if files > MAX_FILES else ''}"
                                         f"{files} files, {size / 2**20:.1f} MB): move data out of the package, "
                                         f"or {OPT_OUT}")
    return None


# ---- finding and walking (reads the file system, changes nothing) ---------------------------------------
def _walk(root: Path, prefix: str, key: str, excluded: Sequence[Path], py_only: bool = False,
          packages_only: bool = False) -> List[Tuple[Path, str]]:
    """Files under ``root`` (no links followed), with their paths relative to the code folder."""
    found: List[Tuple[Path, str]] = []
    scanned = size = 0
    for folder, dirs, names in os.walk(root, followlinks=False):
        here = Path(folder)
        scanned += len(dirs) + len(names)
        keep = [d for d in dirs if not (here / d).is_symlink() and not skip_reason(here / d, True, excluded)
                and (not packages_only or (here / d / "__init__.py").is_file())]
        dirs[:] = sorted(keep)
        for name in sorted(names):
            path = here / name
            if path.is_symlink() or not path.is_file() or skip_reason(path, False):
                continue
            if py_only and not name.endswith(".py"):
                continue
            found.append((path, str(Path(prefix) / path.relative_to(root))))
            size += path.stat().st_size
        if scanned > MAX_SCANNED or (problem := bounds_problem(key, root, len(found), size)):
            raise ConfigError([problem if scanned <= MAX_SCANNED else
                               Problem(key, str(root), f"a folder with fewer than {MAX_SCANNED} entries to "
                                                       f"look through for code; {OPT_OUT}")])
    return found


def _plan(key: str, source: Path, kind: str, files: List[Tuple[Path, str]], **extra: Any) -> Plan:
    files = sorted(files, key=lambda f: f[1])
    return Plan(key, source, kind, tuple(files), sum(p.stat().st_size for p, _ in files), **extra)


def find_top_level(name: str, cwd: Path):
    """The module spec of the top-level ``name``, searched in ``cwd`` then sys.path, without importing it
    (the ``hpc-agent`` console script does not have the working directory on sys.path)."""
    spec = PathFinder.find_spec(name, [str(cwd)] + [p or str(cwd) for p in sys.path])
    if spec is None:
        try:  # other finders (editable installs) answer through importlib; still nothing is executed
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
    return spec


def workload_plan(ref: str, cwd: Path, excluded: Sequence[Path] = ()) -> Plan:
    """The package or module that ``train.workload: pkg.mod:build`` imports first."""
    top = ref.partition(":")[0].split(".")[0]
    spec = find_top_level(top, cwd)
    if spec is None:
        raise ConfigError([Problem("train.workload", ref, f"an importable package: {top!r} is neither in {cwd} nor "
                                   "on sys.path; run submit from the folder that holds it, or add its parent folder "
                                   "to PYTHONPATH")])
    locations = list(spec.submodule_search_locations or [])
    if len(locations) == 1 and Path(locations[0]).is_dir():
        root = Path(locations[0]).resolve()
        return _plan("train.workload", root, "package", _walk(root, top, "train.workload", excluded))
    if not locations and spec.origin and str(spec.origin).endswith(".py") and Path(spec.origin).is_file():
        path = Path(spec.origin).resolve()
        return _plan("train.workload", path, "module", [(path, f"{top}.py")])
    where = spec.origin or ", ".join(locations) or "?"
    raise ConfigError([Problem("train.workload", ref, f"a Python source package or module to snapshot ({top!r} is "
                               f"at {where}); {OPT_OUT}")])


def script_index(argv: Sequence[str], cwd: Path) -> Optional[int]:
    """The first argv word that is an existing ``.py`` file under ``cwd`` (None: no script to copy)."""
    base = Path(cwd).resolve()
    for i, word in enumerate(argv):
        if not str(word).endswith(".py"):
            continue
        path = (base / str(word)).resolve()
        if path.is_file() and path.is_relative_to(base):
            return i
    return None


def command_plan(argv: Sequence[str], cwd: Path, excluded: Sequence[Path] = ()) -> Optional[Plan]:
    """The script's folder: its ``*.py`` files and package folders (None when argv names no script)."""
    index = script_index(argv, cwd)
    if index is None:
        return None
    script = (Path(cwd).resolve() / str(argv[index])).resolve()
    root = script.parent
    files = [(p, p.name) for p in sorted(root.glob("*.py")) if p.is_file() and not p.is_symlink()
             and not skip_reason(p, False)]
    for sub in sorted(d for d in root.iterdir() if d.is_dir() and not d.is_symlink()):
        if (sub / "__init__.py").is_file() and not skip_reason(sub, True, excluded):
            files += _walk(sub, sub.name, "train.command", excluded, py_only=True, packages_only=True)
    if problem := bounds_problem("train.command", root, len(files), sum(p.stat().st_size for p, _ in files)):
        raise ConfigError([problem])
    return _plan("train.command", root, "project", files, script=script.name, argv_index=index)


def plan_for(cfg: Any, cwd: Path) -> Optional[Plan]:
    """What submit copies for this config (None: nothing); raises ConfigError naming the fix."""
    if not wanted(cfg):
        return None
    runs_root = (Path(cwd) / Path(cfg.run.runs_root).expanduser()).resolve()
    if getattr(cfg.train, "command", None):
        return command_plan(cfg.train.command, cwd, [runs_root])
    return workload_plan(str(cfg.train.workload), Path(cwd), [runs_root])


# ---- taking it, and using it ---------------------------------------------------------------------------
def take(plan: Plan, run_dir: Path) -> Dict[str, Any]:
    """Copy ``plan`` into ``<run_dir>/code`` (built aside, renamed into place when complete); the manifest."""
    from hpc_agent.core.filemodes import file_mode_in, make_dir, open_created
    from hpc_agent.core.fsutil import atomic_write_json

    dest = rundir.code_dir(run_dir)
    tmp = Path(run_dir) / f".{rundir.CODE}.tmp-{os.getpid()}"
    make_dir(tmp, exist_ok=False)
    hashed: List[Tuple[str, bytes]] = []
    total = 0
    try:
        for src, rel in plan.files:
            data = rundir.read_bounded(src, MAX_BYTES - total)  # regular files only; bounded if one grew
            total += len(data)
            target = tmp / rel
            make_dir(target.parent)
            fd = open_created(target, os.O_WRONLY | os.O_EXCL, file_mode_in(tmp))
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            hashed.append((rel, data))
        manifest = {"source": str(plan.source), "kind": plan.kind, "sha256": digest(hashed), "files": len(hashed),
                    "bytes": total, "path": str(dest), "script": plan.script, "argv_index": plan.argv_index,
                    "taken_at": _dt.datetime.now().isoformat(timespec="seconds")}
        atomic_write_json(tmp / rundir.CODE_MANIFEST, manifest)
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def run_json_entry(run_dir: Path) -> Optional[Dict[str, Any]]:
    """``code_snapshot`` for run.json: source, sha256, files, bytes, path (None without a snapshot)."""
    try:
        manifest = read_manifest(run_dir)
    except (OSError, ValueError) as exc:  # run.json still gets written: say what is wrong instead
        return {"path": str(rundir.code_dir(run_dir)), "error": f"MANIFEST unreadable: {exc}"}
    return {k: manifest.get(k) for k in ("source", "sha256", "files", "bytes", "path")} if manifest else None


def describe(manifest: Dict[str, Any]) -> str:
    """The line submit prints."""
    return (f"code:         {manifest['source']} -> {manifest['path']} ({manifest['files']} files, "
            f"{manifest['bytes'] / 1024:.1f} KiB, sha256 {manifest['sha256'][:12]})")


def setup_lines(cfg: Any) -> List[str]:
    """Job-script lines (``{run_dir}`` filled and quoted by ``jobs.executor``): the snapshot first on PYTHONPATH."""
    if not wanted(cfg):
        return []
    return [f"export PYTHONPATH={{run_dir}}/{rundir.CODE}" + "${PYTHONPATH:+:$PYTHONPATH}"]

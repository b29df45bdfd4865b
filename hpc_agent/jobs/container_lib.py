"""hpc_agent's own code for a container job: the one folder the container's Python imports it from.

Inside the image the job runs ``python -u -m submitit.core._submit FOLDER``, which unpickles the job
(``launch.job``) and runs hpc_agent's job side: so the container needs hpc_agent, launch and submitit on its
path. It must not get them by mounting the folder they are installed in: for a wheel install
(``pip install ./hpc_agent``) that is the user's site-packages, which also holds the user's own torch,
DeepSpeed, numpy..., built for the host; first on the container's ``PYTHONPATH`` they shadow the image's.

So every submission of a container job (submit's and the watcher's) copies just these packages into
``<run dir>/lib/`` (``hpc_agent.core.rundir.lib_dir``), and the job script puts that folder, after the code
snapshot, on the container's ``PYTHONPATH`` (``sbatch_templates/pyxis.yaml``, ``apptainer.yaml``). The
run directory's mount carries both folders into the container; nothing else of the host's Python is mounted.

What is copied (:data:`PACKAGES`), pure Python only:

* ``hpc_agent`` and ``launch``: hpc_agent's own two packages, as installed (a wheel's ``hpc_agent/shipped``
  included);
* ``submitit`` and ``cloudpickle``: the job was pickled on the login node with these, so the job loads it
  with the very same versions (most images do not ship submitit at all). submitit's one other dependency,
  ``typing_extensions``, is the image's (torch needs it too); doctor checks that submitit imports.

Left out: ``__pycache__``, ``*.pyc``, hidden entries, links. Bounded (:data:`MAX_FILES`, :data:`MAX_BYTES`).
``MANIFEST.json`` records where each package came from and the sha256 (``core.code_manifest.digest``); a
submission whose copy would be identical leaves the folder as it is, and a new copy is built aside and
renamed into place, so a job never imports a half-written folder.
"""
from __future__ import annotations

import datetime as _dt
import importlib.util
import os
import shutil
from pathlib import Path
from typing import Any, Dict, List, Tuple

from hpc_agent.core import rundir
from hpc_agent.core.code_manifest import digest
from hpc_agent.core.paths import code_root

PACKAGES = ("hpc_agent", "launch", "submitit", "cloudpickle")
MANIFEST = "MANIFEST.json"
MAX_FILES = 5000
MAX_BYTES = 64 << 20  # hpc_agent with its shipped files is about 2.5 MB, submitit and cloudpickle under 1 MB


class LibError(RuntimeError):
    """A package could not be copied (missing, not a source folder, too big): the message names it."""


def package_dir(name: str) -> Path:
    """The folder of package ``name`` as this process imports it: hpc_agent's two from :func:`code_root`
    (the checkout or site-packages), the others from their spec (without importing them)."""
    if name in ("hpc_agent", "launch"):
        return code_root() / name
    spec = importlib.util.find_spec(name)
    locations = list(spec.submodule_search_locations or []) if spec else []
    if len(locations) != 1 or not Path(locations[0]).is_dir():
        raise LibError(f"{name} is not an installed source package here ({spec.origin if spec else 'not found'}): "
                       f"pip install {name} into the environment that runs hpc-agent")
    return Path(locations[0])


def files() -> List[Tuple[Path, str]]:
    """(source file, path inside lib/) for every file of :data:`PACKAGES`, sorted by the latter."""
    found: List[Tuple[Path, str]] = []
    for name in PACKAGES:
        root = package_dir(name).resolve()
        if not (root / "__init__.py").is_file():
            raise LibError(f"{root} has no __init__.py: reinstall {name}")
        for folder, dirs, names in os.walk(root, followlinks=False):
            here = Path(folder)
            dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith(".")
                             and not (here / d).is_symlink())
            for file in sorted(names):
                path = here / file
                if file.startswith(".") or file.endswith((".pyc", ".pyo")) or path.is_symlink() or not path.is_file():
                    continue
                found.append((path, f"{name}/{path.relative_to(root)}"))
                if len(found) > MAX_FILES:
                    raise LibError(f"more than {MAX_FILES} files in {', '.join(PACKAGES)}: is {root} a source "
                                   "package? reinstall hpc_agent into a clean environment")
    return sorted(found, key=lambda f: f[1])


def stage(run_dir: Path) -> Dict[str, Any]:
    """Copy :data:`PACKAGES` into ``<run_dir>/lib`` unless the copy there is identical; the manifest.
    Raises LibError (or OSError) naming the problem; the run directory exists (submit made it)."""
    from hpc_agent.core.filemodes import file_mode_in, make_dir, open_created
    from hpc_agent.core.fsutil import atomic_write_json

    run_dir = Path(run_dir)
    entries: List[Tuple[str, bytes]] = []
    for src, rel in files():
        entries.append((rel, src.read_bytes()))
    total = sum(len(data) for _, data in entries)
    if total > MAX_BYTES:
        raise LibError(f"{', '.join(PACKAGES)} hold {total >> 20} MB (at most {MAX_BYTES >> 20} MB): reinstall "
                       "hpc_agent into a clean environment")
    sha = digest(entries)
    dest = rundir.lib_dir(run_dir)
    old, problem = rundir.read_json(dest / MANIFEST, within=run_dir)
    if not problem and old.get("sha256") == sha and dest.is_dir() and not dest.is_symlink():
        return old
    tmp = run_dir / f".{rundir.LIB}.tmp-{os.getpid()}"
    make_dir(tmp, exist_ok=False)
    try:
        mode = file_mode_in(tmp)
        for rel, data in entries:
            target = tmp / rel
            make_dir(target.parent)
            with os.fdopen(open_created(target, os.O_WRONLY | os.O_EXCL, mode), "wb") as handle:
                handle.write(data)
        manifest = {"sha256": sha, "files": len(entries), "bytes": total, "path": str(dest),
                    "packages": {name: str(package_dir(name)) for name in PACKAGES},
                    "taken_at": _dt.datetime.now().isoformat(timespec="seconds")}
        atomic_write_json(tmp / MANIFEST, manifest)
        aside = run_dir / f".{rundir.LIB}.old-{os.getpid()}"
        if dest.is_symlink() or dest.is_file():
            dest.unlink()
        elif dest.exists():
            os.rename(dest, aside)
        os.rename(tmp, dest)
        shutil.rmtree(aside, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest

"""Checks of a Python environment: are DeepSpeed's ops prepared, is a build lock stuck?

``doctor`` runs them on this Python; ``submit`` runs :func:`check_deepspeed_ops` for the ops its job will load,
with the job's Python (:func:`check_job_ops`), so an unprepared op is refused at submit (exit 2) instead of
ending the job with exit 72 after its wait in the queue.

Login-node code: torch and DeepSpeed are not imported; their versions come from the installed metadata,
which is what ``launch/ops.py`` compares too (``torch.__version__`` is the metadata version).
"""
from __future__ import annotations

import ast
import importlib.metadata as metadata
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, FrozenSet, List, Mapping, Optional, Sequence, Tuple

from hpc_agent.core.ops_cache import (MANIFEST, Runtime, find_build_locks, find_prepared, job_ops,
                                      missing_op_message, ops_dir, python_tag, read_manifest, runtime_dir,
                                      torch_extensions_roots)

OK, WARN, FAIL = "OK", "WARN", "FAIL"
Result = Tuple[str, str, str]
"""(level, check name, detail): the doctor wraps these in its own Check."""


def _version(dist: str) -> Optional[str]:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def precompiled_ops() -> Tuple[str, FrozenSet[str]]:
    """``(accelerator, ops)`` compiled into the installed DeepSpeed at install time (``DS_BUILD_*``): DeepSpeed
    loads those itself, never through the JIT step a job guards. Read from the file DeepSpeed's setup.py
    writes (``git_version_info_installed.py``), found and parsed without importing DeepSpeed (or torch)."""
    try:
        spec = importlib.util.find_spec("deepspeed")  # a top-level name: found, not imported
        folders = list(spec.submodule_search_locations or []) if spec else []
        path = Path(folders[0]) / "git_version_info_installed.py" if folders else None
        if path is None or not path.is_file():
            return "", frozenset()
        with open(path, "rb") as handle:
            tree = ast.parse(handle.read(1 << 20))
        values = {target.id: node.value for node in tree.body if isinstance(node, ast.Assign)
                  for target in node.targets if isinstance(target, ast.Name)}
        installed = ast.literal_eval(values["installed_ops"]) if "installed_ops" in values else {}
        accelerator = ast.literal_eval(values["accelerator_name"]) if "accelerator_name" in values else ""
        return str(accelerator), frozenset(str(k) for k, v in dict(installed).items() if v)
    except (ImportError, ValueError, SyntaxError, OSError, TypeError):
        return "", frozenset()


def check_deepspeed_ops(environ: Mapping[str, str] = os.environ, version: Callable[[str], Optional[str]] = _version,
                        prefix: str = sys.prefix, ops: Optional[Sequence[str]] = None, accelerator: str = "",
                        precompiled: Optional[Callable[[], Tuple[str, FrozenSet[str]]]] = None) -> Result:
    """Is there a prepared ops set for this Python, torch and DeepSpeed (any accelerator)? With ``ops`` (and
    the job's ``accelerator``): is each of those ops prepared there, or compiled into DeepSpeed, as the job's
    loader (``launch/ops.py``) will look for it?"""
    torch_v, ds_v = version("torch"), version("deepspeed")
    if not torch_v or not ds_v:
        missing = " and ".join(d for d, v in (("torch", torch_v), ("deepspeed", ds_v)) if not v)
        return WARN, "deepspeed ops", f"{missing} not installed in this Python ({sys.executable}): cannot check"
    root = ops_dir(environ, prefix)
    if ops is not None:
        return _check_these_ops(list(ops), Runtime(accelerator, python_tag(), torch_v, ds_v), root, environ,
                                precompiled or precompiled_ops)
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


def _check_these_ops(ops: List[str], runtime: Runtime, root: Path, environ: Mapping[str, str],
                     precompiled: Callable[[], Tuple[str, FrozenSet[str]]]) -> Result:
    if not ops:
        return OK, "deepspeed ops", f"none needed on accelerator {runtime.accelerator}"
    built_for, built_in = precompiled()
    missing = []
    for op in ops:
        if op in built_in and built_for == runtime.accelerator:
            continue
        # No CPU-feature check here: the login node's CPU is not the compute node's (the job checks its own).
        path, why = find_prepared(op, runtime, root, frozenset())
        if path is None:
            missing.append((op, why))
    if not missing:
        return OK, "deepspeed ops", (f"{', '.join(ops)} prepared in {runtime_dir(root, runtime)} (or compiled into "
                                     "DeepSpeed): the job loads them and compiles nothing")
    op, why = missing[0]
    # The line the job itself would print before exiting 72 (one home for the fix), with the ops dir it uses.
    text = missing_op_message(op, runtime, root, why, sys.executable, environ)
    if runtime.accelerator != "cpu":
        text += (f"; prepare it where DeepSpeed's accelerator is {runtime.accelerator}, e.g. "
                 f"`srun --gpus=1 {sys.executable} -m hpc_agent.prepare`")
    others = f" (also not prepared: {', '.join(name for name, _ in missing[1:])})" if missing[1:] else ""
    return FAIL, "deepspeed ops", text + others


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


# --- submit: the ops this job will load, for the job's Python ------------------------------------------------
SKIP = "SKIP"
"""The check does not apply to this job (the detail says why); nothing is refused."""
JOB_OPS_TIMEOUT_S = 30.0
_PROBE = ("import json, sys; from hpc_agent.checks.envcheck import check_deepspeed_ops; "
          "print(json.dumps(check_deepspeed_ops(ops=json.loads(sys.argv[1]), accelerator=sys.argv[2])))")


def job_accelerator(cfg: Any, environ: Mapping[str, str] = os.environ) -> str:
    """DeepSpeed's accelerator in the job, as it will find it: ``$DS_ACCELERATOR`` when set (the job inherits
    the submit's environment), else cuda when the job gets GPUs (``slurm.gpus_per_node``), else cpu."""
    return environ.get("DS_ACCELERATOR", "").strip() or ("cuda" if cfg.slurm.gpus_per_node else "cpu")


def _is_this_python(python: str) -> bool:
    """Whether the job's interpreter is this one (a venv's python is a link: compared as written, not resolved)."""
    return os.path.abspath(os.path.expanduser(python)) == os.path.abspath(sys.executable)


def check_job_ops(cfg: Any, environ: Mapping[str, str] = os.environ, run: Callable[..., Any] = subprocess.run,
                  timeout_s: float = JOB_OPS_TIMEOUT_S) -> Tuple[str, str]:
    """``(level, detail)`` for submit: are the DeepSpeed ops this job loads prepared for the job's Python?
    OK, FAIL (the detail names the fix), WARN, or SKIP where the check cannot apply (the detail says why).
    The job's Python is ``slurm.python`` (else this one, checked in this process); another interpreter runs
    the same check in a subprocess with a timeout. torch and DeepSpeed are imported by neither."""
    c = cfg.container
    if c.runtime != "none":
        return SKIP, (f"not checked: the job runs {c.python} in the {c.runtime} image {c.image}, whose DeepSpeed "
                      "ops are the image's (doctor's job python check probes the image)")
    accelerator = job_accelerator(cfg, environ)
    ops = job_ops(accelerator, str(cfg.train.offload))
    if not ops:
        return OK, f"none needed (accelerator {accelerator}, train.offload={cfg.train.offload})"
    python = str(cfg.slurm.python or sys.executable)
    if _is_this_python(python):
        level, _, detail = check_deepspeed_ops(environ, ops=ops, accelerator=accelerator)
    else:
        level, detail = _probe(python, ops, accelerator, environ, run, timeout_s)
    if level == FAIL and cfg.train.command:  # the script loads them only through init_distributed
        return WARN, (f"{detail} [train.command: this matters if your script calls hpc_agent's init_distributed "
                      "or DeepSpeed's]")
    return level, detail


def _probe(python: str, ops: List[str], accelerator: str, environ: Mapping[str, str], run: Callable[..., Any],
           timeout_s: float) -> Tuple[str, str]:
    """:func:`check_deepspeed_ops` run by another interpreter (its own metadata, sys.prefix and ops dir)."""
    import shutil

    from hpc_agent.core.paths import code_root

    exe = os.path.expanduser(python) if os.sep in python else shutil.which(python)
    if not exe or not os.access(exe, os.X_OK):
        return SKIP, (f"not checked: slurm.python {python} is not on this machine (doctor checks the job's "
                      "Python on a compute node)")
    try:  # in hpc_agent's folder: `python -c` puts the working directory first on its path
        proc = run([exe, "-c", _PROBE, json.dumps(ops), accelerator], capture_output=True, text=True,
                   timeout=timeout_s, env=dict(environ), cwd=str(code_root()))
    except subprocess.TimeoutExpired:
        return SKIP, f"not checked: slurm.python {python} did not answer within {timeout_s:.0f} s"
    except OSError as exc:
        return SKIP, f"not checked: slurm.python {python} could not be run ({exc})"
    try:
        level, _, detail = json.loads((proc.stdout or "").strip().splitlines()[-1])
        return str(level), str(detail)
    except (ValueError, IndexError, TypeError):
        said = " / ".join(line.strip() for line in (proc.stderr or "").splitlines()[-2:])[:300]
        return SKIP, f"not checked: slurm.python {python} could not run the check (exit {proc.returncode}: {said})"

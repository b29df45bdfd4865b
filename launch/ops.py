"""DeepSpeed's compiled ops: built once by ``python -m hpc_agent.prepare``, loaded, never built, in a job.

The rules and the ops directory are described in ``hpc_agent/core/ops_cache.py``. This module holds the two
halves that need torch and DeepSpeed:

* :func:`prepare` builds ops through DeepSpeed's own JIT path (``OpBuilder.jit_load``) into a build
  directory of ours, copies each library into the ops directory under a name that includes its hash, and
  writes the manifest last (atomically), so a job sees either the complete new set or the old one.
* :func:`install_guard` replaces ``OpBuilder.jit_load`` in the job's process. DeepSpeed calls it only for
  ops that were not compiled into the package at install time (``DS_BUILD_*``; those still load as
  usual). The replacement loads the prepared library, or raises :class:`OpNotPrepared`, which the training
  entry point turns into exit code 72 within seconds instead of a build that can outlive the job. It also
  makes DeepSpeed's op compatibility table probe only the ops asked about (:class:`ProbedOnRequest`).
"""
from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from hpc_agent.core.fsutil import atomic_write_json, hold_lock
from hpc_agent.core.ops_cache import (DEFAULT_OPS, MANIFEST, OPTIONAL_OPS, PreparedOp, Runtime, find_build_locks,
                                      find_prepared, manifest_data, missing_op_message, ops_dir, python_tag,
                                      read_cpu_flags, read_manifest, runtime_dir, sha256_of)

PREPARE_LOCK_WAIT_S = 20 * 60


class OpNotPrepared(Exception):
    """A DeepSpeed op would be compiled in this process, and the rule is that a job never compiles."""

    def __init__(self, op: str, message: str):
        super().__init__(message)
        self.op = op


def current_runtime() -> Runtime:
    import deepspeed
    import torch
    from deepspeed.accelerator import get_accelerator

    return Runtime(accelerator=str(get_accelerator()._name), python=python_tag(), torch=str(torch.__version__),
                   deepspeed=str(deepspeed.__version__), machine=platform.machine())


def _builder_classes() -> List[type]:
    """The OpBuilder base classes whose ``jit_load`` the ops use: DeepSpeed's, and the top-level
    ``op_builder`` copy that a DeepSpeed source checkout puts on the path (its builders subclass that one)."""
    from deepspeed.ops.op_builder import builder as ds_builder

    classes = [ds_builder.OpBuilder]
    try:
        import op_builder  # type: ignore  # noqa: F401 - only present in a DeepSpeed source tree
        from op_builder import builder as alt_builder  # type: ignore

        if getattr(op_builder, "__deepspeed__", False) and alt_builder.OpBuilder not in classes:
            classes.append(alt_builder.OpBuilder)
    except ImportError:
        pass
    return classes


def load_library(name: str, path: Path):
    """Import a compiled extension from its file (what torch's loader does after a build, minus the build)."""
    spec = importlib.util.spec_from_file_location(name, str(path))
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path} as module {name}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class ProbedOnRequest(dict):
    """``deepspeed.ops.__compatible_ops__`` that probes an op when it is asked about, not every op at once.

    DeepSpeed fills that table on first access, probing all its ops; the async_io probe compiles and links a
    test program with the C compiler. The only reader is ``init_distributed`` on the CPU accelerator, which
    asks about the shared-memory comm op alone: so every job start paid 0.06-0.14 s here for a compiler run,
    inside the job, whose answer nothing read."""

    def __missing__(self, name: str) -> bool:
        from deepspeed.ops.op_builder.all_ops import ALL_OPS
        from deepspeed.ops.op_builder.builder import probe_is_compatible

        builder = ALL_OPS.get(name)
        self[name] = bool(builder is not None and probe_is_compatible(builder))
        return self[name]

    def get(self, name: str, default: object = None) -> object:  # dict.get would not call __missing__
        return self[name]


def install_guard(root: Optional[Path] = None, log: Callable[[str], None] = print) -> None:
    """From now on, DeepSpeed's JIT step in this process loads prepared ops or raises OpNotPrepared."""
    import deepspeed.ops

    if "__compatible_ops__" not in vars(deepspeed.ops):  # not probed yet (a module __getattr__ does it)
        deepspeed.ops.__compatible_ops__ = ProbedOnRequest()
    state: Dict[str, object] = {}

    def runtime() -> Runtime:
        if "runtime" not in state:
            state["runtime"] = current_runtime()
        return state["runtime"]  # type: ignore[return-value]

    for owner in _builder_classes():
        if getattr(owner.jit_load, "_hpc_agent_guard", False):
            continue

        def jit_load(self, verbose: bool = True, _owner: type = owner):
            where = root or ops_dir()
            path, why = find_prepared(self.name, runtime(), where, read_cpu_flags())
            if path is None:
                raise OpNotPrepared(self.name, missing_op_message(self.name, runtime(), where, why))
            module = load_library(self.name, path)
            _owner._loaded_ops[self.name] = module
            log(f"[hpc_agent] DeepSpeed op {self.name}: loaded the prepared build {path}")
            return module

        jit_load._hpc_agent_guard = True  # type: ignore[attr-defined]
        owner.jit_load = jit_load


# --- prepare ------------------------------------------------------------------------------------------

def resolve_builders(names: Sequence[str]):
    """DeepSpeed op builders for op names (``cpu_adam``) or builder class names (``CPUAdamBuilder``)."""
    from deepspeed.accelerator import get_accelerator
    from deepspeed.ops.op_builder.all_ops import ALL_OPS

    out, unknown = [], []
    for name in names:
        builder = ALL_OPS.get(name) or get_accelerator().create_op_builder(name)
        # The CPU accelerator answers an unknown name with its NotImplementedBuilder, not None.
        if builder is None or builder.name == "deepspeed_not_implemented":
            unknown.append(name)
        else:
            out.append(builder)
    if unknown:
        raise ValueError(f"unknown DeepSpeed op(s) for accelerator {get_accelerator()._name}: {', '.join(unknown)}; "
                         f"known: {', '.join(sorted(ALL_OPS))}")
    return out


def _precompiled(name: str, runtime: Runtime) -> bool:
    from deepspeed.git_version_info import accelerator_name, installed_ops

    return bool(installed_ops.get(name, False)) and accelerator_name == runtime.accelerator


def _take_lock(path: Path, log: Callable[[str], None], wait_s: float, poll_s: float = 1.0):
    """The prepare lock of one runtime directory (``fsutil.hold_lock``: the kernel drops it when its holder
    dies, so it is never stale): another prepare may be building there; wait for it, saying so, bounded."""
    started = time.monotonic()
    next_note = started
    while (handle := hold_lock(path)) is None:
        waited = time.monotonic() - started
        holder = path.read_text(errors="replace").strip() or "?"
        if waited >= wait_s:
            raise TimeoutError(f"another prepare (pid {holder}) has held {path} for {waited:.0f} s; wait for it "
                               "or stop it, then run prepare again")
        if time.monotonic() >= next_note:
            log(f"waiting for another prepare (pid {holder}) to finish ({waited:.0f} s so far)")
            next_note += 30
        time.sleep(poll_s)
    return handle


def _max_jobs() -> str:
    """Parallel compiler processes: one per core, but each cc1plus of these ops takes ~1 GB."""
    try:
        mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        mem_gb = 2.0
    return str(max(1, min(os.cpu_count() or 1, int(mem_gb // 1.5))))


def prepare(names: Optional[Sequence[str]] = None, root: Optional[Path] = None, force: bool = False,
            log: Callable[[str], None] = print, lock_wait_s: float = PREPARE_LOCK_WAIT_S) -> Dict[str, PreparedOp]:
    """Build ``names`` (default: :data:`DEFAULT_OPS` of this accelerator) and record them; returns the manifest's ops."""
    root = Path(root or ops_dir())
    runtime = current_runtime()
    explicit = bool(names)
    names = list(names) if names else DEFAULT_OPS.get(runtime.accelerator, [])
    where = runtime_dir(root, runtime)
    where.mkdir(parents=True, exist_ok=True)
    log(f"ops directory {where} ({runtime.describe()})")
    handle = _take_lock(where / ".prepare.lock", log, lock_wait_s)
    try:
        build_root = where / "build"
        # We hold the prepare lock and only prepare builds here: a torch lock left in the build dir is from a
        # killed build, and torch would wait on it forever.
        for lock in find_build_locks([build_root]):
            lock.path.unlink(missing_ok=True)
            log(f"removed a build lock left by an interrupted build: {lock.path}")
        os.environ["TORCH_EXTENSIONS_DIR"] = str(build_root)
        os.environ.setdefault("MAX_JOBS", _max_jobs())
        ops, _, _ = read_manifest(where / MANIFEST)
        flags = read_cpu_flags()
        for builder in resolve_builders(names):
            name = builder.name
            if _precompiled(name, runtime):
                log(f"{name}: compiled into the installed DeepSpeed; nothing to prepare")
                continue
            if not builder.is_compatible(False):
                raise RuntimeError(f"{name} cannot be built here: {' '.join(getattr(builder, 'error_log', '') or [])}"
                                   .strip())
            found, _ = find_prepared(name, runtime, root, flags)
            if found is not None and not force:
                log(f"{name}: already prepared ({found})")
                continue
            started = time.monotonic()
            log(f"{name}: compiling (MAX_JOBS={os.environ['MAX_JOBS']}); this takes about a minute")
            try:
                module = builder.jit_load(verbose=False)
            except Exception as exc:  # noqa: BLE001 - the compiler's error, whatever form torch gives it
                if explicit or name not in OPTIONAL_OPS:
                    raise RuntimeError(f"{name} failed to build: {exc}") from exc
                log(f"{name}: skipped, the build failed ({str(exc).strip().splitlines()[-1:]}); only jobs that "
                    f"need it (train.offload) are affected: they exit 72 naming it")
                continue
            built = Path(module.__file__)
            digest = sha256_of(built)
            target = where / f"{name}-{digest[:12]}.so"
            if not target.exists():
                tmp = where / f".{target.name}.tmp"
                shutil.copyfile(built, tmp)
                os.replace(tmp, target)
            ops[name] = PreparedOp(name, target.name, digest, target.stat().st_size, tuple(sorted(flags)),
                                   platform.node(), time.time())
            atomic_write_json(where / MANIFEST, manifest_data(runtime, ops.values()))
            log(f"{name}: built in {time.monotonic() - started:.0f} s -> {target}")
        _remove_unlisted(where, ops)
        return ops
    finally:
        handle.close()


def _remove_unlisted(where: Path, ops: Dict[str, PreparedOp]) -> None:
    keep = {op.file for op in ops.values()}
    for path in where.glob("*.so"):
        if path.name not in keep:
            path.unlink(missing_ok=True)


def verify(names: Sequence[str], root: Optional[Path] = None) -> List[str]:
    """Load each op through the job's path in a fresh process; the problems found (empty: all load)."""
    env = dict(os.environ)
    if root is not None:
        env["HPC_AGENT_OPS_DIR"] = str(root)
    env.pop("TORCH_EXTENSIONS_DIR", None)
    code = ("import sys\nfrom launch.ops import install_guard, resolve_builders\n"
            "install_guard(log=lambda s: None)\n"
            "for b in resolve_builders(sys.argv[1:]): b.load()\nprint('ok')\n")
    proc = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True, env=env, timeout=300)
    if proc.returncode == 0 and proc.stdout.strip().endswith("ok"):
        return []
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return [" / ".join(tail) or f"exit {proc.returncode}"]

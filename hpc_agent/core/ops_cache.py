"""Where prepared DeepSpeed ops live, what they were built for, and stale build locks. No torch here.

DeepSpeed compiles some of its C++ ops the first time they are used (its "JIT" path through
``torch.utils.cpp_extension.load``): the CPU accelerator's shared-memory comm op at every
``init_distributed``, CPU Adam when the optimizer is offloaded. Inside a Slurm job that build is a
disaster: measured on the quickstart job (1 CPU, ``--mem=2G``), two ``cc1plus`` of ~1 GB each thrashed
past the 10 min limit, and the killed build left torch's ``lock`` file behind, on which every later
job waited until its own time limit. So the rule is: **a job never compiles**.

* ``python -m hpc_agent.prepare`` (``launch/ops.py``) builds the ops once, outside any job, and copies
  each built library into the *ops directory*, with a manifest that says what it was built for.
* In the job, ``launch/ops.py`` replaces DeepSpeed's JIT step: an op listed in the manifest for this
  runtime is loaded from its file (no ninja, no lock, no compiler); any other op ends the job within
  seconds with exit code 72 and the command that prepares it.

The ops directory (one per environment, found the same way by ``prepare`` and by the job):

* ``$HPC_AGENT_OPS_DIR`` when set (e.g. a shared directory for several virtualenvs);
* else ``<sys.prefix>/share/hpc_agent/deepspeed_ops``: inside the virtualenv, which the job's Python
  (the login node's ``sys.executable``) shares, and which is never under ``$HOME`` or a cache dir.

Layout: ``<ops dir>/<runtime key>/manifest.json`` and ``<name>-<sha256[:12]>.so`` next to it, where the
runtime key names everything a compiled op depends on (accelerator, Python, torch, DeepSpeed, machine).
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import stat
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

OPS_DIR_ENV = "HPC_AGENT_OPS_DIR"
MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
PREPARE_COMMAND = "python -m hpc_agent.prepare"
MAX_MANIFEST_BYTES = 1 << 20
STALE_LOCK_AGE_S = 15 * 60
"""A torch build lock older than this is left over from a killed build: a real build of a DeepSpeed op
takes 25-60 s on one core here, and minutes only when something is wrong."""

# The ops our jobs make DeepSpeed load, per accelerator: the CPU accelerator's shared-memory comm op at every
# init_distributed; CPU Adam where the optimizer is offloaded from a GPU (on the CPU accelerator we give
# DeepSpeed torch's AdamW instead, see launch/dsconfig.py). Other ops: prepare --op NAME.
DEFAULT_OPS: Dict[str, List[str]] = {"cpu": ["deepspeed_shm_comm"], "cuda": ["cpu_adam"]}
# Needed only by some configs (train.offload): a default build of these that fails (no CUDA toolkit on this
# machine, say) is reported and skipped; such a job then exits 72 naming the op, and nothing else is blocked.
OPTIONAL_OPS = frozenset({"cpu_adam"})


def uses_cpu_adam(on_cuda: bool, offload: str) -> bool:
    """DeepSpeed's CPU Adam (a compiled op) is the optimizer only for ``train.offload`` on a GPU."""
    return bool(on_cuda) and offload != "none"


def job_ops(accelerator: str, offload: str) -> List[str]:
    """The prepared ops a training job on ``accelerator`` loads (submit checks them before the queue wait)."""
    if accelerator == "cpu":
        return list(DEFAULT_OPS["cpu"])
    return ["cpu_adam"] if uses_cpu_adam(accelerator == "cuda", offload) else []


# CPU features a -march=native build may use; an op built where these exist faults (SIGILL) on a node
# without them, so the job checks them before loading (only flags of this kind: the rest vary harmlessly).
_ISA_FLAG = re.compile(r"^(?:avx|amx|fma|f16c|sse|ssse|bmi|vnni|sha_ni|aes|pclmul)")


@dataclass(frozen=True)
class Runtime:
    """What a compiled op must match to be loaded."""

    accelerator: str
    """DeepSpeed's accelerator name: ``cpu``, ``cuda``..."""
    python: str
    """``cp311``: the extension's ABI tag."""
    torch: str
    """``torch.__version__``, local part included (``2.13.0+cpu``, ``2.11.0+cu130``)."""
    deepspeed: str
    machine: str = field(default_factory=platform.machine)

    def key(self) -> str:
        raw = f"{self.accelerator}-{self.python}-torch{self.torch}-ds{self.deepspeed}-{self.machine}"
        return re.sub(r"[^A-Za-z0-9._+-]", "_", raw)

    def describe(self) -> str:
        return (f"accelerator {self.accelerator}, Python {self.python}, torch {self.torch}, "
                f"DeepSpeed {self.deepspeed}, {self.machine}")


def python_tag(version: Sequence[int] = sys.version_info) -> str:
    return f"cp{version[0]}{version[1]}"


def ops_dir(environ: Mapping[str, str] = os.environ, prefix: str = sys.prefix) -> Path:
    """The ops directory (module docstring)."""
    explicit = environ.get(OPS_DIR_ENV, "").strip()
    if explicit:
        return Path(explicit).expanduser()
    return Path(prefix) / "share" / "hpc_agent" / "deepspeed_ops"


def runtime_dir(root: Path, runtime: Runtime) -> Path:
    return root / runtime.key()


def cpu_flags(cpuinfo: str) -> frozenset:
    """The ISA flags of the first CPU in ``/proc/cpuinfo`` text (empty where there is none)."""
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            return frozenset(f for f in value.split() if _ISA_FLAG.match(f))
    return frozenset()


def read_cpu_flags() -> frozenset:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            return cpu_flags(handle.read(1 << 20))
    except OSError:
        return frozenset()


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class PreparedOp:
    name: str
    file: str
    """File name of the library, in the runtime directory."""
    sha256: str
    size: int
    cpu_flags: Tuple[str, ...] = ()
    """ISA flags of the machine it was built on (``-march=native``)."""
    built_on: str = ""
    built_at: float = 0.0


def manifest_data(runtime: Runtime, ops: Iterable[PreparedOp]) -> Dict:
    return {"format": MANIFEST_FORMAT, "runtime": asdict(runtime),
            "ops": {op.name: {**asdict(op), "cpu_flags": sorted(op.cpu_flags)} for op in ops}}


def read_manifest(path: Path) -> Tuple[Dict[str, PreparedOp], Dict[str, str], str]:
    """``({name: op}, runtime, "")``, or ``({}, {}, why not)``. The file is read as untrusted: a regular file, bounded,
    no symlink followed (a job could have written into a shared ops directory)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return {}, {}, f"no {MANIFEST} in {path.parent}"
    except OSError as exc:
        return {}, {}, f"cannot open {path}: {exc.strerror or exc}"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return {}, {}, f"{path} is not a regular file"
        with os.fdopen(fd, "rb", closefd=False) as handle:
            raw = handle.read(MAX_MANIFEST_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > MAX_MANIFEST_BYTES:
        return {}, {}, f"{path} is larger than {MAX_MANIFEST_BYTES} bytes"
    try:
        data = json.loads(raw)
        runtime = {str(k): str(v) for k, v in dict(data.get("runtime") or {}).items()}
        ops = {}
        for name, entry in dict(data.get("ops") or {}).items():
            ops[str(name)] = PreparedOp(str(entry["name"]), str(entry["file"]), str(entry["sha256"]),
                                        int(entry["size"]), tuple(str(f) for f in entry.get("cpu_flags") or ()),
                                        str(entry.get("built_on", "")), float(entry.get("built_at", 0.0)))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        return {}, {}, f"{path} is not a valid manifest ({exc.__class__.__name__}: {exc})"
    return ops, runtime, ""


def missing_op_message(op: str, runtime: Runtime, root: Path, why: str, python: str = sys.executable,
                       environ: Mapping[str, str] = os.environ) -> str:
    """The line a job prints before exiting 72 (``[hpc_agent] environment problem: ...``), and submit before
    it refuses such a job: the fix first, because diagnosis evidence keeps only the start of a long line."""
    hint = f"{OPS_DIR_ENV}={root} " if environ.get(OPS_DIR_ENV) else ""
    return (f"DeepSpeed op {op} is not prepared, and a job never compiles one. Fix: `{hint}{python} -m "
            f"hpc_agent.prepare`, then resubmit. Why: {why} ({runtime.describe()})")


def find_prepared(op: str, runtime: Runtime, root: Path, node_flags: frozenset,
                  verify_hash: bool = True) -> Tuple[Optional[Path], str]:
    """The library to load for ``op``, or ``(None, why not)``."""
    where = runtime_dir(root, runtime)
    ops, _, why = read_manifest(where / MANIFEST)
    if why:
        others = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
        extra = f"; prepared there: {', '.join(others)}" if others else ""
        return None, f"{why}{extra}"
    entry = ops.get(op)
    if entry is None:
        return None, f"{where / MANIFEST} lists {', '.join(sorted(ops)) or 'no op'}, not {op}"
    path = where / Path(entry.file).name
    try:
        size = path.lstat().st_size if path.is_file() and not path.is_symlink() else None
    except OSError:
        size = None
    if size != entry.size:
        return None, f"{path} is missing or not the size the manifest records"
    if verify_hash and sha256_of(path) != entry.sha256:
        return None, f"{path} does not match the manifest's sha256"
    missing = sorted(set(entry.cpu_flags) - set(node_flags)) if node_flags else []
    if missing:
        return None, (f"built on {entry.built_on or 'a machine'} with CPU features this node lacks "
                      f"({', '.join(missing[:6])}); prepare on the oldest kind of compute node")
    return path, ""


# --- torch's build locks ----------------------------------------------------------------------------

def torch_extensions_roots(environ: Mapping[str, str] = os.environ) -> List[Path]:
    """Where torch's JIT builds (and their ``lock`` files) live for this user: ``$TORCH_EXTENSIONS_DIR``,
    else ``$XDG_CACHE_HOME/torch_extensions`` or ``~/.cache/torch_extensions`` (torch's default)."""
    if environ.get("TORCH_EXTENSIONS_DIR"):
        return [Path(environ["TORCH_EXTENSIONS_DIR"]).expanduser()]
    cache = environ.get("XDG_CACHE_HOME") or os.path.join(environ.get("HOME") or os.path.expanduser("~"), ".cache")
    return [Path(cache) / "torch_extensions"]


@dataclass(frozen=True)
class BuildLock:
    path: Path
    age_s: float

    @property
    def stale(self) -> bool:
        return self.age_s >= STALE_LOCK_AGE_S

    def fix(self) -> str:
        return f"rm -f {self.path}"


def find_build_locks(roots: Iterable[Path], now: Optional[float] = None, max_entries: int = 2000) -> List[BuildLock]:
    """Every torch build ``lock`` (``FileBaton``) up to three levels below ``roots``: ``<root>/<op>/lock``
    (``TORCH_EXTENSIONS_DIR`` or our build dir) and ``<root>/py311_cpu/<op>/lock`` (torch's default)."""
    now = time.time() if now is None else now
    found: List[BuildLock] = []
    seen = 0
    for root in roots:
        for pattern in ("lock", "*/lock", "*/*/lock", "*/*/*/lock"):
            for path in sorted(Path(root).glob(pattern)) if Path(root).is_dir() else []:
                seen += 1
                if seen > max_entries:
                    return found
                try:
                    info = path.lstat()
                except OSError:
                    continue
                found.append(BuildLock(path, max(0.0, now - info.st_mtime)))
    return found

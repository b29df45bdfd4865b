"""Will the job fit on the partition's GPUs? The memory check ``submit`` runs before sbatch (pure core).

A wasted allocation costs hours in the queue, and a job that runs out of GPU memory at its first step
wastes all of them. ``submit`` compares the per-GPU estimate (:mod:`hpc_agent.memory`) with the memory
of one GPU of the partition: above it, it refuses unless ``--force``, and names the cheapest change that
fits; above the headroom (90 %) it warns, because the estimate leaves out the CUDA context, temporary
buffers and fragmentation.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

GIB = 2**30
HEADROOM = 0.9

# Memory per GPU of common GRES type names, where the name settles it. Names that exist in two sizes
# (a100: 40/80 GB, v100: 16/32 GB) are left out on purpose: a guess could refuse a job that fits or
# let one through that does not. Sites name such types with the size (a100_80g), which is parsed.
KNOWN_GPU_GIB: Dict[str, float] = {
    "h200": 141, "gh200": 96, "h100": 80, "h800": 80, "l40s": 48, "l40": 48, "a40": 48, "a6000": 48,
    "a30": 24, "a10": 24, "l4": 24, "t4": 15,
}

OK, WARN, REFUSE, SKIP = "ok", "warn", "refuse", "skip"


@dataclass(frozen=True)
class MemoryVerdict:
    level: str
    """ok, warn (fits, but within 10 % of the GPU's memory), refuse (does not fit) or skip (not compared)."""
    message: str
    fix: Dict[str, Any] = field(default_factory=dict)
    """The cheapest change that fits, as dotted-key overrides (only for refuse)."""

    def fix_overrides(self) -> List[str]:
        return [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in self.fix.items()]


def gpu_gib_from_gres(gres: str) -> Optional[float]:
    """GiB of one GPU from a gres string (``gpu:h100:8``, ``gpu:a100_80g:4(S:0-1)``); None when unknown."""
    sizes = []
    for item in re.sub(r"\([^)]*\)", "", gres or "").split(","):
        parts = item.strip().split(":")
        if len(parts) < 3 or parts[0] != "gpu":  # gpu:<count> names no type
            continue
        kind = parts[1].lower()
        size = re.search(r"(\d+)\s*g", kind.split("_", 1)[-1] if "_" in kind else kind.split("-", 1)[-1])
        if size and ("_" in kind or "-" in kind):
            sizes.append(float(size.group(1)))
        elif kind in KNOWN_GPU_GIB:
            sizes.append(KNOWN_GPU_GIB[kind])
        else:
            return None  # one unknown type: the smallest GPU of the partition is unknown
    return min(sizes) if sizes else None


def partition_gres(sinfo_text: str, partition: Optional[str]) -> str:
    """The gres of ``partition`` (the default one, marked ``*``, when None) from ``sinfo -h -o '%P|%G'``."""
    found = []
    for line in sinfo_text.splitlines():
        if "|" not in line:
            continue
        name, gres = line.split("|", 1)
        default = name.endswith("*")
        name = name.rstrip("*")
        if (partition and name == partition) or (not partition and default):
            found.append(gres.strip())
    return ",".join(g for g in found if g and g != "(null)")


def gpu_capacity(cfg: Any, gres: str) -> Tuple[Optional[int], str]:
    """Bytes of one GPU and where the number comes from: the config first, then the partition's gres type."""
    if cfg.slurm.gpu_memory_gib:
        return int(cfg.slurm.gpu_memory_gib * GIB), "slurm.gpu_memory_gib"
    gib = gpu_gib_from_gres(gres)
    if gib:
        return int(gib * GIB), f"the partition's GPU type ({gres})"
    return None, ""


def memory_verdict(cfg: Any, capacity: Optional[int], source: str = "") -> MemoryVerdict:
    """Compare the estimate with one GPU's memory; see the module docstring."""
    from hpc_agent.memory import cheapest_fit, estimate_from_config, format_bytes

    if not cfg.slurm.gpus_per_node:
        return MemoryVerdict(SKIP, "CPU job (slurm.gpus_per_node=0): no GPU memory to check")
    if cfg.train.workload != "gpt":
        return MemoryVerdict(SKIP, f"no memory estimate for the {cfg.train.workload} workload")
    need = estimate_from_config(cfg).total_bytes
    if not capacity:
        return MemoryVerdict(SKIP, f"memory estimate {format_bytes(need)} per GPU; the GPU's memory is unknown "
                                   "(set slurm.gpu_memory_gib to compare)")
    where = f"{capacity / GIB:.1f} GiB per GPU (from {source})" if source else f"{capacity / GIB:.1f} GiB per GPU"
    if need <= capacity * HEADROOM:
        return MemoryVerdict(OK, f"memory estimate {format_bytes(need)} fits in {where}")
    if need <= capacity:
        return MemoryVerdict(WARN, f"memory estimate {format_bytes(need)} is within {1 - HEADROOM:.0%} of {where}: "
                                   "the CUDA context and fragmentation may not fit")
    fit = cheapest_fit(cfg, int(capacity * HEADROOM))
    if fit is None:
        return MemoryVerdict(REFUSE, f"memory estimate {format_bytes(need)} does not fit in {where}, and no single "
                                     "change (micro-batch, activation checkpointing, ZeRO stage, offload) makes it "
                                     "fit: shrink the model or use more or larger GPUs")
    patch, what = fit
    return MemoryVerdict(REFUSE, f"memory estimate {format_bytes(need)} does not fit in {where}; cheapest change "
                                 f"that fits: {what}", dict(patch))


def render(verdict: MemoryVerdict, forced: bool) -> List[str]:
    """The lines submit prints for a verdict."""
    if verdict.level in (OK, SKIP):
        return [f"memory: {verdict.message}"]
    if verdict.level == WARN:
        return [f"warning: {verdict.message}"]
    lines = [("warning (--force): " if forced else "refusing to submit: ") + verdict.message]
    if verdict.fix:
        lines.append("  add: " + " ".join(verdict.fix_overrides()))
    if not forced:
        lines.append("  or pass --force to submit it anyway.")
    return lines


def sinfo_argv() -> Sequence[str]:
    return ["sinfo", "-h", "-o", "%P|%G"]

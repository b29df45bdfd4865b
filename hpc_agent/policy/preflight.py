"""Will the job fit on the partition's GPUs? The memory check ``submit`` runs before sbatch (pure core).

A wasted allocation costs hours in the queue, and a job that runs out of GPU memory at its first step
wastes all of them. ``submit`` compares the per-GPU estimate (:mod:`hpc_agent.policy.memory`) with the memory
of one GPU of the partition: above it, it refuses unless ``--force``, and names the cheapest change that
fits; above the headroom (90 %) it warns, because the estimate leaves out the CUDA context, temporary
buffers and fragmentation.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from hpc_agent.policy.memory import GPU_HEADROOM
from hpc_agent.slurm.sinfo import GRES_FORMAT, gpu_gib_from_gres

GIB = 2**30

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


def gpu_capacity(cfg: Any, gres: str) -> Tuple[Optional[int], str]:
    """Bytes of one GPU and where the number comes from: the config first, then the partition's gres type."""
    if cfg.slurm.gpu_memory_gib:
        return int(cfg.slurm.gpu_memory_gib * GIB), "slurm.gpu_memory_gib"
    # The type the job asks for (profile gpu_request: gres-typed) beats a partition that mixes types.
    gpu_type = getattr(getattr(cfg, "profile", None), "gpu_type", None)
    if gpu_type and (gib := gpu_gib_from_gres(f"gpu:{gpu_type}:1")):
        return int(gib * GIB), f"profile.gpu_type {gpu_type}"
    gib = gpu_gib_from_gres(gres)
    if gib:
        return int(gib * GIB), f"the partition's GPU type ({gres})"
    return None, ""


def memory_verdict(cfg: Any, capacity: Optional[int], source: str = "", offload_allowed: bool = True) -> MemoryVerdict:
    """Compare the estimate with one GPU's memory; see the module docstring. A refusal's fix is the first
    patch on THE OOM ladder (:func:`hpc_agent.policy.memory.ladder_fit`) that fits ``GPU_HEADROOM`` of the GPU: the
    same patch the watcher would propose if the job ran out of memory there (``offload_allowed=False``:
    host memory is short too, as after a host OOM)."""
    from hpc_agent.policy.memory import estimate_from_config, format_bytes, ladder_fit

    if not cfg.slurm.gpus_per_node:
        return MemoryVerdict(SKIP, "CPU job (slurm.gpus_per_node=0): no GPU memory to check")
    if cfg.train.command:
        from hpc_agent.policy.memory import COMMAND_NOTE

        return MemoryVerdict(SKIP, COMMAND_NOTE)
    if cfg.train.workload != "gpt":
        from hpc_agent.config.user_code import is_reference

        if is_reference(cfg.train.workload):  # never imported here (it may import torch): its size is unknown
            return MemoryVerdict(SKIP, f"no memory estimate for your own workload {cfg.train.workload} (the login "
                                       "node does not import your code); an OOM in the job is repaired by the "
                                       "OOM ladder")
        return MemoryVerdict(SKIP, f"no memory estimate for the {cfg.train.workload} workload")
    need = estimate_from_config(cfg).total_bytes
    if not capacity:
        return MemoryVerdict(SKIP, f"memory estimate {format_bytes(need)} per GPU; the GPU's memory is unknown "
                                   "(set slurm.gpu_memory_gib to compare)")
    where = f"{capacity / GIB:.1f} GiB per GPU (from {source})" if source else f"{capacity / GIB:.1f} GiB per GPU"
    if need <= capacity * GPU_HEADROOM:
        return MemoryVerdict(OK, f"memory estimate {format_bytes(need)} fits in {where}")
    if need <= capacity:
        return MemoryVerdict(WARN, f"memory estimate {format_bytes(need)} is within {1 - GPU_HEADROOM:.0%} of {where}: "
                                   "the CUDA context and fragmentation may not fit")
    fit = ladder_fit(cfg, capacity * GPU_HEADROOM, offload_allowed=offload_allowed)
    if fit is None:
        return MemoryVerdict(REFUSE, f"memory estimate {format_bytes(need)} does not fit in {where}, and no rung "
                                     "of the OOM ladder (micro-batch, activation checkpointing, ZeRO stage, offload) "
                                     "makes it fit: shrink the model or use more or larger GPUs")
    patch, what = fit[0], fit[1]
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
    from hpc_agent.slurm.sinfo import partitions_argv

    return partitions_argv(GRES_FORMAT)

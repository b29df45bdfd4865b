"""Partition facts + a config -> :class:`hpc_agent.policy.partitions.Candidate` rows (pure: no I/O, no clock).

For each partition: does the job fit its GPUs, as it is or with the fewest rungs of THE OOM ladder
(:mod:`hpc_agent.policy.memory`)? How long would the remaining steps take there? What would it cost?

The time model is deliberately simple and says so in the table's reason:

- a step costs ``6 x parameters x tokens`` FLOPs (forward + backward of a decoder-only transformer), run at
  ``placement.mfu`` of the GPUs' dense FP16 peak (:mod:`hpc_agent.policy.gpu_types`); once a run has measured its
  own step time on one GPU type, that time scaled by the ratio of the peaks replaces the FLOPs estimate;
- a config change slows a step by fixed factors (:data:`SLOWDOWN`): activation checkpointing recomputes the
  forward (+1/3), ZeRO-3 gathers parameters every layer, offload moves state over PCIe, a smaller micro-batch
  uses the GPU less well. Rough, but they order the options the way their costs do.

Workloads the estimator does not cover (your own model, ``train.command``) have no memory estimate and no
FLOPs count: their candidates say ``?`` and the chooser ranks them by start time.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

from hpc_agent.policy.gpu_types import peak_tflops
from hpc_agent.policy.memory import (GPU_HEADROOM, describe_patch, estimate_from_config, estimate_with_patch,
                                     gpt_param_count, gpu_oom_rung, ladder_fit, train_after)
from hpc_agent.policy.partitions import Candidate

GIB = 2**30
SLOWDOWN = {"activation_checkpointing": 4 / 3, "zero3": 1.1, "optimizer": 1.5, "optimizer+params": 3.0,
            "micro_batch_halving": 1.1}
"""Step-time factors of the ladder's changes (see the module docstring)."""


def _estimated(cfg: Any) -> bool:
    """Whether the memory estimator and the FLOPs count cover this config (the built-in gpt workload)."""
    return cfg.train.workload == "gpt" and not getattr(cfg.train, "command", None)


def _ranks(cfg: Any) -> int:
    return max(1, int(cfg.slurm.nodes) * int(cfg.slurm.tasks_per_node))


def flops_per_step(cfg: Any) -> Optional[float]:
    """Training FLOPs of one optimizer step (the global batch), None for a workload without an estimate."""
    if not _estimated(cfg):
        return None
    m, t = cfg.model, cfg.train
    tokens = t.micro_batch_size * t.grad_accum_steps * _ranks(cfg) * m.seq_len
    return 6.0 * gpt_param_count(m.n_layers, m.d_model, m.seq_len) * tokens


def config_factor(train: Any) -> float:
    """How much slower than plain data-parallel training these settings make a step."""
    factor = SLOWDOWN["activation_checkpointing"] if train.activation_checkpointing else 1.0
    if train.zero_stage == 3:
        factor *= SLOWDOWN["zero3"]
    return factor * SLOWDOWN.get(train.offload, 1.0)


def change_factor(train: Any, patch: Dict[str, Any]) -> float:
    """Step-time factor of applying ``patch`` (a ladder patch) to ``train``."""
    after = train_after(train, patch)
    factor = config_factor(after) / config_factor(train)
    if after.micro_batch_size < train.micro_batch_size:
        factor *= SLOWDOWN["micro_batch_halving"] ** math.log2(train.micro_batch_size / after.micro_batch_size)
    return factor


def step_seconds(cfg: Any, gpu_type: Optional[str], mfu: float,
                 measured: Optional[Tuple[str, float]] = None) -> Optional[float]:
    """Seconds per step of ``cfg`` as it is on ``gpu_type``: a measured ``(gpu type, seconds)`` scaled by the
    peaks when there is one, else the FLOPs estimate. None when the GPU's peak or the FLOPs are unknown."""
    peak = peak_tflops(gpu_type)
    if peak is None:
        return None
    if measured is not None and peak_tflops(measured[0]):
        return measured[1] * peak_tflops(measured[0]) / peak
    flops = flops_per_step(cfg)
    if flops is None:
        return None
    return flops / (peak * 1e12 * _ranks(cfg) * mfu) * config_factor(cfg.train)


def _fit(cfg: Any, capacity: Optional[float], *, must_change: bool, scale: float, offload_allowed: bool,
         headroom: float) -> Tuple[Dict[str, Any], str, Optional[float], Optional[bool], str]:
    """(patch, its description, estimated bytes after it, fits, blocked) for one GPU size.

    ``must_change``: the job ran out of memory on this partition, so it takes at least the next rung (as
    :func:`hpc_agent.policy.memory.gpu_oom_fit` does), climbing to the first that fits by the calibrated estimate."""
    ranks = _ranks(cfg)
    if not _estimated(cfg) or not capacity:
        need = estimate_from_config(cfg).total_bytes * scale if _estimated(cfg) else None
        if not must_change:
            return {}, "as is", need, None, ""
        rung = gpu_oom_rung(cfg.train, ranks, offload_allowed)
        if rung is None:
            return {}, "as is", need, False, "the OOM ladder is used up here"
        return rung[0], rung[1], None, None, ""
    budget = capacity * headroom
    need = estimate_from_config(cfg).total_bytes * scale
    if need <= budget and not must_change:
        return {}, "as is", need, True, ""
    fit = ladder_fit(cfg, budget, ranks, offload_allowed, scale)
    if fit is not None:
        return fit[0], fit[1], fit[2], True, ""
    if must_change:  # the estimate may be pessimistic: the next rung alone, as the watcher always tried
        rung = gpu_oom_rung(cfg.train, ranks, offload_allowed)
        if rung is not None:
            return rung[0], f"{rung[1]} (no rung fits by the estimate)", \
                estimate_with_patch(cfg, rung[0]).total_bytes * scale, None, ""
    return {}, "no rung fits", need, False, ""


def candidates(cfg: Any, facts: Sequence[Any], *, remaining_steps: int, explicit: Optional[str] = None,
               oom_on: Optional[str] = None, scale: float = 1.0, offload_allowed: bool = True,
               measured: Optional[Tuple[str, float]] = None, headroom: float = GPU_HEADROOM) -> List[Candidate]:
    """One candidate per partition fact (``hpc_agent.slurm.partition_facts.PartitionFacts``).

    ``explicit``: the partition the user named. ``oom_on``: the partition where the job just ran out of GPU
    memory (it takes a rung there; ``scale`` calibrates every estimate on that failure). ``measured``: the
    run's own step time on a GPU type."""
    placement = cfg.placement
    out: List[Candidate] = []
    for f in facts:
        capacity = f.gpu_gib * GIB if f.gpu_gib else None
        if cfg.slurm.gpus_per_node and not f.blocked:
            patch, what, need, fits, blocked = _fit(cfg, capacity, must_change=f.name == oom_on, scale=scale,
                                                    offload_allowed=offload_allowed, headroom=headroom)
        else:  # a CPU job (no GPU memory to fit), or a partition that cannot run it anyway
            patch, what, need, fits, blocked = {}, "as is", None, None, ""
        if patch:  # compact for the table: "micro_batch_size 4 -> 2, grad_accum_steps 1 -> 2"
            what = describe_patch(cfg.train, patch) + (" (no rung fits by the estimate)" if fits is None and
                                                       f.name == oom_on and capacity else "")
        base = step_seconds(cfg, f.gpu_type, placement.mfu, measured) if cfg.slurm.gpus_per_node else None
        run_s = base * change_factor(cfg.train, patch) * max(0, remaining_steps) \
            if base is not None and fits is not False else None
        out.append(Candidate(
            partition=f.name, gpu_type=f.gpu_type, gpu_gib=f.gpu_gib, change=dict(patch), change_text=what,
            need_bytes=need, fits=fits, start_s=f.start_s, run_s=run_s,
            gpus=int(cfg.slurm.nodes) * int(cfg.slurm.gpus_per_node),
            cost_per_gpu_hour=placement.cost_of(f.name, f.gpu_type),
            blocked=f.blocked or blocked, explicit=explicit is not None and f.name == explicit,
            node_gpus=int(getattr(f, "gpus_per_node", 0) or 0), default=bool(getattr(f, "default", False))))
    return out

"""The policy's placement rule (pure): after a GPU out-of-memory or a node fault, move the run to another
partition when that finishes sooner than the repair in place.

``policy.decide`` proposes the repair in place first (the next OOM-ladder rung, or the same partition without
the failed node). When the run's config has ``placement.mode: auto`` and the watcher gathered the partitions'
facts (``Situation.placement``), that proposal becomes one candidate among the partitions
(:mod:`hpc_agent.policy.partition_options`), and :func:`hpc_agent.policy.partitions.choose` picks by expected finish. The
decision keeps the proposal's cause and budgets; its patch becomes the winner's partition and change, and the
candidate table goes into the audit trail with it.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

GIB = 2**30


def weigh_partitions(proposed: Any, cfg: Any, situation: Any, limits: Any, oom: bool) -> Any:
    """``proposed`` (a ``policy.Decision`` to resubmit in place), or the same decision moved to the partition that
    finishes first. Unchanged without facts, with ``placement.mode`` off, or when nothing can run the job."""
    facts = situation.placement
    if not facts or getattr(cfg.placement, "mode", "off") != "auto":
        return proposed
    from hpc_agent.policy.memory import estimate_from_config
    from hpc_agent.policy.partitions import choose
    from hpc_agent.policy.partition_options import candidates
    from hpc_agent.config.load import apply_patch

    here = cfg.slurm.partition
    base = apply_patch(cfg, {k: v for k, v in proposed.patch.items() if k.startswith("slurm.")})
    scale = 1.0
    if oom:  # calibrate on the failure, as the ladder does: what ran out of memory needed more than the GPU has
        capacity = situation.gpu_capacity_bytes or next(
            (f.gpu_gib * GIB for f in facts if f.name == here and f.gpu_gib), None)
        if capacity and cfg.train.workload == "gpt" and not cfg.train.command:
            scale = max(1.0, capacity / max(estimate_from_config(cfg).total_bytes, 1))
        if situation.gpu_capacity_bytes:  # the allocator's own word on the GPU it ran on beats the gres type's
            facts = tuple(replace(f, gpu_gib=situation.gpu_capacity_bytes / GIB) if f.name == here else f
                          for f in facts)
    remaining = situation.remaining_steps if situation.remaining_steps is not None else cfg.train.max_steps
    rows = candidates(base, facts, remaining_steps=remaining, oom_on=here if oom else None, scale=scale,
                      headroom=limits.gpu_headroom)
    choice = choose(rows, cfg.placement.tolerance_s)
    if choice.winner is None:
        return replace(proposed, reason=f"{proposed.reason} (placement: {choice.reason})", placement=choice.to_dict())
    patch = {k: v for k, v in proposed.patch.items() if k.startswith("slurm.")}
    patch.update(choice.patch)
    if patch.get("slurm.partition") == here:
        patch.pop("slurm.partition")
    moved = choice.winner.partition != here
    what = (f"move to {choice.winner.partition}" + (f" with {choice.winner.change_text}" if choice.winner.change
                                                     else " as is")) if moved else f"stay on {here}"
    zero_changed = "train.zero_stage" in patch and patch["train.zero_stage"] != cfg.train.zero_stage
    return replace(proposed, patch=patch, reason=f"{proposed.reason.split(':', 1)[0]}: {what} ({choice.reason})",
                   placement=choice.to_dict(), needs_universal_checkpoint=zero_changed)

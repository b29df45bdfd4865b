"""``submit --place auto``: choose the partition, print the table of candidates and why one won.

The imperative shell around the pure chooser: one ``sinfo`` and a bounded number of ``sbatch --test-only``
calls (:mod:`hpc_agent.slurm.partition_facts`), the candidates (:func:`hpc_agent.policy.partitions.candidates`), the choice
(:mod:`hpc_agent.policy.partitions`). The winner's partition, and the ladder rung it needs to fit, become part of the
run's config, so the job script, the memory check and the watcher's later decisions all see them.
``--dry-run`` prints the same table and submits nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional


@dataclass(frozen=True)
class Placed:
    cfg: Any
    """The config to submit: the winner's partition and change applied (unchanged when placement is off)."""
    lines: List[str]
    """The table and the reason, for the user."""
    error: Optional[str] = None
    """Set when no partition can run the job: nothing should be submitted."""
    choice: Any = None


def with_mode(cfg: Any, mode: str) -> Any:
    """``cfg`` with ``placement.mode`` set (``--place`` wins over the config)."""
    from hpc_agent.config.load import apply_patch

    return apply_patch(cfg, {"placement.mode": mode})


def place(cfg: Any, slurm: Any) -> Placed:
    """Choose the partition for a fresh submission of ``cfg`` (``placement.mode`` auto)."""
    from hpc_agent.config.problems import ConfigError
    from hpc_agent.policy.partitions import choose
    from hpc_agent.slurm.partition_facts import collect
    from hpc_agent.policy.partitions import candidates
    from hpc_agent.config.load import apply_patch
    from hpc_agent.slurm.cli import SlurmError

    p = cfg.placement
    explicit = cfg.slurm.partition or None
    try:
        facts = collect(slurm, cfg, only=p.partitions, timeout_s=p.test_only_timeout_s, max_tests=p.max_candidates)
    except SlurmError as exc:
        return Placed(cfg, [], f"--place auto needs sinfo, which failed: {exc}")
    choice = choose(candidates(cfg, facts, remaining_steps=cfg.train.max_steps, explicit=explicit), p.tolerance_s)
    lines = ["placement (expected finish = earliest start from sbatch --test-only + estimated run time):",
             *("  " + line for line in choice.table()), f"placement: {choice.reason}"]
    if choice.winner is None:
        return Placed(cfg, lines, f"no partition can run the job: {choice.reason}", choice)
    # Recorded in the run's config: after a GPU OOM or a node fault the watcher weighs the partitions again
    # (placement.partitions: [one] pins a run to one partition for good).
    patch = {**choice.patch, "placement.mode": "auto"}
    try:
        placed = apply_patch(cfg, patch)
    except ConfigError as exc:  # a partition name sinfo printed that the config refuses: say it, submit nothing
        return Placed(cfg, lines, f"the chosen placement is not a valid config: {exc.render()}", choice)
    return Placed(placed, lines, None, choice)

"""The ``placement:`` section: let ``submit`` (``--place auto``) and the watcher choose the partition.

Off by default: a config that names ``slurm.partition`` keeps today's behaviour. With ``mode: auto`` the
partitions below (or every partition ``sinfo`` shows you) are compared by expected finish time: the memory
estimate on each partition's GPUs, Slurm's earliest start (``sbatch --test-only``), the GPUs' speed and an
optional cost. A partition named explicitly (``slurm.partition`` in the config or on the command line)
always wins. docs/placement.md explains the table it prints.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List

from hpc_agent.config.checks import raise_if
from hpc_agent.config.fields import NAME_RE
from hpc_agent.config.problems import Problem

MODES = ("off", "auto")


@dataclass
class PlacementConfig:
    """How the partition is chosen (``submit --place auto`` sets ``mode: auto``)."""

    mode: str = "off"
    """``off``: submit to ``slurm.partition`` (or the cluster's default). ``auto``: choose the partition with the
    earliest expected finish at submit, and again after a GPU out-of-memory or a node fault."""

    partitions: List[str] = field(default_factory=list)
    """The partitions you may use and want considered; empty: every partition ``sinfo`` shows you."""

    cost_per_gpu_hour: Dict[str, float] = field(default_factory=dict)
    """Optional price of one GPU-hour, by partition name or GPU type (``{gpu_big: 4.0, a10: 1.0}``): breaks ties
    between partitions that finish at about the same time, and is shown in the table."""

    tolerance_s: float = 300.0
    """Expected finish times within this many seconds count as a tie (the estimates are rough); a tie goes to the
    cheaper, then the smaller GPU, so big GPUs stay free for jobs that need them."""

    mfu: float = 0.35
    """Model FLOPs utilisation assumed for the time estimate before the run has measured its own step time (a
    careful FP16 run reaches 0.3-0.5 of the GPU's dense peak)."""

    max_candidates: int = 8
    """At most this many ``sbatch --test-only`` calls (one per partition)."""

    test_only_timeout_s: float = 10.0
    """Timeout of each ``sbatch --test-only`` call; a partition whose call times out ranks last."""

    def problems(self) -> List[Problem]:
        problems: List[Problem] = []
        if self.mode not in MODES:
            problems.append(Problem("placement.mode", self.mode, "off or auto"))
        for name in self.partitions or []:
            if not isinstance(name, str) or not NAME_RE.match(name):
                problems.append(Problem("placement.partitions", name, "partition names (letters, digits, . _ -)"))
        for key, value in (self.cost_per_gpu_hour or {}).items():
            if not isinstance(key, str) or not NAME_RE.match(key):
                problems.append(Problem("placement.cost_per_gpu_hour", key, "partition names or GPU types as keys"))
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
                problems.append(Problem(f"placement.cost_per_gpu_hour.{key}", value, "a price of 0 or more"))
        for name, low in (("tolerance_s", 0.0), ("test_only_timeout_s", 0.1)):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < low:
                problems.append(Problem(f"placement.{name}", value, f"a number of seconds >= {low:g}"))
        if not isinstance(self.mfu, (int, float)) or not 0 < self.mfu <= 1:
            problems.append(Problem("placement.mfu", self.mfu, "a fraction in (0, 1], e.g. 0.35"))
        if not isinstance(self.max_candidates, int) or not 1 <= self.max_candidates <= 64:
            problems.append(Problem("placement.max_candidates", self.max_candidates, "a whole number from 1 to 64"))
        return problems

    def __post_init__(self) -> None:
        raise_if(self.problems())

    def cost_of(self, partition: str, gpu_type: str | None) -> float | None:
        """The price per GPU-hour for a partition: by its name first, then by its GPU type."""
        costs = self.cost_per_gpu_hour or {}
        if partition in costs:
            return float(costs[partition])
        return float(costs[gpu_type]) if gpu_type and gpu_type in costs else None

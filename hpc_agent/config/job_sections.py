"""Config sections for what the job trains on: model size, data, and fault injection."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

from hpc_agent.config.checks import check_choice, check_positive, raise_if
from hpc_agent.config.problems import Problem

IMBALANCE_METHODS = ("none", "class_weight", "weighted_sampler", "mixup", "smote")


@dataclass
class ModelConfig:
    """Model size. ``gpt`` uses all fields; ``classifier`` (an MLP) uses d_model, n_layers and dropout."""

    n_layers: int = 2
    """Transformer blocks (gpt) or hidden layers (classifier)."""

    d_model: int = 64
    """Width of the residual stream (gpt) or of each hidden layer (classifier)."""

    n_heads: int = 4
    """Attention heads (gpt); must divide d_model."""

    seq_len: int = 64
    """Context length in bytes (gpt)."""

    dropout: float = 0.0
    """Dropout probability."""

    def problems(self) -> List[Problem]:
        problems: List[Problem] = []
        check_positive("model", self, ["n_layers", "d_model", "n_heads", "seq_len"], problems)
        if self.n_heads and self.d_model and self.n_heads > 0 and self.d_model % self.n_heads:
            problems.append(Problem("model.n_heads", self.n_heads, f"a divisor of model.d_model={self.d_model}"))
        if self.dropout is None or not 0 <= self.dropout < 1:
            problems.append(Problem("model.dropout", self.dropout, "a probability in [0, 1)"))
        return problems

    def __post_init__(self) -> None:
        raise_if(self.problems())


@dataclass
class DataConfig:
    """Training data. Nothing is downloaded: text ships with the repo, tabular data is generated."""

    path: Optional[str] = None
    """gpt: a UTF-8 text file (default: the corpus shipped in launch/data). classifier: a CSV whose last
    column is the integer label (default: a generated imbalanced dataset)."""

    num_classes: int = 5
    """classifier, generated data: number of classes."""

    num_features: int = 32
    """classifier, generated data: number of features."""

    num_samples: int = 20000
    """classifier, generated data: number of training samples."""

    imbalance_ratio: float = 50.0
    """classifier, generated data: samples of the largest class per sample of the smallest (>= 1)."""

    imbalance_method: str = "none"
    """classifier: ``none`` (plain cross-entropy), ``class_weight`` (weighted loss), ``weighted_sampler``,
    ``mixup`` or ``smote`` (imbalanced-learn oversampling)."""

    def problems(self) -> List[Problem]:
        problems: List[Problem] = []
        check_positive("data", self, ["num_classes", "num_features", "num_samples"], problems)
        if self.imbalance_ratio is None or self.imbalance_ratio < 1:
            problems.append(Problem("data.imbalance_ratio", self.imbalance_ratio, "1 or more"))
        check_choice("data.imbalance_method", self.imbalance_method, IMBALANCE_METHODS, problems)
        return problems

    def __post_init__(self) -> None:
        raise_if(self.problems())


@dataclass
class FaultsConfig:
    """Fault injection for tests and the chaos suite. Everything is off (0) by default."""

    oom_above_micro_batch: int = 0
    """Raise a real out-of-memory error in the forward pass while micro_batch_size is above this."""

    oom_at_step: int = 0
    """Raise an out-of-memory error in the forward pass of this step, once per process (a transient fault, as a
    fragmented GPU gives: a repair in the job replays the step without it)."""

    host_alloc_mb: int = 0
    """Allocate (and touch) this many MB of host memory at ``host_alloc_step``: the cgroup kills the job."""

    host_alloc_step: int = 0
    """Step at which ``host_alloc_mb`` is allocated."""

    nan_at_step: int = 0
    """Make the loss NaN at this step."""

    grad_spike_at_step: int = 0
    """Multiply the gradient (not the loss's value) by 10^4 at this step (once per process): the norm before
    clipping jumps 10^4-fold, while ``train.grad_clip`` keeps the update bounded: a gradient explosion for the adaptive
    schedule (``adaptive:``) to see."""

    hang_at_step: int = 0
    """Stop making progress (sleep) at this step."""

    error_at_step: int = 0
    """Raise a plain Python error (a code bug) at this step."""

    gpu_memory_gib: float = 0.0
    """Simulate a GPU of this many GiB (0: off): the job raises a CUDA-style out-of-memory error, naming this
    capacity, in its first training forward when ``hpc_agent.policy.memory``'s per-GPU estimate for its config
    exceeds it (gpt workload). Unlike the other faults it fires in every attempt: it is the hardware, not
    a transient event, so only a config that fits gets past it."""

    gpu_memory_gib_by_partition: Dict[str, float] = field(default_factory=dict)
    """Like ``gpu_memory_gib``, but only in the named partitions (``SLURM_JOB_PARTITION``), e.g. ``{gpu_small:
    0.5}``: the same run runs out of memory on one partition's simulated GPUs and fits another's (placement
    tests on the localhost cluster, whose GPUs are fake)."""

    runtime_trigger: bool = False
    """Let a running job take faults from ``<run_dir>/chaos/inject.json`` (the chaos driver's hook: NaN, GPU
    OOM, host OOM, kill during a checkpoint save; see launch/chaos_trigger.py). Costs one stat per step."""

    gpu_critical_at_step: int = 0
    """Replace NVML with one simulated GPU that reports uncorrectable ECC errors from this step on, so the
    in-job health check (``train.gpu_health_every``) stops the job with exit code 82 (rank 0's node)."""

    first_attempt_only: bool = True
    """Fire the faults only in the run's first attempt, like a transient fault, so the retry can get past
    them; false replays them in every attempt, like a deterministic bug."""

    def problems(self) -> List[Problem]:
        problems: List[Problem] = []
        for name in ("oom_above_micro_batch", "oom_at_step", "gpu_memory_gib", "gpu_critical_at_step", "host_alloc_mb", "host_alloc_step", "nan_at_step", "grad_spike_at_step", "hang_at_step", "error_at_step"):
            value = getattr(self, name)
            if value is None or value < 0:
                problems.append(Problem(f"faults.{name}", value, "0 (off) or a positive number"))
        for part, gib in (self.gpu_memory_gib_by_partition or {}).items():
            if not isinstance(gib, (int, float)) or isinstance(gib, bool) or gib <= 0:
                problems.append(Problem(f"faults.gpu_memory_gib_by_partition.{part}", gib, "a positive number of GiB"))
        return problems

    def simulated_gpu_gib(self, partition: Optional[str]) -> float:
        """The simulated GPU's GiB in ``partition`` (0: none): the partition's own entry, else ``gpu_memory_gib``."""
        by_partition = self.gpu_memory_gib_by_partition or {}
        return float(by_partition.get(partition or "", 0) or self.gpu_memory_gib or 0)

    def __post_init__(self) -> None:
        raise_if(self.problems())

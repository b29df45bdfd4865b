"""The config schema: structured dataclasses, one docstring per field.

Each section checks itself in ``__post_init__`` and raises :class:`ConfigError`
with *every* problem it found, each naming the key path, the bad value and what
would be accepted. ``hpc_agent.config.load`` builds the sections one by one so
that problems from all sections (plus type and unknown-key errors) are reported
together.

The field docstrings (string literals right after a field) are read by
``hpc_agent.config.docs`` for the config reference (``hpc-agent config``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from hpc_agent.config.adaptive import AdaptiveConfig, adaptive_problems
from hpc_agent.config.checks import MEM_RE, NAME_RE, TIME_RE, check_choice, check_positive, check_shell_safe, raise_if
from hpc_agent.config.fields import owned_option_problem, path_problem
from hpc_agent.config.job_sections import IMBALANCE_METHODS, DataConfig, FaultsConfig, ModelConfig
from hpc_agent.config.notify import NotifyConfig, mail_problems
from hpc_agent.config.placement import PlacementConfig
from hpc_agent.config.problems import Problem
from hpc_agent.config.profile import Profile
from hpc_agent.config.resilience import ResilienceConfig
from hpc_agent.config.user_code import ContainerConfig, command_problems, workload_problem

REDUCE_BUCKET_SIZE = 500_000_000  # DeepSpeed's default zero_optimization.reduce_bucket_size (elements)

PRECISIONS = ("auto", "fp16", "bf16", "fp32")
OFFLOADS = ("none", "optimizer", "optimizer+params")
__all__ = ["Config", "RunConfig", "SlurmConfig", "TrainConfig", "WatchConfig", "ModelConfig", "DataConfig",
           "FaultsConfig", "ResilienceConfig", "ContainerConfig", "Profile", "NotifyConfig", "PlacementConfig",
           "AdaptiveConfig", "SECTIONS", "IMBALANCE_METHODS"]

@dataclass
class RunConfig:
    """Where the run lives and what it is called."""

    name: str = "run"
    """Short run name. The run directory is ``<runs_root>/<name>-<timestamp>``; the run id is that
    directory's name and is carried in the Slurm job name so the watcher can find the job again."""

    runs_root: str = "./runs"
    """Directory that holds all run directories and the ledger. The environment variable
    ``HPC_AGENT_RUNS`` overrides the YAML value; a ``run.runs_root=...`` CLI override beats both."""

    group_readable: bool = False
    """Let your group read this run: its directory is created 0750 and its files 0640 instead of 0700 and
    0600 (others never get access). A runs root that submit creates gets the same mode, and the ledger
    follows the runs root's mode: group-readable only in a root shared with the group alone (0750/0770)."""

    def problems(self) -> List[Problem]:
        problems: List[Problem] = []
        if not NAME_RE.match(str(self.name)):
            problems.append(Problem("run.name", self.name, "1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"))
        check_shell_safe("run.runs_root", self.runs_root, problems)
        if not str(self.runs_root).strip():
            problems.append(Problem("run.runs_root", self.runs_root, "a directory path"))
        return problems

    def __post_init__(self) -> None:
        raise_if(self.problems())


@dataclass
class SlurmConfig:
    """What the job asks Slurm for. Every string here is written into ``#SBATCH`` lines."""

    partition: Optional[str] = None
    """Partition (queue) to submit to; None uses the cluster's default partition."""

    account: Optional[str] = None
    """Account to charge; None uses your default account."""

    qos: Optional[str] = None
    """Quality of service; None uses the default."""

    nodes: int = 1
    """Number of nodes."""

    tasks_per_node: int = 1
    """Training processes per node (one per GPU on GPU nodes). Each is one rank of the srun step."""

    gpus_per_node: int = 0
    """GPUs per node; 0 means a CPU-only job (then FP16 is not available)."""

    gpu_memory_gib: float = 0.0
    """Memory of one GPU of the partition, in GiB, for submit's memory check; 0 looks it up from the
    partition's GPU type (``sinfo`` gres such as ``gpu:h100:8``) where that is unambiguous."""

    cpus_per_task: int = 1
    """CPU cores per training process."""

    mem: Optional[str] = "4G"
    """Memory per node as Slurm's ``--mem`` (e.g. ``4G``, ``16000M``); None leaves it to the partition default.
    Exceeding it ends the job as OUT_OF_MEMORY (the cgroup kills it)."""

    time: str = "01:00:00"
    """Time limit, in any form ``--time`` accepts (``MM``, ``HH:MM:SS``, ``D-HH:MM:SS``)."""

    constraint: Optional[str] = None
    """Node features to require (``--constraint``)."""

    exclude: Optional[str] = None
    """Nodes to avoid (``--exclude``), e.g. ``node3,node7``. The watcher adds failed nodes here."""

    requeue: bool = True
    """Submit with ``--requeue`` so Slurm requeues the job after a preemption or node failure."""

    signal_lead_s: int = 120
    """Seconds before the time limit at which Slurm sends SIGUSR2 (``--signal=USR2@N``) so the job can
    checkpoint in time."""

    python: Optional[str] = None
    """The Python interpreter the job runs, as the compute nodes see it (e.g. a venv on the shared file
    system). None: the one running submit (``sys.executable``). Ignored in a container, which runs
    ``container.python``. ``doctor`` checks that it exists on a compute node."""

    allow_gpu_task_mismatch: bool = False
    """Accept ``tasks_per_node`` different from ``gpus_per_node``. Normally each GPU gets one rank, and a
    mismatch means DeepSpeed uses fewer GPUs than you pay for; set this when your command starts its own
    processes per GPU (e.g. torchrun)."""

    template: str = "default"
    """Name of the file in ``sbatch_templates/`` (without ``.yaml``) that supplies the environment setup
    lines and srun options of the job script. Looked for in ``sbatch_templates/`` next to the config file,
    then in the current directory (``hpc-agent init`` makes one), then among the shipped templates."""

    extra_sbatch: Dict[str, Optional[str]] = field(default_factory=dict)
    """Further sbatch options as ``{option: value}``, e.g. ``{mail-type: END}``. An empty value makes a
    bare flag (``--option``), as does null. The options hpc_agent sets or depends on (``output``, ``signal``,
    ``open-mode``, ``array``, ``requeue``, ``job-name``, ``comment``, ``partition``, ``time``... and any
    abbreviation of them) are refused, naming the setting to use instead (docs/config.md lists them)."""

    env_in_metadata: List[str] = field(default_factory=list)
    """Keys that may take a value from the environment (``${oc.env:NAME}``) although it reaches Slurm's
    metadata, e.g. ``[account]``. Without this, such a value is refused: ``#SBATCH`` options, the job name
    and the log paths (from ``run.runs_root``) are readable by every user of the cluster (``squeue``,
    ``sacct``). Names are ``slurm.`` keys (``account``, ``extra_sbatch.reservation``) or ``run.name`` /
    ``run.runs_root``."""

    def problems(self) -> List[Problem]:
        problems: List[Problem] = []
        check_positive("slurm", self, ["nodes", "tasks_per_node", "cpus_per_task", "signal_lead_s"], problems)
        if self.gpus_per_node is None or self.gpus_per_node < 0:
            problems.append(Problem("slurm.gpus_per_node", self.gpus_per_node, "0 (CPU only) or a positive number"))
        if self.gpu_memory_gib is None or self.gpu_memory_gib < 0:
            problems.append(Problem("slurm.gpu_memory_gib", self.gpu_memory_gib, "0 (look it up) or the GiB of one GPU"))
        if (self.gpus_per_node and self.tasks_per_node and self.gpus_per_node > 0 and self.tasks_per_node > 0
                and self.gpus_per_node != self.tasks_per_node and not self.allow_gpu_task_mismatch):
            problems.append(Problem(
                "slurm.tasks_per_node", self.tasks_per_node,
                f"{self.gpus_per_node} (one rank per GPU: slurm.gpus_per_node={self.gpus_per_node}; otherwise "
                f"DeepSpeed uses {min(self.tasks_per_node, self.gpus_per_node)} of the {self.gpus_per_node} GPUs per node); "
                f"or set slurm.gpus_per_node={self.tasks_per_node}, or slurm.allow_gpu_task_mismatch=true if your "
                "command starts one process per GPU itself"))
        if self.python is not None and (not str(self.python).startswith("/") or path_problem(str(self.python), sbatch=False)):
            why = path_problem(str(self.python), sbatch=False)
            problems.append(Problem("slurm.python", self.python, "an absolute path to a Python interpreter as the "
                                    "compute nodes see it, e.g. /shared/venvs/train/bin/python (or null: this one)"
                                    + (f"; {why}" if why else "")))
        for name in ("partition", "account", "qos", "constraint", "exclude", "mem", "time", "template"):
            check_shell_safe(f"slurm.{name}", getattr(self, name), problems)
        if self.mem is not None and not MEM_RE.match(str(self.mem)):
            problems.append(Problem("slurm.mem", self.mem, "a size such as 4G, 16000M or 500000K"))
        if not TIME_RE.match(str(self.time)):
            problems.append(Problem("slurm.time", self.time, "a Slurm time such as 30, 01:00:00 or 1-12:00:00"))
        if not re.match(r"^[A-Za-z0-9_-]+$", str(self.template)):
            problems.append(Problem("slurm.template", self.template, "a template file name from sbatch_templates/ without .yaml"))
        for key, value in (self.extra_sbatch or {}).items():
            if not re.match(r"^[a-z][a-z0-9-]*$", str(key)):
                problems.append(Problem(f"slurm.extra_sbatch.{key}", value, "an sbatch long option name such as mail-type"))
            elif why := owned_option_problem(str(key)):  # a bare flag (null) too: check_shell_safe skips None
                problems.append(Problem(f"slurm.extra_sbatch.{key}", value, why))
            check_shell_safe(f"slurm.extra_sbatch.{key}", value, problems)
        return problems

    def __post_init__(self) -> None:
        raise_if(self.problems())


@dataclass
class TrainConfig:
    """What the training job does; turned into a DeepSpeed config inside the job."""

    workload: str = "gpt"
    """Which model and data: ``gpt`` (byte-level GPT on text shipped with the repo), ``classifier`` (MLP on a
    generated, imbalanced dataset), or your own as ``package.module:build``: an importable callable that
    takes ``(cfg, device)`` and returns an object following the Workload protocol (docs/your_model.md)."""

    command: Optional[List[str]] = None
    """Run your own training script instead of a workload: an argv list such as ``[python, train.py, --epochs,
    '3']``, run once per rank under srun (never through a shell). The job gives it the DeepSpeed config, run
    directory, checkpoint directory and resume tag in the environment (docs/your_script.md)."""

    snapshot_code: bool = True
    """Copy your code (the ``train.workload`` package, or the project of ``train.command``'s script: its git
    work tree's files, else its folder, less what ``.gitignore``/``.hpcignore`` leave out) into the run
    directory at submit and run that copy in every attempt, so a requeue a day later runs the code you
    submitted, not what the checkout holds then. Its content hash and git commit are in ``run.json``."""

    snapshot_max_mib: int = 200
    """The most the code snapshot may hold, in MiB: past it submit stops (exit 2) and names the biggest
    folders and files, to leave out with ``.hpcignore`` (docs/your_script.md)."""

    snapshot_max_files: int = 20000
    """The most files the code snapshot may hold (as ``snapshot_max_mib``)."""

    max_steps: int = 100
    """Optimizer steps to train for."""

    micro_batch_size: int = 8
    """Samples per rank per forward pass. Global batch = micro_batch_size x grad_accum_steps x ranks."""

    grad_accum_steps: int = 1
    """Micro-batches accumulated per optimizer step."""

    lr: float = 3e-4
    """Peak learning rate (AdamW), reached after the warmup."""

    warmup_steps: int = 10
    """Linear warmup steps; cosine decay follows until max_steps."""

    precision: str = "auto"
    """``auto`` (FP16 on CUDA, BF16 on CPU), ``fp16`` (GPU only: DeepSpeed has no FP16 on the CPU),
    ``bf16`` or ``fp32``."""

    zero_stage: int = 1
    """DeepSpeed ZeRO stage: 0 (plain data parallel) to 3 (parameters sharded too)."""

    offload: str = "none"
    """Offload to CPU memory: ``none``, ``optimizer`` (ZeRO 2 or 3) or ``optimizer+params`` (ZeRO 3)."""

    activation_checkpointing: bool = False
    """Recompute each block's activations in the backward pass: less memory for ~1/3 more compute."""

    reduce_bucket_size: int = REDUCE_BUCKET_SIZE
    """DeepSpeed's gradient-reduction bucket in elements (ZeRO 1-3). Each GPU holds one buffer of this size
    in the 16-bit type (fp32 for fp32 training) whatever the model's size: 1 GB at DeepSpeed's default
    5e8. Smaller saves that memory on small models; larger means fewer, bigger collectives."""

    grad_clip: float = 1.0
    """Clip the global gradient norm to this value; 0 turns clipping off."""

    ckpt_every: int = 50
    """Save a checkpoint every N optimizer steps (and always on SIGUSR2/SIGTERM)."""

    gpu_health_every: int = 500
    """Check the GPUs' health (NVML: ECC, retired pages, Xid, temperature, throttling) at the start and
    every N steps, logging the readings to TensorBoard (``gpu_health/*``); a CRITICAL verdict ends the job
    with exit code 82 so the watcher excludes the node. 0 turns the checks off. Costs one NVML query."""

    keep_checkpoints: int = 3
    """How many recent checkpoints to keep; the newest complete one is never deleted."""

    seed: int = 1234
    """Random seed for model init, data order and dropout."""

    loader_workers: int = 2
    """Data-loader worker processes per rank, for data loading of your own: a workload of your own reads
    ``cfg.train.loader_workers`` and a ``train.command`` script gets it as ``HPC_AGENT_LOADER_WORKERS`` (e.g. for
    ``DataLoader(num_workers=...)``); the built-in workloads load their data in the training process and start
    none. Workers pass batches through shared memory (/dev/shm): after a ``shm_exhausted`` end the watcher halves
    this (down to 0), then asks for more ``slurm.mem``. 0: load in the training process."""

    log_every: int = 1
    """Write TensorBoard scalars every N optimizer steps."""

    eval_every: int = 0
    """Run the workload's evaluation every N steps (0: only at the end)."""

    min_lr_ratio: float = 0.1
    """The cosine decay ends at ``lr * min_lr_ratio``."""

    weight_decay: float = 0.1
    """AdamW weight decay."""

    initial_scale_power: int = 16
    """FP16 only: the dynamic loss scale starts at ``2**initial_scale_power``."""

    loss_scale_window: int = 1000
    """FP16 only: steps without overflow before the loss scale is doubled."""

    hysteresis: int = 2
    """FP16 only: overflows tolerated before the loss scale is lowered."""

    min_loss_scale: float = 1.0
    """FP16 only: the loss scale never drops below this; hitting it repeatedly means divergence."""

    def problems(self) -> List[Problem]:
        problems: List[Problem] = []
        check_positive("train", self, ["max_steps", "micro_batch_size", "grad_accum_steps", "lr", "ckpt_every", "keep_checkpoints", "log_every", "reduce_bucket_size",
                                            "snapshot_max_mib", "snapshot_max_files"], problems)
        if why := workload_problem(self.workload):
            problems.append(Problem("train.workload", self.workload, why))
        problems += command_problems(self.command)
        check_choice("train.precision", self.precision, PRECISIONS, problems)
        check_choice("train.offload", self.offload, OFFLOADS, problems)
        if self.zero_stage not in (0, 1, 2, 3):
            problems.append(Problem("train.zero_stage", self.zero_stage, "0, 1, 2 or 3"))
        elif self.offload == "optimizer" and self.zero_stage < 2:
            problems.append(Problem("train.offload", self.offload, "offload needs train.zero_stage=2 or 3 (or set train.offload=none)"))
        elif self.offload == "optimizer+params" and self.zero_stage != 3:
            problems.append(Problem("train.offload", self.offload, "parameter offload needs train.zero_stage=3 (or use train.offload=optimizer)"))
        if self.warmup_steps is None or self.warmup_steps < 0:
            problems.append(Problem("train.warmup_steps", self.warmup_steps, "0 or more"))
        if self.grad_clip is None or self.grad_clip < 0:
            problems.append(Problem("train.grad_clip", self.grad_clip, "0 (off) or a positive norm"))
        if self.gpu_health_every is None or self.gpu_health_every < 0:
            problems.append(Problem("train.gpu_health_every", self.gpu_health_every, "0 (off) or a positive step count"))
        if self.loader_workers is None or self.loader_workers < 0:
            problems.append(Problem("train.loader_workers", self.loader_workers, "0 (load in the training process) "
                                    "or a number of worker processes"))
        if self.eval_every is None or self.eval_every < 0:
            problems.append(Problem("train.eval_every", self.eval_every, "0 (only at the end) or a positive step count"))
        if self.min_lr_ratio is None or not 0 <= self.min_lr_ratio <= 1:
            problems.append(Problem("train.min_lr_ratio", self.min_lr_ratio, "a fraction between 0 and 1"))
        if self.weight_decay is None or self.weight_decay < 0:
            problems.append(Problem("train.weight_decay", self.weight_decay, "0 or more"))
        check_positive("train", self, ["loss_scale_window", "hysteresis", "min_loss_scale"], problems)
        if self.initial_scale_power is None or not 0 <= self.initial_scale_power <= 32:
            problems.append(Problem("train.initial_scale_power", self.initial_scale_power, "0 to 32"))
        return problems

    def __post_init__(self) -> None:
        raise_if(self.problems())


@dataclass
class WatchConfig:
    """How the watcher treats this run (used by ``python -m hpc_agent.watch``)."""

    enabled: bool = True
    """Let the watcher requeue or resubmit this run when an attempt fails."""

    max_retries: int = 8
    """Overall retry budget across all causes."""

    def problems(self) -> List[Problem]:
        problems: List[Problem] = []
        if self.max_retries is None or self.max_retries < 0:
            problems.append(Problem("watch.max_retries", self.max_retries, "0 or more"))
        return problems

    def __post_init__(self) -> None:
        raise_if(self.problems())


@dataclass
class Config:
    """A whole run: where it lives, what it asks Slurm for, how it trains, how it is watched."""

    run: RunConfig = field(default_factory=RunConfig)
    """Run name and location."""

    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    """Slurm resources and job script options."""

    train: TrainConfig = field(default_factory=TrainConfig)
    """Training settings."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """Model size."""

    data: DataConfig = field(default_factory=DataConfig)
    """Training data."""

    faults: FaultsConfig = field(default_factory=FaultsConfig)
    """Fault injection (tests and chaos runs only)."""

    watch: WatchConfig = field(default_factory=WatchConfig)
    """Watcher settings."""

    resilience: ResilienceConfig = field(default_factory=ResilienceConfig)
    """Heartbeat, hang detection, in-job recovery and snapshots."""

    container: ContainerConfig = field(default_factory=ContainerConfig)
    """Run the job inside a container image (pyxis or Apptainer)."""

    notify: NotifyConfig = field(default_factory=NotifyConfig)
    """Notifications: a command, a webhook, Slurm's mail."""

    placement: PlacementConfig = field(default_factory=PlacementConfig)
    """Choosing the partition by expected finish time (submit --place auto; docs/placement.md)."""

    adaptive: AdaptiveConfig = field(default_factory=AdaptiveConfig)
    """Adapting the LR schedule inside the job (warm restarts, decays); off by default."""

    profile: Profile = field(default_factory=Profile)
    """The cluster profile: GPU request style, activation lines, Slurm quirks (docs/profiles.md)."""

    env_origin: Dict[str, List[str]] = field(default_factory=dict)
    """Written by the loader, not by you: which keys took their value from ``${oc.env:NAME}`` at submit and
    from which variables (names only, never values). Kept in the run's config snapshot."""

    def problems(self) -> List[Problem]:
        """Checks that span sections (each section has already checked itself)."""
        problems: List[Problem] = []
        if self.train.precision == "fp16" and not self.slurm.gpus_per_node:
            problems.append(Problem(
                "train.precision", "fp16",
                "bf16, fp32 or auto: FP16 needs a CUDA GPU and slurm.gpus_per_node is 0 "
                "(DeepSpeed has no FP16 on the CPU); or ask for GPUs with slurm.gpus_per_node=1",
            ))
        problems += mail_problems(self.notify, self.slurm.extra_sbatch)
        problems += adaptive_problems(self.adaptive, self.train)
        return problems

    def __post_init__(self) -> None:
        raise_if(self.problems())


SECTIONS = {"run": RunConfig, "slurm": SlurmConfig, "train": TrainConfig, "model": ModelConfig,
            "data": DataConfig, "faults": FaultsConfig, "watch": WatchConfig,
            "resilience": ResilienceConfig, "container": ContainerConfig, "profile": Profile, "notify": NotifyConfig,
            "placement": PlacementConfig, "adaptive": AdaptiveConfig}

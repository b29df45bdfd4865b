"""Exit codes of ``python -m launch.train`` (one table, also in docs/exit_codes.md).

Slurm records the highest exit code of the srun step's tasks, so the watcher can tell outcomes
apart from ``sacct``'s ExitCode alone. The non-zero codes avoid 2 (argparse/usage), 126-127
(shell) and 128+N (killed by signal N). 65-78 follow BSD ``sysexits.h`` where a meaning fits.
"""
from __future__ import annotations

OK = 0
"""Trained to ``train.max_steps`` (or found the run already finished) and saved the final checkpoint."""

CRASHED = 1
"""Uncaught Python exception: a code bug (also ``faults.error_at_step``). Retrying will not help."""

OUT_OF_MEMORY = 3
"""The allocator raised out-of-memory (CUDA OOM, or ``faults.oom_above_micro_batch``): a smaller
``train.micro_batch_size`` (with a larger ``grad_accum_steps``), a higher ZeRO stage or offload may fit."""

DIVERGED = 65
"""The loss became NaN/inf (EX_DATAERR). No checkpoint is written for the poisoned state; resume
from the last complete checkpoint with a lower ``train.lr`` or another precision."""

UNAVAILABLE = 69
"""The requested precision or backend is not available on this machine (EX_UNAVAILABLE), e.g.
``train.precision=fp16`` on a node without CUDA. Retrying on the same kind of node will not help."""

ENVIRONMENT = 72
"""The job's software environment lacks something a retry will not bring (EX_OSFILE): a DeepSpeed op
that was never prepared for this Python/torch/DeepSpeed (a job never compiles one: run
``python -m hpc_agent.prepare``), or an optional package (``pip install 'hpc_agent[EXTRA]'``). The log line
``[hpc_agent] environment problem: ...`` names what is missing and the command that fixes it."""

PREEMPTED = 75
"""SIGTERM (preemption, scancel) or SIGUSR2 (time limit near) arrived; a complete checkpoint was
written and the run can resume from it (EX_TEMPFAIL: try again later)."""

CONFIG = 78
"""The config snapshot is invalid, or the resume cannot honour the change from the checkpoint's
layout (e.g. the global batch changed) (EX_CONFIG). Fix the config; retrying as is will not help."""

GPU_CRITICAL = 82
"""The in-job GPU health check (``train.gpu_health_every``) judged a GPU CRITICAL (uncorrectable ECC
errors, retired/remapped pages failing, Xid, GPU lost, over temperature). No checkpoint is written; the
watcher excludes the node and resubmits from the last complete checkpoint."""

NAMES = {OK: "ok", CRASHED: "crashed", OUT_OF_MEMORY: "out_of_memory", DIVERGED: "diverged",
         UNAVAILABLE: "unavailable", ENVIRONMENT: "environment", PREEMPTED: "preempted", CONFIG: "config",
         GPU_CRITICAL: "gpu_critical"}

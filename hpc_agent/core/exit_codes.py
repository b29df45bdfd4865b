"""Exit codes of the training job that name their own cause: the one table to align with ``launch/``.

The training process (``python -m launch.train``, run by srun in every task) says why it stopped by its
exit status (``docs/exit_codes.md``); sacct reports it in ExitCode (``65:0``) on
the ``.0`` step, and the batch script passes it on to the allocation row. It also prints the code in
its last line (``[hpc_agent] ... exiting 65``), which :func:`announced_exit_code` reads, because the
status can be lost on the way (a wrapper that exits 0, a step killed afterwards).

The classifier uses this table only when the log names no cause itself: log evidence shows *which*
rank failed first, an exit status only says how one process ended. The Slurm state also comes first:
a job that exits 75 after SIGTERM is PREEMPTED (or CANCELLED by a person) in sacct, so 75 seen with
FAILED means SIGUSR2, the time-limit warning.

This module is the one exit-code table: the job's side (``launch/``) exits with these ``EXIT_*`` constants,
imported from here, so the two cannot drift. Adding a code: one ``EXIT_*`` constant and one
``ExitCodeMeaning`` row in ``_TABLE`` (with its short ``name``), then a row in ``docs/exit_codes.md``.
Pure, torch-free.

``placeholder=True`` marks a proposal that ``launch/`` does not produce yet.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, Iterable, Mapping, Optional, Tuple

from hpc_agent.core.causes import Cause


@dataclass(frozen=True)
class ExitCodeMeaning:
    code: int
    cause: Cause
    meaning: str
    placeholder: bool = False
    """True while ``launch/`` does not exit with this code (align, then flip to False)."""
    name: str = ""
    """The short name ``launch/`` and docs/exit_codes.md use (``out_of_memory``)."""


EXIT_OK = 0  # trained to train.max_steps (or found the run already done); not a cause, so not in EXIT_CODES
EXIT_CRASHED = 1
EXIT_OUT_OF_MEMORY = 3
EXIT_DIVERGED = 65
EXIT_UNAVAILABLE = 69
EXIT_ENVIRONMENT = 72
EXIT_RUN_DIR_BUSY = 73  # another live job holds the run directory's lease (hpc_agent/core/runlease.py); EX_CANTCREAT
EXIT_SIGNALLED_AFTER_CHECKPOINT = 75
EXIT_CONFIG = 78
EXIT_GPU_HEALTH_CRITICAL = 82  # launch/gpu_monitor.py: exclude the node and resubmit

_TABLE: Tuple[ExitCodeMeaning, ...] = (
    ExitCodeMeaning(EXIT_CRASHED, Cause.CODE_ERROR, "uncaught Python exception (a code bug)", name="crashed"),
    ExitCodeMeaning(EXIT_OUT_OF_MEMORY, Cause.GPU_OOM, "the allocator raised out-of-memory (CUDA OOM)",
                    name="out_of_memory"),
    ExitCodeMeaning(EXIT_DIVERGED, Cause.DIVERGED, "the loss became NaN/inf; no checkpoint written for it",
                    name="diverged"),
    ExitCodeMeaning(EXIT_UNAVAILABLE, Cause.CODE_ERROR,
                    "the requested precision/backend cannot run on this node (fix the config)", name="unavailable"),
    ExitCodeMeaning(EXIT_ENVIRONMENT, Cause.ENV_ERROR,
                    "the job's environment lacks a prepared DeepSpeed op or an optional package (fix, then resubmit)",
                    name="environment"),
    ExitCodeMeaning(EXIT_RUN_DIR_BUSY, Cause.RUN_DIR_BUSY,
                    "another live attempt (another job) holds the run directory's lease: did not train, not requeued",
                    name="run_dir_busy"),
    ExitCodeMeaning(EXIT_SIGNALLED_AFTER_CHECKPOINT, Cause.TIMEOUT,
                    "SIGUSR2 (time limit near) or SIGTERM caught, complete checkpoint written: resume",
                    name="preempted"),
    ExitCodeMeaning(EXIT_CONFIG, Cause.CODE_ERROR,
                    "invalid config, or the resume cannot honour the change from the checkpoint", name="config"),
    ExitCodeMeaning(EXIT_GPU_HEALTH_CRITICAL, Cause.GPU_HW_ERROR,
                    "the in-job GPU health check reported CRITICAL (ECC, Xid, GPU lost, temperature)",
                    name="gpu_critical"),
)

EXIT_CODES: Mapping[int, ExitCodeMeaning] = {m.code: m for m in _TABLE}

NAMES: Mapping[int, str] = {EXIT_OK: "ok", **{m.code: m.name for m in _TABLE if not m.placeholder}}
"""Every code the training job exits with -> its short name."""

# 0:125 in sacct is not an exit status: Slurm records signal field 125 for steps the cgroup OOM
# killer hit (the state is then OUT_OF_MEMORY).
SLURM_OOM_SIGNAL = 125

_ANNOUNCED = re.compile(r"\[hpc_agent\].{0,200}\b[Ee]xiting (\d+)\b")  # bounded: a job-written line may repeat the tag


def cause_for_exit(exit_status: Optional[int], signal: Optional[int],
                   table: Mapping[int, ExitCodeMeaning] = EXIT_CODES) -> Optional[ExitCodeMeaning]:
    """The table entry for an ``exit_status:signal`` pair, or None if it says nothing specific."""
    if signal == SLURM_OOM_SIGNAL:
        return ExitCodeMeaning(SLURM_OOM_SIGNAL, Cause.HOST_OOM, "Slurm's OOM marker (ExitCode 0:125)")
    if exit_status is None:
        return None
    return table.get(exit_status)


def announced_exit_code(lines: Iterable[str]) -> Optional[Tuple[int, str]]:
    """The last ``[hpc_agent] ... exiting N`` line of a log: (N, line), or None."""
    found = None
    for line in lines:
        m = _ANNOUNCED.search(line[:2048]) if "[hpc_agent]" in line else None
        if m:
            found = (int(m.group(1)), line.strip())
    return found


def as_table(table: Mapping[int, ExitCodeMeaning] = EXIT_CODES) -> Dict[int, Dict[str, object]]:
    """The table as plain data (for docs and ``diagnose --json`` consumers)."""
    return {code: {"cause": m.cause.value, "meaning": m.meaning, "placeholder": m.placeholder}
            for code, m in sorted(table.items())}

"""Exit codes of ``python -m launch.train`` (what each means: docs/exit_codes.md).

The numbers have one home, :mod:`hpc_agent.diagnosis.exit_codes` (torch-free; the classifier reads the
same table); this module gives them the short names the job's code uses. Slurm records the highest
exit code of the srun step's tasks, so the watcher can tell outcomes apart from ``sacct``'s ExitCode
alone. The non-zero codes avoid 2 (argparse/usage), 126-127 (shell) and 128+N (killed by signal N);
65-78 follow BSD ``sysexits.h`` where a meaning fits.
"""
from __future__ import annotations

from hpc_agent.diagnosis.exit_codes import EXIT_CONFIG as CONFIG  # invalid config / layout change (EX_CONFIG)
from hpc_agent.diagnosis.exit_codes import EXIT_CRASHED as CRASHED  # uncaught exception: a code bug
from hpc_agent.diagnosis.exit_codes import EXIT_DIVERGED as DIVERGED  # NaN/inf loss (EX_DATAERR)
from hpc_agent.diagnosis.exit_codes import EXIT_ENVIRONMENT as ENVIRONMENT  # unprepared op / extra (EX_OSFILE)
from hpc_agent.diagnosis.exit_codes import EXIT_GPU_HEALTH_CRITICAL as GPU_CRITICAL  # GPU health CRITICAL
from hpc_agent.diagnosis.exit_codes import EXIT_OK as OK  # trained to max_steps, final checkpoint saved
from hpc_agent.diagnosis.exit_codes import EXIT_OUT_OF_MEMORY as OUT_OF_MEMORY  # CUDA OOM (or the fault)
from hpc_agent.diagnosis.exit_codes import EXIT_RUN_DIR_BUSY as RUN_DIR_BUSY  # run dir held by a live job
# SIGTERM/SIGUSR2 arrived and a complete checkpoint was written (EX_TEMPFAIL)
from hpc_agent.diagnosis.exit_codes import EXIT_SIGNALLED_AFTER_CHECKPOINT as PREEMPTED
from hpc_agent.diagnosis.exit_codes import EXIT_UNAVAILABLE as UNAVAILABLE  # precision/backend missing (EX_UNAVAILABLE)
from hpc_agent.diagnosis.exit_codes import NAMES  # code -> short name

__all__ = ["OK", "CRASHED", "OUT_OF_MEMORY", "DIVERGED", "UNAVAILABLE", "ENVIRONMENT", "PREEMPTED", "CONFIG",
           "GPU_CRITICAL", "RUN_DIR_BUSY", "NAMES"]

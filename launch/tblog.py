"""TensorBoard scalars from rank 0, one event file per attempt, without overlapping steps.

Every attempt writes into ``<run_dir>/tb/`` (so TensorBoard and the watcher see one run) with its
own event file (suffix ``.attempt<N>``). An attempt that resumed from step S logs only steps > S, and
its writer is opened with ``purge_step=S+1``: the first record of the new file is a SessionLog START
at S+1, on which TensorBoard drops whatever earlier files logged at steps >= S+1 (the steps a killed
attempt ran past its last checkpoint). So each step shows exactly one value, from the attempt whose
weights survived. Readers of the raw event files must apply the same rule.

The attempt number (0 for the first) is ``SLURM_RESTART_COUNT`` (Slurm requeues) or the number of
earlier attempts' event files in ``tb/`` (watcher resubmissions are new jobs), whichever is larger.
It is logged as ``run/attempt`` at S+1, with the effective config as text.
"""
from __future__ import annotations

import os
import resource
from pathlib import Path
from typing import Dict, Mapping, Optional

from hpc_agent import rundir
from hpc_agent.filemodes import file_mode_in, make_dir, set_mode

EVENT_GLOB = "events.out.tfevents.*"


def attempt_number(tb_dir: Path, environ: Mapping[str, str] = os.environ) -> int:
    restarts = environ.get("SLURM_RESTART_COUNT", "")
    previous = len(list(tb_dir.glob(EVENT_GLOB))) if tb_dir.is_dir() else 0
    return max(int(restarts) if restarts.isdigit() else 0, previous)


def peak_memory_bytes(on_cuda: bool) -> int:
    """CUDA: peak allocated by this process's caching allocator. CPU: peak resident set (ru_maxrss,
    which Linux reports in KiB)."""
    if on_cuda:
        import torch

        return int(torch.cuda.max_memory_allocated())
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


class TBLog:
    """A SummaryWriter on rank 0; a no-op everywhere else."""

    def __init__(self, run_dir: Path, rank: int, start_step: int, config_text: str,
                 environ: Mapping[str, str] = os.environ):
        self.writer = None
        self.first_step = start_step + 1
        self.attempt = 0
        if rank != 0:
            return
        from torch.utils.tensorboard import SummaryWriter

        tb_dir = rundir.tb_dir(run_dir)
        self.attempt = attempt_number(tb_dir, environ)
        make_dir(tb_dir)
        self.writer = SummaryWriter(str(tb_dir), purge_step=self.first_step,
                                    filename_suffix=f".attempt{self.attempt}")
        # the writer created its file under the umask: give it the run directory's mode (hpc_agent.filemodes)
        for path in tb_dir.glob(f"{EVENT_GLOB}.attempt{self.attempt}"):
            if not path.is_symlink():
                set_mode(path, file_mode_in(tb_dir))
        self.writer.add_scalar("run/attempt", self.attempt, self.first_step)
        self.writer.add_text("config", "```yaml\n" + config_text + "\n```", self.first_step)
        self.writer.flush()

    def scalars(self, values: Dict[str, Optional[float]], step: int) -> None:
        if self.writer is None or step < self.first_step:
            return
        for tag, value in values.items():
            if value is not None:
                self.writer.add_scalar(tag, float(value), step)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

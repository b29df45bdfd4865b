"""The callable that submitit pickles and runs inside the job (one call per task of the srun step).

It stays importable without torch: the training code in ``launch/`` is imported only when the job
runs, so a login node never pays for importing torch or deepspeed.
"""
from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path


def _exit_now(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class TrainingJob:
    """Runs ``launch.train.main`` on a run directory and its config snapshot."""

    def __init__(self, run_dir: str | Path, config_path: str | Path):
        self.run_dir = str(run_dir)
        self.config_path = str(config_path)

    def __call__(self) -> int:
        os.environ.setdefault("HPC_AGENT_RUN_DIR", self.run_dir)
        from launch.train import main  # imported here: torch loads only inside the job

        code = main(self.config_path, self.run_dir)
        if code == 0:
            # Measured on the local cluster: after a clean finish a rank can still abort in C++ teardown
            # ("terminate called without an active exception" from a communication thread), which makes
            # srun kill the step and Slurm record FAILED for finished work. submitit writes the result
            # before the interpreter exits; at exit this handler runs first (atexit is last-in, first-out)
            # and ends the process with 0 before the C++ destructors get a chance to abort.
            atexit.register(_exit_now, 0)
        if code:
            # submitit would store a returned code as the job's result and exit 0; raising SystemExit gets
            # past its exception handling, so Slurm records the real exit code (table: docs/exit_codes.md).
            raise SystemExit(code)
        return code

    def __repr__(self) -> str:
        return f"TrainingJob(run_dir={self.run_dir!r})"


class CommandJob:
    """``train.command`` mode: each task runs ``launch.command.run``, which writes the attempt's DeepSpeed
    config and then becomes the user's program (exec), so Slurm's signals reach it (docs/your_script.md).

    ``workdir`` is where the command runs: the directory submit ran in, recorded in ``run.json`` at the first
    submit so that a resubmission by the watcher (run from anywhere) uses the same one."""

    def __init__(self, run_dir: str | Path, config_path: str | Path, workdir: str | Path | None):
        self.run_dir = str(run_dir)
        self.config_path = str(config_path)
        self.workdir = str(workdir) if workdir else None

    def __call__(self) -> int:
        os.environ.setdefault("HPC_AGENT_RUN_DIR", self.run_dir)
        from launch.command import run  # imported here: torch loads only inside the job

        code = run(self.run_dir, self.config_path, self.workdir)
        if code:
            raise SystemExit(code)  # as TrainingJob: Slurm (and the local executor) record the real code
        return code

    def __repr__(self) -> str:
        return f"CommandJob(run_dir={self.run_dir!r}, workdir={self.workdir!r})"

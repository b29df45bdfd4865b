"""The callable that submitit pickles and runs inside the job (one call per task of the srun step).

It stays importable without torch: the training code in ``launch/`` is imported only when the job
runs, so a login node never pays for importing torch or deepspeed.
"""
from __future__ import annotations

import os
from pathlib import Path


class TrainingJob:
    """Runs ``launch.train.main`` on a run directory and its config snapshot."""

    def __init__(self, run_dir: str | Path, config_path: str | Path):
        self.run_dir = str(run_dir)
        self.config_path = str(config_path)

    def __call__(self) -> int:
        os.environ.setdefault("HPC_AGENT_RUN_DIR", self.run_dir)
        from launch.train import main  # imported here: torch loads only inside the job

        code = main(self.config_path, self.run_dir)
        if code:
            # submitit would store a returned code as the job's result and exit 0; raising SystemExit gets
            # past its exception handling, so Slurm records the real exit code (table: docs/exit_codes.md).
            raise SystemExit(code)
        return code

    def __repr__(self) -> str:
        return f"TrainingJob(run_dir={self.run_dir!r})"

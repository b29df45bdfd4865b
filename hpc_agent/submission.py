"""Submitting one attempt of a run: ledger intent -> submitit -> ledger job id. Used by submit and watch.

The order is what makes a crash safe: the intent is in the ledger before sbatch runs, and the job
carries the run id in its name, so a watcher restarted after a crash at any point can ask Slurm
whether the intent reached it (``reconcile``) instead of guessing.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import signal
from pathlib import Path
from typing import List

from hpc_agent.config.load import to_yaml
from hpc_agent.config.schema import Config
from hpc_agent.fsutil import atomic_write_json, atomic_write_text
from hpc_agent.launcher import job_name_for, make_executor
from hpc_agent.ledger import Ledger

CRASH_ENV = "HPC_AGENT_CRASH_AT"  # tests only: SIGKILL ourselves at a named point (after_intent, after_submit)


def crash_point(name: str) -> None:
    """Die exactly here, as a power cut or ``kill -9`` would, when the tests ask for it."""
    if os.environ.get(CRASH_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


def log_paths(run_dir: Path, job_id: str, ranks: int) -> List[Path]:
    return [run_dir / "slurm" / f"{job_id}_{rank}_log.out" for rank in range(ranks)]


def write_config(run_dir: Path, cfg: Config, name: str = "config.yaml") -> Path:
    path = run_dir / name
    atomic_write_text(path, to_yaml(cfg))
    return path


def submit_attempt(ledger: Ledger, run_id: str, run_dir: Path, cfg: Config, config_path: Path, kind: str,
                   reason: str):
    """Record the intent, submit ``TrainingJob`` through submitit, record the job id; returns the submitit job."""
    from hpc_agent.job import TrainingJob

    submission_id = ledger.record_intent(run_id, kind, str(config_path), reason=reason)
    crash_point("after_intent")
    try:
        executor = make_executor(kind, run_dir / "slurm", cfg, run_id, run_dir, config_path)
        job = executor.submit(TrainingJob(run_dir, config_path))
    except Exception as exc:  # submitit raises plain exceptions carrying sbatch's stderr
        ledger.record_failed(submission_id, str(exc))
        raise
    crash_point("after_submit")
    ledger.record_submitted(submission_id, job.job_id)
    ledger.set_phase(run_id, "pending")
    update_run_json(run_dir, run_id, kind, job.job_id, config_path, cfg)
    return job


def update_run_json(run_dir: Path, run_id: str, kind: str, job_id: str, config_path: Path, cfg: Config) -> None:
    path = run_dir / "run.json"
    info = json.loads(path.read_text()) if path.exists() else {}
    ranks = cfg.slurm.tasks_per_node * (cfg.slurm.nodes if kind == "slurm" else 1)
    info.update({
        "run_id": run_id, "job_name": job_name_for(run_id), "executor": kind,
        "job_ids": info.get("job_ids", []) + [job_id], "config": str(config_path),
        "logs": [str(p) for p in log_paths(run_dir, job_id, ranks)], "tensorboard": str(run_dir / "tb"),
        "updated_at": _dt.datetime.now().isoformat(timespec="seconds"),
    })
    atomic_write_json(path, info)

"""Submitting one attempt of a run: ledger intent -> submitit -> ledger job id. Used by submit and watch.

The order is what makes a crash safe: the intent is in the ledger before sbatch runs, and the job
carries the run id in its name, so a watcher restarted after a crash at any point can ask Slurm
whether the intent reached it (``reconcile``) instead of guessing.
"""
from __future__ import annotations

import datetime as _dt
import os
import signal
from contextlib import nullcontext
from pathlib import Path
from typing import List

from hpc_agent.config.schema import Config
from hpc_agent.core import rundir
from hpc_agent.core.filemodes import group_of, make_dir, restricted_umask
from hpc_agent.core.fsutil import atomic_write_json
from hpc_agent.core.rundir import WORKDIR, read_run_json, submit_workdir
from hpc_agent.jobs import container_lib
from hpc_agent.jobs.containers import in_container
from hpc_agent.jobs.executor import make_executor
from hpc_agent.slurm.job_match import job_name_for
from hpc_agent.state.ledger import Ledger
from hpc_agent.state.lifecycle import Event, EventKind

CRASH_ENV = "HPC_AGENT_CRASH_AT"  # tests only: SIGKILL ourselves at a named point (after_intent, after_submit)


def crash_point(name: str) -> None:
    """Die exactly here, as a power cut or ``kill -9`` would, when the tests ask for it."""
    if os.environ.get(CRASH_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


def log_paths(run_dir: Path, job_id: str, ranks: int) -> List[Path]:
    return rundir.log_paths(run_dir, job_id, ranks)


class SubmittedButIncomplete(RuntimeError):
    """sbatch accepted the job, but a step after it failed (the ledger, ``run.json``).

    Never a reason to stop the run: Slurm has a live job. ``recorded`` says whether the ledger holds its job
    id (then the run is ``pending``); if not, the intent stays without one and the watcher's reconciliation
    finds the job by its name (``hpc_agent:<run id>``). Either way the watcher follows it."""

    def __init__(self, job, step: str, cause: BaseException, recorded: bool):
        self.job, self.job_id, self.step, self.cause, self.recorded = job, str(job.job_id), step, cause, recorded
        super().__init__(f"job {self.job_id} was submitted, but {step} failed afterwards: {cause}")


def record_job(ledger: Ledger, submission_id: int, run_id: str, job_id: str) -> None:
    """The job id and the phase change it causes, in one transaction (a kill in between leaves neither)."""
    in_tx = getattr(getattr(ledger, "db", None), "in_transaction", False)
    with (nullcontext() if in_tx else ledger.transaction()):
        ledger.record_submitted(submission_id, job_id)
        ledger.advance(run_id, Event(EventKind.SUBMITTED, job_id))  # a first submission or a resubmission


def submit_attempt(ledger: Ledger, run_id: str, run_dir: Path, cfg: Config, config_path: Path, kind: str,
                   reason: str):
    """Record the config (the one the watcher acts on: hpc_agent/state/run_config.py) and the intent, submit the job (:func:`job_for`) through submitit, record the job id; returns the
    submitit job.

    An exception from sbatch (no job id) propagates as is (recorded as a refusal, except
    ``SbatchTimedOut``: then the job may exist, and the intent stays open); any failure after sbatch accepted the job raises
    :class:`SubmittedButIncomplete`, which carries the job: the caller must not stop the run."""
    from hpc_agent.slurm.submitit_timeout import SbatchTimedOut

    from hpc_agent.state import run_config

    run_config.record(ledger, run_id, cfg, f"submitted ({reason})")  # what the watcher acts on from now on
    submission_id = ledger.record_intent(run_id, kind, str(config_path), reason=reason)
    crash_point("after_intent")
    try:
        # submitit's files (pickles, script, logs) and the job's get the run directory's modes: the slurm/
        # folder is made here, and the umask is held (the local job inherits it, sbatch passes it on).
        make_dir(rundir.slurm_dir(run_dir))
        with restricted_umask(group_of(run_dir)):
            if in_container(cfg):  # hpc_agent's code for the container's PYTHONPATH, as this process has it
                container_lib.stage(run_dir)
            executor = make_executor(kind, rundir.slurm_dir(run_dir), cfg, run_id, run_dir, config_path)
            job = executor.submit(job_for(run_dir, cfg, config_path))
    except SbatchTimedOut:
        raise  # the job may be queued: the intent stays open for the watcher to settle by the job's name
    except Exception as exc:  # submitit raises plain exceptions carrying sbatch's stderr
        ledger.record_failed(submission_id, str(exc))
        raise
    crash_point("after_submit")
    try:
        record_job(ledger, submission_id, run_id, job.job_id)
    except Exception as exc:  # noqa: BLE001 - the job is in Slurm whatever went wrong here
        try:  # at least the job id, so that nothing can mistake the intent for one that never reached Slurm
            ledger.record_submitted(submission_id, job.job_id)
            recorded = True
        except Exception:  # noqa: BLE001 - the ledger is unusable; reconciliation by name finds the job
            recorded = False
        raise SubmittedButIncomplete(job, "recording it in the ledger", exc, recorded) from exc
    try:
        update_run_json(run_dir, run_id, kind, job.job_id, config_path, cfg)
    except Exception as exc:  # noqa: BLE001 - run.json is for people and review; the ledger has the truth
        raise SubmittedButIncomplete(job, f"writing {rundir.RUN_JSON}", exc, recorded=True) from exc
    return job


def job_for(run_dir: Path, cfg: Config, config_path: Path):
    """What each task runs: ``CommandJob`` for ``train.command`` (the user's script), else ``TrainingJob``.

    This module is the one place on the login side that imports the job side (``launch/job.py``, which runs
    ``launch``): here, where the callable is handed to submitit, and never at module level."""
    from launch.job import CommandJob

    if cfg.train.command:
        return CommandJob(run_dir, config_path, submit_workdir(run_dir))
    return training_job(run_dir, config_path)


def training_job(run_dir: Path, config_path: Path):
    """The built-in trainer's callable for one run (what a sweep's array tasks run too)."""
    from launch.job import TrainingJob

    return TrainingJob(run_dir, config_path)


def update_run_json(run_dir: Path, run_id: str, kind: str, job_id: str, config_path: Path, cfg: Config) -> None:
    run_dir = Path(run_dir)
    info = read_run_json(run_dir)
    ranks = cfg.slurm.tasks_per_node * (cfg.slurm.nodes if kind == "slurm" else 1)
    info.update({
        "run_id": run_id, "job_name": job_name_for(run_id), "executor": kind,
        "job_ids": info.get("job_ids", []) + [job_id], "config": str(config_path),
        "logs": [str(p) for p in log_paths(run_dir, job_id, ranks)], "tensorboard": str(rundir.tb_dir(run_dir)),
        "updated_at": _dt.datetime.now().isoformat(timespec="seconds"),
    })
    from hpc_agent.jobs.code_snapshot import run_json_entry

    if snapshot := run_json_entry(run_dir):  # from the snapshot's MANIFEST.json, its one source
        info["code_snapshot"] = snapshot
    info.setdefault(WORKDIR, os.getcwd())  # set once, by the first submit (submit_workdir)
    atomic_write_json(rundir.run_json_path(run_dir), info)

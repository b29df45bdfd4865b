"""Issue 15, item 5 (must-show 4): no double training, on the real localhost Slurm.

A run trains in job A. A second attempt for the same run directory (job B: a duplicate resubmission,
made here the way the watcher resubmits) starts while A trains: B's rank 0 finds A's live lease in
``<run dir>/train.lease``, sees it renewed, and B exits 73 (run_dir_busy) with one line naming A, before
writing anything into the run directory. A trains on untouched. The heartbeat is shortened to 1 s
(``HPC_AGENT_LEASE_HEARTBEAT_S``, passed to both jobs through the submitting environment) so B decides
within about a second of its start.
"""
from __future__ import annotations

import json
import time

import pytest

from hpc_agent.core.exit_codes import EXIT_RUN_DIR_BUSY
from hpc_agent.core.rundir import lease_path
from tests.conftest import run_cli
from tests.slurm_helpers import LONG_RUN, SLURM, attempts, cleanup_jobs, last_step, log_text, states, submit, wait_for

pytestmark = pytest.mark.slurm


def test_second_attempt_on_a_live_run_dir_refuses_to_train(tmp_path, monkeypatch):
    monkeypatch.setenv("HPC_AGENT_LEASE_HEARTBEAT_S", "1")  # inherited by sbatch -> the jobs
    root = tmp_path / "runs"
    started = time.monotonic()
    extra_jobs = []
    run_dir, job_a = submit(root, *LONG_RUN, "run.name=lease", "train.max_steps=100000", "train.ckpt_every=100000")
    try:
        wait_for(lambda: last_step(log_text(run_dir, job_a)) >= 3, 240, what="job A training")
        held = json.loads(lease_path(run_dir).read_text())
        assert held["job_id"] == job_a and held["attempt"] == 0 and held["pid"] > 0

        # Job B: a second attempt for the same run directory, outside the ledger (what a stray sbatch, or a
        # resubmission racing a requeue, looks like to the job): same executor, script and training call.
        from launch.job import TrainingJob
        from hpc_agent.jobs.executor import make_executor
        from hpc_agent.core.rundir import config_path, slurm_dir
        from hpc_agent.config.load import load_run_config

        executor = make_executor("slurm", slurm_dir(run_dir), load_run_config(run_dir), run_dir.name, run_dir,
                                 config_path(run_dir))
        job_b = executor.submit(TrainingJob(run_dir, config_path(run_dir))).job_id
        extra_jobs.append(job_b)
        assert job_b != job_a
        wait_for(lambda: (s := states(job_b)) and s[-1] not in ("PENDING", "RUNNING", "COMPLETING"), 240,
                 what="job B to end")
        (attempt_b,) = attempts(job_b)
        assert attempt_b.state == "FAILED" and attempt_b.exit_code.startswith(f"{EXIT_RUN_DIR_BUSY}:"), attempt_b

        text_b = log_text(run_dir, job_b)
        (line,) = [ln for ln in text_b.splitlines() if "run directory busy:" in ln]
        for words in (str(lease_path(run_dir)), f"job {job_a}", "pid", "heartbeat", "scancel",
                      f"exiting {EXIT_RUN_DIR_BUSY}"):
            assert words in line, (words, line)
        assert "training steps" not in text_b and "[hpc_agent] step " not in text_b  # B never trained

        # A still holds the lease and keeps training; nothing of B's is in the run directory.
        assert json.loads(lease_path(run_dir).read_text())["job_id"] == job_a
        step = last_step(log_text(run_dir, job_a))
        wait_for(lambda: last_step(log_text(run_dir, job_a)) > step, 60, what="job A to keep training")
        assert states(job_a)[-1] == "RUNNING"

        # Diagnosis and policy: run_dir_busy, and the watcher would stop, not requeue.
        proc = run_cli("-m", "hpc_agent.diagnose", job_b, "--runs-root", str(root), "--json")
        report = json.loads(proc.stdout)
        assert report["cause"] == "run_dir_busy", proc.stdout + proc.stderr
        assert report["decision"]["action"] == "stop"
        print(f"two-job lease check took {time.monotonic() - started:.0f} s")
    finally:
        cleanup_jobs(root)
        if extra_jobs:
            SLURM.run(["scancel", *extra_jobs], check=False)

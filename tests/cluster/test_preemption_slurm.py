"""Issue 3, must-show 2: 2 ranks on 2 nodes, BF16, ZeRO-2, activation checkpointing on the real Slurm.

Preempting the job (a job in the high partition) produces a complete checkpoint within GraceTime, the
job requeues itself, and the requeued attempt resumes with zero lost steps. No watcher runs here; the
test itself skips Slurm's 121 s requeue delay (the watcher's job, tested in test_watch_slurm.py).
"""
from __future__ import annotations

import re

import pytest

from hpc_agent.diagnose import read_tb_scalars
from tests.slurm_helpers import (LONG_RUN, SLURM, cleanup_jobs, last_step, log_text, preempt_all_nodes, states, submit,
                                 wait_for)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
GRACE_TIME_S = 30  # PartitionName=low GraceTime in scripts/cluster.sh


def test_preempted_2rank_bf16_zero2_job_resumes_with_zero_lost_steps(tmp_path):
    root = tmp_path / "runs"
    run_dir, job = submit(root, *LONG_RUN, "run.name=preempt", "resilience.successor_on_preempt=false",  # the plain requeue (the hand-over: test_successor_slurm.py)
                          "slurm.nodes=2", "slurm.tasks_per_node=1",
                          "train.precision=bf16", "train.zero_stage=2", "train.activation_checkpointing=true",
                          "train.max_steps=1200", "train.ckpt_every=400")
    try:
        wait_for(lambda: last_step(log_text(run_dir, job)) >= 40, 180, what="step 40 of the low-priority job")
        high = preempt_all_nodes(seconds=2)
        text = wait_for(lambda: (t := log_text(run_dir, job)) and "this attempt ends now" in t and t, 120,
                        what="the signal checkpoint and self-requeue")
        signal_line = re.search(r"\[hpc_agent\] signal (SIGUSR2|SIGTERM) at step (\d+): checkpoint (step_\d+) "
                                r"complete in ([\d.]+)s", text)
        assert signal_line, text[-3000:]
        saved_step, save_s = int(signal_line.group(2)), float(signal_line.group(4))
        assert save_s < GRACE_TIME_S
        assert (run_dir / "checkpoints" / signal_line.group(3) / "COMPLETE.json").is_file()
        before_signal = text[:signal_line.start()]
        assert last_step(before_signal) == saved_step  # nothing trained after the last saved step was lost

        wait_for(lambda: states(job)[:1] == ["REQUEUED"] and len(states(job)) == 2, 60, what="requeued attempt")
        wait_for(lambda: "COMPLETED" in states(high), 60, what="the preempting job")
        SLURM.run(["scontrol", "update", f"JobId={job}", "StartTime=now"])
        wait_for(lambda: states(job)[-1:] == ["COMPLETED"], 300, what="the resumed attempt to complete")
        text = log_text(run_dir, job)
        assert f"resumed at step {saved_step} " in text
        assert f"training steps {saved_step + 1}..1200" in text
        steps = [s for s, _ in read_tb_scalars(run_dir / "tb")["train/loss"]]
        assert sorted(steps) == list(range(1, 1201)), "TensorBoard steps must be continuous with no duplicates"
    finally:
        cleanup_jobs(root)

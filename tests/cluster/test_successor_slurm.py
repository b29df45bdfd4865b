"""resilience.successor_on_preempt on the localhost cluster: at a preemption the job hands over to a successor
job (hpc_agent/core/handback.py), which Slurm starts in the same scheduling pass as the preempting job, and the
watcher follows the successor and cancels the held old job. The run must complete with every step exactly
once, resumed from the signal's checkpoint on the other node, with no process of the preempted attempt left.
"""
from __future__ import annotations

import json
import re

import pytest

from hpc_agent.config.load import load_run_config
from hpc_agent.core import handback
from hpc_agent.diagnose import read_tb_scalars
from hpc_agent.state.ledger import Ledger
from launch.lr_schedule import lr_at
from tests.slurm_helpers import (LONG_RUN, WatcherProcess, cleanup_jobs, first_attempt_pids, job_nodes, log_text,
                                 preempt_after_step_20, states, submit, wait_for)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
MAX_STEPS = 1500


def test_a_preempted_run_hands_over_to_its_successor_and_completes(tmp_path):
    root = tmp_path / "runs"
    # A NaN at step 10 is repaired inside the job (the LR halved, training restarted from the start): the successor
    # must train on with that LR, which the job carried into config.yaml, not the submitted one.
    run_dir, job = submit(root, *LONG_RUN, "run.name=successor", "slurm.nodes=1", f"train.max_steps={MAX_STEPS}",
                          "train.ckpt_every=100000", "resilience.in_job_retries=1", "faults.nan_at_step=10",
                          "train.lr=1e-3", "train.warmup_steps=0", "resilience.successor_on_preempt=true")
    watcher = WatcherProcess(root, interval=1.0)
    try:
        node, saved = preempt_after_step_20(run_dir, job)
        new = wait_for(lambda: handback.read_successor(run_dir, job), 30, interval=0.2,
                       what=f"job {job} to name its successor")
        assert f"handed over to job {new}" in wait_for(lambda: (t := log_text(run_dir, job)) and "handed over" in t
                                                        and t, 30, what="the batch shell's hand-over line")
        wait_for(lambda: not first_attempt_pids(job), 15, interval=0.2,
                 what=f"every process of job {job}'s preempted attempt to end")

        wait_for(lambda: f"resumed at step {saved} " in log_text(run_dir, new), 90, what="the successor's resume")
        assert job_nodes(new) != [node], "the preemptor holds the old node: the successor runs on the other one"
        wait_for(lambda: states(new)[-1:] == ["COMPLETED"], 180, what="the successor to complete")
        wait_for(lambda: "completed" in watcher.output(), 30, what="the watcher to see the run complete")
        out = watcher.output()
        assert f"following job {new}" in out, out[-3000:]
        # The held old job was cancelled, never restarted: one attempt, then its held requeue, then cancelled.
        assert states(job)[-1] == "CANCELLED" and "RUNNING" not in states(job)[1:], states(job)
        ledger = Ledger.in_runs_root(root)
        try:
            assert [s.job_id for s in ledger.submissions(ledger.runs()[0].run_id)] == [job, new]
        finally:
            ledger.close()
        events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
        assert any(e.get("action") == "handed_over" and e.get("evidence") == {"successor": new} for e in events)
        # Every step written exactly once, none lost, none twice, but for steps 1-9, which the repair's start-over
        # wrote again (and TensorBoard's purge drops from the series).
        steps = [s for s, _ in read_tb_scalars(run_dir / "tb")["train/loss"]]
        assert sorted(steps) == sorted([*range(1, MAX_STEPS + 1), *range(1, 10)]), "the hand-over redid no step"
        assert "in-job repair 1 of 1: nan_loss at step 10" in log_text(run_dir, job)
        first_pass = log_text(run_dir, job).split("in-job repair 1 of 1")[0]
        before, after = _lrs(log_text(run_dir, job)), _lrs(log_text(run_dir, new))
        assert _lrs(first_pass)[9] == pytest.approx(1e-3, rel=1e-3)  # the submitted LR before the repair
        # after it, half the schedule's LR at that step (the printed LR is update step-1's)
        assert before[saved] == pytest.approx(lr_at(saved - 1, 5e-4, 0, MAX_STEPS, 0.1), rel=1e-2), before
        assert after[saved + 1] == pytest.approx(before[saved], rel=1e-2), (before[saved], after[saved + 1])
        assert load_run_config(run_dir).train.lr == 5e-4
    finally:
        watcher.stop()
        cleanup_jobs(root)


def _lrs(log: str) -> dict:
    """Step -> learning rate of the log's ``[hpc_agent] step N loss X lr Y`` lines (the newest line per step)."""
    return {int(m.group(1)): float(m.group(2)) for m in re.finditer(r"\[hpc_agent\] step (\d+) loss \S+ lr (\S+)", log)}

"""resilience.successor_on_preempt (the default) on the localhost cluster: at a preemption the job hands over to a
successor job (hpc_agent/core/handback.py), which Slurm starts in the same scheduling pass as the preempting job.
With a watcher, it follows the successor; the run must complete with every step exactly once, resumed from the
signal's checkpoint on the other node, with no process of the preempted attempt left. Without one, the successor
cancels the held old job itself and nothing is left in the queue; a hand-over that fails after the release (the
kill point) is rolled back and the job requeues itself; a person's SIGUSR2 is a checkpoint request, not a
hand-over; and the kill switch stops it.
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
from hpc_agent.core.rundir import PAUSE_FILE
from hpc_agent.slurm.job_match import job_name_for
from tests.slurm_helpers import (LONG_RUN, SLURM, WatcherProcess, cleanup_jobs, first_attempt_pids, job_nodes,
                                 last_step, log_text, preempt_after_step_20, preempt_node, states, submit, wait_for)

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


def _queued(*job_ids: str) -> list:
    """The jobs among ``job_ids`` that slurmctld still holds (squeue lists no ended job)."""
    return SLURM.run(["squeue", "--noheader", "--jobs", ",".join(job_ids), "--format", "%i"], check=False).stdout.split()


def test_without_a_watcher_the_successor_cancels_the_held_job_and_nothing_is_left_in_the_queue(tmp_path):
    from hpc_agent import status

    root = tmp_path / "runs"
    run_dir, job = submit(root, *LONG_RUN, "run.name=nowatcher", "slurm.nodes=1", "train.max_steps=600",
                          "train.ckpt_every=100000")  # the default: resilience.successor_on_preempt is true
    try:
        node, saved = preempt_after_step_20(run_dir, job)
        new = wait_for(lambda: handback.read_successor(run_dir, job), 30, interval=0.2, what=f"job {job}'s successor")
        wait_for(lambda: f"cancelled held job {job}" in log_text(run_dir, new), 90, what="the successor's cancel")
        assert f"resumed at step {saved} " in wait_for(lambda: (t := log_text(run_dir, new)) and "resumed at step" in t
                                                       and t, 90, what="the successor's resume")
        assert states(job)[-1] == "CANCELLED" and "RUNNING" not in states(job)[1:], states(job)
        (line,) = status.collect(root)
        assert line["job_id"] == new and line["jobs"] == [job, new]  # one run across its two job ids
        wait_for(lambda: states(new)[-1:] == ["COMPLETED"], 180, what="the successor to complete")
        assert _queued(job, new) == []  # nothing of the run is left in the queue, and no watcher ran
    finally:
        cleanup_jobs(root)


def test_a_hand_over_failing_after_the_release_is_rolled_back_and_the_job_requeues(tmp_path, monkeypatch):
    """The kill point: the successor is released (and started on the free node), then the hand-over fails. The
    successor is cancelled and seen gone, the marker removed, and the job requeues itself; it resumes in place."""
    monkeypatch.setenv(handback.HANDOVER_FAULT_ENV, "after_release")  # submit -> sbatch -> the job's environment
    root = tmp_path / "runs"
    run_dir, job = submit(root, *LONG_RUN, "run.name=rollback", "slurm.nodes=1", "train.max_steps=600",
                          "train.ckpt_every=100000")
    try:
        node, saved = preempt_after_step_20(run_dir, job)
        text = wait_for(lambda: (t := log_text(run_dir, job)) and f"requeueing job {job} instead" in t and t, 90,
                        what="the rollback")
        new = re.search(rf"hand-over of job {job} to job (\d+) failed", text).group(1)
        assert f"job {new} cancelled and gone from the queue" in text
        assert _queued(new) == [] and states(new)[-1] in ("CANCELLED", "FAILED"), states(new)
        assert handback.read_successor(run_dir, job) is None
        wait_for(lambda: states(job)[:1] == ["REQUEUED"] and len(states(job)) == 2, 60, what="the plain requeue")
        SLURM.run(["scontrol", "update", f"JobId={job}", "StartTime=now"])  # what a watcher would do
        wait_for(lambda: f"resumed at step {saved} " in log_text(run_dir, job), 120, what="the resume in place")
    finally:
        cleanup_jobs(root)


def test_a_persons_sigusr2_is_a_checkpoint_request_not_a_hand_over(tmp_path):
    root = tmp_path / "runs"
    run_dir, job = submit(root, *LONG_RUN, "run.name=stray", "slurm.nodes=1", "train.max_steps=1500",
                          "train.ckpt_every=100000")
    try:
        wait_for(lambda: last_step(log_text(run_dir, job)) >= 20, 180, what="step 20")
        SLURM.run(["scancel", "--signal=USR2", job])
        text = wait_for(lambda: (t := log_text(run_dir, job)) and "checkpoint request (SIGUSR2) at step" in t and t,
                        60, what="the checkpoint request")
        assert "not Slurm's preemption or time-limit signal" in text and "this attempt ends now" not in text
        wait_for(lambda: states(job)[-1:] == ["COMPLETED"], 240, what="the run to train on and complete")
        assert states(job) == ["COMPLETED"] and not list(run_dir.glob(f"{handback.SUCCESSOR_PREFIX}*"))
        assert "handed over" not in log_text(run_dir, job)
    finally:
        cleanup_jobs(root)


def test_the_kill_switch_stops_the_hand_over(tmp_path):
    root = tmp_path / "runs"
    run_dir, job = submit(root, *LONG_RUN, "run.name=paused", "slurm.nodes=1", "train.max_steps=1500",
                          "train.ckpt_every=100000")
    try:
        wait_for(lambda: last_step(log_text(run_dir, job)) >= 20, 180, what="step 20")
        (root / PAUSE_FILE).write_text("")
        (node,) = job_nodes(job)
        preempt_node(node, 25)
        text = wait_for(lambda: (t := log_text(run_dir, job)) and "kill switch is set" in t and t, 90,
                        what="the batch shell to see the kill switch")
        assert "handed over" not in text and handback.read_successor(run_dir, job) is None
        wait_for(lambda: states(job)[-1] != "RUNNING", 90, what="the preempted attempt to end")
        ours = SLURM.run(["squeue", "--noheader", "--name", job_name_for(run_dir.name), "--format", "%i"],
                         check=False).stdout.split()
        assert set(ours) <= {job}, ours  # no successor was submitted
    finally:
        (root / PAUSE_FILE).unlink(missing_ok=True)
        cleanup_jobs(root)

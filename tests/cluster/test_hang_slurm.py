"""Issue 17, must-shows 1 and 2: the watcher finds hung live jobs on the real localhost Slurm and repairs them.

(a) A run hangs at step N through a general fault (``faults.hang_at_step``: a blocking sleep loop inside the
training step, which no part of the watcher reads): the watcher calls it ``hung`` from the heartbeats, the
evidence holds the stuck frame from the ranks' faulthandler dumps, the attempt is cancelled and resubmitted
from its newest checkpoint, the run completes, and no process of the hung job remains on the node.
(b) A start-up stall: the run directory's lease is held by another job id that is never renewed, so rank 0
waits for it to go stale (60 s) before training; with ``resilience.startup_budget_s=20`` the watcher calls
the attempt hung, kind ``startup``, within the budget.
"""
from __future__ import annotations

import datetime as _dt
import json
import time
import uuid

import pytest

from hpc_agent.core import rundir
from tests.slurm_helpers import (LONG_RUN, SLURM, WatcherProcess, attempts, events, job_pids, ledger_job_ids, log_text,
                                 run_phase as phase, submit, wait_for)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
FAST = ["resilience.heartbeat_s=1", "resilience.hang_floor_s=10", "resilience.stack_wait_s=5", "train.zero_stage=0",
        "slurm.partition=high"]  # high: a preemption test's job in high cannot preempt it midway


def test_a_hang_at_step_n_is_detected_with_its_stack_and_resumed(root):
    run_dir, job = submit(root, *LONG_RUN, *FAST, "run.name=hang", "train.max_steps=40", "train.ckpt_every=5",
                          "faults.hang_at_step=12")
    watcher = WatcherProcess(root, interval=1.0)
    try:
        wait_for(lambda: "hanging at step 12" in log_text(run_dir, job), 180, what="the fault to hang the job")
        wait_for(lambda: len(ledger_job_ids(root, run_dir.name)) == 2, 120, what="the hung job to be resubmitted")
        # Slurm had ended the hung job before the new one was submitted (await_end), and nothing of it is left.
        assert attempts(job)[-1].state == "CANCELLED", [a.state for a in attempts(job)]
        assert job_pids(job) == []
        wait_for(lambda: phase(root, run_dir.name) == "completed", 240, what="the resubmitted run to complete")
        found = events(run_dir)
        suspected = [e for e in found if e.get("action") == "hang_suspected"]
        assert suspected and suspected[0]["verdict"]["kind"] == "step" and suspected[0]["verdict"]["step"] == 11
        (decision,) = [e for e in found if e.get("cause") == "hung" and "decision" in e]
        assert decision["decision"]["action"] == "resubmit", decision
        text = "\n".join(decision["evidence"])
        assert "faults.py" in text and "in before_step" in text, text  # the stuck frame, from the stack dump
        assert decision["hang"]["step"] == 11 and "before_step" in decision["hang"]["top_frame"]
        assert "newest heartbeat" in text and "silent" in text and "log: " in text
        assert any(e.get("action") == "request_stacks" and e.get("by") for e in found)
        new_job = ledger_job_ids(root, run_dir.name)[-1]
        assert "resumed at step 10" in log_text(run_dir, new_job), log_text(run_dir, new_job)[-2000:]
        assert job_pids(new_job) == []
    finally:
        watcher.stop()


def test_a_start_up_stall_is_detected_within_the_start_up_budget(root):
    budget = 20.0
    run_dir, job = submit(root, *LONG_RUN, *FAST, "run.name=stall", f"resilience.startup_budget_s={budget:g}",
                          "train.max_steps=20")
    # Another job's lease, fresh and never renewed: rank 0 watches it for the staleness (60 s) before it trains.
    now = time.time()
    rundir.lease_path(run_dir).write_text(json.dumps({
        "job_id": "999999", "attempt": 0, "host": "elsewhere", "pid": 1, "heartbeat": now + 120, "started": now,
        "token": uuid.uuid4().hex}))
    watcher = WatcherProcess(root, interval=1.0)
    try:
        wait_for(lambda: any(e.get("action") == "hang_suspected" for e in events(run_dir)), 150,
                 what="the start-up stall to be suspected")
        (suspected,) = [e for e in events(run_dir) if e.get("action") == "hang_suspected"]
        assert suspected["verdict"]["kind"] == "startup", suspected
        started = attempts(job)[0].primary.get("Start")
        start = _dt.datetime.strptime(started, "%Y-%m-%dT%H:%M:%S").timestamp()
        at = _dt.datetime.fromisoformat(suspected["time"]).timestamp()
        # within the budget, plus what observing costs: a heartbeat (1 s), a watcher tick (1 s), sacct's
        # whole-second Start and the time stamp's rounding
        assert budget < at - start + 1 <= budget + 6, (start, at)
        wait_for(lambda: any(e.get("cause") == "hung" and "decision" in e for e in events(run_dir)), 60,
                 what="the hung decision")
        (decision,) = [e for e in events(run_dir) if e.get("cause") == "hung" and "decision" in e]
        assert decision["hang"]["kind"] == "startup"
        text = "\n".join(decision["evidence"])
        assert "lease" in text, text  # the stack names where it waits: the run lease's acquire
    finally:
        watcher.stop()
        SLURM.run(["scancel", *ledger_job_ids(root, run_dir.name)], check=False)

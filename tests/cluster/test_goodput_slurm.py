"""Issue 45, item 6: ``review --goodput`` on a real run with a preemption under the watcher.

The run trains on the localhost cluster, a high-priority job preempts it, the watcher expedites the requeued
attempt and the run completes. ``review --goodput --json`` then asks the real sacct (Submit, Eligible, Start,
End, AllocTRES) and its buckets must add up to the allocation within 1 %, with the preempted attempt's end in
``preemption`` and the resumed attempt's start-up in ``restart_overhead``.
"""
from __future__ import annotations

import json

import pytest

from hpc_agent.runs.goodput import BUCKETS
from tests.conftest import run_cli
from tests.slurm_helpers import (LONG_RUN, WatcherProcess, last_step, log_text, preempt_all_nodes, run_phase as phase,
                                 submit, wait_for)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_goodput_of_a_preempted_run_adds_up_to_its_allocation(root):
    # The plain requeue under the watcher (one job id, requeued in place): the hand-over's chain is another path.
    run_dir, job = submit(root, *LONG_RUN, "run.name=goodput", "train.max_steps=1200", "train.ckpt_every=400",
                          "resilience.successor_on_preempt=false")
    watcher = WatcherProcess(root)
    try:
        wait_for(lambda: last_step(log_text(run_dir, job)) >= 30, 180, what="training to start")
        preempt_all_nodes(seconds=2)
        wait_for(lambda: "expedite" in watcher.output(), 120, what="the watcher to expedite the requeued job")
        wait_for(lambda: phase(root, run_dir.name) == "completed", 300, what="the run to complete")
    finally:
        watcher.stop()
    proc = run_cli("-m", "hpc_agent.review", str(run_dir), "--goodput", "--json")
    assert proc.returncode == 0, proc.stderr
    [run] = json.loads(proc.stdout)["runs"]
    acc = run["account"]
    assert acc is not None, run
    attempts = acc["attempts"]
    assert len(attempts) >= 2 and {a["job_id"] for a in attempts} == {job}  # requeued in place: one job
    assert sum(acc["device_s"][b] for b in BUCKETS) == pytest.approx(acc["allocated_s"], rel=0.01)
    first, last = attempts[0], attempts[-1]
    # the preempted attempt trained, then its end is charged to the preemption (here the signal save takes well under
    # sacct's one-second resolution, so that share may round to 0); the resumed one paid a restart
    assert first["cause"] == "preempted" and first["device_s"]["productive"] > 0, acc
    assert first["device_s"]["preemption"] >= 0 and first["device_s"]["other"] < 1.5, acc
    assert last["cause"] == "completed" and last["device_s"]["restart_overhead"] > 0, acc
    assert acc["device_s"]["productive"] > 0 and 0 < acc["ettr"] <= 1
    assert "CPU-only" in run["devices_note"]  # the localhost cluster has no GPU: 1 device per attempt

"""Issue 17, must-show 4 on the real localhost Slurm: after a node failure (``cluster.sh kill-node``:
SIGKILL of slurmd, slurmstepd and the training processes, no signal first), the watcher resumes the
run from its newest complete snapshot, and the steps redone are at most ``resilience.snapshot_every``.

(A bare ``kill -9`` of the ranks on a healthy node ends the attempt FAILED with exit 9 and nothing in
the log; the watcher's policy calls that a code error and does not retry it, so a node failure is the
hard kill it recovers from.)"""
from __future__ import annotations

import re
import time

import pytest

from hpc_agent.chaos import inject
from tests.slurm_helpers import (LONG_RUN, WatcherProcess, events, job_nodes, last_step, ledger_job_ids, log_text,
                                 run_phase as phase, submit, wait_for)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

EVERY = 2


def test_node_failure_redoes_at_most_the_snapshot_interval(root):
    # A full checkpoint only at the end: the snapshots are all a resume can use.
    run_dir, job = submit(root, *LONG_RUN, "run.name=snapkill", "model.d_model=128", "model.seq_len=128",
                          "train.max_steps=60", "train.ckpt_every=1000", f"resilience.snapshot_every={EVERY}")
    watcher = WatcherProcess(root)
    node = None
    try:
        wait_for(lambda: last_step(log_text(run_dir, job)) >= 15, 240, what="training to pass step 15")
        (node,) = job_nodes(job)
        inject.kill_node(node)
        time.sleep(2)  # let srun's output of what the ranks printed before they died land
        last_before = last_step(log_text(run_dir, job))
        wait_for(lambda: phase(root, run_dir.name) == "completed", 420, what="the run to complete after the kill")
        full = log_text(run_dir)
        resumed = [int(m) for m in re.findall(r"\[hpc_agent\] resumed at step (\d+) ", full)]
        assert resumed, full[-3000:]
        assert re.search(r"resuming from snapshot snap_\d+ \(step %d\)" % resumed[-1], full), full[-3000:]
        redone = last_before - resumed[-1]
        causes = [e.get("cause") for e in events(run_dir) if "decision" in e]
        print(f"steps redone after the node failure: {redone} (last logged {last_before}, resumed at "
              f"{resumed[-1]}); causes {causes}; jobs {ledger_job_ids(root, run_dir.name)}")
        assert "node_fail" in causes
        assert 0 <= redone <= EVERY
        assert "done: 60 steps" in full
    finally:
        watcher.stop()
        if node is not None:
            inject.start_node(node)

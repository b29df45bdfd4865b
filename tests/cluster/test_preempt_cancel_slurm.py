"""Issue 17: preemption on a ``PreemptMode=CANCEL`` partition (``lowcancel`` on the localhost cluster).

There Slurm never requeues a preempted job: at the end of GraceTime it cancels it, and a tool that reads
the ended job as "done" loses the run. Here the run is preempted by a job in the high partition that holds
the run's node, so it can only come back on the other node. On SIGUSR2 (``preempt_send_user_signal``) every
rank saves the checkpoint and exits 75, and the batch shell requeues the job (hpc_agent/core/handback.py) long
before the cancel would come; the watcher expedites the requeued attempt. The run must complete with no
step lost and no process of the preempted attempt left on its node.
"""
from __future__ import annotations

import re

import pytest

from hpc_agent.diagnose import read_tb_scalars
from tests.slurm_helpers import (LONG_RUN, SLURM, WatcherProcess, cleanup_jobs, first_attempt_pids, job_nodes,
                                 log_text, preempt_after_step_20, states, submit, wait_for)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
MAX_STEPS = 1500


def _partition_mode(name: str) -> str:
    text = SLURM.run(["scontrol", "show", "partition", name, "--oneliner"]).stdout
    match = re.search(r"PreemptMode=(\S+)", text)
    return match.group(1) if match else ""


def test_run_on_cancel_partition_resumes_on_the_other_node_with_no_step_lost(tmp_path):
    assert _partition_mode("lowcancel") == "CANCEL", "scripts/cluster.sh up makes lowcancel PreemptMode=CANCEL"
    root = tmp_path / "runs"
    run_dir, job = submit(root, *LONG_RUN, "run.name=cancelmode", "resilience.successor_on_preempt=false", "slurm.nodes=1", "slurm.partition=lowcancel",
                          f"train.max_steps={MAX_STEPS}", "train.ckpt_every=100000",
                          "resilience.in_job_retries=0")  # no in-job rollback (a spike on this tiny model) to redo steps
    watcher = WatcherProcess(root, interval=1.0)
    try:
        node, saved = preempt_after_step_20(run_dir, job)

        # No rank, srun or batch shell of the preempted attempt outlives it (well inside GraceTime).
        wait_for(lambda: not first_attempt_pids(job), 15, interval=0.2,
                 what=f"every process of job {job}'s preempted attempt to end")

        wait_for(lambda: f"resumed at step {saved} " in log_text(run_dir, job), 90, what="the resumed attempt")
        assert job_nodes(job) != [node], "the preemptor holds the old node: the run resumed elsewhere"
        wait_for(lambda: states(job)[-1:] == ["COMPLETED"], 180, what="the resumed attempt to complete")
        assert states(job)[0] in ("REQUEUED", "PREEMPTED"), states(job)
        out = watcher.output()
        assert "expedite" in out or "resubmitted as job" in out, out[-3000:]
        wait_for(lambda: "completed" in watcher.output(), 30, what="the watcher to see the run complete")
        assert not first_attempt_pids(job)
        steps = [s for s, _ in read_tb_scalars(run_dir / "tb")["train/loss"]]
        assert sorted(steps) == list(range(1, MAX_STEPS + 1)), "every step exactly once: none lost, none twice"
    finally:
        watcher.stop()
        cleanup_jobs(root)

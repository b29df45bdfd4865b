"""Issue 4, must-show 2-4: the watcher against the real localhost Slurm, one fault at a time.

Each test submits a small run with an injected or real fault, runs ``python -m hpc_agent.watch`` as a
user would, and checks what Slurm, the ledger and the run's audit trail say afterwards.
"""
from __future__ import annotations

import subprocess
import time

import pytest

from hpc_agent.config.load import load_snapshot
from tests.slurm_helpers import (CLUSTER, LONG_RUN, WatcherProcess, accounting, attempts, events, job_nodes, last_step,
                                 ledger_job_ids, log_text, preempt_all_nodes, run_phase as phase, states, submit,
                                 wait_for)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_preemption_is_expedited_and_resumes(root):
    run_dir, job = submit(root, *LONG_RUN, "run.name=pre", "resilience.successor_on_preempt=false",  # the plain requeue, expedited
                          "slurm.nodes=2", "train.max_steps=1500",
                          "train.ckpt_every=500")
    watcher = WatcherProcess(root)
    try:
        wait_for(lambda: last_step(log_text(run_dir, job)) >= 30, 180, what="training to start")
        preempt_all_nodes(seconds=2)
        wait_for(lambda: "expedite" in watcher.output(), 120, what="the watcher to expedite the requeued job")
        wait_for(lambda: phase(root, run_dir.name) == "completed", 300, what="the run to complete")
        assert "resumed at step" in log_text(run_dir, job)
        # One decision to expedite, and one record (with who) of the watcher carrying it out.
        expedites = [e for e in events(run_dir) if e.get("action") == "expedite"]
        assert [bool(e.get("by")) for e in expedites] == [False, True], expedites
        assert ledger_job_ids(root, run_dir.name) == [job]  # resumed in place: no second job
    finally:
        watcher.stop()


def test_host_oom_is_resubmitted_with_more_memory(root):
    run_dir, job = submit(root, *LONG_RUN, "run.name=hostoom", "slurm.mem=1G", "train.max_steps=30",
                          "train.ckpt_every=5", "faults.host_alloc_mb=1500", "faults.host_alloc_step=8")
    watcher = WatcherProcess(root)
    try:
        wait_for(lambda: len(ledger_job_ids(root, run_dir.name)) == 2, 240, what="a resubmission")
        assert any(a.state == "OUT_OF_MEMORY" or any(s.state == "OUT_OF_MEMORY" for s in a.steps)
                   for a in attempts(job)), states(job)
        (decision,) = [e for e in events(run_dir) if e.get("cause") == "host_oom" and "decision" in e]
        assert decision["decision"]["action"] == "resubmit"
        new_mem = decision["decision"]["patch"]["slurm.mem"]
        assert new_mem != "1G" and load_snapshot(run_dir / "config.yaml").slurm.mem == new_mem
        wait_for(lambda: phase(root, run_dir.name) == "completed", 240, what="the resubmitted run to complete")
    finally:
        watcher.stop()


def test_gpu_oom_halves_micro_batch_and_training_continues(root):
    run_dir, job = submit(root, *LONG_RUN, "run.name=gpuoom", "train.micro_batch_size=8", "train.max_steps=40",
                          "train.ckpt_every=10", "faults.oom_above_micro_batch=4", "resilience.in_job_retries=0")
    watcher = WatcherProcess(root)
    try:
        wait_for(lambda: phase(root, run_dir.name) == "completed", 300, what="the run to complete after the OOM")
        first, second = ledger_job_ids(root, run_dir.name)
        assert first == job
        cfg = load_snapshot(run_dir / "config.yaml")
        assert (cfg.train.micro_batch_size, cfg.train.grad_accum_steps) == (4, 2)
        assert "global batch 8 = 4 x 2 x 1 ranks" in log_text(run_dir, second)
        assert "done: 40 steps" in log_text(run_dir, second)
        (decision,) = [e for e in events(run_dir) if e.get("cause") == "gpu_oom" and "decision" in e]
        assert decision["config_diff"]["train.micro_batch_size"] == {"from": 8, "to": 4}
    finally:
        watcher.stop()


def test_timeout_is_requeued_and_resumes(root):
    run_dir, job = submit(root, *LONG_RUN, "run.name=timeout", "slurm.time=1", "slurm.signal_lead_s=5",
                          "train.max_steps=100", "train.ckpt_every=10", "faults.hang_at_step=25")
    watcher = WatcherProcess(root)
    try:
        wait_for(lambda: "TIMEOUT" in states(job), 240, what="Slurm to end the hung job at its time limit")
        wait_for(lambda: phase(root, run_dir.name) == "completed", 240, what="the requeued run to complete")
        (decision,) = [e for e in events(run_dir) if e.get("cause") == "timeout" and "decision" in e]
        assert decision["decision"]["action"] == "requeue"
        text = log_text(run_dir, job)
        assert "resumed at step 20 " in text and "done: 100 steps" in text
    finally:
        watcher.stop()


def test_node_failure_excludes_the_node(root):
    run_dir, job = submit(root, *LONG_RUN, "run.name=nodefail", "train.max_steps=4000", "train.ckpt_every=50")
    watcher = WatcherProcess(root)
    node = None
    try:
        wait_for(lambda: last_step(log_text(run_dir, job)) >= 60, 180, what="training to pass a checkpoint")
        (node,) = job_nodes(job)
        subprocess.run([*CLUSTER, "kill-node", node], check=True, capture_output=True, timeout=120)
        wait_for(lambda: "NODE_FAIL" in states(job), 180, what="NODE_FAIL in sacct")
        wait_for(lambda: load_snapshot(run_dir / "config.yaml").slurm.exclude == node, 120,
                 what="the watcher to exclude the failed node")
        wait_for(lambda: states(job)[-1] == "RUNNING", 120, what="the requeued job to run again")
        assert node not in job_nodes(job)
        (decision,) = [e for e in events(run_dir) if e.get("cause") == "node_fail" and "decision" in e]
        assert decision["config_diff"]["slurm.exclude"]["to"] == node
    finally:
        watcher.stop()
        if node:
            subprocess.run([*CLUSTER, "start-node", node], capture_output=True, timeout=120)


def test_code_error_is_not_requeued(root):
    run_dir, job = submit(root, *LONG_RUN, "run.name=bug", "train.max_steps=50", "faults.error_at_step=5")
    watcher = WatcherProcess(root)
    try:
        wait_for(lambda: phase(root, run_dir.name) == "stopped", 180, what="the watcher to stop the run")
        time.sleep(3)  # a few more ticks: still nothing may happen
        assert ledger_job_ids(root, run_dir.name) == [job]
        assert states(job) == ["FAILED"]
        (decision,) = [e for e in events(run_dir) if e.get("cause")]
        assert decision["cause"] == "code_error" and decision["decision"]["action"] == "stop"
        out = watcher.output()
        assert "requeued job" not in out and "resubmitted as job" not in out and "expedite" not in out
    finally:
        watcher.stop()


@pytest.mark.parametrize("crash_at", ["after_intent", "after_submit"])
def test_watcher_killed_mid_decision_never_submits_twice(root, crash_at):
    run_dir, job = submit(root, *LONG_RUN, f"run.name=crash-{crash_at.replace('_', '-')}", "train.max_steps=30", "train.micro_batch_size=8",
                          "faults.oom_above_micro_batch=4", "resilience.in_job_retries=0")
    crashing = WatcherProcess(root, env={"HPC_AGENT_CRASH_AT": crash_at})
    wait_for(lambda: crashing.proc.poll() is not None, 240, what="the watcher to die at the crash point")
    assert crashing.stop() == -9  # SIGKILL, as a power cut or the OOM killer would
    # The restarted watcher asks Slurm about the dead watcher's intent once it is older than any sbatch
    # still in flight could be: 10 s here (sbatch answers in well under a second on this cluster), not 120.
    watcher = WatcherProcess(root, args=["--intent-grace", "10"])
    try:
        wait_for(lambda: phase(root, run_dir.name) == "completed", 300, what="the run to complete after the restart")
        ids = ledger_job_ids(root, run_dir.name)
        assert len(ids) == 2 and ids[0] == job
        named = accounting(["--allocations", "--starttime", "now-1hour", "--name", f"hpc_agent:{run_dir.name}",
                            "--format", "JobID"], done=lambda text: sorted(text.split()) == sorted(ids)).split()
        assert sorted(named) == sorted(ids), "the ledger and sacct must agree on the run's jobs"
    finally:
        watcher.stop()


def test_slurmctld_outage_causes_no_requeue(root):
    run_dir, job = submit(root, *LONG_RUN, "run.name=ctld", "train.max_steps=2500", "train.ckpt_every=500")
    watcher = WatcherProcess(root)
    try:
        wait_for(lambda: last_step(log_text(run_dir, job)) >= 20, 180, what="training to start")
        subprocess.run(["pkill", "-x", "slurmctld"], check=True)
        outage_start = len(watcher.output())
        time.sleep(60)
        during = watcher.output()[outage_start:]
        assert "requeue" not in during and "resubmit" not in during
        subprocess.run([*CLUSTER, "up"], check=True, capture_output=True, timeout=300)
        wait_for(lambda: phase(root, run_dir.name) == "completed", 300, what="tracking to continue to completion")
        assert ledger_job_ids(root, run_dir.name) == [job]
    finally:
        watcher.stop()
        subprocess.run([*CLUSTER, "up"], capture_output=True, timeout=300)


def test_gpu_oom_ladder_skips_rungs_that_cannot_fit(root):
    # A simulated 6 MiB GPU. With a 1e5-element reduction bucket (a real GPU's 1 GB default would dwarf
    # this tiny model) the estimate is 12.5 MiB at micro-batch 8, 7.25 at 4 and 4.62 at 2: the watcher
    # reads the capacity from the OOM message and goes straight to 2 (x4 accumulation).
    run_dir, job = submit(root, *LONG_RUN, "run.name=ladder", "model.d_model=64", "model.seq_len=128",
                          "train.micro_batch_size=8", "train.max_steps=20", "train.ckpt_every=10",
                          "train.reduce_bucket_size=100000", f"faults.gpu_memory_gib={6 / 1024}", "resilience.in_job_retries=0")
    watcher = WatcherProcess(root)
    try:
        wait_for(lambda: phase(root, run_dir.name) == "completed", 300, what="the run to complete after the OOM")
        first, second = ledger_job_ids(root, run_dir.name)  # one retry was enough
        assert "total capacity of 6.00 MiB" in log_text(run_dir, first)
        cfg = load_snapshot(run_dir / "config.yaml")
        assert (cfg.train.micro_batch_size, cfg.train.grad_accum_steps) == (2, 4)
        (decision,) = [e for e in events(run_dir) if e.get("cause") == "gpu_oom" and "decision" in e]
        assert "skipped 1 rung(s)" in decision["decision"]["reason"]
        assert "done: 20 steps" in log_text(run_dir, second)
    finally:
        watcher.stop()


def test_gpu_health_critical_excludes_the_node(root):
    # The in-job check reads a simulated GPU that reports uncorrectable ECC errors from step 8: the job
    # exits 82, the watcher calls it gpu_hw_error and resubmits without that node, from step 5.
    run_dir, job = submit(root, *LONG_RUN, "run.name=gpuhealth", "train.max_steps=20", "train.ckpt_every=5",
                          "faults.gpu_critical_at_step=8")
    watcher = WatcherProcess(root)
    try:
        wait_for(lambda: phase(root, run_dir.name) == "completed", 300, what="the resubmitted run to complete")
        first, second = ledger_job_ids(root, run_dir.name)
        assert first == job and attempts(job)[-1].exit_code.startswith("82")
        (node,) = job_nodes(job)
        assert f"GPU health CRITICAL on {node}: GPU 0: 2 uncorrectable ECC error(s)" in log_text(run_dir, job)
        (decision,) = [e for e in events(run_dir) if e.get("cause") == "gpu_hw_error" and "decision" in e]
        assert decision["decision"]["patch"] == {"slurm.exclude": node}
        assert node not in job_nodes(second)
        text = log_text(run_dir, second)
        assert "resumed at step 5 " in text and "done: 20 steps" in text
        from hpc_agent.metrics.tb_reader import RunScalars

        tb = RunScalars(run_dir / "tb")
        tb.update()
        levels = {p.step: p.value for _, p in tb.raw("gpu_health/level")}
        assert levels[1] == 0 and levels[7] == 0 and levels[8] == 2  # the readings reached TensorBoard
        assert {p.step: p.value for _, p in tb.raw("gpu_health/gpu0/ecc_uncorrected_volatile")}[8] == 2
    finally:
        watcher.stop()

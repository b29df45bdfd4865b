"""Issue 17, must-show 3: an injected GPU OOM and an injected NaN are repaired inside the same Slurm job
(one attempt in ``sacct -D``, the same job id), the global batch is kept, and the watcher records the
job's decision in events.jsonl, where ``review`` shows it."""
from __future__ import annotations

import pytest

from hpc_agent.config.load import load_run_config
from hpc_agent.state.ledger import Ledger
from tests.conftest import run_cli
from tests.slurm_helpers import LONG_RUN, WatcherProcess, attempts, events, ledger_job_ids, log_text, submit, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


@pytest.mark.parametrize("name,fault,cause,patch", [
    ("oom", ("train.micro_batch_size=4", "faults.oom_above_micro_batch=2"), "gpu_oom",
     {"train.micro_batch_size": 2, "train.grad_accum_steps": 2}),
    ("nan", ("train.micro_batch_size=4", "faults.nan_at_step=12"), "diverged", {"train.lr": 5e-4}),
])
def test_fault_repaired_inside_the_same_slurm_job(root, name, fault, cause, patch):
    run_dir, job = submit(root, *LONG_RUN, f"run.name=injob-{name}", "train.max_steps=20", "train.ckpt_every=5",
                          "train.lr=1e-3", *fault)
    watcher = WatcherProcess(root)
    try:
        wait_for(lambda: Ledger.in_runs_root(root).run(run_dir.name).phase == "completed", 150,
                 what="the run to complete")
        wait_for(lambda: [e for e in events(run_dir) if e.get("decided_in") == "job"], 30,
                 what="the in-job decision in events.jsonl")
    finally:
        watcher.stop()
    assert ledger_job_ids(root, run_dir.name) == [job]  # no resubmission
    assert len(attempts(job)) == 1, attempts(job)      # sacct -D: one attempt, no requeue
    log = log_text(run_dir, job)
    assert "global batch 4 = 4 x 1 x 1 ranks" in log and "done: 20 steps" in log
    assert f"in-job repair 1 of 2: {'gpu_oom' if cause == 'gpu_oom' else 'nan_loss'}" in log
    (record,) = [e for e in events(run_dir) if e.get("decided_in") == "job"]
    assert (record["job_id"], record["cause"], record["decision"]["patch"]) == (job, cause, patch)
    if cause == "gpu_oom":  # 2 x 2 x 1 = 4: the global batch is kept
        assert record["config_diff"]["train.micro_batch_size"] == {"from": 4, "to": 2}
    else:
        assert record["decision"]["rollback_to_step"] == 10 and record["step"] == 12
    # carried into the run's config.yaml, which the run's next job loads (a successor, a resubmission)
    train = load_run_config(run_dir).train
    assert {key: getattr(train, key.split(".", 1)[1]) for key in patch} == patch
    assert not [e for e in events(run_dir) if e.get("decision") and e.get("decided_in") != "job"]
    review = run_cli("-m", "hpc_agent.review", str(root))
    assert review.returncode == 0, review.stdout + review.stderr
    assert cause in review.stdout, review.stdout

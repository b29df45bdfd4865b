"""Issue 19 part 5 offline: the bug report's sweep (both trials fail with a code error, no watcher running)
on the fake Slurm. The driver's embedded watcher judges them, the sweep finishes its budget, and the
summary says FAIL and stopped, not RUNNING."""
from __future__ import annotations

import io

import optuna

from hpc_agent.sweep.live import SweepLive, summary
from hpc_agent.watcher.embedded import EmbeddedWatch
from hpc_agent.watcher.loop import Watcher
from tests.helpers.fake_slurm import FakeSlurm
from tests.unit.test_sweep import make_driver
from tests.unit.test_watcher import CODE_LOG


def test_failed_trials_are_judged_without_a_watcher_and_the_summary_is_true(tmp_path):
    study = optuna.create_study(direction="maximize")
    slurm = FakeSlurm(first_job_id=900)
    driver = make_driver(tmp_path, study, slurm, [])
    driver.spec = driver.spec.__class__(**{**driver.spec.__dict__, "trials": 2})
    said = []
    live = SweepLive(driver, slurm, poll_s=0, stream=io.StringIO())
    live.embedded.close()
    live.embedded = EmbeddedWatch(
        driver.runs_root, slurm=slurm, interval_s=0, out=said.append, clock=lambda: slurm.now,
        make_watcher=lambda ledger, s, lease: Watcher(ledger, s, runs_root=driver.runs_root, clock=lambda: slurm.now,
                                                      lease=lease, out=said.append))
    turns = []

    def on_poll():
        turns.append(1)
        if len(turns) == 2:  # both trials were submitted on the first turn: they start and fail with a bug
            slurm.schedule()
            for f in driver.followed.values():
                job = driver.ledger.latest_submission(f.run_id).job_id
                (f.run_dir / "slurm").mkdir(parents=True, exist_ok=True)
                (f.run_dir / "slurm" / f"{job}_0_log.out").write_text(CODE_LOG.format(job=job))
                slurm.fail(job, 1)
            slurm.advance(5)
        live()

    try:
        driver.run(poll_s=0, stop=lambda: len(turns) > 10, on_poll=on_poll)
    finally:
        live.close()
    assert driver.finished() and len(turns) <= 4, said
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.FAIL] * 2
    assert summary(driver) == "trials {'FAIL': 2}; runs {'stopped': 2}"
    assert any("no watcher holds" in line for line in said)
    assert all(driver.ledger.decisions(t.user_attrs["run_id"])[-1].cause == "code_error" for t in study.trials)

"""One broken run never stops the watcher: it is parked in needs_attention, every other run is followed.

Canonical fake Slurm (held to the real cluster by tests/cluster/test_slurm_contract.py); the same scenario on the
real cluster with the watcher process running is tests/cluster/test_watch_poison_slurm.py.
"""
from __future__ import annotations

import os

from hpc_agent.core import rundir
from hpc_agent.state.journal import Journal
from tests.helpers.running_runs import PREEMPTION_LOG, fake_world, running_run



def test_a_poisoned_run_is_parked_and_a_preempted_one_is_still_expedited_on_the_same_tick(tmp_path):
    root, ledger, slurm, watcher, out = fake_world(tmp_path)
    a_dir, a_job = running_run(root, ledger, slurm, "a", "[hpc_agent] step 3 loss 2.0\n", recorded=False)
    _, b_job = running_run(root, ledger, slurm, "b", PREEMPTION_LOG)
    rundir.config_path(a_dir).write_text("train: [unclosed\n")
    log = rundir.slurm_dir(a_dir) / f"{a_job}_0_log.out"
    log.unlink()
    os.mkfifo(log)
    (rundir.slurm_dir(a_dir) / f"{a_job}_0_log.err").symlink_to("/dev/zero")
    slurm.oom(a_job)      # A ends (host OOM: would be resubmitted if its files could be read)
    slurm.preempt(b_job)  # B is requeued by Slurm
    report = watcher.tick()
    assert report.parked == ["a"]
    assert ledger.run("a").phase == "needs_attention"
    (record,) = [r for _, _, r in Journal(ledger).audit_records("a")]
    assert "config.yaml" in record["reason"] and "FIFO" in record["reason"] and "symbolic link" in record["reason"]
    assert slurm.expedites == [b_job] and ledger.run("b").phase == "pending"
    assert slurm.submissions == []  # nothing was resubmitted for the parked run
    watcher.tick()  # parked runs are not followed again: no second audit record, no action
    assert len(Journal(ledger).audit_records("a")) == 1 and slurm.submissions == []


def test_an_exception_in_the_core_parks_only_that_run(tmp_path, monkeypatch):
    import hpc_agent.watcher.loop as watcher_module

    root, ledger, slurm, watcher, out = fake_world(tmp_path)
    _, a_job = running_run(root, ledger, slurm, "a", "")
    _, b_job = running_run(root, ledger, slurm, "b", PREEMPTION_LOG)
    real = watcher_module.follow

    def follow(state, obs, limits):
        if state.run_id == "a":
            raise ZeroDivisionError("a bug in the core")
        return real(state, obs, limits)

    monkeypatch.setattr(watcher_module, "follow", follow)
    slurm.preempt(b_job)
    watcher.tick()
    assert ledger.run("a").phase == "needs_attention" and ledger.run("b").phase == "pending"
    (record,) = [r for _, _, r in Journal(ledger).audit_records("a")]
    assert record["reason"] == "ZeroDivisionError: a bug in the core"
    assert (root / "a" / "events.jsonl").read_text().count("needs_attention") == 1


def test_resume_run_follows_a_parked_run_again(tmp_path):
    from hpc_agent.watch import main

    root, ledger, slurm, watcher, out = fake_world(tmp_path)
    a_dir, a_job = running_run(root, ledger, slurm, "a", "", recorded=False)
    rundir.config_path(a_dir).write_text("train: [unclosed\n")
    slurm.fail(a_job, 3)
    watcher.tick()
    assert ledger.run("a").phase == "needs_attention"
    assert main(["--runs-root", str(root), "--resume-run", "a"]) == 0
    assert ledger.run("a").phase == "pending"
    assert main(["--runs-root", str(root), "--resume-run", "a"]) == 2  # not parked any more: usage error

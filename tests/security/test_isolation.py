"""Issue 42, "per-run isolation": any exception from observing, deciding or carrying out one run parks that run.

The attack: a job writes whatever makes one of the watcher's readers, its pure core or an effect raise (here
the raise is planted with monkeypatch at each stage, with exception types no ``except`` list names). The watcher
must stay up, park that run in ``needs_attention`` through the lifecycle with the reason audited, and follow
every other run on the same tick. Fake Slurm (tests/helpers/fake_slurm.py): nothing reaches a cluster.
"""
from __future__ import annotations

import pytest

from hpc_agent.state.journal import Journal
from tests.helpers.running_runs import fake_world, running_run



class OddError(Exception):
    """An exception type nobody's ``except`` list names."""


def _world(tmp_path, names=("a", "b", "c")):
    root, ledger, slurm, watcher, out = fake_world(tmp_path)
    jobs = {name: running_run(root, ledger, slurm, name)[1] for name in names}
    return root, ledger, slurm, watcher, out, jobs


def _raise_for_run_a(monkeypatch, target, name, exc, run_of):
    real = getattr(target, name)

    def poisoned(*args, **kwargs):
        if run_of(*args, **kwargs) == "a":
            raise exc
        return real(*args, **kwargs)

    monkeypatch.setattr(target, name, poisoned)


def _stages():
    """(stage, module, function, which argument names the run): observe, decide, carry out, write the audit."""
    import hpc_agent.watcher.effects as effects
    import hpc_agent.watcher.loop as loop
    import hpc_agent.watcher.observe as observe
    from hpc_agent.state import journal

    return [
        ("observe: the run's files", observe, "read_files", lambda run_dir, *a, **k: run_dir.name),
        ("observe: the job's sacct records", loop, "own_attempts", lambda attempts, claim: claim.run_id),
        ("decide: the pure core", loop, "follow", lambda state, *a, **k: state.run_id),
        ("carry out: an effect", effects, "carry_out", lambda ctx, run, effect: run.run_id),
        ("carry out: events.jsonl", journal.Journal, "flush_events", lambda self, run_id, *a, **k: run_id),
    ]


@pytest.mark.parametrize("exc", [RuntimeError("planted by the job"), KeyError("train"), OddError("odd")],
                         ids=["RuntimeError", "KeyError", "OddError"])
@pytest.mark.parametrize("stage", range(len(_stages())), ids=[s[0] for s in _stages()])
def test_a_run_that_raises_anywhere_is_parked_and_the_others_go_on(tmp_path, monkeypatch, stage, exc):
    root, ledger, slurm, watcher, out, jobs = _world(tmp_path)
    _, target, name, run_of = _stages()[stage]
    _raise_for_run_a(monkeypatch, target, name, exc, run_of)
    for job in jobs.values():
        slurm.preempt(job)  # each job is requeued by Slurm: the watcher expedites each (one effect per run)

    watcher.tick()  # the watcher stays up: no exception leaves tick()

    assert ledger.run("a").phase == "needs_attention"
    reasons = [r.get("reason", "") for _, _, r in Journal(ledger).audit_records("a")
               if r.get("action") == "needs_attention"]
    assert reasons and type(exc).__name__ in reasons[-1]  # parked through the lifecycle, the reason audited
    assert any("a: needs attention" in line and type(exc).__name__ in line for line in out)
    # the others were followed on the same tick: requeued by Slurm, expedited by the watcher
    assert sorted(slurm.expedites) in (sorted([jobs["b"], jobs["c"]]), sorted(jobs.values()))
    assert ledger.run("b").phase == "pending" and ledger.run("c").phase == "pending"
    assert slurm.submissions == []

    watcher.tick()  # and on the next tick: no new audit record for the parked run, the watcher still up
    assert ledger.run("a").phase == "needs_attention"
    assert len([1 for _, _, r in Journal(ledger).audit_records("a") if r.get("action") == "needs_attention"]) == 1


def test_an_events_file_that_keeps_failing_is_said_once_and_every_tick_goes_on(tmp_path, monkeypatch):
    """A parked run whose events.jsonl can never be written (its reader raises every time) costs one line, not
    one a tick, and never stops a tick."""
    from hpc_agent.state import journal

    root, ledger, slurm, watcher, out, jobs = _world(tmp_path)
    _raise_for_run_a(monkeypatch, journal.Journal, "flush_events", RecursionError("deep JSON"),
                     lambda self, run_id, *a, **k: run_id)
    slurm.preempt(jobs["a"])
    for _ in range(4):
        watcher.tick()
        slurm.advance(10)
    assert ledger.run("a").phase == "needs_attention"
    said = [line for line in out if "a: needs attention: RecursionError" in line]
    assert len(said) == 2  # parked (followed -> needs_attention), then once more for the parked run, not each tick
    slurm.preempt(jobs["b"])
    watcher.tick()
    assert jobs["b"] in slurm.expedites

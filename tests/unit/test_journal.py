"""The effect journal: a decision, its effects, its audit record and the phase commit together or not at all;
events.jsonl gets each audit record exactly once and can be rebuilt from the ledger alone."""
from __future__ import annotations

import json

import pytest

from hpc_agent.state.journal import Journal, LeaseLost, WatcherLease, commit_or_skip
from hpc_agent.state.ledger import Ledger
from hpc_agent.state.lifecycle import Event, EventKind, Phase
from hpc_agent.watcher.follow_model import Expedite, Outcome, Requeue

DECISION = {"job_id": "7", "attempt": 0, "cause": "timeout", "action": "requeue", "reason": "time limit",
            "patch": {}, "evidence": ["sacct: TIMEOUT"], "ckpt_step": 40, "decision": {"action": "requeue"}}


def _ledger(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite", clock=lambda: 1_800_000_000.0)
    ledger.add_run("r", "r", str(tmp_path / "r"))
    (tmp_path / "r").mkdir()
    sid = ledger.record_intent("r", "slurm", "c.yaml", "submit")
    ledger.record_submitted(sid, "7")
    ledger.advance("r", Event(EventKind.SUBMITTED, "7"))
    ledger.advance("r", Event(EventKind.STARTED, "7"))
    return ledger


def _outcome():
    return Outcome(Phase.RECOVERING, (Requeue("7"), Expedite("7")), dict(DECISION), expedite_attempt=1,
                   audit=({"job_id": "7", "cause": "timeout", "decision": {"action": "requeue"}},))


def test_commit_writes_everything_at_once(tmp_path):
    ledger = _ledger(tmp_path)
    journal = Journal(ledger)
    assert commit_or_skip(journal, "r", "running", _outcome())
    assert ledger.run("r").phase == "recovering" and ledger.decided("7", 0) and ledger.expedited("7", 1)
    assert [(k, s) for k, _, s in journal.effects("r")] == [("requeue", "pending"), ("expedite", "pending")]
    assert len(journal.audit_records("r")) == 1
    assert not commit_or_skip(journal, "r", "recovering", _outcome())  # decided already: nothing written twice
    assert len(journal.effects("r")) == 2 and len(journal.audit_records("r")) == 1


def test_a_commit_that_fails_half_way_leaves_nothing(tmp_path):
    ledger = _ledger(tmp_path)
    lease = WatcherLease(ledger, holder="me")
    other = WatcherLease(ledger, holder="other")
    assert other.acquire() is None  # someone else holds the root: the journal's lease check fails
    with pytest.raises(LeaseLost):
        Journal(ledger, lease).commit("r", "running", _outcome())
    assert ledger.run("r").phase == "running" and not ledger.decided("7", 0) and not ledger.expedited("7", 1)
    assert Journal(ledger).effects("r") == [] and Journal(ledger).audit_records("r") == []


def test_phase_is_written_only_if_unchanged_since_the_core_looked(tmp_path):
    ledger = _ledger(tmp_path)
    ledger.advance("r", Event(EventKind.CANCELLED, "7"))  # a sweep driver pruned it meanwhile
    assert not commit_or_skip(Journal(ledger), "r", "running", _outcome())
    assert ledger.run("r").phase == "stopped" and not ledger.decided("7", 0)


def test_events_get_each_record_once_even_if_the_mark_was_lost(tmp_path):
    ledger = _ledger(tmp_path)
    journal = Journal(ledger)
    commit_or_skip(journal, "r", "running", _outcome())
    assert journal.flush_events("r", tmp_path / "r", str) == 1
    ledger.db.execute("UPDATE audit SET written = 0")  # as if killed between the append and the mark
    assert journal.flush_events("r", tmp_path / "r", str) == 0
    lines = (tmp_path / "r" / "events.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["seq"] == 1
    (tmp_path / "r" / "events.jsonl").write_text("torn{\n")  # lost or damaged: rebuilt from the journal
    assert journal.rebuild_events("r", tmp_path / "r", str) == 1
    assert json.loads((tmp_path / "r" / "events.jsonl").read_text())["cause"] == "timeout"


def test_events_jsonl_that_is_a_fifo_is_not_written(tmp_path):
    import os

    ledger = _ledger(tmp_path)
    journal = Journal(ledger)
    commit_or_skip(journal, "r", "running", _outcome())
    os.mkfifo(tmp_path / "r" / "events.jsonl")
    with pytest.raises(OSError):
        journal.flush_events("r", tmp_path / "r", str)
    assert journal.unwritten_runs() == {"r"}  # kept in the ledger, retried next tick

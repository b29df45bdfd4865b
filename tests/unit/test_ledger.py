"""The ledger records the intent before sbatch and the job id after it."""
from __future__ import annotations

import sqlite3

from hpc_agent.state.ledger import Ledger


def test_intent_then_job_id(tmp_path):
    ticks = iter(range(100, 200))
    ledger = Ledger(tmp_path / "ledger.sqlite", clock=lambda: float(next(ticks)))
    ledger.add_run("r1", "r", str(tmp_path / "r1"))
    sid = ledger.record_intent("r1", "slurm", "cfg.yaml", reason="submit")
    (pending,) = ledger.submissions("r1")
    assert pending.job_id is None and pending.intent_at == 101.0
    ledger.record_submitted(sid, "42")
    (done,) = ledger.submissions("r1")
    assert done.job_id == "42" and done.submitted_at == 102.0 and done.error is None
    assert [r.run_id for r in ledger.runs()] == ["r1"]


def test_failed_submission_is_kept(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.add_run("r1", "r", "d")
    sid = ledger.record_intent("r1", "slurm", "cfg.yaml", reason="submit")
    ledger.record_failed(sid, "sbatch: error: invalid partition")
    (row,) = ledger.submissions("r1")
    assert row.job_id is None and "invalid partition" in row.error


def test_wal_mode_and_reopen(tmp_path):
    path = tmp_path / "ledger.sqlite"
    Ledger(path).add_run("r1", "r", "d")
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert [r.run_id for r in Ledger(path).runs()] == ["r1"]

"""The ledger: SQLite in WAL mode, the source of truth for runs and their submissions.

The intent to submit is recorded *before* sbatch runs and the job id right after, so a crash between
the two leaves an intent without a job id. The watcher reconciles such rows with sacct using the run
id carried in the job name, instead of guessing (and never submits twice).
"""
from __future__ import annotations

import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
import json
from typing import Any, Callable, Dict, Iterator, List, Optional

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id      TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    run_dir     TEXT NOT NULL,
    created_at  REAL NOT NULL,
    phase       TEXT NOT NULL DEFAULT 'submitting',
    updated_at  REAL
);
CREATE TABLE IF NOT EXISTS submissions (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id       TEXT NOT NULL REFERENCES runs(run_id),
    executor     TEXT NOT NULL,
    config_path  TEXT NOT NULL,
    reason       TEXT NOT NULL,
    intent_at    REAL NOT NULL,
    job_id       TEXT,
    submitted_at REAL,
    error        TEXT
);
CREATE INDEX IF NOT EXISTS submissions_run ON submissions(run_id);
-- One row per decided attempt; the UNIQUE key makes deciding idempotent across watcher restarts.
CREATE TABLE IF NOT EXISTS decisions (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id       TEXT NOT NULL REFERENCES runs(run_id),
    job_id       TEXT NOT NULL,
    attempt      INTEGER NOT NULL,
    at           REAL NOT NULL,
    cause        TEXT NOT NULL,
    action       TEXT NOT NULL,
    reason       TEXT NOT NULL,
    patch        TEXT NOT NULL DEFAULT '{}',
    evidence     TEXT NOT NULL DEFAULT '[]',
    ckpt_step    INTEGER,
    decision     TEXT NOT NULL DEFAULT '{}',
    UNIQUE(job_id, attempt)
);
-- Expedites already sent (scontrol update StartTime=now), once per attempt.
CREATE TABLE IF NOT EXISTS expedites (
    job_id   TEXT NOT NULL,
    attempt  INTEGER NOT NULL,
    at       REAL NOT NULL,
    PRIMARY KEY(job_id, attempt)
);
"""

LEDGER_FILE = "ledger.sqlite"


@dataclass(frozen=True)
class Submission:
    id: int
    run_id: str
    executor: str
    config_path: str
    reason: str
    intent_at: float
    job_id: Optional[str]
    submitted_at: Optional[float]
    error: Optional[str]


@dataclass(frozen=True)
class Run:
    run_id: str
    name: str
    run_dir: str
    created_at: float
    phase: str


@dataclass(frozen=True)
class DecisionRow:
    id: int
    run_id: str
    job_id: str
    attempt: int
    at: float
    cause: str
    action: str
    reason: str
    patch: Dict[str, Any]
    evidence: List[str]
    ckpt_step: Optional[int]
    decision: Dict[str, Any]


class Ledger:
    def __init__(self, path: str | Path, clock: Callable[[], float] = time.time):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.clock = clock
        # isolation_level=None: autocommit; each statement is its own transaction unless we open one.
        self.db = sqlite3.connect(str(self.path), timeout=30, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)

    @classmethod
    def in_runs_root(cls, runs_root: str | Path) -> "Ledger":
        return cls(Path(runs_root) / LEDGER_FILE)

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def transaction(self) -> Iterator["Ledger"]:
        """The statements inside commit together or not at all: a process killed in between (SIGKILL, power
        cut) leaves none of them, so a reader never sees, say, a submission row without its job id."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def add_run(self, run_id: str, name: str, run_dir: str) -> None:
        self.db.execute("INSERT INTO runs(run_id, name, run_dir, created_at) VALUES (?, ?, ?, ?)",
                        (run_id, name, str(run_dir), self.clock()))

    def record_intent(self, run_id: str, executor: str, config_path: str, reason: str) -> int:
        cur = self.db.execute(
            "INSERT INTO submissions(run_id, executor, config_path, reason, intent_at) VALUES (?, ?, ?, ?, ?)",
            (run_id, executor, str(config_path), reason, self.clock()))
        return int(cur.lastrowid)

    def record_submitted(self, submission_id: int, job_id: str) -> None:
        self.db.execute("UPDATE submissions SET job_id = ?, submitted_at = ? WHERE id = ?",
                        (str(job_id), self.clock(), submission_id))

    def record_failed(self, submission_id: int, error: str) -> None:
        self.db.execute("UPDATE submissions SET error = ? WHERE id = ?", (error, submission_id))

    def runs(self, phases: Optional[List[str]] = None) -> List[Run]:
        rows = [Run(*row) for row in self.db.execute(
            "SELECT run_id, name, run_dir, created_at, phase FROM runs ORDER BY created_at, run_id")]
        return [r for r in rows if phases is None or r.phase in phases]

    def run(self, run_id: str) -> Optional[Run]:
        row = self.db.execute("SELECT run_id, name, run_dir, created_at, phase FROM runs WHERE run_id = ?",
                              (run_id,)).fetchone()
        return Run(*row) if row else None

    def set_phase(self, run_id: str, phase: str) -> None:
        self.db.execute("UPDATE runs SET phase = ?, updated_at = ? WHERE run_id = ?", (phase, self.clock(), run_id))

    def latest_submission(self, run_id: str) -> Optional[Submission]:
        subs = self.submissions(run_id)
        return subs[-1] if subs else None

    def record_decision(self, run_id: str, job_id: str, attempt: int, cause: str, action: str, reason: str,
                        patch: Dict[str, Any], evidence: List[str], ckpt_step: Optional[int],
                        decision: Optional[Dict[str, Any]] = None) -> bool:
        """Store a decision; False if this attempt was already decided (a restarted watcher must not act twice)."""
        try:
            self.db.execute(
                "INSERT INTO decisions(run_id, job_id, attempt, at, cause, action, reason, patch, evidence, ckpt_step,"
                " decision) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (run_id, str(job_id), attempt, self.clock(), cause, action, reason, json.dumps(patch, sort_keys=True),
                 json.dumps(list(evidence)), ckpt_step, json.dumps(decision or {}, sort_keys=True, default=str)))
        except sqlite3.IntegrityError:
            return False
        return True

    def decided(self, job_id: str, attempt: int) -> bool:
        return self.db.execute("SELECT 1 FROM decisions WHERE job_id = ? AND attempt = ?",
                               (str(job_id), attempt)).fetchone() is not None

    def decisions(self, run_id: str) -> List[DecisionRow]:
        rows = self.db.execute(
            "SELECT id, run_id, job_id, attempt, at, cause, action, reason, patch, evidence, ckpt_step, decision "
            "FROM decisions WHERE run_id = ? ORDER BY id", (run_id,))
        return [DecisionRow(*row[:8], json.loads(row[8]), json.loads(row[9]), row[10], json.loads(row[11]))
                for row in rows]

    def mark_expedited(self, job_id: str, attempt: int) -> bool:
        """True the first time for this attempt; False if it was already expedited."""
        try:
            self.db.execute("INSERT INTO expedites(job_id, attempt, at) VALUES (?, ?, ?)",
                            (str(job_id), attempt, self.clock()))
        except sqlite3.IntegrityError:
            return False
        return True

    def expedited(self, job_id: str, attempt: int) -> bool:
        return self.db.execute("SELECT 1 FROM expedites WHERE job_id = ? AND attempt = ?",
                               (str(job_id), attempt)).fetchone() is not None

    def submissions(self, run_id: str) -> List[Submission]:
        return [Submission(*row) for row in self.db.execute(
            "SELECT id, run_id, executor, config_path, reason, intent_at, job_id, submitted_at, error "
            "FROM submissions WHERE run_id = ? ORDER BY id", (run_id,))]

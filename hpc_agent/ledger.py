"""The ledger: SQLite in WAL mode, the source of truth for runs and their submissions.

The intent to submit is recorded *before* sbatch runs and the job id right after, so a crash between
the two leaves an intent without a job id. The watcher reconciles such rows with sacct using the run
id carried in the job name, instead of guessing (and never submits twice).
"""
from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id      TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    run_dir     TEXT NOT NULL,
    created_at  REAL NOT NULL,
    status      TEXT NOT NULL DEFAULT 'active'
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
    status: str


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

    def runs(self) -> List[Run]:
        return [Run(*row) for row in self.db.execute(
            "SELECT run_id, name, run_dir, created_at, status FROM runs ORDER BY created_at")]

    def submissions(self, run_id: str) -> List[Submission]:
        return [Submission(*row) for row in self.db.execute(
            "SELECT id, run_id, executor, config_path, reason, intent_at, job_id, submitted_at, error "
            "FROM submissions WHERE run_id = ? ORDER BY id", (run_id,))]

"""The ledger: SQLite (WAL on local disks, DELETE journal on network filesystems), the source of truth for
runs, their submissions, decisions, the effect journal and the watcher lease.

The intent to submit is recorded *before* sbatch runs and the job id right after, so a crash between
the two leaves an intent without a job id. The watcher reconciles such rows with sacct using the run
id carried in the job name, instead of guessing (and never submits twice).
"""
from __future__ import annotations

import json
import os
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Tuple

from hpc_agent.state.ledger_schema import SCHEMA

if TYPE_CHECKING:
    from hpc_agent.state.lifecycle import Event, Phase


LEDGER_FILE = "ledger.sqlite"


SIDECARS = ("-journal", "-wal", "-shm")
"""SQLite's files beside the database; it creates them with the database file's own mode."""


def _create_private(path: Path) -> None:
    """Create the database file (and its folder) with the mode the runs root calls for (0600, or 0640 in
    a group-shared root: hpc_agent.core.filemodes) before SQLite opens it: SQLite would create it 0644 minus the
    umask, and gives its -journal/-wal/-shm files the database's mode. An existing ledger (and sidecar)
    is brought to that mode too."""
    from hpc_agent.core.filemodes import file_mode_in, make_dir, open_created, set_mode

    make_dir(path.parent)
    mode = file_mode_in(path.parent)
    os.close(open_created(path, os.O_RDWR, mode))
    for suffix in SIDECARS:
        side = path.with_name(path.name + suffix)
        if side.is_file() and not side.is_symlink():
            set_mode(side, mode)


def ledger_problem(runs_root: str | Path) -> Optional[str]:
    """Why the ledger in ``runs_root`` (or a SQLite file beside it) is not to be trusted, or None: each must be
    a regular file of this user's that nobody else can write. In a group-writable runs root another member
    could replace it, or plant a ``-wal`` file that SQLite would replay into it."""
    from hpc_agent.core.filemodes import owned_problem

    path = Path(runs_root) / LEDGER_FILE
    for candidate in (path, *(path.with_name(path.name + suffix) for suffix in SIDECARS)):
        try:
            info = os.lstat(candidate)
        except FileNotFoundError:
            continue
        except OSError as exc:
            return f"{candidate}: {exc.strerror or exc}"
        problem = owned_problem(info, os.geteuid(), str(candidate))
        if problem is not None:
            return problem + ": refusing to use this ledger (docs/security.md)"
    return None


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
        _create_private(self.path)
        self.clock = clock
        # isolation_level=None: autocommit; each statement is its own transaction unless we open one.
        self.db = sqlite3.connect(str(self.path), timeout=30, isolation_level=None)
        # WAL only on a local file system: its -shm index is shared memory, which NFS/Lustre/GPFS do not
        # share between hosts. ``journal_mode`` says which mode was chosen and why (watch prints it).
        from hpc_agent.core.fsutil import sqlite_journal_mode

        mode, why = sqlite_journal_mode(self.path.parent)
        self.db.execute(f"PRAGMA journal_mode={mode}")
        self.db.execute("PRAGMA synchronous=NORMAL" if mode == "WAL" else "PRAGMA synchronous=FULL")
        self.journal_mode = (mode, why)
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
        where = "" if phases is None else f" WHERE phase IN ({','.join('?' * len(phases))})"
        return [Run(*row) for row in self.db.execute(
            f"SELECT run_id, name, run_dir, created_at, phase FROM runs{where} ORDER BY created_at, run_id",
            list(phases or ()))]

    def open_intents(self, phases: List[str]) -> List[Tuple[Run, Submission]]:
        """Runs in these phases whose newest submission is an intent without a job id and without an error
        (its submitter died between the intent and the job id, or is still in sbatch). One query."""
        marks = ",".join("?" * len(phases))
        rows = self.db.execute(
            "SELECT r.run_id, r.name, r.run_dir, r.created_at, r.phase, s.id, s.run_id, s.executor, s.config_path, "
            "s.reason, s.intent_at, s.job_id, s.submitted_at, s.error FROM runs r JOIN submissions s ON s.id = "
            "(SELECT MAX(id) FROM submissions WHERE run_id = r.run_id) "
            f"WHERE r.phase IN ({marks}) AND s.job_id IS NULL AND s.error IS NULL ORDER BY r.created_at", phases)
        return [(Run(*row[:5]), Submission(*row[5:])) for row in rows]

    def run(self, run_id: str) -> Optional[Run]:
        row = self.db.execute("SELECT run_id, name, run_dir, created_at, phase FROM runs WHERE run_id = ?",
                              (run_id,)).fetchone()
        return Run(*row) if row else None

    def set_phase(self, run_id: str, phase: str) -> None:
        """Low level: write a phase. Callers outside the ledger use :meth:`advance`, which goes through the
        one state machine (``lifecycle.transition``)."""
        self.db.execute("UPDATE runs SET phase = ?, updated_at = ? WHERE run_id = ?", (phase, self.clock(), run_id))

    def replace_phase(self, run_id: str, expected: str, phase: str) -> bool:
        """Write ``phase`` only if the run is still in ``expected`` (another writer, such as a sweep driver
        cancelling the run, wins a race instead of being overwritten). For the effect journal, whose core
        already went through ``lifecycle.transition``."""
        cur = self.db.execute("UPDATE runs SET phase = ?, updated_at = ? WHERE run_id = ? AND phase = ?",
                              (phase, self.clock(), run_id, expected))
        return cur.rowcount == 1

    def advance(self, run_id: str, event: "Event") -> "Phase":
        """Move a run along the lifecycle: its current phase plus ``event`` -> the next phase, written and
        returned. Raises ``InvalidTransition`` for an edge that does not exist."""
        from hpc_agent.state.lifecycle import Phase, transition

        run = self.run(run_id)
        if run is None:
            raise KeyError(f"no run {run_id!r} in {self.path}")
        phase = Phase(run.phase)
        new_phase = transition(phase, event)
        if new_phase is not phase:
            self.set_phase(run_id, new_phase.value)
        return new_phase

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

    def followed_submissions(self, phases: List[str]) -> List[Tuple[str, str, Optional[str], Optional[float], str]]:
        """``(run id, phase, newest job id, its intent_at, its executor)`` of every run in these phases, oldest run
        first: one query, plain tuples (a tick over ten thousand runs builds no object for a run that needs
        nothing). ``intent_at`` is what the watcher matches sacct records against (a reused job id can list an
        older job first; hpc_agent/slurm/job_match.py); ``executor`` says where the job runs (``local``: a
        process id, never sent to sacct)."""
        marks = ",".join("?" * len(phases))
        return self.db.execute(
            "SELECT r.run_id, r.phase, s.job_id, s.intent_at, s.executor FROM runs r JOIN submissions s ON s.id = "
            f"(SELECT MAX(id) FROM submissions WHERE run_id = r.run_id) WHERE r.phase IN ({marks}) "
            "ORDER BY r.created_at, r.run_id", phases).fetchall()

    def attempt_marks(self, phases: List[str]) -> Tuple[Dict[str, set], Dict[str, set]]:
        """(decided, expedited): attempt indexes per job id, for the jobs of runs in these phases."""
        marks = ",".join("?" * len(phases))
        jobs = f"SELECT job_id FROM submissions WHERE run_id IN (SELECT run_id FROM runs WHERE phase IN ({marks}))"
        out: Tuple[Dict[str, set], Dict[str, set]] = ({}, {})
        for table, into in (("decisions", out[0]), ("expedites", out[1])):
            for job_id, attempt in self.db.execute(f"SELECT job_id, attempt FROM {table} WHERE job_id IN ({jobs})",
                                                   phases):
                into.setdefault(job_id, set()).add(attempt)
        return out

    def store_suspicion(self, job_id: str, attempt: int, asked_at: float, marks: Dict[int, Any],
                        verdict: Dict[str, Any], active: bool) -> None:
        """Open (or close, ``active`` False) the hang suspicion of one attempt; a closed one keeps its row."""
        if active:
            self.db.execute("INSERT OR REPLACE INTO hang_suspicions(job_id, attempt, asked_at, marks, verdict, active) "
                            "VALUES (?, ?, ?, ?, ?, 1)", (str(job_id), attempt, asked_at,
                                                          json.dumps({str(k): list(v) for k, v in marks.items()}),
                                                          json.dumps(verdict, sort_keys=True, default=str)))
        else:
            self.db.execute("UPDATE hang_suspicions SET active = 0 WHERE job_id = ? AND attempt = ?",
                            (str(job_id), attempt))

    def suspicions(self, phases: List[str]) -> Dict[str, Tuple[int, float, Dict[int, Tuple[int, int]], Dict[str, Any]]]:
        """job id -> (attempt, asked_at, rank -> stack file mark, verdict) of every open hang suspicion of
        the jobs of runs in these phases (one query a tick)."""
        marks = ",".join("?" * len(phases))
        jobs = f"SELECT job_id FROM submissions WHERE run_id IN (SELECT run_id FROM runs WHERE phase IN ({marks}))"
        out = {}
        for job_id, attempt, asked_at, stack_marks, verdict in self.db.execute(
                "SELECT job_id, attempt, asked_at, marks, verdict FROM hang_suspicions WHERE active = 1 AND "
                f"job_id IN ({jobs}) ORDER BY attempt", phases):
            out[job_id] = (attempt, asked_at, {int(k): (int(v[0]), int(v[1])) for k, v in json.loads(stack_marks).items()},
                           json.loads(verdict))
        return out

    def record_config(self, run_id: str, yaml_text: str, source: str) -> int:
        """Store a new version of the run's config (the YAML text and its SHA-256); returns its version. The
        newest version is the one the watcher acts on (hpc_agent/state/run_config.py)."""
        import hashlib

        row = self.db.execute("SELECT MAX(version) FROM run_configs WHERE run_id = ?", (run_id,)).fetchone()
        version = (row[0] or 0) + 1
        self.db.execute("INSERT INTO run_configs(run_id, version, at, source, yaml, sha256) VALUES (?, ?, ?, ?, ?, ?)",
                        (run_id, version, self.clock(), source, yaml_text,
                         hashlib.sha256(yaml_text.encode("utf-8")).hexdigest()))
        return version

    def latest_config(self, run_id: str) -> Optional[Tuple[int, str, str, str]]:
        """``(version, source, yaml, sha256)`` of the run's newest recorded config, or None (a run submitted
        before the ledger kept configs)."""
        row = self.db.execute("SELECT version, source, yaml, sha256 FROM run_configs WHERE run_id = ? "
                              "ORDER BY version DESC LIMIT 1", (run_id,)).fetchone()
        return tuple(row) if row else None  # type: ignore[return-value]

    def submissions(self, run_id: str) -> List[Submission]:
        return [Submission(*row) for row in self.db.execute(
            "SELECT id, run_id, executor, config_path, reason, intent_at, job_id, submitted_at, error "
            "FROM submissions WHERE run_id = ? ORDER BY id", (run_id,))]

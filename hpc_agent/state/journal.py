"""The effect journal and the watcher lease, both in the ledger (SQLite).

A decision, its effects, its audit record and the run's new phase are written in ONE transaction,
before anything is carried out (:meth:`Journal.commit`). Each effect is then carried out idempotently
and marked done; whatever is still pending after a crash is carried out at start-up or on the next
tick. ``events.jsonl`` is written from the ``audit`` table: every line carries its ``seq``, and lines
already in the file are not appended again, so a crash between the append and the mark costs nothing.

The lease makes one watcher per runs root: a row with a heartbeat, taken over only when it expired
(or, on the same host, when its holder process is gone: a ``kill -9`` must not lock the root for a TTL).
"""
from __future__ import annotations

import json
import os
import socket
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from hpc_agent.core.filemodes import open_created
from hpc_agent.core.fsutil import pid_alive
from hpc_agent.core.redact import redact_record
from hpc_agent.core.rundir import EVENTS, events_path, read_json_lines
from hpc_agent.state.ledger import Ledger

EVENTS_TAIL_BYTES = 256 * 1024  # enough to hold the last lines we may have appended before a crash


class LeaseLost(RuntimeError):
    """Another watcher holds the runs root now: stop acting."""


@dataclass(frozen=True)
class EffectRow:
    id: int
    run_id: str
    kind: str
    job_id: str
    args: Dict[str, Any]
    after_submission: int
    created_at: float
    tries: int


class Journal:
    def __init__(self, ledger: Ledger, lease: Optional["WatcherLease"] = None):
        self.ledger, self.db, self.lease = ledger, ledger.db, lease

    def commit(self, run_id: str, expected_phase: str, outcome) -> bool:
        """Write a :class:`hpc_agent.watcher.follow.Outcome` atomically; False (nothing written) when the run's
        phase changed under us or the attempt was already decided (then another writer acted)."""
        ledger, now = self.ledger, self.ledger.clock()
        with ledger.transaction():
            if self.lease is not None:
                self.lease.check()
            if outcome.decision is not None:
                d = outcome.decision
                if not ledger.record_decision(run_id, d["job_id"], d["attempt"], d["cause"], d["action"], d["reason"],
                                              d["patch"], d["evidence"], d["ckpt_step"], d["decision"]):
                    raise _Abort()
            expedite = next((e.job_id for e in outcome.effects if e.kind == "expedite"), None)
            if outcome.expedite_attempt is not None and expedite and not ledger.mark_expedited(
                    expedite, outcome.expedite_attempt):
                raise _Abort()  # this attempt's expedite is already journaled
            if outcome.phase.value != expected_phase and not ledger.replace_phase(run_id, expected_phase,
                                                                                  outcome.phase.value):
                raise _Abort()
            latest = ledger.latest_submission(run_id)
            for effect in outcome.effects:
                self.db.execute("INSERT INTO effects(run_id, kind, job_id, args, after_submission, created_at) "
                                "VALUES (?, ?, ?, ?, ?, ?)", (run_id, effect.kind, effect.job_id,
                                                              json.dumps(effect.args, sort_keys=True, default=str),
                                                              latest.id if latest else 0, now))
            for record in outcome.audit:
                self.add_audit(run_id, record)
            hang = getattr(outcome, "suspect", None)
            if hang is not None:
                ledger.store_suspicion(hang.job_id, hang.attempt, hang.asked_at, hang.stack_marks, hang.verdict,
                                       hang.active)
        return True

    def add_audit(self, run_id: str, record: Dict[str, Any]) -> None:
        """One audit record, its strings redacted (``hpc_agent.core.redact``): the trail is copied to the run's
        events.jsonl and shown by review, and a config diff or a reason may carry a secret."""
        self.db.execute("INSERT INTO audit(run_id, at, record) VALUES (?, ?, ?)",
                        (run_id, self.ledger.clock(), json.dumps(redact_record(record), sort_keys=True, default=str)))

    # --- effects --------------------------------------------------------------------------------------
    def pending(self, run_id: Optional[str] = None) -> List[EffectRow]:
        sql = ("SELECT id, run_id, kind, job_id, args, after_submission, created_at, tries FROM effects "
               "WHERE status = 'pending'" + (" AND run_id = ?" if run_id else "") + " ORDER BY id")
        return [EffectRow(*row[:4], json.loads(row[4]), *row[5:])
                for row in self.db.execute(sql, (run_id,) if run_id else ())]

    def pending_runs(self) -> set:
        return {row[0] for row in self.db.execute("SELECT DISTINCT run_id FROM effects WHERE status = 'pending'")}

    def mark_done(self, effect_id: int, result: str = "done") -> None:
        self.db.execute("UPDATE effects SET status = 'done', done_at = ?, result = ? WHERE id = ? AND status = 'pending'",
                        (self.ledger.clock(), result, effect_id))

    def mark_try(self, effect_id: int, error: str) -> None:
        self.db.execute("UPDATE effects SET tries = tries + 1, result = ? WHERE id = ?", (error, effect_id))

    def drop_pending(self, run_id: str, why: str) -> None:
        self.db.execute("UPDATE effects SET status = 'dropped', done_at = ?, result = ? WHERE run_id = ? AND "
                        "status = 'pending'", (self.ledger.clock(), why, run_id))

    def effects(self, run_id: str) -> List[Tuple[str, str, str]]:
        """(kind, job_id, status) of every journaled effect of a run, oldest first (tests, review)."""
        return list(self.db.execute("SELECT kind, job_id, status FROM effects WHERE run_id = ? ORDER BY id", (run_id,)))

    # --- the audit trail --------------------------------------------------------------------------------
    def audit_records(self, run_id: str) -> List[Tuple[int, float, Dict[str, Any]]]:
        return [(seq, at, json.loads(text)) for seq, at, text in self.db.execute(
            "SELECT seq, at, record FROM audit WHERE run_id = ? ORDER BY seq", (run_id,))]

    def unwritten_runs(self) -> set:
        return {row[0] for row in self.db.execute("SELECT DISTINCT run_id FROM audit WHERE written = 0")}

    def flush_events(self, run_id: str, run_dir: Path, time_of, crash=lambda name: None,
                     say=lambda text: None) -> int:
        """Append the run's unwritten audit records to its events.jsonl, each exactly once; returns how many.
        Lines of the file that are not the watcher's JSON (the job can write it) are said through ``say``."""
        rows = [(seq, at, json.loads(text)) for seq, at, text in self.db.execute(
            "SELECT seq, at, record FROM audit WHERE run_id = ? AND written = 0 ORDER BY seq", (run_id,))]
        if not rows:
            return 0
        unwritten = [seq for seq, _, _ in rows]
        present, problems = _seqs_in(run_dir)
        if problems:
            say(f"{EVENTS}: {len(problems)} line(s) skipped, not the watcher's JSON (first: {problems[0][:200]})")
        lines = [_line(run_id, seq, at, rec, time_of) for seq, at, rec in rows if seq not in present]
        crash("before_audit")
        if lines:
            _append(events_path(run_dir), "".join(lines))
        self.db.execute(f"UPDATE audit SET written = 1 WHERE run_id = ? AND seq IN ({','.join('?' * len(unwritten))})",
                        (run_id, *unwritten))
        return len(lines)

    def rebuild_events(self, run_id: str, run_dir: Path, time_of) -> int:
        """Rewrite events.jsonl from the journal alone (atomically); returns the number of lines."""
        from hpc_agent.core.fsutil import atomic_write_text

        rows = self.audit_records(run_id)
        atomic_write_text(events_path(run_dir), "".join(_line(run_id, seq, at, rec, time_of) for seq, at, rec in rows))
        self.db.execute("UPDATE audit SET written = 1 WHERE run_id = ?", (run_id,))
        return len(rows)


class _Abort(Exception):
    pass


def commit_or_skip(journal: Journal, run_id: str, expected_phase: str, outcome) -> bool:
    try:
        return journal.commit(run_id, expected_phase, outcome)
    except _Abort:
        return False


def _line(run_id: str, seq: int, at: float, record: Dict[str, Any], time_of) -> str:
    return json.dumps({"time": time_of(at), "run_id": run_id, "seq": seq, **record}, sort_keys=True, default=str) + "\n"


def _seqs_in(run_dir: Path) -> Tuple[set, List[str]]:
    """The seq numbers in the last lines of events.jsonl (only our own recent appends can be missing a mark).
    The job can write the file: read with the run directory's total JSON-lines reader (a 100000-deep line,
    a link, a FIFO: no seq from it, never an exception)."""
    values, problems = read_json_lines(events_path(run_dir), EVENTS_TAIL_BYTES, within=Path(run_dir),
                                       complete_only=True)
    return {v["seq"] for v in values
            if isinstance(v, dict) and isinstance(v.get("seq"), int) and not isinstance(v.get("seq"), bool)}, problems


def _append(path: Path, text: str) -> None:
    """One write() on a regular file opened O_APPEND without following links (lines never interleave),
    created with the run directory's mode (0600, or 0640 where it is group-shared: hpc_agent.core.filemodes)."""
    fd = open_created(path, os.O_WRONLY | os.O_APPEND | getattr(os, "O_NONBLOCK", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file; not appending to it")
        os.write(fd, text.encode())
    finally:
        os.close(fd)


class WatcherLease:
    """The one-watcher-per-root lease: ``acquire`` once, ``renew`` every tick, ``check`` before acting."""

    def __init__(self, ledger: Ledger, ttl_s: float = 60.0, holder: Optional[str] = None):
        self.ledger, self.ttl_s = ledger, ttl_s
        self.host, self.pid = socket.gethostname(), os.getpid()
        self.holder = holder or f"{self.host}:{self.pid}:{os.urandom(4).hex()}"

    def current(self) -> Optional[Dict[str, Any]]:
        row = self.ledger.db.execute("SELECT holder, host, pid, heartbeat, ttl FROM watcher_lease WHERE one = 1").fetchone()
        return dict(zip(("holder", "host", "pid", "heartbeat", "ttl"), row)) if row else None

    def _free(self, cur: Optional[Dict[str, Any]], now: float) -> bool:
        if cur is None or cur["holder"] == self.holder or now > cur["heartbeat"] + cur["ttl"]:
            return True
        return cur["host"] == self.host and not pid_alive(int(cur["pid"]))

    def acquire(self) -> Optional[Dict[str, Any]]:
        """None when the lease is now ours; else the current holder's row (it is live)."""
        now = self.ledger.clock()
        with self.ledger.transaction():
            cur = self.current()
            if not self._free(cur, now):
                return cur
            self.ledger.db.execute("INSERT OR REPLACE INTO watcher_lease(one, holder, host, pid, heartbeat, ttl) "
                                   "VALUES (1, ?, ?, ?, ?, ?)", (self.holder, self.host, self.pid, now, self.ttl_s))
        return None

    def renew(self) -> None:
        cur = self.ledger.db.execute("UPDATE watcher_lease SET heartbeat = ? WHERE one = 1 AND holder = ?",
                                     (self.ledger.clock(), self.holder))
        if cur.rowcount != 1:
            raise LeaseLost(self._lost_message())

    def check(self) -> None:
        cur = self.current()
        if cur is None or cur["holder"] != self.holder:
            raise LeaseLost(self._lost_message())

    def release(self) -> None:
        self.ledger.db.execute("DELETE FROM watcher_lease WHERE one = 1 AND holder = ?", (self.holder,))

    def _lost_message(self) -> str:
        cur = self.current()
        who = f"{cur['host']} pid {cur['pid']}" if cur else "nobody"
        return f"this watcher's lease on the runs root expired and was taken over (now held by {who}); stopping"

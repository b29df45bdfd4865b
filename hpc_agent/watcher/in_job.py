"""The job's own repairs, as the watcher records them: ``journal/in_job.jsonl`` -> ledger audit -> events.jsonl.

The line format, and the reader that checks every field, are :mod:`hpc_agent.core.in_job_journal`; the job also writes each
repair's patch into the run's ``config.yaml`` (``launch.recovery.carry_into_config``), the file a requeued attempt
loads. The watcher takes the patch into its own copy of the config in the ledger (the one it resubmits from),
allow-listed keys only (:mod:`hpc_agent.state.run_config`); a refused key is audited (``refused_in_job_patch``).

Each valid line becomes one audit record in the ledger (so ``events.jsonl``, ``review`` and ``diagnose``
see it) shaped like the watcher's own decision records, plus ``decided_in: "job"``, ``in_job_seq`` and
``step``. Exactly once: the insert and the check of the highest ``in_job_seq`` already recorded for the
run happen in one ledger transaction. They are not rows of the ``decisions`` table: that table holds one
decision per *ended* attempt (``UNIQUE(job_id, attempt)``), which the watcher's follow-up relies on.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from hpc_agent.core import rundir
from hpc_agent.core.in_job_journal import ADAPT_ACTION, InJobDecision, read


def audit_record(d: InJobDecision) -> Dict[str, Any]:
    """The ledger audit record of one in-job decision: the watcher's decision shape, decided in the job."""
    decision = {"action": d.action, "cause": d.cause, "reason": d.reason, "patch": dict(d.patch), "expedite": False,
                "rollback_to_step": d.rollback_to_step, "rollback_before_step": None,
                "needs_universal_checkpoint": "train.zero_stage" in d.patch, "free": False}
    diff = {k: ({"from": d.before[k], "to": v} if k in d.before else {"to": v}) for k, v in d.patch.items()}
    return {"job_id": d.job_id, "attempt": d.attempt + 1, "cause": d.cause, "action": d.action, "reason": d.reason,
            "evidence": list(d.evidence), "decision": decision, "config_diff": diff, "decided_in": "job",
            "in_job_seq": d.seq, "step": d.step, "budget_left": d.budget_left, "decided_at": d.at}


def recorded_seq(journal: Any, run_id: str) -> int:
    """The highest ``in_job_seq`` already in the run's audit trail (0: none)."""
    return max((int(rec["in_job_seq"]) for _, _, rec in journal.audit_records(run_id)
                if rec.get("decided_in") == "job" and isinstance(rec.get("in_job_seq"), int)), default=0)


def record_new(journal: Any, run_id: str, decisions: List[InJobDecision]) -> List[InJobDecision]:
    """Audit the decisions not recorded yet, and take each one's patch into the watcher's own copy of the
    config (allow-listed keys only: hpc_agent/state/run_config.py), in one transaction; returns them."""
    from hpc_agent.state import run_config

    with journal.ledger.transaction():
        if journal.lease is not None:
            journal.lease.check()  # another watcher took the root over: it records them
        done = recorded_seq(journal, run_id)
        new = sorted((d for d in decisions if d.seq > done), key=lambda d: d.seq)
        run = journal.ledger.run(run_id)
        for d in new:
            journal.add_audit(run_id, audit_record(d))
            if not d.patch or run is None:
                continue
            taken = run_config.apply_in_job(
                journal.ledger, run_id, run.run_dir, d.patch, f"in-job repair {d.seq} of job {d.job_id}")
            if taken["refused"] or taken["problem"]:
                journal.add_audit(run_id, {
                    "action": "refused_in_job_patch", "job_id": d.job_id, "in_job_seq": d.seq,
                    "refused_keys": taken["refused"], "problem": taken["problem"],
                    "reason": "the job may change only " + ", ".join(sorted(run_config.IN_JOB_KEYS))})
    return new


LOCAL_JOB = "local"
"""The job id a job run without Slurm writes (``launch.recovery.own_job_id``)."""


def own_job_ids(submissions: List[Any]) -> Tuple[str, ...]:
    """The job ids that are this run's, from the ledger's submissions for it (written only by the watcher's
    user): each submitted job id, and ``local`` where the run was submitted to the local executor. Pure."""
    ids = {s.job_id for s in submissions if getattr(s, "job_id", None)}
    if any(getattr(s, "executor", "") == "local" for s in submissions):
        ids.add(LOCAL_JOB)
    return tuple(sorted(ids))


def split_own(decisions: List[InJobDecision], own: Tuple[str, ...]) -> Tuple[List[InJobDecision], List[InJobDecision]]:
    """(this run's decisions, the others): a line naming a job the run never submitted (another run's job id,
    copied or forged into this journal) is not this run's repair. Pure."""
    mine = [d for d in decisions if d.job_id in own]
    return mine, [d for d in decisions if d.job_id not in own]


class InJobIngest:
    """The watcher's hook: each tick, for each followed run, record its new in-job decisions. One lstat per
    run per tick; the file is read only when its size or mtime changed. Never raises."""

    def __init__(self, ledger: Any, journal: Any, say: Callable[[str, str], None]):
        self.ledger, self.journal, self.say = ledger, journal, say
        self._dirs: Dict[str, Optional[Tuple[str, str]]] = {}  # run id -> (run dir, its journal's path)
        self._seen: Dict[str, Tuple[int, int]] = {}
        self._said: set = set()

    def tick(self, run_id: str) -> List[InJobDecision]:
        try:
            return self._tick(run_id)
        except Exception as exc:  # noqa: BLE001 - the job's file must never stop the watcher
            self._once(run_id, f"in-job journal not read: {type(exc).__name__}: {exc}")
            return []

    def _tick(self, run_id: str) -> List[InJobDecision]:
        if run_id not in self._dirs:
            run = self.ledger.run(run_id)
            self._dirs[run_id] = (run.run_dir, str(rundir.in_job_journal_path(Path(run.run_dir)))) if run else None
        known = self._dirs[run_id]
        if known is None:
            return []
        run_dir, journal_path = known
        try:
            info = os.lstat(journal_path)
        except FileNotFoundError:
            return []
        own = own_job_ids(self.ledger.submissions(run_id))
        key = (info.st_size, info.st_mtime_ns, own)  # a new submission's job makes foreign lines its own
        if self._seen.get(run_id) == key:
            return []
        if not stat.S_ISREG(info.st_mode):
            self._seen[run_id] = key
            self._once(run_id, f"{rundir.in_job_journal_path(Path(run_dir))} is not a regular file: not read")
            return []
        decisions, problems = read(Path(run_dir))  # journal/ that is a link: refused (no link followed below the run dir)
        for problem in problems:
            self._once(run_id, f"in-job journal: skipped {problem}")
        decisions, foreign = split_own(decisions, own)
        if foreign:
            self._once(run_id, f"in-job journal: {len(foreign)} line(s) naming job(s) this run never submitted "
                               f"({', '.join(sorted({d.job_id for d in foreign})[:5])}) ignored: not this run's")
        new = record_new(self.journal, run_id, decisions)
        self._seen[run_id] = key
        for d in new:
            if d.action == ADAPT_ACTION:
                self.say(run_id, f"job {d.job_id} attempt {d.attempt + 1} adapted its LR schedule at step {d.step}: "
                                 f"{d.reason or d.action}")
                continue
            self.say(run_id, f"job {d.job_id} attempt {d.attempt + 1} repaired in the job at step {d.step}: "
                             f"{d.cause} -> {d.reason or d.action} ({d.budget_left} in-job repair(s) left)")
        return new

    def _once(self, run_id: str, text: str) -> None:
        if (run_id, text) not in self._said:
            self._said.add((run_id, text))
            self.say(run_id, text)

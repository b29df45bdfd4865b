"""The job's own repairs, as the watcher records them: ``journal/in_job.jsonl`` -> ledger audit -> events.jsonl.

The training job repairs a GPU OOM or a divergence inside its allocation (``launch/recovery.py``) and
appends one JSON line per decision to :func:`hpc_agent.rundir.in_job_journal_path`::

    {"seq": 1, "job_id": "123", "attempt": 0, "step": 7, "cause": "gpu_oom", "action": "in_job_repair",
     "patch": {"train.micro_batch_size": 2, "train.grad_accum_steps": 2}, "from": {...}, "rollback_to_step": 5,
     "evidence": ["..."], "reason": "...", "at": 1764600000.0, "budget_left": 1}

An adaptation of the LR schedule (``adaptive:``; ``launch/adaptive_loop.py``) is a line with ``"action":
"adaptive_schedule"``, ``"cause": "adaptive"``, an empty patch, no rollback, and evidence of ``[step, value]``
pairs (each a JSON text); an escalation to a rollback is then followed by the repair's own line.

``seq`` counts the run's lines (1, 2, ...), across attempts. ``attempt`` is the job's 0-based attempt
number (``launch.tblog.attempt_number``). The file is written by the job, so here it is untrusted:
read bounded, regular files only, every field checked; a malformed line is skipped and said once.

The job also writes each repair's patch into the run's ``config.yaml`` (:func:`carry_into_config`), the file
every later attempt of the run loads: a requeue, the successor a preempted job submits of itself, and the
watcher's resubmission (which patches that file). Without it the next job started from the submitted settings
again, ran out of memory again or diverged again at the old learning rate (P2 run 13: the successor of a
preempted job trained at ``micro_batch_size`` 8 again after the job's repair to 4; the watcher's resubmission
after a host OOM at ``lr`` 1e-3 again after the job's cut to 5e-4).

Each valid line becomes one audit record in the ledger (so ``events.jsonl``, ``review`` and ``diagnose``
see it) shaped like the watcher's own decision records, plus ``decided_in: "job"``, ``in_job_seq`` and
``step``. Exactly once: the insert and the check of the highest ``in_job_seq`` already recorded for the
run happen in one ledger transaction. They are not rows of the ``decisions`` table: that table holds one
decision per *ended* attempt (``UNIQUE(job_id, attempt)``), which the watcher's follow-up relies on.
"""
from __future__ import annotations

import json
import math
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from hpc_agent import rundir

ACTION = "in_job_repair"
ADAPT_ACTION = "adaptive_schedule"
"""An adaptation of the LR schedule (``adaptive:``, ``hpc_agent.adaptive``): cause ``adaptive``, no patch, no
budget spent; the evidence is the ``[step, value]`` window it rests on, one JSON pair per line."""
ADAPT_CAUSE = "adaptive"
CAUSES = ("gpu_oom", "diverged", ADAPT_CAUSE)
ACTIONS = {ACTION: ("gpu_oom", "diverged"), ADAPT_ACTION: (ADAPT_CAUSE,)}
"""Each action with the causes it may have (a repair is never ``adaptive``, an adaptation nothing else)."""
MAX_BYTES = 1 << 20        # a line is ~1 KiB and a run makes a few; anything bigger is not ours
MAX_LINE_BYTES = 16 << 10
MAX_EVIDENCE = 20
MAX_TEXT = 2000
_JOB_ID = re.compile(r"^[0-9A-Za-z_.+-]{1,64}$")
_KEY = re.compile(r"^train\.[a-z_]{1,64}$")
_BIG = 10 ** 12


@dataclass(frozen=True)
class InJobDecision:
    seq: int
    job_id: str
    attempt: int
    step: int
    cause: str
    action: str
    patch: Dict[str, Any]
    rollback_to_step: Optional[int]
    evidence: Tuple[str, ...]
    at: float
    budget_left: int
    reason: str = ""
    before: Dict[str, Any] = field(default_factory=dict)
    """The patched keys' values before the repair (``from`` in the line)."""

    def to_dict(self) -> Dict[str, Any]:
        return {"seq": self.seq, "job_id": self.job_id, "attempt": self.attempt, "step": self.step,
                "cause": self.cause, "action": self.action, "patch": dict(self.patch), "from": dict(self.before),
                "rollback_to_step": self.rollback_to_step, "evidence": list(self.evidence), "reason": self.reason,
                "at": self.at, "budget_left": self.budget_left}


def adaptation_reason(kind: str, why: str) -> str:
    """An adaptation's journal reason, ``<kind>: <why>`` (clipped to MAX_TEXT); :func:`adaptation_kind` reads
    the kind back."""
    return f"{kind}: {why}"[:MAX_TEXT]


def adaptation_kind(reason: str) -> Optional[str]:
    """The kind (``warm_restart``, ``lr_decay``, ...) an adaptation's reason starts with; None when it names
    none of ``hpc_agent.adaptive.KINDS`` (the job wrote the text: nothing else of it is echoed)."""
    from hpc_agent.adaptive import KINDS

    kind = str(reason or "").split(":", 1)[0]
    return kind if kind in KINDS else None


def encode(decision: InJobDecision) -> str:
    """One journal line (checked by :func:`parse_line`, so the job never writes a line the watcher skips)."""
    line = json.dumps(decision.to_dict(), sort_keys=True, allow_nan=False) + "\n"
    parse_line(line)
    return line


def _int(obj: Mapping[str, Any], key: str, low: int = 0, optional: bool = False) -> Optional[int]:
    value = obj.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value < _BIG:
        raise ValueError(f"{key}: {value!r} is not an integer >= {low}")
    return value


def _scalar(key: str, value: Any) -> Any:
    if value is None or isinstance(value, (bool, str)) and len(str(value)) <= 200:
        return value
    if isinstance(value, int) and abs(value) < _BIG or isinstance(value, float) and math.isfinite(value):
        return value
    raise ValueError(f"patch value of {key} is not a plain scalar: {value!r:.80}")


def _patch(value: Any, name: str) -> Dict[str, Any]:
    if not isinstance(value, dict) or len(value) > 16:
        raise ValueError(f"{name}: not an object of at most 16 keys")
    for key in value:
        if not isinstance(key, str) or not _KEY.match(key):
            raise ValueError(f"{name}: key {key!r:.80} is not a train.* setting")
    return {k: _scalar(k, v) for k, v in value.items()}


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise ValueError(f"{name}: not a string of at most {MAX_TEXT} characters")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_line(line: str) -> InJobDecision:
    """One line -> a decision; ValueError naming the first problem (the line is untrusted input)."""
    if len(line.encode("utf-8", errors="replace")) > MAX_LINE_BYTES:
        raise ValueError(f"line longer than {MAX_LINE_BYTES} bytes")
    obj = json.loads(line, parse_constant=_no_constant)
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    job_id = obj.get("job_id")
    if not isinstance(job_id, str) or not _JOB_ID.match(job_id):
        raise ValueError(f"job_id: {job_id!r:.80} is not a job id")
    if obj.get("cause") not in CAUSES:
        raise ValueError(f"cause: {obj.get('cause')!r:.80} is not one of {CAUSES}")
    action = obj.get("action")
    if not isinstance(action, str) or action not in ACTIONS:
        raise ValueError(f"action: {action!r:.80} is not one of {tuple(ACTIONS)}")
    if obj["cause"] not in ACTIONS[action]:
        raise ValueError(f"cause: {obj['cause']!r} is not a cause of action {action!r}")
    if action == ADAPT_ACTION and obj.get("patch"):
        raise ValueError("patch: an adaptive_schedule line changes no setting")
    evidence = obj.get("evidence", [])
    if not isinstance(evidence, list) or len(evidence) > MAX_EVIDENCE:
        raise ValueError(f"evidence: not a list of at most {MAX_EVIDENCE} lines")
    at = obj.get("at")
    if not isinstance(at, (int, float)) or isinstance(at, bool) or not math.isfinite(at) or at < 0:
        raise ValueError(f"at: {at!r:.80} is not a time")
    patch = _patch(obj.get("patch"), "patch")
    before = _patch(obj.get("from", {}), "from")
    return InJobDecision(seq=_int(obj, "seq", 1), job_id=job_id, attempt=_int(obj, "attempt"), step=_int(obj, "step"),
                         cause=obj["cause"], action=action, patch=patch,
                         rollback_to_step=_int(obj, "rollback_to_step", optional=True),
                         evidence=tuple(_text(e, "evidence") for e in evidence), at=float(at),
                         budget_left=_int(obj, "budget_left"), reason=_text(obj.get("reason", ""), "reason"),
                         before={k: v for k, v in before.items() if k in patch})


def parse(text: str) -> Tuple[List[InJobDecision], List[str]]:
    """Every valid line, and one problem per invalid one. A last line without its newline is a write in
    progress: left for the next read, not a problem."""
    decisions: List[InJobDecision] = []
    problems: List[str] = []
    lines = text.split("\n")
    for number, line in enumerate(lines[:-1], 1):  # lines[-1]: "" after the last newline, or a torn line
        if not line.strip():
            continue
        try:
            decisions.append(parse_line(line))
        except (ValueError, TypeError, RecursionError) as exc:
            problems.append(f"line {number}: {exc}")
    return decisions, problems


def read(run_dir: Path) -> Tuple[List[InJobDecision], List[str]]:
    """The run's in-job decisions; ([], []) without a journal. An unsafe file (a link, a FIFO, too big)
    is one problem, and nothing of it is read."""
    path = rundir.in_job_journal_path(run_dir)
    try:
        data = rundir.read_bounded(path, MAX_BYTES)
    except FileNotFoundError:
        return [], []
    except OSError as exc:
        return [], [f"{path}: {exc}"]
    return parse(data.decode("utf-8", errors="replace"))


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
    """Audit the decisions not recorded yet, in one transaction; returns them."""
    with journal.ledger.transaction():
        if journal.lease is not None:
            journal.lease.check()  # another watcher took the root over: it records them
        done = recorded_seq(journal, run_id)
        new = sorted((d for d in decisions if d.seq > done), key=lambda d: d.seq)
        for d in new:
            journal.add_audit(run_id, audit_record(d))
    return new


class InJobIngest:
    """The watcher's hook: each tick, for each followed run, record its new in-job decisions. One lstat per
    run per tick; the file is read only when its size or mtime changed. Never raises."""

    def __init__(self, ledger: Any, journal: Any, say: Callable[[str, str], None]):
        self.ledger, self.journal, self.say = ledger, journal, say
        self._dirs: Dict[str, Optional[str]] = {}
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
            self._dirs[run_id] = run.run_dir if run else None
        run_dir = self._dirs[run_id]
        if run_dir is None:
            return []
        try:
            info = os.lstat(rundir.in_job_journal_path(Path(run_dir)))
        except FileNotFoundError:
            return []
        key = (info.st_size, info.st_mtime_ns)
        if self._seen.get(run_id) == key:
            return []
        if not stat.S_ISREG(info.st_mode):
            self._seen[run_id] = key
            self._once(run_id, f"{rundir.in_job_journal_path(Path(run_dir))} is not a regular file: not read")
            return []
        decisions, problems = read(Path(run_dir))
        for problem in problems:
            self._once(run_id, f"in-job journal: skipped {problem}")
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


def carry_into_config(run_dir: Path, patch: Mapping[str, Any]) -> str:
    """Apply ``patch`` to the run's ``config.yaml`` (validated again, written atomically), so every later attempt
    starts with it; returns what was done, for the job's log. A run directory without one (a job started by hand
    on a config elsewhere) keeps the patch in the journal only: its own config file is not the job's to change.
    Raises OSError or ConfigError; the caller says so and trains on."""
    from hpc_agent.policy import apply_patch

    path = rundir.config_path(run_dir)
    if not patch:
        return "nothing to carry"
    if not os.path.lexists(path):
        return f"not carried into {path.name}: the run directory has none (the journal keeps it)"
    rundir.write_config(run_dir, apply_patch(rundir.load_config(run_dir), patch))  # load_config refuses a link
    return f"carried into {path.name} for later attempts"

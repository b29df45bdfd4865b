"""The in-job journal's format: ``journal/in_job.jsonl``, one JSON line per repair or adaptation the job made.

The training job repairs a GPU OOM or a divergence inside its allocation (``launch/recovery.py``) and
appends one JSON line per decision to :func:`hpc_agent.core.rundir.in_job_journal_path`::

    {"seq": 1, "job_id": "123", "attempt": 0, "step": 7, "cause": "gpu_oom", "action": "in_job_repair",
     "patch": {"train.micro_batch_size": 2, "train.grad_accum_steps": 2}, "from": {...}, "rollback_to_step": 5,
     "evidence": ["..."], "reason": "...", "at": 1764600000.0, "budget_left": 1}

An adaptation of the LR schedule (``adaptive:``; ``launch/adaptive_loop.py``) is a line with ``"action":
"adaptive_schedule"``, ``"cause": "adaptive"``, an empty patch, no rollback, and evidence of ``[step, value]``
pairs (each a JSON text); an escalation to a rollback is then followed by the repair's own line.

``seq`` counts the run's lines (1, 2, ...), across attempts. ``attempt`` is the job's 0-based attempt
number (``launch.tblog.attempt_number``). The file is written by the job, so the watcher reads it as
untrusted input: bounded, regular files only, every field checked; a malformed line is skipped and said once.
The job writes with :func:`encode` and reads its own earlier lines back with :func:`read` (a requeued
attempt starts with its earlier repairs); the watcher turns each line into an audit record
(``hpc_agent/watcher/in_job.py``).
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from hpc_agent.core import json_safe, rundir

ACTION = "in_job_repair"
ADAPT_ACTION = "adaptive_schedule"
"""An adaptation of the LR schedule (``adaptive:``, ``hpc_agent.policy.adaptive_lr``): cause ``adaptive``, no patch, no
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


LIMITS = json_safe.Limits(max_depth=6, max_line_bytes=MAX_LINE_BYTES, max_total_bytes=MAX_BYTES, constants=False)
"""A line is an object holding flat objects and a list of strings: deeper is not ours."""


def parse_line(line: str) -> InJobDecision:
    """One line -> a decision; ValueError naming the first problem (the line is untrusted input)."""
    if len(line.encode("utf-8", errors="replace")) > MAX_LINE_BYTES:
        raise ValueError(f"line longer than {MAX_LINE_BYTES} bytes")
    obj, problem = json_safe.loads(line, LIMITS)
    if problem:
        raise ValueError(problem)
    return decision_of(obj)


def decision_of(obj: Any) -> InJobDecision:
    """A parsed line -> a decision; ValueError naming the first problem (every field is checked)."""
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
    progress: left for the next read, not a problem. Never raises."""
    decisions: List[InJobDecision] = []
    values, problems = json_safe.parse_lines(text, LIMITS, complete_only=True)
    for number, obj in values:
        try:
            decisions.append(decision_of(obj))
        except (ValueError, TypeError, RecursionError) as exc:
            problems.append(f"line {number}: {exc}")
    return decisions, problems


def read(run_dir: Path) -> Tuple[List[InJobDecision], List[str]]:
    """The run's in-job decisions; ([], []) without a journal. An unsafe file (a link, a FIFO, too big, a
    ``journal/`` that is a link: no link is followed below the run dir) is one problem, and nothing of it is read."""
    path = rundir.in_job_journal_path(run_dir)
    try:
        data = rundir.read_bounded(path, MAX_BYTES, within=Path(run_dir))
    except FileNotFoundError:
        return [], []
    except OSError as exc:
        return [], [f"{path}: {exc.strerror or exc}"]
    return parse(data.decode("utf-8", errors="replace"))

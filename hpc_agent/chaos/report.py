"""The chaos report: one row per fault, ETTR, and the nothing-lost checks. Pure.

Steps lost for a fault = the last step the ended attempt logged - the step the next attempt resumed
from. P3 (steps lost per *signalled* preemption) is that number over the ``preempt`` faults only.
ETTR = productive training time (the step times of the kept steps that ended by then) / wall time from
submission to the end (completion, or the time the run was given when it did not complete), so a run that
never comes back is charged for the rest; :func:`hpc_agent.runs.goodput.time_lost` says where the rest of the
wall time went. Both come from the one home for time accounting, :mod:`hpc_agent.runs.goodput`.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from hpc_agent.chaos.schedule import PREEMPT


@dataclass
class FaultRecord:
    kind: str
    target: str
    planned_at_s: float
    injected_at_s: Optional[float] = None
    """Seconds after the first training step the driver saw; None if never injected."""
    detected_cause: Optional[str] = None
    decision: Optional[str] = None
    recovery_s: Optional[float] = None
    """Seconds from the injection to the first step trained after it (a new attempt, or past an in-job repair)."""
    ended_after_s: Optional[float] = None
    """Seconds from the injection to the end of the attempt it ended (sacct's End, whole seconds, taken as the
    middle of its second): ``recovery_s`` minus this is the time from that end to the first resumed step. None
    for a fault repaired inside the job. A host OOM's share before the end is the fault developing (the
    allocation growing to the limit), not the recovery."""
    steps_lost: Optional[int] = None
    resumed_from: Optional[int] = None
    last_step_before: Optional[int] = None
    recovered: bool = False
    note: str = ""

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class TargetSummary:
    name: str
    completed: bool
    max_steps: int
    ettr: Optional[float]
    productive_s: float
    wall_s: float
    checks: List[Check] = field(default_factory=list)
    time_lost: Optional[Dict[str, Any]] = None
    """:func:`hpc_agent.runs.goodput.time_lost` of the kept step series (None without a start time)."""


def ended_after(ends: Sequence[float], injected_at: float, until: float) -> Optional[float]:
    """Seconds from ``injected_at`` to the first attempt end in ``ends`` (sacct's End as epoch seconds; the
    attempt ended within that second) that lies between the injection and ``until``; None if none does."""
    hit = [e for e in ends if e + 1.0 > injected_at and e <= until]
    return round(max(0.0, min(hit) + 0.5 - injected_at), 1) if hit else None


def continuity_check(steps: Sequence[int], max_steps: int) -> Check:
    """TensorBoard's winning loss series must hold 1..max_steps, each exactly once."""
    seen = list(steps)
    dupes = len(seen) - len(set(seen))
    missing = sorted(set(range(1, max_steps + 1)) - set(seen))
    extra = sorted(set(seen) - set(range(1, max_steps + 1)))
    ok = not dupes and not missing and not extra
    detail = f"steps {min(seen) if seen else '-'}..{max(seen) if seen else '-'}, {len(seen)} points"
    if missing:
        detail += f"; {len(missing)} missing (first {missing[:5]})"
    if dupes:
        detail += f"; {dupes} duplicated"
    if extra:
        detail += f"; unexpected {extra[:5]}"
    return Check("continuous step series", ok, detail)


def final_checkpoint_check(chosen_step: Optional[int], chosen_problem: Optional[str], max_steps: int) -> Check:
    """The checkpoint a resume would choose must be the final one, complete (marker + every file)."""
    if chosen_step is None:
        return Check("final checkpoint complete", False, chosen_problem or "no complete checkpoint")
    ok = chosen_step == max_steps
    return Check("final checkpoint complete", ok, f"newest complete checkpoint is step {chosen_step} of {max_steps}")


def fault_checks(records: Sequence[FaultRecord]) -> List[Check]:
    out = []
    missed = [r for r in records if r.injected_at_s is None]
    out.append(Check("every fault injected", not missed,
                     f"{len(records) - len(missed)}/{len(records)} injected" +
                     (f"; not: {', '.join(r.kind for r in missed)}" if missed else "")))
    unrecovered = [r for r in records if r.injected_at_s is not None and not r.recovered]
    out.append(Check("every fault recovered", not unrecovered,
                     "all recovered" if not unrecovered else
                     "; ".join(f"{r.kind} on {r.target}: {r.note or 'no recovery'}" for r in unrecovered)))
    lost = [r.steps_lost for r in records if r.kind == PREEMPT and r.recovered]
    out.append(Check("zero steps lost on signalled preemptions", all(v == 0 for v in lost),
                     f"steps lost per preemption: {lost}" if lost else "no preemption in the schedule"))
    return out


def p3(records: Sequence[FaultRecord]) -> Dict[str, Any]:
    lost = [r.steps_lost for r in records if r.kind == PREEMPT and r.steps_lost is not None]
    return {"preemptions": len(lost), "steps_lost": lost, "mean": round(statistics.mean(lost), 3) if lost else None,
            "max": max(lost) if lost else None}


def _fmt(value: Any, spec: str = "") -> str:
    return "-" if value is None else format(value, spec)


def render(records: Sequence[FaultRecord], targets: Sequence[TargetSummary]) -> str:
    """The report as plain text (it goes to a terminal and to CI logs)."""
    head = f"{'#':>2} {'target':<9} {'fault':<18} {'at_s':>6} {'detected cause':<16} {'decision':<11} " \
           f"{'recovery_s':>10} {'ended_s':>7} {'lost':>5}  note"
    lines = ["chaos report", head, "-" * len(head)]
    for i, r in enumerate(records, 1):
        lines.append(f"{i:>2} {r.target:<9} {r.kind:<18} {_fmt(r.injected_at_s, '.0f'):>6} "
                     f"{_fmt(r.detected_cause):<16} {_fmt(r.decision):<11} {_fmt(r.recovery_s, '.1f'):>10} "
                     f"{_fmt(r.ended_after_s, '.1f'):>7} {_fmt(r.steps_lost):>5}  {r.note}")
    for t in targets:
        lines.append(f"{t.name}: {'completed' if t.completed else 'NOT completed'} {t.max_steps} steps; "
                     f"ETTR {_fmt(t.ettr, '.3f')} (productive {t.productive_s:.0f} s / wall {t.wall_s:.0f} s)")
        for c in t.checks:
            lines.append(f"  [{'ok' if c.ok else 'FAIL'}] {c.name}: {c.detail}")
    return "\n".join(lines)


def passed(targets: Sequence[TargetSummary]) -> bool:
    return all(c.ok for t in targets for c in t.checks)

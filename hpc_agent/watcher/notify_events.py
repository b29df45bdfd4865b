"""Which notifications an audit record calls for, and what they say. Pure: no I/O, no clock.

The audit trail is the truth of what the watcher decided (``hpc_agent/state/journal.py``), so notifications are
derived from it, one audit record at a time: ``notifications_for(seq, run_id, record, budget)``. The
adapter (``hpc_agent/watcher/notifier.py``) reads new records, records each notification in the ledger before
sending it, and delivers it. Events:

- ``completed``: the decision record of a finished run (``cause: completed``, ``action: done``);
- ``gave_up``: a decision whose action is ``stop`` (code error, budget spent, the same hang twice, ...);
- ``attention``: a run parked in ``needs_attention`` (by the watcher's trouble following it, or by the policy:
  an unknown cause twice at the same step, with its hypotheses and log lines); a hang suspected (stacks asked); a requeue or
  resubmission that leaves at most one retry in a budget (``budget``); the kill switch set (``paused``,
  runs-root wide: :func:`paused_notification`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

BUDGET_WARN_LEFT = 1  # warn while a budget has this many retries left or fewer: the next failure may be the last
NOTIFY_EVIDENCE_LINES = 3  # log lines in a parked run's notification text (all of them are in its fields)


@dataclass(frozen=True)
class Notification:
    key: str
    """Unique per event (the audit seq, or the pause file's identity): the ledger sends each key once."""
    event: str
    """``completed``, ``gave_up`` or ``attention`` (what ``notify.events`` selects)."""
    run_id: str
    text: str
    """One line for people (the Slack ``text``)."""
    fields: Dict[str, Any] = field(default_factory=dict)
    """Structured: kind, job_id, attempt, cause, reason (what scripts read)."""

    def payload(self) -> Dict[str, Any]:
        """The JSON the command gets on stdin and the webhook gets as its body (Slack reads ``text``; the
        other keys are ignored by Slack and read by scripts)."""
        return {"text": self.text, "event": self.event, "run_id": self.run_id, "key": self.key, **self.fields}


def _strings(value: Any) -> List[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


def _decision(record: Mapping[str, Any]) -> Mapping[str, Any]:
    value = record.get("decision")
    return value if isinstance(value, Mapping) else {}


def notifications_for(seq: int, run_id: str, record: Mapping[str, Any],
                      budget: Optional[Tuple[int, str]] = None) -> List[Notification]:
    """The notifications one audit record calls for (usually none). ``budget``: for a retry decision, the
    tighter budget after it (``policy.decide.retries_left``), which the adapter looks up only when
    :func:`wants_budget` says so."""
    if "by" in record or record.get("decided_in") == "job":
        return []  # an action record (its decision record already spoke), or a repair inside the job's allocation
    job_id, cause = str(record.get("job_id", "")), str(record.get("cause", ""))
    base = {"job_id": job_id, "cause": cause, "attempt": record.get("attempt")}
    decision, action = _decision(record), str(record.get("action", ""))
    key = str(seq)
    if cause == "completed" and action == "done":
        reason = str(record.get("reason", "completed"))
        extra = "" if reason == "completed" else f" ({reason})"
        return [Notification(key, "completed", run_id, f"hpc_agent: run {run_id} completed (job {job_id}){extra}",
                             {**base, "kind": "completed", "reason": reason})]
    if decision.get("action") == "stop":
        reason = str(decision.get("reason", ""))
        return [Notification(key, "gave_up", run_id, f"hpc_agent: gave up on run {run_id} (job {job_id}, {cause}): "
                                                     f"{reason}", {**base, "kind": "gave_up", "reason": reason})]
    if action == "needs_attention":
        reason = str(record.get("reason", ""))
        fields = {**base, "kind": "needs_attention", "reason": reason}
        text = f"hpc_agent: run {run_id} needs attention: {reason}; fix it, then `hpc-agent watch --resume-run {run_id}`"
        hypotheses = _strings(record.get("hypotheses"))
        if hypotheses:  # parked by the policy (an unknown cause twice at the same step): what to look at
            evidence = _strings(record.get("evidence"))
            fields.update(hypotheses=hypotheses, evidence=evidence)
            text += "".join(f"; log: {line}" for line in evidence[:NOTIFY_EVIDENCE_LINES])
        return [Notification(key, "attention", run_id, text, fields)]
    if action == "hang_suspected":
        verdict = record.get("verdict") if isinstance(record.get("verdict"), Mapping) else {}
        reason = str(verdict.get("reason", "no progress"))
        return [Notification(key, "attention", run_id, f"hpc_agent: run {run_id} (job {job_id}) looks hung: {reason}; "
                             "the watcher takes its stacks and then restarts it",
                             {**base, "kind": "hang", "reason": reason, "step": verdict.get("step")})]
    if wants_budget(record) and budget is not None and budget[0] <= BUDGET_WARN_LEFT:
        left, which = budget
        reason = f"{left} {'retry' if left == 1 else 'retries'} left: {which}"
        return [Notification(key, "attention", run_id, f"hpc_agent: run {run_id} {decision.get('action')} after "
                             f"{cause}, {reason}; the next such failure may stop it",
                             {**base, "kind": "budget", "reason": reason, "retries_left": left})]
    return []


def wants_budget(record: Mapping[str, Any]) -> bool:
    """A retry decision that spent budget: the adapter should look the budgets up for it."""
    decision = _decision(record)
    return "by" not in record and record.get("decided_in") != "job" and decision.get("action") in ("requeue", "resubmit") and not decision.get("free")


def paused_notification(identity: str, pause_file: str) -> Notification:
    """The kill switch was set: one notification per pause (``identity``: the pause file's inode and mtime)."""
    return Notification(f"paused:{identity}", "attention", "", f"hpc_agent: the watcher is paused ({pause_file} "
                        "exists): no run is requeued or resubmitted until `hpc-agent watch --resume`",
                        {"kind": "paused", "reason": f"{pause_file} exists"})


def selected(notification: Notification, events: List[str]) -> bool:
    return notification.event in events

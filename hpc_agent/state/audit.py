"""Audit records of actions: who did what to which job, why, and which config change went with it.

Every action the tools take on Slurm writes one record into the ledger's audit trail (``events.jsonl`` is
written from it) through :func:`record_action`, the one place that shapes them::

    {"action": "resubmit", "job_id": "123", "reason": "gpu_oom: halve micro_batch", "result": "submitted as job 124",
     "config_diff": {"train.micro_batch_size": {"from": 8, "to": 4}}, "decided_in": 17,
     "by": {"user": "ana", "host": "login1", "pid": 4242, "process": "watcher"}}

``decided_in`` is the seq of the decision record that asked for the action (the watcher's), and the
decision's ``attempt`` and ``cause`` are copied, so ``review`` merges both into one attempt boundary.
Who acts: the watcher (``hpc_agent.watcher.effects.Carrier`` records every effect it carries out), a sweep driver
(submit, release, cancel) and the submit CLI (submit).
"""
from __future__ import annotations

import getpass
import os
import socket
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

ACTIONS = ("submit", "requeue", "expedite", "resubmit", "exclude", "cancel", "release", "request_stacks", "release_lease",
           "adopt", "refused")  # refused: an action the kill switch stopped (record_refused)
PROCESSES = ("watcher", "sweep", "submit")
NOT_ACTIONS = ("notify", "await_end")  # effects that change nothing outside our own log: no action record


def who(process: str) -> Dict[str, Any]:
    """The acting user, host, pid and tool."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers): the uid still says who
        user = f"uid {os.getuid()}"
    return {"user": user, "host": socket.gethostname(), "pid": os.getpid(), "process": process}


def action_record(action: str, job_id: str, reason: str, by: Mapping[str, Any], *, result: str = "",
                  config_diff: Optional[Mapping[str, Any]] = None, **extra: Any) -> Dict[str, Any]:
    """One action's audit record (pure). An action not in :data:`ACTIONS` is a programming error."""
    if action not in ACTIONS:
        raise ValueError(f"unknown action {action!r}: declare it in hpc_agent.state.audit.ACTIONS")
    if by.get("process") not in PROCESSES:
        raise ValueError(f"unknown process {by.get('process')!r}: one of {PROCESSES}")
    return {**extra, "action": action, "job_id": str(job_id), "reason": reason, "result": result,
            "config_diff": dict(config_diff or {}), "by": dict(by)}


def record_action(journal, run_id: str, action: str, job_id: str, reason: str, *, process: str,
                  **fields: Any) -> Dict[str, Any]:
    """Write one action record to the run's audit trail (inside the caller's transaction, if any)."""
    record = action_record(action, job_id, reason, who(process), **fields)
    journal.add_audit(run_id, record)
    return record


def record_refused(journal, run_id: str, refused: str, job_id: str, pause_file: Any, *, process: str,
                   **fields: Any) -> Dict[str, Any]:
    """The kill switch stopped ``refused`` (an action or effect kind: ``submit``, ``requeue``, ``notify``...)
    before it ran: one ``{"action": "refused", "refused": ..., "pause_file": ...}`` record, so the audit trail
    says what was not done and why."""
    return record_action(journal, run_id, "refused", job_id, f"the kill switch is set ({pause_file}): "
                         f"{refused} not done", process=process, result="refused", refused=refused,
                         pause_file=str(pause_file), **fields)


def patch_diff(patch: Mapping[str, Any]) -> Dict[str, Dict[str, Any]]:
    """A config patch as a diff when the decision's own diff (with the old values) is not at hand."""
    return {key: {"to": value} for key, value in patch.items()}


SAME_COMMIT_S = 2.0  # an effect and its decision are journaled in one transaction, a few microseconds apart


def decision_for(kind: str, job_id: str, created_at: float,
                 records: Sequence[Tuple[int, float, Mapping[str, Any]]]) -> Optional[Tuple[int, Mapping[str, Any]]]:
    """The decision record that asked for an effect: journaled in the effect's own transaction (the same job,
    at the same moment). Among several (an exclude and an expedite decided together), the one naming this
    action, else the one with a config change for an effect that has one, else the first. (seq, record) or None."""
    same: List[Tuple[int, Mapping[str, Any]]] = [
        (seq, rec) for seq, at, rec in records
        if 0 <= at - created_at < SAME_COMMIT_S and str(rec.get("job_id", "")) == job_id and "by" not in rec]
    if not same:
        return None

    def named(rec: Mapping[str, Any]) -> str:
        return str(rec.get("action") or (rec.get("decision") or {}).get("action") or "")

    for seq, rec in same:
        if named(rec) == kind:
            return seq, rec
    if kind in ("exclude", "resubmit"):
        for seq, rec in same:
            if rec.get("config_diff"):
                return seq, rec
    return same[0]


def effect_fields(kind: str, args: Mapping[str, Any], decision: Optional[Tuple[int, Mapping[str, Any]]]
                  ) -> Dict[str, Any]:
    """The why and the config diff of a carried-out effect: from its decision, else from the effect itself."""
    fields: Dict[str, Any] = {"config_diff": patch_diff(args.get("patch") or {}),
                              "reason": str(args.get("reason") or f"{kind} asked by the watcher")}
    if kind == "exclude":
        fields["nodes"] = args.get("nodes")
    if decision is None:
        return fields
    seq, rec = decision
    fields["decided_in"] = seq
    for key in ("attempt", "cause"):
        if key in rec:
            fields[key] = rec[key]
    reason = rec.get("reason") or (rec.get("decision") or {}).get("reason")
    if reason:
        fields["reason"] = str(reason)
    if rec.get("config_diff") and kind in ("exclude", "resubmit"):
        fields["config_diff"] = dict(rec["config_diff"])
    return fields

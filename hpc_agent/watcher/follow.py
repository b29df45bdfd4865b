"""The watcher's pure core: ``follow(run state, observation) -> Outcome`` (new phase, effects, audit).

No I/O, no clock: everything it needs is in its arguments, so every edge is table-tested
(tests/unit/test_follow.py) and a decision can be replayed from the ledger plus the recorded sacct text.
The watcher (``hpc_agent/watcher/loop.py``) observes, calls :func:`follow`, journals the outcome in one
ledger transaction, then carries the effects out. Every phase change goes through
``lifecycle.transition``.

Observing costs: most ticks only need sacct. :func:`wants` says, from the run state and its sacct
attempts alone, whether this run also needs squeue's word and its files (logs, TensorBoard, config,
checkpoints), so a watcher following thousands of running jobs reads no file at all.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, List, Optional, Sequence, Tuple

from hpc_agent.config.load import apply_patch
from hpc_agent.core.causes import Cause
from hpc_agent.diagnosis.classify import Diagnosis, classify_job
from hpc_agent.diagnosis.logscan import gpu_capacity_bytes
from hpc_agent.policy.decide import (ATTENTION, DONE, REQUEUE, RESUBMIT, STOP, Decision, PastAttempt, PolicyLimits,
                                     Situation, decide)
from hpc_agent.slurm.sacct import Attempt
from hpc_agent.state.lifecycle import Action, Event, EventKind, Phase, transition
from hpc_agent.watcher.follow_hang import config_value as _get, open_suspicion, running
from hpc_agent.watcher.follow_model import (NOT_ASKED, Adopt, Cancel, Effect, Exclude, Expedite, Notify, Observation,
                                            Outcome, ReleaseLease, Requeue, Resubmit, RunFiles, RunState, Wants)

RUNNING_STATES = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "SIGNALING", "STAGE_OUT", "RESIZING"})
PENDING_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"})
_ACTIONS = {REQUEUE: Action.REQUEUE, RESUBMIT: Action.RESUBMIT, STOP: Action.STOP, ATTENTION: Action.ATTENTION}
PLACEMENT_CAUSES = (Cause.GPU_OOM, Cause.NODE_FAIL, Cause.GPU_HW_ERROR)
"""Causes whose resubmission may move the run to another partition (``placement.mode`` auto)."""
LOCAL = "local"
LOCAL_EVIDENCE = "local process (no sacct: its process, result files and log): "
LOCAL_IGNORED = frozenset({"slurm.exclude", "slurm.partition", "slurm.mem"})
"""Patch keys the local executor has no use for: it runs on the one machine that submitted it (no node to leave
out, no partition to move to) without a memory limit of its own (``jobs.executor.local_parameters``)."""


# --- the local executor ----------------------------------------------------------------------------------
def local_decision(decision: Decision) -> Tuple[Decision, str]:
    """The policy's decision as the local executor can carry it out, and a note for the audit record ("" when
    unchanged). Pure.

    * requeue: a local process cannot be requeued (no ``scontrol``, no queue): the same job is started again as
      a new process from the newest checkpoint (a resubmission, unchanged config), still counted as a requeue;
    * resubmit: the keys in :data:`LOCAL_IGNORED` are dropped; when nothing else is left (``node_fail`` or a GPU
      hardware error: exclude the node; a host OOM: more ``--mem``; a move to another partition) the repair has
      no local meaning, and running the same thing on the same machine again would fail the same way: the run
      is parked for a person (needs_attention) instead.
    """
    if decision.action == REQUEUE:
        return decision, ("local executor: the requeue is carried out as a resubmission of the same config "
                          "through the local executor, from the newest checkpoint (no scontrol for a local process)")
    if decision.action != RESUBMIT or not set(decision.patch) & LOCAL_IGNORED:
        return decision, ""
    dropped = sorted(set(decision.patch) & LOCAL_IGNORED)
    kept = {k: v for k, v in decision.patch.items() if k not in LOCAL_IGNORED}
    if kept:
        return replace(decision, patch=kept, reason=f"{decision.reason} ({', '.join(dropped)} dropped: no meaning "
                                                    "for the local executor)"), \
            f"local executor: {', '.join(dropped)} dropped from the patch"
    why = (f"{decision.reason}; but the local executor runs on this one machine ({', '.join(dropped)} has no "
           "meaning there), so running it again here would end the same way: needs a person")
    return Decision(ATTENTION, decision.cause, why), f"local executor: {', '.join(dropped)} has no local meaning"


def requeue_effects(state: RunState, reason: str) -> Tuple[Effect, ...]:
    """The effects of a requeue: ``scontrol requeue`` then expedite on Slurm; for a local job a resubmission of
    the same config from the newest checkpoint (its lease freed first: the process is gone)."""
    if state.executor == LOCAL:
        return ReleaseLease(state.job_id), Resubmit(state.job_id, {}, reason)
    return Requeue(state.job_id), Expedite(state.job_id)


# --- the one Situation builder (also used by diagnose) --------------------------------------------------
def situation_from(diagnoses: Sequence[Diagnosis], made_progress: Optional[bool] = None,
                   checkpoint_steps: Sequence[int] = (), placement: Any = None,
                   remaining_steps: Optional[int] = None) -> Situation:
    """The policy's facts about the newest attempt. A pending attempt after a Slurm requeue carries the
    cause of the attempt before it (so the policy can expedite it); the GPU's capacity comes from the
    out-of-memory message when it states it; ``placement``: the partitions' facts, when gathered. Whether the
    attempt ended, its evidence lines and the hypotheses of an unknown cause come from the diagnosis as they are."""
    latest = diagnoses[-1]
    previous = diagnoses[-2].cause.value if len(diagnoses) > 1 and latest.cause == Cause.PENDING else None
    lines = (*latest.evidence, latest.root.line) if latest.root else tuple(latest.evidence)
    return Situation(job_id=latest.job_id, made_progress=made_progress, checkpoint_steps=tuple(checkpoint_steps),
                     nodes=latest.nodes, bad_nodes=latest.bad_nodes, divergence_step=latest.divergence_step,
                     gpu_capacity_bytes=gpu_capacity_bytes(lines), requeued_after=previous,
                     placement=tuple(placement) if placement else None, remaining_steps=remaining_steps,
                     ended=latest.ended, evidence=lines, hypotheses=tuple(latest.hypotheses))


def history_from(rows: Sequence[Any]) -> Tuple[PastAttempt, ...]:
    """The policy's history from the ledger's decision rows (oldest first); progress is whether the
    checkpoint step recorded with a decision moved past the one before it; ``step`` is that checkpoint step
    (the newest complete checkpoint when the attempt was decided: where its retry resumed)."""
    out = []
    for i, row in enumerate(rows):
        before = rows[i - 1].ckpt_step if i else None
        progress = None if row.ckpt_step is None and before is None else (row.ckpt_step or -1) > (before or -1)
        hang = (getattr(row, "decision", None) or {}).get("hang")
        out.append(PastAttempt(row.job_id, row.cause, row.action, row.patch, progress,
                               (hang.get("step"), str(hang.get("signature", ""))) if isinstance(hang, dict) else None,
                               row.ckpt_step))
    return tuple(out)


# --- the core ------------------------------------------------------------------------------------------
def _effective(state: RunState, obs: Observation) -> Tuple[Tuple[Attempt, ...], int]:
    """The attempts, plus a synthetic pending one when squeue already shows the requeued job pending
    before sacct records the new attempt (~4 s measured by scripts/bench/recovery.py)."""
    attempts = obs.attempts
    latest = attempts[-1]
    index = len(attempts) - 1
    if latest.state == "REQUEUED" and (index + 1) not in state.expedited and obs.queue == "PENDING":
        attempts = (*attempts, Attempt(latest.job_id, index + 1, (replace(latest.primary, state="PENDING"),)))
        index += 1
    return attempts, index


def wants(state: RunState, attempts: Sequence[Attempt]) -> Wants:
    """What else to observe for this run, from its sacct attempts alone."""
    if not attempts or state.phase is Phase.RECOVERING:
        return Wants()
    latest, index = attempts[-1], len(attempts) - 1
    if latest.state in RUNNING_STATES:
        asked = open_suspicion(state, index) is not None  # stacks asked: read them, and what a decision needs
        return Wants(files=asked, live=latest.state == "RUNNING", stacks=asked)
    if latest.state == "REQUEUED" and (index + 1) not in state.expedited:
        return Wants(queue=True, files=True)
    if latest.state in PENDING_STATES:
        return Wants(files=index > 0 and index not in state.expedited)
    if index in state.decided:
        # Pending with its attempt decided and ended: resumed after the policy parked it (``_resumed``), which
        # needs the ledger's newest decision; otherwise nothing to read.
        return Wants(files=state.phase is Phase.PENDING)
    return Wants(queue=False, files=True)  # squeue only if the decision would act (Outcome.ask_queue)


def follow(state: RunState, obs: Observation, limits: PolicyLimits = PolicyLimits()) -> Outcome:
    """The next phase and the effects for one run. Raises only on a bug; the watcher parks the run then."""
    if not obs.attempts:
        return Outcome(state.phase)
    if state.phase is Phase.RECOVERING:
        return _recovering(state, obs)
    if obs.successor and obs.attempts[-1].state not in RUNNING_STATES and state.phase in (Phase.RUNNING, Phase.PENDING):
        return _handed_over(state, obs.successor)
    attempts, index = _effective(state, obs)
    latest = attempts[-1]
    if latest.state in RUNNING_STATES:
        if state.phase is not Phase.RUNNING:
            return _to(state, Event(EventKind.STARTED, state.job_id))
        parked = _unfollowable(state, obs.files) if open_suspicion(state, index) is not None else None
        return parked or running(state, attempts, obs, limits)
    if latest.state in PENDING_STATES:
        outcome = Outcome(state.phase)
        if index > 0 and index not in state.expedited:
            outcome = _requeued_by_slurm(state, attempts, obs.files, limits)
        if state.phase is Phase.RUNNING and outcome.phase is not Phase.NEEDS_ATTENTION:
            queued = _to(state, Event(EventKind.QUEUED, state.job_id))
            outcome = replace(outcome, phase=queued.phase)
        return outcome
    if index in state.decided:
        return _resumed(state, index, obs.files) if state.phase is Phase.PENDING else Outcome(state.phase)
    return _ended(state, attempts, obs, limits)


def _handed_over(state: RunState, successor: str) -> Outcome:
    """The job submitted its successor at a preemption and requeued itself held (hpc_agent/core/handback.py):
    follow the successor from now on, and cancel the held job (it never starts by itself). Checked before
    the attempt's end is judged: the held job must not be expedited, nor its cancel read as a person's."""
    phase = transition(state.phase, Event(EventKind.HANDED_OVER, state.job_id))
    reason = (f"job {state.job_id} handed over to job {successor} at its preemption (checkpoint saved, successor "
              f"queued, job {state.job_id} requeued held): following job {successor}, cancelling held job {state.job_id}")
    record = {"job_id": state.job_id, "action": "handed_over", "cause": "preempted", "reason": reason,
              "evidence": {"successor": successor}}
    return Outcome(phase, effects=(Adopt(state.job_id, successor), Cancel(state.job_id)), audit=(record,),
                   lines=(reason,))


def _to(state: RunState, event: Event) -> Outcome:
    phase = transition(state.phase, event)
    return Outcome(phase)


def _unfollowable(state: RunState, files: Optional[RunFiles]) -> Optional[Outcome]:
    if files is None:
        return None
    if not files.problems and files.config is not None:
        return None
    reasons = list(files.problems) or ["the run's config.yaml could not be read"]
    phase = transition(state.phase, Event(EventKind.UNFOLLOWABLE, state.job_id))
    reason = "; ".join(reasons)
    return Outcome(phase, (Notify(f"needs attention: {reason}"),),
                   audit=({"job_id": state.job_id, "action": "needs_attention", "reason": reason,
                           "notes": list(files.notes)},))


def _diagnoses(state: RunState, attempts: Sequence[Attempt], files: RunFiles) -> List[Diagnosis]:
    found = classify_job(attempts, files.logs, files.alarms, job_id=state.job_id)
    if state.executor != LOCAL:
        return found
    # A local job's attempt was read from its process and files (local_process.observe_local), not from sacct.
    return [replace(d, evidence=tuple(LOCAL_EVIDENCE + e[len("sacct: "):] if i == 0 and e.startswith("sacct: ") else e
                                      for i, e in enumerate(d.evidence))) for d in found]


def _requeued_by_slurm(state: RunState, attempts: Sequence[Attempt], files: Optional[RunFiles],
                       limits: PolicyLimits) -> Outcome:
    """Slurm requeued the job by itself (preemption, node failure): make its next attempt start now, and
    for a failed node also keep it off that node (``ExcNodeList``: the resubmission the policy asks for,
    without a second job id)."""
    parked = _unfollowable(state, files)
    if parked is not None or files is None:
        return parked or Outcome(state.phase)
    diagnoses = _diagnoses(state, attempts, files)
    previous = diagnoses[-2]
    cfg = files.config
    effects: List[Effect] = []
    audit: List[Dict[str, Any]] = []
    lines: List[str] = []
    record = None
    run_attempt = state.attempt_offset + previous.attempt_index + 1
    if previous.cause in (Cause.NODE_FAIL, Cause.GPU_HW_ERROR) and previous.attempt_index not in state.decided:
        decision = decide(previous.cause, state.history, cfg,
                          Situation(job_id=state.job_id, nodes=previous.nodes, bad_nodes=previous.bad_nodes), limits)
        lines.append(f"job {state.job_id} attempt {previous.attempt_index + 1}: {previous.cause.value} -> "
                     f"{decision.action}: {decision.reason}")
        exclude = decision.patch.get("slurm.exclude")
        if decision.action == RESUBMIT and set(decision.patch) == {"slurm.exclude"}:
            record = _decision_row(state, previous, decision, None)
            effects.append(Exclude(state.job_id, str(exclude), decision.patch))
            audit.append({"job_id": state.job_id, "attempt": run_attempt, "cause": previous.cause.value,
                          "evidence": list(previous.evidence), "decision": decision.to_dict(),
                          "config_diff": {"slurm.exclude": {"from": cfg.slurm.exclude, "to": exclude}}})
            cfg = apply_patch(cfg, decision.patch)
    decision = decide(Cause.PENDING, [], cfg, Situation(job_id=state.job_id, requeued_after=previous.cause.value),
                      limits)
    if not decision.expedite:
        return Outcome(state.phase, tuple(effects), record, audit=tuple(audit), lines=tuple(lines))
    lines.append(f"job {state.job_id} requeued by Slurm after {previous.cause.value}: expedite "
                 "(scontrol update StartTime=now; Slurm would wait 121 s)")
    effects.append(Expedite(state.job_id))
    audit.append({"job_id": state.job_id, "attempt": run_attempt, "cause": previous.cause.value,
                  "action": "expedite", "reason": decision.reason, "evidence": list(previous.evidence)})
    return Outcome(state.phase, tuple(effects), record, expedite_attempt=len(attempts) - 1, audit=tuple(audit),
                   lines=tuple(lines))


def _decision_row(state: RunState, diagnosis: Diagnosis, decision: Decision, ckpt_step: Optional[int]) -> Dict[str, Any]:
    return {"job_id": state.job_id, "attempt": diagnosis.attempt_index, "cause": diagnosis.cause.value,
            "action": decision.action, "reason": decision.reason, "patch": dict(decision.patch),
            "evidence": list(diagnosis.evidence), "ckpt_step": ckpt_step, "decision": decision.to_dict()}


def _ended(state: RunState, attempts: Sequence[Attempt], obs: Observation, limits: PolicyLimits) -> Outcome:
    parked = _unfollowable(state, obs.files)
    if parked is not None or obs.files is None:
        return parked or Outcome(state.phase)
    files = obs.files
    diagnoses = _diagnoses(state, attempts, files)
    latest = diagnoses[-1]
    cfg, steps = files.config, files.checkpoint_steps
    last = state.last_ckpt_step
    progress = None if not steps else (steps[-1] > last if last is not None else True)
    facts = None if obs.placement == NOT_ASKED else obs.placement
    decision = decide(latest.cause, state.history, cfg,
                      situation_from(diagnoses, progress, steps, facts, cfg.train.max_steps - (steps[-1] if steps else 0)),
                      limits)
    local_note = ""
    if state.executor == LOCAL and decision.action in (REQUEUE, RESUBMIT):
        decision, local_note = local_decision(decision)
    if decision.action != DONE and steps and steps[-1] >= cfg.train.max_steps:
        # The final checkpoint is complete, so the training is done whatever happened after it (a rank
        # crashing in interpreter teardown, a late signal): never requeue finished work.
        decision = Decision(DONE, "completed", f"the final checkpoint (step {steps[-1]}) is complete; the job "
                                               f"ended {latest.state} after it ({latest.cause.value})")
    if decision.action == DONE:
        phase = transition(state.phase, Event(EventKind.COMPLETED, state.job_id))
        text = f"job {state.job_id} completed" + ("" if latest.cause == Cause.COMPLETED else f": {decision.reason}")
        return Outcome(phase, audit=({"job_id": state.job_id, "cause": "completed", "action": "done",
                                      "reason": decision.reason},), lines=(text,))
    if decision.action not in _ACTIONS:
        return Outcome(state.phase)  # wait
    if decision.action in (REQUEUE, RESUBMIT) and obs.queue == NOT_ASKED:
        return Outcome(state.phase, ask_queue=True)
    if decision.action in (REQUEUE, RESUBMIT) and (obs.queue is None or obs.queue):
        # Slurm requeues preempted and node-failed jobs by itself, and sacct can show the ended attempt a
        # moment before the requeued one. Acting now would start a second job for the same run; the next
        # ticks see the requeued attempt and expedite (and exclude) it instead.
        return Outcome(state.phase, wait_note=latest.attempt_index,
                       lines=(f"job {state.job_id} ended ({latest.cause.value}) but is still in Slurm's queue "
                              f"({obs.queue or 'squeue did not answer'}): waiting for its requeued attempt",))
    if decision.action == RESUBMIT and obs.placement == NOT_ASKED and latest.cause in PLACEMENT_CAUSES \
            and cfg.placement.mode == "auto" and state.executor != LOCAL:
        return Outcome(state.phase, ask_placement={k: v for k, v in decision.patch.items() if k.startswith("slurm.")})
    phase = transition(state.phase, Event(EventKind.ENDED, state.job_id, _ACTIONS[decision.action]))
    lines = [f"job {state.job_id} attempt {latest.attempt_index + 1}: {latest.cause.value} -> "
             f"{decision.action}: {decision.reason}"] + [f"    evidence: {line}" for line in latest.evidence[:4]]
    if decision.placement:
        lines += [f"    {line}" for line in decision.placement.get("table", ())]
    if decision.action == REQUEUE:
        # Slurm only requeues preempted/node-failed jobs itself; anything else needs an explicit requeue.
        effects: Tuple[Effect, ...] = requeue_effects(state, f"{decision.cause}: {decision.reason}")
    elif decision.action == RESUBMIT:
        # Slurm no longer queues the job (checked above), so a run lease it still holds is dead: free it, or the
        # new job waits for it to go stale (~50 s measured in the P2 run after a host OOM killed rank 0).
        effects = (ReleaseLease(state.job_id),
                   Resubmit(state.job_id, decision.patch, f"{decision.cause}: {decision.reason}",
                            decision.rollback_to_step, decision.rollback_before_step))
    elif decision.action == ATTENTION:
        effects = (Notify(f"needs attention: {decision.reason}"),)
        lines += [f"    hypothesis: {h}" for h in decision.hypotheses]
    else:
        effects = (Notify(f"stopped: {decision.reason}"),)
    audit = {"job_id": state.job_id, "attempt": state.attempt_offset + latest.attempt_index + 1,
             "cause": latest.cause.value, "evidence": list(latest.evidence), "decision": decision.to_dict(),
             "config_diff": {k: {"from": _get(cfg, k), "to": v} for k, v in decision.patch.items()}}
    if decision.action == ATTENTION:
        # Parked by the policy: the record says so the way every park does (``action``, ``reason``), and carries
        # what a person needs to judge it (the log lines are ``evidence``).
        audit.update(action=ATTENTION, reason=decision.reason, hypotheses=list(decision.hypotheses))
    if files.notes:
        audit["notes"] = list(files.notes)
    if local_note:
        audit["executor"] = local_note
    # A requeue is expedited with it: its next attempt needs no second expedite when sacct shows it pending.
    expedite = latest.attempt_index + 1 if decision.action == REQUEUE and state.executor != LOCAL else None
    return Outcome(phase, effects, _decision_row(state, latest, decision, steps[-1] if steps else None),
                   expedite_attempt=expedite, audit=(audit,), lines=tuple(lines))


def _resumed(state: RunState, index: int, files: Optional[RunFiles]) -> Outcome:
    """A pending run whose newest attempt ended and was decided: a person resumed it (``watch --resume-run``)
    after the policy parked it (``needs_attention``). The resume is the go-ahead: requeue that attempt once,
    unchanged, from the newest checkpoint, and expedite it. Not a decision of its own (the park is the attempt's
    decision row, so an unknown end at the same step again parks again), and free of the budgets: a person asked."""
    last = state.last_decision
    if files is None or not last or (last["job_id"], last["attempt"], last["action"]) != (state.job_id, index, ATTENTION) \
            or index + 1 in state.expedited:  # (expedited: its requeue is journaled already; sacct lags behind)
        return Outcome(state.phase)
    parked = _unfollowable(state, files)
    if parked is not None:
        return parked
    phase = transition(state.phase, Event(EventKind.ENDED, state.job_id, Action.REQUEUE))
    reason = (f"resumed by a person after it was parked ({last['reason']}): requeue attempt {index + 1} once, "
              "unchanged, from the newest checkpoint")
    decision = Decision(REQUEUE, str(last["cause"]), reason, expedite=True, free=True)
    audit = {"job_id": state.job_id, "attempt": state.attempt_offset + index + 1, "cause": str(last["cause"]),
             "resumed": True, "decision": decision.to_dict(), "config_diff": {}}
    return Outcome(phase, requeue_effects(state, f"{last['cause']}: resumed by a person"),
                   expedite_attempt=index + 1, audit=(audit,), lines=(f"job {state.job_id} attempt {index + 1}: {reason}",))


def _recovering(state: RunState, obs: Observation) -> Outcome:
    """A ``recovering`` run with no journaled effects left: a ledger written before the effect journal
    (its decision recorded, its action maybe never carried out). Finish it the way it was decided."""
    last = state.last_decision
    if not last:
        return Outcome(state.phase)
    latest, index = obs.attempts[-1], len(obs.attempts) - 1
    # (A parked attempt's decision is the newest while a person's resume requeues it: ``_resumed``.)
    recovered = last["job_id"] != state.job_id or (
        last["action"] in (REQUEUE, ATTENTION) and latest.state in PENDING_STATES | RUNNING_STATES
        and index > last["attempt"])
    if recovered:
        return _to(state, Event(EventKind.RECOVERED, state.job_id))
    saved = last.get("decision", {})
    if last["action"] in (REQUEUE, ATTENTION):
        effects: Tuple[Effect, ...] = requeue_effects(state, f"{last['cause']}: {last['reason']}")
    elif last["action"] == RESUBMIT:
        effects = (Resubmit(state.job_id, dict(last.get("patch", {})), f"{last['cause']}: {last['reason']}",
                            saved.get("rollback_to_step"), saved.get("rollback_before_step")),)
    else:
        return Outcome(state.phase)
    return Outcome(state.phase, effects,
                   lines=(f"carrying out the recorded decision again: {last['action']} ({last['reason']})",))



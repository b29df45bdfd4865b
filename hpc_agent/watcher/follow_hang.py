"""The watcher's pure core for a *running* attempt that may be hung (called by ``hpc_agent.watcher.follow``).

Two ticks, so the evidence holds the stuck ranks' Python stacks:

1. the heartbeats' verdict (``diagnosis.hang.judge``, computed by the observer) says hung and no suspicion
   is open -> effect ``request_stacks`` (``scancel --signal=URG``: every rank's faulthandler dumps its
   threads), an audit record ``hang_suspected``, and the suspicion stored with the stack files' marks;
2. a later tick: the verdict is gone -> the suspicion is closed (``hang_cleared``), nothing else; each
   stuck rank's stack file changed since the request, or ``stack_wait_s`` passed -> the decision (cause
   ``hung``, evidence: heartbeat age, silence and limit, step, stack groups and top frame, last log lines)
   and its effects: cancel, wait until Slurm no longer lists the job (its processes are gone), move the
   ended job's run lease aside, resubmit from the newest checkpoint (``slurm.exclude`` for the nodes of
   outlier ranks or of ranks whose heartbeat stopped while others beat on), or stop (same hang twice).

No I/O, no clock: ``Observation.live.now`` is the observer's time.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from hpc_agent.core.causes import Cause
from hpc_agent.diagnosis.hang import StackGroups, group_stacks, main_thread
from hpc_agent.policy.decide import RESUBMIT, STOP, PolicyLimits, Situation, decide
from hpc_agent.slurm.hostlist import expand_hostlist
from hpc_agent.slurm.sacct import Attempt
from hpc_agent.state.lifecycle import Action, Event, EventKind, transition
from hpc_agent.watcher.follow_model import (AwaitEnd, Cancel, Live, Notify, Observation, Outcome, ReleaseLease,
                                            RequestStacks, Resubmit, RunState, Suspicion)

LOG_LINES = 6     # last log lines in the evidence
STACK_FRAMES = 8  # frames of the majority's main thread in the evidence


def verdict_dict(verdict: Any) -> Dict[str, Any]:
    return {"kind": verdict.kind, "silent_s": round(float(verdict.silent_s), 1), "limit_s": round(float(verdict.limit_s), 1),
            "step": verdict.step, "ranks": list(verdict.ranks), "reason": verdict.reason}


def open_suspicion(state: RunState, index: int) -> Optional[Suspicion]:
    sus = state.suspicion
    return sus if sus is not None and sus.active and sus.job_id == state.job_id and sus.attempt == index else None


def running(state: RunState, attempts: Sequence[Attempt], obs: Observation, limits: PolicyLimits) -> Outcome:
    live, index = obs.live, len(attempts) - 1
    if live is None or not live.acting:
        return Outcome(state.phase)
    sus = open_suspicion(state, index)
    verdict = live.verdict
    if sus is None:
        if verdict is None:
            return Outcome(state.phase)
        record = {"job_id": state.job_id, "attempt": state.attempt_offset + index + 1, "action": "hang_suspected",
                  "cause": Cause.HUNG.value, "verdict": verdict_dict(verdict)}
        return Outcome(state.phase, (RequestStacks(state.job_id),), audit=(record,),
                       suspect=Suspicion(state.job_id, index, live.now, dict(live.stack_marks), verdict_dict(verdict)),
                       lines=(f"job {state.job_id} looks hung ({verdict.reason}): asking its ranks for their stacks",))
    if verdict is None:
        record = {"job_id": state.job_id, "attempt": state.attempt_offset + index + 1, "action": "hang_cleared",
                  "cause": Cause.HUNG.value, "reason": "the job made progress again before the decision",
                  "verdict": sus.verdict}
        return Outcome(state.phase, audit=(record,), suspect=_closed(sus),
                       lines=(f"job {state.job_id} moved on: hang suspicion dropped, nothing done",))
    if not (stacks_arrived(sus, live, verdict.ranks) or live.now - sus.asked_at >= live.stack_wait_s):
        return Outcome(state.phase)
    files = obs.files
    if files is None or files.config is None or files.problems:
        return Outcome(state.phase)  # follow() parks an unreadable run before it gets here
    return _decide(state, attempts[-1], index, obs, live, sus, verdict, limits)


def stacks_arrived(sus: Suspicion, live: Live, ranks: Sequence[int]) -> bool:
    """Every stuck rank's stack file changed (a new dump) since the request; False with no rank to wait for."""
    ranks = tuple(ranks) or tuple(sus.stack_marks)
    return bool(ranks) and all(r in live.stack_marks and live.stack_marks[r] != sus.stack_marks.get(r) for r in ranks)


def _closed(sus: Suspicion) -> Suspicion:
    return Suspicion(sus.job_id, sus.attempt, sus.asked_at, sus.stack_marks, sus.verdict, active=False)


def bad_nodes(verdict: Any, groups: StackGroups, beats: Sequence[Any], job_nodes: Sequence[str]) -> Tuple[str, ...]:
    """Nodes the evidence points at: those of outlier ranks, or of ranks whose heartbeat stopped while other
    ranks' went on. Only a host that is one of the job's Slurm nodes counts (a host name that is not the node
    name excludes nothing rather than the wrong node), and never every node of the job: that points at the
    job, not a node."""
    hosts = {b.rank: b.host for b in beats}
    suspects = set(groups.outliers)
    if verdict.kind == "heartbeat_lost" and len(verdict.ranks) < len(hosts):
        suspects |= set(verdict.ranks)
    nodes = set(job_nodes)
    named = sorted({hosts[r] for r in suspects if hosts.get(r) in nodes})
    return tuple(named) if named and len(named) < len(nodes) else ()


def evidence(verdict: Any, live: Live, groups: StackGroups, stacks: Dict[int, str], logs: Sequence[Any]) -> List[str]:
    newest = max((b.written_at for b in live.beats), default=None)
    age = f"{live.now - newest:.0f} s ago" if newest is not None else "never written by this attempt"
    out = [f"hung ({verdict.kind}): {verdict.reason}",
           f"silent {verdict.silent_s:.0f} s / limit {verdict.limit_s:.0f} s; last step {verdict.step}; "
           f"newest heartbeat {age}"]
    if groups.groups:
        out.append(f"stacks: top frame {groups.top_frame}; groups: " + "; ".join(
            f"ranks {','.join(map(str, ranks))}: {sig}" for sig, ranks in groups.groups.items())
            + (f"; outliers: ranks {','.join(map(str, groups.outliers))}" if groups.outliers else ""))
        rank = groups.groups[groups.majority][0]
        frames = main_thread(stacks.get(rank, "")) or []
        out.extend(f"  rank {rank}: {frame}" for frame in frames[:STACK_FRAMES])
    else:
        out.append("stacks: none dumped (the ranks had not registered their stack signal, or did not answer)")
    lines = [line for log in logs for line in log.text.splitlines() if line.strip()]
    out.extend(f"log: {line[:300]}" for line in lines[-LOG_LINES:])
    return out


def _decide(state: RunState, latest: Attempt, index: int, obs: Observation, live: Live, sus: Suspicion,
            verdict: Any, limits: PolicyLimits) -> Outcome:
    files = obs.files
    cfg, steps = files.config, files.checkpoint_steps
    stacks = dict(live.stacks or {})
    groups = group_stacks({r: t for r, t in stacks.items() if not verdict.ranks or r in verdict.ranks})
    job_nodes = expand_hostlist(latest.primary.get("NodeList") if latest.primary else "")
    nodes = bad_nodes(verdict, groups, live.beats, job_nodes)
    hang = (verdict.step, groups.majority or verdict.kind)
    last = state.last_ckpt_step
    progress = None if not steps else (steps[-1] > last if last is not None else True)
    decision = decide(Cause.HUNG, state.history, cfg,
                      Situation(job_id=state.job_id, made_progress=progress, checkpoint_steps=tuple(steps),
                                nodes=tuple(job_nodes), bad_nodes=nodes, hang=hang, top_frame=groups.top_frame), limits)
    action = Action.RESUBMIT if decision.action == RESUBMIT else Action.STOP
    if decision.action not in (RESUBMIT, STOP):  # e.g. a requeue proposal cannot come from _hung; be explicit
        action = Action.STOP
    phase = transition(state.phase, Event(EventKind.ENDED, state.job_id, action))
    proof = evidence(verdict, live, groups, stacks, files.logs)
    saved = {**decision.to_dict(), "hang": {"step": verdict.step, "signature": hang[1], "kind": verdict.kind,
                                            "top_frame": groups.top_frame, "ranks": list(verdict.ranks),
                                            "bad_nodes": list(nodes)}}
    row = {"job_id": state.job_id, "attempt": index, "cause": Cause.HUNG.value, "action": action.value,
           "reason": decision.reason, "patch": dict(decision.patch), "evidence": proof,
           "ckpt_step": steps[-1] if steps else None, "decision": saved}
    if action is Action.RESUBMIT:
        effects = (Cancel(state.job_id), AwaitEnd(state.job_id), ReleaseLease(state.job_id),
                   Resubmit(state.job_id, decision.patch, f"hung: {decision.reason}"))
    else:
        effects = (Cancel(state.job_id), Notify(f"stopped: {decision.reason}"))
    audit = {"job_id": state.job_id, "attempt": state.attempt_offset + index + 1, "cause": Cause.HUNG.value,
             "evidence": proof, "decision": decision.to_dict(), "hang": saved["hang"],
             "config_diff": {k: {"from": config_value(cfg, k), "to": v} for k, v in decision.patch.items()}}
    lines = [f"job {state.job_id} attempt {index + 1}: hung -> {action.value}: {decision.reason}"]
    lines += [f"    evidence: {line}" for line in proof[:4]]
    return Outcome(phase, effects, row, audit=(audit,), lines=tuple(lines), suspect=_closed(sus))


def config_value(cfg: Any, dotted: str) -> Any:
    """``cfg``'s value at ``train.lr``-style ``dotted`` (None where absent)."""
    node: Any = cfg
    for part in dotted.split("."):
        node = getattr(node, part, None)
    return node

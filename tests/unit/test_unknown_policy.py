"""The unknown policy (issue 43): an attempt that ended with no positive evidence for any cause is requeued once,
unchanged, from the newest checkpoint; a second unknown end at the same step parks the run in needs_attention with
the evidence and the hypotheses; an unknown *state* still waits.

A table over ``decide()`` (pure), then the watcher's pure core (``follow``) for the same ends, then the whole loop
on the fake Slurm: park, a person's resume, and the requeue it asks for.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any, Dict, Optional, Sequence, Tuple

import pytest

from hpc_agent.config.load import build_config
from hpc_agent.core.causes import Cause
from hpc_agent.diagnosis.classify import Diagnosis
from hpc_agent.policy.decide import (ATTENTION, DEFAULT_PER_CAUSE, REQUEUE, RESUBMIT, STOP, WAIT, PastAttempt,
                                     Situation, decide)
from hpc_agent.state.lifecycle import Event, EventKind, Phase
from hpc_agent.watcher import follow as follow_module
from hpc_agent.watcher.follow import follow, history_from, situation_from, wants
from hpc_agent.watcher.follow_model import (EXPEDITE, NOT_ASKED, NOTIFY, REQUEUE_EFFECT, Observation, RunFiles,
                                            RunState, Wants)
from hpc_agent.watcher.notify_events import notifications_for
from tests.unit.test_follow import attempts, files, row, state
from tests.unit.test_watcher import add_run, world, write_complete_checkpoint  # noqa: F401 - world: a fixture

HYPOTHESES = ("host_oom: the last memory reading was 97% of --mem", "node_fail: node1 logged a kernel soft lockup")
EVIDENCE = ("sacct: job 9 attempt 1: FAILED, exit 1:0, on node1", "9_0_log.out:40: [hpc_agent] step 20 loss 2.1")


def cfg(**overrides: Any):
    return build_config([dict(overrides)])


def unknown(step: Optional[int], action: str = REQUEUE, progress: Optional[bool] = None) -> PastAttempt:
    """An earlier unknown end whose retry resumed from ``step`` (the ledger's ckpt_step)."""
    return PastAttempt("9", "unknown", action, {}, progress, None, step)


def ended(*steps: int, **kw: Any) -> Situation:
    return Situation(job_id="9", ended=True, checkpoint_steps=tuple(steps), hypotheses=HYPOTHESES,
                     evidence=EVIDENCE, **kw)


@dataclass
class Row:
    id: str
    action: str
    history: Sequence[PastAttempt] = ()
    situation: Situation = field(default_factory=lambda: ended(10, 20))
    config: Dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    expedite: Optional[bool] = None


ROWS = [
    Row("first-unknown-requeues-unchanged-from-the-newest-checkpoint", REQUEUE, expedite=True, reason="step 20"),
    Row("first-unknown-without-a-checkpoint-requeues", REQUEUE, situation=ended(), expedite=True,
        reason="no checkpoint yet"),
    Row("second-unknown-at-the-same-step-needs-attention", ATTENTION, [unknown(20)], reason="again at step 20"),
    Row("second-unknown-at-a-later-step-requeues", REQUEUE, [unknown(20)], ended(20, 30), expedite=True,
        reason="step 30"),
    Row("third-unknown-at-the-same-step-as-the-second-needs-attention", ATTENTION, [unknown(20), unknown(30)],
        ended(20, 30)),
    Row("unknown-both-times-without-checkpoints-is-the-same-step", ATTENTION, [unknown(None)], ended()),
    Row("an-older-checkpoint-than-the-earlier-unknowns-is-not-the-same-step", REQUEUE, [unknown(30)], ended(20)),
    Row("other-causes-between-do-not-make-it-a-new-fault", ATTENTION,
        [unknown(20), PastAttempt("9", "preempted", REQUEUE, {}, False, None, 20)]),
    Row("after-a-person-resumed-a-park-the-same-step-parks-again", ATTENTION,
        [unknown(20), unknown(20, ATTENTION)]),
    Row("unknown-state-waits-never-requeues", WAIT, situation=Situation(checkpoint_steps=(10, 20)),
        reason="never requeue"),
    Row("unknown-state-waits-even-after-earlier-unknown-ends", WAIT, [unknown(20)], Situation(checkpoint_steps=(20,))),
    Row("per-cause-budget-exhausted-stops", STOP, [unknown(10), unknown(20), unknown(30)], ended(40),
        reason="retry budget for unknown used up (3 of 3)"),
    Row("overall-budget-exhausted-stops", STOP, [PastAttempt("9", "gpu_oom", RESUBMIT, {"x": 1}, True, None, 10)],
        config={"watch.max_retries": 1}, reason="overall retry budget"),
    Row("watch-disabled-does-not-requeue", STOP, config={"watch.enabled": False}, reason="watch.enabled is false"),
]


@pytest.mark.parametrize("r", ROWS, ids=[r.id for r in ROWS])
def test_unknown_policy_table(r: Row):
    d = decide(Cause.UNKNOWN, r.history, cfg(**r.config), r.situation)
    assert d.action == r.action, d.reason
    assert d.cause == "unknown" and r.reason in d.reason
    if r.expedite is not None:
        assert d.expedite is r.expedite
    if d.action == REQUEUE:  # unchanged, from the newest checkpoint, and it costs budget
        assert d.patch == {} and d.rollback_to_step is None and d.rollback_before_step is None and not d.free
    if d.action == ATTENTION:  # the hypotheses travel with the decision, into the audit record
        assert d.hypotheses == HYPOTHESES and d.to_dict()["hypotheses"] == list(HYPOTHESES)
        assert HYPOTHESES[0] in d.reason
    if d.action == WAIT:
        assert d.free and "hypotheses" not in d.to_dict()


def test_unknown_has_a_per_cause_budget_and_a_park_costs_none():
    assert DEFAULT_PER_CAUSE["unknown"] == 3
    # A park (needs_attention) is not a retry: it spends neither the per-cause nor the overall budget.
    history = [unknown(10), unknown(10, ATTENTION), unknown(20)]
    assert decide("unknown", history, cfg(**{"watch.max_retries": 3}), ended(30)).action == REQUEUE
    assert decide("unknown", history, cfg(**{"watch.max_retries": 2}), ended(30)).action == STOP


def test_history_and_situation_carry_the_step_the_hypotheses_and_the_evidence():
    rows = [SimpleNamespace(job_id="9", cause="unknown", action="requeue", patch={}, ckpt_step=20, decision={}),
            SimpleNamespace(job_id="9", cause="unknown", action="needs_attention", patch={}, ckpt_step=None,
                            decision={})]
    assert [h.step for h in history_from(rows)] == [20, None]
    diagnosis = Diagnosis("9", Cause.UNKNOWN, EVIDENCE, state="FAILED", ended=True, hypotheses=HYPOTHESES)
    s = situation_from([diagnosis], None, (10, 20))
    assert (s.ended, s.resume_step, s.hypotheses, s.evidence) == (True, 20, HYPOTHESES, EVIDENCE)
    assert situation_from([replace(diagnosis, ended=False)]).ended is False


# --- the watcher's pure core -------------------------------------------------------------------------------------
@pytest.fixture
def diagnosed_unknown(monkeypatch):
    """The classifier's answer for an ended attempt with nothing recognisable, as issue 43 makes it: ``unknown``,
    ended, with hypotheses (until the classifier's change lands, a FAILED attempt with a plain log is a code error)."""
    real = follow_module._diagnoses

    def fake(run, found_attempts, run_files):
        out = real(run, found_attempts, run_files)
        last = out[-1]
        return out[:-1] + [Diagnosis(last.job_id, Cause.UNKNOWN, EVIDENCE, last.attempt_index, last.state,
                                     last.exit_code, last.nodes, ended=True, hypotheses=HYPOTHESES)]

    monkeypatch.setattr(follow_module, "_diagnoses", fake)


def decision_row(outcome) -> SimpleNamespace:
    """The ledger's decision row for an outcome, as ``Ledger.decisions`` gives it back."""
    return SimpleNamespace(**{k: outcome.decision[k] for k in ("job_id", "attempt", "cause", "action", "reason",
                                                                "patch", "ckpt_step", "decision")})


PLAIN = "[hpc_agent] step 20 loss 2.1\n"


def test_follow_requeues_a_first_unknown_end_then_parks_the_second_at_the_same_checkpoint(diagnosed_unknown):
    # Attempt 1 fails with nothing recognisable, newest complete checkpoint: step 20.
    first = Observation(attempts(row("FAILED", "1:0")), "", files(PLAIN, steps=(10, 20)))
    outcome = follow(state(), first)
    assert outcome.phase is Phase.RECOVERING
    assert [e.kind for e in outcome.effects] == [REQUEUE_EFFECT, EXPEDITE] and outcome.expedite_attempt == 1
    assert outcome.decision["action"] == "requeue" and outcome.decision["ckpt_step"] == 20
    rows = [decision_row(outcome)]

    # Attempt 2 (Slurm's second attempt of job 9) fails the same way, no newer checkpoint.
    run = state(Phase.RUNNING, history=history_from(rows), decided=frozenset({0}), expedited=frozenset({1}),
                last_ckpt_step=20)
    second = Observation(attempts(row("REQUEUED"), row("FAILED", "1:0")), NOT_ASKED, files(PLAIN, steps=(10, 20)))
    outcome = follow(run, second)
    assert outcome.phase is Phase.NEEDS_ATTENTION
    assert [e.kind for e in outcome.effects] == [NOTIFY]
    assert outcome.effects[0].args["text"].startswith("needs attention: ended without a known cause again at step 20")
    assert outcome.decision["action"] == ATTENTION and outcome.decision["ckpt_step"] == 20  # replayable from the ledger
    (audit,) = outcome.audit
    assert audit["action"] == ATTENTION and audit["cause"] == "unknown" and audit["attempt"] == 2
    assert audit["hypotheses"] == list(HYPOTHESES) and audit["evidence"] == list(EVIDENCE)
    assert audit["decision"]["hypotheses"] == list(HYPOTHESES) and audit["reason"] == audit["decision"]["reason"]
    assert any(line.strip() == f"hypothesis: {HYPOTHESES[0]}" for line in outcome.lines)

    # The notification a parked run gets carries the hypotheses and the log lines.
    (note,) = notifications_for(7, "r", audit)
    assert note.event == "attention" and note.fields["kind"] == "needs_attention"
    assert note.fields["hypotheses"] == list(HYPOTHESES) and note.fields["evidence"] == list(EVIDENCE)
    assert "--resume-run r" in note.text and EVIDENCE[1] in note.text and HYPOTHESES[1] in note.text


def test_follow_requeues_a_second_unknown_end_after_a_newer_checkpoint(diagnosed_unknown):
    rows = [SimpleNamespace(job_id="9", attempt=0, cause="unknown", action="requeue", patch={}, ckpt_step=20,
                            decision={})]
    run = state(history=history_from(rows), decided=frozenset({0}), expedited=frozenset({1}), last_ckpt_step=20)
    outcome = follow(run, Observation(attempts(row("REQUEUED"), row("FAILED", "1:0")), "", files(PLAIN, steps=(20, 30))))
    assert outcome.phase is Phase.RECOVERING and [e.kind for e in outcome.effects] == [REQUEUE_EFFECT, EXPEDITE]


PARKED = {"job_id": "9", "attempt": 1, "action": ATTENTION, "cause": "unknown",
          "reason": "ended without a known cause again at step 20", "patch": {}, "decision": {}}


def test_a_resumed_park_is_requeued_once_from_the_newest_checkpoint():
    """``watch --resume-run`` puts the parked run back to pending; its ended attempt is decided (the park), so the
    next tick reads the ledger's newest decision and requeues that attempt: the person's go-ahead."""
    run = state(Phase.PENDING, decided=frozenset({0, 1}), expedited=frozenset({1}), last_decision=PARKED)
    ended_attempts = attempts(row("REQUEUED"), row("FAILED", "1:0"))
    assert wants(run, ended_attempts) == Wants(files=True)
    outcome = follow(run, Observation(ended_attempts, NOT_ASKED, files(PLAIN, steps=(10, 20))))
    assert outcome.phase is Phase.RECOVERING
    assert [e.kind for e in outcome.effects] == [REQUEUE_EFFECT, EXPEDITE] and outcome.expedite_attempt == 2
    assert outcome.decision is None  # not a decision of its own: the same step unknown again parks again
    (audit,) = outcome.audit
    assert audit["resumed"] is True and audit["decision"]["action"] == "requeue" and audit["decision"]["free"]
    assert notifications_for(8, "r", audit) == []

    # Once its requeue is journaled (expedited), a lagging sacct does not make it requeue twice.
    again = replace(run, expedited=frozenset({1, 2}))
    assert follow(again, Observation(ended_attempts, NOT_ASKED, files(PLAIN, steps=(10, 20)))).effects == ()
    # A pending run whose ended attempt was decided otherwise (a requeue sacct has not caught up with) waits.
    other = replace(run, last_decision={**PARKED, "action": "requeue"})
    assert follow(other, Observation(ended_attempts, NOT_ASKED, files(PLAIN))).effects == ()
    # Unreadable files park it again (through the same edge as any run the watcher cannot follow).
    broken = follow(run, Observation(ended_attempts, NOT_ASKED, files(PLAIN, problems=("config.yaml: bad",))))
    assert broken.phase is Phase.NEEDS_ATTENTION


def test_a_legacy_recovering_run_after_a_resumed_park_recovers_once_the_next_attempt_exists():
    run = state(Phase.RECOVERING, last_decision=PARKED)
    outcome = follow(run, Observation(attempts(row("REQUEUED"), row("REQUEUED"), row("PENDING")), NOT_ASKED))
    assert outcome.phase is Phase.PENDING


# --- the loop on the fake Slurm ------------------------------------------------------------------------------------
def test_watcher_parks_on_the_second_unknown_end_at_the_same_step_and_a_resume_requeues(world, diagnosed_unknown):
    slurm, ledger, watcher = world["slurm"], world["ledger"], world["watcher"]
    run_dir, job = add_run(world, "r", log=PLAIN)
    write_complete_checkpoint(run_dir, 20)
    slurm.fail(job, 1)
    watcher.tick()
    assert slurm.requeues == [job] and slurm.expedites == [job]
    assert [(d.cause, d.action, d.ckpt_step) for d in ledger.decisions("r")] == [("unknown", "requeue", 20)]
    slurm.schedule()
    watcher.tick()
    assert ledger.run("r").phase == "running"

    slurm.fail(job, 1)  # the same end again, no newer checkpoint
    watcher.tick()
    assert ledger.run("r").phase == "needs_attention" and "r" in watcher._report.parked
    assert [(d.cause, d.action, d.ckpt_step) for d in ledger.decisions("r")][-1] == ("unknown", ATTENTION, 20)
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    (park,) = [e for e in events if e.get("action") == ATTENTION]
    assert park["hypotheses"] == list(HYPOTHESES) and park["evidence"] == list(EVIDENCE)
    watcher.tick()
    assert slurm.requeues == [job]  # parked: not followed, nothing done

    # A person resumes it (what `watch --resume-run r` does): the next tick requeues it once.
    ledger.advance("r", Event(EventKind.RESUMED))
    watcher.tick()
    assert slurm.requeues == [job, job] and ledger.run("r").phase == "pending"
    watcher.tick()
    assert slurm.requeues == [job, job]
    slurm.schedule()
    watcher.tick()
    slurm.fail(job, 1)  # and the same end at the same step again parks it again
    watcher.tick()
    assert ledger.run("r").phase == "needs_attention"

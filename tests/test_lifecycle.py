"""The run state machine: one test per edge, plus the effects that matter and the edges that must not exist."""
from __future__ import annotations

import pytest

from hpc_agent.lifecycle import (EDGES, EFFECT_NOTIFY, EFFECT_RECORD, EFFECT_REQUEUE, EFFECT_RESUBMIT, EFFECT_SUBMIT,
                                 TERMINAL, Action, Event, EventKind, InvalidTransition, Phase, transition)


@pytest.mark.parametrize("edge", sorted(EDGES, key=str), ids=lambda e: f"{e[0].value}-{e[1].value}-{e[2].value if e[2] else ''}")
def test_every_edge(edge):
    phase, kind, action = edge
    new_phase, effects = transition(phase, Event(kind, job_id="7", action=action))
    assert new_phase is EDGES[edge]
    names = [e.name for e in effects]
    if kind is EventKind.ENDED:
        assert names[0] == EFFECT_RECORD  # a decision is recorded before it is carried out
        expected = {Action.REQUEUE: EFFECT_REQUEUE, Action.RESUBMIT: EFFECT_RESUBMIT, Action.STOP: EFFECT_NOTIFY}[action]
        assert names[1] == expected
    elif kind is EventKind.NOT_FOUND:
        assert names == [EFFECT_SUBMIT]
    elif new_phase in TERMINAL:
        assert names == [EFFECT_NOTIFY]


@pytest.mark.parametrize("phase", sorted(TERMINAL, key=str))
@pytest.mark.parametrize("kind", list(EventKind))
def test_terminal_phases_accept_nothing(phase, kind):
    with pytest.raises(InvalidTransition):
        transition(phase, Event(kind, job_id="1", action=Action.REQUEUE if kind is EventKind.ENDED else None))


def test_completed_is_not_a_decision():
    with pytest.raises(InvalidTransition):
        transition(Phase.SUBMITTING, Event(EventKind.STARTED))


def test_requeue_path_round_trip():
    phase = Phase.RUNNING
    phase, effects = transition(phase, Event(EventKind.ENDED, "5", Action.REQUEUE, {"cause": "preempted"}))
    assert phase is Phase.RECOVERING
    assert effects[1].detail["cause"] == "preempted"
    phase, _ = transition(phase, Event(EventKind.ACTION_FAILED, "5"))
    assert phase is Phase.RECOVERING
    phase, _ = transition(phase, Event(EventKind.RECOVERED, "5"))
    phase, _ = transition(phase, Event(EventKind.STARTED, "5"))
    phase, effects = transition(phase, Event(EventKind.COMPLETED, "5"))
    assert phase is Phase.COMPLETED and effects[0].name == EFFECT_NOTIFY

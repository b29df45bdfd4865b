"""The run state machine, tested by what runs go through rather than by the table against itself.

* scenarios: a run's whole life as a sequence of events, with the phase after each step (what to do on an
  edge is the follow core's: its effects are tested in tests/unit/test_follow.py);
* edges that must not exist (a second submission, a parked run that starts, anything after the end);
* the graph: every phase can be reached, and every live phase can still end;
* ``Ledger.advance`` writes the phase only along an edge;
* nothing in ``hpc_agent/`` changes a phase except through ``Ledger.advance`` (a grep).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from hpc_agent.state.ledger import Ledger
from hpc_agent.state.lifecycle import (EDGES, FOLLOWED, TERMINAL, Action, Event, EventKind, InvalidTransition, Phase,
                                       transition)

P, K, A = Phase, EventKind, Action
PACKAGE = Path(__file__).resolve().parents[2] / "hpc_agent"

# Files under hpc_agent/ allowed to call ``.set_phase(`` directly. ledger.py defines it (advance calls it);
# watcher.py is being rewritten onto Ledger.advance and leaves this list when that is done.
SET_PHASE_ALLOWED = ("state/ledger.py",)


def walk(start: Phase, steps):
    """Feed ``steps`` ((event kind, action, expected phase), ...) through transition()."""
    phase = start
    for kind, action, expected in steps:
        phase = transition(phase, Event(kind, job_id="7", action=action, detail={"cause": "x"}))
        assert phase is expected, (kind, action)
    return phase


SCENARIOS = {
    "submit, run, preempted, requeued, completed": (P.SUBMITTING, [
        (K.SUBMITTED, None, P.PENDING),
        (K.STARTED, None, P.RUNNING),
        (K.STARTED, None, P.RUNNING),  # seen running again next tick: nothing happens
        (K.ENDED, A.REQUEUE, P.RECOVERING),
        (K.QUEUED, None, P.RECOVERING),
        (K.RECOVERED, None, P.PENDING),
        (K.STARTED, None, P.RUNNING),
        (K.COMPLETED, None, P.COMPLETED),
    ]),
    "Slurm requeues by itself, the requeued job starts before the watcher looks": (P.PENDING, [
        (K.STARTED, None, P.RUNNING),
        (K.QUEUED, None, P.PENDING),
        (K.STARTED, None, P.RUNNING),
        (K.ENDED, A.REQUEUE, P.RECOVERING),
        (K.STARTED, None, P.RUNNING),
        (K.COMPLETED, None, P.COMPLETED),
    ]),
    "OOM, resubmit fails once, then goes through": (P.PENDING, [
        (K.STARTED, None, P.RUNNING),
        (K.ENDED, A.RESUBMIT, P.RECOVERING),
        (K.ACTION_FAILED, None, P.RECOVERING),
        (K.RECOVERED, None, P.PENDING),
        (K.STARTED, None, P.RUNNING),
        (K.COMPLETED, None, P.COMPLETED),
    ]),
    "an OOM while still pending (e.g. at start-up), then the budget is spent while retrying": (P.PENDING, [
        (K.ENDED, A.RESUBMIT, P.RECOVERING),
        (K.ACTION_FAILED, None, P.RECOVERING),
        (K.ENDED, A.STOP, P.STOPPED),
    ]),
    "OOM, the watcher's resubmission is answered by sbatch": (P.RUNNING, [
        (K.ENDED, A.RESUBMIT, P.RECOVERING),
        (K.SUBMITTED, None, P.PENDING),
        (K.STARTED, None, P.RUNNING),
    ]),
    "submit died between recording the job id and the phase: followed like a pending run": (P.SUBMITTING, [
        (K.STARTED, None, P.RUNNING),
        (K.COMPLETED, None, P.COMPLETED),
    ]),
    "sbatch refuses": (P.SUBMITTING, [
        (K.SUBMIT_FAILED, None, P.STOPPED),
    ]),
    "submitter killed before sbatch: reconciled, submitted, found": (P.SUBMITTING, [
        (K.NOT_FOUND, None, P.SUBMITTING),
        (K.FOUND, None, P.PENDING),
    ]),
    "a code error stops the run": (P.RUNNING, [
        (K.ENDED, A.STOP, P.STOPPED),
    ]),
    "a pruned sweep trial is cancelled": (P.SUBMITTING, [
        (K.SUBMITTED, None, P.PENDING),
        (K.STARTED, None, P.RUNNING),
        (K.CANCELLED, None, P.STOPPED),
    ]),
    "unfollowable, parked, resumed, then followed again": (P.RUNNING, [
        (K.UNFOLLOWABLE, None, P.NEEDS_ATTENTION),
        (K.UNFOLLOWABLE, None, P.NEEDS_ATTENTION),  # still broken next time: told once only
        (K.RESUMED, None, P.PENDING),
        (K.STARTED, None, P.RUNNING),
        (K.COMPLETED, None, P.COMPLETED),
    ]),
    "an unknown cause twice at the same step: the policy parks it, a person resumes it, it is requeued": (P.RUNNING, [
        (K.ENDED, A.ATTENTION, P.NEEDS_ATTENTION),
        (K.RESUMED, None, P.PENDING),
        (K.ENDED, A.REQUEUE, P.RECOVERING),  # the resumed attempt's requeue (hpc_agent/watcher/follow.py _resumed)
        (K.RECOVERED, None, P.PENDING),
        (K.STARTED, None, P.RUNNING),
    ]),
    "a parked trial is pruned": (P.RECOVERING, [
        (K.UNFOLLOWABLE, None, P.NEEDS_ATTENTION),
        (K.CANCELLED, None, P.STOPPED),
    ]),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario(name):
    start, steps = SCENARIOS[name]
    end = walk(start, steps)
    assert end in TERMINAL or end in FOLLOWED


@pytest.mark.parametrize("phase", list(P))
def test_cancel_stops_every_live_or_parked_run(phase):
    if phase in TERMINAL:
        with pytest.raises(InvalidTransition):
            transition(phase, Event(K.CANCELLED, "1"))
        return
    assert transition(phase, Event(K.CANCELLED, "1")) is P.STOPPED


INVALID = [
    (P.PENDING, K.SUBMITTED, None),       # a second sbatch for a run that has a job
    (P.RUNNING, K.SUBMITTED, None),
    (P.RECOVERING, K.ENDED, A.REQUEUE),   # a second decision while the first is carried out
    (P.RECOVERING, K.ENDED, A.RESUBMIT),
    (P.PENDING, K.RECOVERED, None),
    (P.PENDING, K.RESUMED, None),         # only a parked run is resumed
    (P.RUNNING, K.FOUND, None),
    (P.NEEDS_ATTENTION, K.STARTED, None),  # a parked run is not followed until a person resumes it
    (P.NEEDS_ATTENTION, K.ENDED, A.REQUEUE),
    (P.NEEDS_ATTENTION, K.ENDED, A.ATTENTION),  # a parked run is not decided on again until a person resumes it
    (P.NEEDS_ATTENTION, K.COMPLETED, None),
    (P.COMPLETED, K.STARTED, None),
    (P.STOPPED, K.RESUMED, None),
    (P.STOPPED, K.QUEUED, None),          # a stopped run is never revived by what Slurm does
]


@pytest.mark.parametrize("phase, kind, action", INVALID, ids=lambda v: getattr(v, "value", str(v)))
def test_edges_that_must_not_exist(phase, kind, action):
    with pytest.raises(InvalidTransition, match=f"no edge from {phase.value} on {kind.value}"):
        transition(phase, Event(kind, job_id="1", action=action))


@pytest.mark.parametrize("phase", sorted(TERMINAL, key=str))
@pytest.mark.parametrize("kind", list(EventKind))
def test_terminal_phases_accept_nothing(phase, kind):
    with pytest.raises(InvalidTransition):
        transition(phase, Event(kind, job_id="1", action=Action.REQUEUE if kind is EventKind.ENDED else None))


def test_every_phase_is_reachable_and_every_live_phase_can_end():
    succ = {}
    for (src, _, _), dst in EDGES.items():
        succ.setdefault(src, set()).add(dst)

    def reach(start):
        seen, todo = {start}, [start]
        while todo:
            for nxt in succ.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    assert reach(P.SUBMITTING) == set(P)
    for phase in set(P) - TERMINAL:
        assert {P.COMPLETED, P.STOPPED} & reach(phase), phase


def test_ledger_advance_writes_along_edges_only(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.add_run("r", "r", str(tmp_path))
    assert ledger.run("r").phase == "submitting"
    assert ledger.advance("r", Event(K.SUBMITTED, "1")) is P.PENDING
    with pytest.raises(InvalidTransition):
        ledger.advance("r", Event(K.SUBMITTED, "2"))
    assert ledger.run("r").phase == "pending"  # a refused event writes nothing
    ledger.advance("r", Event(K.STARTED, "1"))
    assert ledger.advance("r", Event(K.CANCELLED, "1")) is P.STOPPED
    assert ledger.run("r").phase == "stopped"


def test_no_phase_is_written_around_the_state_machine():
    """Every phase change goes through Ledger.advance (lifecycle.transition); only the files in
    SET_PHASE_ALLOWED may call set_phase directly."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in SET_PHASE_ALLOWED:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\.set_phase\(", line):
                offenders.append(f"hpc_agent/{rel}:{number}: {line.strip()}")
    assert not offenders, "phase written without Ledger.advance:\n" + "\n".join(offenders)

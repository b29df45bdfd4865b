"""One state machine for a run's life: ``transition(phase, event) -> phase``.

Pure: no I/O, no clock. Every phase change of a run goes through :func:`transition` (``Ledger.advance``, and
the watcher's pure core, ``hpc_agent.watcher.follow``, for the phase it journals). Every edge is listed in ``EDGES``;
an event that has no edge from the current phase is a bug in the caller and raises :class:`InvalidTransition`
instead of being silently ignored. What to *do* on an edge (requeue, expedite, resubmit, notify) is the
follow core's decision: its effects (``hpc_agent.watcher.follow_model.Effect``) are the only effects there are.

    submitting --submitted/found--> pending --started--> running --completed--> completed
        |                             |  ^                  |
        |                             |  '---requeued-------+---ended(recoverable)--> recovering
        '--submit_failed--> stopped   '--ended(final)---> stopped <--gave_up----------'
                                      '--ended(needs_attention), unfollowable--> needs_attention --resumed--> pending
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Dict, Optional, Tuple


class Phase(str, Enum):
    SUBMITTING = "submitting"  # intent recorded, sbatch not (yet) confirmed
    PENDING = "pending"        # a job id exists and it waits in the queue
    RUNNING = "running"
    RECOVERING = "recovering"  # an attempt ended; the decided action is being carried out
    COMPLETED = "completed"    # terminal: training finished
    STOPPED = "stopped"        # terminal: gave up, cancelled, or a code error
    NEEDS_ATTENTION = "needs_attention"  # the watcher could not follow this run (unreadable files, a bug), or
    #                                      the policy parked it (an unknown cause twice at the same step); parked
    #                                      with the reason in its audit trail until a person resumes it


TERMINAL = frozenset({Phase.COMPLETED, Phase.STOPPED})
# Phases the watcher follows every tick (a parked run is neither followed nor finished).
FOLLOWED = frozenset(p for p in Phase if p not in TERMINAL and p is not Phase.NEEDS_ATTENTION)


class EventKind(str, Enum):
    SUBMITTED = "submitted"            # sbatch returned a job id
    FOUND = "found"                    # start-up reconcile: sacct shows a job carrying the run id
    NOT_FOUND = "not_found"            # start-up reconcile: no such job, so the intent never reached Slurm
    SUBMIT_FAILED = "submit_failed"    # sbatch refused (bad partition, ...)
    STARTED = "started"                # sacct: RUNNING
    QUEUED = "queued"                  # sacct: PENDING (e.g. a requeued job waiting again)
    COMPLETED = "completed"            # sacct: COMPLETED
    ENDED = "ended"                    # an attempt ended; ``action`` says what the policy decided
    RECOVERED = "recovered"            # the action took effect (requeued / resubmitted)
    ACTION_FAILED = "action_failed"    # the action's Slurm command failed; retried next tick
    CANCELLED = "cancelled"            # we cancelled it on purpose (a pruned sweep trial): never requeue
    UNFOLLOWABLE = "unfollowable"      # observing or deciding this run failed; park it, follow the others
    RESUMED = "resumed"                # a person cleared needs_attention (``watch --resume-run``)
    HANDED_OVER = "handed_over"        # the job submitted its successor at a preemption: follow that job now


class Action(str, Enum):
    """What the policy decided for an ended attempt."""

    REQUEUE = "requeue"      # same job id: ensure requeued, expedite its start (preempted, timeout)
    RESUBMIT = "resubmit"    # new job with a patched config (OOM ladder, node exclusion, LR rollback)
    STOP = "stop"            # never requeue (code error, cancelled, budget spent)
    ATTENTION = "needs_attention"  # park for a person: ended without a known cause twice at the same step


@dataclass(frozen=True)
class Event:
    kind: EventKind
    job_id: Optional[str] = None
    action: Optional[Action] = None
    detail: Dict[str, object] = field(default_factory=dict)


class InvalidTransition(ValueError):
    pass


# (phase, event kind, action or None) -> next phase. Every legal edge, and nothing else.
EDGES: Dict[Tuple[Phase, EventKind, Optional[Action]], Phase] = {
    (Phase.SUBMITTING, EventKind.SUBMITTED, None): Phase.PENDING,
    (Phase.SUBMITTING, EventKind.FOUND, None): Phase.PENDING,
    (Phase.SUBMITTING, EventKind.NOT_FOUND, None): Phase.SUBMITTING,
    (Phase.SUBMITTING, EventKind.SUBMIT_FAILED, None): Phase.STOPPED,
    (Phase.PENDING, EventKind.STARTED, None): Phase.RUNNING,
    (Phase.PENDING, EventKind.QUEUED, None): Phase.PENDING,
    (Phase.PENDING, EventKind.COMPLETED, None): Phase.COMPLETED,
    (Phase.PENDING, EventKind.ENDED, Action.REQUEUE): Phase.RECOVERING,
    (Phase.PENDING, EventKind.ENDED, Action.RESUBMIT): Phase.RECOVERING,
    (Phase.PENDING, EventKind.ENDED, Action.STOP): Phase.STOPPED,
    (Phase.RUNNING, EventKind.STARTED, None): Phase.RUNNING,
    (Phase.RUNNING, EventKind.QUEUED, None): Phase.PENDING,  # Slurm requeued it by itself
    (Phase.RUNNING, EventKind.COMPLETED, None): Phase.COMPLETED,
    (Phase.RUNNING, EventKind.ENDED, Action.REQUEUE): Phase.RECOVERING,
    (Phase.RUNNING, EventKind.ENDED, Action.RESUBMIT): Phase.RECOVERING,
    (Phase.RUNNING, EventKind.ENDED, Action.STOP): Phase.STOPPED,
    (Phase.RECOVERING, EventKind.RECOVERED, None): Phase.PENDING,
    (Phase.RECOVERING, EventKind.ACTION_FAILED, None): Phase.RECOVERING,
    (Phase.RECOVERING, EventKind.STARTED, None): Phase.RUNNING,  # a requeued job started before we looked
    (Phase.RECOVERING, EventKind.QUEUED, None): Phase.RECOVERING,
    (Phase.RECOVERING, EventKind.ENDED, Action.STOP): Phase.STOPPED,  # e.g. budget spent while retrying
    # The policy parks the run (an unknown cause repeated at the same step): a person looks, then resumes it.
    (Phase.PENDING, EventKind.ENDED, Action.ATTENTION): Phase.NEEDS_ATTENTION,
    (Phase.RUNNING, EventKind.ENDED, Action.ATTENTION): Phase.NEEDS_ATTENTION,
    (Phase.RECOVERING, EventKind.ENDED, Action.ATTENTION): Phase.NEEDS_ATTENTION,
    (Phase.NEEDS_ATTENTION, EventKind.RESUMED, None): Phase.PENDING,  # the next tick looks at sacct afresh
    # The job handed over to a successor job (hpc_agent/core/handback.py): the run follows that job, queued or not yet
    # seen running.
    (Phase.PENDING, EventKind.HANDED_OVER, None): Phase.PENDING,
    (Phase.RUNNING, EventKind.HANDED_OVER, None): Phase.PENDING,
}
# A run whose job id is recorded but whose phase still says submitting (submit died between the two
# writes) is followed like a pending one.
for (_event, _action), _to in list({(k[1], k[2]): v for k, v in EDGES.items() if k[0] is Phase.PENDING}.items()):
    EDGES.setdefault((Phase.SUBMITTING, _event, _action), _to)
EDGES[(Phase.RECOVERING, EventKind.SUBMITTED, None)] = Phase.PENDING  # the resubmission's sbatch answered
for _live in (Phase.SUBMITTING, Phase.PENDING, Phase.RUNNING, Phase.RECOVERING):
    EDGES[(_live, EventKind.CANCELLED, None)] = Phase.STOPPED
    EDGES[(_live, EventKind.UNFOLLOWABLE, None)] = Phase.NEEDS_ATTENTION
EDGES[(Phase.NEEDS_ATTENTION, EventKind.UNFOLLOWABLE, None)] = Phase.NEEDS_ATTENTION
EDGES[(Phase.NEEDS_ATTENTION, EventKind.CANCELLED, None)] = Phase.STOPPED  # e.g. a parked sweep trial pruned


def transition(phase: Phase, event: Event) -> Phase:
    """The next phase, or :class:`InvalidTransition`."""
    key = (phase, event.kind, event.action if event.kind is EventKind.ENDED else None)
    if key not in EDGES:
        raise InvalidTransition(f"no edge from {phase.value} on {event.kind.value}"
                                + (f" ({event.action.value})" if event.action else ""))
    return EDGES[key]

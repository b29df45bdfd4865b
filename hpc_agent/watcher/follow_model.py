"""The values the watcher's pure core works on: the effects (data), a run's state, an observation, an outcome.

``hpc_agent.watcher.follow`` computes with them; ``hpc_agent.state.journal`` stores them; ``hpc_agent.watcher.effects`` carries
the effects out. Plain frozen dataclasses: no I/O here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, Optional, Tuple

from hpc_agent.config.schema import Config
from hpc_agent.core.rundir import LogText
from hpc_agent.metrics.alarm_kinds import Alarm
from hpc_agent.policy.decide import PastAttempt
from hpc_agent.slurm.sacct import Attempt
from hpc_agent.state.lifecycle import Phase


# --- effects: data, carried out by hpc_agent/watcher/effects.py -------------------------------------------------
@dataclass(frozen=True)
class Effect:
    kind: str
    job_id: str = ""
    args: Dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        return {"kind": self.kind, "job_id": self.job_id, "args": self.args}

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "Effect":
        return cls(str(data["kind"]), str(data.get("job_id", "")), dict(data.get("args", {})))


REQUEUE_EFFECT, EXPEDITE, RESUBMIT_EFFECT, EXCLUDE, CANCEL, NOTIFY = (
    "requeue", "expedite", "resubmit", "exclude", "cancel", "notify")
STACKS, AWAIT_END, RELEASE_LEASE = "request_stacks", "await_end", "release_lease"
ADOPT = "adopt"


def Requeue(job_id: str) -> Effect:  # noqa: N802 - effect constructors read like the data they build
    return Effect(REQUEUE_EFFECT, job_id)


def Expedite(job_id: str) -> Effect:  # noqa: N802
    return Effect(EXPEDITE, job_id)


def Resubmit(job_id: str, patch: Dict[str, Any], reason: str, rollback_to_step: Optional[int] = None,
             rollback_before_step: Optional[int] = None) -> Effect:  # noqa: N802
    return Effect(RESUBMIT_EFFECT, job_id, {"patch": dict(patch), "reason": reason, "rollback_to_step": rollback_to_step,
                                            "rollback_before_step": rollback_before_step})


def Exclude(job_id: str, nodes: str, patch: Dict[str, Any]) -> Effect:  # noqa: N802
    return Effect(EXCLUDE, job_id, {"nodes": nodes, "patch": dict(patch)})


def Cancel(job_id: str) -> Effect:  # noqa: N802
    return Effect(CANCEL, job_id)


def Notify(text: str) -> Effect:  # noqa: N802
    return Effect(NOTIFY, "", {"text": text})


def RequestStacks(job_id: str) -> Effect:  # noqa: N802 - ``scancel --signal=URG``: every rank dumps its stacks
    return Effect(STACKS, job_id)


def AwaitEnd(job_id: str) -> Effect:  # noqa: N802 - done once squeue no longer lists the job (processes gone)
    return Effect(AWAIT_END, job_id)


def ReleaseLease(job_id: str) -> Effect:  # noqa: N802 - the ended job's run lease, moved aside if it still holds it
    return Effect(RELEASE_LEASE, job_id)


def Adopt(job_id: str, successor: str) -> Effect:  # noqa: N802 - the run follows ``successor`` from now on
    return Effect(ADOPT, job_id, {"successor": successor})


@dataclass(frozen=True)
class Suspicion:
    """A hang verdict the watcher acted on by asking for stacks (the ledger's ``hang_suspicions`` row)."""

    job_id: str
    attempt: int
    asked_at: float
    stack_marks: Dict[int, Tuple[int, int]] = field(default_factory=dict)
    """rank -> (size, mtime_ns) of its stack file when the stacks were asked: a change is a new dump."""
    verdict: Dict[str, Any] = field(default_factory=dict)
    active: bool = True
    """False: a record that the suspicion was dropped (the job moved on) or decided."""


@dataclass(frozen=True)
class Live:
    """A running attempt's progress, read bounded each tick (``hpc_agent.watcher.observe.read_live``)."""

    now: float
    verdict: Optional[Any] = None
    """``hpc_agent.diagnosis.hang.HangVerdict`` of this attempt's heartbeats, or None: progressing."""
    beats: Tuple[Any, ...] = ()
    stack_marks: Dict[int, Tuple[int, int]] = field(default_factory=dict)
    stacks: Optional[Dict[int, str]] = None
    """rank -> its stack file's tail; read only once the stacks were asked."""
    stack_wait_s: float = 10.0
    acting: bool = True
    """The run's ``watch.enabled``: False leaves a hung job alone (no signal, no cancel)."""


# --- inputs --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunState:
    """What the ledger knows about one run (read by the watcher before the tick)."""

    run_id: str
    phase: Phase
    job_id: str
    history: Tuple[PastAttempt, ...] = ()
    decided: FrozenSet[int] = frozenset()
    """Attempt indexes of ``job_id`` that already have a recorded decision."""
    expedited: FrozenSet[int] = frozenset()
    last_ckpt_step: Optional[int] = None
    """The checkpoint step recorded with the newest decision that had one (progress is measured from it)."""
    attempt_offset: int = 0
    """Attempts of this run's earlier jobs (a run spans several jobs when resubmitted)."""
    last_decision: Optional[Dict[str, Any]] = None
    """The newest recorded decision: ``job_id``, ``attempt``, ``action``, ``decision`` (for a legacy
    ``recovering`` run whose effects were never journaled)."""
    suspicion: Optional[Suspicion] = None
    """The active hang suspicion of ``job_id`` (stacks asked, no decision yet), if any."""
    executor: str = "slurm"
    """Where ``job_id`` runs: ``slurm``, or ``local`` (a process on the submitting machine: no queue, no
    ``scontrol``; a requeue is carried out as a resubmission, see ``follow.local_decision``)."""


@dataclass(frozen=True)
class RunFiles:
    """What the run's files say, read bounded by the watcher; ``problems`` are reasons it cannot be followed."""

    config: Optional[Config] = None
    logs: Tuple[LogText, ...] = ()
    alarms: Tuple[Alarm, ...] = ()
    checkpoint_steps: Tuple[int, ...] = ()
    problems: Tuple[str, ...] = ()
    notes: Tuple[str, ...] = ()
    """Things skipped and reported (a corrupt TensorBoard tail), which do not stop following."""


@dataclass(frozen=True)
class Observation:
    attempts: Tuple[Attempt, ...]
    queue: Optional[str] = None
    """squeue's state for the job ("" not queued, None no answer, NOT_ASKED: ask only if needed)."""
    files: Optional[RunFiles] = None
    live: Optional[Live] = None
    """For a running attempt: its heartbeats' verdict (None when the run's settings or beats were not read)."""
    placement: Any = "?"
    """The partitions' facts for a decision that may move the run (``placement.mode`` auto): a tuple of
    ``slurm.partition_facts.PartitionFacts``, ``()`` when they could not be gathered, NOT_ASKED until asked."""
    successor: Optional[str] = None
    """For an attempt that is no longer running: the job id it handed over to (``hpc_agent.core.handback``), if any."""


NOT_ASKED = "?"


@dataclass(frozen=True)
class Wants:
    queue: bool = False
    files: bool = False
    live: bool = False
    """A running attempt: read its heartbeats (bounded, every tick) and judge them."""
    stacks: bool = False
    """A hang suspicion is open: also read the stack files (and ``files``, to decide)."""


@dataclass(frozen=True)
class Outcome:
    phase: Phase
    effects: Tuple[Effect, ...] = ()
    decision: Optional[Dict[str, Any]] = None
    """A decision row for the ledger (job_id, attempt, cause, action, reason, patch, evidence, ckpt_step, decision)."""
    expedite_attempt: Optional[int] = None
    audit: Tuple[Dict[str, Any], ...] = ()
    lines: Tuple[str, ...] = ()
    ask_queue: bool = False
    """Call again with squeue's word: the decision acts only on a job Slurm no longer queues."""
    ask_placement: Optional[Dict[str, Any]] = None
    """Call again with the partitions' facts, gathered for the run's config with this ``slurm.*`` patch applied
    (e.g. the failed node excluded): the decision may move the run (``placement.mode`` auto)."""
    wait_note: Optional[int] = None
    """An attempt index deferred while Slurm still queues the job (said once per attempt by the watcher)."""
    suspect: Optional[Suspicion] = None
    """A hang suspicion to store (asked) or to close (``active`` False), in the decision's transaction."""

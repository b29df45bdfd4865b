"""In-job recovery: repair a GPU OOM or a divergence inside the allocation, without a Slurm round trip.

What is repaired (``resilience.in_job_retries`` repairs per attempt in total; 0 turns it off):

- a ``torch.OutOfMemoryError`` in a training forward pass (a real one, or ``faults.oom_above_micro_batch``
  / ``faults.oom_at_step``): the next rung of THE OOM ladder (``hpc_agent.policy.memory`` through
  ``policy.decide.repair_rule``: the global batch is kept); the state before the failed step, still intact, is
  saved as a checkpoint, then the engine is rebuilt and loads it (no step is trained twice);
- a non-finite loss, an FP16 loss-scale collapse or a loss spike, as THE divergence detector
  (``hpc_agent.metrics.divergence.detect``) reports them: the watcher's rollback and LR cut
  (``policy.decide.repair_rule``): checkpoints from the divergence on are set aside like the watcher's
  rollback does (``hpc_agent.core.checkpoint_format.set_aside_after``) and the engine restarts from the one before.

Agreement: every rank must take the same branch at the same point. The loss is all-reduced before it is
judged, so a divergence is seen everywhere alike. An OOM may hit one rank only, so each rank's "my forward
failed" bit rides on the per-micro-step signal all-reduce, which now runs right *after* the forward
(:func:`agree`): no extra collective. Not covered (the job exits as before, and the watcher repairs it):
an OOM inside a collective or in ``backward``/``step`` (its peers are inside gradient reductions by then,
and an OOM in an NCCL call can wedge the communicator), or an OOM under ZeRO-3 in a forward, whose
parameter gathers are collectives.

When the budget is spent the job exits with the cause's exit code as before (OOM 3, NaN 65:
``hpc_agent/core/exit_codes.py``); a spike or a loss-scale collapse then is only logged, as before. Each repair
appends a line to the run's in-job journal (rank 0, fsynced; format: ``hpc_agent.core.in_job_journal``) and goes into
the run's ``config.yaml`` (:func:`carry_into_config`), which every later job of the run loads (a
hand-over successor, a watcher resubmission); a later attempt of the *same Slurm job* (a requeue) also starts with the patches its earlier
attempts recorded in the journal, so it does not run out of memory again even when that write failed.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from hpc_agent.core import checkpoint_format, in_job_journal, rundir
from hpc_agent.core.causes import Cause
from hpc_agent.core.exit_codes import EXIT_DIVERGED, EXIT_OK, EXIT_OUT_OF_MEMORY
from hpc_agent.metrics.alarm_kinds import LOSS_SCALE_COLLAPSE, LOSS_SPIKE, NAN_LOSS
from hpc_agent.metrics.divergence import detect, newest_loss_may_alarm
from hpc_agent.policy.adaptive_lr import adaptation_reason

REPAIR, EXIT, CONTINUE = "repair", "exit", "continue"
FAILED_BIT = 1 << 16  # above every signal number
HISTORY = 200  # loss points kept for the detector
WINDOW = 50  # the detector's trailing window
JUDGED_EACH_STEP = 10
"""Loss points judged at each step, after their ``WINDOW`` points of context. A point's trailing window never
changes once it is logged, and every older point was judged at its own step, so judging the newest few (at least
the detector's ``spike_patience``, 2) finds the same new alarm as judging the whole history: at ~0.2 ms a step
instead of ~3.7 ms (200 points), which was 3 % of a 0.12 s step outside the step's own time (P2's ETTR)."""
JUDGED_KINDS = (NAN_LOSS, LOSS_SPIKE, LOSS_SCALE_COLLAPSE)
SPIKE_REL_FLOOR = 0.05
"""The detector's noise floor as a fraction of the trailing median when the job acts on a spike (its default,
1e-3, is for review's markers). A rollback costs the steps since the checkpoint, so a spike must rise at least
z_threshold x 5 % = 30 % above the trailing median: measured on the small CPU GPT at lr 1e-3, the default floor
called ordinary noise of a very smooth loss a spike and rolled a healthy run back twice."""
_EXIT_CODES = {Cause.GPU_OOM.value: EXIT_OUT_OF_MEMORY, Cause.DIVERGED.value: EXIT_DIVERGED}


# --- pure: agreement, faults, plans -------------------------------------------------------------------
def agree(stop: Any, max_int: Callable[[int], int], failed: bool) -> Tuple[bool, int]:
    """One max all-reduce of (failed bit | signal number): (some rank failed, the agreed signal). When a rank
    failed, a signal that only a healthy rank holds shows at the next micro-step's agreement."""
    seen: List[bool] = []

    def reduce(signum: int) -> int:
        value = max_int((FAILED_BIT if failed else 0) | int(signum))
        seen.append(bool(value & FAILED_BIT))
        return value & (FAILED_BIT - 1)

    signum = stop.agreed(reduce)
    return seen[0], signum


@dataclass(frozen=True)
class Fault:
    cause: str
    step: int
    """The step being trained when it happened (1-based)."""
    kind: str
    """``gpu_oom``, or the detector's alarm kind."""
    detail: str
    divergence_step: Optional[int] = None
    capacity_bytes: Optional[int] = None


@dataclass(frozen=True)
class Plan:
    action: str  # REPAIR, EXIT or CONTINUE
    cause: str
    reason: str
    patch: Dict[str, Any] = field(default_factory=dict)
    rollback_to_step: Optional[int] = None
    exit_code: int = EXIT_OK


def divergence_fault(losses: Sequence[Tuple[int, float]], scales: Sequence[Tuple[int, float]], step: int,
                     min_loss_scale: float, judge_trends: bool, cut: bool = False) -> Optional[Fault]:
    """The detector's verdict on the loss (and FP16 loss-scale) history: a non-finite loss always, a spike
    or a scale collapse only when ``judge_trends`` (in-job repairs are on). ``cut``: older points were dropped
    from ``losses``, so its first ``WINDOW`` points are context only (``detect``'s ``context_points``): judged
    on the rest of their window, one in every few hundred steps of a noisy but healthy loss looked like a spike
    (measured on the classifier at 1:50 imbalance: 10 false rollbacks in 20 runs of 1500 steps)."""
    kinds = JUDGED_KINDS if judge_trends else (NAN_LOSS,)
    for alarm in detect(losses, loss_scale=scales, min_loss_scale=min_loss_scale, rel_floor=SPIKE_REL_FLOOR,
                        window=WINDOW, context_points=WINDOW if cut else 0):
        if alarm.kind in kinds:
            return Fault(Cause.DIVERGED.value, step, alarm.kind, alarm.detail, alarm.step)
    return None


def plan(fault: Fault, cfg: Any, budget_left: int, budget: int, checkpoint_steps: Sequence[int] = ()) -> Plan:
    """What to do about ``fault``: the policy's rule when the budget allows and the patch is one the job can
    apply in place (``train.*``); else exit with the cause's code (or, for a trend, carry on as before)."""
    from hpc_agent.policy.decide import RESUBMIT, Situation, repair_rule

    fatal = fault.cause == Cause.GPU_OOM.value or fault.kind == NAN_LOSS
    give_up = EXIT if fatal else CONTINUE
    code = _EXIT_CODES[fault.cause] if fatal else EXIT_OK
    if budget_left <= 0:
        why = "in-job recovery is off" if budget <= 0 else f"in-job budget spent ({budget} of {budget})"
        return Plan(give_up, fault.cause, f"{why} (resilience.in_job_retries)", exit_code=code)
    if fault.cause == Cause.GPU_OOM.value and getattr(getattr(cfg, "placement", None), "mode", "off") == "auto":
        # Only the watcher sees the other partitions: it weighs a bigger GPU against the next rung here.
        return Plan(EXIT, fault.cause, "not repaired in the job: placement.mode is auto, so the watcher weighs a "
                                       "partition with bigger GPUs against the next rung of the OOM ladder",
                    exit_code=code)
    decision = repair_rule(fault.cause, cfg, Situation(checkpoint_steps=tuple(checkpoint_steps),
                                                       divergence_step=fault.divergence_step,
                                                       gpu_capacity_bytes=fault.capacity_bytes))
    outside = sorted(k for k in decision.patch if not k.startswith("train."))
    if decision.action != RESUBMIT or outside:
        why = f"needs {', '.join(outside)} (a new job)" if outside else decision.reason
        return Plan(give_up, fault.cause, f"not repairable in the job: {why}", exit_code=code)
    return Plan(REPAIR, fault.cause, decision.reason, dict(decision.patch), decision.rollback_to_step)


def carried_patch(decisions: Sequence[in_job_journal.InJobDecision], job_id: str, attempt: int) -> Dict[str, Any]:
    """The patches earlier attempts of this same job recorded, merged in order (a requeue keeps them)."""
    merged: Dict[str, Any] = {}
    for d in sorted(decisions, key=lambda d: d.seq):
        if d.job_id == job_id and d.attempt < attempt:
            merged.update(d.patch)
    return merged


def own_job_id(environ=os.environ) -> str:
    from launch.signals import own_job_id as slurm_job_id

    return slurm_job_id(environ) or "local"


# --- the job's side -------------------------------------------------------------------------------------
class InJobRecovery:
    """Budget, loss history and journal of one attempt. Reads and writes happen on rank 0; what every rank
    must agree on is broadcast (``coll``)."""

    def __init__(self, cfg: Any, run_dir: Path, rank: int, attempt: int, coll: Any, say: Callable[[str], None]):
        self.run_dir, self.rank, self.attempt, self.coll, self.say = Path(run_dir), rank, attempt, coll, say
        self.budget = int(cfg.resilience.in_job_retries)
        self.left = self.budget
        self.job_id = own_job_id()
        self.losses: List[Tuple[int, float]] = []
        self.scales: List[Tuple[int, float]] = []
        self.cut = False  # older loss points were dropped (HISTORY)
        earlier = in_job_journal.read(self.run_dir) if rank == 0 else ([], [])
        for problem in earlier[1]:
            say(f"in-job journal: skipped {problem}")
        self.seq = max((d.seq for d in earlier[0]), default=0)
        self.carried = coll.broadcast_object(carried_patch(earlier[0], self.job_id, attempt) if rank == 0 else None)

    def observe(self, step: int, loss: float, scale: Optional[float], min_loss_scale: float) -> Optional[Fault]:
        self.losses.append((step, loss))
        if len(self.losses) > HISTORY:
            self.losses, self.cut = self.losses[-HISTORY:], True
        if scale is not None:
            self.scales = (self.scales + [(step, scale)])[-HISTORY:]
        if not self.scales and not newest_loss_may_alarm([v for _, v in self.losses[-(WINDOW + 1):]],
                                                         window=WINDOW, rel_floor=SPIKE_REL_FLOOR):
            return None  # the full detector would find nothing new (FP16's loss scale always goes through it)
        losses, cut = self.losses, self.cut
        if len(losses) > WINDOW + JUDGED_EACH_STEP:  # only the newest points can start a new alarm
            losses, cut = losses[-(WINDOW + JUDGED_EACH_STEP):], True
        return divergence_fault(losses, self.scales, step, min_loss_scale, judge_trends=self.left > 0, cut=cut)

    def oom_fault(self, step: int, message: str) -> Fault:
        """Every rank reaches this after :func:`agree`: the failing ranks' messages are gathered, so every
        rank decides on the same text (CUDA's states the GPU's capacity, which the ladder uses)."""
        from hpc_agent.diagnosis.logscan import gpu_capacity_bytes

        texts = [t for t in self.coll.gather_objects(message) if t]
        return Fault(Cause.GPU_OOM.value, step, "gpu_oom", texts[0] if texts else "out of memory",
                     capacity_bytes=gpu_capacity_bytes(texts))

    def decide(self, fault: Fault, cfg: Any) -> Plan:
        steps = checkpoint_format.complete_steps(self.run_dir) if self.rank == 0 and fault.cause == "diverged" else []
        return plan(fault, cfg, self.left, self.budget, self.coll.broadcast_object(steps))

    def record(self, fault: Fault, p: Plan, cfg: Any) -> None:
        """Spend one repair; rank 0 appends the journal line (fsynced) and sets rolled-back checkpoints aside."""
        self.left -= 1
        if self.rank == 0:
            self.seq += 1
            before = {k: getattr(cfg.train, k.split(".", 1)[1], None) for k in p.patch}
            line = in_job_journal.encode(in_job_journal.InJobDecision(
                self.seq, self.job_id, self.attempt, fault.step, fault.cause, in_job_journal.ACTION, dict(p.patch),
                p.rollback_to_step, (fault.detail[:in_job_journal.MAX_TEXT],), time.time(), self.left, p.reason[:in_job_journal.MAX_TEXT],
                before))
            _append_synced(rundir.in_job_journal_path(self.run_dir), line)
            try:
                self.say(f"in-job repair settings {carry_into_config(self.run_dir, p.patch)}")
            except Exception as exc:  # noqa: BLE001 - the repair itself stands; a requeue still reads the journal
                self.say(f"in-job repair settings not carried into {rundir.CONFIG}: {type(exc).__name__}: {exc}")
            if fault.cause == Cause.DIVERGED.value:
                moved = checkpoint_format.set_aside_after(self.run_dir, p.rollback_to_step, fault.divergence_step)
                if moved:
                    self.say(f"rollback: set aside {', '.join(moved)}")
        self.coll.barrier()

    def record_adaptation(self, adaptation: Any) -> None:
        """Rank 0: one journal line (fsynced) for an adaptation of the LR schedule (``hpc_agent.policy.adaptive_lr``);
        no repair budget is spent. The evidence is its ``[step, value]`` window (the first point and the
        last ones, when longer than the journal allows)."""
        if self.rank != 0:
            return
        import json

        pairs = adaptation.to_dict()["evidence"]
        if len(pairs) > in_job_journal.MAX_EVIDENCE:
            pairs = pairs[:1] + pairs[-(in_job_journal.MAX_EVIDENCE - 1):]
        self.seq += 1
        line = in_job_journal.encode(in_job_journal.InJobDecision(
            self.seq, self.job_id, self.attempt, adaptation.step, in_job_journal.ADAPT_CAUSE, in_job_journal.ADAPT_ACTION, {}, None,
            tuple(json.dumps(p) for p in pairs), time.time(), self.left,
            adaptation_reason(adaptation.kind, adaptation.reason)))
        _append_synced(rundir.in_job_journal_path(self.run_dir), line)

    def restarted_at(self, step: int, tb: Any) -> None:
        """After the reload: forget the rolled-back history, and make TensorBoard drop what it logged past
        ``step`` (a SessionLog START, as a resumed attempt's ``purge_step`` does)."""
        self.losses = [p for p in self.losses if p[0] <= step]
        self.scales = [p for p in self.scales if p[0] <= step]
        if tb is None:
            return
        tb.restart_at(step + 1)


def _append_synced(path: Path, line: str) -> None:
    from hpc_agent.core.filemodes import make_dir, open_created

    make_dir(path.parent)
    fd = open_created(path, os.O_WRONLY | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0))
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def repair_in_place(tr: Any, fault: Fault, loss: Optional[float] = None) -> Any:
    """Decide on ``fault`` (every rank alike) and repair trainer ``tr`` (launch/engine.py) in place: None
    (repaired: train on from ``tr.step``), CONTINUE (not repaired, carry on as before) or an exit code."""
    from launch import heartbeat

    p = tr.recovery.decide(fault, tr.cfg)
    first = tr.rank == 0
    if p.action == CONTINUE:
        if first:
            tr.recovery.say(f"{fault.kind} at step {fault.step} ({fault.detail}); not repaired: {p.reason}")
        return CONTINUE
    if p.action == EXIT:
        if fault.cause == Cause.GPU_OOM.value:  # the line log diagnosis and the tests know, on every rank
            tr.recovery.say(f"not repaired in the job: {p.reason}")
            tr.recovery.say(f"out of memory at step {fault.step} during training (micro_batch_size "
                            f"{tr.t.micro_batch_size}, ZeRO-{tr.t.zero_stage}); exiting {p.exit_code}")
        else:
            tr.tb.scalars({"train/loss": loss}, fault.step)
            tr.recovery.say(f"diverged: loss is {loss} at step {fault.step}; no checkpoint written; exiting "
                            f"{p.exit_code}")
        return p.exit_code
    budget = tr.recovery.budget
    # On every rank: log diagnosis reads what follows the last such line as the attempt's end (a rank's own
    # OOM traceback before it was repaired here; hpc_agent/diagnosis/logscan.py since_last_repair).
    tr.recovery.say(f"in-job repair {budget - tr.recovery.left + 1} of {budget}: {fault.kind} at step "
                    f"{fault.step}: {p.reason}")
    tr.recovery.record(fault, p, tr.cfg)
    if fault.cause == Cause.GPU_OOM.value and tr.step > 0:
        # An OOM is repaired only when caught in a forward, before this step's update: the engine still holds
        # the state of step tr.step, intact. Saved now, the rebuilt engine resumes from it and trains no step
        # twice (from the newest checkpoint it redid half a checkpoint interval on average, at the cost of a
        # save that is a small part of an interval's training).
        _free_memory(tr.on_cuda)
        tr._save()
    tr.snapshots.settle()
    tr.engine.destroy()  # frees DeepSpeed's hooks and buffers before the new engine allocates its own
    tr.engine = tr.workload = None
    _free_memory(tr.on_cuda)
    tr._configure(tr.cfg, p.patch)
    code = tr._build()
    tr.recovery.restarted_at(tr.step, tr.tb)
    heartbeat.current().phase("training")
    return None if code == EXIT_OK else code


def _free_memory(on_cuda: bool) -> None:
    import gc

    gc.collect()
    if on_cuda:
        import torch

        torch.cuda.empty_cache()


def adopt_configured_lr(engine: Any, lr: float) -> bool:
    """After a checkpoint load: the configured ``train.lr`` wins over the one the checkpoint's LR scheduler
    and optimizer saved (a divergence rollback lowers it, in the job or through the watcher's resubmission).
    True when it changed anything."""
    sched = getattr(engine, "lr_scheduler", None)
    base = getattr(sched, "base_lrs", None)
    if not base or all(b == lr for b in base):
        return False
    sched.base_lrs = [lr for _ in base]
    for group, value in zip(sched.optimizer.param_groups, sched.get_lr()):
        group["initial_lr"], group["lr"] = lr, value
    return True


def carry_into_config(run_dir: Path, patch: Dict[str, Any]) -> str:
    """Apply ``patch`` to the run's ``config.yaml`` (validated again, written atomically), so every later attempt
    starts with it; returns what was done, for the job's log. A run directory without one (a job started by hand
    on a config elsewhere) keeps the patch in the journal only: its own config file is not the job's to change.
    Raises OSError or ConfigError; the caller says so and trains on.

    Every later attempt of the run loads that file: a requeue, the successor a preempted job submits of itself,
    and the watcher's resubmission (which patches that file). Without it the next job started from the submitted
    settings again, ran out of memory again or diverged again at the old learning rate (P2 run 13: the successor
    of a preempted job trained at ``micro_batch_size`` 8 again after the job's repair to 4; the watcher's
    resubmission after a host OOM at ``lr`` 1e-3 again after the job's cut to 5e-4)."""
    from hpc_agent.config.load import apply_patch, load_run_config, write_run_config

    path = rundir.config_path(run_dir)
    if not patch:
        return "nothing to carry"
    if not os.path.lexists(path):
        return f"not carried into {path.name}: the run directory has none (the journal keeps it)"
    write_run_config(run_dir, apply_patch(load_run_config(run_dir), patch))  # load_run_config refuses a link
    return f"carried into {path.name} for later attempts"

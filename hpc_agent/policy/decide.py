"""What to do about an attempt's end: (cause, history, config) -> decision + config patch. Pure.

A *patch* is ``{dotted.key: new value}`` (``{"train.micro_batch_size": 4, "train.grad_accum_steps": 2}``);
``config.load.apply_patch`` turns it into a new, validated :class:`Config`, and the same dict can be written as
``key=value`` overrides. Actions:

- ``wait``: nothing ended (running, pending, unknown: a silent sacct is never a reason to act);
- ``done``: completed;
- ``requeue``: run the same job again from the newest checkpoint, config unchanged (``scontrol requeue``
  if Slurm did not requeue it already); ``expedite`` asks for ``scontrol update JobId=N StartTime=now``,
  because a requeued job otherwise waits 121 s before it may start;
- ``resubmit``: a new job with the patched config (node exclusions, memory, batch ladder, LR), resuming
  from the newest checkpoint or from ``rollback_to_step``;
- ``stop``: give up and report (code errors, cancellations, exhausted budgets, no progress);
- ``needs_attention``: park the run for a person (an attempt that ended without a known cause, a second
  time at the same checkpoint step): the watcher moves it to the lifecycle phase ``needs_attention`` with the
  evidence and the hypotheses; ``watch --resume-run`` requeues it from there.

Budgets: a retry budget per cause and an overall one (``watch.max_retries``). Preemptions are free (not
the run's fault), and so are timeouts that saved a newer checkpoint (a long run needs many). The
no-progress guard stops a run whose last two attempts (preemptions aside) wrote no new checkpoint while
nothing was changed between them: repeating the same thing a third time will not help.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from hpc_agent.config.schema import Config
from hpc_agent.core.causes import Cause
from hpc_agent.policy.env_fix import env_fix
from hpc_agent.policy.memory import GPU_HEADROOM, gpu_oom_fit
from hpc_agent.policy.partitions import weigh_partitions
from hpc_agent.slurm.hostlist import expand_hostlist

WAIT, DONE, REQUEUE, RESUBMIT, STOP = "wait", "done", "requeue", "resubmit", "stop"
ATTENTION = "needs_attention"
ACTIONS = (WAIT, DONE, REQUEUE, RESUBMIT, STOP, ATTENTION)

DEFAULT_PER_CAUSE: Mapping[str, Optional[int]] = {
    "preempted": None,  # None: unlimited
    "timeout": None,    # unlimited while it progresses; the no-progress guard catches hangs
    "node_fail": 3, "gpu_hw_error": 3, "nccl_error": 3, "host_oom": 3, "shm_exhausted": 3, "diverged": 3,
    "unknown": 3,       # an ended attempt without a known cause; a repeat at the same step parks the run (_unknown)
    "gpu_oom": 12,      # the ladder itself ends: log2(micro_batch_size) + at most 6 rungs
    "hung": 3,          # and a repeat at the same step in the same frame stops at once (_rule)
}


@dataclass(frozen=True)
class PastAttempt:
    """One earlier attempt of the run, as the ledger remembers it (oldest first in ``history``)."""

    job_id: str
    cause: str
    action: str = ""
    """What was decided after it ("" if nothing was, e.g. Slurm requeued it on its own)."""
    patch: Mapping[str, Any] = field(default_factory=dict)
    """The config patch applied for the *next* attempt."""
    made_progress: Optional[bool] = None
    """A newer complete checkpoint exists after this attempt; None when unknown."""
    hang: Optional[Tuple[Optional[int], str]] = None
    """For a ``hung`` attempt: (the step it hung at, the stack signature of its stuck ranks)."""
    step: Optional[int] = None
    """The step its retry resumed from: the newest complete checkpoint when it was decided (the ledger's
    ``ckpt_step``); None: no checkpoint yet."""


@dataclass(frozen=True)
class Situation:
    """Facts about the attempt being decided on, beyond its cause."""

    job_id: str = ""
    made_progress: Optional[bool] = None
    checkpoint_steps: Tuple[int, ...] = ()
    """Steps of the complete checkpoints on disk (for a divergence rollback)."""
    nodes: Tuple[str, ...] = ()
    bad_nodes: Tuple[str, ...] = ()
    divergence_step: Optional[int] = None
    gpu_capacity_bytes: Optional[int] = None
    """The GPU's total memory, when the out-of-memory message states it (CUDA's does)."""
    requeued_after: Optional[str] = None
    """For a pending attempt: the cause after which Slurm requeued the job itself (e.g. preempted)."""
    hang: Optional[Tuple[Optional[int], str]] = None
    """For a hung attempt: (step, stack signature); ``top_frame`` names the majority's innermost frame."""
    top_frame: str = ""
    placement: Optional[Tuple[Any, ...]] = None
    """With ``placement.mode`` auto: the partitions' facts (``slurm.partition_facts.PartitionFacts``), gathered by the
    watcher for a decision that could move the run (a GPU OOM, a node or GPU fault); None: not gathered."""
    remaining_steps: Optional[int] = None
    """Steps left after the newest complete checkpoint (for the placement's time estimate)."""
    ended: bool = False
    """The attempt is over (``Diagnosis.ended``): an ``unknown`` cause then means "no positive evidence for any
    cause" (requeue once, then park), not an unknown state (wait)."""
    evidence: Tuple[str, ...] = ()
    """The diagnosis' evidence lines (for ``env_error``: the line that names the fix, :func:`env_fix`)."""
    hypotheses: Tuple[str, ...] = ()
    """For an ``unknown`` cause of an ended attempt: the classifier's best guesses, most likely first."""

    @property
    def resume_step(self) -> Optional[int]:
        """The step a retry resumes from: the newest complete checkpoint; None: none yet (start over)."""
        return max(self.checkpoint_steps) if self.checkpoint_steps else None


@dataclass(frozen=True)
class PolicyLimits:
    per_cause: Mapping[str, Optional[int]] = field(default_factory=lambda: dict(DEFAULT_PER_CAUSE))
    max_mem_mb: Optional[int] = None
    """The most ``--mem`` the partition allows (MaxMemPerNode, or the nodes' RealMemory); None: unknown."""
    mem_factor: float = 1.5
    lr_factor: float = 0.5
    no_progress_attempts: int = 2
    gpu_headroom: float = GPU_HEADROOM
    """Share of the GPU's capacity an OOM-ladder rung's estimate may use: the estimate leaves out the CUDA
    context, temporary buffers and fragmentation."""


@dataclass(frozen=True)
class Decision:
    action: str
    cause: str
    reason: str
    patch: Dict[str, Any] = field(default_factory=dict)
    expedite: bool = False
    rollback_to_step: Optional[int] = None
    """Resume from this checkpoint instead of the newest (divergence); None: the newest."""
    rollback_before_step: Optional[int] = None
    """The divergence step: resume from a checkpoint older than this one."""
    needs_universal_checkpoint: bool = False
    """The patch changes the ZeRO stage, so the checkpoint may need a universal conversion to load
    (informational: launch/ converts by itself when it must, see docs/exit_codes.md)."""
    free: bool = False
    """Does not count against the overall retry budget."""
    placement: Optional[Dict[str, Any]] = None
    """The candidate table and the reason, when partitions were weighed (``partitions.Choice.to_dict``)."""
    hypotheses: Tuple[str, ...] = ()
    """For ``needs_attention`` after an unknown cause: the classifier's hypotheses, for the person who looks."""

    def to_dict(self) -> Dict[str, Any]:
        out = {"action": self.action, "cause": self.cause, "reason": self.reason, "patch": dict(self.patch),
               "expedite": self.expedite, "rollback_to_step": self.rollback_to_step,
               "rollback_before_step": self.rollback_before_step,
               "needs_universal_checkpoint": self.needs_universal_checkpoint, "free": self.free}
        if self.placement is not None:
            out["placement"] = self.placement
        if self.hypotheses:
            out["hypotheses"] = list(self.hypotheses)
        return out


# --- helpers ----------------------------------------------------------------------------------------
_MEM_UNITS = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


def parse_mem_mb(mem: Optional[str]) -> Optional[int]:
    """Slurm ``--mem`` to MB: ``4G`` -> 4096, ``16000M`` -> 16000, ``4000`` -> 4000 (MB is the default unit)."""
    m = re.match(r"^\s*(\d+)\s*([KMGT]?)B?\s*$", str(mem or ""), re.I)
    if not m:
        return None
    return math.ceil(int(m.group(1)) * _MEM_UNITS[(m.group(2) or "M").upper()])


def format_mem(mb: int) -> str:
    return f"{mb // 1024}G" if mb % 1024 == 0 else f"{mb}M"


def merge_exclude(existing: Optional[str], nodes: Sequence[str]) -> Optional[str]:
    """``slurm.exclude`` plus ``nodes``, without duplicates (a ``node[1-3]`` already there is expanded)."""
    merged = dict.fromkeys(expand_hostlist(existing or "") + [n for n in nodes if n])
    return ",".join(merged) or None


def _host_oom_fix(cfg: Config, limits: PolicyLimits, offload_allowed: bool) -> Optional[Tuple[Dict[str, Any], str]]:
    current = parse_mem_mb(cfg.slurm.mem)
    cap = limits.max_mem_mb
    if current is None and cap is not None:
        return {"slurm.mem": format_mem(cap)}, f"--mem was the partition default; ask for the maximum {format_mem(cap)}"
    if current is not None and (cap is None or current < cap):
        wanted = math.ceil(current * limits.mem_factor)
        if wanted % 1024 and wanted > 1024:
            wanted = math.ceil(wanted / 1024) * 1024  # whole GB read better and cost nothing
        new = min(wanted, cap) if cap is not None else wanted
        return {"slurm.mem": format_mem(new)}, f"--mem {cfg.slurm.mem} -> {format_mem(new)}"
    if offload_allowed and cfg.train.offload != "none":
        less = "optimizer" if cfg.train.offload == "optimizer+params" else "none"
        return {"train.offload": less}, f"offload less to CPU memory: train.offload {cfg.train.offload} -> {less}"
    return None


def _rollback(situation: Situation) -> Optional[int]:
    steps = sorted(situation.checkpoint_steps)
    if situation.divergence_step is not None:
        before = [s for s in steps if s < situation.divergence_step]
        return before[-1] if before else (0 if steps else None)  # 0: no checkpoint before it, start over
    # Unknown divergence step: the newest checkpoint may already hold the bad weights; go one back.
    return steps[-2] if len(steps) >= 2 else None


def _no_progress_streak(history: Sequence[PastAttempt], cause: str, situation: Situation) -> int:
    """Attempts at the end of the run that wrote no new checkpoint with an unchanged config."""
    entries = [(h.cause, h.made_progress, bool(history[i - 1].patch) if i else False) for i, h in enumerate(history)]
    entries.append((cause, situation.made_progress, bool(history[-1].patch) if history else False))
    streak = 0
    for past_cause, progress, started_by_patch in reversed(entries):
        if past_cause == Cause.PREEMPTED:
            continue
        if progress is not False:  # progress, or unknown: do not guess a hang
            break
        streak += 1
        if started_by_patch:
            break
    return streak


def _costs(h: PastAttempt) -> bool:
    free = h.cause == Cause.PREEMPTED or (h.cause == Cause.TIMEOUT and h.made_progress is True)
    return h.action in (REQUEUE, RESUBMIT) and not free


# --- the policy -------------------------------------------------------------------------------------
def _rule(cause: Cause, history: Sequence[PastAttempt], cfg: Config, situation: Situation,
          limits: PolicyLimits) -> Decision:
    """What the cause alone calls for, before budgets."""
    c = cause.value
    past = {h.cause for h in history}
    if cause == Cause.PREEMPTED:
        return Decision(REQUEUE, c, "preempted: requeue and resume from the newest checkpoint",
                        expedite=True, free=True)
    if cause == Cause.TIMEOUT:
        return Decision(REQUEUE, c, "time limit reached: resume from the newest checkpoint", expedite=True,
                        free=situation.made_progress is True)
    if cause in (Cause.NODE_FAIL, Cause.GPU_HW_ERROR):
        nodes = list(situation.bad_nodes) or (list(situation.nodes) if len(situation.nodes) == 1 else [])
        if not nodes:
            return Decision(REQUEUE, c, f"{c} on an unnamed node: requeue (Slurm drains failed nodes)", expedite=True)
        exclude = merge_exclude(cfg.slurm.exclude, nodes)
        return weigh_partitions(
            Decision(RESUBMIT, c, f"{c} on {','.join(nodes)}: resubmit excluding it (slurm.exclude={exclude})",
                     {"slurm.exclude": exclude}), cfg, situation, limits, oom=False)
    if cause == Cause.NCCL_ERROR:
        if Cause.NCCL_ERROR not in past:
            return Decision(REQUEUE, c, "first collective failure: resume once (often transient)", expedite=True)
        if not situation.bad_nodes:
            return Decision(STOP, c, "collective communication failed again and no log line names a node: "
                                     "check the interconnect (NCCL_DEBUG=INFO) before resubmitting")
        exclude = merge_exclude(cfg.slurm.exclude, situation.bad_nodes)
        return Decision(RESUBMIT, c, f"collective failed again: exclude the nodes involved (slurm.exclude={exclude})",
                        {"slurm.exclude": exclude})
    if cause == Cause.GPU_OOM:
        ranks = cfg.slurm.nodes * cfg.slurm.tasks_per_node
        rung = gpu_oom_fit(cfg, ranks, Cause.HOST_OOM not in past, situation.gpu_capacity_bytes,
                           limits.gpu_headroom)
        if rung is None:
            return Decision(STOP, c, "GPU out of memory with micro_batch_size=1, activation checkpointing, "
                                     f"ZeRO-{cfg.train.zero_stage} and offload={cfg.train.offload}: nothing left to "
                                     "trade; shrink the model (model.*) or use more or larger GPUs")
        patch, what = rung
        ladder = Decision(RESUBMIT, c, f"GPU out of memory: {what}", patch,
                          needs_universal_checkpoint="train.zero_stage" in patch
                          and patch["train.zero_stage"] != cfg.train.zero_stage)
        return weigh_partitions(ladder, cfg, situation, limits, oom=True)
    if cause == Cause.HOST_OOM:
        fix = _host_oom_fix(cfg, limits, offload_allowed=Cause.GPU_OOM not in past)
        if fix is None:
            return Decision(STOP, c, f"host out of memory at --mem {cfg.slurm.mem} (the most the partition allows) "
                                     "and nothing offloaded: lower train.micro_batch_size or use nodes with more memory")
        patch, what = fix
        return Decision(RESUBMIT, c, f"host out of memory: {what}", patch)
    if cause == Cause.SHM_EXHAUSTED:
        return _shm_exhausted(cfg, limits)
    if cause == Cause.UNKNOWN:
        return _unknown(history, situation)
    if cause == Cause.HUNG:
        return _hung(history, cfg, situation)
    if cause == Cause.DIVERGED:
        lr = cfg.train.lr * limits.lr_factor
        step = _rollback(situation)
        where = f"checkpoint of step {step}" if step is not None else (
            f"the last checkpoint before step {situation.divergence_step}" if situation.divergence_step is not None
            else "the last checkpoint before the divergence")
        return Decision(RESUBMIT, c, f"training diverged: roll back to {where}, train.lr {cfg.train.lr:g} -> {lr:g}",
                        {"train.lr": lr}, rollback_to_step=step, rollback_before_step=situation.divergence_step)
    raise ValueError(f"no rule for cause {c!r}")


def _hung(history: Sequence[PastAttempt], cfg: Config, situation: Situation) -> Decision:
    """Cancel and resubmit from the newest checkpoint, excluding the nodes the evidence names (``bad_nodes``);
    the same hang twice (same step, same stacks) is a bug in the job, not the cluster: stop."""
    c = Cause.HUNG.value
    step = situation.hang[0] if situation.hang else None
    where = f"step {step}" if step is not None else "start-up"
    if situation.hang is not None and any(h.cause == c and h.hang == situation.hang for h in history):
        return Decision(STOP, c, f"hangs at {where} in {situation.top_frame or 'the same frame'} twice: a bug, not "
                                 "the cluster (code_error-like); fix it, then resubmit")
    if situation.bad_nodes:
        exclude = merge_exclude(cfg.slurm.exclude, situation.bad_nodes)
        return Decision(RESUBMIT, c, f"hung at {where}; the evidence points at {','.join(situation.bad_nodes)}: "
                                     f"cancel and resubmit from the newest checkpoint excluding it "
                                     f"(slurm.exclude={exclude})", {"slurm.exclude": exclude})
    return Decision(RESUBMIT, c, f"hung at {where}: cancel and resubmit from the newest checkpoint")


def _shm_exhausted(cfg: Config, limits: PolicyLimits) -> Decision:
    """A full /dev/shm: halve the data-loader workers (they pass batches through it), down to 0; with none left,
    more ``--mem`` (shared memory counts against the job's cgroup memory), as for a host OOM. In a container the
    same holds: pyxis (enroot's default mounts) and ``apptainer exec`` both bind the node's own /dev/shm, and
    neither has a size option to set instead."""
    c = Cause.SHM_EXHAUSTED.value
    workers = cfg.train.loader_workers
    if workers > 0:
        fewer = workers // 2
        return Decision(RESUBMIT, c, f"shared memory (/dev/shm) full: fewer data-loader workers, "
                                     f"train.loader_workers {workers} -> {fewer}", {"train.loader_workers": fewer})
    fix = _host_oom_fix(cfg, limits, offload_allowed=False)
    if fix is None:
        where = (f" (the {cfg.container.runtime} container shares the node's /dev/shm)"
                 if cfg.container.runtime != "none" else "")
        mem = f"--mem {cfg.slurm.mem}" if cfg.slurm.mem else "the partition's default --mem"
        return Decision(STOP, c, f"shared memory (/dev/shm) full with no data-loader workers "
                                 f"(train.loader_workers=0) and no more memory to ask for ({mem}; the partition "
                                 f"allows no more, or its limit is unknown){where}: pass smaller batches between "
                                 "processes, or use nodes with a larger /dev/shm (`df -h /dev/shm` on a node; its "
                                 "size is the admins' setting)")
    patch, what = fix
    return Decision(RESUBMIT, c, f"shared memory (/dev/shm) full with no data-loader workers left "
                                 f"(train.loader_workers=0); it counts against the job's memory: {what}", patch)


def _unknown(history: Sequence[PastAttempt], situation: Situation) -> Decision:
    """An attempt that ended with no positive evidence for any cause: requeue it once, unchanged, from the newest
    checkpoint (a transient fault rarely repeats); an earlier unknown end at the same resume step (no newer
    checkpoint between them; no checkpoint both times counts as the same) parks the run for a person."""
    c = Cause.UNKNOWN.value
    step = situation.resume_step
    where = f"step {step}" if step is not None else "the start (no checkpoint yet)"
    if any(h.cause == c and h.step == step for h in history):
        guesses = "; ".join(situation.hypotheses) or "none"
        return Decision(ATTENTION, c, f"ended without a known cause again at {where} (no newer checkpoint between "
                                      f"the two): not a transient fault; look at the log lines and the hypotheses "
                                      f"({guesses}); resuming the run requeues it",
                        hypotheses=situation.hypotheses)
    return Decision(REQUEUE, c, f"ended without a known cause at {where}: requeue once, unchanged, from the newest "
                                "checkpoint (a transient fault rarely repeats)", expedite=True)


def repair_rule(cause: str | Cause, cfg: Config, situation: Situation = Situation(),
                limits: PolicyLimits = PolicyLimits()) -> Decision:
    """The rule alone, without the watcher's budgets: what the job's in-job recovery applies (launch/recovery.py)."""
    return _rule(Cause(cause), (), cfg, situation, limits)


def decide(cause: str | Cause, history: Sequence[PastAttempt], cfg: Config, situation: Situation = Situation(),
           limits: PolicyLimits = PolicyLimits()) -> Decision:
    """The decision for an attempt whose diagnosis is ``cause``; ``history`` holds the run's *earlier* attempts."""
    cause = Cause(cause)
    c = cause.value
    if cause == Cause.COMPLETED:
        return Decision(DONE, c, "completed")
    if cause == Cause.PENDING and situation.requeued_after in (Cause.PREEMPTED, Cause.NODE_FAIL, Cause.TIMEOUT):
        return Decision(WAIT, c, f"Slurm requeued it after {situation.requeued_after}: skip the 121 s requeue delay",
                        expedite=True, free=True)
    if cause in (Cause.RUNNING, Cause.PENDING) or (cause == Cause.UNKNOWN and not situation.ended):
        return Decision(WAIT, c, {"unknown": "state unknown (sacct failed or has no record): wait, never requeue"}
                        .get(c, f"{c}: wait"), free=True)
    if cause == Cause.CODE_ERROR:
        return Decision(STOP, c, "code error: requeueing would fail the same way; fix it and resubmit")
    if cause == Cause.CANCELLED:
        return Decision(STOP, c, "cancelled by a person: not requeued")
    if cause == Cause.RUN_DIR_BUSY:
        return Decision(STOP, c, "run directory busy: another live job trains in it; a requeue would be refused "
                                 "the same way (two attempts would overwrite each other's checkpoints)")
    if cause == Cause.ENV_ERROR:
        fix = env_fix(situation.evidence)
        return Decision(STOP, c, "environment problem: every retry in this environment would fail the same way; "
                                 + (f"fix: {fix}" if fix else "run the fix in the evidence, then resubmit"))

    proposed = _rule(cause, history, cfg, situation, limits)
    if proposed.action not in (REQUEUE, RESUBMIT):
        return proposed
    if not cfg.watch.enabled:
        if cause == Cause.PREEMPTED:
            return Decision(WAIT, c, "preempted; watch.enabled is false, so only Slurm's own requeue applies",
                            free=True)
        return Decision(STOP, c, f"{proposed.reason} -- but watch.enabled is false: not acting")
    budget = limits.per_cause.get(c)
    used = sum(1 for h in history if h.cause == c and h.action in (REQUEUE, RESUBMIT))
    if budget is not None and used >= budget:
        return Decision(STOP, c, f"retry budget for {c} used up ({used} of {budget}); last idea was: {proposed.reason}")
    spent = sum(1 for h in history if _costs(h))
    if not proposed.free and spent >= cfg.watch.max_retries:
        return Decision(STOP, c, f"overall retry budget used up ({spent} of watch.max_retries={cfg.watch.max_retries})")
    if not proposed.patch and cause != Cause.PREEMPTED:
        streak = _no_progress_streak(history, c, situation)
        if streak >= limits.no_progress_attempts:
            return Decision(STOP, c, f"no progress: {streak} attempts in a row ended without a new checkpoint "
                                     f"and nothing was changed between them (last: {c}); look at the log before "
                                     "resubmitting")
    return proposed


def retries_left(cause: str, history: Sequence[PastAttempt], cfg: Config,
                 limits: PolicyLimits = PolicyLimits()) -> Optional[Tuple[int, str]]:
    """The tighter of the two budgets :func:`decide` checks, after ``history`` (which holds the retry just
    decided): (retries left, which budget in words), or None when neither limits ``cause``. Read by the
    notifications (``hpc_agent/watcher/notify_events.py``) to warn before the run gives up, never to decide."""
    found = []
    budget = limits.per_cause.get(cause)
    if budget is not None:
        used = sum(1 for h in history if h.cause == cause and h.action in (REQUEUE, RESUBMIT))
        found.append((budget - used, f"{cause} retries ({used} of {budget} used)"))
    if cause != Cause.PREEMPTED.value:
        spent = sum(1 for h in history if _costs(h))
        found.append((cfg.watch.max_retries - spent, f"overall retries ({spent} of watch.max_retries="
                                                     f"{cfg.watch.max_retries} used)"))
    return min(found, key=lambda item: item[0]) if found else None

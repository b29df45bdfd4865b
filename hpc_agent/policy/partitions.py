"""Where a job should run: the candidates, the pure chooser behind ``submit --place auto``, and the policy's rule
to move a run after a GPU out-of-memory or a node fault. Pure: no I/O, no clock.

**The chooser.** Each :class:`Candidate` is one way to run the job: a partition, the change the job needs there to
fit (a rung of THE OOM ladder, :mod:`hpc_agent.policy.memory`), the memory estimate, when Slurm says it would start
(``sbatch --test-only``), how long it would then take, and what it would cost. :func:`choose` ranks them by the
expected *finish* (start + run time), not the start: a partition that starts a minute later on GPUs three times
as fast wins. The facts are gathered elsewhere (:mod:`hpc_agent.slurm.partition_facts`, I/O) and turned into
candidates by :func:`candidates`.

The rules, in order:

1. A partition the user named (``slurm.partition``) always wins; the table is still shown.
2. A candidate is out when it cannot run the job: the user may not use the partition, it has too few GPUs,
   the estimate does not fit even with every rung, or ``sbatch --test-only`` refuses it. Each says why.
3. The rest are ranked by expected finish, when every one has a time estimate; otherwise by earliest start
   (and the reason says which lacked an estimate). An unknown start ranks last.
4. Candidates within ``tolerance_s`` of the best are a tie (estimates are rough: minutes do not matter on a
   multi-hour run). A tie goes to, in order: a known fit over an unknown one, the lower cost (a known cost
   over an unknown one), the smaller GPU (the bigger ones stay free for jobs that need them), no change over
   a ladder rung, then the partition name (so the choice is deterministic).

**The candidates** (:func:`candidates`: partition facts + a config -> rows).

For each partition: does the job fit its GPUs, as it is or with the fewest rungs of THE OOM ladder
(:mod:`hpc_agent.policy.memory`)? How long would the remaining steps take there? What would it cost?

The time model is deliberately simple and says so in the table's reason:

- a step costs ``6 x parameters x tokens`` FLOPs (forward + backward of a decoder-only transformer), run at
  ``placement.mfu`` of the GPUs' dense FP16 peak (:mod:`hpc_agent.policy.gpu_types`); once a run has measured its
  own step time on one GPU type, that time scaled by the ratio of the peaks replaces the FLOPs estimate;
- a config change slows a step by fixed factors (:data:`SLOWDOWN`): activation checkpointing recomputes the
  forward (+1/3), ZeRO-3 gathers parameters every layer, offload moves state over PCIe, a smaller micro-batch
  uses the GPU less well. Rough, but they order the options the way their costs do.

Workloads the estimator does not cover (your own model, ``train.command``) have no memory estimate and no
FLOPs count: their candidates say ``?`` and the chooser ranks them by start time.

**The policy's rule** (:func:`weigh_partitions`): ``decide.decide`` proposes the repair in place first (the next
OOM-ladder rung, or the same partition without the failed node). When the run's config has ``placement.mode:
auto`` and the watcher gathered the partitions' facts (``Situation.placement``), that proposal becomes one
candidate among the partitions, and :func:`choose` picks by expected finish. The decision keeps the proposal's
cause and budgets; its patch becomes the winner's partition and change, and the candidate table goes into the
audit trail with it.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Dict, List, Optional, Sequence, Tuple

from hpc_agent.policy.gpu_types import peak_tflops
from hpc_agent.policy.memory import (GPU_HEADROOM, describe_patch, estimate_from_config, estimate_with_patch,
                                     gpt_param_count, gpu_oom_rung, ladder_fit, train_after)

GIB = 2**30
DEFAULT_TOLERANCE_S = 300.0


@dataclass(frozen=True)
class Candidate:
    """One way to run the job. Times are seconds from now; None means unknown."""

    partition: str
    gpu_type: Optional[str] = None
    """The GPU type of the partition's gres (``a10``), None for a CPU partition or an untyped gres."""
    gpu_gib: Optional[float] = None
    """Memory of one GPU, GiB; None when unknown."""
    change: Dict[str, Any] = field(default_factory=dict)
    """Dotted-key patch the job needs here (a ladder rung); empty: as it is."""
    change_text: str = "as is"
    need_bytes: Optional[float] = None
    """The per-GPU memory estimate with ``change`` applied; None when there is no estimate."""
    fits: Optional[bool] = None
    """Whether ``need_bytes`` fits the GPU (with headroom); None when either side is unknown."""
    start_s: Optional[float] = None
    """Seconds until the earliest start ``sbatch --test-only`` reported; None when it did not say."""
    run_s: Optional[float] = None
    """Estimated seconds from start to the last step; None without a time estimate."""
    gpus: int = 0
    """GPUs the job holds (nodes x GPUs per node), for the cost."""
    cost_per_gpu_hour: Optional[float] = None
    blocked: str = ""
    """Why this candidate cannot run the job ("" when it can)."""
    explicit: bool = False
    """The user named this partition."""
    node_gpus: int = 0
    """GPUs per node of the partition (0: a CPU partition, which a CPU job prefers in a tie)."""
    default: bool = False
    """The cluster's default partition (preferred in a tie, before the name)."""

    @property
    def finish_s(self) -> Optional[float]:
        return None if self.start_s is None or self.run_s is None else self.start_s + self.run_s

    @property
    def cost(self) -> Optional[float]:
        if self.cost_per_gpu_hour is None or self.run_s is None:
            return None
        return self.cost_per_gpu_hour * max(self.gpus, 1) * self.run_s / 3600.0

    @property
    def usable(self) -> bool:
        return not self.blocked and self.fits is not False


@dataclass(frozen=True)
class Row:
    candidate: Candidate
    verdict: str


@dataclass(frozen=True)
class Choice:
    """The winner (None when nothing can run the job), every candidate with its verdict, and why."""

    winner: Optional[Candidate]
    rows: Tuple[Row, ...]
    reason: str
    ranked_by: str = "finish"
    """``finish`` or ``start`` (when a usable candidate had no time estimate) or ``explicit``."""

    @property
    def patch(self) -> Dict[str, Any]:
        """What to apply to the config: the winner's partition and change."""
        if self.winner is None:
            return {}
        return {"slurm.partition": self.winner.partition, **self.winner.change}

    def table(self) -> List[str]:
        return render_table(self.rows)

    def to_dict(self) -> Dict[str, Any]:
        """For the audit trail and ``--json``: plain values only."""
        rows = []
        for row in self.rows:
            c = asdict(row.candidate)
            c.update(finish_s=row.candidate.finish_s, cost=row.candidate.cost, verdict=row.verdict)
            rows.append(c)
        return {"winner": self.winner.partition if self.winner else None, "patch": self.patch,
                "reason": self.reason, "ranked_by": self.ranked_by, "table": self.table(), "candidates": rows}


# --- formatting ------------------------------------------------------------------------------------------
def fmt_duration(seconds: Optional[float]) -> str:
    """A duration: ``?``, ``<1s``, ``45s``, ``12m``, ``2h05m``, ``3d04h``, ``never``."""
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return "?"
    s = max(0.0, float(seconds))
    if math.isinf(s):
        return "never"
    if s < 60:
        return "<1s" if s < 1 else f"{s:.0f}s"
    minutes = int(round(s / 60))
    if minutes < 60:
        return f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def _in(seconds: Optional[float]) -> str:
    """A time from now: ``now`` (under a second), ``in 12m``, ``?``, ``never``."""
    text = fmt_duration(seconds)
    return "now" if text == "<1s" else text if text in ("?", "never") else f"in {text}"


def fmt_size(size: float) -> str:
    """Bytes as ``12.3G``, or below 1 GiB ``512M`` (a CPU job's need would read ``0.0G``)."""
    return f"{size / 2**30:.1f}G" if size >= 2**30 else f"{max(1, round(size / 2**20))}M"


def _gpu(c: Candidate) -> str:
    if c.gpu_type is None and c.gpu_gib is None:
        return "-"
    size = f" {c.gpu_gib:g}G" if c.gpu_gib is not None else ""
    return f"{c.gpu_type or 'gpu'}{size}"


def _fits(c: Candidate) -> str:
    if c.blocked:
        return "-"
    need = fmt_size(c.need_bytes) if c.need_bytes is not None else ""
    if c.fits is None:
        return f"? {need}".strip()
    return f"{'yes' if c.fits else 'no'} {need}".strip()


def render_table(rows: Sequence[Row]) -> List[str]:
    head = ("partition", "gpu", "fits", "change", "starts", "runs", "finishes", "cost", "verdict")
    body = [(r.candidate.partition, _gpu(r.candidate), _fits(r.candidate), r.candidate.change_text,
             _in(r.candidate.start_s), fmt_duration(r.candidate.run_s), _in(r.candidate.finish_s),
             "-" if r.candidate.cost is None else f"{r.candidate.cost:.2f}", r.verdict) for r in rows]
    widths = [max(len(str(x[i])) for x in [head, *body]) for i in range(len(head) - 1)]
    return ["  ".join([*(str(x[i]).ljust(widths[i]) for i in range(len(widths))), str(x[-1])]).rstrip()
            for x in [head, *body]]


# --- the choice -------------------------------------------------------------------------------------------
def _blocked_verdict(c: Candidate) -> str:
    if c.blocked:
        return f"out: {c.blocked}"
    return "out: does not fit" + (" even with every rung of the OOM ladder" if c.change_text == "no rung fits" else "")


def _gpu_size(c: Candidate) -> float:
    """For the tie: a partition without GPUs is the smallest (a CPU job leaves GPU nodes alone), an unknown
    GPU the largest."""
    if c.gpu_gib is not None:
        return c.gpu_gib
    return 0.0 if not c.node_gpus and c.gpu_type is None else math.inf


def _tie_key(c: Candidate) -> tuple:
    cost = c.cost
    return (0 if c.fits else 1, 0 if cost is not None else 1, cost or 0.0, _gpu_size(c),
            0 if not c.change else 1, 0 if c.default else 1, c.partition)


def _tie_reason(winner: Candidate, other: Candidate) -> str:
    """Why ``winner`` beat ``other`` within the tolerance: the first tie-break that differs."""
    if bool(winner.fits) != bool(other.fits):
        return "its fit is known"
    if (winner.cost is None) != (other.cost is None):
        return "its cost is known"
    if winner.cost is not None and other.cost is not None and winner.cost != other.cost:
        return f"cheaper ({winner.cost:.2f} vs {other.cost:.2f})"
    if _gpu_size(winner) != _gpu_size(other):
        if winner.gpu_gib is None:
            return "no GPUs: GPU nodes stay free for jobs that need them"
        other_size = f"{other.gpu_gib:g}" if other.gpu_gib is not None else "?"
        return f"smaller GPU ({winner.gpu_gib:g} vs {other_size} GiB): the bigger ones stay free for jobs that need them"
    if bool(winner.change) != bool(other.change):
        return "it runs the job as is"
    if winner.default != other.default:
        return "the cluster's default partition"
    return "by name"


def choose(candidates: Sequence[Candidate], tolerance_s: float = DEFAULT_TOLERANCE_S) -> Choice:
    """Rank ``candidates`` (see the module docstring); every candidate gets a row with its verdict."""
    explicit = next((c for c in candidates if c.explicit), None)
    usable = [c for c in candidates if c.usable]
    missing = [c.partition for c in usable if c.run_s is None]  # an unknown *start* only ranks last
    by = "start" if missing else "finish"

    def key(c: Candidate) -> float:
        value = c.start_s if by == "start" else c.finish_s
        return math.inf if value is None else value

    if explicit is not None:
        verdicts = {id(c): ("chosen: you named it (slurm.partition)" if c is explicit else
                            (_blocked_verdict(c) if not c.usable else "not considered: you named a partition"))
                    for c in candidates}
        return Choice(explicit, tuple(Row(c, verdicts[id(c)]) for c in candidates),
                      f"you named partition {explicit.partition} (slurm.partition): it is used as is", "explicit")
    if not usable:
        why = "; ".join(f"{c.partition}: {_blocked_verdict(c)[5:]}" for c in candidates) or "no partition to try"
        return Choice(None, tuple(Row(c, _blocked_verdict(c)) for c in candidates),
                      f"no partition can run the job ({why})", by)
    best = min(key(c) for c in usable)
    tied = sorted((c for c in usable if key(c) <= best + tolerance_s), key=_tie_key) \
        if not math.isinf(best) else sorted(usable, key=_tie_key)
    winner = tied[0]
    verdicts: Dict[int, str] = {}
    for c in candidates:
        if c is winner:
            verdicts[id(c)] = "chosen"
        elif not c.usable:
            verdicts[id(c)] = _blocked_verdict(c)
        elif c in tied:
            verdicts[id(c)] = f"tie, lost: {_tie_reason(winner, c)}"
        elif math.isinf(key(c)):
            verdicts[id(c)] = f"{by} unknown"
        else:
            verdicts[id(c)] = f"{'finishes' if by == 'finish' else 'starts'} {fmt_duration(key(c) - key(winner))} later"
    what = "finishes" if by == "finish" else "starts"
    when = _in(key(winner))
    if len(usable) == 1:
        reason = f"{winner.partition} is the only partition that can run the job ({what} {when})"
    elif len(tied) > 1:
        reason = (f"{', '.join(c.partition for c in tied)} {what[:-1] if what == 'starts' else 'finish'} within {fmt_duration(tolerance_s)} of "
                  f"each other; {winner.partition} wins the tie: {_tie_reason(winner, tied[1])}")
    else:
        runner = min((c for c in usable if c is not winner), key=key)
        gap = key(runner) - key(winner)
        reason = (f"{winner.partition} {what} first ({when}), " +
                  (f"{fmt_duration(gap)} before {runner.partition}" if not math.isinf(gap) else
                   f"{runner.partition}'s start is unknown (sbatch --test-only did not say)"))
    if missing:
        reason += f"; ranked by start: no time estimate for {', '.join(missing)}"
    if winner.change:
        reason += f"; with {winner.change_text}"
    return Choice(winner, tuple(Row(c, verdicts[id(c)]) for c in candidates), reason, by)


# --- the candidates: partition facts + a config -> rows ---------------------------------------------------
SLOWDOWN = {"activation_checkpointing": 4 / 3, "zero3": 1.1, "optimizer": 1.5, "optimizer+params": 3.0,
            "micro_batch_halving": 1.1}
"""Step-time factors of the ladder's changes (see the module docstring)."""


def _estimated(cfg: Any) -> bool:
    """Whether the memory estimator and the FLOPs count cover this config (the built-in gpt workload)."""
    return cfg.train.workload == "gpt" and not getattr(cfg.train, "command", None)


def _ranks(cfg: Any) -> int:
    return max(1, int(cfg.slurm.nodes) * int(cfg.slurm.tasks_per_node))


def flops_per_step(cfg: Any) -> Optional[float]:
    """Training FLOPs of one optimizer step (the global batch), None for a workload without an estimate."""
    if not _estimated(cfg):
        return None
    m, t = cfg.model, cfg.train
    tokens = t.micro_batch_size * t.grad_accum_steps * _ranks(cfg) * m.seq_len
    return 6.0 * gpt_param_count(m.n_layers, m.d_model, m.seq_len) * tokens


def config_factor(train: Any) -> float:
    """How much slower than plain data-parallel training these settings make a step."""
    factor = SLOWDOWN["activation_checkpointing"] if train.activation_checkpointing else 1.0
    if train.zero_stage == 3:
        factor *= SLOWDOWN["zero3"]
    return factor * SLOWDOWN.get(train.offload, 1.0)


def change_factor(train: Any, patch: Dict[str, Any]) -> float:
    """Step-time factor of applying ``patch`` (a ladder patch) to ``train``."""
    after = train_after(train, patch)
    factor = config_factor(after) / config_factor(train)
    if after.micro_batch_size < train.micro_batch_size:
        factor *= SLOWDOWN["micro_batch_halving"] ** math.log2(train.micro_batch_size / after.micro_batch_size)
    return factor


def step_seconds(cfg: Any, gpu_type: Optional[str], mfu: float,
                 measured: Optional[Tuple[str, float]] = None) -> Optional[float]:
    """Seconds per step of ``cfg`` as it is on ``gpu_type``: a measured ``(gpu type, seconds)`` scaled by the
    peaks when there is one, else the FLOPs estimate. None when the GPU's peak or the FLOPs are unknown."""
    peak = peak_tflops(gpu_type)
    if peak is None:
        return None
    if measured is not None and peak_tflops(measured[0]):
        return measured[1] * peak_tflops(measured[0]) / peak
    flops = flops_per_step(cfg)
    if flops is None:
        return None
    return flops / (peak * 1e12 * _ranks(cfg) * mfu) * config_factor(cfg.train)


def _fit(cfg: Any, capacity: Optional[float], *, must_change: bool, scale: float, offload_allowed: bool,
         headroom: float) -> Tuple[Dict[str, Any], str, Optional[float], Optional[bool], str]:
    """(patch, its description, estimated bytes after it, fits, blocked) for one GPU size.

    ``must_change``: the job ran out of memory on this partition, so it takes at least the next rung (as
    :func:`hpc_agent.policy.memory.gpu_oom_fit` does), climbing to the first that fits by the calibrated estimate."""
    ranks = _ranks(cfg)
    if not _estimated(cfg) or not capacity:
        need = estimate_from_config(cfg).total_bytes * scale if _estimated(cfg) else None
        if not must_change:
            return {}, "as is", need, None, ""
        rung = gpu_oom_rung(cfg.train, ranks, offload_allowed)
        if rung is None:
            return {}, "as is", need, False, "the OOM ladder is used up here"
        return rung[0], rung[1], None, None, ""
    budget = capacity * headroom
    need = estimate_from_config(cfg).total_bytes * scale
    if need <= budget and not must_change:
        return {}, "as is", need, True, ""
    fit = ladder_fit(cfg, budget, ranks, offload_allowed, scale)
    if fit is not None:
        return fit[0], fit[1], fit[2], True, ""
    if must_change:  # the estimate may be pessimistic: the next rung alone, as the watcher always tried
        rung = gpu_oom_rung(cfg.train, ranks, offload_allowed)
        if rung is not None:
            return rung[0], f"{rung[1]} (no rung fits by the estimate)", \
                estimate_with_patch(cfg, rung[0]).total_bytes * scale, None, ""
    return {}, "no rung fits", need, False, ""


def candidates(cfg: Any, facts: Sequence[Any], *, remaining_steps: int, explicit: Optional[str] = None,
               oom_on: Optional[str] = None, scale: float = 1.0, offload_allowed: bool = True,
               measured: Optional[Tuple[str, float]] = None, headroom: float = GPU_HEADROOM) -> List[Candidate]:
    """One candidate per partition fact (``hpc_agent.slurm.partition_facts.PartitionFacts``).

    ``explicit``: the partition the user named. ``oom_on``: the partition where the job just ran out of GPU
    memory (it takes a rung there; ``scale`` calibrates every estimate on that failure). ``measured``: the
    run's own step time on a GPU type."""
    placement = cfg.placement
    out: List[Candidate] = []
    for f in facts:
        capacity = f.gpu_gib * GIB if f.gpu_gib else None
        if cfg.slurm.gpus_per_node and not f.blocked:
            patch, what, need, fits, blocked = _fit(cfg, capacity, must_change=f.name == oom_on, scale=scale,
                                                    offload_allowed=offload_allowed, headroom=headroom)
        else:  # a CPU job (no GPU memory to fit), or a partition that cannot run it anyway
            patch, what, need, fits, blocked = {}, "as is", None, None, ""
        if patch:  # compact for the table: "micro_batch_size 4 -> 2, grad_accum_steps 1 -> 2"
            what = describe_patch(cfg.train, patch) + (" (no rung fits by the estimate)" if fits is None and
                                                       f.name == oom_on and capacity else "")
        base = step_seconds(cfg, f.gpu_type, placement.mfu, measured) if cfg.slurm.gpus_per_node else None
        run_s = base * change_factor(cfg.train, patch) * max(0, remaining_steps) \
            if base is not None and fits is not False else None
        out.append(Candidate(
            partition=f.name, gpu_type=f.gpu_type, gpu_gib=f.gpu_gib, change=dict(patch), change_text=what,
            need_bytes=need, fits=fits, start_s=f.start_s, run_s=run_s,
            gpus=int(cfg.slurm.nodes) * int(cfg.slurm.gpus_per_node),
            cost_per_gpu_hour=placement.cost_of(f.name, f.gpu_type),
            blocked=f.blocked or blocked, explicit=explicit is not None and f.name == explicit,
            node_gpus=int(getattr(f, "gpus_per_node", 0) or 0), default=bool(getattr(f, "default", False))))
    return out


# --- the policy's rule: move after a GPU OOM or a node fault ---------------------------------------------
def weigh_partitions(proposed: Any, cfg: Any, situation: Any, limits: Any, oom: bool) -> Any:
    """``proposed`` (a ``policy.decide.Decision`` to resubmit in place), or the same decision moved to the partition that
    finishes first. Unchanged without facts, with ``placement.mode`` off, or when nothing can run the job."""
    facts = situation.placement
    if not facts or getattr(cfg.placement, "mode", "off") != "auto":
        return proposed
    from hpc_agent.config.load import apply_patch  # validates the patched config again

    here = cfg.slurm.partition
    base = apply_patch(cfg, {k: v for k, v in proposed.patch.items() if k.startswith("slurm.")})
    scale = 1.0
    if oom:  # calibrate on the failure, as the ladder does: what ran out of memory needed more than the GPU has
        capacity = situation.gpu_capacity_bytes or next(
            (f.gpu_gib * GIB for f in facts if f.name == here and f.gpu_gib), None)
        if capacity and cfg.train.workload == "gpt" and not cfg.train.command:
            scale = max(1.0, capacity / max(estimate_from_config(cfg).total_bytes, 1))
        if situation.gpu_capacity_bytes:  # the allocator's own word on the GPU it ran on beats the gres type's
            facts = tuple(replace(f, gpu_gib=situation.gpu_capacity_bytes / GIB) if f.name == here else f
                          for f in facts)
    remaining = situation.remaining_steps if situation.remaining_steps is not None else cfg.train.max_steps
    rows = candidates(base, facts, remaining_steps=remaining, oom_on=here if oom else None, scale=scale,
                      headroom=limits.gpu_headroom)
    choice = choose(rows, cfg.placement.tolerance_s)
    if choice.winner is None:
        return replace(proposed, reason=f"{proposed.reason} (placement: {choice.reason})", placement=choice.to_dict())
    patch = {k: v for k, v in proposed.patch.items() if k.startswith("slurm.")}
    patch.update(choice.patch)
    if patch.get("slurm.partition") == here:
        patch.pop("slurm.partition")
    moved = choice.winner.partition != here
    what = (f"move to {choice.winner.partition}" + (f" with {choice.winner.change_text}" if choice.winner.change
                                                     else " as is")) if moved else f"stay on {here}"
    zero_changed = "train.zero_stage" in patch and patch["train.zero_stage"] != cfg.train.zero_stage
    return replace(proposed, patch=patch, reason=f"{proposed.reason.split(':', 1)[0]}: {what} ({choice.reason})",
                   placement=choice.to_dict(), needs_universal_checkpoint=zero_changed)

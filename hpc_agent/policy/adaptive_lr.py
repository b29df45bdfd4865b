"""The adaptive LR schedule's decisions (the ``adaptive:`` section). Pure: series in, state and decision out.

:func:`decide` is called once per optimizer step with the run's recent metric series and returns the new
:class:`ScheduleState` and at most one :class:`Adaptation`:

- a **gradient explosion** (the step's norm above ``explosion_factor`` x the median of the previous
  ``explosion_window`` norms, a non-finite norm, or ``clip_streak`` consecutive norms at or above
  ``train.grad_clip``) multiplies ``lr_scale`` by ``decay_factor``, never below ``lr_floor_ratio``;
  ``escalate_after`` explosions within ``escalate_window`` steps are an ``escalate_rollback`` instead,
  which the caller hands to the existing divergence rollback (``launch/recovery.py``);
- a **plateau** (the best of the last ``plateau_window`` points of the watched loss beats the best before
  them by at most ``plateau_min_rel_improvement``, relative) is a ``warm_restart``: the LR re-warms
  linearly from where it is to ``restart_fraction`` x peak over ``restart_warmup_steps``, then decays by
  cosine to ``min_lr_ratio`` at the end of the run again.

Explosions take precedence over plateaus. Nothing is adapted during the initial warmup, a point is judged
only in the call for the step it was recorded at (no decision without new evidence), and no restart or
decay comes within ``cooldown_steps`` of the previous adaptation (explosions still count towards
escalation: a run that keeps exploding right after a decay is what the rollback is for). A plateau window
must lie wholly after the last adaptation (like ``ReduceLROnPlateau``, patience restarts after a change,
while the best value before the window is the whole run's).

Steps: ``step`` is the number of optimizer steps completed, i.e. the 1-based step just trained (what
TensorBoard logs), which is also the 0-based index of the next update (what ``LambdaLR`` asks the factor
for). An adaptation decided at ``step`` applies from update ``step`` on. The LR factor itself is
``launch.lr_schedule.lr_factor_adaptive`` (the base schedule lives in ``launch``; hpc_agent never imports
``launch`` at module level), built from :func:`restart_factor` and :func:`scaled_factor` here.

In the training loop (``launch/adaptive_loop.py``, called by ``launch/engine.py`` after a step's evaluation
and before its checkpoint): the LR lambda reads the current state at every scheduler step; the trimmed series
(:func:`trim_history`) and the state are saved in every checkpoint and snapshot and restored by the resume, so
the decisions after a resume equal the uninterrupted run's; rank 0 decides and broadcasts (eval losses need
not agree bit for bit across ranks); gradient norms of FP16 overflow-skipped steps are left out (the loss
scaler's business). An adaptation applies from update ``step`` on, is a journal line
(``hpc_agent/core/in_job_journal.py``, action ``adaptive_schedule``, its ``[step, value]`` window as evidence), an
``adaptive/<kind>`` TensorBoard scalar and a marker in review's plot; ``escalate_rollback`` is the job's
divergence rollback (``launch.recovery.repair_in_place``).
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

WARM_RESTART, LR_DECAY, ESCALATE_ROLLBACK = "warm_restart", "lr_decay", "escalate_rollback"
KINDS = (WARM_RESTART, LR_DECAY, ESCALATE_ROLLBACK)
GRAD_NORM = "train/grad_norm"
METRIC_TAGS = {"eval": "eval/loss", "train": "train/loss"}
Pair = Tuple[int, float]
__all__ = ["ScheduleState", "Adaptation", "decide", "restart_factor", "scaled_factor", "trim_history", "KINDS",
           "WARM_RESTART", "LR_DECAY", "ESCALATE_ROLLBACK", "METRIC_TAGS"]


@dataclass(frozen=True)
class ScheduleState:
    """What the adaptations changed: saved in every checkpoint. The default is the plain schedule."""

    lr_scale: float = 1.0
    """Product of the decays so far (1.0: none)."""
    lr_floor_ratio: float = 0.0
    """The floor (fraction of the peak) decays may not push the LR below, as configured at the last decay."""
    restart_step: Optional[int] = None
    """Update index where the last warm restart's re-warm began; None: no restart yet."""
    restart_start_factor: float = 1.0
    """The unscaled factor the schedule had at ``restart_step``: the re-warm starts there (no jump)."""
    restart_peak_fraction: float = 1.0
    """The fraction of the peak the re-warm rises to (``restart_fraction`` when it was decided)."""
    restart_warmup_steps: int = 0
    """Length of that re-warm (recorded, so a config edit cannot move a curve already under way)."""
    restarts: int = 0
    """Warm restarts made so far."""
    explosions: Tuple[int, ...] = ()
    """Steps of the recent gradient explosions (within ``escalate_window``), for escalation."""
    last_adapt_step: Optional[int] = None
    """Step of the last adaptation: cooldown, and where the next plateau window may start."""

    def to_dict(self) -> Dict[str, Any]:
        """A plain mapping for the checkpoint (floats as they are: the round trip is exact)."""
        out = dataclasses.asdict(self)
        out["explosions"] = list(self.explosions)
        return out

    @classmethod
    def from_dict(cls, data: Optional[Mapping[str, Any]]) -> "ScheduleState":
        """From :meth:`to_dict`; a checkpoint from before this feature (None, or missing keys) gets the
        defaults, and unknown keys (a newer version's) are ignored."""
        data = data or {}
        default = cls()
        values: Dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            value = data.get(f.name, getattr(default, f.name))
            if f.name == "explosions":
                value = tuple(int(s) for s in value)
            elif f.name in ("restart_step", "last_adapt_step"):
                value = None if value is None else int(value)
            elif f.name in ("restart_warmup_steps", "restarts"):
                value = int(value)
            else:
                value = float(value)
            values[f.name] = value
        return cls(**values)


@dataclass(frozen=True)
class Adaptation:
    """One decision of :func:`decide`, with its evidence, as the journal and the review plot show it."""

    kind: str
    """One of ``KINDS``."""
    step: int
    """The step it was decided at; it applies from update ``step`` on."""
    reason: str
    """One line: what was seen and what was done."""
    metric: str
    """The series the evidence comes from: ``train/grad_norm``, ``eval/loss`` or ``train/loss``."""
    evidence: Tuple[Pair, ...]
    """The window of ``(step, value)`` points the decision rests on."""
    lr_scale_before: float
    lr_scale: float
    restarts: int
    """Warm restarts made, this one included."""
    since_step: int
    """Where the trouble began: the first explosion counted (escalation: roll back to before it), or the
    first point of the window."""

    def to_dict(self) -> Dict[str, Any]:
        """JSON-safe (``allow_nan=False``): a non-finite value is written as a string, e.g. ``"nan"``."""
        out = dataclasses.asdict(self)
        out["evidence"] = [[s, v if math.isfinite(v) else str(v)] for s, v in self.evidence]
        return out


def _pairs(series: Sequence[Any]) -> List[Pair]:
    return [(int(s), float(v)) for s, v in series]


# --- the LR factor's adaptive parts (launch.lr_schedule.lr_factor_adaptive composes them) --------------------
def restart_factor(step: int, state: ScheduleState, total_steps: int, min_lr_ratio: float) -> float:
    """The unscaled factor at update ``step >= state.restart_step``: linear from the factor the schedule had
    at the restart to ``restart_peak_fraction`` over ``restart_warmup_steps`` updates (equal to the old
    schedule at the restart step itself, at the fraction when the re-warm ends), then cosine down to
    ``min_lr_ratio`` at update ``total_steps - 1``, and there after."""
    r, w = state.restart_step, state.restart_warmup_steps
    if r is None or step < r:
        raise ValueError(f"no warm restart at or before update {step}")
    start, peak = state.restart_start_factor, state.restart_peak_fraction
    if step - r < w:
        return start + (peak - start) * (step - r) / w
    decay_steps = total_steps - 1 - (r + w)
    if decay_steps <= 0:  # past the end (decide leaves room, so only a shortened run gets here)
        return min_lr_ratio
    progress = min(1.0, (step - r - w) / decay_steps)
    return min_lr_ratio + (peak - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def scaled_factor(factor: float, state: ScheduleState) -> float:
    """``factor`` times the decays' ``lr_scale``, but a decay never pushes it below ``lr_floor_ratio``. The
    floor bounds decays only: where the schedule alone is below it (warmup, the end of the cosine), the
    schedule's value stands. Without a decay this is ``factor`` exactly."""
    if state.lr_scale == 1.0:
        return factor
    return max(factor * state.lr_scale, min(factor, state.lr_floor_ratio))


# --- the decision -----------------------------------------------------------------------------------------
def decide(state: ScheduleState, step: int, losses: Sequence[Pair], grad_norms: Sequence[Pair], grad_clip: float,
           cfg: Any, *, warmup_steps: int, total_steps: int,
           lr_factor_now: float) -> Tuple[ScheduleState, Optional[Adaptation]]:
    """The state after ``step`` and the adaptation made there, if any (see the module docstring).

    ``losses``: the watched loss (``cfg.plateau_metric``) and ``grad_norms``: the norms before clipping, each
    ``(step, value)`` in step order up to ``step`` (:func:`trim_history` keeps what is needed).
    ``lr_factor_now``: the schedule's unscaled factor for update ``step`` under ``state``
    (``launch.lr_schedule.lr_factor_unscaled``): where a warm restart would start, and a restart only ever
    raises the LR."""
    if not cfg.enabled or step < warmup_steps:
        return state, None
    recent = tuple(e for e in state.explosions if step - e < cfg.escalate_window)
    if recent != state.explosions:
        state = replace(state, explosions=recent)
    norms = _pairs(grad_norms)
    explosion = _explosion(state, step, norms, grad_clip, cfg)
    if explosion is not None:
        return _on_explosion(state, step, explosion[0], explosion[1], cfg)
    return _on_plateau(state, step, _pairs(losses), cfg, total_steps, lr_factor_now)


def _cooling(state: ScheduleState, step: int, cfg: Any) -> bool:
    return state.last_adapt_step is not None and step - state.last_adapt_step < cfg.cooldown_steps


def _explosion(state: ScheduleState, step: int, norms: List[Pair], grad_clip: float,
               cfg: Any) -> Optional[Tuple[str, Tuple[Pair, ...]]]:
    """(what was seen, evidence) when the norm of ``step`` is an explosion, else None."""
    if not norms or norms[-1][0] != step:
        return None
    latest = norms[-1][1]
    previous = norms[-(cfg.explosion_window + 1):-1]
    if not math.isfinite(latest):
        return f"grad norm {latest} at step {step} is not finite", tuple(previous) + (norms[-1],)
    finite = [v for _, v in previous if math.isfinite(v)]
    if len(previous) == cfg.explosion_window and finite:
        median = statistics.median(finite)
        if median > 0 and latest > cfg.explosion_factor * median:
            return (f"grad norm {latest:.4g} at step {step} is {latest / median:.1f}x the median {median:.4g} of the "
                    f"previous {cfg.explosion_window} steps (adaptive.explosion_factor {cfg.explosion_factor:g})",
                    tuple(previous) + (norms[-1],))
    n = cfg.clip_streak
    if n > 0 and grad_clip > 0 and len(norms) >= n:
        streak = norms[-n:]
        # A streak is counted once: it must start after the last explosion and adaptation.
        after = max(state.explosions + (-1 if state.last_adapt_step is None else state.last_adapt_step,))
        if streak[0][0] > after and all(not v < grad_clip for _, v in streak):  # NaN counts as clipped
            return (f"grad norm at or above the clip {grad_clip:g} (train.grad_clip) for {n} steps in a row "
                    f"({streak[0][0]}..{step}; adaptive.clip_streak {n})", tuple(streak))
    return None


def _on_explosion(state: ScheduleState, step: int, seen: str, evidence: Tuple[Pair, ...],
                  cfg: Any) -> Tuple[ScheduleState, Optional[Adaptation]]:
    explosions = state.explosions + (step,)
    if cfg.escalate_after and len(explosions) >= cfg.escalate_after:
        new = replace(state, explosions=(), last_adapt_step=step)
        reason = (f"{seen}; {len(explosions)} gradient explosions within {cfg.escalate_window} steps (steps "
                  f"{', '.join(map(str, explosions))}; adaptive.escalate_after {cfg.escalate_after}): roll back "
                  f"to before step {explosions[0]}")
        return new, Adaptation(ESCALATE_ROLLBACK, step, reason, GRAD_NORM, evidence, state.lr_scale, state.lr_scale,
                               state.restarts, explosions[0])
    noted = replace(state, explosions=explosions)
    scale = max(state.lr_scale * cfg.decay_factor, cfg.lr_floor_ratio)
    if _cooling(state, step, cfg) or scale >= state.lr_scale:  # cooling down, or already at the floor
        return noted, None
    new = replace(noted, lr_scale=scale, lr_floor_ratio=cfg.lr_floor_ratio, last_adapt_step=step)
    reason = (f"{seen}: LR scale {state.lr_scale:g} -> {scale:g} (adaptive.decay_factor {cfg.decay_factor:g}, "
              f"floor {cfg.lr_floor_ratio:g} x peak)")
    return new, Adaptation(LR_DECAY, step, reason, GRAD_NORM, evidence, state.lr_scale, scale, state.restarts,
                           evidence[0][0])


def _on_plateau(state: ScheduleState, step: int, losses: List[Pair], cfg: Any, total_steps: int,
                lr_factor_now: float) -> Tuple[ScheduleState, Optional[Adaptation]]:
    warm = cfg.restart_warmup_steps
    if (state.restarts >= cfg.max_restarts or _cooling(state, step, cfg)
            or lr_factor_now >= cfg.restart_fraction  # the LR is still above where a restart would take it
            or step + 2 * warm >= total_steps - 1):  # no room left to re-warm and decay again
        return state, None
    points = [p for p in losses if math.isfinite(p[1])]  # a non-finite loss is the divergence detector's
    w = cfg.plateau_window
    if len(points) <= w or points[-1][0] != step:
        return state, None
    window, before = points[-w:], points[:-w]
    if state.last_adapt_step is not None and window[0][0] <= state.last_adapt_step:
        return state, None
    best_before = min(before, key=lambda p: p[1])
    best = min(window, key=lambda p: p[1])
    gain = (best_before[1] - best[1]) / max(abs(best_before[1]), 1e-12)
    if gain > cfg.plateau_min_rel_improvement:
        return state, None
    metric = METRIC_TAGS.get(cfg.plateau_metric, cfg.plateau_metric)
    new = replace(state, restart_step=step, restart_start_factor=lr_factor_now,
                  restart_peak_fraction=cfg.restart_fraction, restart_warmup_steps=warm,
                  restarts=state.restarts + 1, last_adapt_step=step)
    reason = (f"{metric} plateau: best {best[1]:.6g} of the last {w} points (steps {window[0][0]}..{step}) improves "
              f"{gain:.2e} (relative) on the best {best_before[1]:.6g} before them (step {best_before[0]}), at most "
              f"adaptive.plateau_min_rel_improvement {cfg.plateau_min_rel_improvement:g}: warm restart "
              f"{new.restarts} of {cfg.max_restarts}, LR factor {lr_factor_now:.4g} -> {cfg.restart_fraction:g} "
              f"over {warm} steps, then cosine")
    return new, Adaptation(WARM_RESTART, step, reason, metric, (best_before,) + tuple(window), state.lr_scale,
                           state.lr_scale, new.restarts, window[0][0])


def trim_history(losses: Sequence[Pair], grad_norms: Sequence[Pair], cfg: Any) -> Tuple[List[Pair], List[Pair]]:
    """The least of both series :func:`decide` needs to decide exactly as on the whole run: the finite losses'
    best point before the last ``plateau_window`` and those, and the last ``explosion_window + 1`` (or
    ``clip_streak``) norms. Bounded, so the job can keep it each step and save it in the checkpoint."""
    points = [p for p in _pairs(losses) if math.isfinite(p[1])]
    w = cfg.plateau_window
    if len(points) > w + 1:
        points = [min(points[:-w], key=lambda p: p[1])] + points[-w:]
    keep = max(cfg.explosion_window + 1, cfg.clip_streak)
    return points, _pairs(grad_norms)[-keep:]


def adaptation_reason(kind: str, why: str) -> str:
    """An adaptation's journal reason, ``<kind>: <why>`` (clipped to the journal's MAX_TEXT); :func:`adaptation_kind`
    reads the kind back."""
    from hpc_agent.core.in_job_journal import MAX_TEXT

    return f"{kind}: {why}"[:MAX_TEXT]


def adaptation_kind(reason: str) -> Optional[str]:
    """The kind (``warm_restart``, ``lr_decay``, ...) an adaptation's reason starts with; None when it names
    none of :data:`KINDS` (the job wrote the text: nothing else of it is echoed)."""
    kind = str(reason or "").split(":", 1)[0]
    return kind if kind in KINDS else None

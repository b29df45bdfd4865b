"""The ``adaptive:`` section: the job adapts its LR schedule to what the run shows. Off by default.

Two triggers, both judged by the pure :func:`hpc_agent.policy.adaptive_lr.decide`: a plateau of the watched loss
makes a warm restart (the LR re-warmed to a fraction of its peak, then cosine again, as in SGDR), and a
gradient-norm explosion decays the LR by a factor (with a floor); explosions that keep coming escalate to
the divergence rollback the job already has (``resilience.in_job_retries``). The defaults follow PyTorch's
``ReduceLROnPlateau`` (patience 10, relative threshold 1e-4) and this toolkit's divergence detector
(gradient norm above 10 x the median of the trailing 50 points).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, List

from hpc_agent.config.checks import raise_if
from hpc_agent.config.problems import Problem

PLATEAU_METRICS = ("eval", "train")


@dataclass
class AdaptiveConfig:
    """Adapting the LR schedule inside the job: warm restarts on a loss plateau, LR decay on a gradient explosion."""

    enabled: bool = False
    """Turn the adaptive schedule on. Off, the LR follows ``train``'s warmup and cosine exactly."""

    plateau_metric: str = "eval"
    """The loss a plateau is judged on: ``eval`` (``eval/loss`` every ``train.eval_every`` steps: smooth, so
    the default) or ``train`` (the training loss averaged over each ``train.log_every`` interval)."""

    plateau_window: int = 10
    """A plateau is ``plateau_window`` points of that loss (evaluations, or log intervals) without enough
    improvement. 10 is ``ReduceLROnPlateau``'s patience."""

    plateau_min_rel_improvement: float = 1e-4
    """Enough improvement: the best loss of the window beats the best one before it by more than this
    fraction. 1e-4 is ``ReduceLROnPlateau``'s relative threshold."""

    restart_fraction: float = 0.5
    """A warm restart re-warms the LR to this fraction of the peak (``train.lr``), then decays by cosine to
    ``train.min_lr_ratio`` at ``max_steps`` again. Half the peak: SGDR restarts to the full peak early in
    training, but late in a run the full peak undoes too much of what the decay bought."""

    restart_warmup_steps: int = 100
    """Steps of the linear re-warm from the current LR up to ``restart_fraction`` x peak, instead of SGDR's
    instant jump: a sudden several-fold rise of the step size is the shock a warmup exists to avoid. Shorter
    than a large run's first warmup (hundreds to thousands of steps), which also waits for Adam's moment
    estimates to settle. No restart when fewer than twice this many steps are left."""

    max_restarts: int = 3
    """At most this many warm restarts per run; 0 turns restarts off. Each costs a re-warm and a decay, so a
    run that plateaus again after a few has converged for its budget."""

    explosion_factor: float = 10.0
    """A gradient explosion: the step's gradient norm (before clipping) exceeds this many times the median
    of the previous ``explosion_window`` steps' norms, or is not finite. 10 is the divergence detector's
    ``grad_factor``: an order of magnitude is far outside a healthy run's step-to-step noise."""

    explosion_window: int = 50
    """Steps in the running median of the gradient norm; none is judged before a full window. 50 is the
    divergence detector's window."""

    clip_streak: int = 0
    """Also an explosion: this many consecutive steps whose norm before clipping is at or above
    ``train.grad_clip``. 0 (the default) turns it off: many healthy runs clip most steps for a long time
    (GPT pretraining often sits above a clip of 1.0 for thousands of steps), so set it only where you know
    your norms stay under the clip, e.g. 50."""

    decay_factor: float = 0.5
    """An explosion multiplies the LR by this factor (from that step on, for the rest of the run). Halving
    is the usual manual response to a loss spike; ``ReduceLROnPlateau``'s 0.1 is for a plateau, not a
    shock."""

    lr_floor_ratio: float = 0.1
    """Decays never take the LR below this fraction of the peak (where the schedule itself is below it,
    the schedule wins: the floor bounds decays only). 0.1, ``train.min_lr_ratio``'s default: below where
    the cosine ends, training has all but stopped."""

    escalate_after: int = 3
    """This many explosions within ``escalate_window`` steps hand the run to the divergence rollback (back
    to the checkpoint before the first of them, with a lower LR); 0 never escalates. Three: one decay, and
    the norm still exploding twice after it."""

    escalate_window: int = 200
    """Steps over which explosions are counted for ``escalate_after`` (four cooldowns: room for a decay
    and its effect to show)."""

    cooldown_steps: int = 50
    """No warm restart or decay within this many steps of the previous adaptation, so each one's effect
    can show before the next (explosions are still counted towards escalation). 50, the explosion window:
    after it, the running median only holds norms from after the change."""

    def problems(self) -> List[Problem]:
        problems: List[Problem] = []
        if not isinstance(self.enabled, bool):
            problems.append(Problem("adaptive.enabled", self.enabled, "true or false"))
        if self.plateau_metric not in PLATEAU_METRICS:
            problems.append(Problem("adaptive.plateau_metric", self.plateau_metric, "eval or train"))
        for name, low, what in (("plateau_window", 1, "a whole number of points >= 1, e.g. 10"),
                                ("restart_warmup_steps", 0, "a whole number of steps >= 0, e.g. 100"),
                                ("max_restarts", 0, "0 (no restarts) or more, e.g. 3"),
                                ("explosion_window", 3, "a whole number of steps >= 3, e.g. 50"),
                                ("clip_streak", 0, "0 (off) or a whole number of steps, e.g. 50"),
                                ("escalate_after", 0, "0 (never) or a whole number of explosions, e.g. 3"),
                                ("escalate_window", 1, "a whole number of steps >= 1, e.g. 200"),
                                ("cooldown_steps", 0, "a whole number of steps >= 0, e.g. 50")):
            value = getattr(self, name)
            if not _is_int(value) or value < low:
                problems.append(Problem(f"adaptive.{name}", value, what))
        for name, low, high, what in (
                ("plateau_min_rel_improvement", 0.0, 1.0, "a fraction in [0, 1), e.g. 1e-4"),
                ("decay_factor", 0.0, 1.0, "a factor in (0, 1), e.g. 0.5"),
                ("lr_floor_ratio", 0.0, 1.0, "a fraction of the peak LR in [0, 1), e.g. 0.1")):
            value = getattr(self, name)
            if not _is_number(value) or not low <= value < high or (name == "decay_factor" and value == 0):
                problems.append(Problem(f"adaptive.{name}", value, what))
        if not _is_number(self.restart_fraction) or not 0 < self.restart_fraction <= 1:
            problems.append(Problem("adaptive.restart_fraction", self.restart_fraction,
                                    "a fraction of the peak LR in (0, 1], e.g. 0.5"))
        if not _is_number(self.explosion_factor) or not self.explosion_factor > 1:
            problems.append(Problem("adaptive.explosion_factor", self.explosion_factor,
                                    "a factor above 1, e.g. 10"))
        return problems

    def __post_init__(self) -> None:
        raise_if(self.problems())


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def adaptive_problems(adaptive: Any, train: Any) -> List[Problem]:
    """Settings of ``adaptive`` that another section makes useless (only when it is enabled). Reads
    attributes only: it also runs on the merged raw config when a section failed its own checks."""
    if getattr(adaptive, "enabled", False) is not True:
        return []
    problems: List[Problem] = []
    if getattr(train, "command", None):
        problems.append(Problem("adaptive.enabled", True, "false: train.command runs your own script, whose LR "
                                "schedule hpc_agent does not drive (or use a train.workload)"))
    if getattr(adaptive, "plateau_metric", None) == "eval" and getattr(train, "eval_every", 1) == 0:
        problems.append(Problem("adaptive.plateau_metric", "eval",
                                "train, or set train.eval_every (e.g. 100): with train.eval_every 0 eval/loss "
                                "is only computed at the end, so no plateau could ever be seen"))
    streak, clip = getattr(adaptive, "clip_streak", 0), getattr(train, "grad_clip", 1.0)
    if _is_int(streak) and streak > 0 and _is_number(clip) and clip == 0:
        problems.append(Problem("adaptive.clip_streak", streak, "0: train.grad_clip is 0, so nothing is clipped; "
                                "or set train.grad_clip (e.g. 1.0)"))
    fraction, floor = getattr(adaptive, "restart_fraction", 0.5), getattr(train, "min_lr_ratio", 0.1)
    restarts = getattr(adaptive, "max_restarts", 0)
    if (_is_int(restarts) and restarts > 0 and _is_number(fraction) and _is_number(floor)
            and fraction <= floor):
        problems.append(Problem("adaptive.restart_fraction", fraction,
                                f"more than train.min_lr_ratio ({floor:g}): a restart re-warms the LR above "
                                "where the cosine ends; or set adaptive.max_restarts 0"))
    return problems

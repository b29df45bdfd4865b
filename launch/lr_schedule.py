"""Learning-rate schedule: linear warmup, then cosine decay to ``lr * min_lr_ratio``. Pure.

Step numbering: ``step`` is the 0-based index of the optimizer update. The first update
(step 0) already uses ``lr / warmup_steps`` rather than 0, so no update is wasted; update
``warmup_steps - 1`` uses the peak; the cosine then runs from the peak at ``warmup_steps`` down to
the floor at ``total_steps - 1`` and stays there if training goes on.

The engine hands :func:`lr_factor` to ``torch.optim.lr_scheduler.LambdaLR``: DeepSpeed steps the
scheduler once per optimizer update (only at the gradient-accumulation boundary, and not after an
FP16 overflow-skipped step) and saves/restores its ``last_epoch`` with the checkpoint, so the schedule
position survives a resume. LambdaLR calls the factor with the number of updates done so far,
which is exactly the 0-based index of the next update.

With ``adaptive.enabled`` the factor is :func:`lr_factor_adaptive`: this schedule as changed by the
adaptations in a :class:`hpc_agent.policy.adaptive_lr.ScheduleState` (warm restarts, decays). Its initial state
gives exactly :func:`lr_factor`.
"""
from __future__ import annotations

import math

from hpc_agent.policy.adaptive_lr import ScheduleState, restart_factor, scaled_factor


def lr_factor(step: int, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """Multiplier of the peak learning rate for 0-based update ``step``."""
    if step < 0:
        raise ValueError(f"step must be >= 0, not {step}")
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = total_steps - 1 - warmup_steps
    if decay_steps <= 0:  # warmup fills the whole run: nothing left to decay over
        return 1.0
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def lr_at(step: int, peak_lr: float, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """The learning rate of 0-based update ``step``."""
    return peak_lr * lr_factor(step, warmup_steps, total_steps, min_lr_ratio)


def lr_factor_unscaled(step: int, state: ScheduleState, warmup_steps: int, total_steps: int,
                       min_lr_ratio: float) -> float:
    """The schedule's factor for update ``step`` after the warm restarts in ``state``, before its decays.
    Before the last restart (only a review could ask) it is the base schedule's."""
    if state.restart_step is None or step < state.restart_step:
        return lr_factor(step, warmup_steps, total_steps, min_lr_ratio)
    return restart_factor(step, state, total_steps, min_lr_ratio)


def lr_factor_adaptive(step: int, state: ScheduleState, warmup_steps: int, total_steps: int,
                       min_lr_ratio: float) -> float:
    """Multiplier of the peak learning rate for update ``step`` under the adaptations in ``state``."""
    return scaled_factor(lr_factor_unscaled(step, state, warmup_steps, total_steps, min_lr_ratio), state)

"""Training-health alarms from logged scalars (TensorBoard ``train/loss``, ``train/loss_scale``). Pure.

Reading the event files is I/O and lives in the callers (``hpc_agent.diagnose.read_tb_scalars`` and the
watcher, both over ``metrics.tb_reader``); this module only turns ``[(step, value), ...]`` into alarms.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

NONFINITE_LOSS = "nonfinite_loss"
LOSS_SCALE_AT_MINIMUM = "loss_scale_at_minimum"

Series = Sequence[Tuple[int, float]]


@dataclass(frozen=True)
class Alarm:
    kind: str
    """``nonfinite_loss`` or ``loss_scale_at_minimum``."""
    step: int
    """First step of the problem (where training should be rolled back *before*)."""
    detail: str


def latest_run(series: Series) -> List[Tuple[int, float]]:
    """The points written since the last restart: a resumed attempt logs steps again from its checkpoint,
    so everything before the last point where the step went backwards belongs to an older attempt."""
    points = list(series)
    start = 0
    for i in range(1, len(points)):
        if points[i][0] <= points[i - 1][0]:
            start = i
    return points[start:]


def alarms_from_scalars(loss: Series = (), loss_scale: Series = (), min_loss_scale: float = 1.0,
                        stuck_points: int = 3) -> List[Alarm]:
    """NaN/inf loss, and an FP16 loss scale that stayed at its minimum for the last ``stuck_points``
    points (DeepSpeed gives up there: "Current loss scale already at minimum")."""
    alarms: List[Alarm] = []
    for step, value in latest_run(loss):
        if not math.isfinite(value):
            alarms.append(Alarm(NONFINITE_LOSS, step, f"train/loss is {value} at step {step}"))
            break
    scale = latest_run(loss_scale)
    tail = scale[-stuck_points:]
    if len(tail) >= stuck_points and all(v <= min_loss_scale for _, v in tail):
        first: Optional[int] = None
        for step, value in reversed(scale):
            if value > min_loss_scale:
                break
            first = step
        alarms.append(Alarm(LOSS_SCALE_AT_MINIMUM, first if first is not None else tail[0][0],
                            f"train/loss_scale stuck at the minimum {min_loss_scale:g} since step {first}"))
    return alarms

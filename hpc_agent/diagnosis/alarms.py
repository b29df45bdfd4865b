"""The fatal training alarms, for the classifier: a thin mapping over the one divergence detector. Pure.

:func:`fatal_alarms` is what both the watcher and ``diagnose`` call: it runs
:func:`hpc_agent.metrics.divergence.detect` on the loss and loss-scale series and keeps the kinds that
make an ended attempt count as diverged (a NaN/inf loss, a collapsed FP16 loss scale), named
``nonfinite_loss`` and ``loss_scale_at_minimum``. Spikes, gradient explosions and stalls are shown by
``review`` only. Reading the event files is I/O and lives in the callers (over ``metrics.tb_reader``).
"""
from __future__ import annotations

from typing import Any, List, Sequence, Tuple

from hpc_agent.metrics.alarm_kinds import FATAL_KINDS, LEGACY_KIND, Alarm

Series = Sequence[Any]
"""``[(step, value), ...]`` or ``RunScalars.series(tag)``'s ``Point`` objects (``.step``, ``.value``)."""


def _pair(item: Any) -> Tuple[int, float]:
    return (int(item.step), float(item.value)) if hasattr(item, "step") else (int(item[0]), float(item[1]))


def latest_run(series: Series) -> List[Tuple[int, float]]:
    """The points written since the last restart: a resumed attempt logs steps again from its checkpoint,
    so everything before the last point where the step went backwards belongs to an older attempt.
    (A ``RunScalars.series`` is one point per step, sorted: it comes back whole.)"""
    points = [_pair(p) for p in series]
    start = 0
    for i in range(1, len(points)):
        if points[i][0] <= points[i - 1][0]:
            start = i
    return points[start:]


def fatal_alarms(loss: Series, loss_scale: Series, min_loss_scale: float, stuck_points: int = 3) -> List[Alarm]:
    """NaN/inf loss and FP16 loss-scale collapse in the newest attempt's points (:func:`latest_run`), as
    ``nonfinite_loss`` / ``loss_scale_at_minimum`` alarms ordered by step. ``min_loss_scale`` is the
    config's ``train.min_loss_scale``."""
    from hpc_agent.metrics.divergence import detect  # numpy: imported when alarms are computed, not with diagnose

    found = detect(latest_run(loss), loss_scale=latest_run(loss_scale), min_loss_scale=min_loss_scale,
                   stuck_points=stuck_points)
    return [Alarm(LEGACY_KIND[a.kind], a.step, a.detail) for a in found if a.kind in FATAL_KINDS]


LOSS_TAG, LOSS_SCALE_TAG = "train/loss", "train/loss_scale"


def run_alarms(scalars: Any, min_loss_scale: float) -> List[Alarm]:
    """The fatal alarms of a run's TensorBoard scalars (a ``metrics.tb_reader.RunScalars``, already
    updated): the one way the watcher and ``diagnose`` feed :func:`fatal_alarms`, every point in write
    order, so both judge the same points (a merged per-step series would mix in an older attempt's
    points past the newest one's last step)."""
    return fatal_alarms(scalars.written(LOSS_TAG), scalars.written(LOSS_SCALE_TAG), min_loss_scale)

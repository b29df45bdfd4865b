"""Divergence alarms from training scalars. Pure: series in, alarms out (no I/O).

``detect`` looks at one run's series (``RunScalars.series(tag)``: one point per step, sorted) and reports
every kind of trouble it finds, each with the step where the trouble *began*, so a rollback can pick a
checkpoint from before it:

- ``nan_loss``: the loss is NaN or +/-inf (first such step);
- ``loss_spike``: the loss jumps ``z_threshold`` robust standard deviations above the median of the
  trailing ``window`` points (median/MAD, so the spike itself and ordinary noise do not mask it) and stays
  there for ``spike_patience`` points;
- ``grad_explosion``: the gradient norm exceeds ``grad_factor`` x the trailing median for
  ``grad_patience`` points in a row;
- ``loss_scale_collapse``: FP16 dynamic loss scaling halved at least ``scale_halvings`` times in a chain
  (halvings at most ``window`` points apart, no increase between) down to within one halving of
  ``min_loss_scale``; or, without such a chain, the scale sat at or below ``min_loss_scale`` for the last
  ``stuck_points`` points (DeepSpeed gives up there: "Current loss scale already at minimum");
- ``stalled_throughput``: samples/s below ``throughput_fraction`` x the run's median for
  ``throughput_patience`` points in a row (the first ``throughput_warmup`` points are not judged).

This is the one divergence detector. ``hpc_agent.diagnosis.alarms.fatal_alarms`` picks the fatal kinds
(``FATAL_KINDS``: non-finite loss, loss-scale collapse) out of it for the classifier, under the names
``LEGACY_KIND`` gives them (``nonfinite_loss``, ``loss_scale_at_minimum``). Series items may be
``Point``-like objects (``.step``, ``.value``) or ``(step, value)`` pairs. What an alarm is, and the kinds'
names, live in ``hpc_agent/metrics/alarm_kinds.py`` (no numpy: login-side readers import them).
"""
from __future__ import annotations

import math
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from hpc_agent.metrics.alarm_kinds import (GRAD_EXPLOSION, KINDS, LOSS_SCALE_COLLAPSE, LOSS_SPIKE, NAN_LOSS,
                                           STALLED_THROUGHPUT, Alarm)


MAD_TO_SIGMA = 1.4826
_CHUNK = 20_000  # rows of trailing windows evaluated at once (bounds memory to ~CHUNK x window floats)



def _pairs(series: Sequence[Any]) -> Tuple[np.ndarray, np.ndarray]:
    """(steps, values) sorted by step, from Points or (step, value) pairs."""
    steps: List[int] = []
    values: List[float] = []
    for item in series:
        if hasattr(item, "step"):
            steps.append(int(item.step))
            values.append(float(item.value))
        else:
            steps.append(int(item[0]))
            values.append(float(item[1]))
    s = np.asarray(steps, dtype=np.int64)
    v = np.asarray(values, dtype=np.float64)
    if len(s) > 1 and np.any(np.diff(s) < 0):
        order = np.argsort(s, kind="stable")
        s, v = s[order], v[order]
    return s, v


def _trailing_median_mad(v: np.ndarray, window: int, min_history: int, with_mad: bool, start: int = 0):
    """For each i >= ``start``: median (and MAD) of ``v[max(0, i-window):i]``; NaN where fewer than
    ``min_history``, and before ``start`` (context points are never judged, so their statistics are not needed:
    the short windows at the start cost one ``np.median`` each, ~3 ms of the job's every step at 50 points)."""
    n = len(v)
    med = np.full(n, np.nan)
    mad = np.full(n, np.nan)
    for i in range(max(start, min_history), min(n, window)):  # the short windows at the start
        w = v[:i]
        med[i] = np.median(w)
        if with_mad:
            mad[i] = np.median(np.abs(w - med[i]))
    if n > window:
        windows = np.lib.stride_tricks.sliding_window_view(v, window)[:-1]  # row j = v[j:j+window] -> i=j+window
        first = max(0, start - window)  # row of the first i >= start
        for lo in range(first, len(windows), _CHUNK):
            rows = windows[lo:lo + _CHUNK]
            m = np.median(rows, axis=1)
            med[window + lo:window + lo + len(rows)] = m
            if with_mad:
                mad[window + lo:window + lo + len(rows)] = np.median(np.abs(rows - m[:, None]), axis=1)
    return med, mad


def _first_run(mask: np.ndarray, patience: int) -> int:
    """Index where the first run of ``patience`` consecutive True values starts, or -1."""
    run = 0
    for i, hit in enumerate(mask.tolist()):
        run = run + 1 if hit else 0
        if run >= patience:
            return i - patience + 1
    return -1


def _nan_loss(steps, values) -> List[Alarm]:
    bad = ~np.isfinite(values)
    if not bad.any():
        return []
    i = int(np.argmax(bad))
    return [Alarm(NAN_LOSS, int(steps[i]), f"train/loss is {values[i]} at step {int(steps[i])}")]


def _loss_spike(steps, values, window, z_threshold, spike_patience, min_history, rel_floor,
                context_points=0) -> List[Alarm]:
    finite = np.isfinite(values)
    if not finite.all():  # judge only the part before the loss went non-finite (that is nan_loss)
        cut = int(np.argmax(~finite))
        steps, values = steps[:cut], values[:cut]
    if len(values) <= min_history:
        return []
    med, mad = _trailing_median_mad(values, window, min_history, with_mad=True, start=context_points)
    scale = np.maximum(MAD_TO_SIGMA * mad, rel_floor * np.abs(med))
    scale = np.maximum(scale, 1e-12)
    with np.errstate(invalid="ignore"):
        z = (values - med) / scale
    mask = np.nan_to_num(z, nan=-np.inf) > z_threshold
    mask[:context_points] = False
    i = _first_run(mask, spike_patience)
    if i < 0:
        return []
    return [Alarm(LOSS_SPIKE, int(steps[i]),
                  f"train/loss {values[i]:.6g} at step {int(steps[i])} is {z[i]:.1f} robust sigmas above the "
                  f"trailing median {med[i]:.6g} (window {window}), for {spike_patience}+ points")]


def _grad_explosion(steps, values, window, grad_factor, grad_patience, min_history, context_points=0) -> List[Alarm]:
    finite = np.isfinite(values)
    steps, values = steps[finite], values[finite]  # inf norms on FP16 overflow steps are loss-scale business
    if len(values) <= min_history:
        return []
    med, _ = _trailing_median_mad(values, window, min_history, with_mad=False, start=context_points)
    with np.errstate(invalid="ignore"):
        mask = np.nan_to_num(values > grad_factor * np.maximum(med, 1e-12), nan=False) & ~np.isnan(med)
    mask[:context_points] = False
    i = _first_run(mask, grad_patience)
    if i < 0:
        return []
    return [Alarm(GRAD_EXPLOSION, int(steps[i]),
                  f"grad norm {values[i]:.6g} at step {int(steps[i])} is {values[i] / med[i]:.0f}x the trailing "
                  f"median {med[i]:.6g}, for {grad_patience}+ points in a row")]


def _stuck_at_minimum(steps, values, min_loss_scale, stuck_points) -> Optional[int]:
    """First step of the trailing stretch at or below the minimum, if the last ``stuck_points`` are."""
    if stuck_points <= 0 or len(values) < stuck_points or not np.all(values[-stuck_points:] <= min_loss_scale):
        return None
    above = np.nonzero(values > min_loss_scale)[0]
    return int(steps[above[-1] + 1 if len(above) else 0])


def _loss_scale_collapse(steps, values, window, min_loss_scale, scale_halvings, stuck_points) -> List[Alarm]:
    finite = np.isfinite(values)
    steps, values = steps[finite], values[finite]
    stuck = _stuck_at_minimum(steps, values, min_loss_scale, stuck_points)
    also = f"; train/loss_scale stuck at the minimum {min_loss_scale:g} since step {stuck}" if stuck is not None else ""
    chain_start = -1  # index of the first decrease of the current chain
    halvings = 0
    last_drop = -1
    for i in range(1, len(values)):
        prev, cur = values[i - 1], values[i]
        if cur > prev:  # the scaler grew again: training recovered
            chain_start, halvings, last_drop = -1, 0, -1
            continue
        if cur < prev:
            if chain_start < 0 or i - last_drop > window:
                chain_start, halvings = i, 0
            halvings += max(1, int(round(math.log2(prev / cur)))) if cur > 0 else 1
            last_drop = i
            if halvings >= scale_halvings and cur <= 2.0 * min_loss_scale:
                return [Alarm(LOSS_SCALE_COLLAPSE, int(steps[chain_start]),
                              f"loss scale halved {halvings} times from {values[chain_start - 1]:g} at step "
                              f"{int(steps[chain_start])} to {cur:g} at step {int(steps[i])} (minimum "
                              f"{min_loss_scale:g}){also}")]
    if stuck is not None:
        return [Alarm(LOSS_SCALE_COLLAPSE, stuck, also[2:])]
    return []


def _stalled_throughput(steps, values, throughput_fraction, throughput_patience, throughput_warmup) -> List[Alarm]:
    judged = np.arange(len(values)) >= throughput_warmup
    finite = np.isfinite(values)
    ref_values = values[finite & judged]
    if len(ref_values) < throughput_patience:
        return []
    median = float(np.median(ref_values))
    if median <= 0:
        return []
    mask = judged & ((values < throughput_fraction * median) | ~finite)
    i = _first_run(mask, throughput_patience)
    if i < 0:
        return []
    return [Alarm(STALLED_THROUGHPUT, int(steps[i]),
                  f"throughput {values[i]:.6g} samples/s at step {int(steps[i])} is below {throughput_fraction:g}"
                  f" x the run's median {median:.6g} for {throughput_patience}+ points")]


def newest_loss_may_alarm(values: Sequence[float], *, window: int = 50, z_threshold: float = 6.0,
                          min_history: int = 10, rel_floor: float = 1e-3) -> bool:
    """False when the newest of ``values`` (a loss series, oldest first) is finite and not a spike point as
    :func:`_loss_spike` judges it against its own trailing window; True otherwise, and also with some margin
    near the threshold. For a caller that ran :func:`detect` at every earlier point, False means that
    :func:`detect` would find no loss alarm it had not found before: a run of spike points needs its newest
    point, and a point's trailing statistics never change. The job checks every step with this (a sort of at
    most ``window`` floats) and runs :func:`detect` only on True: detect costs ~0.7 ms of a training step."""
    if not values:
        return False
    newest = values[-1]
    history = values[max(0, len(values) - 1 - window):-1]
    if not math.isfinite(newest + sum(history)):  # a NaN or an infinity in view (or a sum that overflowed: True is safe)
        return True
    if len(history) < max(1, min_history):  # not judged yet (the detector's NaN median)
        return False
    ordered = sorted(history)
    med = _sorted_median(ordered)
    limit = 0.9 * z_threshold  # the margin: detect decides the near cases
    # The scale is at least the floor, whatever the MAD: below the limit there, the MAD's sort is not needed (the
    # common case; the job runs this after every step, ~40 us there with the caches cold from the step's compute).
    if newest - med <= limit * max(rel_floor * abs(med), 1e-12):
        return False
    mad = _sorted_median(sorted(abs(x - med) for x in ordered))
    scale = max(MAD_TO_SIGMA * mad, rel_floor * abs(med), 1e-12)
    return (newest - med) / scale > limit


def _sorted_median(ordered: Sequence[float]) -> float:
    n = len(ordered)
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def detect(loss: Sequence[Any], grad_norm: Sequence[Any] = (), loss_scale: Sequence[Any] = (),
           throughput: Sequence[Any] = (), *, window: int = 50, z_threshold: float = 6.0,
           spike_patience: int = 2, min_history: int = 10, rel_floor: float = 1e-3,
           grad_factor: float = 10.0, grad_patience: int = 3,
           min_loss_scale: float = 1.0, scale_halvings: int = 4, stuck_points: int = 3,
           throughput_fraction: float = 0.5, throughput_patience: int = 10,
           throughput_warmup: int = 5, context_points: int = 0) -> List[Alarm]:
    """Every alarm found, ordered by the step where it began (ties: the order of ``KINDS``).

    ``context_points``: the first so many loss and gradient-norm points only fill the trailing window; no
    spike or explosion starts among them. For a series cut from a longer one (the job keeps its last few
    hundred points): judged on what was left of their window, its first points would be judged against as
    few as ``min_history`` points, every step anew, and one of them sooner or later looks like a spike."""
    alarms: List[Alarm] = []
    s, v = _pairs(loss)
    if len(v):
        alarms += _nan_loss(s, v)
        alarms += _loss_spike(s, v, window, z_threshold, spike_patience, min_history, rel_floor, context_points)
    s, v = _pairs(grad_norm)
    if len(v):
        alarms += _grad_explosion(s, v, window, grad_factor, grad_patience, min_history, context_points)
    s, v = _pairs(loss_scale)
    if len(v):
        alarms += _loss_scale_collapse(s, v, window, min_loss_scale, scale_halvings, stuck_points)
    s, v = _pairs(throughput)
    if len(v):
        alarms += _stalled_throughput(s, v, throughput_fraction, throughput_patience, throughput_warmup)
    return sorted(alarms, key=lambda a: (a.step, KINDS.index(a.kind)))

"""Divergence alarms: a table of runs (healthy noisy runs and one kind of trouble each) -> (kind, start step)."""
from __future__ import annotations

import math
import random

import pytest

from hpc_agent.metrics.alarm_kinds import (GRAD_EXPLOSION, LEGACY_KIND, LOSS_SCALE_COLLAPSE, LOSS_SPIKE, NAN_LOSS,
                                           STALLED_THROUGHPUT, Alarm as LegacyAlarm, Alarm)
from hpc_agent.metrics.divergence import detect
from hpc_agent.metrics.tb_reader import Point

N = 1000


def healthy(seed: int):
    """A noisy but healthy run: decaying loss, log-normal grad norms, FP16 loss scale that calibrates down
    a few times at the start and grows back, throughput with a slow warm-up."""
    rng = random.Random(seed)
    loss, grad, scale, tput = [], [], [], []
    s = 65536.0
    for step in range(1, N + 1):
        loss.append(Point(step, 1000.0 + step, 2.0 * math.exp(-step / 300) + 1.0 + rng.gauss(0, 0.05)))
        grad.append(Point(step, 1000.0 + step, (1.5 - step / N) * math.exp(rng.gauss(0, 0.3))))
        if step in (2, 3, 4):
            s /= 2  # initial calibration: 65536 -> 8192
        elif step % 250 == 0:
            s *= 2
        scale.append(Point(step, 1000.0 + step, s))
        tput.append(Point(step, 1000.0 + step, (20.0 if step <= 3 else 100.0) + rng.gauss(0, 5)))
    return {"loss": loss, "grad_norm": grad, "loss_scale": scale, "throughput": tput}


def with_values(points, start, fn, stop=None):
    return [Point(p.step, p.wall_time, fn(p.value, p.step)) if p.step >= start and (stop is None or p.step < stop)
            else p for p in points]


def nan_at(run):
    run["loss"] = with_values(run["loss"], 400, lambda v, s: float("nan"))
    return run


def inf_at(run):
    run["loss"] = with_values(run["loss"], 300, lambda v, s: float("inf") if s == 300 else v)
    return run


def spike(run):
    run["loss"] = with_values(run["loss"], 600, lambda v, s: v + 3.0, stop=620)
    return run


def grad_explosion(run):
    run["grad_norm"] = with_values(run["grad_norm"], 500, lambda v, s: v * 100.0 * (1 + (s - 500) / 10))
    return run


def scale_collapse(run):
    # from step 700 the scale halves every 5 steps until the minimum 1.0 (DeepSpeed stops halving there)
    before = {p.step: p.value for p in run["loss_scale"]}
    start_value = before[699]

    def collapse(v, s):
        halvings = (s - 700) // 5 + 1
        return max(1.0, start_value / 2 ** halvings)

    run["loss_scale"] = with_values(run["loss_scale"], 700, collapse)
    return run


def stall(run):
    run["throughput"] = with_values(run["throughput"], 800, lambda v, s: 10.0, stop=850)
    return run


def single_blip(run):
    run["loss"] = with_values(run["loss"], 450, lambda v, s: v + 3.0, stop=451)  # one bad batch, recovers
    run["grad_norm"] = with_values(run["grad_norm"], 450, lambda v, s: v * 50, stop=452)
    return run


CASES = [
    ("nan", nan_at, [(NAN_LOSS, 400)]),
    ("inf", inf_at, [(NAN_LOSS, 300)]),
    ("spike", spike, [(LOSS_SPIKE, 600)]),
    ("grad_explosion", grad_explosion, [(GRAD_EXPLOSION, 500)]),
    ("loss_scale_collapse", scale_collapse, [(LOSS_SCALE_COLLAPSE, 700)]),
    ("stalled_throughput", stall, [(STALLED_THROUGHPUT, 800)]),
    ("single_blip_is_not_divergence", single_blip, []),
    ("healthy", lambda run: run, []),
]


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 5])
@pytest.mark.parametrize("name,make,expected", CASES, ids=[c[0] for c in CASES])
def test_table(name, make, expected, seed):
    run = make(healthy(seed))
    alarms = detect(run["loss"], run["grad_norm"], run["loss_scale"], run["throughput"])
    assert [(a.kind, a.step) for a in alarms] == expected, alarms
    assert all(isinstance(a, LegacyAlarm) and a.detail for a in alarms)


def test_several_troubles_ordered_by_start_and_pairs_accepted():
    run = stall(grad_explosion(healthy(7)))
    pairs = {k: [(p.step, p.value) for p in v] for k, v in run.items()}
    alarms = detect(**pairs)
    assert [(a.kind, a.step) for a in alarms] == [(GRAD_EXPLOSION, 500), (STALLED_THROUGHPUT, 800)]


def test_empty_and_short_series():
    assert detect([]) == []
    assert detect([(1, 2.0), (2, 50.0)]) == []
    assert detect([(1, 2.0), (2, float("nan"))]) == [Alarm(NAN_LOSS, 2, "train/loss is nan at step 2")]


def test_loss_scale_already_low_needs_a_chain_of_halvings():
    # a scale that starts low and sits near the minimum without a run of halvings is not a collapse
    assert detect([], loss_scale=[(s, 2.0) for s in range(100)]) == []
    chain = [(s, max(1.0, 1024.0 / 2 ** max(0, s - 9))) for s in range(30)]  # halves every step from step 10
    assert [(a.kind, a.step) for a in detect([], loss_scale=chain)] == [(LOSS_SCALE_COLLAPSE, 10)]


def test_legacy_kind_mapping():
    assert LEGACY_KIND == {NAN_LOSS: "nonfinite_loss", LOSS_SCALE_COLLAPSE: "loss_scale_at_minimum"}


# --- the fatal alarms: one function for the watcher and diagnose ---------------------------------------
def points(pairs):
    return [Point(step, 1000.0 + i, value) for i, (step, value) in enumerate(pairs)]


NAN_RUN = [(1, 5.0), (2, 4.0), (3, math.nan), (4, math.nan)]
STUCK = [(1, 4.0), (2, 1.0), (3, 1.0), (4, 1.0)]       # two halvings, then three points at the minimum
CHAIN = [(1, 1024.0), (2, 8.0), (3, 1.0), (4, 1.0), (5, 1.0), (6, 1.0)]


@pytest.mark.parametrize("loss, scale, min_scale, expected", [
    (NAN_RUN, [], 1.0, [("nonfinite_loss", 3, "train/loss is nan at step 3")]),
    ([(29, 2.0), (30, math.nan), (21, 2.1), (22, 2.0)], [], 1.0, []),   # NaN before a restart: history
    ([], STUCK, 1.0, [("loss_scale_at_minimum", 2, "train/loss_scale stuck at the minimum 1 since step 2")]),
    ([], STUCK, 0.5, []),                                                 # above this run's minimum
    ([], [(1, 1.0), (2, 1.0), (3, 2.0)], 1.0, []),                        # it recovered
    ([], [(1, 1.0), (2, 1.0)], 1.0, []),                                  # too short to call it stuck
    ([], CHAIN, 1.0, [("loss_scale_at_minimum", 2, "loss scale halved 10 times from 1024 at step 2 to 1 at step 3 "
                       "(minimum 1); train/loss_scale stuck at the minimum 1 since step 3")]),
    ([(s, 3.0) for s in range(1, 60)] + [(60, 300.0), (61, 300.0)], [], 1.0, []),  # a spike is not fatal
])
def test_fatal_alarms(loss, scale, min_scale, expected):
    from hpc_agent.diagnosis.alarms import fatal_alarms

    found = fatal_alarms(loss, scale, min_scale)
    assert [(a.kind, a.step, a.detail) for a in found] == expected
    assert all(isinstance(a, LegacyAlarm) for a in found)
    if all(b[0] > a[0] for a, b in zip(loss, loss[1:])):  # RunScalars.series' Points give the same answer
        assert fatal_alarms(points(loss), points(scale), min_scale) == found


def test_fatal_alarms_are_detects_fatal_kinds():
    """The watcher's old path (detect + LEGACY_KIND, fatal kinds only) and fatal_alarms agree on a sorted series."""
    from hpc_agent.diagnosis.alarms import fatal_alarms

    loss, scale = points(NAN_RUN), points(CHAIN[:4])
    old = [LegacyAlarm(LEGACY_KIND[a.kind], a.step, a.detail) for a in detect(loss, loss_scale=scale)
           if a.kind in (NAN_LOSS, LOSS_SCALE_COLLAPSE)]
    assert fatal_alarms(loss, scale, 1.0) == old and len(old) == 2


def test_context_points_only_fill_the_window():
    """``context_points``: no spike or explosion starts among the first points; one after them still does."""
    flat = [(s, 2.0 + 0.01 * (s % 3)) for s in range(1, 61)]
    early = [(s, 9.0 if s in (15, 16) else v) for s, v in flat]
    assert [a.step for a in detect(early) if a.kind == LOSS_SPIKE] == [15]
    assert [a for a in detect(early, context_points=20) if a.kind == LOSS_SPIKE] == []
    late = [(s, 9.0 if s in (15, 16, 40, 41) else v) for s, v in flat]
    assert [a.step for a in detect(late, context_points=20) if a.kind == LOSS_SPIKE] == [40]
    norms = [(s, 100.0 if s in (15, 16, 17, 45, 46, 47) else 1.0) for s in range(1, 61)]
    assert [a.step for a in detect([], norms) if a.kind == GRAD_EXPLOSION] == [15]
    assert [a.step for a in detect([], norms, context_points=20) if a.kind == GRAD_EXPLOSION] == [45]


def test_statistics_are_computed_only_where_points_are_judged():
    """_trailing_median_mad(start=): context points get no statistics (NaN), the rest the same values."""
    import numpy as np

    from hpc_agent.metrics.divergence import _trailing_median_mad

    v = np.asarray([2.0 + 0.1 * ((7 * i) % 5) for i in range(130)])
    full_med, full_mad = _trailing_median_mad(v, 50, 10, with_mad=True)
    for start in (0, 5, 30, 50, 77, 129, 200):
        med, mad = _trailing_median_mad(v, 50, 10, with_mad=True, start=start)
        assert np.isnan(med[:start]).all() and np.isnan(mad[:start]).all()
        np.testing.assert_array_equal(med[start:], full_med[start:])
        np.testing.assert_array_equal(mad[start:], full_mad[start:])

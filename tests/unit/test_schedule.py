"""launch.lr_schedule: linear warmup then cosine to lr * min_lr_ratio (pure, table-driven)."""
import math

import pytest

from launch.lr_schedule import lr_at, lr_factor

# (step, warmup, total, min_ratio, expected factor)
CASES = [
    (0, 10, 100, 0.1, 0.1),          # first update already moves: 1/warmup
    (4, 10, 100, 0.1, 0.5),
    (9, 10, 100, 0.1, 1.0),          # last warmup update hits the peak
    (10, 10, 100, 0.1, 1.0),         # cosine starts at the peak
    (99, 10, 100, 0.1, 0.1),         # ...and ends at the floor on the last update
    (54, 10, 100, 0.1, 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 44 / 89))),
    (150, 10, 100, 0.1, 0.1),        # past the end: stays at the floor
    (0, 0, 10, 0.0, 1.0),            # no warmup
    (9, 0, 10, 0.0, 0.0),            # min_lr_ratio 0 decays to zero
    (5, 0, 10, 1.0, 1.0),            # min_lr_ratio 1: constant
    (3, 10, 5, 0.1, 0.4),            # warmup longer than the run: still linear
    (0, 1, 1, 0.1, 1.0),             # single-step run
]


@pytest.mark.parametrize("step,warmup,total,min_ratio,expected", CASES)
def test_lr_factor(step, warmup, total, min_ratio, expected):
    assert lr_factor(step, warmup, total, min_ratio) == pytest.approx(expected)


def test_monotone_after_warmup_and_bounded():
    values = [lr_factor(s, 5, 50, 0.2) for s in range(50)]
    assert values[:5] == sorted(values[:5])
    assert values[4:] == sorted(values[4:], reverse=True)
    assert min(values) == pytest.approx(0.2) and max(values) == pytest.approx(1.0)


def test_lr_at_scales_peak():
    assert lr_at(9, 3e-4, 10, 100, 0.1) == pytest.approx(3e-4)


def test_negative_step_rejected():
    with pytest.raises(ValueError):
        lr_factor(-1, 10, 100, 0.1)

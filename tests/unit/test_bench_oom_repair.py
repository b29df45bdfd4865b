"""Pure helpers of scripts/bench/oom_repair.py: seeded case generation and judging an outcome."""
from __future__ import annotations

import pytest
from scripts.bench import oom_repair as bench


def fake_rungs(knobs):
    """Estimates that halve with the micro-batch, like activations dominate."""
    mbs = knobs["train.micro_batch_size"]
    out = [({}, mbs * 2**20)]
    while mbs > 1:
        mbs //= 2
        out.append(({"train.micro_batch_size": mbs}, mbs * 2**20))
    out.append(({"train.offload": "optimizer"}, 1))
    return out


def test_cases_are_seeded_varied_and_inject_an_oom_that_some_rung_fixes():
    cases = bench.make_cases(20, 7, ["halving", "estimator"], fake_rungs)
    assert cases == bench.make_cases(20, 7, ["halving", "estimator"], fake_rungs)
    assert cases != bench.make_cases(20, 8, ["halving", "estimator"], fake_rungs)
    assert [c["ladder"] for c in cases].count("estimator") == 20
    for case in cases:
        mbs = case["overrides"]["train.micro_batch_size"]
        if case["ladder"] == "halving":
            assert 1 <= case["limit_micro_batch"] < mbs  # the first attempt OOMs
            assert case["overrides"]["faults.first_attempt_only"] is False
        else:
            cap = case["capacity_mib"] * 2**20
            lowest_without_offload = 2**20  # fake_rungs: micro-batch 1
            assert lowest_without_offload <= cap < mbs * 2**20
            assert case["overrides"]["faults.gpu_memory_gib"] == pytest.approx(case["capacity_mib"] / 1024)
    assert len({c["overrides"]["train.micro_batch_size"] for c in cases}) >= 3


def test_as_overrides_writes_booleans_as_yaml():
    assert bench.as_overrides({"a.b": False, "c.d": 4}) == ["a.b=false", "c.d=4"]


OOM = {"cause": "gpu_oom", "action": "resubmit", "patch": {"train.micro_batch_size": 4}, "reason": "halve"}
LOG_KEPT = "global batch 8 = 8 x 1 x 1 ranks\n...\nglobal batch 8 = 4 x 2 x 1 ranks\n"


@pytest.mark.parametrize("decisions, phase, log, fixed, kept", [
    ([OOM], "completed", LOG_KEPT, True, True),
    ([OOM, {**OOM, "action": "stop"}], "stopped", LOG_KEPT, False, True),   # the first retry OOMed again
    ([OOM], "completed", "global batch 8 = 8 x 1 x 1 ranks\nglobal batch 4 = 4 x 1 x 1 ranks\n", True, False),
    ([{**OOM, "cause": "code_error", "action": "stop"}], "stopped", "", False, False),  # no OOM injected
])
def test_judge(decisions, phase, log, fixed, kept):
    outcome = bench.judge({}, decisions, phase, log)
    assert outcome["fixed_first_retry"] is fixed
    assert outcome["global_batch_kept"] is kept
    assert outcome["fixed_and_kept"] is (fixed and kept)


def test_rate_counts_only_cases_where_the_oom_was_injected():
    outcomes = [{"injected_oom": True, "fixed_and_kept": True}] * 19 + [{"injected_oom": True, "fixed_and_kept": False},
                                                                          {"injected_oom": False}]
    assert bench.rate(outcomes) == {"fixed": 19, "injected": 20, "rate": 0.95, "target": 0.95, "met": True}

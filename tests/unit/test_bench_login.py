"""Pure helpers of scripts/bench/login.py: the alternating schedule and the summary with its targets."""
from __future__ import annotations

import pytest
from scripts.bench import login as bench


def test_schedule_alternates_and_flips_the_first_command_every_round():
    assert bench.schedule(3, ["a", "b"]) == [(0, "a"), (0, "b"), (1, "b"), (1, "a"), (2, "a"), (2, "b")]


@pytest.mark.parametrize("ours, ref, ratio, met_s, met_ratio", [
    ([0.2, 0.3, 0.25], [1.0, 1.5, 1.4], 0.179, True, True),
    ([0.6, 0.6, 0.6], [1.5, 1.5, 1.5], 0.4, False, False),
    ([0.45, 0.45, 0.45], [1.0, 1.0, 1.0], 0.45, True, False),
])
def test_summarise_reports_medians_ratio_and_targets(ours, ref, ratio, met_s, met_ratio):
    summary = bench.summarise({"ours": ours, "ref": ref}, "ours", "ref")
    assert summary["ratio_ours_over_reference"] == pytest.approx(ratio, abs=1e-3)
    assert summary["met"] == {"seconds": met_s, "ratio": met_ratio}
    assert summary["ours"]["runs"] == 3

"""Issue 3, item 5: with the best imbalance method, balanced accuracy beats plain cross-entropy by
at least 10 points. A smaller version of ``scripts/bench_imbalance.py`` (same training loop)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parent.parent / "scripts" / "bench_imbalance.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_imbalance", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_best_imbalance_method_beats_plain_cross_entropy_by_10_points(tmp_path):
    bench = load_bench()
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        # The default data (1:50, 20000 samples) with a short budget (200 steps, ~1.3 epochs) and
        # two seeds averaged; the gain is ~18-20 points for every seed pair tried (1..6).
        result = bench.run_benchmark(methods=bench.METHODS, seeds=[1, 2], budgets=[200], ratios=[50.0],
                                     num_samples=20000, log=lambda *_: None)
    finally:
        torch.set_num_threads(before)
    verdict = result["verdicts"][0]
    table = bench.markdown(result)
    assert verdict["best_balanced_accuracy"] >= verdict["none_balanced_accuracy"] + 0.10, table
    # Every balancing method should help, not just the best one.
    for row in result["summary"]:
        if row["method"] != "none":
            assert row["balanced_accuracy"] > verdict["none_balanced_accuracy"], table

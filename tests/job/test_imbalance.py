"""Issue 3, item 5: with the best imbalance method, balanced accuracy beats plain cross-entropy by
at least 10 points. A smaller version of ``scripts/bench/imbalance.py`` (same training loop)."""
from __future__ import annotations

import pytest
import torch



def load_bench():
    from scripts.bench import imbalance

    return imbalance


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


@pytest.mark.slow
def test_through_the_training_job_the_gain_holds_with_the_adaptive_schedule_off_and_on(tmp_path):
    """Issue 21: the same benchmark through the toolkit's training job (``--loop trainer``: DeepSpeed, warmup +
    cosine), with the adaptive schedule off and on. On, it is set to react within this short run (a plateau of 5
    log points of the training loss), so at least one warm restart happens; the balancing method still beats plain
    cross-entropy by at least 10 points either way (measured: +15.0 off, +15.6 on)."""
    bench = load_bench()
    result = bench.run_benchmark(
        methods=["none", "weighted_sampler"], seeds=[1], budgets=[400], ratios=[50.0], num_samples=20000,
        log=lambda *_: None, loop="trainer", adaptive=("off", "on"), eval_every=50, work_dir=tmp_path,
        adaptive_settings={"plateau_metric": "train", "plateau_window": 5, "restart_warmup_steps": 25,
                           "cooldown_steps": 25})
    table = bench.markdown(result)
    assert [(v["adaptive"], v["best_method"]) for v in result["verdicts"]] == [
        ("off", "weighted_sampler"), ("on", "weighted_sampler")], table
    for verdict in result["verdicts"]:
        assert verdict["gain_points"] >= 10, table
    made = {mode: sum(len(r["adaptations"]) for r in result["runs"] if r["adaptive"] == mode) for mode in ("off", "on")}
    assert made["off"] == 0 and made["on"] >= 1, table
    assert all(r["repairs"] == [] for r in result["runs"]), table  # a healthy run: no in-job rollback


def test_adaptive_on_needs_the_training_job(capsys):
    bench = load_bench()
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--adaptive", "on", "--steps", "10", "--seeds", "1", "--methods", "none"])
    assert exit_info.value.code == 2
    assert "--adaptive on needs --loop trainer" in capsys.readouterr().err


def test_summarise_pairs_adaptivity_on_and_off_by_seed():
    bench = load_bench()

    def row(mode, method, seed, bal):
        return {"ratio": 50.0, "steps": 400, "adaptive": mode, "method": method, "seed": seed, "seconds": 1.0,
                "eval/balanced_accuracy": bal, "eval/macro_f1": 0.5, "eval/accuracy": 0.9,
                "adaptations": ["warm_restart@300"] if mode == "on" else [], "repairs": []}

    runs = [row("off", "none", 1, 0.60), row("off", "none", 2, 0.70), row("on", "none", 1, 0.62),
            row("on", "none", 2, 0.69), row("off", "class_weight", 1, 0.80), row("on", "class_weight", 1, 0.70)]
    result = bench.summarise(runs)
    by = {(a["method"]): a for a in result["adaptivity"]}
    assert by["none"]["seeds"] == 2
    assert by["none"]["on_minus_off_points"] == pytest.approx(0.5)  # (+2 - 1) / 2
    assert by["none"]["on_minus_off_std_points"] == pytest.approx(2.1213, abs=1e-3)
    assert by["none"]["not_worse"] is True  # within one standard error of zero
    assert by["class_weight"]["not_worse"] is False and by["class_weight"]["on_minus_off_points"] == pytest.approx(-10)
    summary = {(s["adaptive"], s["method"]): s for s in result["summary"]}
    assert summary[("on", "none")]["adaptations"] == 2 and summary[("off", "none")]["adaptations"] == 0
    assert [(v["adaptive"], v["best_method"], round(v["gain_points"], 6)) for v in result["verdicts"]] == [
        ("off", "class_weight", 15.0), ("on", "class_weight", 4.5)]

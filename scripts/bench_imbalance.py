"""Benchmark the classifier's imbalance methods against plain cross-entropy (issue 3, item 5).

Every method trains the same MLP with a plain torch loop (AdamW, the same steps, batch size and
learning rate for all) through the workload's own ``batch()``/``loss()``/``evaluate()``, for several
training seeds and one or more step budgets. Results go to ``results/bench_imbalance.json`` and a
Markdown table is printed.

    python scripts/bench_imbalance.py                      # defaults below, ~1.5 minutes on 1 core
    python scripts/bench_imbalance.py --steps 300 --seeds 1 2 --ratios 50

Defaults: the workload's generated dataset (5 classes, 32 features, 20000 training samples) at the
default 1:50 imbalance (smallest class ~250 training samples) and at 1:100 (~130), 5 training seeds,
budgets of 400 steps (~2.5 epochs) and 1500 steps (~10 epochs) of 128 samples. Two budgets because
the gap depends on training length: plain cross-entropy partly catches up with long training (it
ends up fitting the few minority samples), while the balanced methods win early and keep a margin.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

METHODS = ("none", "class_weight", "weighted_sampler", "mixup", "smote")


def make_config(method: str, seed: int, ratio: float, num_samples: int, num_classes: int = 5):
    from hpc_agent.config.load import build_config

    return build_config([{
        "train": {"workload": "classifier", "seed": seed},
        "data": {"imbalance_method": method, "imbalance_ratio": ratio, "num_samples": num_samples,
                 "num_classes": num_classes},
        "model": {"n_layers": 2, "d_model": 64, "dropout": 0.0},
    }])


def train_and_evaluate(cfg, steps: int, batch_size: int = 128, lr: float = 3e-3) -> dict:
    """Build the workload, train ``steps`` AdamW steps on one process, return its eval metrics."""
    import torch

    from launch.workloads import build_workload

    started = time.perf_counter()
    workload = build_workload(cfg)
    model = workload.model
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    model.train()
    for step in range(steps):
        # One rank, no accumulation: optimizer step s reads samples s*B .. (s+1)*B-1 of the stream.
        loss = workload.loss(model, workload.batch(step * batch_size, batch_size))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    metrics = workload.evaluate(model)
    metrics["seconds"] = time.perf_counter() - started
    return metrics


def run_benchmark(methods, seeds, budgets, ratios, num_samples, batch_size=128, lr=3e-3, log=print) -> dict:
    """Train every (ratio, steps, method, seed); summarise per (ratio, steps, method) over the seeds."""
    runs = []
    for ratio in ratios:
        for steps in budgets:
            for method in methods:
                for seed in seeds:
                    cfg = make_config(method, seed, ratio, num_samples)
                    metrics = train_and_evaluate(cfg, steps, batch_size, lr)
                    runs.append({"ratio": ratio, "steps": steps, "method": method, "seed": seed, **metrics})
                    log(f"  1:{ratio:<4g} steps={steps:<5} {method:<17} seed={seed}  "
                        f"balanced_acc={metrics['eval/balanced_accuracy']:.3f}  "
                        f"macro_f1={metrics['eval/macro_f1']:.3f}  {metrics['seconds']:.1f}s")
    summary, verdicts = [], []
    for ratio in ratios:
        for steps in budgets:
            rows = {}
            for method in methods:
                mine = [r for r in runs if (r["ratio"], r["steps"], r["method"]) == (ratio, steps, method)]
                bal = [r["eval/balanced_accuracy"] for r in mine]
                rows[method] = {
                    "ratio": ratio, "steps": steps, "method": method, "seeds": len(mine),
                    "balanced_accuracy": statistics.mean(bal),
                    "balanced_accuracy_std": statistics.pstdev(bal),
                    "macro_f1": statistics.mean(r["eval/macro_f1"] for r in mine),
                    "accuracy": statistics.mean(r["eval/accuracy"] for r in mine),
                    "seconds": statistics.mean(r["seconds"] for r in mine),
                }
            summary.extend(rows.values())
            best = max((r for r in rows.values() if r["method"] != "none"), key=lambda r: r["balanced_accuracy"])
            baseline = rows["none"]["balanced_accuracy"] if "none" in rows else float("nan")
            verdicts.append({"ratio": ratio, "steps": steps, "best_method": best["method"],
                             "best_balanced_accuracy": best["balanced_accuracy"],
                             "none_balanced_accuracy": baseline,
                             "gain_points": 100 * (best["balanced_accuracy"] - baseline)})
    return {"summary": summary, "verdicts": verdicts, "runs": runs}


def markdown(result: dict) -> str:
    lines = ["| imbalance | steps | method | balanced accuracy (mean ± sd) | macro-F1 | accuracy | seconds/run |",
             "|---|---:|---|---:|---:|---:|---:|"]
    for s in result["summary"]:
        lines.append(f"| 1:{s['ratio']:g} | {s['steps']} | {s['method']} | {s['balanced_accuracy']:.3f} ± "
                     f"{s['balanced_accuracy_std']:.3f} | {s['macro_f1']:.3f} | {s['accuracy']:.3f} | {s['seconds']:.1f} |")
    lines.append("")
    for v in result["verdicts"]:
        lines.append(f"1:{v['ratio']:g}, {v['steps']} steps: best = {v['best_method']} "
                     f"({v['best_balanced_accuracy']:.3f}), none = {v['none_balanced_accuracy']:.3f}, "
                     f"gain = {v['gain_points']:+.1f} points")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3, 4, 5])
    parser.add_argument("--steps", nargs="+", type=int, default=[400, 1500], help="step budgets")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--ratios", nargs="+", type=float, default=[50.0, 100.0],
                        help="largest:smallest class sizes to try")
    parser.add_argument("--num-samples", type=int, default=20000, help="training samples")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1 is fastest for this tiny MLP on a shared CPU)")
    parser.add_argument("--out", default=str(REPO / "results" / "bench_imbalance.json"))
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    result = run_benchmark(args.methods, args.seeds, args.steps, args.ratios, args.num_samples,
                           args.batch_size, args.lr)
    result["settings"] = {k: v for k, v in vars(args).items() if k != "out"}
    result["settings"].update(num_classes=5, num_features=32, model="MLP 2x64", optimizer="AdamW wd=0.01")
    result["total_seconds"] = time.perf_counter() - started
    out = Path(args.out)
    from hpc_agent.fsutil import atomic_write_json

    atomic_write_json(out, result)
    print()
    print(markdown(result))
    print(f"\nwrote {out} ({result['total_seconds']:.0f} s total)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

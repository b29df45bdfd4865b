"""Benchmark the classifier's imbalance methods against plain cross-entropy (issue 3, item 5), and the
adaptive LR schedule on vs off on the same imbalanced data (issue 21).

``--loop plain`` (the default) trains every method's MLP with a plain torch loop (AdamW, constant LR, the
same steps, batch size and learning rate for all) through the workload's own ``batch()``/``loss()``/
``evaluate()``. ``--loop trainer`` runs the toolkit's own training job instead (``python -m launch.train``
in a subprocess: DeepSpeed, warmup + cosine, evaluation every ``--eval-every`` steps), which is the only
loop with the adaptive schedule, so ``--adaptive on`` needs it. Several training seeds, one or more step
budgets. Results go to ``results/bench_imbalance.json`` (``--out``) and a Markdown table is printed.

    python -m scripts.bench.imbalance                      # defaults below, ~1.5 minutes on 1 core
    python -m scripts.bench.imbalance --steps 300 --seeds 1 2 --ratios 50
    python -m scripts.bench.imbalance --loop trainer --adaptive off on --methods class_weight \
        --ratios 50 --steps 1500 --out results/bench_adaptive.json    # ~15 s per run

Defaults: the workload's generated dataset (5 classes, 32 features, 20000 training samples) at the
default 1:50 imbalance (smallest class ~250 training samples) and at 1:100 (~130), 5 training seeds,
budgets of 400 steps (~2.5 epochs) and 1500 steps (~10 epochs) of 128 samples. Two budgets because
the gap depends on training length: plain cross-entropy partly catches up with long training (it
ends up fitting the few minority samples), while the balanced methods win early and keep a margin.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

METHODS = ("none", "class_weight", "weighted_sampler", "mixup", "smote")
EVAL_TAGS = ("eval/balanced_accuracy", "eval/macro_f1", "eval/accuracy")


def make_config(method: str, seed: int, ratio: float, num_samples: int, num_classes: int = 5,
                trainer: Optional[dict] = None, adaptive: Optional[dict] = None):
    """The classifier's config; ``trainer`` adds ``train:`` settings for the training job, ``adaptive``
    the ``adaptive:`` section (``{"enabled": True, ...}``)."""
    from hpc_agent.config.load import build_config

    return build_config([{
        "train": {"workload": "classifier", "seed": seed, **(trainer or {})},
        "data": {"imbalance_method": method, "imbalance_ratio": ratio, "num_samples": num_samples,
                 "num_classes": num_classes},
        "model": {"n_layers": 2, "d_model": 64, "dropout": 0.0},
        "adaptive": adaptive or {},
    }])


def trainer_settings(steps: int, batch_size: int, lr: float, eval_every: int) -> dict:
    """``train:`` for the training job: one CPU rank, FP32, a checkpoint every sixth of the run (what an
    in-job divergence rollback goes back to)."""
    return {"max_steps": steps, "micro_batch_size": batch_size, "grad_accum_steps": 1, "lr": lr,
            "warmup_steps": max(1, steps // 50), "precision": "fp32", "zero_stage": 0, "eval_every": eval_every,
            "log_every": 10, "ckpt_every": max(eval_every, steps // 6), "keep_checkpoints": 2, "weight_decay": 0.01}


def train_and_evaluate(cfg, steps: int, batch_size: int = 128, lr: float = 3e-3) -> dict:
    """Build the workload, train ``steps`` AdamW steps on one process, return its eval metrics."""
    import torch

    from launch.workloads.registry import build_workload

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


def train_with_trainer(cfg, work_dir: Path, threads: int = 1, timeout: float = 900) -> dict:
    """Run the toolkit's training job (``python -m launch.train``) on ``cfg`` in ``work_dir``; return the
    final evaluation's metrics from its TensorBoard log, and the adaptations its journal records."""
    from hpc_agent.core import in_job_journal, rundir
    from hpc_agent.policy.adaptive_lr import adaptation_kind
    from hpc_agent.config.load import to_yaml
    from hpc_agent.metrics.tb_reader import RunScalars

    started = time.perf_counter()
    work_dir.mkdir(parents=True, exist_ok=True)
    config, run_dir, log = work_dir / "config.yaml", work_dir / "run", work_dir / "train.log"
    config.write_text(to_yaml(cfg))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "SUBMITIT_")) and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p))
    with open(log, "w") as out:
        code = subprocess.run([sys.executable, "-m", "launch.train", str(config), str(run_dir)], cwd=str(REPO),
                              env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout).returncode
    if code != 0:
        raise RuntimeError(f"training job exited {code}; its log ({log}) ends:\n{log.read_text()[-3000:]}")
    scalars = RunScalars(rundir.tb_dir(run_dir))
    scalars.update()
    metrics = {tag: scalars.series(tag)[-1].value for tag in EVAL_TAGS}
    decisions, problems = in_job_journal.read(run_dir)
    if problems:
        raise RuntimeError(f"{run_dir}: in-job journal: {problems}")
    metrics["adaptations"] = [f"{adaptation_kind(d.reason)}@{d.step}" for d in decisions
                              if d.action == in_job_journal.ADAPT_ACTION]
    metrics["repairs"] = [f"{d.cause}@{d.step}" for d in decisions if d.action != in_job_journal.ADAPT_ACTION]
    metrics["seconds"] = time.perf_counter() - started
    return metrics


def run_benchmark(methods, seeds, budgets, ratios, num_samples, batch_size=128, lr=3e-3, log=print,
                  loop="plain", adaptive=("off",), eval_every=50, adaptive_settings=None, work_dir=None,
                  threads=1) -> dict:
    """Train every (ratio, steps, adaptive, method, seed); summarise per (ratio, steps, adaptive, method)
    over the seeds; compare each method with ``none``, and adaptivity on with off (paired by seed)."""
    if loop == "plain" and "on" in adaptive:
        raise ValueError("--adaptive on needs --loop trainer: only the training job has the adaptive schedule")
    runs = []
    for ratio in ratios:
        for steps in budgets:
            for mode in adaptive:
                for method in methods:
                    for seed in seeds:
                        if loop == "plain":
                            metrics = train_and_evaluate(make_config(method, seed, ratio, num_samples),
                                                         steps, batch_size, lr)
                        else:
                            cfg = make_config(method, seed, ratio, num_samples,
                                              trainer=trainer_settings(steps, batch_size, lr, eval_every),
                                              adaptive={**(adaptive_settings or {}), "enabled": mode == "on"})
                            metrics = train_with_trainer(cfg, Path(work_dir) / f"{ratio:g}-{steps}-{mode}-{method}-{seed}",
                                                         threads)
                        runs.append({"ratio": ratio, "steps": steps, "loop": loop, "adaptive": mode,
                                     "method": method, "seed": seed, **metrics})
                        made, fixed = metrics.get("adaptations"), metrics.get("repairs")
                        log(f"  1:{ratio:<4g} steps={steps:<5} adaptive={mode:<3} {method:<17} seed={seed}  "
                            f"balanced_acc={metrics['eval/balanced_accuracy']:.3f}  "
                            f"macro_f1={metrics['eval/macro_f1']:.3f}  {metrics['seconds']:.1f}s"
                            + (f"  adaptations: {', '.join(made) or 'none'}" if made is not None else "")
                            + (f"  in-job repairs: {', '.join(fixed)}" if fixed else ""))
    return summarise(runs)


def summarise(runs) -> dict:
    summary, verdicts, adaptivity = [], [], []
    groups = sorted({(r["ratio"], r["steps"], r["adaptive"]) for r in runs}, key=lambda g: (g[0], g[1], g[2] != "off"))
    for ratio, steps, mode in groups:
        rows = {}
        for r in runs:
            if (r["ratio"], r["steps"], r["adaptive"]) == (ratio, steps, mode):
                rows.setdefault(r["method"], []).append(r)
        for method, mine in rows.items():
            bal = [r["eval/balanced_accuracy"] for r in mine]
            summary.append({
                "ratio": ratio, "steps": steps, "adaptive": mode, "method": method, "seeds": len(mine),
                "balanced_accuracy": statistics.mean(bal), "balanced_accuracy_std": statistics.pstdev(bal),
                "macro_f1": statistics.mean(r["eval/macro_f1"] for r in mine),
                "accuracy": statistics.mean(r["eval/accuracy"] for r in mine),
                "seconds": statistics.mean(r["seconds"] for r in mine),
                "adaptations": sum(len(r.get("adaptations") or []) for r in mine),
                "repairs": sum(len(r.get("repairs") or []) for r in mine),
            })
        mean = {s["method"]: s["balanced_accuracy"] for s in summary
                if (s["ratio"], s["steps"], s["adaptive"]) == (ratio, steps, mode)}
        others = [m for m in mean if m != "none"]
        if "none" in mean and others:
            best = max(others, key=mean.get)
            verdicts.append({"ratio": ratio, "steps": steps, "adaptive": mode, "best_method": best,
                             "best_balanced_accuracy": mean[best], "none_balanced_accuracy": mean["none"],
                             "gain_points": 100 * (mean[best] - mean["none"])})
    for ratio, steps, method in sorted({(r["ratio"], r["steps"], r["method"]) for r in runs}):
        by = {(r["adaptive"], r["seed"]): r["eval/balanced_accuracy"] for r in runs
              if (r["ratio"], r["steps"], r["method"]) == (ratio, steps, method)}
        seeds = sorted(seed for mode, seed in by if mode == "on" and ("off", seed) in by)
        if not seeds:
            continue
        diffs = [by[("on", s)] - by[("off", s)] for s in seeds]
        mean_diff, sd = statistics.mean(diffs), statistics.stdev(diffs) if len(diffs) > 1 else 0.0
        # Not worse: the mean paired difference is above zero, or within one standard error of it.
        adaptivity.append({"ratio": ratio, "steps": steps, "method": method, "seeds": len(seeds),
                           "on_minus_off_points": 100 * mean_diff, "on_minus_off_std_points": 100 * sd,
                           "not_worse": mean_diff >= -sd / math.sqrt(len(seeds))})
    return {"summary": summary, "verdicts": verdicts, "adaptivity": adaptivity, "runs": runs}


def markdown(result: dict) -> str:
    lines = ["| imbalance | steps | adaptive | method | balanced accuracy (mean ± sd) | macro-F1 | accuracy | "
             "adaptations | in-job repairs | seconds/run |", "|---|---:|---|---|---:|---:|---:|---:|---:|---:|"]
    for s in result["summary"]:
        lines.append(f"| 1:{s['ratio']:g} | {s['steps']} | {s['adaptive']} | {s['method']} | "
                     f"{s['balanced_accuracy']:.3f} ± {s['balanced_accuracy_std']:.3f} | {s['macro_f1']:.3f} | "
                     f"{s['accuracy']:.3f} | {s['adaptations']} | {s['repairs']} | {s['seconds']:.1f} |")
    lines.append("")
    for v in result["verdicts"]:
        lines.append(f"1:{v['ratio']:g}, {v['steps']} steps, adaptive {v['adaptive']}: best = {v['best_method']} "
                     f"({v['best_balanced_accuracy']:.3f}), none = {v['none_balanced_accuracy']:.3f}, "
                     f"gain = {v['gain_points']:+.1f} points")
    for a in result.get("adaptivity", []):
        lines.append(f"1:{a['ratio']:g}, {a['steps']} steps, {a['method']}: adaptive on - off = "
                     f"{a['on_minus_off_points']:+.2f} ± {a['on_minus_off_std_points']:.2f} points (paired over "
                     f"{a['seeds']} seeds): {'not worse' if a['not_worse'] else 'WORSE'}")
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
    parser.add_argument("--loop", choices=("plain", "trainer"), default="plain",
                        help="plain: a torch loop in this process; trainer: the toolkit's training job")
    parser.add_argument("--adaptive", nargs="+", choices=("off", "on"), default=["off"],
                        help="the adaptive LR schedule off and/or on (on needs --loop trainer)")
    parser.add_argument("--eval-every", type=int, default=50, help="--loop trainer: steps between evaluations")
    parser.add_argument("--set", dest="adaptive_settings", nargs="*", default=[], metavar="KEY=VALUE",
                        help="adaptive: settings for --adaptive on (default: the section's defaults)")
    parser.add_argument("--work-dir", help="--loop trainer: where the runs go (default: a temporary folder)")
    parser.add_argument("--out", default=str(REPO / "results" / "bench_imbalance.json"))
    args = parser.parse_args(argv)
    if args.loop == "plain" and "on" in args.adaptive:
        parser.error("--adaptive on needs --loop trainer: only the training job has the adaptive schedule")
    try:
        settings = {k: _value(v) for k, v in (item.split("=", 1) for item in args.adaptive_settings)}
    except ValueError:
        parser.error(f"--set takes KEY=VALUE pairs, got {args.adaptive_settings}")

    import torch

    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench_imbalance_") as scratch:
        try:
            result = run_benchmark(args.methods, args.seeds, args.steps, args.ratios, args.num_samples,
                                   args.batch_size, args.lr, loop=args.loop, adaptive=args.adaptive,
                                   eval_every=args.eval_every, adaptive_settings=settings,
                                   work_dir=args.work_dir or scratch, threads=args.threads)
        except (RuntimeError, ValueError) as exc:  # a config the checks refuse, or a failed training job
            print(f"bench_imbalance: {exc}", file=sys.stderr)
            return 2 if isinstance(exc, ValueError) else 1
    result["settings"] = {k: v for k, v in vars(args).items() if k != "out"}
    result["settings"].update(num_classes=5, num_features=32, model="MLP 2x64",
                              optimizer="AdamW wd=0.01" + (", constant LR" if args.loop == "plain" else
                                                           ", warmup + cosine (the training job's schedule)"))
    result["total_seconds"] = time.perf_counter() - started
    out = Path(args.out)
    from hpc_agent.core.fsutil import atomic_write_json

    atomic_write_json(out, result)
    print()
    print(markdown(result))
    print(f"\nwrote {out} ({result['total_seconds']:.0f} s total)")
    return 0


def _value(text: str):
    """``--set`` values: 3 -> int, 0.5 -> float, true -> bool, anything else (eval) the string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


if __name__ == "__main__":
    sys.exit(main())

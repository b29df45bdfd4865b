"""Recovery latency: preemption -> first resumed training step, with the watcher vs Slurm's requeue alone.

    python scripts/bench_recovery.py [--trials 3] [--out results/bench_recovery.json]

Needs the localhost Slurm (bash scripts/cluster.sh up) and nothing else running on it. Each trial
submits a fresh run to the preemptable partition, waits until it trains, submits a 2 s job to the
high partition that needs every CPU, and times from that submission to the first step logged by the
resumed attempt. "native" relies on Slurm's own requeue (eligible again 121 s later); "watcher" runs
``python -m hpc_agent.watch``, which expedites the requeued job. Both modes run in the same session,
alternating, so the ratio is measured under the same load.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.slurm_helpers import (LONG_RUN, WatcherProcess, cleanup_jobs, last_step, log_text,  # noqa: E402
                                 preempt_all_nodes, submit, wait_for)


def first_resumed_step_seen(run_dir: Path, job: str) -> bool:
    text = log_text(run_dir, job)
    match = re.search(r"resumed at step (\d+) ", text)
    return bool(match) and re.search(rf"\[hpc_agent\] step {int(match.group(1)) + 1} ", text) is not None


def trial(mode: str, index: int, work: Path) -> dict:
    root = work / f"{mode}-{index}"
    run_dir, job = submit(root, *LONG_RUN, f"run.name={mode}{index}", "slurm.nodes=2", "train.max_steps=100000",
                          "train.ckpt_every=1000")
    watcher = WatcherProcess(root) if mode == "watcher" else None
    try:
        wait_for(lambda: last_step(log_text(run_dir, job)) >= 20, 300, what="training to start")
        t0 = time.time()
        preempt_all_nodes(seconds=2)
        wait_for(lambda: first_resumed_step_seen(run_dir, job), 600, interval=0.2, what="the first resumed step")
        latency = time.time() - t0
    finally:
        if watcher:
            watcher.stop()
        cleanup_jobs(root)
    print(f"  {mode} trial {index + 1}: {latency:.1f} s", flush=True)
    return {"mode": mode, "trial": index, "latency_s": round(latency, 2), "job_id": job}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5, help="preemptions per mode (default 5)")
    parser.add_argument("--out", default=str(REPO / "results" / "bench_recovery.json"))
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-recovery-") as tmp:
        for i in range(args.trials):
            for mode in ("watcher", "native"):
                results.append(trial(mode, i, Path(tmp)))
    summary = {}
    for mode in ("watcher", "native"):
        values = [r["latency_s"] for r in results if r["mode"] == mode]
        summary[mode] = {"median_s": round(statistics.median(values), 2), "min_s": min(values),
                         "max_s": max(values), "trials": len(values)}
    summary["speedup_native_over_watcher"] = round(summary["native"]["median_s"] / summary["watcher"]["median_s"], 1)
    out = {"benchmark": "recovery latency (preemption -> first resumed step)", "summary": summary,
           "trials": results, "when": time.strftime("%Y-%m-%dT%H:%M:%S")}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

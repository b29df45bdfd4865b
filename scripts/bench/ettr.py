"""P2, ETTR under faults: the watcher vs Slurm's own requeue, side by side, plus P3 (steps lost per
signalled preemption).

    flock /tmp/hpc_slurm.lock python -m scripts.bench.ettr [--window 1200] [--out results/bench_ettr.json]

Needs the localhost Slurm (bash scripts/cluster.sh up) and nothing else running on it. Two identical
runs are submitted at once, one per node (slurm.nodes=1, the other node excluded): "watcher" has
``python -m hpc_agent.watch`` on its runs root; "native" has only what Slurm and the job do by
themselves (``--requeue``, the job's self-requeue after a preemption notice, resume from the latest
complete checkpoint). The chaos driver injects the same schedule into both, a fault about every
``--every`` seconds (mixed causes; a preemption hits both nodes at once, run-time faults go to each
run that is training). Both are followed for the same window of ``--window`` seconds.

ETTR = productive training time (the step times of the steps that survive in the final TensorBoard
series) / wall time from submission to the end of the window. The runs are sized never to finish in
the window, so both are charged the same wall time.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from hpc_agent.core.fsutil import atomic_write_json  # noqa: E402
from hpc_agent.chaos import inject  # noqa: E402
from hpc_agent.chaos.campaign import ChaosDriver, Target, submit_run  # noqa: E402
from hpc_agent.chaos.report import p3, render  # noqa: E402
from hpc_agent.chaos.schedule import Fault  # noqa: E402
from hpc_agent.slurm.cli import SlurmCLI  # noqa: E402

# ~0.07 s a step on one CPU thread (OMP_NUM_THREADS follows cpus_per_task; two 2-thread jobs on this
# 2-core machine ran 10x slower); a checkpoint about every 10 s. Each run is kept on its own node.
RUN = ["slurm.cpus_per_task=1", "slurm.time=02:00:00", "train.max_steps=1000000", "train.micro_batch_size=8",
       "train.ckpt_every=150", "model.d_model=128", "model.n_layers=4", "model.seq_len=128"]
NODES = {"watcher": "node2", "native": "node1"}  # excluded node per run: one run per node
# What each side may do by itself. configs/chaos.yaml turns in-job repairs off (the chaos tests check the
# watcher's own repairs); the toolkit's run gets them back, plus snapshots every 25 steps (~2 s here) and the
# hand-over to a successor job at a preemption (hpc_agent/core/handback.py), which a hand-written sbatch script does not have.
SIDE = {"watcher": ["resilience.in_job_retries=2", "resilience.snapshot_every=25", "resilience.successor_on_preempt=true"],
        "native": ["resilience.in_job_retries=0", "resilience.snapshot_every=0", "resilience.successor_on_preempt=false"]}
MIX = ("preempt", "gpu_oom", "preempt", "nan", "preempt", "host_oom")


def schedule(window: float, every: float):
    count = max(1, int(window // every))
    return [Fault(MIX[i % len(MIX)], round(every * (i + 1) - 30, 1)) for i in range(count) if every * (i + 1) - 30 < window - 60]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=1200.0, help="seconds both runs are followed (default 1200)")
    parser.add_argument("--every", type=float, default=180.0, help="seconds between faults (default 180)")
    parser.add_argument("--out", default=str(REPO / "results" / "bench_ettr.json"))
    parser.add_argument("--keep", metavar="DIR", help="keep both runs' directories under DIR (a new, empty folder) "
                        "for a look afterwards; by default they go in a temporary folder that is removed")
    args = parser.parse_args()
    keep = Path(args.keep) if args.keep else None
    if keep is not None and keep.exists() and any(keep.iterdir()):
        print(f"--keep {keep}: not an empty folder", file=sys.stderr)
        return 2
    faults = schedule(args.window, args.every)
    print("schedule: " + ", ".join(f"{f.kind}@{f.at_s:.0f}s" for f in faults), flush=True)
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
    # ignore_cleanup_errors: a cancelled job can still be writing its last checkpoint while the
    # directory is removed; the measurement is already written by then.
    with (contextlib.nullcontext(keep) if keep is not None
          else tempfile.TemporaryDirectory(prefix="bench-ettr-", ignore_cleanup_errors=True)) as tmp:
        work = Path(tmp)
        watched = Target("watcher", work / "watcher", submit_run(work / "watcher", "configs/chaos.yaml",
                                                                  [*RUN, *SIDE["watcher"], "run.name=ettr-watcher", f"slurm.exclude={NODES['watcher']}"]))
        native = Target("native", work / "native", submit_run(work / "native", "configs/chaos.yaml",
                                                               [*RUN, *SIDE["native"], "run.name=ettr-native", f"slurm.exclude={NODES['native']}"]))
        watched.watcher = inject.Watcher(watched.root)
        watched.watcher.start()
        driver = ChaosDriver([watched, native], faults, duration_s=args.window, sequential=False,
                             recovery_timeout_s=args.every * 2, out=lambda line: print(line, flush=True))
        try:
            summaries = driver.run()
        finally:
            watched.watcher.stop()
            ids = watched.job_ids() + native.job_ids()
            if ids:
                SlurmCLI(timeout_s=30).run(["scancel", *ids], check=False)
        for s in summaries:  # never meant to finish in the window: its end-of-run checks do not apply
            s.checks = [c for c in s.checks if c.name not in ("final checkpoint complete", "continuous step series")]
        print(render(driver.records, summaries), flush=True)
        by_name = {s.name: s for s in summaries}
        ours, base = by_name["watcher"].ettr, by_name["native"].ettr
        ratio = round(ours / base, 2) if ours and base else None
        watched_records = [r for r in driver.records if r.target == "watcher"]
        out = {
            "benchmark": "ETTR under a fault every ~%.0f s: watcher vs native Slurm requeue, side by side" % args.every,
            "window_s": args.window, "schedule": [f.to_dict() for f in faults], "run_overrides": RUN, "side_overrides": SIDE,
            "summary": {
                "ettr_watcher": ours, "ettr_native": base, "ratio": ratio,
                "target_ettr_0_97_met": bool(ours is not None and ours >= 0.97),
                "target_ratio_5_met": bool(ratio is not None and ratio >= 5),
                "p3_steps_lost_per_signalled_preemption": p3(watched_records),
            },
            "targets": {s.name: {"ettr": s.ettr, "productive_s": s.productive_s, "wall_s": s.wall_s,
                                 "last_step": _last_step(t), "series_continuous_to_last_step": _continuous(t),
                                 "time_lost": s.time_lost}
                        for s, t in zip(summaries, (watched, native))},
            "faults": [r.to_dict() for r in driver.records],
            "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        atomic_write_json(Path(args.out), out)
    print(json.dumps(out["summary"], indent=2))
    return 0


def _continuous(target: Target) -> bool:
    """The runs never finish in the window: TensorBoard must hold 1..(last step) once each."""
    from hpc_agent.chaos.report import continuity_check
    from hpc_agent.metrics.tb_reader import RunScalars

    scalars = RunScalars(target.run_dir / "tb", tags=("train/loss",))
    scalars.update()
    steps = [p.step for p in scalars.series("train/loss")]
    return continuity_check(steps, max(steps, default=0)).ok


def _last_step(target: Target) -> int:
    try:
        return target.progress().last_step
    except OSError:
        return 0


if __name__ == "__main__":
    sys.exit(main())

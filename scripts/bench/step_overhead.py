"""The training loop's own cost between steps: this checkout against a baseline revision, side by side.

    python -m scripts.bench.step_overhead [--baseline REV | --baseline-setting KEY=VALUE ...] [--steps 400] [--rounds 2] [--out F]

ETTR (scripts/bench/ettr.py, hpc_agent/runs/history.py) counts as productive only the time inside each step
(``perf/step_time_s``: forward, backward, optimizer step). Everything the loop does between two steps is lost
time: the loss mean and the in-job fault check, TensorBoard, the log line, snapshots and checkpoints. This runs
``python -m launch.train`` directly (no Slurm), one process on one CPU with the P2 run's model and settings
(``--scale``: a P2 scale of scripts/bench/ettr.py, small by default, with the toolkit's in-job repairs and snapshots
every ``SNAPSHOT_EVERY`` steps, the chaos trigger on as the chaos driver sets it; no fault is written, so none fires), for ``--steps`` steps from scratch, for this checkout and for
``--baseline`` (a git worktree), interleaved ``--rounds`` times. Per run, from the TensorBoard series after a
warm-up of 50 steps: overhead = 1 - (sum of step times) / (wall time from the first to the last step). Also per
run: start_to_first_step_s, from the process's spawn to the start of its first step (a fresh run: no checkpoint
to load), the start-up every attempt pays (launch/startup.py).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from scripts.bench.ettr import SCALES  # noqa: E402
from scripts.bench.worktree import worktree  # noqa: E402
from hpc_agent.core.fsutil import atomic_write_json  # noqa: E402
from scripts.bench.machine import machine  # noqa: E402

WARMUP = 50
SNAPSHOT_EVERY = 25
SETTINGS = ["resilience.in_job_retries=2", f"resilience.snapshot_every={SNAPSHOT_EVERY}"]
DEFAULT_BASELINE = "1df3dbe"  # main before the per-step cuts (the TensorBoard event per step, the fault pre-check)


def snapshot_cycle(points: list, every: int) -> dict:
    """What snapshots every ``every`` steps cost inside the steps, within one run (so the machine's drift between
    runs cancels): the median step time at each of the first 5 positions after a snapshot, above the median of
    the rest (the background writer shares the job's CPU), per step of the cycle."""
    by: dict = {}
    for p in points:
        by.setdefault((p.step - 1) % every, []).append(p.value)
    rest = statistics.median([v for k, vs in by.items() if k >= 5 for v in vs])
    excess = sum(max(0.0, statistics.median(by[k]) - rest) for k in range(5) if k in by)
    return {"every": every, "quiet_step_s": round(rest, 5),
            "after_snapshot_step_s": [round(statistics.median(by[k]), 5) for k in range(5) if k in by],
            "in_step_overhead": round(excess / every / rest, 5)}


def overhead(run_dir: Path, spawned_at: float, every: int = 0) -> dict:
    """Overhead from a run's TensorBoard series (steps after the warm-up), and its start-up."""
    from hpc_agent.metrics.tb_reader import RunScalars
    from hpc_agent.core.rundir import tb_dir

    scalars = RunScalars(tb_dir(run_dir))
    scalars.update()
    series = scalars.series("perf/step_time_s")
    points = [p for p in series if p.step > WARMUP]
    if len(points) < 10:
        raise RuntimeError(f"{run_dir}: only {len(points)} steps logged after the warm-up")
    span = points[-1].wall_time - points[0].wall_time
    inside = sum(p.value for p in points[1:])
    return {"steps": len(points), "wall_s": round(span, 3), "in_steps_s": round(inside, 3),
            "overhead": round(1 - inside / span, 5), "median_step_s": round(statistics.median(p.value for p in points), 5),
            "between_steps_ms": round((span - inside) / (len(points) - 1) * 1e3, 3),
            "wall_per_step_ms": round(span / (len(points) - 1) * 1e3, 3),
            "start_to_first_step_s": round(series[0].wall_time - series[0].value - spawned_at, 3),
            **({"snapshots": snapshot_cycle(points, every)} if every and every * 3 < len(points) else {})}


_WRITE_CONFIG = ("import sys; from pathlib import Path; from hpc_agent.config.load import load_config, to_yaml; "
                 "Path(sys.argv[2]).write_text(to_yaml(load_config(Path(sys.argv[1]), sys.argv[3:])))")


def run_once(code: Path, work: Path, name: str, steps: int, extra: tuple = (), scale: str = "small") -> dict:
    run_dir = work / name
    run_dir.mkdir(parents=True)
    overrides = [*SCALES[scale]["overrides"], *SETTINGS, f"train.max_steps={steps}", "resilience.successor_on_preempt=false",
                 f"run.runs_root={work}", f"run.name={name}", "faults.runtime_trigger=true", *extra]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SUBMITIT_"))}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(code)})
    # The config snapshot is written by the revision's own loader: a field one revision adds is unknown to the other.
    subprocess.run([sys.executable, "-c", _WRITE_CONFIG, str(code / "configs" / "chaos.yaml"), str(run_dir / "config.yaml"),
                    *overrides], cwd=str(code), env=env, check=True, capture_output=True, timeout=120)
    cpu = max(os.sched_getaffinity(0))
    started = time.time()
    proc = subprocess.run([sys.executable, "-m", "launch.train", str(run_dir / "config.yaml"), str(run_dir)], cwd=str(code),
                          env=env, capture_output=True, text=True, timeout=1800,
                          preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))  # one CPU, as the P2 jobs have
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    every = next((int(o.split("=", 1)[1]) for o in reversed(overrides) if o.startswith("resilience.snapshot_every=")), 0)
    return {**overhead(run_dir, started, every), "process_s": round(time.time() - started, 1)}


def _median_of(results: list, key: str):
    values = [r["snapshots"][key] for r in results if "snapshots" in r]
    return statistics.median(values) if values else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=DEFAULT_BASELINE, help=f"git revision to compare with (default {DEFAULT_BASELINE})")
    parser.add_argument("--steps", type=int, default=400, help="steps per run (default 400)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default 2)")
    parser.add_argument("--baseline-setting", action="append", default=[], metavar="KEY=VALUE",
                        help="compare with this checkout run with these overrides instead of another revision "
                             "(e.g. resilience.snapshot_every=0: the snapshots' cost); repeatable")
    parser.add_argument("--scale", choices=sorted(SCALES), default="small",
                        help="the model and settings of a P2 scale (scripts/bench/ettr.py; default small)")
    parser.add_argument("--out", default=str(REPO / "results" / "bench_step_overhead.json"))
    args = parser.parse_args()
    if args.steps <= WARMUP + 20 or args.rounds < 1:
        parser.error(f"--steps must exceed {WARMUP + 20} and --rounds be at least 1")
    with tempfile.TemporaryDirectory(prefix="bench-step-overhead-") as tmp:
        tmp_path = Path(tmp)
        with (contextlib.nullcontext(REPO) if args.baseline_setting
              else worktree(args.baseline, tmp_path / "baseline")) as baseline:
            runs = {"current": [], "baseline": []}
            for r in range(args.rounds):
                for variant, code, extra in (("baseline", baseline, tuple(args.baseline_setting)), ("current", REPO, ())):
                    result = run_once(code, tmp_path / "runs", f"{variant}-{r}", args.steps, extra, args.scale)
                    print(f"{variant} round {r}: overhead {result['overhead']:.2%}, "
                          f"{result['between_steps_ms']:.2f} ms between steps of {result['median_step_s']:.3f} s, "
                          f"first step {result['start_to_first_step_s']:.2f} s after the spawn", flush=True)
                    runs[variant].append(result)
    med = {v: statistics.median(r["overhead"] for r in rs) for v, rs in runs.items()}
    gap = {v: statistics.median(r["between_steps_ms"] for r in rs) for v, rs in runs.items()}
    first = {v: statistics.median(r["start_to_first_step_s"] for r in rs) for v, rs in runs.items()}
    wall = {v: statistics.median(r["wall_per_step_ms"] for r in rs) for v, rs in runs.items()}
    out = {"benchmark": "training-loop time between steps (lost to ETTR), this checkout vs a baseline "
                        + ("setting" if args.baseline_setting else "revision"),
           "when": time.strftime("%Y-%m-%dT%H:%M:%S"), "steps": args.steps,
           **({"baseline_settings": args.baseline_setting} if args.baseline_setting else {"baseline_rev": args.baseline}),
           "scale": args.scale, "settings": [*SCALES[args.scale]["overrides"], *SETTINGS], "one_cpu": True,
           "runs": runs, "machine": machine(),
           "summary": {"overhead_current": med["current"], "overhead_baseline": med["baseline"],
                       "between_steps_ms_current": gap["current"], "between_steps_ms_baseline": gap["baseline"],
                       "ratio_baseline_to_current": round(gap["baseline"] / gap["current"], 2) if gap["current"] else None,
                       "start_to_first_step_s_current": first["current"], "start_to_first_step_s_baseline": first["baseline"],
                       # wall time per step, inside and between steps: what a setting costs in all (a background
                       # writer on the job's one CPU slows the steps themselves, which the overhead above leaves out)
                       "wall_per_step_ms_current": wall["current"], "wall_per_step_ms_baseline": wall["baseline"],
                       "wall_ratio_current_to_baseline": round(wall["current"] / wall["baseline"], 4),
                       "snapshot_in_step_overhead_current": _median_of(runs["current"], "in_step_overhead"),
                       "snapshot_in_step_overhead_baseline": _median_of(runs["baseline"], "in_step_overhead")}}
    atomic_write_json(Path(args.out), out)
    print(json.dumps(out["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

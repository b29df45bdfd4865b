"""Benchmark asynchronous snapshots (launch/snapshot.py, issue 17 item 4): step-time overhead and the
steps redone after a SIGKILL, side by side with the baseline (no snapshots).

Each round trains the same GPT (large enough that one save takes a noticeable time on a CPU) once per
setting, ``resilience.snapshot_every`` = 0 (baseline), 1 and 5, interleaved so that load from other
processes hits every setting alike. The step time is wall-clock: the arrival times of the job's
``step N`` log lines (the job's own ``step_time`` leaves the snapshot hook out), averaged over the
steps after a warm-up. A full checkpoint is taken only at the end (``ckpt_every`` > ``max_steps``).
Then, per setting, one run is SIGKILLed mid-training and resumed: steps redone = the last step logged
before the kill - the step the resume starts from.

    python -m scripts.bench.snapshot            # ~6 min on 2 CPU cores -> results/bench_snapshot.json

``--capture-baseline REV`` measures something else: how long the training loop is held per snapshot (the host
copy, the job's own "training held" figure) on a larger state (``--d-model 512 --layers 8`` unless given,
~420 MB of fp32 weights and Adam moments), this checkout against revision REV (a git worktree), interleaved
``--rounds`` times; -> results/bench_snapshot_capture.json.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from scripts.bench.worktree import worktree  # noqa: E402

STEP_RE = re.compile(r"\] step (\d+) loss ")
RESUMED_RE = re.compile(r"\] resumed at step (\d+) ")


def write_config(path: Path, every: int, steps: int, model: Dict[str, int], micro_batch: int = 4) -> Path:
    from hpc_agent.config.load import build_config, to_yaml

    cfg = build_config([{
        "train": {"workload": "gpt", "max_steps": steps, "micro_batch_size": micro_batch, "grad_accum_steps": 1,
                  "lr": 1e-3, "warmup_steps": 2, "precision": "fp32", "zero_stage": 1,
                  "ckpt_every": steps + 1000, "eval_every": 0},
        "model": model, "resilience": {"snapshot_every": every}}])
    path.write_text(to_yaml(cfg))
    return path


def start(config: Path, run_dir: Path, code: Path = REPO) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "MASTER_"))}
    path = os.pathsep.join(p for p in (str(code), os.environ.get("PYTHONPATH", "")) if p)
    env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONPATH": path})
    return subprocess.Popen([sys.executable, "-m", "launch.train", str(config), str(run_dir)], cwd=str(code),
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def follow(proc: subprocess.Popen, until_step: Optional[int] = None) -> Dict[str, object]:
    """Read the job's output as it comes: arrival time of each ``step N`` line, the resumed step, the log.
    With ``until_step``, SIGKILL the job as soon as that step is logged."""
    arrivals: Dict[int, float] = {}
    resumed, lines = None, []
    for line in proc.stdout:  # type: ignore[union-attr]
        now = time.perf_counter()
        lines.append(line)
        match = STEP_RE.search(line)
        if match:
            arrivals[int(match.group(1))] = now
            if until_step is not None and int(match.group(1)) >= until_step:
                proc.send_signal(signal.SIGKILL)
        match = RESUMED_RE.search(line)
        if match:
            resumed = int(match.group(1))
    proc.wait()
    return {"arrivals": arrivals, "resumed": resumed, "code": proc.returncode, "log": "".join(lines)}


def step_time(arrivals: Dict[int, float], warmup: int) -> float:
    steps = sorted(s for s in arrivals if s >= warmup)
    return (arrivals[steps[-1]] - arrivals[steps[0]]) / (steps[-1] - steps[0])


COMPLETE_RE = re.compile(r"(snapshot|checkpoint) (\S+) complete in ([\d.]+)s \(training held ([\d.]+)s")
"""The job's line for each snapshot or background checkpoint it completed (launch/snapshot.py)."""


def held_seconds(log: str) -> List[float]:
    """The job's "training held" figure of each snapshot or background checkpoint it completed, in order."""
    return [float(held) for _, _, _, held in COMPLETE_RE.findall(log)]


def snapshot_lines(log: str) -> Dict[str, object]:
    found = [(done, held) for kind, tag, done, held in COMPLETE_RE.findall(log) if kind == "snapshot" and tag.startswith("snap_")]
    done, held = [float(d) for d, _ in found], [float(h) for _, h in found]
    skipped = len(re.findall(r"snapshot at step \d+ skipped", log))
    return {"completed": len(done), "skipped": skipped,
            "median_capture_to_marker_s": round(statistics.median(done), 3) if done else None,
            "median_main_thread_s": round(statistics.median(held), 3) if held else None}


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--every", type=int, nargs="+", default=[1, 5])
    parser.add_argument("--d-model", type=int, default=None, help="default 384 (512 with --capture-baseline)")
    parser.add_argument("--layers", type=int, default=None, help="default 4 (8 with --capture-baseline)")
    parser.add_argument("--out", default=None, help="default results/bench_snapshot.json "
                        "(results/bench_snapshot_capture.json with --capture-baseline)")
    parser.add_argument("--capture-baseline", metavar="REV", help="compare the loop's hold per snapshot with REV's")
    args = parser.parse_args(argv)
    if args.capture_baseline:
        return capture_side_by_side(args)
    args.out = args.out or str(REPO / "results" / "bench_snapshot.json")
    model = {"n_layers": args.layers or 4, "d_model": args.d_model or 384, "n_heads": 4, "seq_len": 128}
    settings = [0] + list(args.every)
    times: Dict[int, List[float]] = {k: [] for k in settings}
    snaps: Dict[int, List[Dict[str, object]]] = {k: [] for k in settings}
    kills: Dict[int, Dict[str, object]] = {}
    state_bytes = None
    with tempfile.TemporaryDirectory(prefix="bench_snapshot.") as tmp:
        root = Path(tmp)
        for r in range(args.rounds):
            for every in settings:
                run_dir = root / f"r{r}_e{every}"
                result = follow(start(write_config(root / f"c{every}.yaml", every, args.steps, model), run_dir))
                if result["code"] != 0:
                    print(result["log"][-3000:], file=sys.stderr)
                    return 1
                times[every].append(step_time(result["arrivals"], args.warmup))
                snaps[every].append(snapshot_lines(result["log"]))
                final = run_dir / "checkpoints" / f"step_{args.steps:08d}"
                state_bytes = sum(p.stat().st_size for p in final.iterdir() if p.suffix == ".pt")
                print(f"round {r} snapshot_every={every}: {times[every][-1]:.4f} s/step {snaps[every][-1]}",
                      flush=True)
        kill_at = args.steps // 2 + 3
        for every in args.every:
            run_dir = root / f"kill_e{every}"
            config = write_config(root / f"k{every}.yaml", every, args.steps, model)
            killed = follow(start(config, run_dir), until_step=kill_at)
            last = max(killed["arrivals"])
            resumed = follow(start(config, run_dir))
            kills[every] = {"last_step_logged": last, "resumed_from": resumed["resumed"],
                            "steps_redone": last - (resumed["resumed"] or 0), "resume_exit": resumed["code"]}
            print(f"SIGKILL snapshot_every={every}: {kills[every]}", flush=True)
    base = statistics.median(times[0])
    summary = {
        "model": model, "precision": "fp32", "zero_stage": 1, "ranks": 1, "cpus": os.cpu_count(),
        "state_bytes_per_snapshot": state_bytes, "steps_per_run": args.steps, "warmup_steps": args.warmup,
        "rounds": args.rounds,
        "step_time_s": {str(k): [round(t, 4) for t in v] for k, v in times.items()},
        "median_step_time_s": {str(k): round(statistics.median(v), 4) for k, v in times.items()},
        "overhead_ratio": {str(k): round(statistics.median(times[k]) / base - 1, 4) for k in args.every},
        # Each round's snapshot run against the same round's baseline (the load of other processes on a
        # shared machine drifts between rounds more than the overhead we look for).
        "paired_overhead_ratio_median": {str(k): round(statistics.median(
            t / b - 1 for t, b in zip(times[k], times[0])), 4) for k in args.every},
        # The part of the overhead the training loop itself waits for (the host copy, measured in the job),
        # spread over the interval: robust to machine load, leaves out the background write's contention.
        "held_overhead_ratio": {str(k): round(statistics.median(
            s["median_main_thread_s"] for s in snaps[k] if s["median_main_thread_s"] is not None) / (k * base), 4)
            for k in args.every},
        "snapshots": {str(k): v for k, v in snaps.items() if k},
        "sigkill": {str(k): v for k, v in kills.items()},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({k: summary[k] for k in ("median_step_time_s", "overhead_ratio", "paired_overhead_ratio_median",
                                              "held_overhead_ratio", "sigkill")}, indent=2))
    return 0


def capture_side_by_side(args: argparse.Namespace) -> int:
    """The loop's hold per snapshot, this checkout vs ``args.capture_baseline``, one snapshot every 2 steps."""
    model = {"n_layers": args.layers or 8, "d_model": args.d_model or 512, "n_heads": 8, "seq_len": 32}
    steps, every = max(args.steps, 24), 2
    held: Dict[str, List[float]] = {"current": [], "baseline": []}
    per_run: Dict[str, List[float]] = {"current": [], "baseline": []}
    with tempfile.TemporaryDirectory(prefix="bench_snapshot_capture.") as tmp:
        root = Path(tmp)
        with worktree(args.capture_baseline, root / "baseline") as baseline:
            for r in range(args.rounds):
                for variant, code in (("baseline", baseline), ("current", REPO)):
                    run_dir = root / f"{variant}{r}"
                    config = write_config(root / f"{variant}{r}.yaml", every, steps, model, micro_batch=1)
                    result = follow(start(config, run_dir, code))
                    if result["code"] != 0:
                        print(result["log"][-3000:], file=sys.stderr)
                        return 1
                    seconds = held_seconds(result["log"])[1:]  # the first copy of a run always finds no buffers
                    if not seconds:
                        print(result["log"][-3000:], file=sys.stderr)
                        return 1
                    held[variant] += seconds
                    per_run[variant].append(round(statistics.median(seconds), 4))
                    print(f"round {r} {variant}: training held {per_run[variant][-1]:.4f} s per snapshot "
                          f"(median of {len(seconds)})", flush=True)
                    state_bytes = sum(p.stat().st_size for p in (run_dir / "checkpoints" / f"step_{steps:08d}").iterdir()
                                      if p.suffix == ".pt")
    med = {k: round(statistics.median(v), 4) for k, v in held.items()}
    summary = {"benchmark": "training loop held per snapshot (the host copy), this checkout vs a baseline revision",
               "when": time.strftime("%Y-%m-%dT%H:%M:%S"), "baseline_rev": args.capture_baseline, "model": model,
               "precision": "fp32", "zero_stage": 1, "ranks": 1, "snapshot_every": every, "steps_per_run": steps,
               "state_bytes_per_snapshot": state_bytes, "rounds": args.rounds, "held_s_per_run": per_run,
               "median_held_s": med, "ratio_baseline_to_current": round(med["baseline"] / med["current"], 2)}
    out = Path(args.out or REPO / "results" / "bench_snapshot_capture.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({k: summary[k] for k in ("state_bytes_per_snapshot", "median_held_s", "ratio_baseline_to_current")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

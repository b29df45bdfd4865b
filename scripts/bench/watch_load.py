"""Slurm load of the watcher (P4): Slurm calls and watcher CPU per tick with 1, 100, 1000 and 10000 tracked runs.

    python -m scripts.bench.watch_load [--sizes 1,100,1000,10000] [--ticks 7] [--profile] [--out results/bench_watch_load.json]

Each size gets a fresh runs root with that many synthetic runs, written in ONE ledger transaction (a run,
its intent and its job id each: job ids are synthetic, 9000000 + i) plus an empty run directory each (the
watcher writes ``events.jsonl`` there if it ever audits; a running job needs no other file). The watcher gets an
injected Slurm client that counts every command by name and passes each call to the REAL Slurm CLI on
the real cluster (``sacct`` with all N ids in one call), timing its wall clock. Because the cluster
cannot hold 1000 live jobs, the client then hands the watcher a synthetic ``sacct`` answer in sacct's
own format (every job RUNNING, a share PENDING) so that the watcher's per-run work is real.

Reported per size: Slurm calls per tick (by command), the watcher's CPU per tick (``time.process_time``
around ``tick()``; a child process's CPU is not in it), the tick's wall time, and separately the wall
time of the real sacct subprocess. Ticks after the first are the steady state (the first moves every
run from ``pending`` to ``running`` in the ledger). Targets: one Slurm call per tick at every size, the
watcher's CPU per tick <= 150 ms at 10000 runs, and cost growing at most linearly (CPU per run at the
largest size over CPU per run at the one before, <= ``LINEAR_SLACK``). ``--profile`` adds the top
cProfile entries at the largest size. Needs ``sacct`` on PATH; submits nothing.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Dict, Iterable, List, Sequence

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from hpc_agent.core.fsutil import atomic_write_json  # noqa: E402
from hpc_agent.slurm.cli import SlurmCLI  # noqa: E402
from hpc_agent.slurm.sacct import SACCT_FIELDS  # noqa: E402

TARGET_CPU_MS = 150.0
TARGET_AT_RUNS = 10_000
LINEAR_SLACK = 1.2  # per-run CPU may grow this much (timing noise) and still count as linear
FIRST_JOB_ID = 9_000_000
PENDING_EVERY = 10  # one run in ten is queued, the rest run


# --- pure helpers (tests/unit/test_bench_watch_load.py) ----------------------------------------------------------
def synthetic_sacct(job_ids: Sequence[str], fields: Sequence[str] = SACCT_FIELDS,
                    pending_every: int = PENDING_EVERY) -> str:
    """A ``sacct --parsable2`` answer for these jobs: an allocation row each (RUNNING, or PENDING for every
    ``pending_every``-th) plus batch and step rows for the running ones, as sacct prints them."""
    lines = ["|".join(fields)]
    submitted = time.strftime("%Y-%m-%dT%H:%M:%S")
    for i, job in enumerate(job_ids):
        pending = pending_every and i % pending_every == pending_every - 1
        # The name and submit time of the run's own job (hpc_agent/slurm/job_match.py ignores another job's records).
        base = {"JobID": job, "JobName": f"hpc_agent:load-{int(job) - FIRST_JOB_ID:05d}", "ExitCode": "0:0",
                "Elapsed": "00:10:00", "Submit": submitted,
                "State": "PENDING" if pending else "RUNNING", "NodeList": "None assigned" if pending else "node1",
                "Start": "Unknown" if pending else "2026-11-30T10:00:00", "End": "Unknown"}
        lines.append("|".join(base.get(f, "") for f in fields))
        if not pending:
            for step, name in (("batch", "batch"), ("0", "python")):
                row = dict(base, JobID=f"{job}.{step}", JobName=name)
                lines.append("|".join(row.get(f, "") for f in fields))
    return "\n".join(lines) + "\n"


def growth(summary: Dict[str, Dict[str, object]], small: int, large: int) -> Dict[str, object]:
    """Watcher CPU per run at ``large`` over CPU per run at ``small`` (medians): 1.0 is linear, < 1 sublinear."""
    per_run = {n: float(summary[str(n)]["watcher_cpu_ms_median"]) / n for n in (small, large)}
    ratio = per_run[large] / per_run[small] if per_run[small] > 0 else float("inf")
    return {"from_runs": small, "to_runs": large, "cpu_ms_per_run": {str(n): round(v, 5) for n, v in per_run.items()},
            "ratio": round(ratio, 3), "at_most_linear": ratio <= LINEAR_SLACK, "slack": LINEAR_SLACK}


def per_tick_summary(ticks: List[Dict[str, object]]) -> Dict[str, object]:
    """Medians over steady-state ticks, and the Slurm calls of one tick (the same every tick, else the max)."""
    calls: Counter = Counter()
    for tick in ticks:
        for name, n in tick["calls"].items():
            calls[name] = max(calls[name], n)
    return {"slurm_calls_per_tick": dict(sorted(calls.items())), "slurm_calls_total_per_tick": sum(calls.values()),
            "watcher_cpu_ms_median": round(statistics.median(t["cpu_ms"] for t in ticks), 2),
            "watcher_cpu_ms_max": round(max(t["cpu_ms"] for t in ticks), 2),
            "tick_wall_ms_median": round(statistics.median(t["wall_ms"] for t in ticks), 2),
            "sacct_subprocess_wall_ms_median": round(statistics.median(t["sacct_wall_ms"] for t in ticks), 2),
            "ticks": len(ticks)}


# --- the measurement ----------------------------------------------------------------------------------------
class CountingSlurm:
    """The watcher's Slurm client: counts each command, runs it for real, times the subprocess."""

    def __init__(self, real: SlurmCLI):
        self.real = real
        self.calls: Counter = Counter()
        self.sacct_wall_s = 0.0
        self.sacct_rows_real = 0
        self._answers: Dict[tuple, str] = {}

    def reset(self) -> None:
        self.calls, self.sacct_wall_s = Counter(), 0.0

    def run(self, argv: Sequence[str], check: bool = True, timeout_s: float | None = None):
        self.calls[argv[0]] += 1
        return self.real.run(argv, check=check, timeout_s=timeout_s)

    def sacct(self, job_ids: Iterable[str], fields: Sequence[str] = SACCT_FIELDS, all_attempts: bool = True) -> str:
        ids = list(job_ids)
        self.calls["sacct"] += 1
        t0 = time.perf_counter()
        text = self.real.sacct(ids, fields=fields, all_attempts=all_attempts)  # the real batched query
        self.sacct_wall_s += time.perf_counter() - t0
        self.sacct_rows_real = max(0, len(text.splitlines()) - 1)
        key = (tuple(ids), tuple(fields))
        if key not in self._answers:  # built once (in the uncounted first tick): its CPU is ours, not the watcher's
            self._answers[key] = synthetic_sacct(ids, fields)
        return self._answers[key]


def build_runs_root(root: Path, n: int) -> float:
    """N runs, each submitted (job 9000000 + i) and ``pending``, in one ledger transaction; returns seconds."""
    from hpc_agent.state.ledger import Ledger

    t0 = time.perf_counter()
    ledger = Ledger.in_runs_root(root)
    with ledger.transaction():
        for i in range(n):
            run_id = f"load-{i:05d}"
            run_dir = root / run_id
            run_dir.mkdir()
            ledger.add_run(run_id, "load", str(run_dir))
            sub = ledger.record_intent(run_id, "slurm", str(run_dir / "config.yaml"), reason="initial")
            ledger.record_submitted(sub, str(FIRST_JOB_ID + i))
            ledger.set_phase(run_id, "pending")
    ledger.close()
    return time.perf_counter() - t0


def measure(n: int, ticks: int, work: Path, profile: bool) -> Dict[str, object]:
    from hpc_agent.state.ledger import Ledger
    from hpc_agent.watcher.loop import Watcher

    root = work / f"n{n}"
    build_s = build_runs_root(root, n)
    print(f"  n={n:5d}: runs root built in {build_s:.2f} s", flush=True)
    slurm = CountingSlurm(SlurmCLI(timeout_s=60))
    ledger = Ledger.in_runs_root(root)
    watcher = Watcher(ledger, slurm, runs_root=root, clock=time.time, dry_run=False, executor="slurm",
                      out=lambda line: None, pause_file=root / "watch.paused")
    samples = []
    profiler = cProfile.Profile() if profile else None
    for i in range(ticks):
        slurm.reset()
        c0, w0 = time.process_time(), time.perf_counter()
        report = watcher.tick()
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        samples.append({"tick": i, "cpu_ms": cpu * 1000, "wall_ms": wall * 1000,
                        "sacct_wall_ms": slurm.sacct_wall_s * 1000, "calls": dict(slurm.calls),
                        "runs_followed": report.runs, "unknown": report.unknown})
        print(f"  n={n:5d} tick {i}: cpu {cpu * 1000:7.2f} ms  wall {wall * 1000:7.2f} ms  "
              f"(sacct subprocess {slurm.sacct_wall_s * 1000:6.1f} ms)  calls {dict(slurm.calls)}", flush=True)
    if profiler:  # extra ticks, after the measured ones: the profiler's overhead is not in the figures
        for _ in range(3):
            slurm.reset()
            profiler.enable()
            watcher.tick()
            profiler.disable()
    ledger.close()
    result = {"runs": n, "build_runs_root_s": round(build_s, 3), "first_tick": samples[0], "steady": per_tick_summary(samples[1:]),
              "real_sacct_rows_for_synthetic_ids": slurm.sacct_rows_real, "samples": samples[1:]}
    if profiler:
        buffer = io.StringIO()
        pstats.Stats(profiler, stream=buffer).sort_stats("tottime").print_stats(20)
        result["profile_top_tottime"] = [line for line in buffer.getvalue().splitlines() if line.strip()][-22:]
        buffer = io.StringIO()
        pstats.Stats(profiler, stream=buffer).sort_stats("cumulative").print_stats(25)
        result["profile_top_cumulative"] = [line for line in buffer.getvalue().splitlines() if line.strip()][-27:]
        result["profile_ticks"] = 3
        print("\n".join(result["profile_top_tottime"]), flush=True)
        print("\n".join(result["profile_top_cumulative"]), flush=True)
    shutil.rmtree(root, ignore_errors=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,100,1000,10000",
                        help="numbers of tracked runs (default 1,100,1000,10000)")
    parser.add_argument("--ticks", type=int, default=7, help="ticks per size; the first is not counted (default 7)")
    parser.add_argument("--profile", action="store_true", help="cProfile the ticks at the largest size")
    parser.add_argument("--out", default=str(REPO / "results" / "bench_watch_load.json"))
    args = parser.parse_args()
    if not SlurmCLI.available():
        print("sacct/sbatch are not on PATH: this benchmark needs the real Slurm CLI", file=sys.stderr)
        return 2
    sizes = sorted({int(s) for s in args.sizes.split(",") if s})
    results = []
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-watch-load-") as tmp:
        for n in sizes:
            results.append(measure(n, max(2, args.ticks), Path(tmp), args.profile and n == max(sizes)))
    largest = results[-1]["steady"]
    summary = {str(r["runs"]): r["steady"] for r in results}
    met = {"one_slurm_call_per_tick_at_every_size": all(r["steady"]["slurm_calls_total_per_tick"] == 1
                                                        and r["first_tick"]["calls"] == {"sacct": 1} for r in results),
           "cpu_at_largest": largest["watcher_cpu_ms_median"] <= TARGET_CPU_MS}
    if TARGET_AT_RUNS not in sizes:
        met["cpu_at_largest_note"] = f"largest size run was {sizes[-1]}, the target is set at {TARGET_AT_RUNS}"
    growth_info = growth(summary, sizes[-2], sizes[-1]) if len(sizes) > 1 else None
    if growth_info:
        met["at_most_linear"] = growth_info["at_most_linear"]
    out = {"benchmark": "watcher load per tick (Slurm calls, watcher CPU)",
           "method": "real sacct on the real cluster with all ids in one call; the watcher is handed a synthetic "
                     "sacct answer (every job RUNNING, 1 in 10 PENDING) because the cluster cannot hold thousands "
                     "of jobs; CPU = time.process_time() around tick() (the sacct child's CPU is not in it); "
                     "runs root: one ledger transaction, an empty directory per run",
           "target": {"slurm_calls_per_tick": 1, f"watcher_cpu_ms_at_{TARGET_AT_RUNS}": TARGET_CPU_MS,
                      "cpu_per_run_growth_at_most": LINEAR_SLACK},
           "met": met, "growth": growth_info, "summary": summary, "sizes": results,
           "bench_wall_s": round(time.perf_counter() - t_start, 1), "when": time.strftime("%Y-%m-%dT%H:%M:%S")}
    atomic_write_json(Path(args.out), out)
    print(json.dumps({"summary": summary, "growth": growth_info, "met": out["met"],
                      "bench_wall_s": out["bench_wall_s"]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

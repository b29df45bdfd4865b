"""Slurm load of the watcher (P4): Slurm calls and watcher CPU per tick with 1, 100 and 1000 tracked runs.

    python scripts/bench_watch_load.py [--sizes 1,100,1000] [--ticks 7] [--profile] [--out results/bench_watch_load.json]

Each size gets a fresh runs root with that many synthetic runs (ledger entries, run directories with a
config snapshot, one submitted job each; job ids are synthetic: 9000000 + i). The watcher gets an
injected Slurm client that counts every command by name and passes each call to the REAL Slurm CLI on
the real cluster (``sacct`` with all N ids in one call), timing its wall clock. Because the cluster
cannot hold 1000 live jobs, the client then hands the watcher a synthetic ``sacct`` answer in sacct's
own format (every job RUNNING, a share PENDING) so that the watcher's per-run work is real.

Reported per size: Slurm calls per tick (by command), the watcher's CPU per tick (``time.process_time``
around ``tick()``; a child process's CPU is not in it), the tick's wall time, and separately the wall
time of the real sacct subprocess. Ticks after the first are the steady state (the first moves every
run from ``pending`` to ``running`` in the ledger). ``--profile`` adds the top cProfile entries at the
largest size. Needs ``sacct`` on PATH; submits nothing.
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

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from hpc_agent.fsutil import atomic_write_json  # noqa: E402
from hpc_agent.slurm.cli import SlurmCLI  # noqa: E402
from hpc_agent.slurm.sacct import SACCT_FIELDS  # noqa: E402

TARGET_CPU_MS = 50.0
FIRST_JOB_ID = 9_000_000
PENDING_EVERY = 10  # one run in ten is queued, the rest run


# --- pure helpers (tests/test_bench_watch_load.py) ----------------------------------------------------------
def synthetic_sacct(job_ids: Sequence[str], fields: Sequence[str] = SACCT_FIELDS,
                    pending_every: int = PENDING_EVERY) -> str:
    """A ``sacct --parsable2`` answer for these jobs: an allocation row each (RUNNING, or PENDING for every
    ``pending_every``-th) plus batch and step rows for the running ones, as sacct prints them."""
    lines = ["|".join(fields)]
    for i, job in enumerate(job_ids):
        pending = pending_every and i % pending_every == pending_every - 1
        base = {"JobID": job, "JobName": f"hpc_agent:run-{job}", "ExitCode": "0:0", "Elapsed": "00:10:00",
                "State": "PENDING" if pending else "RUNNING", "NodeList": "None assigned" if pending else "node1",
                "Start": "Unknown" if pending else "2026-11-30T10:00:00", "End": "Unknown"}
        lines.append("|".join(base.get(f, "") for f in fields))
        if not pending:
            for step, name in (("batch", "batch"), ("0", "python")):
                row = dict(base, JobID=f"{job}.{step}", JobName=name)
                lines.append("|".join(row.get(f, "") for f in fields))
    return "\n".join(lines) + "\n"


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


def build_runs_root(root: Path, n: int) -> None:
    from hpc_agent.config.load import load_config, to_yaml
    from hpc_agent.ledger import Ledger

    cfg_text = to_yaml(load_config("quickstart", []))
    ledger = Ledger.in_runs_root(root)
    ledger.db.execute("BEGIN")
    for i in range(n):
        run_id = f"load-{i:05d}"
        run_dir = root / run_id
        (run_dir / "slurm").mkdir(parents=True)
        (run_dir / "config.yaml").write_text(cfg_text)
        ledger.add_run(run_id, "load", str(run_dir))
        sub = ledger.record_intent(run_id, "slurm", str(run_dir / "config.yaml"), reason="initial")
        ledger.record_submitted(sub, str(FIRST_JOB_ID + i))
        ledger.set_phase(run_id, "pending")
    ledger.db.execute("COMMIT")
    ledger.close()


def measure(n: int, ticks: int, work: Path, profile: bool) -> Dict[str, object]:
    from hpc_agent.ledger import Ledger
    from hpc_agent.watcher import Watcher

    root = work / f"n{n}"
    build_runs_root(root, n)
    slurm = CountingSlurm(SlurmCLI(timeout_s=60))
    ledger = Ledger.in_runs_root(root)
    watcher = Watcher(ledger, slurm, runs_root=root, out=lambda line: None)
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
            profiler.enable()
            watcher.tick()
            profiler.disable()
    ledger.close()
    result = {"runs": n, "first_tick": samples[0], "steady": per_tick_summary(samples[1:]),
              "real_sacct_rows_for_synthetic_ids": slurm.sacct_rows_real, "samples": samples[1:]}
    if profiler:
        buffer = io.StringIO()
        pstats.Stats(profiler, stream=buffer).sort_stats("tottime").print_stats(15)
        result["profile_top_tottime"] = [line for line in buffer.getvalue().splitlines() if line.strip()][-17:]
    shutil.rmtree(root, ignore_errors=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,100,1000", help="numbers of tracked runs (default 1,100,1000)")
    parser.add_argument("--ticks", type=int, default=7, help="ticks per size; the first is not counted (default 7)")
    parser.add_argument("--profile", action="store_true", help="cProfile the ticks at the largest size")
    parser.add_argument("--out", default=str(REPO / "results" / "bench_watch_load.json"))
    args = parser.parse_args()
    if not SlurmCLI.available():
        print("sacct/sbatch are not on PATH: this benchmark needs the real Slurm CLI", file=sys.stderr)
        return 2
    sizes = [int(s) for s in args.sizes.split(",") if s]
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-watch-load-") as tmp:
        for n in sizes:
            results.append(measure(n, max(2, args.ticks), Path(tmp), args.profile and n == max(sizes)))
    largest = results[-1]["steady"]
    summary = {str(r["runs"]): r["steady"] for r in results}
    out = {"benchmark": "watcher load per tick (Slurm calls, watcher CPU)",
           "method": "real sacct on the real cluster with all ids in one call; the watcher is handed a synthetic "
                     "sacct answer (every job RUNNING, 1 in 10 PENDING) because the cluster cannot hold 1000 jobs; "
                     "CPU = time.process_time() around tick() (the sacct child's CPU is not in it)",
           "target": {"batched_queries_per_tick": 1, "watcher_cpu_ms_at_1000": TARGET_CPU_MS},
           "met": {"one_batched_query": largest["slurm_calls_total_per_tick"] == 1,
                   "cpu_at_largest": largest["watcher_cpu_ms_median"] <= TARGET_CPU_MS},
           "summary": summary, "sizes": results, "when": time.strftime("%Y-%m-%dT%H:%M:%S")}
    atomic_write_json(Path(args.out), out)
    print(json.dumps({"summary": summary, "met": out["met"]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

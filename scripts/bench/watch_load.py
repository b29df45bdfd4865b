"""The watcher's load per tick (P4): live runs at 1000 and 10,000, the idle path at 1 to 10,000, and the poison mode.

    python -m scripts.bench.watch_load [--mode both|live|idle] [--live-sizes 1000,10000] [--sizes 1,100,1000,10000]
                                       [--ticks 7] [--ranks 1] [--sacct-latency-ms 0] [--profile] [--out FILE]
    python -m scripts.bench.watch_load --poison [--poison-runs 1000] [--samples 5]

**Live mode** (issue 45, :func:`live_mode`; the P4 headline). Each size gets N runs laid out as ``submit`` leaves
them (ledger rows, the config recorded in the ledger and written as ``config.yaml``, heartbeat/, slurm/ and tb/
folders) and a cluster holding their jobs: the canonical FakeSlurm (tests/helpers/fake_slurm.py, held to the real
localhost cluster by tests/cluster/test_slurm_contract.py, the watcher's own query included) behind real
executables put first on PATH (``scripts/bench/fake_slurm_bin.py``): 80 % of the jobs running, 5 % on two nodes,
5 % pending, 5 % preempted and running again, 4.5 % node-failed and running again, 0.5 % preempted and waiting out
their BeginTime; steps batch, extern and 0. The watcher uses the real ``SlurmCLI``, so each tick runs one real
``sacct -D`` subprocess with every id. Before each tick, a separate writer process (``scripts/bench/run_writer.py``)
writes what every running job writes between two ticks at the defaults (``watch --interval`` 5 s, ``heartbeat_s``
5 s, 1 s steps): each rank's heartbeat once, 5 step lines in the submitit log, 5 TensorBoard events; the watcher's
clock moves 5 s. So every running run is judged on every tick (the watcher looks at a running run again every
``heartbeat_s / 2``). Two warm-up ticks (the first sets every run's phase, reads every run's config and expedites
the requeued jobs) are reported apart; then ``--ticks`` ticks are measured in a child process of their own (its
peak RSS is the watcher's). Per tick: ``watcher_ms`` (the tick's wall time less the sacct subprocess's: the
figure the targets apply to, <= 50 ms median at 1000 runs and <= 250 ms at 10,000), the watcher's CPU
(``time.process_time``, the child's excluded), the sacct subprocess's wall time, runs judged, peak RSS.

**Idle mode** (:func:`idle_mode`, the first P4). Each size gets a fresh runs root with that many synthetic runs,
written in ONE ledger transaction (a run, its intent and its job id each: job ids are synthetic, 9000000 + i) plus
an empty run directory each. The watcher gets an injected Slurm client that counts every command by name and
passes each call to the REAL Slurm CLI on the real cluster (``sacct`` with all N ids in one call, which knows none
of them), timing its wall clock, then hands the watcher a synthetic ``sacct`` answer (every job RUNNING, a share
PENDING). With no heartbeat to judge, every run is quiet and skipped: this is the watcher's idle path. Targets:
one Slurm call per tick at every size, the watcher's CPU per tick <= 150 ms at 10000 runs, and cost growing at most
linearly (``LINEAR_SLACK``). Needs ``sacct`` on PATH; submits nothing.

The poison mode (issue 42; :func:`measure_poison`, no Slurm needed) times one tick over 1000 live runs (a
heartbeat each, judged every tick), clean and with ONE run carrying every poison at once
(``scripts/bench/poison.py``), and reports both figures and their ratio (target <= 2x) under ``poison_mode``.
Every mode's figures share ``results/bench_watch_load.json``; a run of some modes keeps the others'.
``--profile`` adds the top cProfile entries of 3 extra ticks at the largest size.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from hpc_agent.core.fsutil import atomic_write_json  # noqa: E402
from hpc_agent.slurm.cli import SlurmCLI  # noqa: E402
from hpc_agent.slurm.sacct import SACCT_FIELDS  # noqa: E402
from scripts.bench.machine import machine  # noqa: E402

TARGET_CPU_MS = 150.0
TARGET_AT_RUNS = 10_000
LINEAR_SLACK = 1.2  # per-run CPU may grow this much (timing noise) and still count as linear
FIRST_JOB_ID = 9_000_000
PENDING_EVERY = 10  # one run in ten is queued, the rest run


# --- pure helpers (tests/unit/test_bench_watch_load.py) ----------------------------------------------------------
def synthetic_sacct(job_ids: Sequence[str], fields: Sequence[str] = SACCT_FIELDS,
                    pending_every: int = PENDING_EVERY, failed: Sequence[str] = (),
                    submitted: Optional[str] = None, completed: Sequence[str] = ()) -> str:
    """A ``sacct --parsable2`` answer for these jobs: an allocation row each (RUNNING, or PENDING for every
    ``pending_every``-th, 0: none; FAILED with exit 1 for the ids in ``failed``, COMPLETED for those in
    ``completed``) plus batch and step rows for
    the started ones, as sacct prints them."""
    lines = ["|".join(fields)]
    submitted = submitted or time.strftime("%Y-%m-%dT%H:%M:%S")
    ended, done = set(failed), set(completed)
    for i, job in enumerate(job_ids):
        pending = bool(pending_every) and i % pending_every == pending_every - 1 and job not in ended
        state = "FAILED" if job in ended else "COMPLETED" if job in done else "PENDING" if pending else "RUNNING"
        # The name and submit time of the run's own job (hpc_agent/slurm/job_match.py ignores another job's records).
        base = {"JobID": job, "JobName": f"hpc_agent:load-{int(job) - FIRST_JOB_ID:05d}",
                "ExitCode": "1:0" if job in ended else "0:0", "Elapsed": "00:10:00", "Submit": submitted,
                "State": state, "NodeList": "None assigned" if pending else "node1",
                "Start": "Unknown" if pending else "2026-11-30T10:00:00",
                "End": submitted if job in ended | done else "Unknown"}
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
    watcher = Watcher(ledger, slurm, runs_root=root, clock=time.time, dry_run=False,
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


# --- the live mode: runs that beat, log and write TensorBoard, and a cluster's sacct answer -----------------------
LIVE_TARGET_MS = {1000: 50.0, 10_000: 250.0}  # the watcher's own time per tick (issue 45), median
WARMUP_TICKS = 2  # the first moves runs' phases and decides on requeued attempts; the second settles


def live_layout(root: Path, n: int, ranks: int) -> Dict[str, Any]:
    """``n`` runs under ``root`` as ``submit`` leaves them (a ledger row each, its config recorded in the ledger
    and written as ``config.yaml``, intent and job id) plus the jobs of a busy cluster in a pickled FakeSlurm
    (``scripts/bench/fake_slurm_bin.MIX``), and, for each run whose job runs, the files its attempts wrote so
    far (heartbeats, a step log, a TensorBoard file; a requeued job's earlier attempt's too). Returns the
    manifest for the writer process and the clock the watcher starts at."""
    from hpc_agent.config.load import build_config
    from hpc_agent.core import rundir
    from hpc_agent.state import run_config
    from hpc_agent.state.ledger import Ledger
    from scripts.bench import fake_slurm_bin
    from scripts.bench.run_writer import RunFiles

    root.mkdir(parents=True)
    template = run_config.to_yaml(build_config([{"run": {"name": "load"}}]))
    assert "\n  name: load\n" in template
    ledger = Ledger.in_runs_root(root)
    names, dirs = [], []
    with ledger.transaction():
        for i in range(n):
            run_id = f"load-{i:05d}"
            run_dir = root / run_id
            for folder in (rundir.heartbeat_dir(run_dir), rundir.slurm_dir(run_dir), rundir.tb_dir(run_dir)):
                folder.mkdir(parents=True)
            # Each run's own config (its name), as submit records it: no two runs share a config text.
            text = template.replace("\n  name: load\n", f"\n  name: {run_id}\n")
            rundir.config_path(run_dir).write_text(text)
            ledger.add_run(run_id, run_id, str(run_dir))
            sub = ledger.record_intent(run_id, "slurm", str(rundir.config_path(run_dir)), reason="initial")
            ledger.record_submitted(sub, str(FIRST_JOB_ID + i))
            ledger.record_config(run_id, text, "submitted (initial)")
            ledger.set_phase(run_id, "pending")
            names.append(f"hpc_agent:{run_id}")
            dirs.append(run_dir)
    ledger.close()
    fake, kinds = fake_slurm_bin.build_cluster(names, FIRST_JOB_ID, time.time() + 1.0)
    state = root.parent / f"{root.name}.slurm.pkl"
    fake_slurm_bin.save(fake, state)
    manifest = []
    for i, run_dir in enumerate(dirs):
        job = fake.job(str(FIRST_JOB_ID + i))
        world = ranks * max(1, len(job.attempt.nodes))
        for index, attempt in enumerate(job.attempts):
            if attempt.start is None:
                continue
            files = RunFiles(str(run_dir), job.job_id, index, world, attempt.start)
            files.write(attempt.end or fake.now, 5)  # what the attempt wrote so far
            if attempt is job.attempt and attempt.state == "RUNNING":
                manifest.append([str(run_dir), job.job_id, index, world, attempt.start])
    return {"state": state, "manifest": manifest, "now": fake.now + 60.0, "kinds": dict(Counter(kinds.values()))}


class PassThroughSlurm:
    """The watcher's Slurm client in the live mode: the real ``SlurmCLI`` (so a real subprocess per call, here
    FakeSlurm's executables first on PATH), counting each command and timing the sacct subprocess."""

    def __init__(self, real: SlurmCLI):
        self.real = real
        self.calls: Counter = Counter()
        self.sacct_wall_s = 0.0
        self.sacct_rows = 0

    def reset(self) -> None:
        self.calls, self.sacct_wall_s = Counter(), 0.0

    def run(self, argv: Sequence[str], check: bool = True, timeout_s: float | None = None):
        self.calls[argv[0]] += 1
        return self.real.run(argv, check=check, timeout_s=timeout_s)

    def sacct_probe(self):
        self.calls["sacct --json probe"] += 1
        return self.real.sacct_probe()

    def sacct(self, job_ids: Iterable[str], fields: Sequence[str] = SACCT_FIELDS, all_attempts: bool = True,
              as_json: bool = False) -> str:
        self.calls["sacct"] += 1
        t0 = time.perf_counter()
        text = self.real.sacct(job_ids, fields=fields, all_attempts=all_attempts, as_json=as_json)
        self.sacct_wall_s += time.perf_counter() - t0
        self.sacct_rows = max(0, len(text.splitlines()) - 1)
        return text


def live_summary(ticks: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Spreads (median, min, max, n) over the measured ticks of one size."""
    calls: Counter = Counter()
    for tick in ticks:
        for name, count in tick["calls"].items():
            calls[name] = max(calls[name], count)
    return {"watcher_ms": spread([t["wall_ms"] - t["sacct_wall_ms"] for t in ticks]),
            "watcher_cpu_ms": spread([t["cpu_ms"] for t in ticks]),
            "tick_wall_ms": spread([t["wall_ms"] for t in ticks]),
            "sacct_subprocess_wall_ms": spread([t["sacct_wall_ms"] for t in ticks]),
            "runs_judged": spread([t["runs_judged"] for t in ticks]),
            "slurm_calls_per_tick": dict(sorted(calls.items())),
            "peak_rss_mb": max(t["peak_rss_mb"] for t in ticks)}


def measure_live_child(root: Path, layout: Dict[str, Any], ticks: int, profile: bool) -> Dict[str, Any]:
    """The watcher's ticks over a live runs root (run in a process of its own, so its peak RSS is the watcher's):
    before each tick the writer process writes a round (every running job: heartbeats, step lines, TensorBoard
    events), the watcher's clock moves one tick (5 s), the page cache is synced; then one ``tick()`` is timed."""
    import resource
    import subprocess

    from hpc_agent.state.ledger import Ledger
    from hpc_agent.watcher.loop import Watcher
    from scripts.bench.run_writer import STEPS_PER_ROUND

    manifest = root.parent / f"{root.name}.manifest.json"
    manifest.write_text(json.dumps(layout["manifest"]))
    writer = subprocess.Popen([sys.executable, "-m", "scripts.bench.run_writer", str(manifest)], cwd=REPO,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    now, step = [float(layout["now"])], [5]
    slurm = PassThroughSlurm(SlurmCLI(timeout_s=120))
    ledger = Ledger.in_runs_root(root)
    lines: List[str] = []
    watcher = Watcher(ledger, slurm, runs_root=root, clock=lambda: now[0], dry_run=False, submit=_refuse_submit,
                      out=lines.append, pause_file=root / "watch.paused")
    profiler = cProfile.Profile() if profile else None
    samples: List[Dict[str, Any]] = []
    try:
        for i in range(WARMUP_TICKS + ticks + (3 if profile else 0)):
            now[0] += 5.0
            step[0] += STEPS_PER_ROUND
            writer.stdin.write(f"round {now[0]} {step[0]}\n")
            writer.stdin.flush()
            done = writer.stdout.readline().split()
            if not done or done[0] != "done":
                raise RuntimeError(f"the writer process answered {done!r}")
            os.sync()  # the round's writeback is not the tick's cost
            slurm.reset()
            del lines[:]
            measured = WARMUP_TICKS <= i < WARMUP_TICKS + ticks
            if profiler is not None and not measured and i >= WARMUP_TICKS:
                profiler.enable()
            c0, w0 = time.process_time(), time.perf_counter()
            report = watcher.tick()
            cpu, wall = time.process_time() - c0, time.perf_counter() - w0
            if profiler is not None:
                profiler.disable()
            judged = sum(1 for q in watcher._quiet.values() if q[2] is not None and q[2] > now[0])
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            sample = {"tick": i, "warmup": i < WARMUP_TICKS, "profiled": i >= WARMUP_TICKS + ticks,
                      "wall_ms": wall * 1000, "cpu_ms": cpu * 1000, "sacct_wall_ms": slurm.sacct_wall_s * 1000,
                      "calls": dict(slurm.calls), "runs_followed": report.runs, "runs_judged": judged,
                      "parked": list(report.parked), "writer_round_s": float(done[2]), "files_written": int(done[1]),
                      "peak_rss_mb": round(rss, 1), "sacct_rows": slurm.sacct_rows, "lines": lines[:5]}
            samples.append(sample)
            print(f"  live n={report.runs:5d} tick {i}{' (warm-up)' if sample['warmup'] else ''}: "
                  f"wall {wall * 1000:7.1f} ms (sacct {slurm.sacct_wall_s * 1000:6.1f}) cpu {cpu * 1000:7.1f} ms "
                  f"judged {judged} calls {dict(slurm.calls)} rss {rss:.0f} MB; writer {done[1]} files "
                  f"in {done[2]} s", flush=True)
    finally:
        writer.stdin.write("quit\n")
        writer.stdin.close()
        writer.wait(timeout=60)
        ledger.close()
    measured = [s for s in samples if not s["warmup"] and not s["profiled"]]
    result = {"summary": live_summary(measured), "warmup": [s for s in samples if s["warmup"]],
              "samples": measured, "running_jobs_written_per_round": len(layout["manifest"])}
    if profiler is not None:
        buffer = io.StringIO()
        pstats.Stats(profiler, stream=buffer).sort_stats("tottime").print_stats(25)
        result["profile_top_tottime"] = [line for line in buffer.getvalue().splitlines() if line.strip()][-27:]
        buffer = io.StringIO()
        pstats.Stats(profiler, stream=buffer).sort_stats("cumulative").print_stats(30)
        result["profile_top_cumulative"] = [line for line in buffer.getvalue().splitlines() if line.strip()][-32:]
        print("\n".join(result["profile_top_tottime"] + result["profile_top_cumulative"]), flush=True)
    return result


def measure_live(n: int, ticks: int, work: Path, profile: bool, ranks: int, sacct_latency_ms: float) -> Dict[str, Any]:
    """One size of the live mode: the runs root and the cluster built here, the ticks measured in a child
    process (``--live-child``) with FakeSlurm's executables first on its PATH."""
    import subprocess

    from scripts.bench import fake_slurm_bin

    root = work / f"live-n{n}"
    t0 = time.perf_counter()
    layout = live_layout(root, n, ranks)
    build_s = time.perf_counter() - t0
    print(f"  live n={n}: runs root and cluster built in {build_s:.1f} s ({layout['kinds']})", flush=True)
    bin_dir = work / "bin"
    fake_slurm_bin.install(bin_dir, layout["state"])
    spec = work / f"live-n{n}.json"
    spec.write_text(json.dumps({**layout, "state": str(layout["state"])}))
    out = work / f"live-n{n}.result.json"
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
               **{fake_slurm_bin.MIN_S_ENV: str(sacct_latency_ms / 1000.0)})
    argv = [sys.executable, "-m", "scripts.bench.watch_load", "--live-child", str(root), "--live-spec", str(spec),
            "--ticks", str(ticks), "--out", str(out)] + (["--profile"] if profile else [])
    subprocess.run(argv, cwd=REPO, env=env, check=True)
    result = json.loads(out.read_text())
    shutil.rmtree(root, ignore_errors=True)
    return {"runs": n, "ranks_per_node": ranks, "jobs_by_kind": layout["kinds"], "build_s": round(build_s, 2),
            "sacct_latency_floor_ms": sacct_latency_ms, **result}


# --- the poison mode: one run carrying every poison of issue 42 among N live runs ---------------------------------
POISON_TARGET_RATIO = 2.0  # the poisoned tick may take at most this many times the clean tick (issue 42)


class SyntheticSlurm:
    """No real Slurm: ``sacct`` answers every id (RUNNING; FAILED or COMPLETED for the ids in ``failed`` or
    ``completed``) from a text built
    once per state (so the watcher's attempt cache sees what it would see on a quiet cluster), ``squeue`` says
    'not queued'; every command is counted by name."""

    def __init__(self) -> None:
        self.failed: set = set()
        self.completed: set = set()
        self.calls: Counter = Counter()
        self.submitted = time.strftime("%Y-%m-%dT%H:%M:%S")
        self._answers: Dict[tuple, str] = {}

    def sacct(self, job_ids: Iterable[str], fields: Sequence[str] = SACCT_FIELDS, all_attempts: bool = True,
              as_json: bool = False) -> str:
        ids = list(job_ids)
        self.calls["sacct"] += 1
        key = (tuple(ids), tuple(fields), tuple(sorted(self.failed)), tuple(sorted(self.completed)))
        if key not in self._answers:
            self._answers[key] = synthetic_sacct(ids, fields, pending_every=0, failed=sorted(self.failed),
                                                 submitted=self.submitted, completed=sorted(self.completed))
        return self._answers[key]

    def run(self, argv: Sequence[str], check: bool = True, timeout_s: float | None = None):
        import subprocess

        self.calls[argv[0]] += 1
        return subprocess.CompletedProcess(list(argv), 0, "", "")


def _refuse_submit(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("the benchmark submits nothing")


def spread(values: Sequence[float]) -> Dict[str, float]:
    """Median, min and max (ms, rounded) of a sample."""
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2),
            "max": round(max(values), 2), "n": len(values)}


def poison_ratio(clean_ms: Sequence[float], poisoned_ms: Sequence[float]) -> Dict[str, Any]:
    """The poisoned tick's median over the clean tick's median, and whether it meets the target."""
    ratio = statistics.median(poisoned_ms) / statistics.median(clean_ms)
    return {"ratio": round(ratio, 3), "target_at_most": POISON_TARGET_RATIO, "met": ratio <= POISON_TARGET_RATIO}


def measure_poison(n: int, samples: int, work: Path, poison_kwargs: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """``n`` live runs: ``samples`` clean ticks, then ``samples`` ticks each with one more run poisoned (a fresh
    run each time: the one poisoned before is parked and no longer followed) and its job FAILED, so the watcher
    reads all of its files. Every measured tick judges every running run's heartbeats (the clock moves one
    heartbeat_s per tick and the heartbeats are rewritten before it, outside the timing)."""
    import resource

    from scripts.bench.poison import HEARTBEAT_S, beat_all, build_live_runs, plant_poison, remove_tree
    from hpc_agent.state.ledger import Ledger
    from hpc_agent.watcher.loop import Watcher

    root = work / f"poison-n{n}"
    now = [time.time()]
    t0 = time.perf_counter()
    runs = build_live_runs(root, n, now[0])
    build_s = time.perf_counter() - t0
    print(f"  poison mode: {n} live runs built in {build_s:.1f} s", flush=True)
    slurm = SyntheticSlurm()
    ledger = Ledger.in_runs_root(root)
    lines: List[str] = []
    watcher = Watcher(ledger, slurm, runs_root=root, clock=lambda: now[0], dry_run=False,
                      submit=_refuse_submit, out=lines.append, pause_file=root / "watch.paused", sacct_json=False)
    step = [1]

    def tick(label: str) -> Dict[str, Any]:
        now[0] += HEARTBEAT_S
        step[0] += 1
        beat_all(runs, now[0], step[0])
        os.sync()  # the heartbeats' writeback is not the tick's cost
        slurm.calls.clear()
        del lines[:]
        c0, w0 = time.process_time(), time.perf_counter()
        report = watcher.tick()
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"  {label}: wall {wall * 1000:8.1f} ms  cpu {cpu * 1000:8.1f} ms  followed {report.runs}  "
              f"parked {report.parked}  peak RSS {rss:.0f} MB", flush=True)
        return {"wall_ms": wall * 1000, "cpu_ms": cpu * 1000, "runs_followed": report.runs,
                "parked": list(report.parked), "calls": dict(slurm.calls), "peak_rss_mb_so_far": round(rss, 1),
                "lines": list(lines)}

    tick("warm-up (not counted: the runs' settings are read once)")
    clean = [tick(f"clean tick {i + 1}") for i in range(samples)]
    rss_clean = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    poisoned, after, planted = [], [], None
    for k in range(samples):
        run_id, run_dir, job_id = runs[k]
        marker = work / f"notify-command-ran-{k}"
        planted = plant_poison(run_dir, job_id, outside=work / f"outside-{k}", marker=marker,
                               victim_job_id=runs[-1][2], **(poison_kwargs or {}))
        slurm.failed.add(job_id)
        sample = tick(f"poisoned tick {k + 1} ({run_id})")
        sample.update(run_id=run_id, phase_after=ledger.run(run_id).phase, notify_command_ran=marker.exists(),
                      said_about_it=[line for line in sample["lines"] if f" {run_id}: " in line])
        poisoned.append(sample)
        after.append(tick(f"tick after poisoned tick {k + 1}"))
    rss_end = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    ledger.close()
    for k in range(samples):
        remove_tree(work / f"outside-{k}")
    remove_tree(root)
    clean_ms = [t["wall_ms"] for t in clean]
    poison_ms = [t["wall_ms"] for t in poisoned]
    for t in clean + poisoned + after:
        t["lines"] = t["lines"][:0] if t in clean or t in after else t["lines"][:12]
    return {
        "runs": n, "samples_each": samples, "build_live_runs_s": round(build_s, 2),
        "clean_tick_wall_ms": spread(clean_ms), "poisoned_tick_wall_ms": spread(poison_ms),
        "clean_tick_cpu_ms": spread([t["cpu_ms"] for t in clean]),
        "poisoned_tick_cpu_ms": spread([t["cpu_ms"] for t in poisoned]),
        "tick_after_poisoned_wall_ms": spread([t["wall_ms"] for t in after]),
        "ratio_poisoned_over_clean": poison_ratio(clean_ms, poison_ms),
        "cpu_ratio_poisoned_over_clean": poison_ratio([t["cpu_ms"] for t in clean], [t["cpu_ms"] for t in poisoned]),
        "peak_rss_mb": {"after_clean_ticks": round(rss_clean, 1), "after_poisoned_ticks": round(rss_end, 1)},
        "poisoned_runs_parked": all(t["run_id"] in t["parked"] or t["phase_after"] == "needs_attention"
                                    for t in poisoned),
        "other_runs_followed_every_tick": all(t["runs_followed"] >= n - samples for t in poisoned + after),
        "notify_command_from_run_dir_ran": any(t["notify_command_ran"] for t in poisoned),
        "poison": planted, "clean_samples": clean, "poisoned_samples": poisoned, "after_samples": after,
    }


def _merge_out(path: Path, update: Dict[str, Any]) -> Dict[str, Any]:
    """results/bench_watch_load.json holds every mode: ``live``, ``idle`` and ``poison_mode``; a run of some modes
    keeps the others' figures (each mode's own ``machine`` and ``when`` say where and when it was taken)."""
    try:
        current = json.loads(path.read_text())
    except (OSError, ValueError):
        current = {}
    if "poison_mode" in update:
        current["poison_mode"] = update["poison_mode"]
        return current
    kept = {k: current[k] for k in ("live", "idle", "poison_mode") if k in current and k not in update}
    return {**update, **kept}


def main_poison(args: argparse.Namespace) -> int:
    t_start = time.perf_counter()
    before = machine()
    with tempfile.TemporaryDirectory(prefix="bench-watch-poison-") as tmp:
        result = measure_poison(args.poison_runs, max(3, args.samples), Path(tmp))
    result.update(
        benchmark="one watcher tick over N live runs, clean and with ONE run carrying every poison of issue 42",
        method="synthetic Slurm client (no real Slurm; sacct text built once per state, squeue 'not queued'); "
               "each run: a valid config.yaml and a heartbeat rewritten before every tick, the watcher's clock "
               "moving one heartbeat_s per tick, so every running run is judged every tick (the busy path); "
               "wall = time.perf_counter() around tick(); each poisoned tick poisons a fresh run and FAILs its job, "
               "so the watcher reads its config, logs, TensorBoard, journal and events.jsonl",
        bench_wall_s=round(time.perf_counter() - t_start, 1), when=time.strftime("%Y-%m-%dT%H:%M:%S"),
        machine={**before, "load_average_after": machine()["load_average"]},
        command="python -m scripts.bench.watch_load " + " ".join(sys.argv[1:]))
    out = _merge_out(Path(args.out), {"poison_mode": result})
    atomic_write_json(Path(args.out), out)
    print(json.dumps({k: result[k] for k in ("clean_tick_wall_ms", "poisoned_tick_wall_ms", "ratio_poisoned_over_clean",
                                             "cpu_ratio_poisoned_over_clean",
                                             "tick_after_poisoned_wall_ms", "peak_rss_mb", "poisoned_runs_parked",
                                             "other_runs_followed_every_tick", "notify_command_from_run_dir_ran")},
                     indent=2))
    return 0


def idle_mode(sizes: List[int], ticks: int, profile: bool) -> Dict[str, Any]:
    """The idle path (the first P4): empty run dirs and a synthetic sacct answer; see the module doc."""
    results = []
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-watch-load-") as tmp:
        for n in sizes:
            results.append(measure(n, max(2, ticks), Path(tmp), profile and n == max(sizes)))
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
    return {"benchmark": "watcher load per tick, the IDLE path (Slurm calls, watcher CPU)",
            "method": "real sacct on the real cluster with all ids in one call (it knows none of them: 0 rows); the "
                      "watcher is handed a synthetic sacct answer (every job RUNNING, 1 in 10 PENDING); "
                      "CPU = time.process_time() around tick() (the sacct child's CPU is not in it); runs root: one "
                      "ledger transaction, an empty directory per run, so every run is quiet and skipped",
            "target": {"slurm_calls_per_tick": 1, f"watcher_cpu_ms_at_{TARGET_AT_RUNS}": TARGET_CPU_MS,
                       "cpu_per_run_growth_at_most": LINEAR_SLACK},
            "met": met, "growth": growth_info, "summary": summary, "sizes": results,
            "bench_wall_s": round(time.perf_counter() - t_start, 1)}


def live_mode(sizes: List[int], ticks: int, profile: bool, ranks: int, sacct_latency_ms: float) -> Dict[str, Any]:
    results = []
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-watch-live-") as tmp:
        for n in sizes:
            results.append(measure_live(n, ticks, Path(tmp), profile and n == max(sizes), ranks, sacct_latency_ms))
    met = {}
    for r in results:
        target = LIVE_TARGET_MS.get(r["runs"])
        if target is not None:
            met[f"watcher_ms_median_at_{r['runs']}"] = {"median": r["summary"]["watcher_ms"]["median"],
                                                         "target_at_most": target,
                                                         "met": r["summary"]["watcher_ms"]["median"] <= target}
    met["one_slurm_call_per_tick"] = all(s["calls"] == {"sacct": 1} for r in results for s in r["samples"])
    return {"benchmark": "watcher load per tick, LIVE runs (heartbeats, step logs and TensorBoard written between "
                         "ticks by a separate writer process; a cluster's sacct answer)",
            "method": "each size: N runs laid out as submit leaves them (ledger rows with the config recorded, "
                      "config.yaml); their jobs in a FakeSlurm (tests/helpers/fake_slurm.py, held to the real cluster "
                      "by tests/cluster/test_slurm_contract.py) behind real executables first on PATH "
                      "(scripts/bench/fake_slurm_bin.py; mix: 80% running, 5% on two nodes, 5% pending, 5% preempted "
                      "and running again, 4.5% node-failed and running again, 0.5% preempted and waiting out "
                      "BeginTime; steps batch/extern/0); the watcher's real SlurmCLI runs one sacct subprocess a tick. Before "
                      "each tick the writer process (scripts/bench/run_writer.py) writes a round for EVERY running "
                      "job (heartbeat_s = watch --interval = 5 s by default: every rank beats once between two "
                      "ticks, 5 one-second steps logged and sent to TensorBoard), the watcher's clock moves 5 s, "
                      "os.sync(); then tick() is timed: watcher_ms = tick wall minus the sacct subprocess's wall "
                      "(the target's measure), watcher_cpu_ms = time.process_time() (children excluded). "
                      f"{WARMUP_TICKS} warm-up ticks (phases set, requeued attempts decided) are kept apart. "
                      "The watcher runs in a process of its own: peak_rss_mb is its ru_maxrss.",
            "target": {f"watcher_ms_median_at_{n}": ms for n, ms in LIVE_TARGET_MS.items()},
            "met": met, "summary": {str(r["runs"]): r["summary"] for r in results}, "sizes": results,
            "bench_wall_s": round(time.perf_counter() - t_start, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("both", "live", "idle"), default="both",
                        help="live runs, the idle path, or both (default both)")
    parser.add_argument("--sizes", default="1,100,1000,10000",
                        help="idle mode: numbers of tracked runs (default 1,100,1000,10000)")
    parser.add_argument("--live-sizes", default="1000,10000", help="live mode: numbers of runs (default 1000,10000)")
    parser.add_argument("--ticks", type=int, default=7,
                        help="measured ticks per size (default 7; idle: the first is not counted; live: after "
                             f"{WARMUP_TICKS} warm-up ticks)")
    parser.add_argument("--ranks", type=int, default=1, help="live mode: ranks (heartbeat files) per node (default 1)")
    parser.add_argument("--sacct-latency-ms", type=float, default=0.0,
                        help="live mode: the fake sacct answers no faster than this (default 0: as fast as it can)")
    parser.add_argument("--profile", action="store_true", help="cProfile 3 extra ticks at the largest size")
    parser.add_argument("--out", default=str(REPO / "results" / "bench_watch_load.json"))
    parser.add_argument("--poison", action="store_true",
                        help="the poison mode instead: a clean tick of --poison-runs live runs against a tick where "
                             "one of them carries every poison of issue 42 (no Slurm needed)")
    parser.add_argument("--poison-runs", type=int, default=1000, help="live runs in the poison mode (default 1000)")
    parser.add_argument("--samples", type=int, default=5, help="ticks of each kind in the poison mode (min 3)")
    parser.add_argument("--live-child", help=argparse.SUPPRESS)  # the runs root of one live size (internal)
    parser.add_argument("--live-spec", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.poison:
        return main_poison(args)
    if args.live_child:
        spec = json.loads(Path(args.live_spec).read_text())
        result = measure_live_child(Path(args.live_child), spec, max(1, args.ticks), args.profile)
        atomic_write_json(Path(args.out), result)
        return 0
    if args.mode != "live" and not SlurmCLI.available():
        print("sacct/sbatch are not on PATH: the idle mode needs the real Slurm CLI (or run --mode live)",
              file=sys.stderr)
        return 2
    before = machine()
    out: Dict[str, Any] = {"benchmark": "P4: the watcher's load per tick", "when": time.strftime("%Y-%m-%dT%H:%M:%S")}
    if args.mode in ("both", "live"):
        out["live"] = live_mode(sorted({int(s) for s in args.live_sizes.split(",") if s}), args.ticks, args.profile,
                                args.ranks, args.sacct_latency_ms)
    if args.mode in ("both", "idle"):
        out["idle"] = idle_mode(sorted({int(s) for s in args.sizes.split(",") if s}), args.ticks, args.profile)
    after = machine()
    out["machine"] = {**before, "load_average_before": before.pop("load_average"),
                      "load_average_after": after["load_average"]}
    out["machine"].pop("load_average", None)
    out["command"] = "python -m scripts.bench.watch_load " + " ".join(sys.argv[1:])
    atomic_write_json(Path(args.out), _merge_out(Path(args.out), out))
    print(json.dumps({k: {"summary": out[k]["summary"], "met": out[k]["met"]} for k in ("live", "idle") if k in out},
                     indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

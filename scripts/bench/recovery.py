"""Recovery latency (P1): preemption -> first resumed training step, with the watcher vs Slurm's requeue alone.

    flock /tmp/hpc_slurm.lock python -m scripts.bench.recovery [--trials 5] [--native-trials N]
        [--reuse-native OLD.json] [--interval 1] [--partition low|lowcancel] [--hold 20]
        [--scheduler default|fast] [--out results/bench_recovery.json]

Needs the localhost Slurm (bash scripts/cluster.sh up) and nothing else running on it: hold
/tmp/hpc_slurm.lock. The scenario (issue 17, P1): a fresh 1-node run (one rank) on the 2-node cluster trains
in the preemptable partition; a job in the high partition that needs every CPU of *that* node and holds it
``--hold`` seconds (>= 15) preempts it, so the resumed attempt must start on the other node. The clock runs
from the preemptor's submission to the first step logged by the resumed attempt. "native" relies on Slurm's
own requeue (eligible again 121 s later); "watcher" runs ``python -m hpc_agent.watch``, which expedites the
requeued job; "successor" is the watcher mode with ``resilience.successor_on_preempt`` on: the job hands over to
a successor job it submits at the signal (hpc_agent/core/handback.py; ``--modes successor,watcher,native``). The
modes run in the same session, alternating, so the ratios are measured under the same load.
A native trial takes ~130 s: ``--native-trials N`` runs native only in the first N rounds, and
``--reuse-native OLD.json`` adds the native trials of an earlier results file to the native figures (marked
``reused_from`` in the JSON; the summary then says how many trials are fresh and how many reused).
``--partition lowcancel`` measures a ``PreemptMode=CANCEL`` partition the same way
(results/bench_recovery_cancel.json).

Slurm's default scheduler settings: the test cluster normally runs ``SchedulerParameters=sched_interval=3,
bf_interval=3``; with ``--scheduler default`` (the default) this script switches the cluster to Slurm's
defaults (``scripts/cluster.sh sched default``: the line commented out, ``scontrol reconfigure``) for its
duration and back to the fast setting when it ends, whatever happens.

Where the time goes: every trial also records a timeline of milestones, from slurmctld's log
(millisecond timestamps: preemption, allocation of the preempting job, its end, the expedite, the
requeued job's start), from submitit's log lines in the job (ms), and from the moment this script first
saw a line in the job's or the watcher's output (polled every 0.05 s). ``breakdown`` turns the
timeline into consecutive segments; the medians per segment go into the JSON. Each trial also records the
nodes before and after, and the steps redone (the last step logged before the resume minus the resumed
step: 0 means no step was lost).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from scripts.bench.machine import machine  # noqa: E402

SLURMCTLD_LOG = Path("/var/log/slurm/slurmctld.log")
SLURMD_LOGS = sorted(Path("/var/log/slurm").glob("slurmd-*.log"))
POLL_S = 0.05

# Milestones in the order they happen; a trial has a subset (native has no expedite).
MILESTONES = (
    ("preemptor_submitted", "the high-partition job that holds the run's node is submitted (clock starts)"),
    ("signal_seen", "the training job logs the preemption signal (SIGUSR2) and checkpoints"),
    ("self_requeue_seen", "rank 0 logs that this attempt ends (exit 75; the batch shell requeues)"),
    ("batch_done", "slurmd: the batch step has ended"),
    ("steps_done", "slurmd: the last node's training step has ended (processes gone)"),
    ("requeued", "slurmctld requeues the training job (the nodes are free)"),
    ("preemptor_started", "slurmctld starts the preempting job"),
    ("expedited", "slurmctld applies StartTime=now"),
    ("expedite_seen", "the watcher prints its expedite decision"),
    ("preemptor_done", "the preempting job ends"),
    ("job_restarted", "slurmctld starts the requeued training job"),
    ("submitit_started", "submitit's python in the job has loaded (its first log line)"),
    ("torch_deepspeed_imported", "DeepSpeed's accelerator line: torch and deepspeed imported"),
    ("rank_line_seen", "distributed init (gloo rendezvous) done: the rank line"),
    ("resumed_seen", "checkpoint loaded: 'resumed at step'"),
    ("first_step_seen", "first resumed step logged (clock stops)"),
)
MILESTONE_NAMES = [name for name, _ in MILESTONES]


# --- pure helpers (tests/unit/test_bench_recovery.py) ---------------------------------------------------------
def parse_stamp(text: str) -> float:
    """'2026-11-30T12:40:05.536' or '2026-11-30 12:40:05,536' (local time, as Slurm and submitit log) -> epoch."""
    return dt.datetime.fromisoformat(text.replace(",", ".").replace(" ", "T")).timestamp()


def slurmctld_milestones(lines: Sequence[str], job: str, preemptor: str, since: float) -> Dict[str, float]:
    """The slurmctld log lines about the training job and the preempting job, at or after ``since``."""
    patterns = {
        "requeued": rf"Requeuing JobId={job}\b",
        "preemptor_started": rf"(Allocate|Started) JobId={preemptor}\b",
        "expedited": rf"_update_job: setting begin to .* for JobId={job}\b",
        "preemptor_done": rf"_job_complete: JobId={preemptor} done",
        "job_restarted": rf"(Allocate|Started) JobId={job}\b",
    }
    found: Dict[str, float] = {}
    for line in lines:
        match = re.match(r"\[(\d{4}-\d\d-\d\dT[\d:.]+)\] (.*)", line)
        if not match:
            continue
        stamp = parse_stamp(match.group(1))
        if stamp < since - 0.5:  # slurmctld's ms clock vs ours: same host, allow rounding
            continue
        for name, pattern in patterns.items():
            if name not in found and re.search(pattern, match.group(2)):
                found[name] = stamp
    return found


def slurmd_milestones(per_node_lines: Sequence[Sequence[str]], job: str, since: float) -> Dict[str, float]:
    """When the attempt's training step and batch step ended: the latest node to say so, at or after ``since``."""
    found: Dict[str, float] = {}
    for lines in per_node_lines:
        ends: Dict[str, float] = {}
        for line in lines:
            match = re.match(rf"\[(\d{{4}}-\d\d-\d\dT[\d:.]+)\] \[{job}\.(0|batch)\] done with job", line)
            if match and parse_stamp(match.group(1)) >= since - 0.5:
                ends.setdefault(match.group(2), parse_stamp(match.group(1)))
        for step, name in (("0", "steps_done"), ("batch", "batch_done")):
            if step in ends:
                found[name] = max(found.get(name, 0.0), ends[step])
    return found


def submitit_milestones(text: str, since: float) -> Dict[str, float]:
    """Timestamps submitit and DeepSpeed themselves print in the job log, for the attempt that began after ``since``."""
    found: Dict[str, float] = {}
    for stamp in re.findall(r"submitit INFO \(([\d\- :,]+)\) - Starting with JobEnvironment", text):
        if parse_stamp(stamp) >= since and "submitit_started" not in found:
            found["submitit_started"] = parse_stamp(stamp)
    for stamp in re.findall(r"^\[([\d\- :,]+)\] \[WARNING\] \[real_accelerator", text, flags=re.M):
        if parse_stamp(stamp) >= since and "torch_deepspeed_imported" not in found:
            found["torch_deepspeed_imported"] = parse_stamp(stamp)
    return found


def steps_redone(text: str) -> Dict[str, Optional[int]]:
    """From the job log of the two attempts: the step the signal's checkpoint saved, the step the resumed
    attempt started from, the last step logged before the resume, and the steps trained twice."""
    saved = re.search(r"\[hpc_agent\] signal SIG\w+ at step (\d+)", text)
    resumed = re.search(r"resumed at step (\d+) ", text)
    if not resumed:
        return {"saved_step": int(saved.group(1)) if saved else None, "resumed_step": None,
                "last_step_before": None, "steps_redone": None}
    before = [int(m) for m in re.findall(r"\[hpc_agent\] step (\d+) ", text[:resumed.start()])]
    last = max(before) if before else 0
    step = int(resumed.group(1))
    return {"saved_step": int(saved.group(1)) if saved else None, "resumed_step": step, "last_step_before": last,
            "steps_redone": last - step}


def breakdown(times: Dict[str, float]) -> List[Dict[str, object]]:
    """Consecutive segments between the milestones that were seen, in their canonical order.

    A milestone seen out of order (e.g. the expedite landing after the preempting job ended) keeps its
    place in the list but the segments are cut by actual time, so every second is counted once."""
    seen = sorted(((t, name) for name, t in times.items() if name in MILESTONE_NAMES),
                  key=lambda p: (p[0], MILESTONE_NAMES.index(p[1])))
    out = []
    for (t_a, a), (t_b, b) in zip(seen, seen[1:]):
        out.append({"from": a, "to": b, "seconds": round(t_b - t_a, 3)})
    return out


def segment_medians(trials: List[Dict[str, object]], mode: str) -> Dict[str, float]:
    """Median seconds from the clock start to each milestone, over the trials of one mode."""
    offsets: Dict[str, List[float]] = {}
    for trial in trials:
        if trial["mode"] != mode:
            continue
        times = trial["milestones"]
        for name, t in times.items():
            offsets.setdefault(name, []).append(t - times["preemptor_submitted"])
    return {name: round(statistics.median(v), 3) for name, v in sorted(offsets.items(),
                                                                         key=lambda kv: statistics.median(kv[1]))}


def median_segments(trials: List[Dict[str, object]], mode: str) -> List[Dict[str, object]]:
    """Median seconds of each step between consecutive milestones (canonical order) that every trial of
    the mode has; unlike offsets from the start, these medians are of the segments themselves."""
    runs = [t["milestones"] for t in trials if t["mode"] == mode]
    common = [m for m in MILESTONE_NAMES if runs and all(m in r for r in runs)]
    out = []
    for a, b in zip(common, common[1:]):
        values = [r[b] - r[a] for r in runs]
        out.append({"from": a, "to": b, "median_s": round(statistics.median(values), 3),
                    "min_s": round(min(values), 3), "max_s": round(max(values), 3)})
    return out


def summarise(values: List[float]) -> Dict[str, float]:
    return {"median_s": round(statistics.median(values), 2), "min_s": min(values), "max_s": max(values),
            "trials": len(values)}


def paired_ratios(results: List[Dict[str, object]], mode: str, baseline: str = "native") -> Dict[str, float]:
    """The headline of docs/benchmarks.md's rules: ``baseline`` over ``mode`` per round (the trials of one round
    ran back to back), as median and min-max; rounds without both are left out."""
    by = {(r["mode"], r["trial"]): float(r["latency_s"]) for r in results if not r.get("reused_from")}
    ratios = [by[(baseline, i)] / by[(mode, i)] for (m, i) in by if m == mode and (baseline, i) in by and by[(mode, i)]]
    if not ratios:
        return {}
    return {"median": round(statistics.median(ratios), 1), "min": round(min(ratios), 1),
            "max": round(max(ratios), 1), "rounds": len(ratios)}


def reused_trials(old: Dict[str, object], mode: str, source: str) -> List[Dict[str, object]]:
    """The trials of one mode from an earlier results file, each marked with where it came from."""
    return [dict(t, reused_from=source) for t in old.get("trials", []) if t.get("mode") == mode
            and not t.get("reused_from")]


def rounds(trials: int, modes: Sequence[str], native_trials: int) -> List[Tuple[int, str]]:
    """(trial index, mode) in run order: modes alternate per round; native only in its first rounds."""
    return [(i, m) for i in range(trials) for m in modes if m != "native" or i < native_trials]


# --- the measurement (imperative shell) ------------------------------------------------------------------
class FirstSeen:
    """Polls text sources and records the first time (our clock) each named regex matched in them."""

    def __init__(self) -> None:
        self.times: Dict[str, float] = {}
        self.rules: List[Tuple[str, Callable[[], str], str]] = []

    def add(self, name: str, source: Callable[[], str], pattern: str) -> None:
        self.rules.append((name, source, pattern))

    def poll(self) -> None:
        now = time.time()
        cache: Dict[int, str] = {}
        for name, source, pattern in self.rules:
            if name in self.times:
                continue
            if id(source) not in cache:
                cache[id(source)] = source()
            text = cache[id(source)]
            if re.search(pattern, text, flags=re.M):
                self.times[name] = now


def _lines_since(path: Path, offset: int) -> List[str]:
    with open(path, errors="replace") as handle:
        handle.seek(offset)
        return handle.read().splitlines()


SIDE = {"default": (), "successor": ("resilience.successor_on_preempt=true",),
        "watcher": ("resilience.successor_on_preempt=false",), "native": ("resilience.successor_on_preempt=false",)}
"""Config overrides per mode: ``default`` is a run as a user submits it, nothing overridden and no watcher (the
hand-over to a successor job, hpc_agent/core/handback.py, is on by default since issue 45 and needs no watcher);
``successor`` is the hand-over with a watcher at ``--interval``; ``watcher`` and ``native`` keep the plain
requeue."""
WATCHED = ("watcher", "successor")


def trial(mode: str, index: int, work: Path, interval: float, partition: str, hold_s: int) -> dict:
    from hpc_agent.core.handback import read_successor
    from tests.slurm_helpers import (LONG_RUN, WatcherProcess, cleanup_jobs, job_nodes, last_step, log_text,
                                     preempt_node, submit, wait_for)

    root = work / f"{mode}-{index}"
    # The scenario needs the other node free: a job cancelled by the trial before is COMPLETING for up to
    # KillWait (30 s), and a preemptor may still hold its node.
    wait_for(cluster_idle, 120, interval=0.5, what="an idle cluster before the trial")
    run_dir, job = submit(root, *LONG_RUN, f"run.name={mode}{index}", "slurm.nodes=1", f"slurm.partition={partition}",
                          "train.max_steps=100000", "train.ckpt_every=1000", *SIDE.get(mode, ()))
    watcher = WatcherProcess(root, interval=interval) if mode in WATCHED else None
    successor = lambda: read_successor(run_dir, job)  # noqa: E731 - successor mode: the job that goes on
    preemptor = None
    try:
        wait_for(lambda: last_step(log_text(run_dir, job)) >= 20, 300, what="training to start")
        before = len(log_text(run_dir, job))
        first_node = job_nodes(job)
        ctld_offset = SLURMCTLD_LOG.stat().st_size if SLURMCTLD_LOG.exists() else 0
        slurmd_offsets = {p: p.stat().st_size for p in SLURMD_LOGS}
        seen = FirstSeen()
        def new_text() -> str:  # only what the preemption caused: the rest of this job's log, and its successor's
            succ = successor()
            return log_text(run_dir, job)[before:] + ("\n" + log_text(run_dir, succ) if succ else "")

        seen.add("signal_seen", new_text, r"\[hpc_agent\] signal SIG")
        seen.add("self_requeue_seen", new_text, r"this attempt ends now")
        seen.add("rank_line_seen", new_text, r"^\[rank 0/")
        seen.add("resumed_seen", new_text, r"resumed at step \d+ ")
        if watcher:
            seen.add("expedite_seen", watcher.output, r"expedite \(scontrol update StartTime=now")
        t0 = time.time()
        preemptor = preempt_node(first_node[0], hold_s)

        def resumed_step() -> bool:
            seen.poll()
            text = new_text()
            match = re.search(r"resumed at step (\d+) ", text)
            return bool(match) and re.search(rf"\[hpc_agent\] step {int(match.group(1)) + 1} ", text) is not None

        wait_for(resumed_step, 600, interval=POLL_S, what="the first resumed step")
        t1 = time.time()
        latency = t1 - t0
        going_on = successor() or job
        resumed_node = job_nodes(going_on)
        milestones = {"preemptor_submitted": t0, "first_step_seen": t1, **seen.times}
        milestones.update(submitit_milestones(new_text(), since=t0))
        if SLURMCTLD_LOG.exists():
            lines = _lines_since(SLURMCTLD_LOG, ctld_offset)
            milestones.update(slurmctld_milestones(lines, job, preemptor, since=t0))
            if going_on != job:  # the successor's start is the restart
                restarted = slurmctld_milestones(lines, going_on, preemptor, since=t0).get("job_restarted")
                milestones.pop("job_restarted", None)
                if restarted is not None:
                    milestones["job_restarted"] = restarted
        milestones.update(slurmd_milestones([_lines_since(p, o) for p, o in slurmd_offsets.items()], job, since=t0))
        steps = steps_redone(log_text(run_dir, job) + ("\n" + log_text(run_dir, going_on) if going_on != job else ""))
        # Handed over: the held original must leave the queue by itself (the successor cancels it; issue 45)
        left_in_queue = None
        if going_on != job:
            left_in_queue = not _left_queue(job, 30.0)
    finally:
        if watcher:
            watcher.stop()
        cleanup_jobs(root)
        if preemptor:
            subprocess.run(["scancel", preemptor], capture_output=True, timeout=30)
    print(f"  {mode} trial {index + 1}: {latency:.1f} s, {first_node} -> {resumed_node}, steps redone "
          f"{steps['steps_redone']}", flush=True)
    for seg in breakdown(milestones):
        print(f"      {seg['seconds']:7.2f} s  {seg['from']} -> {seg['to']}", flush=True)
    return {"mode": mode, "trial": index, "latency_s": round(latency, 2), "job_id": job, "successor_id": going_on
            if going_on != job else None, "preemptor_id": preemptor, "predecessor_left_in_queue": left_in_queue,
            "partition": partition, "nodes_before": first_node, "nodes_after": resumed_node, **steps,
            "milestones": {k: round(v, 3) for k, v in milestones.items()}, "breakdown": breakdown(milestones)}


def _left_queue(job: str, timeout_s: float) -> bool:
    """Whether ``job`` is gone from squeue within ``timeout_s`` (polled every 0.5 s)."""
    deadline = time.time() + timeout_s
    while True:
        listed = subprocess.run(["squeue", "-h", "-j", job, "-o", "%i"], capture_output=True, text=True,
                                timeout=30).stdout.split()
        if job not in listed:
            return True
        if time.time() > deadline:
            return False
        time.sleep(0.5)


def cluster_idle() -> bool:
    """No job queued, running or completing, and every node idle."""
    queue = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, timeout=30).stdout.split()
    nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, timeout=30).stdout.split()
    return not queue and bool(nodes) and all(state == "idle" for state in nodes)


def scheduler(setting: str) -> str:
    """Switch the localhost cluster's SchedulerParameters (scripts/cluster.sh sched); returns what it says."""
    proc = subprocess.run(["bash", str(REPO / "scripts" / "cluster.sh"), "sched", setting], capture_output=True,
                          text=True, timeout=60, check=True)
    return proc.stdout.strip().splitlines()[-1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5, help="preemptions per mode (default 5)")
    parser.add_argument("--interval", type=float, default=1.0, help="the watcher's --interval (default 1 s)")
    parser.add_argument("--modes", default="default,native",
                        help="comma-separated modes: default, successor, watcher, native (default: default,native)")
    parser.add_argument("--native-trials", type=int, default=None,
                        help="native trials to run (default: --trials); they go in the first rounds")
    parser.add_argument("--reuse-native", default=None,
                        help="an earlier results JSON whose native trials are added to the native figures")
    parser.add_argument("--partition", default="low",
                        help="the run's partition: low (PreemptMode=REQUEUE) or lowcancel (PreemptMode=CANCEL)")
    parser.add_argument("--hold", type=int, default=20, help="seconds the preemptor holds the run's node (>= 15)")
    parser.add_argument("--scheduler", choices=("default", "fast"), default="default",
                        help="SchedulerParameters during the benchmark: Slurm's defaults (default) or the test "
                             "cluster's fast setting; the fast setting is restored at the end either way")
    parser.add_argument("--out", default=str(REPO / "results" / "bench_recovery.json"))
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    native_trials = args.trials if args.native_trials is None else args.native_trials
    reused: List[Dict[str, object]] = []
    if args.reuse_native:
        old = json.loads(Path(args.reuse_native).read_text())
        reused = reused_trials(old, "native", f"{args.reuse_native} ({old.get('when', '?')})")
        if "native" not in modes:
            modes.append("native")
    results = []
    machine_before = machine()
    t_start = time.time()
    partial = Path(tempfile.gettempdir()) / "bench_recovery.partial.jsonl"
    partial.unlink(missing_ok=True)
    # timeout(1)/kill send SIGTERM: end through the finally below, which restores the fast scheduler setting
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    sched_during = scheduler(args.scheduler)
    print(f"scheduler during the benchmark: {sched_during}", flush=True)
    try:
        # a cancelled job may still be writing its log while the directory is removed: not an error
        with tempfile.TemporaryDirectory(prefix="bench-recovery-", ignore_cleanup_errors=True) as tmp:
            for i, mode in rounds(args.trials, modes, native_trials):
                results.append(trial(mode, i, Path(tmp), args.interval, args.partition, args.hold))
                with open(partial, "a") as handle:  # a crash later in the session keeps the trials done so far
                    handle.write(json.dumps(results[-1]) + "\n")
    finally:
        print(f"scheduler restored: {scheduler('fast')}", flush=True)
    wall_s = round(time.time() - t_start, 1)
    fresh = list(results)
    results += reused
    summary: Dict[str, object] = {}
    for mode in modes:
        values = [r["latency_s"] for r in results if r["mode"] == mode]
        if not values:
            continue
        summary[mode] = summarise(values)
        summary[mode]["fresh_trials"] = sum(1 for r in fresh if r["mode"] == mode)
        summary[mode]["reused_trials"] = len(values) - summary[mode]["fresh_trials"]
        if summary[mode]["fresh_trials"] and summary[mode]["reused_trials"]:
            summary[mode]["fresh_median_s"] = round(statistics.median(
                r["latency_s"] for r in fresh if r["mode"] == mode), 2)
    for mode in ("default", "watcher", "successor"):
        if mode in summary and "native" in summary:
            summary[f"speedup_native_over_{mode}"] = round(summary["native"]["median_s"] / summary[mode]["median_s"], 1)
            if paired_ratios(fresh, mode):
                summary[f"paired_speedup_native_over_{mode}"] = paired_ratios(fresh, mode)
    out = {"benchmark": "recovery latency (preemption -> first resumed step)",
           "clock": "starts when the preempting job is submitted, stops when the resumed attempt's first step is logged",
           "scenario": f"1-node run in partition {args.partition} on the 2-node cluster; a high-partition job holds "
                       f"its node {args.hold} s, so the resumed attempt starts on the other node",
           "scheduler_parameters": sched_during, "watcher_interval_s": args.interval, "summary": summary,
           "steps_redone": [r.get("steps_redone") for r in fresh],
           "resumed_on_other_node": [r.get("nodes_after") != r.get("nodes_before") for r in fresh],
           "predecessor_left_in_queue": [r.get("predecessor_left_in_queue") for r in fresh],
           "median_time_to_milestone_s": {m: segment_medians(results, m) for m in summary if m in modes},
           "median_segments": {m: median_segments(results, m) for m in summary if m in modes},
           "milestones": dict(MILESTONES), "trials": results, "bench_wall_s": wall_s,
           "when": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": machine_before,
           "load_average_after": machine()["load_average"]}
    from hpc_agent.core.fsutil import atomic_write_json

    atomic_write_json(Path(args.out), out)
    partial.unlink(missing_ok=True)
    print(json.dumps({"summary": summary, "median_time_to_milestone_s": out["median_time_to_milestone_s"]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

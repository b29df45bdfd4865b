"""How soon Slurm gives a preempted batch job's continuation a node, for each way the job can hand over.

    flock /tmp/hpc_slurm.lock python -m scripts.bench.handover [--trials 5] [--out results/bench_handover.json]

P1 (``scripts/bench/recovery.py``) times the whole recovery of a training job; this isolates Slurm's part of it with
plain batch jobs (bash and ``sleep``, no Python in the job), on the localhost cluster under Slurm's default
SchedulerParameters (switched for the run, restored after, as ``scripts/bench/recovery.py`` does). Each trial: a job
in the preemptable partition ``low`` (1 task, ``--requeue``, ``--signal=B:USR2@60``) runs on one node; a job
in ``high`` that needs that whole node for ``--hold`` seconds preempts it; the other node is free. The
victim's batch shell traps the preemption signal and hands over one way:

- ``requeue_expedite``: today's path (``hpc_agent/core/handback.py``). It requeues itself; this script plays the
  watcher and expedites it (``scontrol update StartTime=now``) as soon as ``squeue`` shows it pending on its
  begin time (polled every 0.05 s).
- ``requeue_expedite_late``: the same, expedited ``LATE_S`` (0.5 s) later, as late as P1's watcher does.
- ``successor_exit``: it submits a successor job (same request) and ends for good (``Requeue=0``, exit 0).
- ``successor_requeuehold``: it submits a successor and requeues itself *held* (``scontrol requeuehold``): a
  held job cannot start again by itself, and a requeue makes slurmctld schedule at once when the job is done.

Clock: slurmctld's own log (millisecond stamps) from the preempting job's submission to the allocation of
the continuation (the requeued job, or the successor). Slurm's default ``batch_sched_delay`` (3 s, whole
seconds) paces event-triggered scheduling passes; a requeue's completion runs one at once, but the requeued
job's new begin time (now + 121 s) is set in the same moment, so only a job that is already eligible then
(the successor) is started by that pass.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from hpc_agent.core.fsutil import atomic_write_json  # noqa: E402

PATHS = ("requeue_expedite", "requeue_expedite_late", "successor_exit", "successor_requeuehold")
LATE_S = 0.5
"""``requeue_expedite_late`` expedites this long after the requeued job shows pending: the watcher's own delay
in P1 (0.3 to 0.7 s: it waits for sacct to record the requeue, then asks squeue)."""
SETTLE_S = 5.0
"""Seconds the victim runs before it is preempted: P1's job has trained for a while, so slurmctld's last
scheduling pass is older than ``batch_sched_delay`` and the preempting job is looked at when it is submitted."""
MILESTONES = ("preemptor_submitted", "victim_done", "preemptor_allocated", "expedited", "continuation_allocated")

# The victim's batch script. {path} picks the hand-over; {succ_file} receives the successor's job id.
VICTIM = """#!/bin/bash
#SBATCH --partition=low --ntasks=1 --mem=2G --requeue --signal=B:USR2@60 --open-mode=append
#SBATCH --job-name=handover-victim --output={log}
hand_over() {{
    kill "$child" 2>/dev/null; wait "$child" 2>/dev/null  # the work is gone, as after a training checkpoint
    case {path} in
    requeue_expedite*) scontrol requeue "$SLURM_JOB_ID" ;;
    successor_exit)
        sbatch --parsable --partition=low --ntasks=1 --mem=2G --job-name=handover-successor --output=/dev/null \\
            --wrap="sleep 60" > {succ_file}
        scontrol update JobId="$SLURM_JOB_ID" Requeue=0 ;;
    successor_requeuehold)
        sbatch --parsable --partition=low --ntasks=1 --mem=2G --job-name=handover-successor --output=/dev/null \\
            --wrap="sleep 60" > {succ_file}
        scontrol requeuehold "$SLURM_JOB_ID" ;;
    esac
    exit 0
}}
trap hand_over USR2
echo "victim started ${{SLURM_RESTART_COUNT:-0}}"
sleep 1000 & child=$!
wait "$child"
"""


# --- pure helpers (tests/unit/test_bench_handover.py) ----------------------------------------------------------
def ctld_times(lines: Sequence[str], victim: str, preemptor: str, continuation: Optional[str]) -> Dict[str, float]:
    """The milestones of one trial from slurmctld log lines (first occurrence of each), as epoch seconds."""
    from scripts.bench.recovery import parse_stamp

    patterns = {
        "preemptor_submitted": rf"_slurm_rpc_submit_batch_job: JobId={preemptor}\b",
        "victim_done": rf"(Requeuing JobId={victim}\b|_job_complete: JobId={victim} done)",
        "preemptor_allocated": rf"(Allocate|Started) JobId={preemptor}\b",
    }
    if continuation == victim:
        patterns["expedited"] = rf"_update_job: setting begin to .* for JobId={victim}\b"
    if continuation:
        patterns["continuation_allocated"] = rf"(Allocate|Started) JobId={continuation}\b"
    found: Dict[str, float] = {}
    for line in lines:
        match = re.match(r"\[(\d{4}-\d\d-\d\dT[\d:.]+)\] (.*)", line)
        if not match:
            continue
        for name, pattern in patterns.items():
            if name not in found and re.search(pattern, match.group(2)):
                found[name] = parse_stamp(match.group(1))
    return found


def offsets(times: Dict[str, float]) -> Dict[str, float]:
    """Each milestone in seconds after the preempting job's submission (milestones not seen are left out)."""
    t0 = times.get("preemptor_submitted")
    if t0 is None:
        return {}
    return {name: round(times[name] - t0, 3) for name in MILESTONES[1:] if name in times}


def summary(trials: List[dict]) -> Dict[str, dict]:
    """Per path: median, min and max of each milestone's offset over the trials that saw it."""
    out: Dict[str, dict] = {}
    for path in PATHS:
        rows = [t["offsets_s"] for t in trials if t["path"] == path]
        if not rows:
            continue
        out[path] = {"trials": len(rows)}
        for name in MILESTONES[1:]:
            values = [r[name] for r in rows if name in r]
            if values:
                out[path][name] = {"median_s": round(statistics.median(values), 3), "min_s": min(values),
                                   "max_s": max(values), "seen": len(values)}
    return out


# --- the cluster side ---------------------------------------------------------------------------------------
def _run(argv: List[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.strip()


def trial(path: str, work: Path, hold_s: int, log_path: Path) -> dict:
    from scripts.bench.recovery import _lines_since, cluster_idle
    from tests.slurm_helpers import wait_for

    wait_for(cluster_idle, 120, interval=0.5, what="an idle cluster")
    log = work / f"{path}-victim.log"
    succ_file = work / f"{path}-successor.id"
    for stale in (log, succ_file):  # the same names serve every trial of a path
        stale.unlink(missing_ok=True)
    script = work / f"{path}.sh"
    script.write_text(VICTIM.format(path=path, log=log, succ_file=succ_file))
    victim = _run(["sbatch", "--parsable", str(script)]).split(";")[0]
    preemptor = continuation = None
    try:
        wait_for(lambda: log.exists() and "victim started" in log.read_text(), 60, interval=0.05, what="victim start")
        node = _run(["squeue", "-h", "-j", victim, "-o", "%N"])
        time.sleep(SETTLE_S)
        offset = log_path.stat().st_size
        preemptor = _run(["sbatch", "--parsable", "--partition=high", "--nodes=1", f"--nodelist={node}",
                          "--ntasks-per-node=2", "--output=/dev/null", f"--wrap=sleep {hold_s}"]).split(";")[0]
        if path.startswith("requeue_expedite"):
            wait_for(lambda: _run(["squeue", "-h", "-j", victim, "-o", "%T"]) == "PENDING", 30, interval=0.05,
                     what="requeued victim")
            if path == "requeue_expedite_late":
                time.sleep(LATE_S)
            _run(["scontrol", "update", f"JobId={victim}", "StartTime=now"])
            continuation = victim
        else:
            continuation = wait_for(lambda: succ_file.exists() and succ_file.read_text().strip().split(";")[0], 30,
                                    interval=0.05, what="successor id")
        pattern = re.compile(rf"(Allocate|Started) JobId={continuation}\b")
        wait_for(lambda: any(pattern.search(line) for line in _lines_since(log_path, offset)), 30, interval=0.1,
                 what="continuation allocated")
        times = ctld_times(_lines_since(log_path, offset), victim, preemptor, continuation)
    finally:
        _run(["scancel"] + [j for j in (victim, preemptor, continuation) if j])
    return {"path": path, "victim": victim, "preemptor": preemptor, "continuation": continuation, "node": node,
            "offsets_s": offsets(times)}


def main() -> int:
    from scripts.bench.recovery import SLURMCTLD_LOG, scheduler

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5, help="trials per hand-over path (default 5)")
    parser.add_argument("--hold", type=int, default=15, help="seconds the preempting job holds the node (default 15)")
    parser.add_argument("--paths", default=",".join(PATHS), help="comma-separated hand-over paths (default: all)")
    parser.add_argument("--out", default=str(REPO / "results" / "bench_handover.json"))
    args = parser.parse_args()
    started = time.time()
    trials: List[dict] = []
    sched = scheduler("default")
    try:
        with tempfile.TemporaryDirectory(prefix="bench_handover_") as tmp:
            for index in range(args.trials):  # the paths interleaved: drift on the machine hits each alike
                for path in [p for p in args.paths.split(",") if p]:
                    try:
                        result = trial(path, Path(tmp), args.hold, SLURMCTLD_LOG)
                    except AssertionError as exc:  # wait_for's timeout  # one stuck trial is reported, not fatal to the others
                        result = {"path": path, "error": str(exc), "offsets_s": {}}
                    result["trial"] = index
                    trials.append(result)
                    print(f"[bench_handover] {path} #{index}: {json.dumps(result['offsets_s'])}", flush=True)
    finally:
        scheduler("fast")
    out = {"benchmark": "preempted batch job -> its continuation allocated, per hand-over path (slurmctld clock)",
           "when": time.strftime("%Y-%m-%dT%H:%M:%S"), "scheduler_parameters": sched, "hold_s": args.hold,
           "summary": summary(trials), "trials": trials, "bench_wall_s": round(time.time() - started, 1)}
    atomic_write_json(Path(args.out), out)
    print(json.dumps(out["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

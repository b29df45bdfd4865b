"""P2, ETTR under faults that behave as real ones do: the toolkit against the strongest realistic baseline, to the
rules of docs/benchmarks.md (issue 45).

    flock /tmp/hpc_slurm.lock python -m scripts.bench.ettr [--scales small,large] [--seeds 1,2,3] [--window 600]
        [--out results/bench_ettr.json]

Needs the localhost Slurm (bash scripts/cluster.sh up) and nothing else running on it; like P1 it runs under Slurm's
default SchedulerParameters (``--scheduler``) and puts the test cluster's fast setting back at the end.

**The two sides.** Both submit the same config with ``python -m hpc_agent.submit`` to the 2-node partition ``low``:

- ``toolkit``: the defaults (in-job repairs, the hand-over to a successor job at a preemption, no snapshots) and
  ``python -m hpc_agent.watch`` at its default ``--interval`` (5 s);
- ``baseline``: what a user builds from submitit and a shell loop (NOTES.md, "Baselines users actually run"): at
  the preemption signal the job saves a checkpoint and requeues itself (submitit's ``checkpoint()``), Slurm's
  ``--requeue`` brings it back (eligible 121 s later), and a loop resubmits a job that ended any other way than
  COMPLETED, unchanged, resuming from its newest checkpoint, at most ``max_retries`` (3) times
  (:class:`ResubmitLoop`, polling every second). No in-job repairs, no hand-over, no watcher.

**The faults** (``ChaosDriver(persistent=True)``; launch/chaos_trigger.py) behave as real ones do: a GPU OOM recurs
at any micro-batch at or above the one it happened at; a divergence (NaN) recurs at the same step with the same LR
(the data order is a function of the step); a host OOM recurs at every start while ``--mem`` is what it was; a bad
node (its GPU falls off the bus, Xid 79) fails every attempt placed on it until it is excluded; a hang recurs at
the same step on the same node. A preemption takes the run's node for ``--preempt-hold`` seconds (60) with a job
of the high partition; it is the one fault that goes away by itself, and it is reported under its own name. Each
seed draws the order and times of the six faults (``hpc_agent.chaos.schedule.from_seed``: one of each, about
``window / 9`` apart, from ~40 s after the first step); both sides get the same seeds.

**The scales**: ``small`` is the earlier P2 setting (a 4-layer, 128-wide byte GPT, ~0.1 s steps, a 16 MB
checkpoint); ``large`` is a bigger model, not a padding buffer: GPT-2 small's shape with a byte vocabulary
(12 layers, 768 wide, 85.5M parameters), ~2 s steps on one CPU under Slurm, a ~1.4 GB checkpoint (fp32 weights, the ZeRO
fp32 partition, Adam's two moments). Both checkpoint about every 30 s of training, the same on both sides.

**The figure**: ETTR = the step time of the steps that survive in TensorBoard and ended within the window, over
the window (``--window`` seconds from the submission; ``hpc_agent.runs.goodput.time_lost``). A run that can no
longer train (the loop gave up, a hung job that would hold its node until its 2-hour limit, a run the watcher
stopped) ends early and is charged the whole window all the same. The lost time is split by cause
(``goodput.lost_by_cause``: each fault is charged the first gap after its injection). Each (scale, seed) runs
both sides one after the other on an idle cluster, the order alternating by seed.
"""
from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from hpc_agent.chaos import inject  # noqa: E402
from hpc_agent.chaos.campaign import ChaosDriver, Target, submit_run  # noqa: E402
from hpc_agent.chaos.schedule import GPU_OOM, HANG, HOST_OOM, NAN, NODE_FAIL, PREEMPT, from_seed  # noqa: E402
from hpc_agent.core.fsutil import atomic_write_json  # noqa: E402
from hpc_agent.runs.goodput import lost_by_cause  # noqa: E402
from hpc_agent.slurm.cli import SlurmCLI  # noqa: E402
from hpc_agent.slurm.queries import queue_state  # noqa: E402
from scripts.bench.machine import machine  # noqa: E402

COMMON = ["slurm.nodes=1", "slurm.cpus_per_task=1", "slurm.time=02:00:00", "train.max_steps=1000000",
          "slurm.partition=low"]
SCALES: Dict[str, Dict[str, Any]] = {
    "small": {"overrides": ["slurm.mem=2G", "train.micro_batch_size=8", "model.d_model=128", "model.n_layers=4",
                            "model.seq_len=128", "train.ckpt_every=300"],
              "what": "byte GPT, 4 layers x 128 wide, seq 128, micro-batch 8: ~0.1 s steps, a 16 MB checkpoint, "
                      "one every 300 steps (~30 s)"},
    "large": {"overrides": ["slurm.mem=4G", "train.micro_batch_size=2", "model.d_model=768", "model.n_layers=12",
                            "model.n_heads=12", "model.seq_len=64", "train.ckpt_every=15"],
              "what": "a bigger model (no padding): GPT-2 small's shape with a byte vocabulary, 12 layers x 768 "
                      "wide, 85.5M parameters, seq 64, micro-batch 2: ~2 s steps on one CPU under Slurm, a ~1.4 GB "
                      "checkpoint (fp32 weights, ZeRO's fp32 partition, Adam's two moments), one every 15 steps "
                      "(~30 s)"},
}
SIDES = {
    "toolkit": ["resilience.in_job_retries=2"],  # the default (configs/chaos.yaml turns it off for the chaos CI)
    "baseline": ["resilience.in_job_retries=0", "resilience.successor_on_preempt=false",
                 "resilience.snapshot_every=0"],
}
MIX = (PREEMPT, GPU_OOM, HOST_OOM, NAN, NODE_FAIL, HANG)
MAX_RETRIES = 3
WATCH_INTERVAL_S = 5.0  # python -m hpc_agent.watch's default
HUNG_AFTER_S = 90.0  # a baseline job RUNNING without a new step this long is hung until its time limit
GONE_AFTER_S = 60.0  # no job of the run in the queue this long: nothing will bring it back


# --- the baseline's resubmit loop ---------------------------------------------------------------------------------
def loop_action(queued: bool, state: str, retries: int, max_retries: int) -> str:
    """The user's loop, decided (pure): ``wait`` while the job is queued or sacct has no final state yet (a
    preempted job Slurm requeued is queued), ``done`` at COMPLETED, else ``resubmit`` until ``max_retries``
    resubmissions were made, then ``give_up``."""
    if queued or state in ("", "PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "UNKNOWN", "COMPLETING"):
        return "wait"
    if state == "COMPLETED":
        return "done"
    return "resubmit" if retries < max_retries else "give_up"


class ResubmitLoop:
    """The loop users write around submitit: when the run's job has ended other than COMPLETED (a preempted job
    Slurm requeued has not ended), submit the same config again, resuming from its newest checkpoint; give up after
    ``max_retries`` resubmissions."""

    def __init__(self, root: Path, run_dir: Path, slurm: SlurmCLI, max_retries: int = MAX_RETRIES,
                 say: Callable[[str], None] = print):
        self.root, self.run_dir, self.slurm, self.max_retries, self.say = root, run_dir, slurm, max_retries, say
        self.retries, self.gave_up, self.completed = 0, "", False
        self.ends: List[Dict[str, Any]] = []

    def _job(self) -> str:
        from hpc_agent.core.rundir import read_run_json

        ids = read_run_json(self.run_dir).get("job_ids", [])
        return str(ids[-1]) if ids else ""

    def poll(self) -> None:
        if self.gave_up or self.completed:
            return
        job = self._job()
        if not job:
            return
        queued = queue_state(self.slurm, job)
        if queued is None:  # squeue could not be asked: never act on a guess
            return
        state = ""
        if not queued:
            rows = self.slurm.run(["sacct", "-X", "-n", "-P", "-j", job, "--format", "State"],
                                  check=False).stdout.split()
            state = rows[-1].split()[0] if rows else "UNKNOWN"
        action = loop_action(bool(queued), state, self.retries, self.max_retries)
        if action == "done":
            self.completed = True
        if action not in ("resubmit", "give_up"):
            return
        self.ends.append({"job": job, "state": state, "at": time.time()})
        if action == "give_up":
            self.gave_up = f"job {job} ended {state} after {self.retries} resubmissions (max_retries {self.max_retries})"
            self.say(f"  baseline loop: {self.gave_up}; giving up")
            return
        self.retries += 1
        try:
            new = resubmit_unchanged(self.root, self.run_dir)
        except Exception as exc:  # noqa: BLE001 - sbatch's refusal ends the user's loop as well
            self.gave_up = f"resubmitting job {job} failed: {exc}"
            self.say(f"  baseline loop: {self.gave_up}")
            return
        self.say(f"  baseline loop: job {job} ended {state}: resubmitted unchanged as {new} "
                 f"({self.retries} of {self.max_retries})")


def resubmit_unchanged(root: Path, run_dir: Path) -> str:
    """``sbatch`` of the same job again, as a user's loop does (submitit's ``executor.submit`` of the same callable):
    the run's config as it is; the job resumes from the newest complete checkpoint in the run directory (what the
    trainer does at every start). Nothing goes through the ledger: no watcher follows this run."""
    from hpc_agent.config.load import load_run_config
    from hpc_agent.core import rundir
    from hpc_agent.jobs.executor import make_executor
    from hpc_agent.jobs.submission import job_for, update_run_json

    cfg = load_run_config(run_dir)
    config_path = run_dir / rundir.CONFIG
    executor = make_executor("slurm", rundir.slurm_dir(run_dir), cfg, run_dir.name, run_dir, config_path)
    job = executor.submit(job_for(run_dir, cfg, config_path))
    update_run_json(run_dir, run_dir.name, "slurm", str(job.job_id), config_path, cfg)  # the loop's own record
    return str(job.job_id)


def looks_hung(states: List[str], moved_at: float, running_since: Optional[float], now: float,
               training: bool) -> bool:
    """A baseline job hung with nothing watching it (pure): the run's one job RUNNING, for ``HUNG_AFTER_S`` since
    both its last progress and the moment it began to run (a requeued job that has just started is not hung)."""
    return (states == ["RUNNING"] and training and running_since is not None
            and now - max(moved_at, running_since) > HUNG_AFTER_S)


# --- one run ---------------------------------------------------------------------------------------------------------
def cancel_run(slurm: SlurmCLI, run_dir: Path) -> None:
    from hpc_agent.slurm.job_match import job_name_for

    slurm.run(["scancel", "--me", "--name", job_name_for(run_dir.name)], check=False)


def wait_idle(timeout_s: float = 180.0) -> float:
    from scripts.bench.recovery import cluster_idle  # P1's: no job queued, every node idle

    start = time.time()
    while not cluster_idle():
        if time.time() - start > timeout_s:
            raise RuntimeError(f"the cluster is not idle after {timeout_s:.0f} s: squeue shows other jobs")
        time.sleep(1.0)
    return round(time.time() - start, 1)


def one_run(scale: str, seed: int, side: str, window: float, hold_s: int, work: Path, keep: bool) -> Dict[str, Any]:
    slurm = SlurmCLI(timeout_s=60)
    waited = wait_idle()
    faults = schedule(seed, window)
    root = work / f"{scale}-s{seed}-{side}"
    say = lambda text: print(f"[{scale} seed {seed} {side}] {text}", flush=True)  # noqa: E731
    run_dir = submit_run(root, "configs/chaos.yaml", [*COMMON, *SCALES[scale]["overrides"], *SIDES[side],
                                                       f"run.name=p2-{scale}-{seed}-{side}"])
    target = Target(side, root, run_dir)
    loop = ResubmitLoop(root, run_dir, slurm, say=say) if side == "baseline" else None
    if side == "toolkit":
        target.watcher = inject.Watcher(root, interval=WATCH_INTERVAL_S)
        target.watcher.start()
    seen: Dict[str, Any] = {"step": None, "moved": time.time(), "queued": time.time(), "running_since": None}

    def stop_when() -> Optional[str]:
        now = time.time()
        progress = target.progress()
        key = (len(progress.segments), progress.last_step)  # a new attempt redoing the same steps is progress too
        if key != seen["step"]:
            seen["step"], seen["moved"] = key, now
        states = [state for state, _ in inject.run_queue(slurm, run_dir) or ()]
        if states:
            seen["queued"] = now
        if states != ["RUNNING"]:
            seen["running_since"] = None
        elif seen.get("running_since") is None:  # the job (a requeued one too) only now began to run
            seen["running_since"] = now
        if loop is not None and loop.gave_up:
            return f"the resubmit loop gave up: {loop.gave_up}"
        if now - seen["queued"] > GONE_AFTER_S:
            return f"no job of the run in the queue for {GONE_AFTER_S:.0f} s"
        if loop is not None and looks_hung(states, seen["moved"], seen["running_since"], now, progress.training):
            return (f"hung: no step for {HUNG_AFTER_S:.0f} s while RUNNING; with nothing watching it, the job holds "
                    "its node until its time limit (2 h)")
        return None

    driver = ChaosDriver([target], faults, duration_s=window, sequential=True, recovery_timeout_s=200.0,
                         out=say, slurm=slurm, on_poll=loop.poll if loop else (lambda: None), persistent=True,
                         preempt_hold_s=hold_s, stop_when=stop_when, charge_window=True)
    try:
        (summary,) = driver.run()
    finally:
        if target.watcher is not None:
            target.watcher.stop()
        cancel_run(slurm, run_dir)
    start = driver.started + window - summary.wall_s  # the run's creation (the ledger's)
    injected = [(r.kind, r.injected_at_s + (driver.t0 - start)) for r in driver.records if r.injected_at_s is not None]
    recurred = recurrences(run_dir, start)  # a persistent fault met again: charged to its own kind
    cfg = target.config()
    by_cause = lost_by_cause(summary.time_lost or {}, injected + recurred, window_s=summary.wall_s,
                             ckpt_every=cfg.train.ckpt_every, startup_s=driver.t0 - start)
    steps = [s for s in (summary.time_lost or {}).get("gaps", [])]
    out = {"scale": scale, "seed": seed, "side": side, "ettr": summary.ettr, "productive_s": summary.productive_s,
           "window_s": summary.wall_s, "lost_s": (summary.time_lost or {}).get("lost_s"),
           "lost_by_cause_s": by_cause, "stopped_early": driver.stopped_early,
           "schedule": [f.to_dict() for f in faults],
           "faults": [r.to_dict() for r in driver.records], "jobs": target.job_ids(),
           "resubmissions": loop.retries if loop else None, "ends_seen_by_loop": loop.ends if loop else None,
           "last_step": target.progress().last_step, "waited_for_idle_cluster_s": waited,
           "largest_gaps": steps[:8], "time_lost": summary.time_lost, "started_at": start,
           "first_step_seen_s": round(driver.t0 - start, 2), "recurrences": recurred,
           "run_dir": str(run_dir) if keep else None}
    say(f"ETTR {summary.ettr} ({summary.productive_s:.0f} s of {summary.wall_s:.0f} s); lost by cause: "
        + ", ".join(f"{k} {v:.0f} s" for k, v in sorted(by_cause.items(), key=lambda kv: -kv[1])))
    return out


def recurrences(run_dir: Path, start: float, limit: int = 1 << 20) -> List[tuple]:
    """``(kind, seconds from start)`` of every recurrence of a persistent fault, from the job's
    ``chaos/recurred.jsonl`` (launch/chaos_trigger.py; the first ``limit`` bytes; malformed lines skipped)."""
    try:
        with open(Path(run_dir) / "chaos" / "recurred.jsonl", "rb") as handle:
            text = handle.read(limit).decode(errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            item = json.loads(line)
            out.append((str(item["kind"]), round(float(item["time"]) - start, 3)))
        except (ValueError, KeyError, TypeError):
            continue
    return out


def schedule(seed: int, window: float):
    """One of each fault of ``MIX``, in the seed's order, about ``window / 9`` apart from ~40 s after the first
    step; the same for both sides."""
    return from_seed(seed, len(MIX), every_s=window / 9, kinds=MIX, first_s=40.0)


# --- the summary -----------------------------------------------------------------------------------------------------
def spread(values: List[float]) -> Dict[str, Any]:
    values = [v for v in values if v is not None]
    if not values:
        return {"n": 0}
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4), "max": round(max(values), 4),
            "n": len(values)}


def summarise(trials: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Per scale: ETTR per side and the ratio per seed, median and min-max; the lost time by cause per side
    (median over the seeds of each cause's seconds, a seed without the cause counting 0)."""
    out: Dict[str, Any] = {}
    for scale in sorted({t["scale"] for t in trials}):
        rows = [t for t in trials if t["scale"] == scale]
        seeds = sorted({t["seed"] for t in rows})
        by = {(t["seed"], t["side"]): t for t in rows}
        ratios = [by[(s, "toolkit")]["ettr"] / by[(s, "baseline")]["ettr"] for s in seeds
                  if (s, "toolkit") in by and (s, "baseline") in by and by[(s, "baseline")]["ettr"]]
        entry: Dict[str, Any] = {"seeds": seeds, "ratio_toolkit_over_baseline": spread(ratios)}
        for side in SIDES:
            mine = [t for t in rows if t["side"] == side]
            causes = sorted({c for t in mine for c in t["lost_by_cause_s"]})
            entry[side] = {"ettr": spread([t["ettr"] for t in mine]),
                           "lost_by_cause_s_median": {c: round(statistics.median(
                               [t["lost_by_cause_s"].get(c, 0.0) for t in mine]), 1) for c in causes},
                           "ended_early": sum(1 for t in mine if t["stopped_early"])}
        out[scale] = entry
    return out


def markdown(out: Dict[str, Any]) -> str:
    """The tables docs/benchmarks.md shows, from a results file: ETTR and the ratio per scale, then the lost
    seconds by cause (median over the seeds) and, per fault kind, what it cost each side."""
    lines = ["| scale | toolkit ETTR | baseline ETTR | ratio (per seed) | seeds |", "| --- | --- | --- | --- | --- |"]

    def fmt(d: Dict[str, Any], digits: int = 3) -> str:
        if not d.get("n"):
            return "-"
        return f"{d['median']:.{digits}f} ({d['min']:.{digits}f}-{d['max']:.{digits}f})"

    for scale, entry in out["summary"].items():
        lines.append(f"| {scale} | {fmt(entry['toolkit']['ettr'])} | {fmt(entry['baseline']['ettr'])} | "
                     f"{fmt(entry['ratio_toolkit_over_baseline'], 1)}x | {', '.join(map(str, entry['seeds']))} |")
    causes = sorted({c for e in out["summary"].values() for side in SIDES for c in e[side]["lost_by_cause_s_median"]})
    lines += ["", "| scale | side | " + " | ".join(causes) + " |", "| --- | --- |" + " --- |" * len(causes)]
    for scale, entry in out["summary"].items():
        for side in SIDES:
            row = entry[side]["lost_by_cause_s_median"]
            lines.append(f"| {scale} | {side} | " + " | ".join(f"{row.get(c, 0.0):.0f}" for c in causes) + " |")
    lines += ["", "| scale | seed | side | ETTR | faults met (recovered in s) | recurrences recorded | ended early |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for t in out["trials"]:
        met = ", ".join(f"{f['kind']} {f['recovery_s']:.0f}" if f.get("recovered") else
                        f"{f['kind']} {'-' if f.get('injected_at_s') is None else 'not recovered'}"
                        for f in t["faults"])
        again: Dict[str, int] = {}
        for kind, _ in t.get("recurrences") or ():
            again[kind] = again.get(kind, 0) + 1
        seen = ", ".join(f"{k} x{n}" for k, n in sorted(again.items())) if "recurrences" in t else "not recorded"
        lines.append(f"| {t['scale']} | {t['seed']} | {t['side']} | {t['ettr']} | {met} | {seen or '-'} | "
                     f"{t['stopped_early'] or '-'} |")
    return "\n".join(lines)


def replace_trials(out: Dict[str, Any], rerun: Dict[str, Any], why: str) -> int:
    """``rerun``'s trials in place of ``out``'s of the same (scale, seed, side); the replaced ones are kept under
    ``replaced_trials`` with ``why``, and the rerun's commit and machine under ``reruns``. Returns how many."""
    key = lambda t: (t["scale"], t["seed"], t["side"])  # noqa: E731
    fresh = {key(t): t for t in rerun["trials"]}
    kept, replaced = [], []
    for t in out["trials"]:
        (replaced if key(t) in fresh else kept).append(t)
    out["trials"] = kept + list(fresh.values())
    out.setdefault("replaced_trials", []).extend(dict(t, replaced_because=why) for t in replaced)
    out.setdefault("reruns", []).append({"trials": [list(k) for k in fresh], "why": why, "when": rerun.get("when"),
                                         "machine": rerun.get("machine")})
    out["summary"] = summarise(out["trials"])
    return len(replaced)


def first_steps(log: str, submit_s: float = 0.7) -> Dict[str, float]:
    """Seconds from each trial's start to its first step, from the benchmark's printed log ("[chaos Ns] training
    started", whole seconds from the driver's start, which comes ``submit_s`` after the run's creation)."""
    import re

    found: Dict[str, float] = {}
    for line in log.splitlines():
        m = re.match(r"\[(\w+) seed (\d+) (\w+)\] \[chaos\s+(\d+)s\] training started", line)
        if m:
            found[f"{m[1]}-s{m[2]}-{m[3]}"] = float(m[4]) + submit_s
    return found


def reaccount(out: Dict[str, Any], kept: Path, started: Dict[str, float], say: Callable[[str], None] = print) -> int:
    """Charge the lost time of trials measured before the job recorded its faults' recurrences again, from copies of
    their run directories under ``kept`` (``<scale>-s<seed>-<side>/<run id>/``: TensorBoard and
    ``chaos/recurred.jsonl``). The run's start is read from its run id (whole seconds), the first step's time from
    ``started`` (seconds from the start, by trial key); a trial whose productive time from the copy differs from the
    recorded one by more than 1 s is left as it was. Returns how many trials were charged again."""
    import datetime as dt

    from hpc_agent.metrics.tb_reader import RunScalars
    from hpc_agent.runs.goodput import time_lost
    from hpc_agent.runs.history import STEP_TIME

    done = 0
    for t in out["trials"]:
        key = f"{t['scale']}-s{t['seed']}-{t['side']}"
        dirs = [d for d in (kept / key).glob("*") if d.is_dir()]
        if "time_lost" in t or len(dirs) != 1 or key not in started:
            continue
        run_dir = dirs[0]
        stamp = dt.datetime.strptime(run_dir.name[-15:], "%Y%m%d-%H%M%S").replace(tzinfo=dt.timezone.utc)
        start = stamp.timestamp()
        scalars = RunScalars(run_dir / "tb", tags=(STEP_TIME,))
        scalars.update()
        points = [(p.step, p.wall_time, p.value) for p in scalars.series(STEP_TIME)]
        lost = time_lost(start, start + t["window_s"], points)
        if abs(lost["productive_s"] - t["productive_s"]) > 1.0:
            say(f"{key}: productive {lost['productive_s']} s from the copy, {t['productive_s']} s recorded: left as is")
            continue
        t0 = started[key]
        injected = [(f["kind"], f["injected_at_s"] + t0) for f in t["faults"] if f.get("injected_at_s") is not None]
        recurred = recurrences(run_dir, start)
        ckpt = next((int(o.split("=")[1]) for o in SCALES[t["scale"]]["overrides"] if o.startswith("train.ckpt_every=")), 0)
        t["lost_by_cause_s_at_run_time"] = t["lost_by_cause_s"]
        t["lost_by_cause_s"] = lost_by_cause(lost, injected + recurred, window_s=t["window_s"], ckpt_every=ckpt,
                                             startup_s=t0)
        t.update(time_lost=lost, recurrences=recurred, reaccounted=f"from a copy of the run dir; start from the run id "
                 f"(whole seconds), first step at {t0} s (the driver's log)")
        done += 1
    out["summary"] = summarise(out["trials"])
    return done


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scales", default="small,large", help="comma-separated: small, large (default both)")
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated fault-schedule seeds (default 1,2,3)")
    parser.add_argument("--window", type=float, default=600.0, help="seconds each run is charged (default 600)")
    parser.add_argument("--preempt-hold", type=int, default=60, help="seconds a preemptor holds the node (default 60)")
    parser.add_argument("--sides", default="toolkit,baseline", help=argparse.SUPPRESS)
    parser.add_argument("--scheduler", choices=("default", "fast"), default="default",
                        help="SchedulerParameters during the benchmark: Slurm's defaults (default) or the test "
                             "cluster's fast setting; the fast setting is restored at the end either way")
    parser.add_argument("--out", default=str(REPO / "results" / "bench_ettr.json"))
    parser.add_argument("--keep", action="store_true", help="keep the runs' directories (printed at the end)")
    parser.add_argument("--markdown", metavar="RESULTS", help="print the tables of a results file and exit")
    parser.add_argument("--reaccount", metavar="RESULTS", help="charge the lost time of a results file's trials again "
                        "(those measured before recurrences were recorded) from copies of their run dirs (--kept) "
                        "and the benchmark's printed log (--run-log), then rewrite it")
    parser.add_argument("--kept", metavar="DIR", help="with --reaccount: <scale>-s<seed>-<side>/<run id>/ copies")
    parser.add_argument("--replace-from", metavar="RERUN", help="with --reaccount: take the trials of RERUN (a results "
                        "file of this benchmark) in place of the same (scale, seed, side) ones; those are kept under "
                        "replaced_trials with --why")
    parser.add_argument("--why", default="", help="with --replace-from: why the trials were measured again")
    parser.add_argument("--run-log", metavar="LOG", help="with --reaccount: what the benchmark printed")
    args = parser.parse_args()
    if args.reaccount:
        if not (args.kept and args.run_log):
            print("--reaccount needs --kept DIR and --run-log LOG", file=sys.stderr)
            return 2
        try:
            out = json.loads(Path(args.reaccount).read_text())
            started = first_steps(Path(args.run_log).read_text())
        except (OSError, ValueError) as exc:
            print(f"--reaccount: {exc}", file=sys.stderr)
            return 2
        print(f"charged again: {reaccount(out, Path(args.kept), started)} trials")
        if args.replace_from:
            rerun = json.loads(Path(args.replace_from).read_text())
            print(f"replaced: {replace_trials(out, rerun, args.why)} trials")
        atomic_write_json(Path(args.reaccount), out)
        print(markdown(out))
        return 0
    if args.markdown:
        try:
            print(markdown(json.loads(Path(args.markdown).read_text())))
        except (OSError, ValueError, KeyError) as exc:
            print(f"--markdown {args.markdown}: not a results file of this benchmark ({exc})", file=sys.stderr)
            return 2
        return 0
    scales = [s for s in args.scales.split(",") if s]
    bad = [s for s in scales if s not in SCALES]
    if bad:
        print(f"--scales: unknown {', '.join(bad)}; choose from {', '.join(SCALES)}", file=sys.stderr)
        return 2
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s]
    except ValueError:
        print(f"--seeds: comma-separated integers, got {args.seeds!r}", file=sys.stderr)
        return 2
    sides = [s for s in args.sides.split(",") if s in SIDES]
    before = machine()
    partial = Path(tempfile.gettempdir()) / "bench_ettr.partial.jsonl"
    partial.unlink(missing_ok=True)
    trials: List[Dict[str, Any]] = []
    started = time.time()
    work = Path(tempfile.mkdtemp(prefix="bench-ettr-"))
    from scripts.bench.recovery import scheduler

    # timeout(1)/kill send SIGTERM: end through the finally below, which restores the test cluster's setting
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    sched_during = scheduler(args.scheduler)
    print(f"scheduler during the benchmark: {sched_during}", flush=True)
    try:
        for scale in scales:
            for i, seed in enumerate(seeds):
                for side in (sides if i % 2 == 0 else list(reversed(sides))):
                    trials.append(one_run(scale, seed, side, args.window, args.preempt_hold, work, args.keep))
                    with open(partial, "a") as handle:  # a crash later keeps the runs done so far
                        handle.write(json.dumps(trials[-1]) + "\n")
                    if not args.keep:
                        subprocess.run(["rm", "-rf", str(work / f"{scale}-s{seed}-{side}")], check=False)
    finally:
        print(f"scheduler restored: {scheduler('fast')}", flush=True)
        if not args.keep:
            subprocess.run(["rm", "-rf", str(work)], check=False)
    out = {"benchmark": "P2: ETTR under persistent faults, the toolkit (defaults + watcher) vs submitit-style "
                        "requeue + a resubmit-unchanged loop (max_retries 3), same seeds, one after the other",
           "rules": "docs/benchmarks.md, 'The rules every benchmark follows'",
           "window_s": args.window, "preempt_hold_s": args.preempt_hold, "scheduler_parameters": sched_during, "mix": list(MIX),
           "scales": {s: SCALES[s] for s in scales}, "common_overrides": COMMON, "side_overrides": SIDES,
           "baseline_max_retries": MAX_RETRIES, "watch_interval_s": WATCH_INTERVAL_S,
           "summary": summarise(trials), "trials": trials, "bench_wall_s": round(time.time() - started, 1),
           "when": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": before,
           "load_average_after": machine()["load_average"]}
    atomic_write_json(Path(args.out), out)
    partial.unlink(missing_ok=True)
    print(json.dumps(out["summary"], indent=2))
    print(markdown(out))
    if args.keep:
        print(f"runs kept under {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

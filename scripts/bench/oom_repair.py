"""OOM repair rate (P8): share of injected GPU OOMs fixed by the first retry with the global batch kept.

    python -m scripts.bench.oom_repair [--cases 20] [--seed 7] [--ladders halving,estimator] [--policy-cases 200]
                                      [--out results/bench_oom_repair.json]

Real jobs on the localhost Slurm (hold /tmp/hpc_slurm.lock), one ``python -m hpc_agent.watch`` following
all of them. Every case is a tiny 1-node, 1-task gpt run (a few steps) whose first training forward
raises a CUDA-style out-of-memory error, injected in one of two ways:

- ``halving``: ``faults.oom_above_micro_batch=L`` with ``faults.first_attempt_only=false`` (the limit
  stands for the hardware, so it holds in every attempt). The message states no GPU capacity, so the
  watcher takes the next rung of its ladder: halve the micro-batch, double the accumulation.
- ``estimator``: ``faults.gpu_memory_gib=C``, a simulated GPU: the job OOMs while hpc_agent.policy.memory's
  per-GPU estimate for its config exceeds C, and the message states C as CUDA's does, so the watcher
  can pick the first rung whose estimate fits.

``watch.max_retries=1``: the first retry is all that is measured, so a second OOM stops the run instead
of spending cluster time on more rungs. Per case: did the first attempt OOM (the injection worked), did
the first retry train to the end (fixed), is the global batch (micro-batch x accumulation x ranks) the
same in both attempts' logs (kept). Cases are drawn from a seeded generator (``make_cases``).

``--policy-cases`` also runs a larger seeded set through ``hpc_agent.policy.decide`` alone (no Slurm),
judging the proposed config by the same rule the fault uses; it shows both ladders on the same cases,
including blind halving on the capacity cases, which the real watcher never does when the capacity is
known. The real-cluster figures are the ones that count.
"""
from __future__ import annotations

import argparse
import json
import random
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

TARGET_RATE = 0.95
BASE = ["slurm.mem=1500M", "slurm.nodes=1", "slurm.tasks_per_node=1", "train.workload=gpt", "train.precision=fp32",
        "train.max_steps=3", "train.ckpt_every=1000", "train.log_every=1", "train.warmup_steps=1",
        "watch.max_retries=1"]
MBS = (4, 6, 8, 12, 16, 32)
SHAPES = ((1, 32, 32), (2, 32, 32), (2, 64, 32), (3, 64, 64))  # (n_layers, d_model, seq_len)


# --- pure helpers (tests/unit/test_bench_oom_repair.py) ---------------------------------------------------------
def _shape_overrides(rng: random.Random) -> Dict[str, object]:
    layers, width, seq = rng.choice(SHAPES)
    return {"model.n_layers": layers, "model.d_model": width, "model.n_heads": 4, "model.seq_len": seq,
            "train.micro_batch_size": rng.choice(MBS), "train.grad_accum_steps": rng.choice((1, 2)),
            "train.zero_stage": rng.choice((0, 1, 2)),
            # A small reduction bucket: DeepSpeed's 1 GB default would dwarf these tiny models and push the
            # simulated GPUs past 1 GiB, where the OOM message rounds the capacity to 10 MiB.
            "train.reduce_bucket_size": 100_000}


def halving_case(rng: random.Random, index: int) -> Dict[str, object]:
    knobs = _shape_overrides(rng)
    mbs = int(knobs["train.micro_batch_size"])
    limit = rng.randint(1, mbs - 1)  # any micro-batch above this OOMs
    knobs.update({"faults.oom_above_micro_batch": limit, "faults.first_attempt_only": False,
                  "resilience.in_job_retries": 0})  # the watcher's repair is what this measures
    return {"id": f"halving-{index:02d}", "ladder": "halving", "overrides": knobs, "limit_micro_batch": limit}


def estimator_case(rng: random.Random, index: int, estimate_rungs) -> Optional[Dict[str, object]]:
    """A simulated GPU between the estimates of the config's ladder: it OOMs at the start, and some rung
    (micro-batch halving or activation checkpointing: no CPU offload on this CPU-only cluster) fits."""
    knobs = _shape_overrides(rng)
    rungs = estimate_rungs(knobs)  # [(patch, estimate_bytes)], the start config first
    start = rungs[0][1]
    reachable = [est for patch, est in rungs[1:] if "train.offload" not in patch]
    if not reachable:
        return None
    lowest = min(reachable)
    # Capacity uniformly between the lowest reachable estimate and the start, in whole 1/100 MiB so the
    # OOM message (two decimals of MiB) states it exactly.
    cap_mib = round(rng.uniform(lowest, start * 0.98) / 2**20, 2)
    if cap_mib * 2**20 < lowest or cap_mib * 2**20 >= start:
        return None
    knobs["faults.gpu_memory_gib"] = cap_mib / 1024
    knobs["resilience.in_job_retries"] = 0  # the watcher's repair is what this measures
    return {"id": f"estimator-{index:02d}", "ladder": "estimator", "overrides": knobs, "capacity_mib": cap_mib,
            "start_estimate_mib": round(start / 2**20, 3)}


def make_cases(n: int, seed: int, ladders: Sequence[str], estimate_rungs=None) -> List[Dict[str, object]]:
    """``n`` cases per ladder, the same for the same seed."""
    cases: List[Dict[str, object]] = []
    for ladder in ladders:
        rng = random.Random(f"{seed}-{ladder}")
        made = 0
        while made < n:
            case = halving_case(rng, made) if ladder == "halving" else estimator_case(rng, made, estimate_rungs)
            if case is not None:
                cases.append(case)
                made += 1
    return cases


def as_overrides(knobs: Dict[str, object]) -> List[str]:
    return [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in knobs.items()]


def global_batches(log: str) -> List[int]:
    """The global batch each attempt states ("global batch 16 = 8 x 2 x 1 ranks"), in order."""
    return [int(g) for g in re.findall(r"global batch (\d+) = ", log)]


def judge(case: Dict[str, object], decisions: List[Dict[str, object]], phase: str, log: str) -> Dict[str, object]:
    """The outcome of one case on the cluster, from its ledger decisions, final phase and job logs."""
    injected = bool(decisions) and decisions[0]["cause"] == "gpu_oom"
    retried = injected and decisions[0]["action"] in ("resubmit", "requeue")
    second_oom = any(d["cause"] == "gpu_oom" for d in decisions[1:])
    fixed = retried and phase == "completed" and not second_oom
    batches = global_batches(log)
    kept = len(batches) >= 2 and len(set(batches)) == 1
    return {"injected_oom": injected, "retried": retried, "fixed_first_retry": fixed, "global_batch_kept": kept,
            "fixed_and_kept": fixed and kept, "global_batches": batches,
            "patch": decisions[0]["patch"] if decisions else None,
            "reason": decisions[0]["reason"] if decisions else None, "final_phase": phase}


def rate(outcomes: List[Dict[str, object]], key: str = "fixed_and_kept") -> Dict[str, object]:
    counted = [o for o in outcomes if o.get("injected_oom")]
    good = sum(1 for o in counted if o.get(key))
    return {"fixed": good, "injected": len(counted), "rate": round(good / len(counted), 3) if counted else None,
            "target": TARGET_RATE, "met": bool(counted) and good / len(counted) >= TARGET_RATE}


# --- the estimator and policy (no Slurm) ------------------------------------------------------------------
def _cfg(knobs: Dict[str, object]):
    from hpc_agent.config.load import load_config

    return load_config("quickstart", [*BASE, *as_overrides(knobs)])


def estimate_rungs(knobs: Dict[str, object]):
    from hpc_agent.policy.memory import estimate_from_config, estimate_with_patch, gpu_oom_rung, train_after

    cfg = _cfg(knobs)
    out, patch = [({}, estimate_from_config(cfg).total_bytes)], {}
    while (rung := gpu_oom_rung(train_after(cfg.train, patch), 1, True)) is not None:
        patch = {**patch, **rung[0]}
        out.append((dict(patch), estimate_with_patch(cfg, patch).total_bytes))
    return out


def policy_outcome(case: Dict[str, object], capacity_known: bool) -> Dict[str, object]:
    """What ``decide`` proposes for the first OOM, and whether that config passes the same fault."""
    from hpc_agent.core.causes import Cause
    from hpc_agent.policy.memory import estimate_with_patch
    from hpc_agent.policy.decide import PolicyLimits, Situation, decide

    cfg = _cfg(case["overrides"])
    cap = int(case["capacity_mib"] * 2**20) if case["ladder"] == "estimator" else None
    decision = decide(Cause.GPU_OOM, [], cfg, Situation(job_id="0", gpu_capacity_bytes=cap if capacity_known else None),
                      PolicyLimits())
    patch = decision.patch
    mbs = patch.get("train.micro_batch_size", cfg.train.micro_batch_size)
    accum = patch.get("train.grad_accum_steps", cfg.train.grad_accum_steps)
    if case["ladder"] == "halving":
        passes = mbs <= case["limit_micro_batch"]
    else:
        passes = estimate_with_patch(cfg, patch).total_bytes <= cap
    kept = mbs * accum == cfg.train.micro_batch_size * cfg.train.grad_accum_steps
    return {"action": decision.action, "patch": patch, "injected_oom": True, "fixed_first_retry": passes,
            "global_batch_kept": kept, "fixed_and_kept": passes and kept}


def policy_evaluation(n: int, seed: int) -> Dict[str, object]:
    cases = make_cases(n, seed + 1000, ["halving", "estimator"], estimate_rungs)
    out = {}
    for name, ladder, known in (("halving_fault_next_rung", "halving", False),
                                ("capacity_fault_blind_halving", "estimator", False),
                                ("capacity_fault_estimator", "estimator", True)):
        out[name] = rate([policy_outcome(c, known) for c in cases if c["ladder"] == ladder])
    return {"cases_per_ladder": n, "seed": seed + 1000, "rates": out}


# --- the cluster run -----------------------------------------------------------------------------------------
def run_on_cluster(cases: List[Dict[str, object]], work: Path, timeout_s: float) -> List[Dict[str, object]]:
    from hpc_agent.state.ledger import Ledger
    from tests.slurm_helpers import WatcherProcess, cleanup_jobs, log_text, submit

    root = work / "runs"
    dirs = {}
    for case in cases:
        run_dir, job = submit(root, f"run.name={case['id']}", *BASE, *as_overrides(case["overrides"]))
        dirs[case["id"]] = run_dir
        print(f"  submitted {case['id']} as job {job}", flush=True)
    watcher = WatcherProcess(root, interval=1.0)
    ledger = Ledger.in_runs_root(root)
    by_dir = {}
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            by_dir = {Path(r.run_dir): r for r in ledger.runs()}
            done = [r for r in by_dir.values() if r.phase in ("completed", "stopped")]
            print(f"  {len(done)}/{len(cases)} runs finished", flush=True)
            if len(done) == len(cases):
                break
            time.sleep(5)
        outcomes = []
        for case in cases:
            run = by_dir[dirs[case["id"]]]
            decisions = [{"cause": d.cause, "action": d.action, "patch": d.patch, "reason": d.reason}
                         for d in ledger.decisions(run.run_id)]
            outcome = judge(case, decisions, run.phase, log_text(dirs[case["id"]]))
            outcomes.append({**case, **outcome, "run_id": run.run_id})
            print(f"  {case['id']}: fixed={outcome['fixed_first_retry']} kept={outcome['global_batch_kept']} "
                  f"{outcome['reason']}", flush=True)
    finally:
        watcher.stop()
        ledger.close()
        cleanup_jobs(root)
    return outcomes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=20, help="cluster cases per ladder (default 20)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--ladders", default="halving,estimator", help="halving,estimator (default both)")
    parser.add_argument("--policy-cases", type=int, default=200, help="pure-policy cases per ladder (0: skip)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds to wait for every run to finish")
    parser.add_argument("--out", default=str(REPO / "results" / "bench_oom_repair.json"))
    args = parser.parse_args()
    ladders = [x for x in args.ladders.split(",") if x]
    cases = make_cases(args.cases, args.seed, ladders, estimate_rungs)
    out: Dict[str, object] = {"benchmark": "OOM repair rate: injected GPU OOMs fixed by the first retry, global batch kept",
                              "seed": args.seed, "base_overrides": BASE, "when": time.strftime("%Y-%m-%dT%H:%M:%S")}
    if args.policy_cases:
        out["policy_only"] = policy_evaluation(args.policy_cases, args.seed)
        print(json.dumps(out["policy_only"]["rates"], indent=2), flush=True)
    if args.cases:
        t0 = time.time()
        with tempfile.TemporaryDirectory(prefix="bench-oom-") as tmp:
            outcomes = run_on_cluster(cases, Path(tmp), args.timeout)
        out["cluster_wall_s"] = round(time.time() - t0, 1)
        out["cluster"] = {ladder: rate([o for o in outcomes if o["ladder"] == ladder]) for ladder in ladders}
        out["cases"] = outcomes
        print(json.dumps(out["cluster"], indent=2))
    from hpc_agent.core.fsutil import atomic_write_json

    atomic_write_json(Path(args.out), out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

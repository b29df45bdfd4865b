"""Placement on the localhost cluster's typed-GPU partitions (scripts/cluster.sh: gpu_small = 2 x a10 24 GiB,
gpu_big = 2 x h100 80 GiB, fake device files; training runs on the CPU).

- ``submit --place auto``: a config that only fits 80 GiB goes to gpu_big; one that fits both goes where it
  finishes first, which moves to gpu_big while a blocker holds gpu_small's GPUs; a named partition is kept.
- The watcher after a GPU OOM on gpu_small (a simulated 3 MiB GPU there, ``faults.gpu_memory_gib_by_partition``):
  it moves the run to gpu_big when that finishes sooner, and takes the OOM-ladder rung in place when gpu_big
  is busy for hours. Both decisions carry the candidate table into the audit trail.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import List

import pytest

from hpc_agent.state.ledger import Ledger
from tests.conftest import run_cli
from tests.slurm_helpers import SLURM, WatcherProcess, accounting, log_text, queue_and_nodes, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

ON_GPUS = ["slurm.gpus_per_node=1", "slurm.tasks_per_node=1", "placement.partitions=[gpu_small,gpu_big]"]
HOLD = "slurm.extra_sbatch={hold: null}"  # placed, accepted by sbatch, never started: nothing to train
# ~12.6 B parameters: even every rung of the OOM ladder leaves > 21.6 GiB on a 24 GiB GPU; with optimizer
# offload it fits 90 % of 80 GiB.
ONLY_80GIB = ["model.n_layers=40", "model.d_model=5120", "model.n_heads=32", "model.seq_len=256"]


@pytest.fixture(autouse=True)
def typed_gpus():
    text = SLURM.run(["sinfo", "--noheader", "--format", "%P|%G"], check=False).stdout
    gres = dict(line.split("|", 1) for line in text.split() if "|" in line)
    if "a10" not in gres.get("gpu_small", "") or "h100" not in gres.get("gpu_big", ""):
        why = f"the localhost cluster has no typed-GPU partitions (sinfo: {text.strip()!r}); bash scripts/cluster.sh up"
        if os.environ.get("HPC_AGENT_REQUIRE_SLURM") == "1":
            pytest.fail(why)
        pytest.skip(why)


def blocker(partition: str, minutes: int) -> str:
    """A job holding both GPUs of ``partition`` for ``minutes`` (its time limit is what --test-only sees)."""
    out = SLURM.run(["sbatch", "--parsable", "--partition", partition, "--gres", "gpu:2", "--time", str(minutes),
                     "--job-name", "placement-blocker", "--output", "/dev/null", "--wrap", "sleep 3600"]).stdout
    job = out.strip().split(";")[0]
    wait_for(lambda: SLURM.run(["squeue", "--noheader", "--jobs", job, "--format", "%T"], check=False).stdout.strip()
             == "RUNNING", 60, what=f"the blocker on {partition} to run", explain=queue_and_nodes)
    return job


def submit(root: Path, *overrides: str, dry: bool = False):
    args = ["-m", "hpc_agent.submit", "quickstart", "--executor", "slurm", "--place", "auto", f"run.runs_root={root}",
            *ON_GPUS, *overrides] + (["--dry-run"] if dry else [])
    proc = run_cli(*args, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, proc.stdout + proc.stderr


def job_partition(output: str) -> str:
    job = next(line.split()[2] for line in output.splitlines() if line.startswith("job id:"))
    return SLURM.run(["squeue", "--noheader", "--jobs", job, "--format", "%P"], check=False).stdout.strip()


def table(output: str) -> List[str]:
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("partition  gpu"))
    return [line.strip() for line in lines[start:start + 3]]


def test_submit_places_by_memory_and_start_time_and_keeps_a_named_partition(root):
    jobs = []
    try:
        # 1. Only an 80 GiB GPU can hold it: gpu_big, with the rung it needs there; gpu_small is out.
        _, out = submit(root, *ONLY_80GIB, HOLD, "train.max_steps=10")
        assert job_partition(out) == "gpu_big", out
        rows = table(out)
        small = next(r for r in rows if r.startswith("gpu_small"))
        assert "out: does not fit" in small and "no rung fits" in small, rows
        assert next(r for r in rows if r.startswith("gpu_big")).endswith("chosen")
        assert "placement: gpu_big is the only partition that can run the job" in out
        # The dry run shows the same table and submits nothing.
        _, dry = submit(root, *ONLY_80GIB, "train.max_steps=10", dry=True)
        assert table(dry) == rows and "slurm:\n  partition: gpu_big\n" in dry and "#SBATCH --partition=gpu_big" in dry
        assert "Dry run: nothing was created or submitted" in dry
        # 2. A small config fits both: both start now and finish within minutes, so the smaller GPU wins...
        _, out = submit(root, HOLD)
        assert job_partition(out) == "gpu_small", out
        assert "wins the tie: smaller GPU" in out
        # ... until a blocker holds gpu_small's GPUs for an hour: sbatch --test-only says gpu_big starts first.
        jobs.append(blocker("gpu_small", 60))
        _, out = submit(root, HOLD)
        assert job_partition(out) == "gpu_big", out
        small = next(r for r in table(out) if r.startswith("gpu_small"))
        assert " in 1h" in small or " in 59m" in small, table(out)  # the blocker's time limit, from --test-only
        assert "placement: gpu_big finishes first" in out
        # 3. A named partition wins even while it is busy: the job waits there.
        _, out = submit(root, "slurm.partition=gpu_small", HOLD)
        assert job_partition(out) == "gpu_small", out
        assert "you named partition gpu_small" in out
    finally:
        if jobs:
            SLURM.run(["scancel", *jobs], check=False)


def _oom_run(root: Path):
    """Submitted on gpu_small, whose simulated 3 MiB GPU the micro-batch of 4 (3.4 MiB estimated) exceeds and a
    micro-batch of 2 (2.6 MiB) fits; gpu_big's GPU is not simulated (it fits)."""
    root.mkdir(parents=True, exist_ok=True)
    watcher = WatcherProcess(root)
    watcher.wait_until_following()
    _, out = submit(root, "slurm.partition=gpu_small", "train.max_steps=30", "train.micro_batch_size=4",
                    "faults.gpu_memory_gib_by_partition={gpu_small: 0.003}",
                    # the model is tiny, so both options take seconds: with no tolerance the faster GPU counts
                    "placement.tolerance_s=0")
    run_dir = Path(next(line.split(None, 2)[2] for line in out.splitlines() if line.startswith("run dir:")))
    run_id = run_dir.name
    ledger = Ledger.in_runs_root(root)
    try:
        wait_for(lambda: ledger.run(run_id).phase in ("completed", "stopped", "needs_attention"), 240,
                 what="the run to end", explain=lambda: queue_and_nodes() + watcher.output()[-3000:])
    finally:
        watcher.stop()
    assert ledger.run(run_id).phase == "completed", watcher.output()
    (decision,) = [d for d in ledger.decisions(run_id) if d.cause == "gpu_oom"]
    jobs = [s.job_id for s in ledger.submissions(run_id)]
    assert len(jobs) == 2, jobs
    return run_dir, decision, jobs, watcher.output()


def _partition_of(job_id: str) -> str:
    text = accounting(["--allocations", "--jobs", job_id, "--format", "Partition"], done=lambda text: bool(text.split()))
    return text.split()[0] if text.split() else ""


def test_after_a_gpu_oom_the_watcher_moves_the_run_to_the_free_bigger_gpu(root):
    run_dir, decision, (first, second), watch = _oom_run(root)
    assert _partition_of(first) == "gpu_small" and _partition_of(second) == "gpu_big"
    assert decision.patch == {"slurm.partition": "gpu_big"}, decision.reason
    assert "move to gpu_big as is" in decision.reason
    placement = decision.decision["placement"]
    assert placement["winner"] == "gpu_big" and placement["table"][0].startswith("partition")
    assert "move to gpu_big as is" in watch and any("chosen" in line and "gpu_big" in line for line in watch.splitlines())
    audit = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert any(e.get("decision", {}).get("placement", {}).get("winner") == "gpu_big" for e in audit), audit
    assert "done: 30 steps" in log_text(run_dir, second)
    print("\nmove decision: " + decision.reason + "\n  " + "\n  ".join(placement["table"]))


def test_after_a_gpu_oom_a_busy_bigger_gpu_loses_to_the_ladder_rung(root):
    busy = blocker("gpu_big", 120)
    try:
        run_dir, decision, (first, second), watch = _oom_run(root)
    finally:
        SLURM.run(["scancel", busy], check=False)
    assert _partition_of(first) == "gpu_small" and _partition_of(second) == "gpu_small"
    assert decision.patch == {"train.micro_batch_size": 2, "train.grad_accum_steps": 2}, decision.reason
    assert "stay on gpu_small" in decision.reason
    big = next(line for line in decision.decision["placement"]["table"] if line.startswith("gpu_big"))
    assert "finishes" in big and "later" in big, decision.decision["placement"]["table"]
    assert "done: 30 steps" in log_text(run_dir, second)
    print(f"\nrung decision: {decision.reason}\n  " + "\n  ".join(decision.decision["placement"]["table"]))

"""submit's pre-flight memory check: the GPU's memory from config or gres, the verdict, the CLI's refusal."""
from __future__ import annotations

import pytest

from hpc_agent.config.load import build_config
from hpc_agent.policy.memory import estimate_from_config, estimate_with_patch
from hpc_agent.policy.preflight import OK, REFUSE, SKIP, WARN, gpu_capacity, memory_verdict
from hpc_agent.slurm.sinfo import gpu_gib_from_gres, partition_gres
from tests.conftest import run_cli

GIB = 2**30
BIG = {"model.n_layers": 24, "model.d_model": 1024, "model.seq_len": 4096, "model.n_heads": 16,
       "train.micro_batch_size": 16, "train.precision": "bf16", "train.zero_stage": 1, "slurm.gpus_per_node": 1}
BIG_ARGS = [f"{k}={v}" for k, v in BIG.items()]


def cfg(**overrides):
    return build_config([{**BIG, **overrides}])


@pytest.mark.parametrize("gres, gib", [
    ("gpu:h100:8", 80), ("gpu:h100:8(S:0-1)", 80), ("gpu:a100_80g:4", 80), ("gpu:a100-40gb:4", 40),
    ("gpu:a100:4", None),            # 40 or 80 GB: not guessed
    ("gpu:4", None),                 # no type
    ("gpu:h100:4,gpu:l40s:2", 48),   # a mixed partition: its smallest GPU
    ("gpu:h100:4,gpu:mystery:2", None),
    ("", None), ("(null)", None),
])
def test_gpu_gib_from_gres(gres, gib):
    assert gpu_gib_from_gres(gres) == gib


@pytest.mark.parametrize("text, partition, gres", [
    ("low*|(null)\nhigh|gpu:h100:8\n", None, ""),
    ("low*|(null)\nhigh|gpu:h100:8\n", "high", "gpu:h100:8"),
    ("gpu*|gpu:h100:8\ngpu*|gpu:h100:4\n", None, "gpu:h100:8,gpu:h100:4"),
    ("low*|(null)\n", "nope", ""),
])
def test_partition_gres(text, partition, gres):
    assert partition_gres(text, partition) == gres


def test_capacity_prefers_the_config():
    assert gpu_capacity(cfg(**{"slurm.gpu_memory_gib": 24}), "gpu:h100:8") == (24 * GIB, "slurm.gpu_memory_gib")
    assert gpu_capacity(cfg(), "gpu:h100:8")[0] == 80 * GIB
    assert gpu_capacity(cfg(), "gpu:a100:8") == (None, "")


NEED = estimate_from_config(cfg()).total_bytes  # 48.4 GiB


@pytest.mark.parametrize("overrides, capacity, level, text", [
    ({}, 80 * GIB, OK, "fits in 80.0 GiB"),
    ({}, int(NEED / 0.95), WARN, "within 10%"),
    ({}, 40 * GIB, REFUSE, "cheapest change that fits: micro_batch_size 16 -> 8"),
    ({}, 8 * GIB, REFUSE, "activation_checkpointing off -> on"),
    ({}, GIB // 1000, REFUSE, "no rung of the OOM ladder"),
    ({}, None, SKIP, "unknown"),
    ({"slurm.gpus_per_node": 0}, 8 * GIB, SKIP, "CPU job"),
    ({"train.workload": "classifier"}, 8 * GIB, SKIP, "no memory estimate"),
])
def test_memory_verdict(overrides, capacity, level, text):
    v = memory_verdict(cfg(**overrides), capacity, "test")
    assert v.level == level
    assert text in v.message


@pytest.mark.parametrize("capacity_gib", [8, 12, 20, 30, 40])
def test_refusal_fix_fits_and_keeps_global_batch(capacity_gib):
    c = cfg()
    v = memory_verdict(c, capacity_gib * GIB)
    assert v.level == REFUSE and v.fix
    assert estimate_with_patch(c, v.fix).total_bytes <= 0.9 * capacity_gib * GIB
    assert v.fix.get("train.micro_batch_size", 16) * v.fix.get("train.grad_accum_steps", 1) == 16
    assert all("=" in o for o in v.fix_overrides())


def test_submit_refuses_without_force(tmp_path):
    root = tmp_path / "runs"
    proc = run_cli("-m", "hpc_agent.submit", "quickstart", *BIG_ARGS, "slurm.gpu_memory_gib=8",
                   f"run.runs_root={root}", "--executor", "local")
    assert proc.returncode == 6, proc.stdout + proc.stderr  # exit_status.WONT_FIT
    assert "refusing to submit" in proc.stderr and "--force" in proc.stderr
    assert "add: train.micro_batch_size=1 train.grad_accum_steps=16 train.activation_checkpointing=true" in proc.stderr
    assert not root.exists()  # nothing created, nothing in a ledger


def test_submit_force_warns_and_goes_on():
    proc = run_cli("-m", "hpc_agent.submit", "quickstart", *BIG_ARGS, "slurm.gpu_memory_gib=8", "--force",
                   "--dry-run", "--executor", "slurm")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "warning (--force): memory estimate 56.06 GiB does not fit" in proc.stderr
    assert "# Job script (sbatch)" in proc.stdout


def test_submit_suggested_fix_is_accepted():
    fix = ["train.micro_batch_size=1", "train.grad_accum_steps=16", "train.activation_checkpointing=true"]
    proc = run_cli("-m", "hpc_agent.submit", "quickstart", *BIG_ARGS, "slurm.gpu_memory_gib=8", *fix, "--dry-run",
                   "--executor", "slurm")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "memory: memory estimate 6.65 GiB fits in 8.0 GiB" in proc.stdout


def test_cpu_job_is_not_checked():
    proc = run_cli("-m", "hpc_agent.submit", "quickstart", "--dry-run", "--executor", "slurm")
    assert proc.returncode == 0 and "CPU job" in proc.stdout

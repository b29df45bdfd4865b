"""python -m hpc_agent.doctor on the real localhost Slurm (its pure logic: tests/unit/test_doctor.py)."""
from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli


@pytest.mark.slurm
def test_doctor_quickstart_on_localhost_slurm():
    res = run_cli("-m", "hpc_agent.doctor", "quickstart", timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert "low (default)" in out and "high" in out
    # scripts/cluster.sh's placeholder-GPU partitions (HPC_SLURM_GPU_PARTITIONS, default gpu_small/gpu_big)
    assert "GPUs on gpu_small (2/node), gpu_big (2/node)" in out or "no GPUs (gres) on any partition" in out, out
    assert "OK    sbatch --test-only:" in out
    assert "OK    accounting: sacct answers" in out
    assert "READY:" in out


@pytest.mark.slurm
def test_doctor_flags_wrong_partition():
    res = run_cli("-m", "hpc_agent.doctor", "quickstart", "slurm.partition=nosuch", timeout=120)
    assert res.returncode == 1, res.stdout + res.stderr
    line = next(l for l in res.stdout.splitlines() if l.startswith("FAIL  sbatch --test-only"))
    assert "nosuch" in line and "invalid partition" in line.lower()
    assert "FAILED:" in res.stdout


@pytest.mark.slurm
def test_doctor_config_problems_and_json():
    res = run_cli("-m", "hpc_agent.doctor", "quickstart", "train.lr=x", "slurm.nodes=0", "--json", timeout=120)
    assert res.returncode == 1
    report = json.loads(res.stdout)
    config = next(c for c in report["checks"] if c["name"] == "config")
    assert config["level"] == "FAIL" and "train.lr" in config["detail"] and "slurm.nodes" in config["detail"]
    assert {p["name"] for p in report["partitions"]} >= {"low", "high"}
    assert report["exit_code"] == 1

"""python -m hpc_agent.doctor: pure parsing/verdict logic (the real localhost Slurm: tests/cluster/test_doctor_slurm.py)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from hpc_agent import doctor as d
from hpc_agent.slurm.sinfo import gpus_in_gres, parse_partitions
from tests.conftest import run_cli
from tests.helpers.fake_slurm import FakeSlurm

SINFO = "low*|2|2|6000|(null)|up\nhigh|2|2|6000|(null)|up\ngpu|4|64|512000|gpu:a100:4(S:0-1)|up\n\nbad line\n"


def test_parse_sinfo():
    parts = parse_partitions(SINFO)
    assert [p.name for p in parts] == ["low", "high", "gpu"]
    assert [p.default for p in parts] == [True, False, False]
    assert parts[0].nodes == 2 and parts[0].cpus == "2" and parts[0].mem_mb == "6000"
    assert [p.gpus for p in parts] == [0, 0, 4]
    table = "\n".join(d.partition_table(parts))
    assert "low (default)" in table and "4 (gpu:a100:4(S:0-1))" in table and "500 GiB" in table


@pytest.mark.parametrize("gres, n", [("(null)", 0), ("", 0), ("gpu:2", 2), ("gpu:a100:4(S:0-1),gpu:v100:2", 6),
                                     ("mps:100,gpu:1", 1), ("gpu", 1)])
def test_gpus_in_gres(gres, n):
    assert gpus_in_gres(gres) == n


def test_summary_logic():
    ok, warn, fail = d.Check(d.OK, "a", "x"), d.Check(d.WARN, "b", "y"), d.Check(d.FAIL, "c", "z")
    assert d.summarize([ok]) == (0, "all 1 checks OK.")
    code, text = d.summarize([ok, warn])
    assert code == 0 and "no blockers" in text and "b" in text
    code, text = d.summarize([ok, warn, fail])
    assert code == 1 and "1 blocker(s): c" in text
    assert fail.line() == "FAIL  c: z"


def test_sbatch_argv():
    slurm = SimpleNamespace(nodes=2, tasks_per_node=4, cpus_per_task=8, time="01:00:00", partition="high",
                            account="acct", qos=None, mem="16G", constraint=None, exclude=None, gpus_per_node=4)
    argv = d.sbatch_test_argv(slurm)
    assert argv[:2] == ["sbatch", "--test-only"] and argv[-2:] == ["--wrap", "true"]
    joined = " ".join(argv)
    for piece in ("--nodes 2", "--ntasks-per-node 4", "--cpus-per-task 8", "--time 01:00:00", "--partition high",
                  "--account acct", "--mem 16G", "--gpus-per-node 4"):
        assert piece in joined
    assert "--qos" not in joined


def test_gpu_request_on_gpuless_partition_fails():
    cfg = SimpleNamespace(slurm=SimpleNamespace(nodes=1, tasks_per_node=1, cpus_per_task=1, time="10", partition=None,
                                                account=None, qos=None, mem=None, constraint=None, exclude=None,
                                                gpus_per_node=2))
    slurm = FakeSlurm(partitions=("low", "high", "gpu"))
    checks = d.check_sbatch(slurm, cfg, parse_partitions(SINFO))
    assert [c.level for c in checks] == [d.OK, d.FAIL]
    assert "sbatch: Job 100 to start" in checks[0].detail
    assert "partition low has no GPU gres" in checks[1].detail
    assert [argv[:2] for argv in slurm.calls] == [["sbatch", "--test-only"]] and slurm.jobs == {}
    cfg.slurm.partition = "gpu"
    assert [c.level for c in d.check_sbatch(slurm, cfg, parse_partitions(SINFO))] == [d.OK]
    rejected = d.check_sbatch(FakeSlurm(partitions=("low", "high")), cfg, [])
    assert rejected[0].level == d.FAIL and "invalid partition specified: gpu" in rejected[0].detail


def test_memory_and_health_never_crash():
    checks, _, _ = d.check_gpu_health()
    assert checks and all(c.level in (d.OK, d.WARN, d.FAIL) for c in checks)
    assert d._gpu_mem_bytes([{"memory_total_mib": 1024}]) == 2**30


def test_help_and_bad_config_without_slurm_dependency():
    res = run_cli("-m", "hpc_agent.doctor", "--help")
    assert res.returncode == 0 and "--data" in res.stdout


def test_without_a_driver_health_says_so(monkeypatch):
    from hpc_agent.diagnosis import gpu_health

    monkeypatch.setattr(gpu_health, "read_gpus", lambda: ([], "NVIDIA driver not found: no libnvidia-ml"))
    checks, report, gpu_bytes = d.check_gpu_health()
    assert [c.level for c in checks] == [d.WARN] and "no GPU on this machine" in checks[0].detail
    assert gpu_bytes is None and report == []


BIG = {"model.n_layers": 24, "model.d_model": 1024, "model.seq_len": 4096, "model.n_heads": 16,
       "train.micro_batch_size": 16, "train.precision": "bf16", "train.zero_stage": 1, "slurm.gpus_per_node": 1}


@pytest.mark.parametrize("overrides, gpu_gib, gres, level, text", [
    ({}, None, "", d.OK, "GPU memory unknown here"),
    ({}, 80, "", d.OK, "fits in 80.0 GiB per GPU (from this machine's GPU)"),
    ({}, None, "gpu:h100:8", d.OK, "from the partition's GPU type"),
    ({"slurm.gpu_memory_gib": 8}, None, "", d.FAIL, "add: train.micro_batch_size=1"),
    ({}, 60, "", d.WARN, "within 10%"),
    ({"train.workload": "classifier"}, 8, "", d.OK, "no estimate"),
])
def test_memory_check_is_submits_verdict(overrides, gpu_gib, gres, level, text):
    from hpc_agent.config.load import build_config

    cfg = build_config([{**BIG, **overrides}])
    (check,) = d.check_memory(cfg, gpu_gib * 2**30 if gpu_gib else None, gres)
    assert check.level == level and text in check.detail, check.detail


def test_target_gres_follows_the_partition():
    from hpc_agent.config.load import build_config

    parts = parse_partitions(SINFO)
    assert d.target_gres(build_config([{}]), parts) == ""  # the default partition "low" has (null) gres
    assert d.target_gres(build_config([{"slurm.partition": "gpu"}]), parts) == "gpu:a100:4(S:0-1)"
    assert d.target_gres(build_config([{"slurm.partition": "nosuch"}]), parts) == ""

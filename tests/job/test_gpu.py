"""The GPU-only paths: FP16 training with DeepSpeed ZeRO 1-3 and activation checkpointing, FP16 resume,
FP16 with ZeRO-Offload (the optimizer on the CPU) and its resume, dynamic loss scaling through an overflow,
a real CUDA out-of-memory error and its diagnosis, and the GPU health check through pynvml.

Every test here skips without a CUDA GPU: DeepSpeed has no FP16 training on the CPU, and these tests
are about what the CUDA build does (its kernels, its allocator's error text, NVML). The CPU machines
cover the same code in BF16/FP32 (tests/job/test_train_cpu.py, tests/job/test_resume.py). On a GPU machine:
``python -m pytest tests/job/test_gpu.py``.
"""
from __future__ import annotations

import json
import math
import signal
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from helpers.common import REPO, env_for, expect, losses, run, snapshot, start, tb_scalars, wait_for  # noqa: E402
from hpc_agent.core.exit_codes import EXIT_OUT_OF_MEMORY
from hpc_agent.core.exit_codes import EXIT_ENVIRONMENT  # noqa: E402
from hpc_agent.core.checkpoint_format import MARKER, tag_for  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU: DeepSpeed's FP16 path, CUDA OOMs and NVML are GPU-only")

MODEL = {"n_layers": 4, "d_model": 256, "n_heads": 4, "seq_len": 128}
GPU = {"gpus_per_node": 1}  # FP16 configs must ask for a GPU (validation refuses FP16 on CPU-only jobs)


def fp16_config(tmp_path, name, **train):
    settings = {"precision": "fp16", "activation_checkpointing": True, "micro_batch_size": 8, "max_steps": 40,
                "ckpt_every": 20, "warmup_steps": 5, "zero_stage": 2, "log_every": 1}
    settings.update(train)
    return snapshot(tmp_path / f"{name}.yaml", train=settings, model=MODEL, slurm=GPU)


def assert_trained_in_fp16(result, run_dir, steps):
    expect(result, 0, f"done: {steps} steps", "fp16", "device cuda")
    got = losses(result.stdout)
    assert sorted(got) == list(range(1, steps + 1)), sorted(got)
    assert all(math.isfinite(v) for v in got.values()), got
    first, last = [got[s] for s in range(1, 6)], [got[s] for s in range(steps - 4, steps + 1)]
    assert sum(last) < sum(first), f"loss did not fall: first {first}, last {last}"
    scale = tb_scalars(run_dir, "train/loss_scale")
    assert sorted(scale) == list(range(1, steps + 1)) and all(v >= 1 for v in scale.values()), scale
    peak = tb_scalars(run_dir, "perf/peak_mem_bytes")
    assert peak and min(peak.values()) > 0, peak
    return got


@pytest.mark.parametrize("stage", [1, 3])
def test_fp16_trains_under_zero_with_activation_checkpointing(tmp_path, stage):
    cfg = fp16_config(tmp_path, f"z{stage}", zero_stage=stage, gpu_health_every=10)
    result = run(cfg, tmp_path / "run", timeout=300)
    assert_trained_in_fp16(result, tmp_path / "run", 40)
    assert (tmp_path / "run" / "checkpoints" / tag_for(40) / MARKER).exists()
    # The in-job GPU health check (pynvml) ran every 10 steps and found nothing critical.
    level = tb_scalars(tmp_path / "run", "gpu_health/level")
    assert level and max(level.values()) < 2, level


def test_fp16_zero2_sigkill_resume_continues_the_straight_run(tmp_path):
    cfg = fp16_config(tmp_path, "z2")
    straight = run(cfg, tmp_path / "straight", timeout=300)
    want = assert_trained_in_fp16(straight, tmp_path / "straight", 40)

    run_dir = tmp_path / "killed"
    proc = start(cfg, run_dir)
    wait_for(run_dir / "checkpoints" / tag_for(20) / MARKER, proc, timeout=240)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    resumed = run(cfg, run_dir, timeout=300)
    expect(resumed, 0, f"resuming from checkpoint {tag_for(20)} (step 20)", "done: 40 steps")
    got = losses(resumed.stdout)
    # The FP16 master weights, the optimizer state, the loss scale and the data position come back:
    # the resumed steps retrace the straight run (CUDA kernels may differ in the last bits).
    worst = max(abs(got[s] - want[s]) for s in range(21, 41))
    print(f"FP16 ZeRO-2 resume: largest |loss difference| over steps 21-40 = {worst:.3g}")
    assert worst < 2e-3, f"resumed losses differ from the straight run by up to {worst}"
    scale_straight = tb_scalars(tmp_path / "straight", "train/loss_scale")
    scale_resumed = tb_scalars(run_dir, "train/loss_scale")
    assert scale_resumed[21] == scale_straight[21], (scale_resumed[21], scale_straight[21])


def test_fp16_zero_offload_optimizer_on_the_cpu_trains_and_resumes(tmp_path):
    """ZeRO-Offload (train.offload=optimizer): FP16 forward/backward on the GPU, the FP32 master weights and
    AdamW (DeepSpeed's CPU Adam) on the CPU. It trains, saves the offload layout, and a resume from the
    middle checkpoint retraces the run."""
    cfg = fp16_config(tmp_path, "offload", offload="optimizer", zero_stage=2, max_steps=30, ckpt_every=15)
    run_dir = tmp_path / "run"
    straight = run(cfg, run_dir, timeout=300)
    if straight.returncode == EXIT_ENVIRONMENT and "cpu_adam" in straight.stdout:
        pytest.skip("DeepSpeed's cpu_adam op is not prepared here (python -m hpc_agent.prepare could not build it)")
    want = assert_trained_in_fp16(straight, run_dir, 30)
    marker = json.loads((run_dir / "checkpoints" / tag_for(30) / MARKER).read_text())
    assert marker["layout"]["offload"] == "optimizer" and marker["layout"]["precision"] == "fp16", marker

    for path in (run_dir / "checkpoints" / tag_for(30)).iterdir():  # make step 15 the newest checkpoint
        path.unlink()
    resumed = run(cfg, run_dir, timeout=300)
    expect(resumed, 0, f"resuming from checkpoint {tag_for(15)} (step 15)", "done: 30 steps")
    got = losses(resumed.stdout)
    assert min(got) == 16, sorted(got)
    worst = max(abs(got[s] - want[s]) for s in range(16, 31))
    print(f"FP16 ZeRO-Offload resume: largest |loss difference| over steps 16-30 = {worst:.3g}")
    assert worst < 2e-3, f"resumed losses differ from the straight run by up to {worst}"


def test_fp16_overflow_lowers_the_loss_scale_and_is_not_divergence(tmp_path):
    """A loss scale of 2**32 overflows FP16 gradients at once: DeepSpeed skips those updates and halves
    the scale. The run must go on (a skipped update is not a divergence) and the scale must come down."""
    cfg = fp16_config(tmp_path, "overflow", initial_scale_power=32, hysteresis=1, max_steps=16, ckpt_every=16)
    result = run(cfg, tmp_path / "run", timeout=300)
    expect(result, 0, "done: 16 steps")
    scale = tb_scalars(tmp_path / "run", "train/loss_scale")
    print("loss scale by step:", {s: scale[s] for s in sorted(scale)})
    assert max(scale.values()) < 2.0**32 and scale[16] <= scale[1], scale  # the first update overflowed
    assert all(math.isfinite(v) for v in losses(result.stdout).values())


def test_real_cuda_oom_is_diagnosed_with_the_gpu_capacity(tmp_path):
    """A micro-batch far beyond the GPU: the CUDA allocator's own error, exit code 3, and log-based
    diagnosis reads the cause and the card's capacity from the real message text."""
    from hpc_agent.core.causes import Cause
    from hpc_agent.core.rundir import LogText
    from hpc_agent.diagnosis.logscan import gpu_capacity_bytes, scan_logs

    cfg = snapshot(tmp_path / "oom.yaml", train={"precision": "fp16", "micro_batch_size": 4096, "zero_stage": 2,
                                                 "max_steps": 2, "ckpt_every": 100, "activation_checkpointing": False},
                   model={"n_layers": 4, "d_model": 1024, "n_heads": 16, "seq_len": 1024}, slurm=GPU)
    result = run(cfg, tmp_path / "run", timeout=300)
    expect(result, EXIT_OUT_OF_MEMORY, "CUDA out of memory")
    findings = scan_logs([LogText("rank0.log", result.stdout)])
    assert any(f.cause == Cause.GPU_OOM for f in findings), findings
    total = torch.cuda.get_device_properties(0).total_memory
    capacity = gpu_capacity_bytes([result.stdout])
    print("CUDA OOM line:", next(l for l in result.stdout.splitlines() if "CUDA out of memory" in l)[:400])
    print(f"capacity read from the log {capacity} bytes, device total {total} bytes")
    assert capacity is not None and abs(capacity - total) / total < 0.01, (capacity, total)


def test_doctor_reports_gpu_health_through_pynvml():
    proc = subprocess.run([sys.executable, "-m", "hpc_agent.doctor", "quickstart", "slurm.gpus_per_node=1", "--json"],
                          cwd=str(REPO), env=env_for(), capture_output=True, text=True, timeout=120)
    report = json.loads(proc.stdout)
    health = [c for c in report["checks"] if c["name"] == "gpu health"]
    assert health and all(c["level"] != "FAIL" for c in health), report["checks"]
    # The check names the GPU it read (NVML's name is the one CUDA reports) and the report has its row.
    name = torch.cuda.get_device_name(0)
    assert any(name in c["detail"] for c in health), health
    assert any(name in line for line in report["gpu_report"]), report["gpu_report"]
    print("\n".join(c["detail"] for c in health) + "\n" + "\n".join(report["gpu_report"]))

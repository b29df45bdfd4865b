"""scripts/bench/mfu.py: its pure helpers (model FLOPs, MFU, checkpointing penalty, target verdicts, the GPU
peak by name) and, on the CPU, the smoke run through the same DeepSpeed and AMP code paths."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
from scripts.bench import mfu as bench

from tests.conftest import REPO


@pytest.mark.parametrize("layers, d, seq, vocab, matmul, per_token", [
    # Hand count. Block: qkv 3d^2+3d, proj d^2+d, fc 4d^2+4d, out 4d^2+d, two LayerNorms 4d = 12d^2+13d;
    # plus the final LayerNorm 2d and the head d*vocab; the token and position tables are lookups.
    (1, 4, 8, 10, 12 * 16 + 13 * 4 + 2 * 4 + 4 * 10, 6 * 292 + 12 * 1 * 4 * 8),
    # GPT-2 small shape: 12 * 7,087,872 + 1,536 + 38,597,376 = 123,653,376 (~124M, as GPT-2 with a tied head).
    (12, 768, 1024, 50257, 123_653_376, 6 * 123_653_376 + 12 * 12 * 768 * 1024),
])
def test_flops_per_token_is_6n_plus_the_attention_term(layers, d, seq, vocab, matmul, per_token):
    assert bench.matmul_params(layers, d, seq, vocab) == matmul
    assert bench.flops_per_token(layers, d, seq, vocab) == per_token


def test_matmul_params_are_the_model_without_its_embedding_tables():
    torch = pytest.importorskip("torch")
    from launch.workloads.gpt import ByteGPT

    model = ByteGPT(2, 64, 4, 32, vocab=300)
    tables = model.tok_emb.weight.numel() + model.pos_emb.weight.numel()
    assert sum(p.numel() for p in model.parameters()) - tables == bench.matmul_params(2, 64, 32, 300)
    assert ByteGPT(2, 64, 4, 32).head.out_features == 256  # the workload's byte vocabulary is unchanged
    assert torch.is_tensor(model.head.weight)


@pytest.mark.parametrize("tflops, peak, want", [(494.5, 989, 0.5), (0.0, 989, 0.0), (100, None, None),
                                                (None, 989, None), (100, 0, None)])
def test_mfu(tflops, peak, want):
    got = bench.mfu(tflops, peak)
    assert got == pytest.approx(want) if want is not None else got is None


@pytest.mark.parametrize("ckpt, plain, want", [(1.2, 1.0, 0.2), (1.0, 1.0, 0.0), (0.9, 1.0, -0.1),
                                               (None, 1.0, None), (1.2, None, None)])
def test_ckpt_penalty(ckpt, plain, want):
    got = bench.ckpt_penalty(ckpt, plain)
    assert got == pytest.approx(want) if want is not None else got is None


@pytest.mark.parametrize("name, override, want", [
    ("NVIDIA H200", None, 989), ("NVIDIA H100 80GB HBM3", None, 989), ("NVIDIA A100-SXM4-80GB", None, 312),
    ("NVIDIA H200", 500.0, 500.0), ("Tesla K80", None, None), (None, None, None)])
def test_peak_from_the_gpu_name(name, override, want):
    assert bench.resolve_peak(name, override) == want


def rows(mfu_350m, step_plain, step_ckpt):
    out = []
    for mode in bench.MODES:
        for ckpt in (False, True):
            step = step_ckpt if ckpt else step_plain
            out.append({"model": "350m", "mode": mode, "ckpt": ckpt, "micro_batch": 8, "step_s": step,
                        "tokens_per_s": 8192 / step * (1.0 if mode == "amp" else 0.9),
                        "mfu": None if mfu_350m is None else mfu_350m * (1.0 if mode == "amp" else 0.9)})
    return out


@pytest.mark.parametrize("device, mfu_350m, step_ckpt, want_mfu, want_pen", [
    ("cuda", 0.55, 1.2, True, True),      # best DeepSpeed MFU 49.5 %, penalty 20 %
    ("cuda", 0.45, 1.3, False, False),    # 40.5 %, 30 %
    ("cuda", 0.6, 1.25, True, True),      # the bounds are inclusive
    ("cpu", None, 1.1, None, None),       # a CPU run never says a GPU target is met
])
def test_target_verdicts(device, mfu_350m, step_ckpt, want_mfu, want_pen):
    summary = bench.summarize(rows(mfu_350m, 1.0, step_ckpt), device)
    assert summary["verdicts"]["mfu"]["met"] is want_mfu
    assert summary["verdicts"]["ckpt_penalty"]["met"] is want_pen
    assert all(p["penalty"] == pytest.approx(step_ckpt - 1) for p in summary["penalties"])
    assert all(r["ratio"] == pytest.approx(0.9) for r in summary["ds_over_amp"])


def test_an_oom_case_leaves_the_verdicts_unmeasured_and_shows_in_the_table():
    data = rows(0.6, 1.0, 1.1)
    data[3] = {"model": "350m", "mode": "zero2", "ckpt": True, "micro_batch": 8, "error": "OOM: CUDA out of memory"}
    result = {"device": "cuda", "gpu": "NVIDIA H200", "peak_tflops": 989, "rows": data, **bench.summarize(data, "cuda")}
    assert result["verdicts"]["ckpt_penalty"]["met"] is None
    assert result["verdicts"]["mfu"]["met"] is True
    table = bench.markdown_table(result)
    assert "OOM: CUDA out of memory" in table and "NOT GPU" not in table and "MET" in table


@pytest.mark.slow
def test_cpu_smoke_runs_every_case(tmp_path):
    out = tmp_path / "bench_mfu.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        env.pop(key, None)
    proc = subprocess.run([sys.executable, "-m", "scripts.bench.mfu", "--cpu-smoke", "--out", str(out)], env=env,
                          cwd=str(REPO), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "NOT GPU results" in proc.stdout
    data = json.loads(out.read_text())
    assert data["device"] == "cpu" and data["peak_tflops"] is None
    assert sorted((r["model"], r["mode"], r["ckpt"]) for r in data["rows"]) == sorted(
        (m["name"], mode, ckpt) for m in bench.SMOKE for mode, ckpt in bench.CASES)
    assert len(data["penalties"]) == 2 * len(bench.MODES) and all(p["penalty"] is not None for p in data["penalties"])
    for row in data["rows"]:
        assert "error" not in row, row
        assert math.isfinite(row["tokens_per_s"]) and row["tokens_per_s"] > 0, row
        assert row["mfu"] is None and row["tflops"] > 0
    assert data["verdicts"]["mfu"]["met"] is None and data["verdicts"]["ckpt_penalty"]["met"] is None
    assert data["targets"] == {"mfu_min": 0.45, "mfu_model": "350m", "ckpt_penalty_max": 0.25}


def test_without_a_gpu_and_without_cpu_smoke_it_exits_2_without_a_traceback(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "scripts.bench.mfu", "--out", str(tmp_path / "x.json")], env=env,
                          cwd=str(REPO), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no CUDA GPU" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "x.json").exists()

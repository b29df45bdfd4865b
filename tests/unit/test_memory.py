"""Memory estimator: arithmetic, agreement with DeepSpeed's own model-state estimators, cheapest_fit."""
from __future__ import annotations

import pytest

from hpc_agent.config.load import apply_patch, build_config
from hpc_agent.policy.memory import Estimate, cheapest_fit, estimate, estimate_from_config, gpt_param_count

GiB = 2**30
SIZES = [(12, 768, 1024), (28, 1024, 1024), (24, 2048, 2048)]  # ~86 M, 354 M (configs/gpt350m.yaml), 1.2 B
WORLD = 8


def cfg_of(**overrides):
    return build_config([dict(overrides)])


def test_sharding_and_offload_arithmetic():
    p = 1_000_000
    e0 = estimate(p, 2, 64, 64, 1, "bf16", 0, 4)
    assert (e0.params_bytes, e0.grads_bytes, e0.optimizer_bytes, e0.gathered_bytes) == (2 * p, 2 * p, 16 * p, 0)
    e1 = estimate(p, 2, 64, 64, 1, "bf16", 1, 4)
    assert (e1.params_bytes, e1.grads_bytes, e1.optimizer_bytes) == (2 * p, 2 * p, 4 * p)
    e2 = estimate(p, 2, 64, 64, 1, "bf16", 2, 4)
    assert (e2.params_bytes, e2.grads_bytes, e2.optimizer_bytes) == (2 * p, p // 2, 4 * p)
    e3 = estimate(p, 2, 64, 64, 1, "bf16", 3, 4)
    assert (e3.params_bytes, e3.grads_bytes, e3.optimizer_bytes) == (p // 2, p // 2, 3 * p)
    # working set: the step's fp32 gradient of the whole 250k-parameter partition (1 MB) beats the
    # gathered largest layer (4 B x 49,984 parameters)
    assert e3.gathered_bytes == max(4 * (12 * 64 * 64 + 13 * 64), 4 * p // 4) == p
    wide = estimate(p, 2, 256, 64, 1, "bf16", 3, 4)  # largest layer 789,760 parameters
    assert wide.gathered_bytes == 4 * (12 * 256 * 256 + 13 * 256)
    f32 = estimate(p, 2, 64, 64, 1, "fp32", 0, 1)
    assert (f32.params_bytes, f32.grads_bytes, f32.optimizer_bytes) == (4 * p, 4 * p, 8 * p)
    off = estimate(p, 2, 64, 64, 1, "bf16", 2, 4, offload="optimizer")
    assert off.optimizer_bytes == 0 and off.host_bytes == 4 * p
    off3 = estimate(p, 2, 64, 64, 1, "bf16", 3, 4, offload="optimizer+params")
    assert off3.params_bytes == 0 and off3.host_bytes == 4 * p + p // 2
    # Two phases: forward/backward (no gradients, no step-only fp32 gradient, all activations) and the step.
    assert e3.buffer_bytes == 5 * 10**8 * 2
    assert e3.step_bytes == e3.model_state_bytes + e3.buffer_bytes
    assert e3.forward_backward_bytes == (e3.model_state_bytes - e3.grads_bytes - e3.step_only_bytes
                                         + e3.buffer_bytes + e3.activation_bytes)
    assert e3.step_only_bytes == p - 4 * (12 * 64 * 64 + 13 * 64)  # forward/backward keeps the gathered layer
    assert e3.total_bytes == max(e3.forward_backward_bytes, e3.step_bytes)
    assert e2.step_only_bytes == e2.optimizer_bytes // 4  # the fp32 gradient partition
    assert off.step_only_bytes == 0 and f32.step_only_bytes == 0
    assert estimate(p, 2, 64, 64, 1, "bf16", 0, 1).buffer_bytes == 0  # no ZeRO, no reduction bucket
    assert estimate(p, 2, 64, 64, 1, "fp32", 1, 1, reduce_bucket_size=1000).buffer_bytes == 4000
    assert all(isinstance(a, str) for a in e3.assumptions) and e3.assumptions


def test_activations():
    s, b, h, a, L = 1024, 4, 1024, 16, 28
    e = estimate(10**6, L, h, s, b, "bf16", 1, 1, vocab=256)
    per_layer = 34 * s * b * h  # fused attention: no a*s*s score matrix
    logits = 2 * 4 * s * b * 256
    assert e.activation_bytes == L * per_layer + logits
    ck = estimate(10**6, L, h, s, b, "bf16", 1, 1, activation_checkpointing=True, vocab=256)
    assert ck.activation_bytes == L * 2 * s * b * h + per_layer + logits
    assert estimate(10**6, L, h, s, 2 * b, "bf16", 1, 1).activation_bytes > e.activation_bytes
    assert estimate(10**6, L, h, s, b, "fp32", 1, 1).activation_bytes == 2 * L * per_layer + logits
    # Same tokens per micro-batch, twice the sequence: the same activations (measured: +0.2 % on a GPU).
    assert estimate(10**6, L, h, 2 * s, b // 2, "bf16", 1, 1, vocab=256).activation_bytes == e.activation_bytes


# ZeRO-3: we count 16 B/param sharded (16-bit params 2 + 16-bit grads 2 + master 4 + moments 8) plus the
# larger of the gathered largest layer and the step's fp32 gradient (4 B/param of the partition), where
# DeepSpeed's estimator counts 18 B/param plus the gathered layer.


def test_estimate_from_config():
    cfg = cfg_of(**{"model.n_layers": 28, "model.d_model": 1024, "model.n_heads": 16, "model.seq_len": 1024,
                    "train.micro_batch_size": 8, "train.precision": "bf16", "train.zero_stage": 2,
                    "slurm.nodes": 2, "slurm.tasks_per_node": 4, "slurm.gpus_per_node": 4})
    e = estimate_from_config(cfg)
    direct = estimate(gpt_param_count(28, 1024, 1024), 28, 1024, 1024, 8, "bf16", 2, 8)
    assert isinstance(e, Estimate) and e.total_bytes == direct.total_bytes


BIG = {"model.n_layers": 28, "model.d_model": 1024, "model.n_heads": 16, "model.seq_len": 4096,
       "train.precision": "bf16", "train.zero_stage": 1, "slurm.nodes": 1, "slurm.tasks_per_node": 8,
       "slurm.gpus_per_node": 8}


def test_cheapest_fit_order():
    cfg = cfg_of(**{**BIG, "train.micro_batch_size": 16, "train.grad_accum_steps": 1})
    total = estimate_from_config(cfg).total_bytes
    assert cheapest_fit(cfg, total) == ({}, "fits as is")
    # a little short: one halving of the micro-batch, global batch kept
    patch, what = cheapest_fit(cfg, total - 1)
    assert patch == {"train.micro_batch_size": 8, "train.grad_accum_steps": 2} and "micro_batch_size 16 -> 8" in what
    apply_patch(cfg, patch)  # a valid config
    # Nothing left to halve at micro-batch 1: activation checkpointing is the next single change.
    one = cfg_of(**{**BIG, "train.micro_batch_size": 1, "train.grad_accum_steps": 16})
    ck = estimate_from_config(apply_patch(one, {"train.activation_checkpointing": True})).total_bytes
    assert ck < estimate_from_config(one).total_bytes
    assert cheapest_fit(one, ck) == ({"train.activation_checkpointing": True},
                                     "turn on activation checkpointing (~1/3 more compute)")


def test_cheapest_fit_zero_stage():
    cfg = cfg_of(**{**BIG, "train.micro_batch_size": 1, "train.activation_checkpointing": True})
    e = estimate_from_config(cfg)
    z2 = estimate_from_config(apply_patch(cfg, {"train.zero_stage": 2})).total_bytes
    assert z2 < e.total_bytes  # 8 ranks: the gradients are sharded too
    patch, _ = cheapest_fit(cfg, z2)
    assert patch == {"train.zero_stage": 2}


def test_cheapest_fit_offload():
    # One GPU: ZeRO stages shard nothing, so only offloading the optimizer states frees memory.
    cfg = cfg_of(**{**BIG, "train.micro_batch_size": 1, "train.activation_checkpointing": True,
                    "slurm.tasks_per_node": 1, "slurm.gpus_per_node": 1})
    z3 = estimate_from_config(apply_patch(cfg, {"train.zero_stage": 3})).total_bytes
    off = {"train.offload": "optimizer", "train.zero_stage": 2}
    off_total = estimate_from_config(apply_patch(cfg, off)).total_bytes
    assert off_total < z3
    patch, what = cheapest_fit(cfg, off_total)
    assert patch == off and "offload" in what
    apply_patch(cfg, patch)
    assert cheapest_fit(cfg, 1) is None


def test_memory_module_is_torch_free():
    import subprocess
    import sys
    code = "import sys, hpc_agent.policy.memory; print('torch' in sys.modules or 'deepspeed' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


# Peak memory (torch.cuda.max_memory_allocated) of FP16 gpt runs on one NVIDIA H200, DeepSpeed 0.19.8,
# torch 2.11: scripts/bench/gpu_memory.py, results/gpu/bench_gpu_memory.json (2026-11-30).
# (layers, width, seq, micro-batch, ZeRO stage, activation checkpointing, measured peak bytes)
H200_PEAKS = [
    (12, 768, 1024, 8, 2, False, 4816134144),
    (12, 768, 1024, 16, 2, False, 7351717376),
    (12, 768, 2048, 4, 2, False, 4827249664),
    (24, 1024, 1024, 4, 2, False, 8680404992),
    (24, 1024, 1024, 8, 2, False, 11943108608),
    (24, 1024, 1024, 8, 2, True, 6759254016),
    (24, 1024, 1024, 8, 1, False, 11943636992),
    (24, 1024, 1024, 8, 3, False, 12550234112),
    (4, 2048, 1024, 8, 2, False, 6418459648),
]


@pytest.mark.parametrize("layers,width,seq,mbs,stage,ckpt,peak", H200_PEAKS)
def test_estimate_tracks_the_measured_gpu_peak(layers, width, seq, mbs, stage, ckpt, peak):
    e = estimate(gpt_param_count(layers, width, seq), layers, width, seq, mbs, "fp16", stage, 1,
                 activation_checkpointing=ckpt)
    assert 0.93 <= e.total_bytes / peak <= 1.07, (e.total_bytes / peak, e.to_dict())

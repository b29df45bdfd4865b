"""The GPU OOM ladder guided by the memory estimate: skip the rungs that cannot fit (pure, table-driven)."""
from __future__ import annotations

from typing import Any

import pytest

from hpc_agent.config.load import build_config
from hpc_agent.diagnosis.logscan import gpu_capacity_bytes
from hpc_agent.policy.decide import RESUBMIT, PolicyLimits, Situation, decide
from hpc_agent.policy.memory import estimate_from_config, estimate_with_patch, gpu_oom_fit, gpu_oom_rung

GIB = 2**30
# About a 300M-parameter GPT (sequence 4096) on one GPU: the estimate is 56.1 GiB at micro-batch 16 (bf16,
# ZeRO-1), 30.5 at 8, 17.7 at 4, 11.3 at 2, 8.1 at 1, 6.7 at 1 with activation checkpointing (the
# optimizer step's floor).
BIG = {"model.n_layers": 24, "model.d_model": 1024, "model.seq_len": 4096, "model.n_heads": 16,
       "train.micro_batch_size": 16, "train.grad_accum_steps": 1, "train.precision": "bf16", "train.zero_stage": 1,
       "slurm.nodes": 1, "slurm.tasks_per_node": 1}


def cfg(**overrides: Any):
    return build_config([{**BIG, **overrides}])


@pytest.mark.parametrize("capacity_gib, overrides, patch, reason_has", [
    pytest.param(None, {}, {"train.micro_batch_size": 8, "train.grad_accum_steps": 2}, "16 -> 8",
                 id="capacity-unknown-one-rung"),
    pytest.param(40, {}, {"train.micro_batch_size": 8, "train.grad_accum_steps": 2}, "estimate 30.50 GiB",
                 id="first-rung-fits"),
    pytest.param(16, {}, {"train.micro_batch_size": 2, "train.grad_accum_steps": 8}, "skipped 2 rung(s)",
                 id="skip-to-micro-batch-2"),
    pytest.param(8, {}, {"train.micro_batch_size": 1, "train.grad_accum_steps": 16,
                         "train.activation_checkpointing": True}, "activation_checkpointing off -> on",
                 id="skip-to-activation-checkpointing"),
    pytest.param(0.5, {}, {"train.micro_batch_size": 8, "train.grad_accum_steps": 2}, "no rung fits",
                 id="nothing-fits-next-rung-alone"),
    # The config ran out of memory on a 60 GiB GPU although its estimate is 56.1 GiB: the estimate is
    # scaled by 60/56.1 (30.50 -> 32.64 GiB for micro-batch 8).
    pytest.param(60, {}, {"train.micro_batch_size": 8, "train.grad_accum_steps": 2}, "estimate 32.64 GiB",
                 id="calibrated-by-the-failure"),
    pytest.param(16, {"train.workload": "classifier"}, {"train.micro_batch_size": 8, "train.grad_accum_steps": 2},
                 "16 -> 8", id="no-estimate-for-classifier"),
])
def test_gpu_oom_fit(capacity_gib, overrides, patch, reason_has):
    c = cfg(**overrides)
    capacity = int(capacity_gib * GIB) if capacity_gib else None
    fit = gpu_oom_fit(c, 1, True, capacity, headroom=0.9)
    assert fit is not None
    assert fit[0] == patch
    assert reason_has in fit[1]


@pytest.mark.parametrize("capacity_gib", [8, 9, 10, 12, 14, 18, 20, 24, 30, 36, 44, 60])
def test_fit_keeps_global_batch_and_fits(capacity_gib):
    c = cfg()
    patch, _ = gpu_oom_fit(c, 1, True, capacity_gib * GIB, headroom=0.9)
    mbs = patch.get("train.micro_batch_size", 16)
    accum = patch.get("train.grad_accum_steps", 1)
    assert mbs * accum == 16
    assert estimate_with_patch(c, patch).total_bytes <= 0.9 * capacity_gib * GIB
    # ... and it is the first such rung: the previous rung alone would not have fitted.
    rung = gpu_oom_rung(c.train, 1)
    if patch != rung[0]:
        assert estimate_with_patch(c, rung[0]).total_bytes > 0.9 * capacity_gib * GIB


def test_decide_uses_the_capacity_from_the_situation():
    d = decide("gpu_oom", [], cfg(), Situation(gpu_capacity_bytes=16 * GIB), PolicyLimits())
    assert d.action == RESUBMIT
    assert d.patch == {"train.micro_batch_size": 2, "train.grad_accum_steps": 8}
    assert "skipped" in d.reason


@pytest.mark.parametrize("texts, expected", [
    (["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
      "79.15 GiB of which 1.02 GiB is free."], int(79.15 * GIB)),
    (["GPU 0 has a total capacity of 15360.00 MiB of which 0 bytes is free"], 15360 * 2**20),
    (["CUDA out of memory. Tried to allocate 2.00 GiB"], None),
    (["a total capacity of 8.00 GiB", "unrelated", ""], 8 * GIB),
    ([], None),
])
def test_gpu_capacity_from_oom_text(texts, expected):
    assert gpu_capacity_bytes(texts) == expected


def test_estimate_grows_with_micro_batch():
    assert estimate_from_config(cfg(**{"train.micro_batch_size": 4})).total_bytes < estimate_from_config(cfg()).total_bytes

"""The memory estimate (hpc_agent/policy/memory.py, torch-free) against the job's own code: the GPT workload's
parameter count and DeepSpeed's model-state estimators (the arithmetic alone: tests/unit/test_memory.py)."""
from __future__ import annotations

import pytest

from hpc_agent.policy.memory import estimate, gpt_param_count
from tests.unit.test_memory import SIZES, WORLD


@pytest.mark.parametrize("n_layers,d_model,seq_len", [(4, 128, 64), (2, 64, 64), (28, 1024, 1024)])
def test_param_count_matches_workload(n_layers, d_model, seq_len):
    gpt = pytest.importorskip("launch.workloads.gpt")
    assert gpt_param_count(n_layers, d_model, seq_len) == gpt.gpt_param_count(n_layers, d_model, seq_len)


TOLERANCE = {1: 0.10, 2: 0.10, 3: 0.10}


def deepspeed_model_states(params: int, largest_layer: int, stage: int) -> int:
    """DeepSpeed's GPU model-state bytes per rank, additional_buffer_factor=1.0, no offload, 1 node x WORLD.

    ZeRO-1 has no estimator of its own: the ZeRO-2 formula (2 B/param 16-bit params replicated, 18 B/param
    sharded = 2 16-bit grads + 4 fp32 grads + 4 fp32 params + 8 moments) with the 2 B/param 16-bit gradients
    moved from the sharded to the replicated part, as ZeRO-1 does not shard gradients."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
    if stage == 3:
        return estimate_zero3_model_states_mem_needs(params, largest_layer, num_gpus_per_node=WORLD, num_nodes=1,
                                                     cpu_offload=False, cpu_offload_params=False, zero_init=False,
                                                     additional_buffer_factor=1.0)[1]
    gpu = estimate_zero2_model_states_mem_needs(params, num_gpus_per_node=WORLD, num_nodes=1, cpu_offload=False,
                                                additional_buffer_factor=1.0)[1]
    if stage == 1:
        gpu += 2 * params - int(2 * params / WORLD)
    return gpu


@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("n_layers,d_model,seq_len", SIZES)
def test_model_states_agree_with_deepspeed(n_layers, d_model, seq_len, stage):
    pytest.importorskip("deepspeed")
    params = gpt_param_count(n_layers, d_model, seq_len)
    ours = estimate(params, n_layers, d_model, seq_len, 1, "bf16", stage, WORLD).model_state_bytes
    theirs = deepspeed_model_states(params, 12 * d_model * d_model + 13 * d_model, stage)
    diff = (ours - theirs) / theirs
    print(f"params={params} zero={stage} ours={ours} deepspeed={theirs} diff={diff:+.2%}")
    assert abs(diff) <= TOLERANCE[stage]

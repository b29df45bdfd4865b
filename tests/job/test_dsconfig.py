"""launch.dsconfig: config -> DeepSpeed dict and precision resolution (pure, table-driven)."""
import pytest

from hpc_agent.config.schema import TrainConfig
from launch.dsconfig import PrecisionUnavailable, build_ds_config, resolve_precision


@pytest.mark.parametrize("requested,cuda,expected", [
    ("auto", True, "fp16"),
    ("auto", False, "bf16"),
    ("fp16", True, "fp16"),
    ("bf16", False, "bf16"),
    ("bf16", True, "bf16"),
    ("fp32", False, "fp32"),
])
def test_resolve_precision(requested, cuda, expected):
    precision, note = resolve_precision(requested, cuda)
    assert precision == expected
    assert expected in note


def test_fp16_without_cuda_is_a_clear_error():
    with pytest.raises(PrecisionUnavailable, match="needs a CUDA GPU.*bf16"):
        resolve_precision("fp16", False)


def test_fp16_section_carries_loss_scaling_settings():
    train = TrainConfig(precision="fp16", initial_scale_power=12, loss_scale_window=500, hysteresis=3,
                        min_loss_scale=0.5)
    cfg = build_ds_config(train, world_size=2, precision="fp16", on_cuda=True)
    assert cfg["fp16"] == {"enabled": True, "loss_scale": 0, "initial_scale_power": 12,
                           "loss_scale_window": 500, "hysteresis": 3, "min_loss_scale": 0.5}
    assert "bf16" not in cfg


@pytest.mark.parametrize("precision,key", [("bf16", "bf16"), ("fp32", None)])
def test_other_precisions(precision, key):
    cfg = build_ds_config(TrainConfig(), world_size=1, precision=precision, on_cuda=False)
    assert "fp16" not in cfg
    assert (cfg.get("bf16") == {"enabled": True}) == (key == "bf16")


@pytest.mark.parametrize("mbs,accum,world", [(8, 1, 1), (4, 2, 1), (2, 4, 2), (1, 8, 4)])
def test_batch_sizes(mbs, accum, world):
    cfg = build_ds_config(TrainConfig(micro_batch_size=mbs, grad_accum_steps=accum), world_size=world,
                          precision="bf16", on_cuda=False)
    assert cfg["train_micro_batch_size_per_gpu"] == mbs
    assert cfg["gradient_accumulation_steps"] == accum
    assert cfg["train_batch_size"] == mbs * accum * world


@pytest.mark.parametrize("stage,offload,on_cuda,zero", [
    (0, "none", False, {"stage": 0}),
    (2, "optimizer", False, {"stage": 2, "reduce_bucket_size": 500_000_000,
                             "offload_optimizer": {"device": "cpu", "pin_memory": False}}),
    (3, "optimizer+params", True, {"stage": 3, "reduce_bucket_size": 500_000_000,
                                   "offload_optimizer": {"device": "cpu", "pin_memory": True},
                                   "offload_param": {"device": "cpu", "pin_memory": True}}),
])
def test_zero_and_offload(stage, offload, on_cuda, zero):
    cfg = build_ds_config(TrainConfig(zero_stage=stage, offload=offload), world_size=1, precision="bf16",
                          on_cuda=on_cuda)
    assert cfg["zero_optimization"] == zero


def test_reduce_bucket_size_is_passed_on():
    """The memory estimate counts this bucket: DeepSpeed must get the same number."""
    cfg = build_ds_config(TrainConfig(zero_stage=1, reduce_bucket_size=12345), world_size=1, precision="bf16",
                          on_cuda=False)
    assert cfg["zero_optimization"]["reduce_bucket_size"] == 12345


@pytest.mark.parametrize("offload,on_cuda,torch_adam", [("none", True, True), ("none", False, True),
                                                        ("optimizer", False, True), ("optimizer", True, False)])
def test_optimizer(offload, on_cuda, torch_adam):
    train = TrainConfig(lr=2e-4, weight_decay=0.05, zero_stage=2, offload=offload, grad_clip=0.5)
    cfg = build_ds_config(train, world_size=1, precision="bf16", on_cuda=on_cuda)
    assert cfg["optimizer"]["type"] == "AdamW"
    assert cfg["optimizer"]["params"]["lr"] == 2e-4 and cfg["optimizer"]["params"]["weight_decay"] == 0.05
    assert cfg["optimizer"]["params"].get("torch_adam", False) is torch_adam
    assert cfg["gradient_clipping"] == 0.5
    assert "scheduler" not in cfg  # the engine passes its own LambdaLR


def test_load_universal_flag():
    assert "checkpoint" not in build_ds_config(TrainConfig(), world_size=1, precision="fp32", on_cuda=False)
    cfg = build_ds_config(TrainConfig(), world_size=1, precision="fp32", on_cuda=False, load_universal=True)
    assert cfg["checkpoint"] == {"load_universal": True}


def test_unresolved_precision_rejected():
    with pytest.raises(ValueError):
        build_ds_config(TrainConfig(), world_size=1, precision="auto", on_cuda=False)


def test_deepspeed_accepts_the_dict():
    """DeepSpeed's own config parser takes every combination we generate (no engine needed)."""
    from deepspeed.runtime.config import DeepSpeedConfig

    for precision in ("fp16", "bf16", "fp32"):
        for stage, offload in ((0, "none"), (1, "none"), (2, "optimizer"), (3, "optimizer+params")):
            cfg = build_ds_config(TrainConfig(zero_stage=stage, offload=offload, precision=precision),
                                  world_size=1, precision=precision, on_cuda=False)
            parsed = DeepSpeedConfig(cfg)
            assert parsed.zero_optimization_stage == stage
            assert parsed.float16_config.enabled == (precision == "fp16")
            if precision == "fp16":
                fp16 = parsed.float16_config
                assert (fp16.loss_scale, fp16.initial_scale_power, fp16.loss_scale_window, fp16.hysteresis,
                        fp16.min_loss_scale) == (0, 16, 1000, 2, 1)


_FP16_ENGINE = r"""
import os, torch, deepspeed
from deepspeed.accelerator import get_accelerator
if not get_accelerator().is_fp16_supported():
    print("SKIP"); raise SystemExit(0)
from launch.distributed import free_port
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
from hpc_agent.config.schema import TrainConfig
from launch.dsconfig import build_ds_config
from launch.engine import _loss_scale
for stage in (0, 1):
    model = torch.nn.Linear(8, 1)
    cfg = build_ds_config(TrainConfig(zero_stage=stage, initial_scale_power=8, precision="fp16"),
                          world_size=1, precision="fp16", on_cuda=False)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    print("SCALE", stage, _loss_scale(engine))
"""


def test_fp16_engine_starts_at_our_loss_scale():
    """DeepSpeed builds an FP16 engine from our dict with the loss scale 2**initial_scale_power, and the
    engine's loss scale is found for TensorBoard. Runs where DeepSpeed's CPU accelerator has an FP16
    path (our training refuses FP16 without CUDA anyway); skipped elsewhere."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", _FP16_ENGINE], capture_output=True, text=True, timeout=300,
                         cwd=repo, env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    if "SKIP" in out.stdout:
        pytest.skip("this CPU has no FP16 support in DeepSpeed's CPU accelerator")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "SCALE 0 256.0" in out.stdout and "SCALE 1 256.0" in out.stdout

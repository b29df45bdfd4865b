"""``train`` section -> DeepSpeed config dict, and the precision choice. Pure: no torch, no I/O.

What ends up in the dict, and why:

* Batch: DeepSpeed checks ``train_batch_size == micro x accum x world``; we always give all three.
* Optimizer: AdamW from the DeepSpeed config (not a client optimizer) so ZeRO wraps it and its state
  is saved in ZeRO's sharded format. ``torch_adam: true`` makes DeepSpeed use ``torch.optim.AdamW``
  instead of its FusedAdam, which would be JIT-compiled with nvcc at start-up (slow, and absent on
  CPU nodes). Exception: offload on CUDA, where DeepSpeed's CPU Adam (C++, compiled once) is the
  fast path for the CPU-side update.
* Scheduler: none here. The engine passes a ``LambdaLR`` over :func:`launch.lr_schedule.lr_factor`;
  DeepSpeed steps it at each accumulation boundary and saves it in the checkpoint.
* FP16: ``loss_scale: 0`` selects dynamic loss scaling, tuned by the four ``train`` fields.
* ``checkpoint.load_universal``: set only for a resume that goes through a universal checkpoint
  (a changed ZeRO stage or world size); it changes how ``load_checkpoint`` reads, not how we save.
"""
from __future__ import annotations

from typing import Any, Dict, Tuple

from hpc_agent.core.ops_cache import uses_cpu_adam

# DeepSpeed prints a progress line every steps_per_print steps; we log ourselves.
_NEVER = 2**31 - 1


class PrecisionUnavailable(Exception):
    """The requested precision cannot run on this machine (exit code ``EXIT_UNAVAILABLE``)."""


def resolve_precision(requested: str, cuda_available: bool) -> Tuple[str, str]:
    """``(precision, note)``: what to train in and a line saying why.

    ``auto`` is FP16 on CUDA (dynamic loss scaling, every CUDA GPU has it) and BF16 on the CPU
    (DeepSpeed's CPU accelerator has no FP16 training path). An explicit ``fp16`` without CUDA is an
    error rather than a silent switch: the user asked for something this node cannot do.
    """
    if requested == "auto":
        if cuda_available:
            return "fp16", "precision auto -> fp16 (CUDA available; dynamic loss scaling)"
        return "bf16", "precision auto -> bf16 (no CUDA device: DeepSpeed has no FP16 on the CPU)"
    if requested == "fp16" and not cuda_available:
        raise PrecisionUnavailable(
            "train.precision=fp16 needs a CUDA GPU, and this node has none (DeepSpeed's CPU accelerator "
            "fails with 'Type fp16 is not supported on your device'). Use train.precision=bf16, fp32 or "
            "auto, or run on a GPU node (slurm.gpus_per_node >= 1).")
    if requested not in ("fp16", "bf16", "fp32"):
        raise ValueError(f"train.precision={requested!r}: expected auto, fp16, bf16 or fp32")
    return requested, f"precision {requested} (as configured)"


def zero_section(stage: int, offload: str, on_cuda: bool, reduce_bucket_size: int) -> Dict[str, Any]:
    zero: Dict[str, Any] = {"stage": stage}
    if stage >= 1:
        # Explicit, so the memory estimate (hpc_agent.policy.memory) and DeepSpeed count the same bucket.
        zero["reduce_bucket_size"] = int(reduce_bucket_size)
    if offload in ("optimizer", "optimizer+params"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": on_cuda}
    if offload == "optimizer+params":
        zero["offload_param"] = {"device": "cpu", "pin_memory": on_cuda}
    return zero


def fp16_section(train) -> Dict[str, Any]:
    return {
        "enabled": True,
        "loss_scale": 0,  # 0 = dynamic loss scaling
        "initial_scale_power": int(train.initial_scale_power),
        "loss_scale_window": int(train.loss_scale_window),
        "hysteresis": int(train.hysteresis),
        "min_loss_scale": float(train.min_loss_scale),
    }


def build_ds_config(train, *, world_size: int, precision: str, on_cuda: bool,
                    load_universal: bool = False) -> Dict[str, Any]:
    """The DeepSpeed config for ``train`` (a ``TrainConfig``) on ``world_size`` ranks."""
    if precision not in ("fp16", "bf16", "fp32"):
        raise ValueError(f"precision must be resolved to fp16, bf16 or fp32 first, not {precision!r}")
    mbs, accum = int(train.micro_batch_size), int(train.grad_accum_steps)
    cpu_adam = uses_cpu_adam(on_cuda, train.offload)  # a compiled op: submit checks that it is prepared
    params: Dict[str, Any] = {"lr": float(train.lr), "weight_decay": float(train.weight_decay)}
    if not cpu_adam:
        params["torch_adam"] = True
    config: Dict[str, Any] = {
        "train_batch_size": mbs * accum * world_size,
        "train_micro_batch_size_per_gpu": mbs,
        "gradient_accumulation_steps": accum,
        "gradient_clipping": float(train.grad_clip),
        "optimizer": {"type": "AdamW", "params": params},
        "zero_optimization": zero_section(int(train.zero_stage), train.offload, on_cuda,
                                          int(train.reduce_bucket_size)),
        "steps_per_print": _NEVER,
        "wall_clock_breakdown": False,
    }
    if precision == "fp16":
        config["fp16"] = fp16_section(train)
    elif precision == "bf16":
        config["bf16"] = {"enabled": True}
    if load_universal:
        config["checkpoint"] = {"load_universal": True}
    return config

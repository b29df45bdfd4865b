"""Resume under a changed layout (micro-batch, accumulation, ZeRO stage, world size).

What DeepSpeed can load, found by trying (0.19.8):

* Same world size and the same ZeRO partitioning: a plain ``load_checkpoint``. Micro-batch size and
  accumulation are not part of any saved state, and ZeRO-1 and ZeRO-2 share one optimizer class and
  one shard format (the shards depend only on the world size), so 1 <-> 2 loads natively too.
* ZeRO-0 at any world size: the full optimizer state sits in rank 0's file and every rank reads it.
* Anything else (world size change, a move to or from ZeRO-3): a *universal* checkpoint, made by
  ``deepspeed.checkpoint.ds_to_universal`` and loaded with ``checkpoint.load_universal``. DeepSpeed
  only round-trips it within one stage family; to load a ZeRO-1/2 conversion into ZeRO-3 (or back) we
  normalise it (:func:`normalize`): ZeRO-3 looks for ``zero_pp_rank_0_mp_rank_00_model_states.pt``
  and for the Adam step in ``optimizer_state.pt``; ZeRO-1/2 want ``mp_rank_00_model_states.pt``, a
  ``step.pt`` per parameter and ``ds_version``.
* From ZeRO-0 to ZeRO >= 1: ds_to_universal cannot read a ZeRO-0 checkpoint, so
  :func:`stage0_to_universal` writes the same per-parameter layout from the plain optimizer state.
* Into ZeRO-0 from ZeRO >= 1: refused. DeepSpeed cannot load a universal checkpoint without ZeRO.
* A changed global batch (micro x accum x world): refused. The data position and the LR schedule
  count optimizer steps of a fixed global batch; silently changing it changes the experiment.

Conversions are written to ``checkpoints/.universal/<tag>`` by rank 0 and deleted after the load.
"""
from __future__ import annotations

import argparse
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Sequence

NATIVE, UNIVERSAL, FROM_STAGE0, REFUSE = "native", "universal", "universal-from-zero0", "refuse"
LAYOUT_KEYS = ("micro_batch_size", "grad_accum_steps", "world_size", "zero_stage", "offload", "precision")
UNIVERSAL_DIR = ".universal"
_MODEL_STATES = "mp_rank_00_model_states.pt"
_MODEL_STATES_Z3 = "zero_pp_rank_0_mp_rank_00_model_states.pt"


def layout_of(train: Any, world_size: int, precision: str) -> Dict[str, Any]:
    """What a checkpoint records about how it was trained (in its marker and client state)."""
    return {"micro_batch_size": int(train.micro_batch_size), "grad_accum_steps": int(train.grad_accum_steps),
            "world_size": int(world_size), "zero_stage": int(train.zero_stage), "offload": str(train.offload),
            "precision": precision}


def global_batch(layout: Dict[str, Any]) -> int:
    return int(layout["micro_batch_size"]) * int(layout["grad_accum_steps"]) * int(layout["world_size"])


def _split(layout: Dict[str, Any]) -> str:
    return f"{layout['micro_batch_size']} x {layout['grad_accum_steps']} x {layout['world_size']} ranks"


@dataclass(frozen=True)
class ResumePlan:
    mode: str
    reason: str


def plan(saved: Dict[str, Any], current: Dict[str, Any]) -> ResumePlan:
    """How to load a checkpoint saved with layout ``saved`` into an engine with layout ``current``."""
    changed = [f"{k} {saved.get(k)} -> {current.get(k)}" for k in LAYOUT_KEYS if saved.get(k) != current.get(k)]
    what = ", ".join(changed) if changed else "no layout change"
    if global_batch(saved) != global_batch(current):
        return ResumePlan(REFUSE, (
            f"the global batch changed from {global_batch(saved)} (micro_batch_size x grad_accum_steps x ranks = "
            f"{_split(saved)}) to {global_batch(current)} ({_split(current)}). Data position and LR schedule "
            f"count optimizer steps of a fixed global batch: keep the product at {global_batch(saved)}, or "
            "start a new run"))
    s0, s1 = int(saved["zero_stage"]), int(current["zero_stage"])
    same_world = saved["world_size"] == current["world_size"]
    if same_world and (s0 == s1 or {s0, s1} <= {1, 2}):
        return ResumePlan(NATIVE, f"{what}: same ZeRO shard layout, plain load")
    if s0 == 0 and s1 == 0:
        return ResumePlan(NATIVE, f"{what}: ZeRO-0 keeps the full optimizer state in one file, plain load")
    if s1 == 0:
        return ResumePlan(REFUSE, (
            f"{what}: DeepSpeed cannot load a ZeRO-{s0} checkpoint saved on {saved['world_size']} ranks into "
            f"ZeRO-0 on {current['world_size']} (universal checkpoints need ZeRO >= 1). Keep "
            f"train.zero_stage={s0}{'' if same_world else ' and the rank count'}, or start a new run"))
    if s0 == 0:
        return ResumePlan(FROM_STAGE0, f"{what}: converting the ZeRO-0 checkpoint to a universal checkpoint")
    return ResumePlan(UNIVERSAL, f"{what}: converting to a universal checkpoint (ds_to_universal)")


def _torch():
    import torch

    return torch


def _load(path: Path) -> Any:
    return _torch().load(path, map_location="cpu", weights_only=False)


def convert(src: Path, dst: Path, mode: str, param_names: Sequence[str], workers: int = 1) -> Path:
    """Write the universal form of checkpoint ``src`` to ``dst`` (rank 0 only).

    One worker by default: more makes ds_to_universal fork a process pool from a process that already
    runs the process group's threads (and maybe CUDA), which is not fork-safe."""
    if dst.exists():
        shutil.rmtree(dst)
    if mode == FROM_STAGE0:
        stage0_to_universal(src, dst, param_names)
    else:
        from deepspeed.checkpoint.ds_to_universal import main as ds_to_universal

        # inject_missing_state adds the 'universal_checkpoint_info' entry that Megatron-style clients
        # write themselves; strict keeps DeepSpeed's consistency checks on.
        ds_to_universal(argparse.Namespace(
            input_folder=str(src), output_folder=str(dst), num_extract_workers=workers,
            num_merge_workers=workers, keep_temp_folder=False, strict=True, inject_missing_state=True))
    normalize(dst)
    return dst


def normalize(dst: Path) -> None:
    """Make a universal checkpoint loadable by ZeRO-1/2 *and* ZeRO-3 (see the module docstring)."""
    torch = _torch()
    for have, want in ((_MODEL_STATES, _MODEL_STATES_Z3), (_MODEL_STATES_Z3, _MODEL_STATES)):
        if (dst / have).exists() and not (dst / want).exists():
            shutil.copyfile(dst / have, dst / want)
    zero = dst / "zero"
    state_path = zero / "optimizer_state.pt"
    sd = _load(state_path)
    param_dirs = [p for p in zero.iterdir() if p.is_dir()]
    if "optimizer_state_dict" in sd:
        step = sd["optimizer_state_dict"]["state"][0]["step"]
    else:
        steps = [p / "step.pt" for p in param_dirs if (p / "step.pt").exists()]
        step = _load(steps[0]) if steps else torch.tensor(0.0)
        sd["optimizer_state_dict"] = {"state": {0: {"step": step}}, "param_groups": sd["param_groups"]}
    if "ds_version" not in sd:
        import deepspeed

        sd["ds_version"] = deepspeed.__version__
    torch.save(sd, state_path)
    # ZeRO-3's conversion stores each state as a bare flat tensor; ZeRO-1/2 expect {"param": tensor}
    # in the parameter's shape (ZeRO-3 accepts both, it flattens anyway).
    shapes: Dict[str, Any] = {}
    for group in _load(dst / _MODEL_STATES).get("param_shapes") or []:
        shapes.update(group)
    for p in param_dirs:
        if not (p / "step.pt").exists():
            torch.save(step, p / "step.pt")
        for key in ("fp32", "exp_avg", "exp_avg_sq"):
            value = _load(p / f"{key}.pt") if (p / f"{key}.pt").exists() else None
            if torch.is_tensor(value) and p.name in shapes:
                torch.save({"param": value.view(shapes[p.name])}, p / f"{key}.pt")


def stage0_to_universal(src: Path, dst: Path, param_names: Sequence[str]) -> None:
    """Universal layout from a ZeRO-0 checkpoint: fp32 master weights and Adam moments per parameter.

    BF16/FP16 engines keep FP32 masters in the optimizer (``fp32_groups``, or ``fp32_groups_flat`` for
    the fused FP16 optimizer) with the torch optimizer state under ``optimizer_state_dict``; FP32
    engines have a plain torch optimizer state and the weights in ``module``."""
    torch = _torch()
    states = _load(src / _MODEL_STATES)
    opt = states["optimizer"]
    module = states["module"]
    inner = opt.get("optimizer_state_dict", opt)
    order: List[int] = [i for group in inner["param_groups"] for i in group["params"]]
    if "fp32_groups" in opt:
        masters = [t for group in opt["fp32_groups"] for t in group]
    elif "fp32_groups_flat" in opt:
        flat = torch.cat([t.view(-1) for t in opt["fp32_groups_flat"]])
        masters, offset = [], 0
        for name in param_names:
            n = module[name].numel()
            masters.append(flat[offset:offset + n].view(module[name].shape))
            offset += n
    else:
        masters = [module[name] for name in param_names]
    if not (len(order) == len(masters) == len(param_names)):
        raise RuntimeError(f"ZeRO-0 checkpoint {src}: {len(order)} optimizer entries, {len(masters)} weights, "
                           f"{len(param_names)} model parameters; cannot convert")
    zero = dst / "zero"
    step = torch.tensor(0.0)
    for index, name, master in zip(order, param_names, masters):
        folder = zero / name
        folder.mkdir(parents=True, exist_ok=True)
        torch.save({"param": master.detach().float().clone()}, folder / "fp32.pt")
        state = inner["state"].get(index, {})
        for key in ("exp_avg", "exp_avg_sq"):
            value = state.get(key, torch.zeros_like(master, dtype=torch.float32))
            torch.save({"param": value.float().clone()}, folder / f"{key}.pt")
        step = torch.as_tensor(state.get("step", step), dtype=torch.float32)
        torch.save(step, folder / "step.pt")
    import deepspeed

    groups = [{k: v for k, v in g.items()} for g in inner["param_groups"]]
    torch.save({"param_groups": groups, "ds_version": deepspeed.__version__,
                "optimizer_state_dict": {"state": {0: {"step": step}}, "param_groups": groups}},
               zero / "optimizer_state.pt")
    shutil.copyfile(src / _MODEL_STATES, dst / _MODEL_STATES)

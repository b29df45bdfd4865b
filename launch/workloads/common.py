"""Small helpers shared by the workloads."""
from __future__ import annotations

import contextlib
from typing import Callable, Iterator, TypeVar

import torch

M = TypeVar("M", bound=torch.nn.Module)


def seeded_module(seed: int, build: Callable[[], M]) -> M:
    """Build a module from ``seed`` alone, without touching the caller's global RNG state.

    Models are always built on the CPU, so the initial weights are the same whatever device the run
    uses later (a run can move between CPU and GPU nodes and still start from the same model)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def param_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype the model computes in (the engine may have cast it to BF16/FP16)."""
    for param in model.parameters():
        return param.dtype
    return torch.float32


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """``model.eval()`` and no_grad for the block, then the previous training mode again."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)

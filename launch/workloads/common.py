"""What the workloads share: the :class:`Workload` protocol the engine talks to, and small helpers."""
from __future__ import annotations

import contextlib
from typing import Callable, Dict, Iterator, Protocol, TypeVar, runtime_checkable

import torch

M = TypeVar("M", bound=torch.nn.Module)


@runtime_checkable
class Workload(Protocol):
    model: torch.nn.Module
    """Fresh model, deterministic given cfg.train.seed."""

    tokens_per_sample: int
    """Tokens in one sample, for tokens/s: gpt seq_len, classifier 1."""

    def batch(self, start: int, count: int) -> Dict[str, torch.Tensor]:
        """Samples start .. start+count-1 of the deterministic global sample stream."""
        ...

    def loss(self, model: torch.nn.Module, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        """Scalar mean training loss (class weights / MixUp included as configured)."""
        ...

    def evaluate(self, model: torch.nn.Module) -> Dict[str, float]:
        """Held-out metrics, e.g. {"eval/loss": ...}."""
        ...


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

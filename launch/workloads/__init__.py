"""Workloads: a model plus its deterministic data stream, loss and evaluation.

The engine (``launch/engine.py``) only talks to the :class:`Workload` protocol:

* ``model`` is a plain ``nn.Module`` built on the CPU from ``cfg.train.seed`` alone; the engine wraps
  it with ``deepspeed.initialize`` and passes the engine back into ``loss``/``evaluate``.
* ``batch(start, count)`` returns samples ``start .. start+count-1`` of an infinite global sample
  stream that depends only on the seed and the data settings. Rank ``r`` at micro-step ``m`` of
  optimizer step ``s`` asks for ``start = s*G + (m*world + r)*mbs`` with ``G = mbs*accum*world``, so an
  optimizer step always consumes samples ``s*G .. (s+1)*G-1`` whatever the split; a resume with another
  micro-batch size, accumulation or world size sees the same data. Tensors are returned on the CPU;
  the engine moves them to its device.
* ``loss(model, batch)`` is the scalar mean training loss, computed in FP32 whatever the model dtype.
* ``evaluate(model)`` returns held-out metrics named ``eval/...``; deterministic, no_grad, and it
  restores the model's training mode.
"""
from __future__ import annotations

from typing import Dict, Protocol, runtime_checkable

import torch


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


def build_workload(cfg, device: torch.device | str = "cpu") -> Workload:
    """The workload named by ``cfg.train.workload``: ``gpt``, ``classifier`` or ``package.module:callable``
    (your own, resolved and checked by ``launch/workloads/user.py``; raises its WorkloadError).

    ``device`` is where ``evaluate`` puts its held-out tensors (the engine's device); the model itself
    is always built on the CPU and moved by the engine."""
    name = cfg.train.workload
    if name == "gpt":
        from launch.workloads.gpt import GPTWorkload

        return GPTWorkload(cfg, device)
    if name == "classifier":
        from launch.workloads.classifier import ClassifierWorkload

        return ClassifierWorkload(cfg, device)
    from launch.workloads.user import build_user_workload

    return build_user_workload(str(name), cfg, device)

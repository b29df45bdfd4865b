"""Which workload a run trains: ``train.workload`` -> a :class:`~launch.workloads.common.Workload`."""
from __future__ import annotations

import torch

from launch.workloads.common import Workload


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

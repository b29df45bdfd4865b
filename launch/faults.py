"""Fault injection from ``cfg.faults`` (tests and chaos runs; everything is off by default).

Steps are 1-based optimizer steps ("step N" is the N-th update), as in the logs and TensorBoard. A
fault fires when that step runs, so after a resume from a checkpoint past it, it does not fire again,
while a resume from before it replays it, like a deterministic bug would.

Every fault prints one ``[hpc_agent] fault: ...`` line before it acts, so a log shows injected faults
apart from real ones. ``host_alloc_mb`` allocates on rank 0 only, so the number is the total.
"""
from __future__ import annotations

import os
import time
from typing import Any, List, Set

_HELD: List[bytearray] = []  # keeps the injected host allocation alive until the process dies
_NAN_FIRED: Set[int] = set()  # steps whose injected NaN has fired in this process
_SPIKE_FIRED: Set[int] = set()  # steps whose injected gradient spike has fired in this process
_OOM_FIRED: Set[int] = set()  # steps whose injected one-off out-of-memory error has fired in this process
GRAD_SPIKE_FACTOR = 1e4


class Faults:
    def __init__(self, faults_cfg: Any, micro_batch_size: int, rank: int, attempt: int = 0):
        self.cfg = faults_cfg
        self.micro_batch_size = micro_batch_size
        self.rank = rank
        # faults.first_attempt_only: a later attempt (requeue or resubmission) runs fault-free.
        self.armed = attempt == 0 or not getattr(faults_cfg, "first_attempt_only", True)
        # The simulated GPU of the partition the job runs in (faults.gpu_memory_gib[_by_partition]).
        simulated = getattr(faults_cfg, "simulated_gpu_gib", None)
        self.simulated_gib = float(simulated(os.environ.get("SLURM_JOB_PARTITION")) if simulated else
                                   getattr(faults_cfg, "gpu_memory_gib", 0) or 0)

    def _say(self, text: str) -> None:
        print(f"[hpc_agent] fault: {text} (rank {self.rank})", flush=True)

    def install(self, model: Any, estimate_bytes: int = 0) -> None:
        """Arm the out-of-memory faults: a forward pre-hook, so the error is raised inside forward.

        ``estimate_bytes`` is hpc_agent.policy.memory's per-GPU estimate for this config, compared with the
        simulated ``faults.gpu_memory_gib`` (armed in every attempt: it stands for the hardware)."""
        limit = self.cfg.oom_above_micro_batch
        if self.armed and limit and self.micro_batch_size > limit:
            model.register_forward_pre_hook(self._oom)
        capacity = self.simulated_gib
        if capacity and estimate_bytes > capacity * 2**30:
            self._estimate_gib = estimate_bytes / 2**30
            model.register_forward_pre_hook(self._oom_capacity)

    def _oom_capacity(self, module: Any, args: Any) -> None:
        import torch

        if not torch.is_grad_enabled():
            return
        capacity, need = self.simulated_gib, self._estimate_gib
        self._say(f"out of memory in forward: estimated {need * 1024:.2f} MiB per GPU > "
                  f"faults.gpu_memory_gib={capacity:g}")
        # The wording follows the CUDA caching allocator's message, "total capacity" included: the
        # watcher reads the capacity from it to pick the first OOM-ladder rung that fits.
        # CUDA prints GiB with two decimals; the tiny simulated GPUs of the tests need MiB to stay exact.
        cap = f"{capacity:.2f} GiB" if capacity >= 1 else f"{capacity * 1024:.2f} MiB"
        raise torch.OutOfMemoryError(
            f"CUDA out of memory. Tried to allocate {max(need - capacity, 0) * 1024:.2f} MiB. GPU 0 has a total "
            f"capacity of {cap} of which 0 bytes is free. (injected: estimated {need * 1024:.2f} MiB per "
            f"GPU > faults.gpu_memory_gib {capacity:g})")

    def _oom(self, module: Any, args: Any) -> None:
        import torch

        if not torch.is_grad_enabled():  # evaluation runs its own batch size: only training OOMs
            return
        limit = self.cfg.oom_above_micro_batch
        self._say(f"out of memory in forward: train.micro_batch_size={self.micro_batch_size} > "
                  f"faults.oom_above_micro_batch={limit}")
        # torch.OutOfMemoryError is what the CUDA caching allocator raises; it can be constructed on
        # CPU builds too, and its text is the one log-based diagnosis looks for.
        raise torch.OutOfMemoryError(
            f"CUDA out of memory. Tried to allocate 2.00 GiB (injected: micro_batch_size "
            f"{self.micro_batch_size} > faults.oom_above_micro_batch {limit})")

    def before_step(self, step: int) -> None:
        cfg = self.cfg
        if not self.armed:
            return
        if cfg.host_alloc_mb and step == cfg.host_alloc_step and self.rank == 0:
            self._say(f"allocating and touching {cfg.host_alloc_mb} MB of host memory at step {step}")
            block = bytearray(cfg.host_alloc_mb * 2**20)
            for offset in range(0, len(block), 4096):  # touch every page so it is really resident
                block[offset] = 1
            _HELD.append(block)
        if cfg.error_at_step and step == cfg.error_at_step:
            self._say(f"raising an error (a code bug) at step {step}")
            raise RuntimeError(f"injected code bug at step {step} (faults.error_at_step)")
        if cfg.hang_at_step and step == cfg.hang_at_step:
            self._say(f"hanging at step {step}: no further progress")
            while True:  # like a stuck collective: signals are recorded but never acted on
                time.sleep(1)

    def loss(self, step: int, loss: Any) -> Any:
        # Once per process (transient faults): an in-job repair that replays the step must not meet them again.
        oom_at = getattr(self.cfg, "oom_at_step", 0)
        if self.armed and oom_at and step == oom_at and step not in _OOM_FIRED:
            import torch

            _OOM_FIRED.add(step)
            self._say(f"out of memory in forward at step {step}")
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate 2.00 GiB (injected: "
                                         f"faults.oom_at_step {step})")
        if self.armed and self.cfg.nan_at_step and step == self.cfg.nan_at_step and step not in _NAN_FIRED:
            _NAN_FIRED.add(step)
            self._say(f"making the loss NaN at step {step}")
            return loss * float("nan")
        spike = getattr(self.cfg, "grad_spike_at_step", 0)
        if self.armed and spike and step == spike and step not in _SPIKE_FIRED:
            _SPIKE_FIRED.add(step)
            self._say(f"scaling the gradient by {GRAD_SPIKE_FACTOR:g} at step {step} (a gradient spike)")
            # The same value (the loss detector sees nothing), GRAD_SPIKE_FACTOR x its gradient.
            return loss + (GRAD_SPIKE_FACTOR - 1.0) * (loss - loss.detach())
        return loss

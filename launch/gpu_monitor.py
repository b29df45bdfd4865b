"""GPU health inside the job: at the start and every ``train.gpu_health_every`` steps.

Local rank 0 of each node reads the node's GPUs through NVML (``hpc_agent.diagnosis.gpu_health``), logs the readings
to TensorBoard and judges them. The worst verdict is agreed on by all ranks (one all-reduce), so on
CRITICAL every rank stops together with ``EXIT_GPU_HEALTH_CRITICAL`` and the watcher can exclude the node
and resubmit. No checkpoint is written then: a GPU with uncorrectable memory errors may already have
corrupted the state, and the last complete checkpoint is the safe point to resume from.

Without an NVIDIA driver anywhere (this CPU cluster) the first check says so once and the checks stop;
``faults.gpu_critical_at_step`` feeds simulated readings instead, so the whole path runs without a GPU.
"""
from __future__ import annotations

import os
import socket
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from hpc_agent.diagnosis import gpu_health

NO_GPU_LEVEL = -1
LEVELS = {gpu_health.OK: 0, gpu_health.WARN: 1, gpu_health.CRITICAL: 2, gpu_health.NO_GPU: NO_GPU_LEVEL}

Reader = Callable[[], Tuple[List[gpu_health.GpuReading], Optional[str]]]


def simulated_reader(critical_at_step: int, current_step: Callable[[], int]) -> Reader:
    """One healthy simulated GPU that reports uncorrectable ECC errors from ``critical_at_step`` on."""
    def read() -> Tuple[List[gpu_health.GpuReading], Optional[str]]:
        bad = current_step() >= critical_at_step
        return [gpu_health.GpuReading(0, "simulated GPU (faults.gpu_critical_at_step)", 55.0, 1000.0, 81920.0, 150.0,
                                      700.0, 90.0, 2 if bad else 0, 0, False, 0, False)], None
    return read


def scalars_of(readings: Sequence[gpu_health.GpuReading], level: int) -> Dict[str, float]:
    """TensorBoard values ``gpu_health/gpu<i>/<metric>`` plus ``gpu_health/level`` (0 OK, 1 WARN, 2 CRITICAL)."""
    values: Dict[str, float] = {"gpu_health/level": float(level)}
    for r in readings:
        for name in ("temperature_c", "memory_used_mb", "power_w", "utilization_pct", "ecc_uncorrected_volatile",
                     "ecc_corrected_volatile", "retired_pages_count"):
            value = getattr(r, name)
            if value is not None:
                values[f"gpu_health/gpu{r.index}/{name}"] = float(value)
    return values


class GpuHealthMonitor:
    def __init__(self, every: int, local_rank: int, reader: Optional[Reader] = None, host: str = ""):
        self.every = int(every)
        self.local_rank = local_rank
        self.reader = reader or gpu_health.read_gpus
        # Slurm's node name, which the watcher puts into slurm.exclude (several slurmd may share one host).
        self.host = host or os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        self.enabled = self.every > 0
        self.simulated = reader is not None

    def due(self, step: int, first: bool = False) -> bool:
        """Same answer on every rank (the caller then runs a collective)."""
        return self.enabled and (first or step % self.every == 0)

    def read(self) -> Tuple[int, Dict[str, float], List[str]]:
        """``(level, TensorBoard values, reasons)`` on local rank 0; other ranks report OK and nothing."""
        if self.local_rank != 0:
            return 0, {}, []
        readings, error = self.reader()
        verdict = gpu_health.judge_all(readings, error)
        level = LEVELS[verdict.level]
        return level, (scalars_of(readings, level) if readings else {}), list(verdict.reasons)

    def conclude(self, worst: int, reasons: Sequence[str]) -> Optional[str]:
        """After the all-reduce: a line to print (rank 0 of the node) and whether to stop; disables itself
        when no rank has a GPU."""
        if worst == NO_GPU_LEVEL:
            self.enabled = False
            return f"GPU health: no NVIDIA GPU ({'; '.join(reasons) or 'no driver'}); checks off" \
                if self.local_rank == 0 else None
        if worst >= LEVELS[gpu_health.CRITICAL] and reasons:
            return f"GPU health CRITICAL on {self.host}: {'; '.join(reasons)}"
        if reasons and self.local_rank == 0:
            return f"GPU health {'WARN' if worst == 1 else 'note'} on {self.host}: {'; '.join(reasons)}"
        return None

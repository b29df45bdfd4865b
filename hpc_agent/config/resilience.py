"""The ``resilience:`` section: heartbeat, hang detection, in-job recovery and snapshots.

One home for the numbers that decide when a live job counts as stuck and what the job may repair by
itself. The defaults follow NVIDIA resiliency-ext's measured sections (set-up, step, checkpointing)
scaled to a toolkit whose verdict must come well before PyTorch's NCCL watchdog (480-600 s): a run
whose steps take seconds is called hung after ``hang_floor_s`` of silence, one whose steps take
minutes after ``hang_factor`` x its recent median step time.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List

from hpc_agent.config.checks import raise_if
from hpc_agent.config.problems import Problem


@dataclass
class ResilienceConfig:
    """How the job reports progress, when the watcher calls it hung, and what the job repairs in place."""

    heartbeat_s: float = 5.0
    """Seconds between heartbeat writes (``heartbeat/`` in the run directory: step, phase, time). A thread
    writes them, so a stuck main thread shows as a heartbeat whose step stops moving."""

    hang_factor: float = 5.0
    """A training run is hung after ``max(hang_factor x median recent step time, hang_floor_s)`` seconds
    without a new step."""

    hang_floor_s: float = 120.0
    """The shortest silence (s) that counts as a hang while training, whatever the step time."""

    hang_warmup_steps: int = 5
    """Steps of each attempt left out of the median step time (the first steps are slow: compilation,
    allocator warm-up, ``torch.compile``); until then the start-up budget applies."""

    startup_budget_s: float = 600.0
    """Seconds an attempt may take from its start to its first completed step (imports, rendezvous,
    checkpoint load, first step) before it counts as a start-up stall."""

    save_budget_s: float = 600.0
    """Seconds one checkpoint save may take before it counts as a stall in saving."""

    eval_budget_s: float = 900.0
    """Seconds one evaluation may take before it counts as a stall."""

    stack_wait_s: float = 10.0
    """After calling a run hung, how long the watcher waits for the ranks' Python stacks (asked for with a
    signal) before it cancels the attempt anyway."""

    in_job_retries: int = 2
    """Faults the job repairs inside its allocation (GPU OOM: next OOM-ladder rung; NaN/inf loss, loss-scale
    collapse, loss spike: roll back with a lower LR) before it exits and leaves the fault to the watcher.
    0 turns in-job recovery off."""

    snapshot_every: int = 0
    """Take an asynchronous snapshot (host copy, background write) every N optimizer steps, so a hard kill
    loses at most N steps; 0 turns snapshots off. Full checkpoints still follow ``train.ckpt_every``,
    and with snapshots on they are written the same way (a host copy, then the background write).
    A snapshot is a complete checkpoint in ``checkpoints/snap_<step>/`` (only the newest is kept). From
    the first snapshot on, each rank keeps a second host-memory copy of its state, which every later
    snapshot copies into (the same peak as a fresh copy each time, and the loop held ~4x less on a large
    state); a due snapshot is skipped if the previous one is still being written (launch/snapshot.py)."""

    successor_on_preempt: bool = True
    """On Slurm's preemption notice or time-limit warning (the ``--signal=USR2`` hpc_agent asks for, its reason read
    from Slurm: ``PreemptTime``, or the time left), after its checkpoint, the job submits its own successor (the
    same job script, held until submitit's pickle is copied under the new job id), releases it, then requeues
    itself *held*. A requeue's completion makes Slurm schedule at once, but the requeued job itself only becomes
    eligible after its 121 s begin delay; a successor that is already queued is started in that very pass, beside
    the preempting job (``scripts/bench/handover.py``: 0.97 s vs 3.94 s from the preemption under Slurm's default
    scheduler settings). The successor cancels the held job as it starts, so nothing is left in the queue, with
    or without a watcher; the run goes on under the new job id (``status``, ``review`` and ``hpc-agent cancel``
    follow the chain). A hand-over that fails is rolled back (the successor cancelled and seen gone) and the job
    requeues itself as with ``false``; a SIGUSR2 from anyone else is a checkpoint request, never a hand-over;
    the kill switch stops it. Job arrays (sweeps) keep the plain requeue. Needs ``sbatch``, ``scontrol``,
    ``squeue`` and ``scancel`` on the compute nodes (docs/resilience.md)."""

    def problems(self) -> List[Problem]:
        problems: List[Problem] = []
        for name in ("heartbeat_s", "hang_factor", "hang_floor_s", "startup_budget_s", "save_budget_s",
                     "eval_budget_s", "stack_wait_s"):
            value = getattr(self, name)
            if value is None or not value > 0:
                problems.append(Problem(f"resilience.{name}", value, "a positive number of seconds"
                                        if name.endswith("_s") else "a positive number"))
        for name in ("hang_warmup_steps", "in_job_retries", "snapshot_every"):
            value = getattr(self, name)
            if value is None or value < 0:
                problems.append(Problem(f"resilience.{name}", value, "0 or more"))
        if not problems and self.heartbeat_s * 3 > self.hang_floor_s:
            problems.append(Problem("resilience.hang_floor_s", self.hang_floor_s,
                                    f"at least 3 x resilience.heartbeat_s ({3 * self.heartbeat_s:g}): a hang "
                                    "must outlast a few heartbeats to be seen; or lower resilience.heartbeat_s"))
        return problems

    def __post_init__(self) -> None:
        raise_if(self.problems())

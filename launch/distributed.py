"""Who am I in the job (rank, world, master address), and the process group.

Sources, first match wins:

1. submitit's job environment (the normal path: ``TrainingJob`` under ``SlurmExecutor`` or
   ``LocalExecutor``): ``submitit.helpers.TorchDistributedEnvironment`` gives rank, world, local rank
   and the first host of the job as master; the port is ours (``job_port``), see below.
2. torchrun-style variables (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``): tests and
   hand-launched multi-process runs.
3. Plain Slurm variables (``srun python -m launch.train`` without submitit).
4. Nothing: a single process; a 1-rank group on 127.0.0.1 with a free port, so the same DeepSpeed
   code path (ZeRO, checkpoints) runs everywhere.

The rendezvous port (rank 0's TCPStore listens on it). submitit would hash the job id into 20000-60000,
which mostly lies in Linux's ephemeral range (32768-60999 by default): the kernel hands those ports out as
the local end of every outgoing connection (srun I/O, slurmd and slurmctld RPCs, other jobs' gloo pairs),
and a closed one stays taken for a minute in TIME_WAIT. Measured on the localhost cluster: a sweep trial
(array task 518_1) died at init with EADDRINUSE on its hashed port 46758. So a one-rank job takes a port
the kernel says is free now, and a multi-rank job (whose ranks must agree without talking) hashes its job
id into 20000-32767, below the ephemeral range, where only another job's listener can be, never an
outgoing connection. ``MASTER_PORT`` in the environment still wins.

Backend: NCCL on CUDA, gloo on the CPU. We pass it explicitly: DeepSpeed's CPU accelerator would
pick oneCCL when ``oneccl_bindings_for_pytorch`` happens to be installed.
"""
from __future__ import annotations

import datetime as _dt
import os
import socket
import zlib
from dataclasses import dataclass
from typing import Any, List, Mapping, Optional


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    source: str

    def describe(self) -> str:
        return (f"rank {self.rank}/{self.world_size} (local {self.local_rank}) master "
                f"{self.master_addr}:{self.master_port} from {self.source}")


# Fixed, not read from this node's ip_local_port_range: every node of a job must compute the same port.
JOB_PORTS = (20000, 32767)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def job_port(job_id: str, world_size: int, environ: Mapping[str, str] = os.environ) -> int:
    """The rendezvous port (module docstring): ``MASTER_PORT`` if set; a free one for a single rank; else
    the job id hashed below the ephemeral range (the same on every rank and after a requeue)."""
    if environ.get("MASTER_PORT"):
        return int(environ["MASTER_PORT"])
    if world_size == 1:
        return free_port()
    low, high = JOB_PORTS
    return low + zlib.crc32(str(job_id).encode()) % (high - low + 1)


def _from_submitit() -> Optional[DistEnv]:
    try:
        import submitit
        from submitit.helpers import TorchDistributedEnvironment

        job = submitit.JobEnvironment()  # raises RuntimeError outside a submitit job
        env = TorchDistributedEnvironment()
    except (ImportError, RuntimeError):
        return None
    return DistEnv(env.rank, env.world_size, env.local_rank, env.master_addr,
                   job_port(job.job_id, env.world_size), "submitit")


def _slurm_master(environ: Mapping[str, str]) -> str:
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST") or ""
    if not nodelist:
        return "127.0.0.1"
    from submitit.slurm.slurm import _parse_node_list  # handles node[01-04,07] forms

    return _parse_node_list(nodelist)[0]


def detect(environ: Mapping[str, str] = os.environ, use_submitit: bool = True) -> DistEnv:
    """The rank layout of this process (see the module docstring for the order)."""
    if use_submitit:
        found = _from_submitit()
        if found is not None:
            return found
    if "RANK" in environ and "WORLD_SIZE" in environ and "MASTER_ADDR" in environ:
        return DistEnv(int(environ["RANK"]), int(environ["WORLD_SIZE"]), int(environ.get("LOCAL_RANK", 0)),
                       environ["MASTER_ADDR"], int(environ.get("MASTER_PORT", 29500)), "torchrun variables")
    if "SLURM_PROCID" in environ and "SLURM_NTASKS" in environ:
        ntasks = int(environ["SLURM_NTASKS"])
        return DistEnv(int(environ["SLURM_PROCID"]), ntasks, int(environ.get("SLURM_LOCALID", 0)),
                       _slurm_master(environ), job_port(environ.get("SLURM_JOB_ID", "0"), ntasks, environ),
                       "Slurm variables")
    return DistEnv(0, 1, 0, "127.0.0.1", int(environ.get("MASTER_PORT", 0)) or free_port(), "single process")


def init(env: DistEnv, on_cuda: bool, timeout_s: float = 600.0) -> str:
    """Export the env:// variables and initialise the process group through DeepSpeed."""
    import deepspeed
    import torch

    from launch.ops import install_guard

    # Before DeepSpeed's communication init, which loads (or would compile) its CPU comm op: from here on
    # an op that was not prepared ends the job at once (launch/ops.py) instead of compiling inside it.
    install_guard(log=lambda line: print(line, flush=True))
    os.environ.update({"RANK": str(env.rank), "WORLD_SIZE": str(env.world_size),
                       "LOCAL_RANK": str(env.local_rank), "MASTER_ADDR": env.master_addr,
                       "MASTER_PORT": str(env.master_port)})
    backend = "nccl" if on_cuda else "gloo"
    if on_cuda:
        torch.cuda.set_device(env.local_rank)
    # auto_mpi_discovery would probe mpi4py/OMPI variables; our variables are already set.
    deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False, verbose=False,
                               timeout=_dt.timedelta(seconds=timeout_s))
    return backend


class Collectives:
    """The few collectives the training loop needs, on the right device for the backend.

    A one-process job (``world == 1``) skips the reductions: two per step (the OOM agreement and the loss
    mean) cost about 1 % of a 0.11 s step through gloo (scripts/bench/step_overhead.py)."""

    def __init__(self, device: Any):
        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.device = torch, dist, device
        self._world: Optional[int] = None  # read once the process group exists (the script API builds us early)

    @property
    def single(self) -> bool:
        """One process in the group: every collective is the identity."""
        if self._world is None and self.dist.is_available() and self.dist.is_initialized():
            self._world = self.dist.get_world_size()
        return self._world == 1

    def barrier(self) -> None:
        self.dist.barrier()

    def max_int(self, value: int) -> int:
        if self.single:
            return int(value)
        t = self.torch.tensor([int(value)], dtype=self.torch.int64, device=self.device)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return int(t.item())

    def mean(self, value: float) -> float:
        if self.single:
            return float(value)
        t = self.torch.tensor([float(value)], dtype=self.torch.float64, device=self.device)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.SUM)
        return float(t.item()) / self.dist.get_world_size()

    def gather_objects(self, obj: Any) -> List[Any]:
        if self.single:
            return [obj]
        out: List[Any] = [None] * self.dist.get_world_size()
        self.dist.all_gather_object(out, obj)
        return out

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        if self.single:
            return obj
        box = [obj]
        self.dist.broadcast_object_list(box, src=src)
        return box[0]


def shutdown() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()

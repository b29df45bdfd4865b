"""Training entry point, one process per task of the srun step: parse, build, train, close.

Minimal version: a tiny model trained for ``train.max_steps`` steps, logging to TensorBoard.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def _rank() -> tuple[int, int]:
    """(rank, world size) from submitit's job environment, falling back to plain Slurm variables."""
    try:
        import submitit

        env = submitit.JobEnvironment()
        return env.global_rank, env.num_tasks
    except RuntimeError:  # not inside a submitit job (e.g. run by hand)
        return int(os.environ.get("SLURM_PROCID", 0)), int(os.environ.get("SLURM_NTASKS", 1))


def main(config_path: str, run_dir: str) -> int:
    import torch
    from torch.utils.tensorboard import SummaryWriter

    from hpc_agent.config.load import load_snapshot

    cfg = load_snapshot(config_path)
    rank, world = _rank()
    torch.manual_seed(cfg.train.seed)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr)
    writer = SummaryWriter(str(Path(run_dir) / "tb")) if rank == 0 else None
    print(f"[rank {rank}/{world}] host={os.uname().nodename} job={os.environ.get('SLURM_JOB_ID', 'local')} "
          f"training {cfg.train.workload} for {cfg.train.max_steps} steps", flush=True)
    target = torch.randn(16, 1)
    for step in range(1, cfg.train.max_steps + 1):
        t0 = time.perf_counter()
        x = torch.randn(cfg.train.micro_batch_size, 16)
        loss = torch.nn.functional.mse_loss(model(x), x @ target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if writer is not None and step % cfg.train.log_every == 0:
            writer.add_scalar("train/loss", loss.item(), step)
            writer.add_scalar("perf/step_time_s", time.perf_counter() - t0, step)
        print(f"[rank {rank}] step {step} loss {loss.item():.4f}", flush=True)
    if writer is not None:
        writer.close()
    print(f"[rank {rank}] done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))

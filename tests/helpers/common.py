"""Shared test helpers: config snapshots, running ``launch.train`` in subprocesses, reading logs/TB."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from hpc_agent.config.load import build_config, to_yaml

RUNNER = Path(__file__).resolve().parent / "runner.py"
REPO = Path(__file__).resolve().parent.parent.parent

TINY = {
    "train": {"workload": "gpt", "max_steps": 6, "micro_batch_size": 4, "grad_accum_steps": 1, "lr": 1e-3,
              "warmup_steps": 2, "precision": "fp32", "zero_stage": 1, "ckpt_every": 3, "eval_every": 0},
    "model": {"n_layers": 2, "d_model": 32, "n_heads": 2, "seq_len": 32},
}


def merge(base: Dict, extra: Dict) -> Dict:
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    for key, value in extra.items():
        if isinstance(value, dict):
            out[key] = merge(out.get(key, {}), value)
        else:
            out[key] = value
    return out


def snapshot(path: Path, **sections: Dict) -> Path:
    """Write a resolved config snapshot (like submit does) from TINY plus ``sections`` overrides."""
    cfg = build_config([merge(TINY, sections)])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(to_yaml(cfg))
    return path


def env_for(rank: int = 0, world: int = 1, port: Optional[int] = None) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SUBMITIT_"))}
    # The repo first, then whatever PYTHONPATH already holds (a GPU machine may carry packages there).
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONPATH": path})
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        env.pop(key, None)
    if world > 1:
        env.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    return env


def start(config: Path, run_dir: Path, rank: int = 0, world: int = 1, port: Optional[int] = None,
          log: Optional[Path] = None, env_extra: Optional[Dict[str, str]] = None) -> subprocess.Popen:
    log = log or run_dir.parent / f"{run_dir.name}.rank{rank}.{time.monotonic_ns()}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    handle = open(log, "w")
    proc = subprocess.Popen([sys.executable, str(RUNNER), str(config), str(run_dir)], cwd=str(REPO),
                            env={**env_for(rank, world, port), **(env_extra or {})}, stdout=handle, stderr=subprocess.STDOUT)
    proc.log_path = log  # type: ignore[attr-defined]
    return proc


def run(config: Path, run_dir: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    proc = start(config, run_dir)
    proc.wait(timeout=timeout)
    out = Path(proc.log_path).read_text()  # type: ignore[attr-defined]
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


def run_ranks(config: Path, run_dir: Path, world: int, timeout: float = 240) -> List[subprocess.CompletedProcess]:
    from launch.distributed import free_port

    port = free_port()
    procs = [start(config, run_dir, r, world, port) for r in range(world)]
    results = []
    for proc in procs:
        proc.wait(timeout=timeout)
        results.append(subprocess.CompletedProcess(proc.args, proc.returncode,
                                                   Path(proc.log_path).read_text(), ""))  # type: ignore[attr-defined]
    return results


def losses(output: str) -> Dict[int, float]:
    """Step -> loss from the ``[hpc_agent] step N loss X`` lines."""
    return {int(m.group(1)): float(m.group(2)) for m in re.finditer(r"\] step (\d+) loss (\S+)", output)}


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"process exited with {proc.returncode} before {path} appeared:\n"
                                 + Path(proc.log_path).read_text()[-3000:])  # type: ignore[attr-defined]
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"timed out waiting for {path}")
        time.sleep(0.05)


def tb_scalars(run_dir: Path, tag: str) -> Dict[int, float]:
    """What TensorBoard shows for ``tag`` (all event files of the run, restarts purged)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    if tag not in acc.Tags().get("scalars", []):
        return {}
    return {e.step: e.value for e in acc.Scalars(tag)}


def expect(result: subprocess.CompletedProcess, code: int, *needles: Sequence[str]) -> None:
    assert result.returncode == code, f"exit {result.returncode}, expected {code}:\n{result.stdout[-4000:]}"
    for needle in needles:
        assert needle in result.stdout, f"{needle!r} not in output:\n{result.stdout[-4000:]}"


def wait_for_snapshot(run_dir: Path, at_least: int, proc: subprocess.Popen, timeout: float = 120) -> str:
    """Wait until a resume would take a complete snapshot (launch/snapshot.py) of step ``at_least`` or
    later; returns its name."""
    from hpc_agent.core.checkpoint_format import is_snapshot, scan, select

    deadline = time.monotonic() + timeout
    root = run_dir / "checkpoints"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"process exited with {proc.returncode} before a snapshot:\n"
                                 + Path(proc.log_path).read_text()[-3000:])  # type: ignore[attr-defined]
        chosen = select(scan(root)).chosen if root.is_dir() else None
        if chosen is not None and is_snapshot(chosen.name) and chosen.step >= at_least:
            return chosen.name
        time.sleep(0.01)
    proc.kill()
    raise AssertionError(f"no complete snapshot of step >= {at_least} within {timeout}s")

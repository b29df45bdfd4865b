"""How each fault is provoked on the cluster (the imperative half of the chaos driver).

Slurm is driven through :class:`hpc_agent.slurm.cli.SlurmCLI`; the node and slurmctld faults go
through ``scripts/cluster.sh`` (the localhost cluster's own kill-node/start-node/up commands).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from hpc_agent.core.fsutil import atomic_write_json
from hpc_agent.slurm.cli import SlurmCLI, SlurmError

REPO = Path(__file__).resolve().parents[2]
CLUSTER_SH = REPO / "scripts" / "cluster.sh"
CTLD_PID_FILE = Path("/run/slurm/slurmctld.pid")


def cluster(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(CLUSTER_SH), *args], capture_output=True, text=True, timeout=timeout)


def preempt_all_nodes(slurm: SlurmCLI, seconds: int = 2) -> str:
    """A job in the high partition that needs every CPU of both nodes: Slurm preempts what runs in ``low``."""
    out = slurm.run(["sbatch", "--parsable", "--partition", "high", "--nodes", "2", "--ntasks-per-node", "2",
                     "--job-name", "chaos-preempt", "--output", "/dev/null", "--wrap", f"sleep {seconds}"]).stdout
    return out.strip().split(";")[0]


def preempt_node(slurm: SlurmCLI, node: str, seconds: int) -> str:
    """A job in the high partition that needs every CPU of ``node`` for ``seconds``: Slurm preempts what runs there
    in ``low``, and a preempted 1-node run can come back only on another node meanwhile."""
    out = slurm.run(["sbatch", "--parsable", "--partition", "high", "--nodes", "1", "--nodelist", node,
                     "--exclusive", "--job-name", "chaos-preempt", "--output", "/dev/null",
                     "--wrap", f"sleep {seconds}"]).stdout
    return out.strip().split(";")[0]


def write_trigger(run_dir: Path, kind: str, nonce: str, **extra) -> Path:
    """The run-time trigger the job polls each step (launch/chaos_trigger.py)."""
    return atomic_write_json(Path(run_dir) / "chaos" / "inject.json", {"kind": kind, "nonce": nonce, **extra})


def in_save(run_dir: Path, nonce: str) -> Optional[Dict]:
    """The job's note that it stalls inside a checkpoint save for this nonce, or None."""
    path = Path(run_dir) / "chaos" / "in_save.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if data.get("nonce") == nonce else None


def job_node(slurm: SlurmCLI, job_id: str) -> Optional[str]:
    try:
        out = slurm.run(["squeue", "--noheader", "--jobs", job_id, "--format", "%N"], check=False).stdout.strip()
    except SlurmError:
        return None
    return out.split(",")[0] or None


def run_queue(slurm: SlurmCLI, run_dir: Path) -> Optional[List[Tuple[str, str]]]:
    """``(state, first node)`` of each of the run's jobs in the queue, found by the run's job name (a successor job
    has a new id but the same name: ``job_name_for`` of the run id, its directory's name); None if squeue fails."""
    from hpc_agent.slurm.job_match import job_name_for

    try:
        out = slurm.run(["squeue", "--noheader", "--me", "--name", job_name_for(Path(run_dir).name),
                         "--format", "%T %N"]).stdout
    except SlurmError:
        return None
    return [(parts[0], parts[1].split(",")[0] if len(parts) > 1 else "") for parts in map(str.split, out.splitlines())
            if parts]


def running_node(slurm: SlurmCLI, run_dir: Path) -> Optional[str]:
    """The node of the run's running job (:func:`run_queue`), or None."""
    return next((node for state, node in run_queue(slurm, run_dir) or () if state == "RUNNING" and node), None)


def kill_node(node: str) -> str:
    proc = cluster("kill-node", node, timeout=120)
    return (proc.stdout + proc.stderr).strip().splitlines()[-1:][0] if (proc.stdout + proc.stderr).strip() else ""


def start_node(node: str) -> bool:
    return cluster("start-node", node, timeout=180).returncode == 0


def restart_slurmctld(down_s: float = 10.0) -> str:
    """Stop slurmctld (SIGTERM to the pid in its pid file), leave it down ``down_s``, start it with ``up``."""
    try:
        pid = int(CTLD_PID_FILE.read_text().split()[0])
        os.kill(pid, signal.SIGTERM)
        what = f"slurmctld (pid {pid}) stopped"
    except (OSError, ValueError, IndexError) as exc:
        what = f"could not stop slurmctld ({exc})"
    time.sleep(down_s)
    proc = cluster("up", timeout=300)
    return f"{what}; cluster.sh up exited {proc.returncode}"


class Watcher:
    """``python -m hpc_agent.watch`` for one runs root, in the background, restartable."""

    def __init__(self, root: Path, interval: float = 1.0):
        self.root, self.interval = Path(root), interval
        self.log = self.root / "chaos-watch.log"
        self.proc: Optional[subprocess.Popen] = None
        self.starts: List[float] = []

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        handle = open(self.log, "a")
        self.proc = subprocess.Popen([sys.executable, "-m", "hpc_agent.watch", "--runs-root", str(self.root),
                                      "--interval", str(self.interval)], stdout=handle, stderr=subprocess.STDOUT,
                                     cwd=str(REPO))
        handle.close()
        self.starts.append(time.time())

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def sigkill(self) -> Optional[int]:
        """SIGKILL it (a power cut, the OOM killer); returns the pid it had."""
        if not self.alive():
            return None
        pid = self.proc.pid
        self.proc.kill()
        self.proc.wait(timeout=30)
        return pid

    def stop(self) -> None:
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)

"""Shared fixtures. Tests marked ``slurm`` need the real localhost cluster (scripts/cluster.sh up)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def slurm_ready() -> tuple[bool, str]:
    if shutil.which("sbatch") is None:
        return False, "sbatch is not on PATH"
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"sinfo failed: {exc}"
    states = out.stdout.split()
    if out.returncode != 0 or not any(s.startswith(("idle", "mix", "alloc", "comp")) for s in states):
        return False, f"no usable Slurm nodes (sinfo: {out.stdout.strip() or out.stderr.strip()})"
    return True, ""


@pytest.fixture(autouse=True)
def _slurm_gate(request):
    """``slurm`` tests skip (with the reason) when no cluster runs, and fail when CI requires one."""
    if request.node.get_closest_marker("slurm") is None:
        return
    ready, why = slurm_ready()
    if ready and request.node.get_closest_marker("keeps_jobs") is not None:
        return
    if ready:
        from tests.slurm_helpers import settle_cluster

        leftovers = settle_cluster()
        if leftovers:  # shown with the test's output: which earlier test leaks jobs
            print(f"[conftest] cancelled jobs an earlier test left queued or running:\n{leftovers}", file=sys.stderr)
        return
    if os.environ.get("HPC_AGENT_REQUIRE_SLURM") == "1":
        pytest.fail(f"HPC_AGENT_REQUIRE_SLURM=1 but the localhost Slurm is not ready: {why}")
    pytest.skip(f"needs the localhost Slurm cluster (bash scripts/cluster.sh up): {why}")


@pytest.fixture
def runs_root(tmp_path, monkeypatch):
    root = tmp_path / "runs"
    monkeypatch.setenv("HPC_AGENT_RUNS", str(root))
    return root


@pytest.fixture
def root(tmp_path):
    """A runs root for a real-cluster test; whatever the test left queued or running there is cancelled after."""
    from tests.slurm_helpers import cleanup_jobs

    root = tmp_path / "runs"
    yield root
    cleanup_jobs(root)


def run_cli(*args: str, env: dict | None = None, timeout: float = 600, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m <args>`` as a user would, capturing output."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout,
                          env=full_env, cwd=str(cwd or REPO))

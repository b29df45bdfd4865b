"""submit with the local executor: the laptop path, and what auto picks when Slurm is absent."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from hpc_agent.state.ledger import Ledger
from tests.conftest import run_cli

NO_SLURM_PATH = os.path.dirname(sys.executable)  # python only: no sbatch anywhere on PATH


def _only_run_dir(root: Path) -> Path:
    (run_dir,) = [p for p in root.iterdir() if p.is_dir()]
    return run_dir


def test_auto_without_sbatch_announces_and_runs_local(tmp_path):
    root = tmp_path / "runs"
    proc = run_cli("-m", "hpc_agent.submit", "quickstart", "--wait", f"run.runs_root={root}",
                   env={"PATH": NO_SLURM_PATH})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "executor: local (no sbatch on PATH" in proc.stdout
    assert "finished: COMPLETED" in proc.stdout
    run_dir = _only_run_dir(root)
    info = json.loads((run_dir / "run.json").read_text())
    assert info["executor"] == "local"
    log = Path(info["logs"][0]).read_text()
    assert "step 10 " in log and "done" in log
    assert list((run_dir / "tb").glob("events.out.tfevents.*")), "no TensorBoard event file"
    assert (run_dir / "config.yaml").is_file()
    (sub,) = Ledger.in_runs_root(root).submissions(run_dir.name)
    assert sub.job_id == info["job_ids"][0] and sub.executor == "local"


def test_local_job_outlives_the_submit_command(tmp_path):
    root = tmp_path / "runs"
    proc = run_cli("-m", "hpc_agent.submit", "quickstart", "--executor", "local", f"run.runs_root={root}")
    assert proc.returncode == 0, proc.stderr
    for word in ("run dir:", "job id:", "logs:", "tensorboard:", "next:"):
        assert word in proc.stdout
    log = Path(json.loads((_only_run_dir(root) / "run.json").read_text())["logs"][0])
    deadline = time.time() + 120
    while time.time() < deadline and not (log.exists() and "done" in log.read_text()):
        time.sleep(0.5)
    assert "done" in log.read_text()

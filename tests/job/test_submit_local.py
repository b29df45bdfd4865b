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


# --- issue 44: one record for every executor; --wait shows progress and, on failure, the diagnosis -----------------
def _status_and_review(root: Path) -> tuple[dict, dict]:
    status = run_cli("-m", "hpc_agent.status", "--runs-root", str(root), "--json")
    assert status.returncode == 0, status.stdout + status.stderr
    review = run_cli("-m", "hpc_agent.review", str(root), "--json")
    assert review.returncode == 0, review.stdout + review.stderr
    (line,) = json.loads(status.stdout)["runs"]
    (run,) = json.loads(review.stdout)["runs"]
    return line, run


def test_local_wait_shows_progress_and_the_records_end_completed(tmp_path):
    """Progress while it runs (a line per change and per 10 s when not a TTY), then status and review say
    completed: one attempt, its ETTR from the run's start to its last step (not decaying with the clock)."""
    import re

    root = tmp_path / "runs"
    proc = run_cli("-m", "hpc_agent.submit", "quickstart", "--executor", "local", "--wait", f"run.runs_root={root}",
                   "train.max_steps=300", "train.ckpt_every=300", "resilience.heartbeat_s=1", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert re.search(r"run \S+: job \d+ RUNNING", out), out
    assert re.search(r"run \S+: job \d+ RUNNING, step \d+ of 300 \(\d+%\)", out), out  # from the heartbeats
    assert re.search(r"run \S+: job \d+ finished COMPLETED \(run completed\)", out), out
    assert "finished: COMPLETED" in out and "diagnosis:" not in out
    line, run = _status_and_review(root)
    assert (line["phase"], line["slurm_state"], line["step"]) == ("completed", "COMPLETED (local)", 300)
    assert (run["phase"], run["attempts"], run["causes"]) == ("completed", 1, ["completed"])
    assert run["ettr"] is not None and run["ettr"] > 0, run
    time.sleep(1.1)
    assert _status_and_review(root)[1]["ettr"] == run["ettr"]  # an ended run's ETTR does not decay with the clock


def test_local_gpu_oom_is_repaired_by_the_wait_and_quiet_shows_only_the_result(tmp_path):
    """An injected GPU OOM (no in-job retry): the wait's watcher resubmits it locally with the micro batch halved
    and the accumulation doubled, and it completes. -q: no progress line, the result lines still."""
    root = tmp_path / "runs"
    proc = run_cli("-m", "hpc_agent.submit", "quickstart", "--executor", "local", "--wait", "-q",
                   f"run.runs_root={root}", "train.micro_batch_size=8", "faults.oom_above_micro_batch=4",
                   "resilience.in_job_retries=0", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "finished: COMPLETED" in proc.stdout
    for chatter in ("RUNNING", "[embedded watch]", "[watch ", "last cause"):
        assert chatter not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    line, run = _status_and_review(root)
    assert line["phase"] == "completed" and run["phase"] == "completed"
    assert run["attempts"] == 2 and "gpu_oom" in run["causes"], run
    (decision,) = [d for d in run["decisions"] if d["cause"] == "gpu_oom"]
    assert decision["action"] == "resubmit"
    assert decision["patch"] == {"train.micro_batch_size": 4, "train.grad_accum_steps": 2}
    subs = Ledger.in_runs_root(root).submissions(run["run_id"])
    assert [s.executor for s in subs] == ["local", "local"] and subs[0].job_id != subs[1].job_id


def test_a_failed_local_wait_prints_the_diagnosis(tmp_path):
    """A code error is not repaired: the run stops, the wait exits 1 and prints why (cause, evidence, fix), from
    the run's process and files (no sacct)."""
    root = tmp_path / "runs"
    proc = run_cli("-m", "hpc_agent.submit", "quickstart", "--executor", "local", "--wait", f"run.runs_root={root}",
                   "faults.error_at_step=3", timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout
    assert "finished: FAILED" in out and "diagnosis:" in out, out
    diagnosis = out.split("diagnosis:", 1)[1]
    assert "code_error" in diagnosis and "local process" in diagnosis, diagnosis
    line, run = _status_and_review(root)
    assert (line["phase"], line["slurm_state"]) == ("stopped", "FAILED (local)")
    assert run["phase"] == "stopped" and run["attempts"] == 1 and run["causes"] == ["code_error"]

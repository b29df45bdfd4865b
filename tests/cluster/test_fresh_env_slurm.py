"""Issue 14, must-shows 2 and 3, on the real localhost Slurm: nothing is compiled inside a job.

* A DeepSpeed CPU job in a tight cgroup (1 CPU, 2 GB), started from an empty HOME and empty per-user caches
  (so only what the set-up step prepared can be found), reaches its first training step within 60 s of
  starting, and leaves nothing behind in HOME or in a torch extensions directory.
* The same job with the op unprepared is refused by submit (exit 2, naming the fix); submitted anyway
  (``--force``), it fails within 60 s with exit 72 and the command that fixes it;
  ``diagnose`` names it ``env_error``, and the watcher stops the run instead of requeueing it.
"""
from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path
from typing import Dict, Tuple

import pytest

from hpc_agent.core.ops_cache import OPS_DIR_ENV
from hpc_agent.slurm.sacct import parse_parsable2
from tests.conftest import run_cli
from tests.slurm_helpers import SLURM, events, ledger_job_ids, log_text

pytestmark = pytest.mark.slurm
TIGHT = ("slurm.cpus_per_task=1", "slurm.mem=2G", "slurm.time=00:05:00")


def clean_user_env(tmp_path: Path, **extra: str) -> Dict[str, str]:
    """What a newcomer's shell holds: an empty HOME and caches (sbatch passes them on to the job)."""
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"), "MPLCONFIGDIR": str(home / ".mpl"),
           "TORCH_EXTENSIONS_DIR": str(tmp_path / "torch_extensions"), OPS_DIR_ENV: ""}
    env.update(extra)
    return env


def submit_and_wait(root: Path, env: Dict[str, str], *overrides: str) -> Tuple[Path, str, str]:
    proc = run_cli("-m", "hpc_agent.submit", "quickstart", "--executor", "slurm", "--wait", "--wait-timeout", "240",
                   f"run.runs_root={root}", *TIGHT, *overrides, env=env, timeout=300)
    (run_dir,) = [p for p in root.iterdir() if p.is_dir()]
    job = json.loads((run_dir / "run.json").read_text())["job_ids"][-1]
    return run_dir, job, proc.stdout + proc.stderr


def allocation(job: str) -> Dict[str, str]:
    text = SLURM.run(["sacct", "-X", "--parsable2", "-j", job,
                      "--format", "JobID,State,ExitCode,AllocCPUS,ReqMem,Start,End,ElapsedRaw"]).stdout
    (row,) = [r for r in parse_parsable2(text) if r["JobID"] == job]
    return row


def epoch(sacct_time: str) -> float:
    return _dt.datetime.fromisoformat(sacct_time).timestamp()  # sacct prints the local time, like time.time()


def first_step_wall_time(run_dir: Path) -> float:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return min(e.wall_time for e in acc.Scalars("train/loss") if e.step == 1)


def test_a_job_in_a_tight_cgroup_with_empty_home_reaches_its_first_step_within_60s(root, tmp_path):
    env = clean_user_env(tmp_path)
    run_dir, job, out = submit_and_wait(root, env)
    row = allocation(job)
    assert row["State"] == "COMPLETED", out + log_text(run_dir, job)
    assert row["AllocCPUS"] == "1" and row["ReqMem"].startswith("2G"), row  # the cgroup it ran in
    to_first_step = first_step_wall_time(run_dir) - epoch(row["Start"])
    print(f"job {job}: first step {to_first_step:.1f} s after the job started; whole job {row['ElapsedRaw']} s")
    assert to_first_step <= 60, f"first step {to_first_step:.1f} s after the start"
    log = log_text(run_dir, job)
    assert "DeepSpeed op deepspeed_shm_comm: loaded the prepared build" in log
    # Nothing was built: no torch extension dir, and the empty HOME is still empty.
    assert not (tmp_path / "torch_extensions").exists()
    assert list((tmp_path / "home").iterdir()) == []


def test_an_unprepared_op_fails_fast_is_diagnosed_and_never_requeued(root, tmp_path):
    env = clean_user_env(tmp_path, **{OPS_DIR_ENV: str(tmp_path / "never_prepared")})
    # submit refuses it first (exit 2, the fix named, nothing created) ...
    refused = run_cli("-m", "hpc_agent.submit", "quickstart", "--executor", "slurm", f"run.runs_root={root}", *TIGHT,
                      env=env, timeout=120)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "DeepSpeed op deepspeed_shm_comm is not prepared" in refused.stderr
    assert "-m hpc_agent.prepare" in refused.stderr and "Traceback" not in refused.stderr
    assert not root.exists() or not any(root.iterdir())
    # ... and a job submitted anyway (--force) is stopped by its own guard, in seconds
    run_dir, job, out = submit_and_wait(root, env, "--force")
    row = allocation(job)
    assert row["State"] == "FAILED" and row["ExitCode"] == "72:0", row
    assert int(row["ElapsedRaw"]) <= 60, row
    log = log_text(run_dir, job)
    assert "[hpc_agent] environment problem: DeepSpeed op deepspeed_shm_comm is not prepared" in log
    assert f"{OPS_DIR_ENV}={tmp_path / 'never_prepared'}" in log and "-m hpc_agent.prepare" in log
    assert "Traceback" not in log

    diag = run_cli("-m", "hpc_agent.diagnose", job, "--runs-root", str(root), "--json", timeout=120)
    assert diag.returncode == 0, diag.stderr
    report = json.loads(diag.stdout)
    assert report["cause"] == "env_error"
    assert any("-m hpc_agent.prepare" in line for line in report["evidence"]), report["evidence"]
    assert report["decision"]["action"] == "stop"

    for _ in range(2):  # a second tick must not change its mind
        watch = run_cli("-m", "hpc_agent.watch", "--runs-root", str(root), "--once", timeout=120)
        assert watch.returncode == 0, watch.stdout + watch.stderr
    assert ledger_job_ids(root, run_dir.name) == [job]
    (decision,) = [e for e in events(run_dir) if e.get("cause")]
    assert decision["cause"] == "env_error" and decision["decision"]["action"] == "stop"

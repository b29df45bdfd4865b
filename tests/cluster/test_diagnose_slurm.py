"""Issue 43, part 5 on the real localhost Slurm: ``diagnose`` takes what users have. A job that runs out of GPU memory
(injected: ``faults.oom_above_micro_batch``, no in-job retry, no watcher) is diagnosed by its run id, its run
directory and its log alone; a local-executor run with the same fault is diagnosed by its run id without sacct,
on a machine where sacct answers (its process id could be some Slurm job's id)."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.slurm_helpers import LONG_RUN, states, submit, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

OOM = ("train.micro_batch_size=8", "faults.oom_above_micro_batch=4", "resilience.in_job_retries=0",
       "train.max_steps=20")


def diagnose_json(*args: str, env: dict | None = None) -> dict:
    proc = run_cli("-m", "hpc_agent.diagnose", *args, "--json", env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def test_failed_job_by_run_id_run_dir_and_log(root):
    run_dir, job = submit(root, *LONG_RUN, "run.name=diag", *OOM)
    wait_for(lambda: states(job)[-1:] == ["FAILED"], 240, what="the job to fail", explain=lambda: str(states(job)))

    by_run = diagnose_json(run_dir.name, "--runs-root", str(root))
    assert (by_run["run_id"], by_run["job_id"], by_run["state_from"]) == (run_dir.name, job, "sacct")
    assert (by_run["cause"], by_run["state"]) == ("gpu_oom", "FAILED"), by_run["evidence"]
    assert any("CUDA out of memory" in e for e in by_run["evidence"]), by_run["evidence"]
    assert by_run["logs"] == [f"{job}_0_log.out"] and by_run["problems"] == []
    # The run's own config (8 x 1) on the OOM ladder: 4 x 2, the global batch kept.
    assert by_run["decision"]["patch"] == {"train.micro_batch_size": 4, "train.grad_accum_steps": 2}

    by_dir = diagnose_json(str(run_dir))  # its parent is the runs root
    assert (by_dir["job_id"], by_dir["cause"], by_dir["state"]) == (job, "gpu_oom", "FAILED")

    log = run_dir / "slurm" / f"{job}_0_log.out"
    alone = diagnose_json("--log", str(log))
    assert (alone["cause"], alone["state"], alone["state_from"]) == ("gpu_oom", "unknown", "nothing")
    assert alone["decision"]["action"] == "resubmit"
    text = run_cli("-m", "hpc_agent.diagnose", "--log", str(log))
    assert text.returncode == 0 and "state unknown: no sacct consulted" in text.stdout
    assert "watch would: resubmit" in text.stdout


def _recording_sacct(tmp_path: Path) -> tuple[dict, Path]:
    """``sacct`` and ``scontrol`` first on PATH: each records that it ran, then runs the real one."""
    bin_dir, record = tmp_path / "bin", tmp_path / "slurm-called"
    bin_dir.mkdir()
    for name in ("sacct", "scontrol"):
        real = next(Path(d) / name for d in os.environ["PATH"].split(os.pathsep) if (Path(d) / name).is_file())
        stub = bin_dir / name
        stub.write_text(f"#!/bin/sh\necho {name} \"$@\" >> {record}\nexec {real} \"$@\"\n")
        stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}, record


def test_local_run_by_run_id_never_asks_sacct(root, tmp_path):
    env, record = _recording_sacct(tmp_path)
    proc = run_cli("-m", "hpc_agent.submit", "quickstart", "--executor", "local", "--wait", "--wait-timeout", "240",
                   f"run.runs_root={root}", *LONG_RUN, "run.name=diag-local", *OOM, "watch.max_retries=0", env=env,
                   timeout=300)  # no retry budget: --wait's watcher stops the run instead of repairing it
    assert "finished: FAILED" in proc.stdout, proc.stdout + proc.stderr
    (run_dir,) = [p for p in root.iterdir() if p.is_dir()]
    pid = json.loads((run_dir / "run.json").read_text())["job_ids"][-1]

    report = diagnose_json(run_dir.name, "--runs-root", str(root), env=env)
    assert (report["job_id"], report["state_from"]) == (pid, "local process")
    assert (report["cause"], report["state"], report["exit_code"]) == ("gpu_oom", "FAILED", "3:0"), report["evidence"]
    assert report["local"]["alive"] is False
    evidence = "\n".join(report["evidence"])
    assert "exit line in the log" in evidence and "exiting 3" in evidence and "CUDA out of memory" in evidence
    text = run_cli("-m", "hpc_agent.diagnose", str(run_dir), env=env)
    assert text.returncode == 0 and f"state FAILED, exit 3:0, local process {pid} (no sacct)" in text.stdout
    assert not record.exists(), record.read_text()  # submit --executor local and diagnose: no sacct, no scontrol

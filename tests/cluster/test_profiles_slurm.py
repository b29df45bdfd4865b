"""Cluster profiles against the real localhost Slurm (scripts/cluster.sh): ``doctor --profile`` passes with the
shipped ``localhost`` profile and names a nonexistent partition or account, and a submit with ``--profile``
completes with the profile's settings and activation line in its job script."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.slurm


def checks_of(stdout: str) -> dict:
    return {c["name"]: c for c in json.loads(stdout)["checks"]}


def test_doctor_profile_localhost_passes():
    res = run_cli("-m", "hpc_agent.doctor", "--profile", "localhost", "quickstart", timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    for line in ("OK    profile: localhost from ", "OK    profile partition: low exists", "OK    profile account: none set",
                 "OK    sbatch --test-only: partition low accepts", "OK    slurm version: Slurm ",
                 "OK    activation: no activation lines", "OK    gpu request: "):
        assert line in out, out
    assert "READY:" in out


def test_doctor_names_a_nonexistent_partition_and_account(tmp_path):
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "broken.yaml").write_text("slurm:\n  partition: nosuchpart\n", encoding="utf-8")
    (profiles / "badacct.yaml").write_text(
        "slurm:\n  partition: low\n  account: nosuchacct\nprofile:\n  activate: ['if true; then']\n", encoding="utf-8")
    res = run_cli("-m", "hpc_agent.doctor", "--profile", "broken", "quickstart", "--json", timeout=180, cwd=tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    checks = checks_of(res.stdout)
    part = checks["profile partition"]
    assert part["level"] == "FAIL" and "nosuchpart" in part["detail"] and "slurm.partition" in part["detail"]
    assert str(profiles / "broken.yaml") in part["detail"]
    assert checks["sbatch --test-only"]["level"] == "FAIL" and "nosuchpart" in checks["sbatch --test-only"]["detail"]

    res = run_cli("-m", "hpc_agent.doctor", "--profile", "badacct", "quickstart", "--json", timeout=180, cwd=tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    checks = checks_of(res.stdout)
    assert checks["activation"]["level"] == "FAIL" and "bash -n" in checks["activation"]["detail"]
    # scripts/cluster.sh does not enforce associations, so sbatch --test-only accepts any account: the
    # accounting check (sacctmgr list account) is the one that names it.
    account = checks["profile account"]
    assert account["level"] == "FAIL" and "nosuchacct" in account["detail"] and "slurm.account" in account["detail"]
    assert "root" in account["detail"]  # what accounting does know
    assert checks["profile qos"]["level"] == "OK"  # none set


def test_submit_with_profile_completes_and_records_it(tmp_path):
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "site.yaml").write_text(
        "profile:\n  gpu_request: gres\n  activate:\n    - export HPC_AGENT_PROFILE_SAYS=activated\n"
        "    - echo \"profile site active on $(hostname)\"\nslurm:\n  partition: high\n", encoding="utf-8")
    root = tmp_path / "runs"
    res = run_cli("-m", "hpc_agent.submit", "--profile", "site", "quickstart", "--executor", "slurm", "--wait",
                  "--wait-timeout", "300", f"run.runs_root={root}", timeout=400, cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    (run_dir,) = [p for p in root.iterdir() if p.is_dir()]
    snapshot = (run_dir / "config.yaml").read_text()
    assert "name: site" in snapshot and "partition: high" in snapshot and "HPC_AGENT_PROFILE_SAYS" in snapshot
    info = json.loads((run_dir / "run.json").read_text())
    log = Path(info["logs"][0]).read_text()
    assert "profile site active on" in log and "done" in log
    (script,) = (run_dir / "slurm").glob("*submission.sh")
    text = script.read_text()
    assert "#SBATCH --partition=high" in text and "# activation lines of profile site" in text

    from hpc_agent.config.load import load_run_config

    (profiles / "site.yaml").unlink()  # the watcher resubmits from the snapshot alone
    cfg = load_run_config(run_dir)
    assert cfg.profile.name == "site" and cfg.slurm.partition == "high"

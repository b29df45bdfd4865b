"""The rendered job script (golden file) and --dry-run. Pure rendering: no sbatch is run."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpc_agent.config.load import load_config
from hpc_agent.jobs.executor import load_template, render_job_script, slurm_parameters
from hpc_agent.slurm.job_match import job_name_for, run_id_from_job_name
from hpc_agent.slurm.timelimit import slurm_time_to_minutes
from tests.conftest import run_cli

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "quickstart.sbatch"
RUN_DIR = Path("/runs/quickstart-20260101-000000")


def _render() -> str:
    cfg = load_config("quickstart", ["slurm.partition=low", "slurm.exclude=node3", "slurm.python=/usr/bin/python3"],
                      env={})
    return render_job_script(cfg, RUN_DIR.name, RUN_DIR, RUN_DIR / "config.yaml")


def test_rendered_script_matches_golden_file():
    text = _render()
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "job script changed; review and rerun with UPDATE_GOLDEN=1"


def test_script_carries_requeue_append_signal_and_run_id():
    lines = _render().splitlines()
    assert "#SBATCH --requeue" in lines
    assert "#SBATCH --open-mode=append" in lines
    assert "#SBATCH --signal=USR2@120" in lines
    assert f"#SBATCH --job-name={job_name_for(RUN_DIR.name)}" in lines
    assert any(line.startswith("srun ") and "--kill-on-bad-exit=1" in line for line in lines)


def test_job_name_round_trips_run_id():
    assert run_id_from_job_name(job_name_for("demo-20260101-000000")) == "demo-20260101-000000"
    assert run_id_from_job_name("someone-elses-job") is None


def test_requeue_off_and_extra_options():
    cfg = load_config("quickstart", ["slurm.requeue=false", "slurm.extra_sbatch.mail-type=END",
                                     "slurm.extra_sbatch.exclusive="], env={})
    params = slurm_parameters(cfg, "r", RUN_DIR, RUN_DIR / "c.yaml", load_template("default"))
    extra = params["additional_parameters"]
    assert extra["no-requeue"] is True and "requeue" not in extra
    assert extra["mail-type"] == "END" and extra["exclusive"] is True


def test_template_values_are_shell_quoted():
    run_dir = Path("/runs/with space")
    cfg = load_config("quickstart", [], env={})
    params = slurm_parameters(cfg, "r", run_dir, run_dir / "config.yaml", load_template("default"))
    assert "export HPC_AGENT_RUN_DIR='/runs/with space'" in params["setup"]


@pytest.mark.parametrize("value, minutes", [("30", 30), ("1:30", 2), ("01:00:00", 60), ("2-00", 2880),
                                            ("1-12:30", 2190), ("0-00:00:59", 1), ("10:00:01", 601)])
def test_slurm_time_to_minutes(value, minutes):
    assert slurm_time_to_minutes(value) == minutes


def test_dry_run_prints_config_and_script_and_creates_nothing(tmp_path):
    proc = run_cli("-m", "hpc_agent.submit", "quickstart", "--dry-run", "--executor", "slurm",
                   f"run.runs_root={tmp_path / 'runs'}")
    assert proc.returncode == 0, proc.stderr
    for needle in ("# Resolved config", "#SBATCH --requeue", "#SBATCH --open-mode=append", "#SBATCH --signal=USR2@120",
                   "max_steps: 10"):
        assert needle in proc.stdout
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("flags", [["--script-only"], ["--dry-run", "--script-only"]])
def test_script_only_redirected_is_exactly_the_job_script(tmp_path, flags):
    """Issue 44: ``--dry-run > job.sh`` mixed the config, comments and the script. ``--script-only > job.sh``
    writes the job script alone, as --dry-run shows it; everything else goes to stderr."""
    import subprocess
    import sys

    runs = tmp_path / "runs"
    job_sh = tmp_path / "job.sh"
    with job_sh.open("w") as out:
        proc = subprocess.run([sys.executable, "-m", "hpc_agent", "submit", "quickstart", *flags, "--executor",
                               "slurm", f"run.runs_root={runs}"], stdout=out, stderr=subprocess.PIPE, text=True,
                              timeout=300, cwd=str(tmp_path),
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert proc.returncode == 0, proc.stderr
    text = job_sh.read_text()
    assert text.startswith("#!/bin/bash\n") and text.rstrip().endswith('exit "$hpc_agent_rc"'), text[:300]
    assert "# Resolved config" not in text and "memory:" not in text and "Dry run" not in text
    assert "#SBATCH --requeue" in text
    check = subprocess.run(["bash", "-n", str(job_sh)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stderr
    assert "memory:" in proc.stderr and "nothing was created or submitted" in proc.stderr
    assert not runs.exists()
    full = run_cli("-m", "hpc_agent.submit", "quickstart", "--dry-run", "--executor", "slurm", f"run.runs_root={runs}")
    end = 'exit "$hpc_agent_rc"\n'  # the script's last line: what --dry-run prints after it is about the checks
    shown = full.stdout.split("# Job script (sbatch)\n", 1)[1].split(end, 1)[0] + end
    import re

    def same_run(t: str) -> str:  # the two dry runs may name their run ids a second apart
        return re.sub(r"quickstart-\d{8}-\d{6}(-\d+)?", "RUN_ID", t)

    assert same_run(shown) == same_run(text)


def test_script_only_refuses_the_local_executor(tmp_path, monkeypatch, capsys):
    from hpc_agent import submit
    from hpc_agent.slurm.cli import SlurmCLI

    monkeypatch.setattr(SlurmCLI, "available", staticmethod(lambda: False))  # auto -> local
    assert submit.main(["quickstart", "--script-only", f"run.runs_root={tmp_path / 'runs'}"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "--executor slurm" in captured.err and "auto chose local" in captured.err
    assert not (tmp_path / "runs").exists()


def test_submit_with_three_mistakes_exits_2_naming_all(tmp_path):
    proc = run_cli("-m", "hpc_agent.submit", "quickstart", "train.zero_stage=7", "slurm.nodes=0",
                   "slurm.partition=low;rm -rf /", f"run.runs_root={tmp_path}")
    assert proc.returncode == 2
    for key in ("train.zero_stage", "slurm.nodes", "slurm.partition"):
        assert key in proc.stderr
    assert "Traceback" not in proc.stderr
    assert "3 problems" in proc.stderr
    assert list(tmp_path.iterdir()) == []

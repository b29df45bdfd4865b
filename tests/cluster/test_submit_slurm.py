"""submit against the real localhost Slurm: the job completes and training ran as an srun step."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpc_agent.slurm.cli import SlurmCLI
from hpc_agent.slurm.job_match import job_name_for
from hpc_agent.slurm.sacct import parse_parsable2
from tests.conftest import run_cli

pytestmark = pytest.mark.slurm


def test_quickstart_completes_as_srun_step(tmp_path):
    root = tmp_path / "runs"
    proc = run_cli("-m", "hpc_agent.submit", "quickstart", "--executor", "auto", "--wait", "--wait-timeout", "300",
                   f"run.runs_root={root}", timeout=400)
    assert "executor: slurm (sbatch found on PATH)" in proc.stdout
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = [p for p in root.iterdir() if p.is_dir()]
    info = json.loads((run_dir / "run.json").read_text())
    job_id = info["job_ids"][0]

    rows = parse_parsable2(SlurmCLI().sacct([job_id], fields=("JobID", "JobName", "State", "ExitCode")))
    by_id = {r["JobID"]: r for r in rows}
    assert by_id[job_id]["State"] == "COMPLETED"
    assert by_id[job_id]["JobName"] == job_name_for(run_dir.name)  # the watcher finds runs by this
    # The training entry ran as step 0 of the allocation (srun), not in the batch shell.
    assert by_id[f"{job_id}.0"]["State"] == "COMPLETED"
    assert by_id[f"{job_id}.0"]["ExitCode"] == "0:0"

    log = Path(info["logs"][0])
    assert log.parent == run_dir / "slurm"
    text = log.read_text()
    assert f"job={job_id}" in text and "step 10 " in text and "done" in text


def test_an_error_after_sbatch_leaves_the_real_job_followed(tmp_path, monkeypatch, capsys):
    """run.json cannot be written after sbatch succeeded: the job is in Slurm, the ledger has its id, the run
    stays pending (followed by watch), and the user is told so (tests/unit/test_submit_orphans.py: every other case)."""
    from hpc_agent.jobs import submission
    from hpc_agent import submit
    from hpc_agent.state.ledger import Ledger
    from tests.slurm_helpers import cleanup_jobs

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(submission, "update_run_json", broken)
    root = tmp_path / "runs"
    try:
        assert submit.main(["quickstart", "--executor", "slurm", f"run.runs_root={root}"]) == 0
        ledger = Ledger.in_runs_root(root)
        (run,) = ledger.runs()
        (sub,) = ledger.submissions(run.run_id)
        assert run.phase == "pending" and sub.job_id
        err = capsys.readouterr().err
        assert f"job {sub.job_id} was submitted" in err and "will follow it" in err
        queued = SlurmCLI().run(["squeue", "--noheader", "--jobs", sub.job_id, "--format", "%j"]).stdout.split()
        rows = parse_parsable2(SlurmCLI().sacct([sub.job_id], fields=("JobID", "JobName", "State")))
        assert job_name_for(run.run_id) in queued + [r["JobName"] for r in rows]
    finally:
        cleanup_jobs(root)

"""Issue 44, item 3 on the real Slurm: a command-mode script in a git work tree that reads a config next to
itself (``Path(__file__).parent / "params.json"``), a data file in a sibling package, and a data file given
relative to the submit's folder (``--data data/train.txt``, untracked and not ignored) completes, run from the
snapshot taken at submit: a change to the checkout after the submit does not reach the job."""
from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import run_cli
from tests.job.test_command_snapshot import write_project
from tests.slurm_helpers import log_text, states, wait_for

pytestmark = [pytest.mark.slurm]

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]


def test_script_reads_files_next_to_it_and_relative_data_under_slurm(root, tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    work = tmp_path / "project"
    write_project(work)
    subprocess.run([*GIT, "-C", str(work), "init", "-q"], check=True)
    subprocess.run([*GIT, "-C", str(work), "add", "train.py", "params.json", "helpers"], check=True)
    subprocess.run([*GIT, "-C", str(work), "commit", "-qm", "project"], check=True)
    proc = run_cli("-m", "hpc_agent.submit", "quickstart", "--executor", "slurm", f"run.runs_root={root}",
                   "run.name=snapcmd", "train.command=[python,train.py,--data,data/train.txt]", "train.precision=fp32",
                   "slurm.mem=2G", "slurm.time=00:05:00", cwd=work)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (work / "params.json").write_text('{"lr": 9.0}')  # the checkout moves on: the job runs what was submitted
    (run_dir,) = [p for p in root.iterdir() if p.is_dir()]
    run = json.loads((run_dir / "run.json").read_text())
    job = run["job_ids"][0]
    assert run["code_snapshot"]["git"]["dirty"] is True  # data/train.txt is untracked, and copied
    wait_for(lambda: set(states(job)) & {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY"}, 240,
             what="the job to end")
    code = run_dir / "code"
    text = log_text(run_dir, job)
    assert states(job)[-1] == "COMPLETED", text[-3000:]
    assert f"SCRIPT_OK lr=0.5 vocab=3 lines=4 file={code / 'train.py'} cwd={code}" in text, text[-3000:]

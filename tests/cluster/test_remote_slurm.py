"""``--remote`` against a real sshd on localhost and the real localhost Slurm: submit, status, diagnose and
review of a real run, and the incremental TensorBoard pull (CI must-show 3, docs/remote.md).

The "login node" is this machine reached through a throw-away sshd (tests/helpers/sshd.py) as root, with the
client's port, key and known-hosts file passed through ``HPC_AGENT_SSH_OPTS``: ~/.ssh is never touched. Every
command below runs ``hpc-agent <command>`` on the far side of ssh; the test itself only reads files."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.helpers import sshd
from tests.slurm_helpers import states, wait_for

pytestmark = pytest.mark.slurm
TARGET = "root@127.0.0.1"


@pytest.fixture
def login(tmp_path):
    why = sshd.missing()
    if why:
        pytest.skip(f"no sshd for the --remote test: {why}")
    with sshd.local_sshd(tmp_path / "sshd") as env:
        yield env


def remote_cli(env, command: str, *args: str, timeout: float = 300):
    """``python -m hpc_agent COMMAND --remote root@127.0.0.1 ...`` as a laptop user types it."""
    return run_cli("-m", "hpc_agent", command, "--remote", TARGET, "--remote-python", sys.executable, *args,
                   env=env, timeout=timeout)


def test_submit_status_diagnose_review_and_pull_over_ssh(login, root, tmp_path):
    env = login
    proc = remote_cli(env, "submit", "quickstart", "--executor", "slurm", f"run.runs_root={root}",
                      "train.lr=0.00071")  # an override reaches the login node inside the resolved YAML
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job_id = re.search(r"^job id:\s+(\d+) \(slurm\)", proc.stdout, re.M).group(1)
    run_id = re.search(r"^run id:\s+(\S+)", proc.stdout, re.M).group(1)
    run_dir = root / run_id
    assert run_dir.is_dir() and "0.00071" in (run_dir / "config.yaml").read_text()

    proc = remote_cli(env, "status", "--runs-root", str(root), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (line,) = json.loads(proc.stdout)["runs"]
    assert (line["run_id"], line["job_id"]) == (run_id, job_id)

    wait_for(lambda: "COMPLETED" in states(job_id), timeout=400, interval=2, what=f"job {job_id} to complete")
    proc = remote_cli(env, "status", "--runs-root", str(root))
    assert proc.returncode == 0 and run_id in proc.stdout and "COMPLETED" in proc.stdout, proc.stdout + proc.stderr
    assert "10/10" in proc.stdout

    proc = remote_cli(env, "diagnose", job_id, "--runs-root", str(root))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith(f"job {job_id}: completed")

    proc = remote_cli(env, "review", str(root))
    assert proc.returncode == 0 and run_id in proc.stdout, proc.stdout + proc.stderr

    mirror = tmp_path / "mirror"
    proc = remote_cli(env, "review", str(run_dir), "--pull", str(mirror), "--plot", str(tmp_path / "run.png"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    pulled = int(re.search(r"pulled (\d+) new TensorBoard bytes", proc.stdout).group(1))
    tb_files = sorted((run_dir / "tb").iterdir())
    assert pulled == sum(p.stat().st_size for p in tb_files) > 0
    for p in tb_files:
        assert (mirror / run_id / "tb" / p.name).read_bytes() == p.read_bytes()
    assert (tmp_path / "run.png").stat().st_size > 0 and run_id in proc.stdout

    proc = remote_cli(env, "review", str(run_dir), "--pull", str(mirror), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "pulled 0 new TensorBoard bytes" in proc.stderr  # the run ended: the second pull moves nothing
    (reviewed,) = json.loads(proc.stdout)["runs"]
    assert reviewed["run_id"] == run_id and reviewed["step"] == 10
    assert Path(reviewed["run_dir"]) == mirror / run_id

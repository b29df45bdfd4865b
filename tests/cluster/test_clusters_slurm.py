"""``--clusters`` against the real localhost Slurm: every command accepts -M, and every parser reads under -M
what it reads without it (squeue, sinfo and scontrol print a "CLUSTER: name" line first; sbatch says
"on cluster NAME"), down to a submit --wait that completes."""
from __future__ import annotations

import json
import re

import pytest

from hpc_agent.slurm.cli import CLUSTERS_ENV, SlurmCLI
from hpc_agent.slurm.queries import jobs_named, queue_state
from hpc_agent.slurm.sacct import parse_parsable2
from hpc_agent.slurm.sinfo import max_node_memory_mb, node_memory_argv, parse_partitions, partitions_argv
from tests.conftest import run_cli

pytestmark = pytest.mark.slurm


@pytest.fixture
def cluster() -> str:
    config = SlurmCLI(timeout_s=20).run(["scontrol", "show", "config"]).stdout
    return re.search(r"^ClusterName\s*=\s*(\S+)", config, re.M).group(1)


def test_parsers_read_the_same_under_clusters(cluster, monkeypatch):
    monkeypatch.setenv(CLUSTERS_ENV, "")
    plain, named = SlurmCLI(timeout_s=30), SlurmCLI(timeout_s=30, clusters=cluster)
    raw = named.run(["sbatch", "--hold", "--job-name", "hpc-agent-clusters-test", "--output", "/dev/null",
                     "--wrap", "true"]).stdout
    assert f"on cluster {cluster}" in raw, raw  # what -M adds; submitit's "job (\d+)" still finds the id
    job_id = re.search(r"job (\d+)", raw).group(1)
    try:
        for cli in (plain, named):
            assert cli.run(["squeue", "--noheader", "--jobs", job_id, "--format", "%T"]).stdout.strip() == "PENDING"
            assert queue_state(cli, job_id) == "PENDING"
            assert jobs_named(cli, "hpc-agent-clusters-test", 0) and job_id in jobs_named(cli, "hpc-agent-clusters-test", 0)
            show = cli.run(["scontrol", "--oneliner", "show", "job", job_id]).stdout
            assert show.startswith(f"JobId={job_id} "), show
        assert parse_partitions(named.run(partitions_argv()).stdout) == parse_partitions(plain.run(partitions_argv()).stdout)
        assert max_node_memory_mb(named.run(node_memory_argv()).stdout) == max_node_memory_mb(
            plain.run(node_memory_argv()).stdout)
        assert parse_parsable2(named.sacct([job_id])) == parse_parsable2(plain.sacct([job_id]))
        assert named.run(["scontrol", "release", job_id]).returncode == 0
    finally:
        named.run(["scancel", job_id], check=False)


def test_submit_wait_and_diagnose_with_clusters(cluster, tmp_path, monkeypatch):
    monkeypatch.setenv(CLUSTERS_ENV, "")
    root = tmp_path / "runs"
    proc = run_cli("-m", "hpc_agent.submit", "quickstart", "--executor", "slurm", "--wait", "--wait-timeout", "300",
                   "--clusters", cluster, "-v", f"run.runs_root={root}", timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"--clusters={cluster}" in proc.stdout  # -v: the debug line of each Slurm command
    (run_dir,) = [p for p in root.iterdir() if p.is_dir()]
    job_id = json.loads((run_dir / "run.json").read_text())["job_ids"][0]
    diag = run_cli("-m", "hpc_agent.diagnose", job_id, "--runs-root", str(root), "--json", "--clusters", cluster)
    assert diag.returncode == 0 and json.loads(diag.stdout)["cause"] == "completed", diag.stdout + diag.stderr

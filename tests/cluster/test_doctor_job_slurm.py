"""doctor's job-python check on the real cluster (the fake-runner cases: tests/unit/test_doctor_job.py)."""
from __future__ import annotations

import time

import pytest

from tests.conftest import run_cli


@pytest.mark.slurm
def test_doctor_job_python_on_the_real_cluster():
    start = time.monotonic()
    ok = run_cli("-m", "hpc_agent.doctor", "quickstart", timeout=120)
    line = next(l for l in ok.stdout.splitlines() if "job python" in l)
    assert line.startswith("OK") and "imports hpc_agent and submitit" in line, ok.stdout
    bad = run_cli("-m", "hpc_agent.doctor", "quickstart", "slurm.python=/nonexistent/bin/python", timeout=120)
    line = next(l for l in bad.stdout.splitlines() if "job python" in l)
    assert bad.returncode == 1 and line.startswith("FAIL"), bad.stdout
    assert "/nonexistent/bin/python does not exist on node" in line and "set slurm.python to a venv" in line
    assert time.monotonic() - start < 120

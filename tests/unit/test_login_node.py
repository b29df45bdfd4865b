"""Login-node commands must not import torch or deepspeed (importing torch alone takes seconds)."""
from __future__ import annotations

import re

import pytest

from tests.conftest import REPO, run_cli

HEAVY = re.compile(r"\|\s+(torch|deepspeed)(\.|\s*$)")


def imported_modules(importtime_stderr: str) -> list[str]:
    return [line.split("|")[-1].strip() for line in importtime_stderr.splitlines() if line.startswith("import time:")]


@pytest.mark.parametrize("argv", [
    ["-m", "hpc_agent.submit", "quickstart", "--dry-run", "--executor", "slurm"],
    ["-m", "hpc_agent.submit", "quickstart", "--dry-run", "--executor", "local"],
    ["-m", "hpc_agent", "--help"],
    ["-m", "hpc_agent.watch", "--once", "--dry-run", "--runs-root"],
    ["-m", "hpc_agent.status", "--runs-root"],
    ["-m", "hpc_agent.diagnose", "--json", "--sacct-file", str(REPO / "tests" / "data" / "sacct" / "completed.txt"),
     "--runs-root"],
])
def test_cli_imports_neither_torch_nor_deepspeed(argv, tmp_path):
    if argv[-1] == "--runs-root":
        from hpc_agent.state.ledger import Ledger

        Ledger.in_runs_root(tmp_path)  # an empty ledger, so watch really builds its watcher and ticks
        argv = [*argv, str(tmp_path)]
    elif "submit" in argv[1]:
        argv = [*argv, f"run.runs_root={tmp_path}"]
    proc = run_cli("-X", "importtime", *argv)
    assert proc.returncode == 0, proc.stderr[-2000:]
    modules = imported_modules(proc.stderr)
    assert "hpc_agent" in modules  # the importtime output was really read
    heavy = [m for m in modules if m.split(".")[0] in ("torch", "deepspeed")]
    assert heavy == [], f"login-node command imported {heavy[:5]}"

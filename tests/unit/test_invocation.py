"""How a command runs as a process (hpc_agent/cli/invocation.py): a reader that closes early ends it quietly, as
``git log | head`` does, and its usage line names it as it was started (issue 44, section 6)."""
from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

from hpc_agent.cli.invocation import PIPE_CLOSED, prog
from tests.conftest import REPO

# The console script pip writes for ``hpc-agent = "hpc_agent.__main__:main"`` (pyproject.toml), as it writes it.
CONSOLE_SCRIPT = """import re
import sys
from hpc_agent.__main__ import main
if __name__ == '__main__':
    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])
    sys.exit(main())
"""


def _env(unbuffered: bool = False) -> dict:
    """The environment of a user's shell: stdout to a pipe is block-buffered unless PYTHONUNBUFFERED is set."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _into_closed_reader(argv: List[str], read_lines: int, cwd: Path, unbuffered: bool) -> subprocess.CompletedProcess:
    """Run ``argv`` with stdout into a pipe whose reader reads ``read_lines`` lines and closes it, like ``| head``.
    The pipe holds one page, so that the command is still writing when the reader goes (a 64 KiB pipe would take
    a short output whole, and the race would decide)."""
    read_fd, write_fd = os.pipe()
    if hasattr(fcntl, "F_SETPIPE_SZ"):
        fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, 4096)
    proc = subprocess.Popen(argv, stdout=write_fd, stderr=subprocess.PIPE, env=_env(unbuffered),
                            cwd=str(cwd))
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as reader:
        for _ in range(read_lines):
            reader.readline()
    _, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(argv, proc.returncode, "", err.decode(errors="replace"))


@pytest.mark.parametrize("argv,lines,unbuffered,codes", [
    (["-m", "hpc_agent", "config"], 1, False, {PIPE_CLOSED}),        # hpc-agent config | head -1
    (["-m", "hpc_agent", "config"], 1, True, {PIPE_CLOSED}),         # the same with PYTHONUNBUFFERED=1
    (["-m", "hpc_agent.config"], 1, False, {PIPE_CLOSED}),           # python -m hpc_agent.config | head -1
    (["-m", "hpc_agent", "submit", "quickstart", "--dry-run", "--executor", "local"], 0, False, {PIPE_CLOSED}),
    (["-m", "hpc_agent.status", "--help"], 0, False, {PIPE_CLOSED}),  # argparse's own printing, flushed at the end
    # unbuffered, argparse's own write meets the closed pipe and argparse ignores it: quiet, and its exit 0
    (["-m", "hpc_agent.status", "--help"], 0, True, {0, PIPE_CLOSED}),
    (["-m", "hpc_agent", "--help"], 0, False, {PIPE_CLOSED}),        # the front door's
], ids=["hpc-agent-config", "hpc-agent-config-unbuffered", "python-m-config", "submit-dry-run", "status-help",
        "status-help-unbuffered", "front-door-help"])
def test_a_reader_that_closes_early_ends_the_command_quietly(tmp_path, argv, lines, unbuffered, codes):
    proc = _into_closed_reader([sys.executable, *argv, f"run.runs_root={tmp_path}"] if "submit" in argv
                               else [sys.executable, *argv], lines, tmp_path, unbuffered)
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr
    assert "Exception ignored" not in proc.stderr, proc.stderr
    assert proc.returncode in codes, proc.stderr


def test_a_reader_that_reads_everything_sees_exit_0(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "hpc_agent", "config"], capture_output=True, text=True, env=_env(),
                          cwd=str(tmp_path), timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("#"), proc.stderr


@pytest.mark.parametrize("argv0,expected", [
    ("/home/u/.venv/bin/hpc-agent", "hpc-agent submit"),
    ("C:/venv/Scripts/hpc-agent.exe", "hpc-agent submit"),
    ("/site-packages/hpc_agent/__main__.py", "python -m hpc_agent submit"),
    ("/site-packages/hpc_agent/submit.py", "python -m hpc_agent.submit"),
    ("/site-packages/hpc_agent/sweep/__main__.py", "python -m hpc_agent.submit"),
    ("/usr/bin/pytest", "python -m hpc_agent.submit"),
    ("", "python -m hpc_agent.submit"),
])
def test_prog_names_the_command_as_it_was_started(argv0, expected):
    assert prog("submit", argv0) == expected


@pytest.mark.parametrize("command", ["submit", "config", "init", "chaos", "sweep", "status"])
def test_usage_line_matches_the_invocation(tmp_path, command):
    """``hpc-agent X --help`` says ``usage: hpc-agent X``; ``python -m hpc_agent.X --help`` says that."""
    script = tmp_path / "hpc-agent"
    script.write_text(CONSOLE_SCRIPT)
    module = f"hpc_agent.{command}"
    for argv, name in (([str(script), command], f"hpc-agent {command}"),
                       (["-m", module], f"python -m {module}"),
                       (["-m", "hpc_agent", command], f"python -m hpc_agent {command}")):
        proc = subprocess.run([sys.executable, *argv, "--help"], capture_output=True, text=True, env=_env(),
                              cwd=str(tmp_path), timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith(f"usage: {name} "), (argv, proc.stdout[:200])

"""Issue 44, item 3: command mode runs the user's script as they wrote it. A script that reads a file next to
itself (``Path(__file__).parent / "params.json"``) and a data file given relative to the submit's folder
(``--data data/train.txt``) completes under the local executor, from the snapshot: the files it read are the
ones submitted, not the checkout's later edits. (tests/cluster/test_command_snapshot_slurm.py: the same
under the real Slurm.)"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_cli

SCRIPT = '''"""Reads a config next to itself and a data file relative to where it runs, as scripts do."""
import argparse
import json
import os
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--data", required=True)
args = parser.parse_args()
params = json.loads((Path(__file__).parent / "params.json").read_text())
from helpers.vocab import load_vocab  # a sibling package, with a data file of its own
vocab = load_vocab()
lines = Path(args.data).read_text().split()
print(f"SCRIPT_OK lr={params['lr']} vocab={len(vocab)} lines={len(lines)} file={__file__} cwd={os.getcwd()}",
      flush=True)
'''
HELPER = '''from pathlib import Path


def load_vocab():
    return (Path(__file__).parent / "vocab.txt").read_text().split()
'''


def write_project(work: Path) -> None:
    """The project, as a user has it: the script, its config, a package with a data file, and data."""
    for rel, text in {"train.py": SCRIPT, "params.json": '{"lr": 0.5}', "helpers/__init__.py": "",
                      "helpers/vocab.py": HELPER, "helpers/vocab.txt": "a b c", "data/train.txt": "x\ny\nz\nw\n",
                      ".hpcignore": "scratch/\n", "scratch/huge.bin": "not copied"}.items():
        path = work / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


COMMAND = "train.command=[python,train.py,--data,data/train.txt]"


@pytest.mark.slow
def test_script_reads_files_next_to_it_and_relative_data_locally(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # no work tree above: the folder rule
    work = tmp_path / "project"
    write_project(work)
    root = tmp_path / "runs"
    proc = run_cli("-m", "hpc_agent.submit", "quickstart", COMMAND, "train.precision=fp32", f"run.runs_root={root}",
                   "--executor", "local", "--wait", "--wait-timeout", "240", cwd=work, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = [p for p in root.iterdir() if p.is_dir()]
    code = run_dir / "code"
    log = "\n".join(p.read_text() for p in (run_dir / "slurm").glob("*_0_log.out"))
    assert f"SCRIPT_OK lr=0.5 vocab=3 lines=4 file={code / 'train.py'} cwd={code}" in log, log[-3000:]
    assert "code:" in proc.stdout and "6 files" in proc.stdout and not (code / "scratch").exists()

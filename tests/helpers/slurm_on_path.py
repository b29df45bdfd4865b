"""The one in-memory Slurm (tests/helpers/fake_slurm.py) as commands on ``PATH``, for bash under test.

``install(bin_dir, state, slurm)`` pickles ``slurm`` to ``state`` and writes ``sbatch``, ``squeue``, ``scontrol`` and
``scancel`` into ``bin_dir``. Each loads the FakeSlurm, runs its argv through it (as ``SlurmCLI.run`` would), prints
its answer, exits with its code and saves it back, under a lock (a background bash loop may call at the same time).
``load(state)`` gives the test the FakeSlurm back to drive it (``start``, ``preempt``...) and ``save`` stores it again.
"""
from __future__ import annotations

import fcntl
import os
import pickle
import shlex
import sys
from contextlib import contextmanager
from pathlib import Path

COMMANDS = ("sbatch", "squeue", "scontrol", "scancel")
ROOT = Path(__file__).resolve().parents[2]


def save(slurm, state: Path) -> None:
    tmp = Path(f"{state}.tmp")
    tmp.write_bytes(pickle.dumps(slurm))
    os.replace(tmp, state)


def load(state: Path):
    return pickle.loads(Path(state).read_bytes())


@contextmanager
def locked(state: Path):
    with open(f"{state}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def install(bin_dir: Path, state: Path, slurm) -> str:
    """Write the commands; returns the PATH to run bash with (``bin_dir`` first)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    save(slurm, state)
    for name in COMMANDS:
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\nPYTHONPATH={shlex.quote(str(ROOT))} exec {shlex.quote(sys.executable)} "
                        f"-m tests.helpers.slurm_on_path {shlex.quote(str(state))} {name} \"$@\"\n")
        path.chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


def main(argv) -> int:
    state, name, args = Path(argv[0]), argv[1], argv[2:]
    from hpc_agent.slurm.cli import SlurmError

    with locked(state):
        slurm = load(state)
        try:
            result = slurm.run([name, *args], check=False)
        except SlurmError as exc:  # break_command(..., timeout=True): what a hung daemon gives
            save(slurm, state)
            sys.stderr.write(f"{exc}\n")
            return 1
        save(slurm, state)
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

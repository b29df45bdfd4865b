"""The canonical FakeSlurm (tests/helpers/fake_slurm.py) behind real executables, for load tests of the watcher.

``install(bin_dir, state)`` writes ``sacct``, ``squeue``, ``scontrol``, ``scancel`` and ``sbatch`` into ``bin_dir``
(a temporary folder the benchmark puts first on PATH; never a system folder). Each is a small Python program
that loads the pickled :class:`FakeSlurm` from ``state``, answers its argv with FakeSlurm's own command
handler (the text shapes tests/cluster/test_slurm_contract.py holds to the real localhost cluster, for the
watcher's exact query too: ``test_watch_query_shape_matches_real``), writes the state back after a command that
changes it (scontrol, scancel, sbatch), and exits with the command's return code. So the watcher's real
``SlurmCLI`` runs a real subprocess per call (process start, argv with 10,000 ids, the text piped back), and
the answer is a cluster's, not a template: requeued jobs' attempts listed with ``-D`` in accounting order (an
old attempt's row first, its newer attempt after other jobs' rows), steps batch/extern/0, ``None assigned``,
``Unknown``, exit codes and CANCELLED 0:15 batch steps of preempted attempts.

:func:`build_cluster` makes the mix of jobs of N runs (``MIX``; see its comment for the shares).
"""
from __future__ import annotations

import hashlib
import os
import pickle
import sys
import time
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

REPO = Path(__file__).resolve().parents[2]
COMMANDS = ("sacct", "squeue", "scontrol", "scancel", "sbatch")
MUTATING = ("scontrol", "scancel", "sbatch")

# The jobs of N followed runs, by i % 20 (shares of a busy cluster's followed runs; every one of them has a
# job in the queue or running, since only those are followed):
#   running        80 %  RUNNING on one node, steps batch, extern and 0 (the srun'd trainer)
#   running2        5 %  RUNNING on two nodes
#   pending         5 %  PENDING, never started (None assigned, Start Unknown)
#   preempted_back  5 %  PREEMPTED attempt (batch CANCELLED 0:15), requeued, expedited, RUNNING again (-D: 2 records)
#   node_fail_back  5 %  NODE_FAIL attempt, requeued, RUNNING again; one in 200 runs (i % 200 == 199) instead:
#   requeued_wait 0.5 %  PREEMPTED, requeued, PENDING until its BeginTime (the watcher expedites it on its first
#                        tick: a handful at any moment, since each waits at most one tick for it)
MIX = ("running",) * 16 + ("running2", "pending", "preempted_back", "node_fail_back")
NODES = 512  # gpu001..gpu512


def kind_of(i: int) -> str:
    return "requeued_wait" if i % 200 == 199 else MIX[i % len(MIX)]


def node_of(i: int, k: int = 0) -> str:
    return f"gpu{(i + k) % NODES + 1:03d}"


def build_cluster(names: Sequence[str], first_job_id: int, t0: float, extern_step: bool = True):
    """A FakeSlurm holding one job per name (job ids ``first_job_id + i``, submitted at ``t0`` or later), in
    the states of :data:`MIX`; returns ``(fake, {job id: kind})``. The clock ends within ~300 s of ``t0``."""
    sys.path.insert(0, str(REPO))
    from tests.helpers.fake_slurm import FakeSlurm

    fake = FakeSlurm(first_job_id=first_job_id, nodes=[node_of(i) for i in range(NODES)], start=t0,
                     extern_step=extern_step, uid=str(os.getuid()))
    ids = [fake.submit(name) for name in names]
    fake.advance(30)  # queued half a minute
    kinds: Dict[str, str] = {}
    for i, job in enumerate(ids):
        kind = kinds[job] = kind_of(i)
        if kind == "pending":
            continue
        fake.start(job, nodes=[node_of(i), node_of(i, 1)] if kind == "running2" else [node_of(i)])
        fake.step(job, "python")
    fake.advance(120)
    for i, job in enumerate(ids):
        kind = kinds[job]
        if kind in ("preempted_back", "requeued_wait"):
            fake.preempt(job)
        elif kind == "node_fail_back":
            fake.node_fail(job, requeue=True)
    fake.advance(30)
    for i, job in enumerate(ids):
        if kinds[job] in ("preempted_back", "node_fail_back"):
            fake.job(job).begin = fake.now  # expedited (scontrol update StartTime=now), then scheduled
            fake.start(job, nodes=[node_of(i, 7)])
            fake.step(job, "python")
    fake.advance(60)
    return fake, kinds


def save(fake, state: Path) -> None:
    tmp = state.with_name(state.name + ".tmp")
    tmp.write_bytes(pickle.dumps(fake, protocol=pickle.HIGHEST_PROTOCOL))
    os.replace(tmp, state)


SHIM = """#!{python}
# {command}: FakeSlurm behind an executable (scripts/bench/fake_slurm_bin.py), for a benchmark; state in {state}
import sys
sys.path.insert(0, {repo!r})
from scripts.bench.fake_slurm_bin import main
sys.exit(main({state!r}, sys.argv))
"""


def install(bin_dir: Path, state: Path, commands: Sequence[str] = COMMANDS) -> List[Path]:
    """The executables, in ``bin_dir`` (created; must be a folder of the caller's, put first on PATH)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    made = []
    for command in commands:
        path = bin_dir / command
        path.write_text(SHIM.format(python=sys.executable, command=command, state=str(state), repo=str(REPO)))
        path.chmod(0o755)
        made.append(path)
    return made


def answer(fake, argv: Sequence[str]) -> Tuple[int, str, str]:
    """FakeSlurm's answer to one command line (``argv[0]`` the command's name)."""
    from hpc_agent.slurm.cli import SlurmError

    try:
        result = fake.run([Path(argv[0]).name, *argv[1:]], check=False)
    except SlurmError as exc:
        return 1, "", f"{exc}\n"
    return result.returncode, result.stdout, result.stderr


MIN_S_ENV = "FAKE_SLURM_MIN_S"
"""Optional: every command takes at least this many seconds (a slurmdbd's latency), set by the benchmark."""


def _memo_path(state: Path, argv: Sequence[str]) -> Path:
    return state.with_name(state.name + ".answers") / hashlib.sha1("\0".join(argv[1:]).encode()).hexdigest()


def main(state: str, argv: Sequence[str]) -> int:
    """Answer one command line. A ``sacct`` answer without Elapsed (the only column that moves while nothing
    happens; the watcher does not ask for it) is kept and given again until the state changes: FakeSlurm renders
    10,000 jobs in ~1.3 s of Python here, the real sacct ~0.3 s; the first call of the benchmark renders it."""
    started = time.monotonic()
    path = Path(state)
    command = Path(argv[0]).name
    memo = _memo_path(path, argv) if command == "sacct" and "Elapsed" not in " ".join(argv) else None
    try:
        if memo is None or memo.stat().st_mtime_ns < path.stat().st_mtime_ns:
            raise FileNotFoundError
        rc, out, err = 0, memo.read_text(), ""
    except FileNotFoundError:
        sys.path.insert(0, str(REPO))
        import tests.helpers.fake_slurm  # noqa: F401 - the pickled classes

        fake = pickle.loads(path.read_bytes())
        fake._now = max(fake._now, time.time())  # Elapsed of a running job grows as on a cluster
        rc, out, err = answer(fake, argv)
        if command in MUTATING and rc == 0 and not any(a.startswith("--test-only") for a in argv):
            fake.calls, fake.commands, fake.sacct_calls = [], [], []
            save(fake, path)
        elif memo is not None and rc == 0:
            memo.parent.mkdir(exist_ok=True)
            memo.write_text(out)
    wait = float(os.environ.get(MIN_S_ENV, "0") or 0) - (time.monotonic() - started)
    if wait > 0:
        time.sleep(wait)
    sys.stdout.write(out)
    sys.stderr.write(err)
    return rc

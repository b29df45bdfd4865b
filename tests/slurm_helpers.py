"""Helpers for tests against the real localhost Slurm (scripts/cluster.sh up)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from hpc_agent.slurm.cli import SlurmCLI
from hpc_agent.slurm.sacct import SACCT_FIELDS, group_attempts, parse_sacct
from tests.conftest import REPO, run_cli

CLUSTER = ["bash", str(REPO / "scripts" / "cluster.sh")]
SLURM = SlurmCLI(timeout_s=60)

# A run that lasts long enough to be preempted or failed on purpose: ~0.03 s a step on this machine.
LONG_RUN = ["slurm.mem=2G", "train.workload=gpt", "model.n_layers=2", "model.d_model=32", "model.seq_len=32",
            "train.precision=fp32", "train.zero_stage=1", "train.log_every=1"]


def wait_for(predicate: Callable[[], object], timeout: float, interval: float = 0.5, what: str = "condition",
             explain: Optional[Callable[[], str]] = None):
    """Poll ``predicate`` until it is truthy; on timeout, fail with ``explain()`` (the state that says why)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    detail = f"\n{explain()}" if explain is not None else ""
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{detail}")


def accounting(args: Sequence[str], done: Callable[[str], bool] = bool, wait_s: float = 30.0) -> str:
    """``sacct --parsable2 --noheader ARGS``, asked again until ``done(text)`` or ``wait_s``: slurmdbd records a
    job seconds after slurmctld ran it on a busy machine (a job that ended 1 s ago can be missing, seen in
    CI), so an assertion on accounting waits for it the way the watcher's own queries tolerate it."""
    deadline = time.monotonic() + wait_s
    while True:
        text = SLURM.run(["sacct", "--parsable2", "--noheader", *args]).stdout
        if done(text) or time.monotonic() > deadline:
            return text
        time.sleep(0.5)


def queue_and_nodes() -> str:
    """squeue and sinfo as text: what a timed-out wait on the cluster reports."""
    queue = SLURM.run(["squeue", "--array", "--format", "%i|%P|%j|%T|%r|%N"], check=False).stdout
    nodes = SLURM.run(["sinfo", "--Node", "--noheader", "--format", "%N|%P|%T|%E"], check=False).stdout
    return f"squeue:\n{queue}sinfo:\n{nodes}"


def end_jobs(job_ids: Sequence[str], signal_for_s: float = 10.0) -> None:
    """End these jobs now. A plain ``scancel`` of a running hpc_agent job holds its node COMPLETING for KillWait
    (30 s here): its ranks answer the SIGTERM with a checkpoint and then wait to be requeued or killed
    (launch/signals.py), and a cancelled job's steps can no longer be signalled. So the running ones get a
    SIGTERM every second, for at most ``signal_for_s``, until they stop running (a second one ends that wait, as
    the end of a preemption's grace does; a rank still starting up answers only later), then every one is
    cancelled: ~4 s instead of 32 s, measured. A job that outlasts the signals still ends at KillWait."""
    ids = [str(j) for j in job_ids if j]
    deadline = time.monotonic() + signal_for_s
    while ids and time.monotonic() < deadline:
        listed = SLURM.run(["squeue", "--noheader", "--array", "--jobs", ",".join(ids), "--format", "%i|%T"],
                           check=False).stdout
        running = [line.split("|")[0] for line in listed.split() if line.endswith("|RUNNING")]
        if not running:
            break
        SLURM.run(["scancel", "--signal=TERM", *running], check=False)
        time.sleep(1.0)
    if ids:
        SLURM.run(["scancel", *ids], check=False)


def settle_cluster(timeout_s: float = 90.0) -> str:
    """Before a real-cluster test: end whatever an earlier test left in the queue (:func:`end_jobs`), end the ranks
    of jobs already cancelled, and wait until every node is idle again (a cancelled job holds its node COMPLETING
    for up to KillWait). Tests share two nodes, so a leftover would otherwise delay the next test's jobs by
    minutes. Returns what it had to end."""
    mine = SLURM.run(["squeue", "--noheader", "--user", str(os.getuid()), "--format", "%A|%j|%T"], check=False).stdout
    # A job already COMPLETING was cancelled (or ended) by its test: not reported.
    leftovers = [line for line in mine.splitlines() if line.strip() and not line.endswith("|COMPLETING")]
    if leftovers:
        end_jobs([line.split("|")[0] for line in leftovers])
    # A cancelled job (by its test, or by a watcher: a hung one) can no longer be signalled through Slurm, and its
    # ranks would hold the node COMPLETING until KillWait. On this one-host cluster they are this host's processes.
    mine = SLURM.run(["squeue", "--noheader", "--user", str(os.getuid()), "--format", "%A|%T"], check=False).stdout
    for job_id in [line.split("|")[0] for line in mine.split() if line.endswith("|COMPLETING")]:
        for pid in training_pids(job_id):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        queue = SLURM.run(["squeue", "--noheader", "--format", "%A"], check=False).stdout.split()
        states = SLURM.run(["sinfo", "--Node", "--noheader", "--format", "%T"], check=False).stdout.split()
        if not queue and states and all(s.rstrip("*~#") in ("idle", "down", "drained", "drain") for s in states):
            break
        time.sleep(0.5)
    return "\n".join(leftovers)


def submit(root: Path, *overrides: str, config: str = "quickstart") -> Tuple[Path, str]:
    before = {p.name for p in root.iterdir()} if root.exists() else set()
    proc = run_cli("-m", "hpc_agent.submit", config, "--executor", "slurm", f"run.runs_root={root}", *overrides)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = [p for p in root.iterdir() if p.is_dir() and p.name not in before]
    return run_dir, json.loads((run_dir / "run.json").read_text())["job_ids"][-1]


def attempts(job_id: str):
    return group_attempts(parse_sacct(SLURM.sacct([job_id], fields=SACCT_FIELDS))).get(str(job_id), [])


def states(job_id: str) -> List[str]:
    return [a.state for a in attempts(job_id)]


def log_text(run_dir: Path, job_id: Optional[str] = None) -> str:
    pattern = f"{job_id}_0_log.out" if job_id else "*_0_log.out"
    return "\n".join(p.read_text(errors="replace") for p in sorted((run_dir / "slurm").glob(pattern)))


def last_step(text: str) -> int:
    steps = [int(m) for m in re.findall(r"\[hpc_agent\] step (\d+) ", text)]
    return max(steps) if steps else 0


def job_nodes(job_id: str) -> List[str]:
    found = attempts(job_id)
    return found[-1].nodes if found else []


def preempt_all_nodes(seconds: int = 3) -> str:
    """A job in the high partition that needs every CPU: Slurm preempts what runs in `low`."""
    out = SLURM.run(["sbatch", "--parsable", "--partition", "high", "--nodes", "2", "--ntasks-per-node", "2",
                     "--output", "/dev/null", "--wrap", f"sleep {seconds}"]).stdout
    return out.strip().split(";")[0]


def ledger_job_ids(root: Path, run_id: str) -> List[str]:
    from hpc_agent.state.ledger import Ledger

    return [s.job_id for s in Ledger.in_runs_root(root).submissions(run_id) if s.job_id]


def events(run_dir: Path) -> List[Dict]:
    path = run_dir / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


class WatcherProcess:
    """``python -m hpc_agent.watch`` as a user runs it, in the background, with its output kept."""

    def __init__(self, root: Path, interval: float = 1.0, env: Optional[Dict[str, str]] = None,
                 args: Sequence[str] = ()):
        self.log = root / f"watch-{time.time_ns()}.log"
        full_env = dict(os.environ, **(env or {}))
        self.handle = open(self.log, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "hpc_agent.watch", "--runs-root", str(root),
                                      "--interval", str(interval), *args], stdout=self.handle, stderr=subprocess.STDOUT,
                                     cwd=str(REPO), env=full_env)

    def output(self) -> str:
        return self.log.read_text()

    def wait_until_following(self, timeout_s: float = 60.0) -> None:
        """Until it holds the runs root's lease (it logs "[watch] following" right after taking it): a sweep or
        submit --wait started after this observes it instead of running its own embedded watcher."""
        wait_for(lambda: "[watch] following" in self.output() or self.proc.poll() is not None, timeout_s,
                 what="the watcher to take the lease")
        assert self.proc.poll() is None, self.output()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.handle.close()
        return self.proc.returncode


def cleanup_jobs(root: Path) -> None:
    """Cancel whatever the test left queued or running under this runs root's run ids."""
    from hpc_agent.state.ledger import Ledger

    from hpc_agent.core.handback import job_chain

    if not (root / "ledger.sqlite").exists():
        return
    ledger = Ledger.in_runs_root(root)
    try:  # with the successors the jobs named (a hand-over no watcher copied into the ledger)
        ids = [j for r in ledger.runs() for j in job_chain(r.run_dir, [s.job_id for s in ledger.submissions(r.run_id)])]
    finally:
        ledger.close()
    end_jobs(ids)


def training_pids(job_id: str) -> List[int]:
    """The pids of a running job's training processes on this host (all nodes of the localhost cluster
    are this host): those whose environment names the job and a task rank (SLURM_PROCID), not srun,
    slurmstepd or the batch shell."""
    found = []
    want = f"SLURM_JOB_ID={job_id}".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if want in env and any(e.startswith(b"SLURM_PROCID=") for e in env) and b"python" in cmdline \
                and b"srun" not in cmdline.split(b"\0")[0]:
            found.append(int(proc.name))
    return sorted(found)


def preempt_node(node: str, seconds: int) -> str:
    """A job in the high partition that needs every CPU of ``node`` for ``seconds``: Slurm preempts what runs
    there in a lower tier, and a preempted 1-node run can only come back on the other node meanwhile."""
    out = SLURM.run(["sbatch", "--parsable", "--partition", "high", "--nodes", "1", "--nodelist", node,
                     "--ntasks-per-node", "2", "--output", "/dev/null", "--wrap", f"sleep {seconds}"]).stdout
    return out.strip().split(";")[0]


def preempt_after_step_20(run_dir: Path, job: str, hold_s: int = 25) -> Tuple[str, int]:
    """Let the run train to step 20, preempt its node for ``hold_s`` seconds (:func:`preempt_node`), and wait for
    the signal's checkpoint and the hand-back; returns the preempted node and the step the checkpoint saved
    (nothing was trained after it)."""
    import re

    wait_for(lambda: last_step(log_text(run_dir, job)) >= 20, 180, what="step 20 of the low-priority run")
    (node,) = job_nodes(job)
    preempt_node(node, hold_s)
    text = wait_for(lambda: (t := log_text(run_dir, job)) and "this attempt ends now" in t and t, 60,
                    what="the signal checkpoint and the hand-back")
    signal_line = re.search(r"\[hpc_agent\] signal SIGUSR2 at step (\d+): checkpoint (step_\d+) complete", text)
    assert signal_line, text[-3000:]
    saved = int(signal_line.group(1))
    assert last_step(text[:signal_line.start()]) == saved  # nothing trained after the saved step
    return node, saved


def job_pids(job_id: str, first_attempt_only: bool = False) -> List[int]:
    """Every process on this host (all nodes of the localhost cluster) of the job: its environment names the
    job. The batch shell, srun and every rank count; slurmstepd (no job environment) does not. With
    ``first_attempt_only``, only those of the job's first attempt: no SLURM_RESTART_COUNT (Slurm sets it from
    the first requeue on)."""
    want = f"SLURM_JOB_ID={job_id}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if want in env and not (first_attempt_only and any(e.startswith(b"SLURM_RESTART_COUNT=") for e in env)):
            found.append(int(proc.name))
    return sorted(found)


def first_attempt_pids(job_id: str) -> List[int]:
    """The processes of the job's *first* attempt (:func:`job_pids`)."""
    return job_pids(job_id, first_attempt_only=True)


def run_phase(root: Path, run_id: str) -> str:
    """The run's phase in the ledger under the runs root."""
    from hpc_agent.state.ledger import Ledger

    return Ledger.in_runs_root(root).run(run_id).phase

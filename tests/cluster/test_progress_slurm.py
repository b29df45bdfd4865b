"""Issue 19 on the real localhost Slurm, with no ``python -m hpc_agent.watch`` running anywhere.

Must-show 2: the progress output of a real ``submit --wait`` (not a TTY: plain lines). A blocker job holds
every node for a few seconds, so the first lines show the job pending with squeue's reason and its place
in the queue; then step N of M with steps/s and ETA; a preemption (a high-partition job, as in
test_preemption_slurm.py) that submit's own embedded watcher handles (cause and decision lines); and the
final state line. The output is saved in the test's tmp dir and printed.

Must-show 5: a sweep whose trials fail with a code error, and no watcher process: the sweep's embedded
watcher judges the failed trials, the sweep finishes its budget within a bound, and its summary is true.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO
from tests.slurm_helpers import LONG_RUN, SLURM, events, last_step, log_text, preempt_all_nodes, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
STEPPING = re.compile(r"job (\S+) RUNNING, step (\d+) of (\d+) \(\d+%\), [\d.]+ steps/s, ETA \d")


def _blocker(seconds: int) -> str:
    """A job in ``low`` (the run's own partition, same tier: never preempted by it) on every CPU."""
    out = SLURM.run(["sbatch", "--parsable", "--partition", "low", "--nodes", "2", "--ntasks-per-node", "2",
                     "--job-name", "issue19-blocker", "--output", "/dev/null", "--wrap", f"sleep {seconds}"]).stdout
    job = out.strip().split(";")[0]
    wait_for(lambda: SLURM.run(["squeue", "--noheader", "--jobs", job, "--format", "%T"], check=False)
             .stdout.strip() == "RUNNING", 60, what="the blocker to run")
    return job


def test_submit_wait_shows_progress_and_its_own_watcher_handles_a_preemption(root, tmp_path):
    root.mkdir(parents=True)
    out_path = tmp_path / "submit_wait_output.txt"
    blocker = _blocker(8)
    with open(out_path, "w") as handle:  # a file: not a TTY, so plain lines
        proc = subprocess.Popen(
            [sys.executable, "-m", "hpc_agent.submit", "quickstart", "--executor", "slurm", "--wait",
             "--wait-timeout", "240", f"run.runs_root={root}", *LONG_RUN, "run.name=progress", "resilience.successor_on_preempt=false", "slurm.nodes=2",
             "train.max_steps=1500", "train.ckpt_every=500", "resilience.heartbeat_s=2"],
            stdout=handle, stderr=subprocess.STDOUT, cwd=str(REPO), env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        text = lambda: out_path.read_text()  # noqa: E731
        # Training reported with its rate and ETA, then the preemption: the run's own watcher must handle it.
        found = wait_for(lambda: STEPPING.search(text()), 150, what="a step line with steps/s and ETA")
        run_dir = next(p for p in root.iterdir() if p.is_dir())
        wait_for(lambda: last_step(log_text(run_dir, found.group(1))) >= 100, 60, what="step 100")
        preempt_all_nodes(seconds=2)
        proc.wait(timeout=200)
    finally:
        if proc.poll() is None:
            proc.kill()
        SLURM.run(["scancel", blocker], check=False)
    output = out_path.read_text()
    print(f"--- captured submit --wait output ({out_path}) ---\n{output}--- end ---")
    assert proc.returncode == 0, output
    assert "\x1b" not in output  # never ANSI when not a TTY
    assert "[embedded watch] no watcher holds" in output  # nobody else watched: submit ran its own
    pending = re.search(r"run progress-\S+: job \S+ PENDING, reason (\w+)(, position \d+ of \d+ in low)?", output)
    assert pending and pending.group(2), output  # squeue's reason (Resources: the blocker) and the place
    assert output.index(pending.group(0)) < output.index(found.group(0))  # pending first, then stepping
    decision = re.search(r"last cause (\w+), decision (\w+)", output)
    assert decision and decision.group(1) == "preempted" and decision.group(2) in ("expedite", "requeue"), output
    assert re.search(r"run progress-\S+: job \S+ finished COMPLETED \(run completed\)", output), output
    assert re.search(r"^job \S+ finished: COMPLETED$", output, re.M), output
    from hpc_agent.state.ledger import Ledger

    ledger = Ledger.in_runs_root(root)
    assert ledger.run(run_dir.name).phase == "completed"
    assert any(e.get("action") == "expedite" and e.get("cause") == "preempted" for e in events(run_dir))


def test_sweep_without_a_watcher_judges_failed_trials_and_reports_them(root, tmp_path):
    import optuna

    from hpc_agent.state.ledger import Ledger
    from tests.cluster.test_sweep_slurm import study_of, sweep_cmd, sweep_file

    root.mkdir(parents=True)
    path = sweep_file(tmp_path, "fails")
    started = time.monotonic()
    proc = subprocess.run(sweep_cmd(path, root, "--trials", "2", "--parallel", "2", "faults.error_at_step=3"),
                          capture_output=True, text=True, timeout=240, cwd=str(REPO))
    took = time.monotonic() - started
    print(f"--- sweep output ({took:.0f} s) ---\n{proc.stdout}{proc.stderr}--- end ---")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert took < 120, f"the sweep took {took:.0f} s"
    assert "[embedded watch] no watcher holds" in proc.stdout
    study = study_of(root, path)
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.FAIL] * 2
    ledger = Ledger.in_runs_root(root)
    for trial in study.trials:
        run_id = trial.user_attrs["run_id"]
        assert ledger.run(run_id).phase == "stopped"
        assert [d.cause for d in ledger.decisions(run_id)][-1:] == ["code_error"]
    (done,) = [line for line in proc.stdout.splitlines() if "] done: " in line]
    assert "'FAIL': 2" in done and "RUNNING" not in done and "'stopped': 2" in done, done
    assert re.search(r"trial \d: job \S+ (PENDING|RUNNING)", proc.stdout), proc.stdout  # progress lines

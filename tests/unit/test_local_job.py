"""hpc_agent.diagnosis.local_job: how a local-executor job ended, from its process, result files and exit line
(a table of cases; pure), and hpc_agent.jobs.local_process, which finds those facts on the machine."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import pytest

from hpc_agent.core import rundir
from hpc_agent.core.rundir import LogText
from hpc_agent.diagnosis.local_job import LocalFacts, classify_local, host_of, local_state
from hpc_agent.jobs.local_process import local_facts, process_alive, result_tags

START = "submitit INFO (2026-12-04 10:15:01,000) - Starting with JobEnvironment(job_id=4242, hostname=lap, " \
        "local_rank=0(1), node=0(1), global_rank=0(1))"
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
OOM_EXIT = "[hpc_agent] out of memory at step 4 during training (micro_batch_size 16, ZeRO-1); exiting 3"
TRACEBACK = "Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\nValueError: bad column"
DONE = "[hpc_agent] done: 10 steps"


@dataclass
class Case:
    id: str
    alive: Optional[bool]
    lines: Sequence[str]
    state: str
    exit_code: str
    cause: str
    results: Tuple[Tuple[int, str], ...] = ()
    basis: str = ""


CASES = [
    Case("alive-is-running", True, [START, "[hpc_agent] step 3 loss 4.1"], "RUNNING", "", "running",
         basis="process 4242 is alive"),
    Case("alive-with-an-oom-line-is-still-running", True, [START, OOM], "RUNNING", "", "running"),
    Case("gone-oom-and-exit-line", False, [START, OOM, OOM_EXIT], "FAILED", "3:0", "gpu_oom",
         basis="state FAILED, exit 3: from the exit line"),
    Case("gone-exit-line-alone-names-the-cause", False, [START, OOM_EXIT], "FAILED", "3:0", "gpu_oom",
         basis="exit line in the log"),
    Case("gone-success-result", False, [START, DONE], "COMPLETED", "0:0", "completed", results=((0, "success"),),
         basis="the result file says success"),
    Case("gone-success-but-announced-diverged", False, [START, "[hpc_agent] diverged: loss is nan at step 7; "
                                                               "no checkpoint written; exiting 65"],
         "FAILED", "65:0", "diverged", results=((0, "success"),)),
    Case("gone-error-result-traceback", False, [START, TRACEBACK], "FAILED", "1:0", "code_error",
         results=((0, "error"),), basis="an exception escaped the job"),
    Case("gone-one-rank-error", False, [START, TRACEBACK], "FAILED", "1:0", "code_error",
         results=((0, "success"), (1, "error"))),
    Case("gone-nothing-recorded-traceback", False, [START, TRACEBACK], "FAILED", "", "code_error",
         basis="exit status not recorded"),
    Case("gone-nothing-recorded-oom-line", False, [START, OOM], "FAILED", "", "gpu_oom"),
    Case("unknown-host-exit-line-decides", None, [START, OOM, OOM_EXIT], "FAILED", "3:0", "gpu_oom"),
    Case("unknown-host-nothing-else-state-unknown", None, [START, OOM], "", "", "gpu_oom",
         basis="state unknown: liveness cannot be checked"),
    Case("unknown-host-no-lines-unknown", None, [START], "", "", "unknown"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_local_state_and_cause(case: Case):
    facts = LocalFacts("4242", case.alive, {True: "process 4242 is alive", False: "no process 4242 on this host",
                                            None: "it ran on lap, not on this host"}[case.alive], case.results)
    logs = [LogText("4242_0_log.out", "\n".join(case.lines) + "\n")]
    state, exit_code, basis = local_state(facts, logs)
    assert (state, exit_code) == (case.state, case.exit_code), basis
    found = classify_local(facts, logs)
    assert found.cause.value == case.cause, found.evidence
    assert found.state == case.state
    assert found.evidence[0].startswith("local process 4242 (executor local: no sacct record")
    assert not any(e.startswith("sacct:") for e in found.evidence), found.evidence  # there was no sacct
    if case.basis:
        assert any(case.basis in e for e in found.evidence), found.evidence


def test_host_of_reads_submitits_start_line():
    assert host_of([LogText("a", START)], "4242") == "lap"
    assert host_of([LogText("a", START)], "4243") is None  # another job's line (a reused folder)
    assert host_of([LogText("a", "nothing")], "4242") is None


# --- the machine's facts (I/O) --------------------------------------------------------------------------------
class RunsCode:
    """Unpickling this would create the file it names: the proof that a reader never unpickles."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_result_tags_read_opcodes_never_unpickle(tmp_path):
    run_dir = tmp_path / "run"
    rundir.slurm_dir(run_dir).mkdir(parents=True)
    planted = tmp_path / "unpickled"
    rundir.result_path(run_dir, "4242", 0).write_bytes(pickle.dumps(("success", RunsCode(str(planted)))))
    rundir.result_path(run_dir, "4242", 1).write_bytes(pickle.dumps(("error", "Traceback ...")))
    rundir.result_path(run_dir, "4242", 2).write_bytes(b"not a pickle")
    (tmp_path / "elsewhere.pkl").write_bytes(pickle.dumps(("success", 0)))
    rundir.result_path(run_dir, "4242", 3).symlink_to(tmp_path / "elsewhere.pkl")
    assert result_tags(run_dir, "4242", [0, 1, 2, 3, 4]) == ((0, "success"), (1, "error"), (2, ""), (3, ""))
    assert not planted.exists()


def test_process_alive_needs_the_jobs_folder_in_its_command_line(tmp_path):
    marker = str(tmp_path / "run" / "slurm")
    mine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        alive, how = process_alive(str(mine.pid), marker)
        assert alive is True and "alive" in how
        alive, how = process_alive(str(other.pid), marker)  # a reused id: another program
        assert alive is False and "another program" in how
    finally:
        for proc in (mine, other):
            proc.kill()
            proc.wait()
    alive, how = process_alive(str(mine.pid), marker)
    assert alive is False
    assert process_alive("notapid", marker)[0] is None and process_alive("1", marker)[0] is None


def test_process_alive_sees_a_zombie_as_gone(tmp_path):
    marker = str(tmp_path / "slurm")
    proc = subprocess.Popen([sys.executable, "-c", "pass", marker])
    try:
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
        alive, how = process_alive(str(proc.pid), marker)
        assert alive is False and "zombie" in how
    finally:
        proc.wait()


def test_local_facts_on_another_host_cannot_tell(tmp_path):
    run_dir = tmp_path / "run"
    rundir.slurm_dir(run_dir).mkdir(parents=True)
    facts = local_facts(run_dir, str(os.getpid()), [LogText("4242_0_log.out", START.replace("4242", str(os.getpid())))],
                        [0])
    assert facts.alive is None and "it ran on lap" in facts.alive_basis


# --- the watcher's attempt of a local job (pure) ----------------------------------------------------------------
T0 = 1.8e9  # a start, epoch seconds


@pytest.mark.parametrize("state, code, started, ended, fields", [
    ("RUNNING", "", T0, None, {"State": "RUNNING", "End": "Unknown", "Elapsed": None}),
    ("RUNNING", "", T0, T0 + 99, {"End": "Unknown", "Elapsed": None}),  # a running job's end is not its log's mtime
    ("COMPLETED", "0:0", T0, T0 + 65, {"State": "COMPLETED", "ExitCode": "0:0", "Elapsed": "00:01:05"}),
    ("COMPLETED", "", T0, T0 + 65, {"ExitCode": "0:0"}),
    ("FAILED", "3:0", T0, T0 + 90061, {"State": "FAILED", "ExitCode": "3:0", "Elapsed": "1-01:01:01"}),
    ("FAILED", "", T0, None, {"ExitCode": "", "End": "Unknown", "Elapsed": None}),  # no file to date the end
    ("FAILED", "1:0", T0, T0 - 30, {"Elapsed": "00:00:00"}),  # a file dated before the start: never a negative time
    ("FAILED", "1:0", None, T0, {"Start": "Unknown", "Elapsed": None}),
], ids=["running", "running-log-touched", "completed", "completed-no-code", "failed-a-day", "failed-undated",
        "end-before-start", "start-unknown"])
def test_local_row_is_the_sacct_row_of_a_local_job(state, code, started, ended, fields):
    from hpc_agent.diagnosis.local_job import local_row, sacct_time

    row = local_row("4242", state, code, started, ended, host="lap.example.org")
    assert row is not None and (row.job_id, row.base_id, row.step) == ("4242", "4242", None)
    assert row.get("NodeList") == "lap" and row.nodes == ["lap"]
    expected = {"Start": sacct_time(started), **fields}
    for name, value in expected.items():
        assert (row.fields.get(name)) == value, (name, row.fields)


def test_local_attempt_reads_like_one_from_sacct():
    from hpc_agent.diagnosis.local_job import local_attempt
    from hpc_agent.watcher.observe import attempt_end, attempt_start

    attempt = local_attempt("4242", "FAILED", "3:0", T0, T0 + 65)
    assert (attempt.job_id, attempt.index, attempt.state, attempt.exit_code) == ("4242", 0, "FAILED", "3:0")
    assert (attempt_start(attempt), attempt_end(attempt)) == (T0, T0 + 65)  # the watcher's readers of sacct times
    assert local_attempt("4242", "", "", T0, None) is None  # state unknown: no attempt (the watcher waits)
    assert local_attempt("local", "RUNNING", "", T0, None) is None  # not a process id


def test_observe_local_of_a_live_job_reads_no_file(tmp_path):
    from hpc_agent.jobs.local_process import observe_local

    run_dir = tmp_path / "run"
    folder = rundir.slurm_dir(run_dir)
    folder.mkdir(parents=True)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(folder)])
    try:
        (folder / f"{proc.pid}_0_log.out").write_text(OOM_EXIT + "\n")  # an exit line while alive: still running
        seen = observe_local(run_dir, str(proc.pid), T0)
        assert seen.attempt.state == "RUNNING" and not seen.final and seen.attempt.end == "Unknown"
    finally:
        proc.kill()
        proc.wait()
    seen = observe_local(run_dir, str(proc.pid), T0)
    assert (seen.attempt.state, seen.attempt.exit_code, seen.final) == ("FAILED", "3:0", True)
    assert seen.attempt.end != "Unknown"  # dated by the log's mtime

"""submit after a successful sbatch: whatever fails next (run.json, the ledger, printing), the job is never
orphaned. The run keeps its job id and stays followed, and the user is told the job id and that ``watch``
follows it. Only sbatch's own refusal (no job id) stops the run.

In-process, with a fake submitit executor: no job runs. tests/cluster/test_submit_slurm.py repeats the run.json case
against the real localhost cluster.
"""
from __future__ import annotations

import sqlite3
import sys
from types import SimpleNamespace

import pytest

from hpc_agent import submit
from hpc_agent.config.load import load_config, write_run_config
from hpc_agent.core.rundir import read_run_json
from hpc_agent.jobs import submission
from hpc_agent.state.ledger import Ledger
from hpc_agent.state.lifecycle import FOLLOWED, Action, Event, EventKind, Phase


class FakeExecutor:
    def __init__(self, job_id="4242", refuse=None):
        self.job_id, self.refuse, self.submitted = job_id, refuse, []

    def submit(self, fn):
        if self.refuse:
            raise RuntimeError(self.refuse)
        self.submitted.append(fn)
        return SimpleNamespace(job_id=self.job_id, done=lambda: True, result=lambda: None)


@pytest.fixture
def executor(monkeypatch):
    fake = FakeExecutor()
    monkeypatch.setattr(submission, "make_executor", lambda *a, **k: fake)
    return fake


def run_submit(root):
    return submit.main(["quickstart", "--executor", "local", f"run.runs_root={root}"])


def the_run(root):
    ledger = Ledger.in_runs_root(root)
    (run,) = ledger.runs()
    return run, ledger.submissions(run.run_id)


def test_run_json_failing_after_sbatch_leaves_the_run_pending_and_says_so(tmp_path, executor, monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(submission, "update_run_json", broken)
    assert run_submit(tmp_path) == 0
    run, subs = the_run(tmp_path)
    assert run.phase == "pending"
    assert [s.job_id for s in subs] == ["4242"] and subs[0].error is None
    out, err = capsys.readouterr()
    assert "job 4242 was submitted, but writing run.json failed afterwards: [Errno 28] No space left" in err
    assert f"python -m hpc_agent.watch --runs-root {tmp_path}` will follow it" in err
    assert "job id:       4242 (local)" in out  # the usual summary still follows


def test_the_ledger_failing_after_sbatch_still_records_the_job_id(tmp_path, executor, monkeypatch, capsys):
    def locked(self, run_id, event):
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(Ledger, "advance", locked)
    assert run_submit(tmp_path) == 0
    run, subs = the_run(tmp_path)
    assert [s.job_id for s in subs] == ["4242"]  # rolled back with the phase, then written on its own
    assert Phase(run.phase) in FOLLOWED  # submitting with a job id: the watcher follows it like a pending run
    err = capsys.readouterr().err
    assert "job 4242 was submitted, but recording it in the ledger failed" in err
    assert "the ledger has its job id" in err and "will follow it" in err


def test_a_ledger_that_cannot_record_at_all_leaves_the_intent_for_reconciliation(tmp_path, executor, monkeypatch,
                                                                                 capsys):
    def broken(self, submission_id, job_id):
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(Ledger, "record_submitted", broken)
    assert run_submit(tmp_path) == 0
    run, subs = the_run(tmp_path)
    assert run.phase == "submitting" and subs[0].job_id is None and subs[0].error is None  # an open intent
    err = capsys.readouterr().err
    assert f"finds it in Slurm by its name hpc_agent:{run.run_id}" in err and "4242" in err


def test_printing_failing_after_sbatch_does_not_stop_the_run(tmp_path, executor, monkeypatch, capsys):
    class ClosedPipe:
        def write(self, text):
            if text.startswith("run id:"):
                raise BrokenPipeError(32, "Broken pipe")
            return len(text)

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    assert run_submit(tmp_path) == 0
    run, subs = the_run(tmp_path)
    assert run.phase == "pending" and [s.job_id for s in subs] == ["4242"]
    err = capsys.readouterr().err
    assert "printing the summary failed" in err and "job 4242" in err and "will follow it" in err


def test_only_sbatch_refusing_stops_the_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(submission, "make_executor",
                        lambda *a, **k: FakeExecutor(refuse="sbatch: error: invalid partition specified: nope"))
    assert run_submit(tmp_path) == submit.EXIT_SUBMIT_FAILED
    run, subs = the_run(tmp_path)
    assert run.phase == "stopped"
    assert subs[0].job_id is None and "invalid partition" in subs[0].error
    assert "Submission failed: sbatch: error: invalid partition" in capsys.readouterr().err


def test_submit_attempt_moves_a_first_submission_and_a_resubmission_to_pending(tmp_path, executor):
    cfg = load_config("quickstart", [f"run.runs_root={tmp_path}"])
    ledger = Ledger.in_runs_root(tmp_path)
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    ledger.add_run("r", "r", str(run_dir))
    path = write_run_config(run_dir, cfg)
    assert path == run_dir / "config.yaml"
    submission.submit_attempt(ledger, "r", run_dir, cfg, path, "local", reason="submit")
    assert ledger.run("r").phase == "pending"
    ledger.advance("r", Event(EventKind.STARTED, "4242"))
    ledger.advance("r", Event(EventKind.ENDED, "4242", action=Action.RESUBMIT))
    executor.job_id = "4343"
    submission.submit_attempt(ledger, "r", run_dir, cfg, path, "local", reason="oom")
    assert ledger.run("r").phase == "pending"
    assert [s.job_id for s in ledger.submissions("r")] == ["4242", "4343"]
    info = read_run_json(run_dir)
    assert info["job_ids"] == ["4242", "4343"] and info["logs"] == [str(run_dir / "slurm" / "4343_0_log.out")]


def test_run_json_is_read_as_untrusted(tmp_path):
    (tmp_path / "run.json").symlink_to("/dev/zero")
    with pytest.raises(OSError, match="symbolic link"):
        read_run_json(tmp_path)


def test_the_submit_action_is_audited_with_who_and_why(tmp_path, executor):
    import getpass

    from hpc_agent.state.journal import Journal

    assert run_submit(tmp_path) == 0
    run, _ = the_run(tmp_path)
    ((_, _, record),) = Journal(Ledger.in_runs_root(tmp_path)).audit_records(run.run_id)
    assert record["action"] == "submit" and record["job_id"] == "4242" and record["result"] == "submitted"
    assert record["by"]["process"] == "submit" and record["by"]["user"] == getpass.getuser()
    assert "hpc_agent.submit" in record["reason"] and record["config_diff"] == {}


class _Canary:
    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.mark.parametrize("content, state", [
    ("success", "COMPLETED"),
    ("error", "FAILED"),
    ("canary", "FAILED"),  # a job-written pickle whose __reduce__ creates a file: read, never executed
    ("torn", "FAILED"),
    (None, "FAILED"),  # the job died before writing any result
])
def test_a_local_jobs_end_is_read_from_its_result_pickle_without_unpickling_it(tmp_path, content, state):
    """What ``submit --wait`` and the watcher read of an ended local job (``local_process.observe_local``)."""
    import pickle

    from hpc_agent.core import rundir
    from hpc_agent.jobs.local_process import observe_local

    run_dir, canary = tmp_path / "run", tmp_path / "canary"
    rundir.slurm_dir(run_dir).mkdir(parents=True)
    result = rundir.result_path(run_dir, "77", 0)
    if content in ("success", "error"):
        result.write_bytes(pickle.dumps((content, 0 if content == "success" else "Traceback ...")))
    elif content == "canary":
        result.write_bytes(pickle.dumps(_Canary(canary)))
    elif content == "torn":
        result.write_bytes(pickle.dumps(("success", 0))[:-2])
    seen = observe_local(run_dir, "77", 1.0e9)  # pid 77 is not this job's (its command line names no run dir)
    assert seen.attempt is not None and seen.attempt.state == state and seen.final, seen.basis
    assert not canary.exists()

"""One run across its chain of job ids (hpc_agent/core/handback.py job_chain): a preempted job handed over to a
successor and no watcher copied that into the ledger; ``status`` and ``review`` still show the run's current job,
and ``hpc-agent cancel RUN`` stops it and the held job it came from (hpc_agent/cancel.py)."""
from __future__ import annotations

import json
import subprocess

import pytest

from hpc_agent import cancel, status
from hpc_agent.core import handback
from hpc_agent.runs.history import review_run
from hpc_agent.slurm.cli import SlurmCLI
from hpc_agent.slurm.job_match import job_name_for
from hpc_agent.state.ledger import Ledger
from tests.helpers.fake_slurm import FakeSlurm


@pytest.fixture
def handed_over(tmp_path, monkeypatch):
    """Run r1: the ledger knows job ``old`` only; ``old`` handed over to ``new`` (its marker), is requeued held, and
    ``new`` runs. Every Slurm call of the code under test goes to the FakeSlurm."""
    slurm = FakeSlurm()
    root = tmp_path / "runs"
    run_dir = root / "r1"
    run_dir.mkdir(parents=True)
    old = slurm.submit(job_name_for("r1"))
    slurm.start(old)
    new = slurm.submit(job_name_for("r1"), hold=True)
    slurm.run(["scontrol", "release", new])
    slurm.run(["scontrol", "requeuehold", old])
    slurm.start(new)
    (run_dir / f"{handback.SUCCESSOR_PREFIX}{old}").write_text(f"{new}\n")
    ledger = Ledger.in_runs_root(root)
    try:
        ledger.add_run("r1", "t", str(run_dir))
        ledger.record_submitted(ledger.record_intent("r1", "slurm", str(run_dir / "config.yaml"), "submit"), old)
        ledger.set_phase("r1", "running")
    finally:
        ledger.close()
    monkeypatch.setattr(SlurmCLI, "_execute", staticmethod(
        lambda argv, timeout_s: subprocess.CompletedProcess(argv, *_answer(slurm, argv))))
    monkeypatch.setattr(SlurmCLI, "available", staticmethod(lambda: True))
    return {"slurm": slurm, "root": root, "run_dir": run_dir, "old": old, "new": new}


def _answer(slurm, argv):
    result = slurm.run(argv, check=False)
    return result.returncode, result.stdout, result.stderr


@pytest.mark.parametrize("ids, markers, expected", [
    (["41"], {}, ["41"]),
    (["41"], {"41": "57"}, ["41", "57"]),
    (["41"], {"41": "57", "57": "63"}, ["41", "57", "63"]),
    (["41", "57"], {"41": "57", "57": "63"}, ["41", "57", "63"]),  # the watcher adopted 57 already
    (["41", "41", ""], {}, ["41"]),
    (["41"], {"41": "57", "57": "41"}, ["41", "57"]),                # a loop of markers does not spin
    (["41"], {"41": "41"}, ["41"]),                                  # a job naming itself is no successor
    (["41"], {"41": "57; rm -rf /"}, ["41"]),                        # not a job number
    ([], {"41": "57"}, []),
])
def test_the_job_chain(tmp_path, ids, markers, expected):
    for job, successor in markers.items():
        (tmp_path / f"{handback.SUCCESSOR_PREFIX}{job}").write_text(successor + "\n")
    assert handback.job_chain(tmp_path, ids) == expected


def test_status_and_review_show_the_run_under_its_current_job(handed_over):
    h = handed_over
    review = review_run(h["run_dir"], h["root"])
    assert review["jobs"] == [h["old"], h["new"]]
    (line,) = status.collect(h["root"])
    assert line["job_id"] == h["new"] and line["jobs"] == [h["old"], h["new"]]
    assert line["slurm_state"] == "RUNNING"


def test_cancel_stops_the_current_job_and_the_held_one(handed_over, capsys):
    h = handed_over
    assert cancel.main(["r1", "--runs-root", str(h["root"]), "--dry-run"]) == 0
    assert "would cancel" in capsys.readouterr().out and not h["slurm"].cancels
    assert cancel.main(["r1", "--runs-root", str(h["root"])]) == 0
    out = capsys.readouterr().out
    assert f"job {h['new']} (running, current)" in out and f"job {h['old']} (pending)" in out
    assert h["slurm"].jobs[h["old"]].state == "CANCELLED" and h["slurm"].jobs[h["new"]].state == "CANCELLED"
    assert [c for c in h["slurm"].commands if c[0] == "scancel"] == [["scancel", h["old"], h["new"]]]  # one call
    assert cancel.main([str(h["run_dir"]), "--json"]) == 0  # by its directory; nothing left to cancel
    result = json.loads(capsys.readouterr().out)
    assert result["current"] == h["new"] and result["cancelled"] == [] and result["jobs"] == [h["old"], h["new"]]


def test_an_unknown_run_exits_2_naming_the_fix(handed_over, capsys):
    assert cancel.main(["nosuch", "--runs-root", str(handed_over["root"])]) == 2
    err = capsys.readouterr().err
    assert "no run 'nosuch'" in err and "hpc-agent status" in err and "Traceback" not in err
    assert not any(c[0] == "scancel" for c in handed_over["slurm"].commands)


def test_a_local_run_is_not_sent_to_slurm(tmp_path, capsys):
    root = tmp_path / "runs"
    (root / "r1").mkdir(parents=True)
    ledger = Ledger.in_runs_root(root)
    try:
        ledger.add_run("r1", "t", str(root / "r1"))
        ledger.record_submitted(ledger.record_intent("r1", "local", "c.yaml", "submit"), "4242")
    finally:
        ledger.close()
    assert cancel.main(["r1", "--runs-root", str(root)]) == 2
    assert "local executor (process 4242)" in capsys.readouterr().err

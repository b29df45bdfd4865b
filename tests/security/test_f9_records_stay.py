"""Finding 9 of issue 42: records forged across runs.

1. A line in run A's in-job journal naming run B's job id landed in A's audit trail (and so in A's
   events.jsonl, review and notifications), as if A's job had repaired itself.
2. A ``journal/`` in run A that is a symbolic link to another directory was followed: ``O_NOFOLLOW`` guards
   only the last component of ``journal/in_job.jsonl``.

Now the watcher takes from a run's journal only lines naming a job the ledger says the run submitted, and every
run-dir reader opens its file from the run dir one component at a time, ``O_NOFOLLOW`` at each
(``hpc_agent.core.fsutil.open_beneath``). Both are said once; nothing lands in A's audit trail; B goes on.
"""
from __future__ import annotations

import json
import os

import pytest

from hpc_agent.core import in_job_journal, rundir
from hpc_agent.core.fsutil import LinkInPath, open_beneath
from hpc_agent.runs.history import review_run
from hpc_agent.state.journal import Journal
from hpc_agent.state.ledger import Ledger
from tests.helpers.running_runs import fake_world, running_run


STEP_LOG = "[hpc_agent] step 3 loss 2.0\n"
"""A run still training: the watcher only ingests its journal."""


def _line(job_id: str, seq: int = 1, reason: str = "next OOM-ladder rung") -> str:
    return in_job_journal.encode(in_job_journal.InJobDecision(
        seq=seq, job_id=job_id, attempt=0, step=37, cause="gpu_oom", action=in_job_journal.ACTION,
        patch={"train.micro_batch_size": 4}, rollback_to_step=None, evidence=("CUDA out of memory",),
        at=1.0, budget_left=1, reason=reason, before={"train.micro_batch_size": 8}))


def _write_journal(folder, text: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "in_job.jsonl").write_text(text)


def _in_job(ledger, run_id):
    return [r for _, _, r in Journal(ledger).audit_records(run_id) if r.get("decided_in") == "job"]


@pytest.fixture
def world(tmp_path):
    root, ledger, slurm, watcher, out = fake_world(tmp_path)
    yield root, ledger, slurm, watcher, out
    ledger.close()


def test_a_journal_line_naming_another_runs_job_stays_out_of_this_runs_audit(world):
    root, ledger, slurm, watcher, out = world
    a_dir, a_job = running_run(root, ledger, slurm, "a", STEP_LOG)
    b_dir, b_job = running_run(root, ledger, slurm, "b", STEP_LOG)
    # A's job (or anyone who can write A's run dir) forges B's repair into A's journal, next to A's own line
    _write_journal(a_dir / "journal", _line(b_job, 1, "forged: B's job in A's journal") + _line(a_job, 2))
    _write_journal(b_dir / "journal", _line(b_job, 1))
    watcher.tick()
    a_records = _in_job(ledger, "a")
    assert [(r["job_id"], r["in_job_seq"]) for r in a_records] == [(a_job, 2)]  # A's own line only
    assert not any("forged" in json.dumps(r) for _, _, r in Journal(ledger).audit_records("a"))
    assert [(r["job_id"], r["in_job_seq"]) for r in _in_job(ledger, "b")] == [(b_job, 1)]  # B goes on
    said = [line for line in out if "a:" in line and "never submitted" in line]
    assert len(said) == 1 and b_job in said[0]
    watcher.tick()  # said once, recorded once
    assert len([line for line in out if "never submitted" in line]) == 1 and len(_in_job(ledger, "a")) == 1
    events = rundir.events_path(a_dir).read_text()
    assert "forged" not in events and f'"job_id": "{a_job}"' in events


def test_a_journal_folder_linked_elsewhere_is_not_followed(world, tmp_path):
    root, ledger, slurm, watcher, out = world
    a_dir, a_job = running_run(root, ledger, slurm, "a", STEP_LOG)
    b_dir, b_job = running_run(root, ledger, slurm, "b", STEP_LOG)
    # B's journal holds a line naming A's job (as B's dir could, or any folder the attacker controls), and
    # A's journal/ is a link to it: only the link's last component was ever checked
    _write_journal(b_dir / "journal", _line(a_job, 1, "forged: through a linked journal/"))
    (a_dir / "journal").symlink_to(b_dir / "journal", target_is_directory=True)
    watcher.tick()
    assert _in_job(ledger, "a") == []  # nothing from the link's target landed in A's audit
    assert "forged" not in json.dumps([r for _, _, r in Journal(ledger).audit_records("a")])
    said = [line for line in out if "a:" in line and "in-job journal" in line]
    assert said and "symbolic link" in said[0]
    assert _in_job(ledger, "b") == []  # and B's watcher does not take A's job's line as B's own either
    assert [line for line in out if "b:" in line and "never submitted" in line]


def test_every_run_dir_reader_refuses_a_link_at_any_component(tmp_path):
    """The one helper (open_beneath) and the readers built on it: a heartbeat/, stacks/ or journal/ that is a
    link, or a link further down, is never read through."""
    run_dir, other = tmp_path / "a", tmp_path / "other"
    for folder in ("heartbeat", "stacks", "journal", "deep/er"):
        (other / folder).mkdir(parents=True)
    (other / "stacks" / "rank-00000.txt").write_text("secret stack of another run\n")
    (other / "journal" / "in_job.jsonl").write_text(_line("1", 1))
    (other / "deep" / "er" / "x.json").write_text("{}")
    (other / "run.json").write_text(json.dumps({"run_id": "a"}))
    run_dir.mkdir()
    for name in ("heartbeat", "stacks", "journal", "deep"):
        (run_dir / name).symlink_to(other / name, target_is_directory=True)
    with pytest.raises(LinkInPath):
        os.close(open_beneath(run_dir, "deep/er/x.json"))
    with pytest.raises(LinkInPath):
        os.close(open_beneath(run_dir, "../other/run.json"))
    with pytest.raises(rundir.UnsafeFile):
        rundir.read_bounded(run_dir / "deep" / "er" / "x.json", 100, within=run_dir)
    assert rundir.read_stacks(run_dir) == {} and rundir.read_heartbeats(run_dir) == []
    decisions, problems = in_job_journal.read(run_dir)
    assert decisions == [] and "symbolic link" in problems[0]
    fd = open_beneath(run_dir.parent, "other/deep/er/x.json")  # no link on the way: opened
    os.close(fd)


def test_review_skips_events_naming_another_run_or_job(tmp_path):
    root = tmp_path / "runs"
    ledger = Ledger.in_runs_root(root)
    run_dir = root / "a"
    run_dir.mkdir(parents=True)
    ledger.add_run("a", "a", str(run_dir))
    ledger.record_submitted(ledger.record_intent("a", "slurm", str(run_dir / "config.yaml"), "submit"), "101")
    ledger.close()
    records = [{"run_id": "a", "seq": 1, "job_id": "101", "attempt": 1, "cause": "preempted", "action": "expedite"},
               {"run_id": "b", "seq": 2, "job_id": "202", "attempt": 1, "cause": "gpu_oom", "action": "resubmit"},
               {"run_id": "a", "seq": 3, "job_id": "202", "attempt": 2, "cause": "diverged", "action": "stop"}]
    rundir.events_path(run_dir).write_text("".join(json.dumps(r) + "\n" for r in records))
    review = review_run(run_dir, root)
    assert review["causes"] == ["preempted"]  # neither B's record nor one naming B's job in A's file
    assert any("2 record(s) naming another run or job" in p for p in review["problems"])

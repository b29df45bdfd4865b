"""Job id reuse (issue 16, must-show 1): sacct lists an older job under the run's job id first; the watcher
neither follows nor acts on it. A table test of the pure matching (hpc_agent/slurm/job_match.py), then the watcher
on the canonical FakeSlurm (its ``reuse_job_ids`` is a slurmdbd reset), in text mode and in ``--json`` mode."""
from __future__ import annotations

import datetime as _dt
import json

import pytest

from hpc_agent.slurm.job_match import SUBMIT_SLACK_S, Claim, job_name_for, own_attempts
from hpc_agent.slurm.sacct import group_attempts, parse_sacct
from hpc_agent.sweep.batch import array_name
from hpc_agent.sweep.spec import trial_run_id
from hpc_agent.watcher.observe import json_verdict
from tests.unit.test_watcher import OOM_LOG, acting, add_run, world  # noqa: F401 - the fixture

INTENT = _dt.datetime(2026, 12, 1, 12, 0, 0).timestamp()
HEADER = "JobID|JobName|State|ExitCode|NodeList|Start|End|Submit|Comment"


def ts(offset_s: float) -> str:
    return _dt.datetime.fromtimestamp(INTENT + offset_s).strftime("%Y-%m-%dT%H:%M:%S")


def row(job="100", name="hpc_agent:r1", state="FAILED", submit=0.0, comment="", code="1:0"):
    return f"{job}|{name}|{state}|{code}|node1|{ts(submit)}|{ts(submit + 60)}|{ts(submit)}|{comment}"


OLD_DAYS = -3 * 86400
TRIAL = trial_run_id("sw", 7)
TABLE = [
    # (what, rows, claim run id, key, expected verdict per attempt in sacct order: True = the run's own)
    ("the run's own job", [row(submit=5)], "r1", "100", [True]),
    ("reused id: an older job of another run listed first",
     [row(name="hpc_agent:other", submit=OLD_DAYS), row(state="RUNNING", submit=5, code="0:0")], "r1", "100",
     [False, True]),
    ("reused id: a job not from hpc_agent at all", [row(name="bash", submit=OLD_DAYS)], "r1", "100", [False]),
    ("comment names another run", [row(submit=5, comment="hpc_agent run_id=r2")], "r1", "100", [False]),
    ("comment names this run", [row(submit=5, comment="hpc_agent run_id=r1")], "r1", "100", [True]),
    ("same name, submitted before the run's intent (slack exceeded)", [row(submit=-SUBMIT_SLACK_S - 60)], "r1", "100",
     [False]),
    ("same name, a little before the intent (clock skew within the slack)", [row(submit=-30)], "r1", "100", [True]),
    ("missing evidence (no Submit, no name, no comment) never disqualifies",
     ["100||RUNNING|0:0|node1|Unknown|Unknown|Unknown|"], "r1", "100", [True]),
    ("slurmdbd's placeholder name 'allocation' (a running job's record on 22.05) is no evidence",
     [row(name="allocation", state="PENDING", submit=5)], "r1", "100", [True]),
    ("... but a placeholder-named record submitted days before the intent is another job's",
     [row(name="allocation", submit=OLD_DAYS), row(state="RUNNING", submit=5, code="0:0")], "r1", "100",
     [False, True]),
    ("requeued attempts keep their later Submit",
     [row(state="REQUEUED", submit=5), row(state="RUNNING", submit=200, code="0:0")], "r1", "100", [True, True]),
    ("sweep array task of this trial's sweep (registered after sbatch: no time bound)",
     [row(job="12_3", name=array_name("sw", "b0"), submit=OLD_DAYS, comment="hpc_agent sweep=sw batch=b0")],
     TRIAL, "12_3", [True]),
    ("sweep array task of another sweep",
     [row(job="12_3", name=array_name("other", "b0"), submit=5, comment="hpc_agent sweep=other batch=b0")],
     TRIAL, "12_3", [False]),
    ("heterogeneous job: one foreign component makes the attempt foreign",
     [row(job="12+0", submit=5), row(job="12+1", name="hpc_agent:other", submit=5)], "r1", "12", [False]),
    ("heterogeneous job: both components the run's", [row(job="12+0", submit=5), row(job="12+1", submit=5)],
     "r1", "12", [True]),
    ("a step-only attempt is judged by its Submit", [row(job="100.batch", name="batch", submit=OLD_DAYS)], "r1",
     "100", [False]),
    ("steps carry the step's name and follow their attempt",
     [row(submit=5), row(job="100.batch", name="batch", submit=6)], "r1", "100", [True]),
]


@pytest.mark.parametrize("what,rows,run_id,key,expected", TABLE, ids=[t[0] for t in TABLE])
def test_matching_table(what, rows, run_id, key, expected):
    rows = [r.replace("hpc_agent:r1", job_name_for(run_id)) if run_id != "r1" else r for r in rows]
    attempts = group_attempts(parse_sacct(HEADER + "\n" + "\n".join(rows) + "\n"))[key]
    own, foreign = own_attempts(attempts, Claim(key, run_id, INTENT))
    verdicts = [True] * len(attempts)
    for other in foreign:
        verdicts[other.position] = False
        assert other.reason and other.job_id == key
    assert verdicts == expected, (what, [f.reason for f in foreign])
    assert [a.index for a in own] == list(range(len(own)))  # renumbered: the run's first attempt is 0
    assert [a.state for a in own] == [a.state for a, ok in zip(attempts, expected) if ok]


def test_unknown_intent_checks_name_and_comment_only():
    attempts = group_attempts(parse_sacct(HEADER + "\n" + row(submit=OLD_DAYS) + "\n"))["100"]
    assert own_attempts(attempts, Claim("100", "r1", None))[0] == tuple(attempts)


@pytest.mark.parametrize("rc,doc,use", [
    (0, {"meta": {"Slurm": {"version": {"major": 22, "minor": 5, "micro": 8}}}, "jobs": []}, False),
    (0, {"meta": {"Slurm": {"version": {"major": 23, "minor": 2, "micro": 0}}}, "jobs": []}, True),
    (0, {"meta": {"Slurm": {"version": {"major": 24, "minor": 11, "micro": 1}}}, "jobs": []}, True),
    (1, {}, False),
    (0, "sacct: unrecognized option '--json'", False),
])
def test_json_is_read_only_where_it_is_faithful(rc, doc, use):
    ok, why = json_verdict(rc, doc if isinstance(doc, str) else json.dumps(doc))
    assert ok is use and why


# --- the watcher on the canonical fake --------------------------------------------------------------------
def reused_world(world, as_json: bool):
    """Job 100 was another run's and failed (an OOM the watcher would repair, were it this run's); three days
    later ids start again at 100 and run ``r`` gets job 100 too."""
    slurm = world["slurm"]
    old = slurm.submit(job_name_for("someone-else"), comment="hpc_agent run_id=someone-else")
    slurm.start(old)
    slurm.fail(old, 3)
    slurm.advance(3 * 86400)
    slurm.reuse_job_ids(100)
    if as_json:
        world["watcher"]._source.use_json = True  # the fake is 22.05: make this watcher read --json anyway
    return old


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_reused_job_id_is_neither_followed_nor_acted_on(world, as_json):
    slurm, watcher, ledger = world["slurm"], world["watcher"], world["ledger"]
    old = reused_world(world, as_json)
    slurm.sacct_lag_s = 3600  # the run's own job is not in accounting yet: sacct lists only the old job
    _, job = add_run(world, "r", log=OOM_LOG, start=False)
    assert job == old == "100"
    listed = slurm.sacct([job], fields=("JobID", "JobName", "State"), as_json=as_json)
    assert "hpc_agent:someone-else" in listed and "FAILED" in listed  # sacct answers the older job
    for _ in range(3):
        report = watcher.tick()
        slurm.advance(30)
    assert acting(slurm) == [] and world["submit"].calls == []  # no requeue, resubmit, cancel, exclude
    assert ledger.run("r").phase == "pending" and ledger.decisions("r") == []
    said = [line for line in world["out"] if "ignored a sacct record under job id 100" in line]
    assert len(said) == 1 and "hpc_agent:someone-else" in said[0]  # said once, with its evidence
    audit = [json.loads(line) for line in (world["root"] / "r" / "events.jsonl").read_text().splitlines()]
    assert [a["action"] for a in audit] == ["ignored_foreign_record"]
    assert audit[0]["evidence"]["job_name"] == "hpc_agent:someone-else"
    # The run's own job reaches accounting and runs: followed as attempt 0, the old job still ignored.
    slurm.sacct_lag_s = 0
    slurm.start(job)
    report = watcher.tick()
    assert not report.unknown and ledger.run("r").phase == "running"
    # ... and when it fails, the decision is about the run's attempt 0, not the older job's.
    slurm.fail(job, 3)
    watcher.tick()
    decisions = ledger.decisions("r")
    assert [(d.job_id, d.attempt) for d in decisions] == [(job, 0)]
    assert len([line for line in world["out"] if "ignored a sacct record" in line]) == 1


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_reused_job_id_is_not_acted_on_even_when_slurmctld_does_not_list_the_job(world, as_json):
    """The squeue guard (a job still queued is never resubmitted) cannot help here: slurmctld does not list
    the run's job (gone from its memory, or on another cluster of a federation), and accounting lists only
    the older job under the same id, FAILED. Without the matching the watcher would resubmit the run."""
    slurm, watcher, ledger = world["slurm"], world["watcher"], world["ledger"]
    reused_world(world, as_json)
    slurm.sacct_lag_s = 3600
    _, job = add_run(world, "r", log=OOM_LOG, start=False)
    slurm.purge(job)
    for _ in range(3):
        watcher.tick()
        slurm.advance(30)
    assert acting(slurm) == [] and world["submit"].calls == [] and ledger.decisions("r") == []
    assert ledger.run("r").phase == "pending"

"""Hung running attempts: the pure core's table (hpc_agent/watcher/follow_hang.py), then the watcher with the fake Slurm.

Suspicion -> stacks asked; stacks arrive (or stack_wait_s passes) -> cancel + resubmit with the evidence;
the verdict vanishes -> the suspicion is dropped; the same hang twice -> stop; ``slurm.exclude`` only when a
stuck rank's host is one of the job's Slurm nodes; a watcher killed between the journal and the effects
carries them out once. tests/cluster/test_hang_slurm.py runs it on the real cluster.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpc_agent.config.load import build_config
from hpc_agent.core import rundir
from hpc_agent.core.heartbeat_format import Beat, encode
from hpc_agent.core.rundir import LogText
from hpc_agent.diagnosis.hang import HangVerdict
from hpc_agent.policy.decide import PastAttempt
from hpc_agent.slurm.sacct import group_attempts, parse_sacct
from hpc_agent.state.lifecycle import Phase
from hpc_agent.watcher.follow import follow, history_from, wants
from hpc_agent.watcher.follow_model import (AWAIT_END, CANCEL, NOTIFY, RELEASE_LEASE, RESUBMIT_EFFECT, STACKS, Live,
                                            Observation, RunFiles, RunState, Suspicion, Wants)

HEADER = "JobID|JobName|State|ExitCode|NodeList|Start|End|Elapsed"
CFG = build_config([{"run": {"name": "t"}, "train": {"max_steps": 100}}])
T = 1_800_000_000.0


def running(nodes: str = "node[1-2]"):
    text = f"{HEADER}\n9|hpc_agent:r|RUNNING|0:0|{nodes}|2026-11-30T10:00:00|Unknown|00:01:00\n"
    return tuple(group_attempts(parse_sacct(text))["9"])


def dump(func: str, line: int = 85, path: str = "/w/launch/faults.py") -> str:
    return ("# job 9 attempt 0 rank 0 host node1 pid 1\n"
            "Thread 0x00007f01 (most recent call first):\n"
            '  File "/usr/lib/python3/threading.py", line 320 in wait\n\n'
            "Current thread 0x00007f00 (most recent call first):\n"
            f'  File "{path}", line {line} in {func}\n'
            '  File "/w/launch/engine.py", line 250 in train\n'
            '  File "/w/launch/train.py", line 40 in <module>\n')


def beat(rank: int, host: str, written: float = T) -> Beat:
    return Beat("9", 0, rank, 2, host, 100 + rank, "training", T - 500, 7, T - 100, 0, (0.1,) * 7, T - 500, written, 1.0)


VERDICT = HangVerdict("step", 100.0, 10.0, 7, (0, 1), "ranks 0, 1 of 2 made no step for 100 s after step 7")
LOST = HangVerdict("heartbeat_lost", 60.0, 10.0, 7, (1,), "rank 1 of 2 stopped writing its heartbeat")
BEATS = (beat(0, "node1"), beat(1, "node2"))
MARKS0 = {0: (40, 1), 1: (40, 1)}
MARKS1 = {0: (400, 2), 1: (400, 2)}
ASKED = Suspicion("9", 0, T - 1, MARKS0, {"kind": "step", "step": 7})
SAME = {0: dump("before_step"), 1: dump("before_step")}
ODD = {0: dump("before_step"), 1: dump("all_reduce", 12, "/w/torch/distributed.py")}
LOG = (LogText("9_0_log.out", "[hpc_agent] step 7 loss 2.0\n[hpc_agent] fault: hanging at step 8\n"),)


def files(steps=(5,)):
    return RunFiles(CFG, LOG, (), tuple(steps))


def live(verdict=VERDICT, marks=MARKS1, stacks=SAME, now=T, beats=BEATS):
    return Live(now, verdict, beats, dict(marks), stacks, 10.0)


def st(suspicion=None, history=()):
    return RunState("r", Phase.RUNNING, "9", suspicion=suspicion, history=tuple(history))


HUNG_BEFORE = PastAttempt("8", "hung", "resubmit", {}, True,
                          (7, " <- ".join(["/w/launch/faults.py:85 in before_step", "/w/launch/engine.py:250 in train",
                                           "/w/launch/train.py:40 in <module>"])))

# (name, state, live view, files, expected phase, expected effect kinds)
CASES = [
    ("progressing: nothing", st(), live(None), None, Phase.RUNNING, []),
    ("hung but watch.enabled is false: left alone", st(), Live(T, VERDICT, BEATS, MARKS0, None, 10.0, False), None,
     Phase.RUNNING, []),
    ("no live view (config unreadable): nothing", st(), None, None, Phase.RUNNING, []),
    ("hung, not yet asked: request stacks", st(), live(marks=MARKS0, stacks=None), None, Phase.RUNNING, [STACKS]),
    ("asked, stacks not there yet, within stack_wait_s: wait", st(ASKED), live(marks=MARKS0), files(), Phase.RUNNING, []),
    ("asked, stacks arrived: cancel and resubmit", st(ASKED), live(), files(), Phase.RECOVERING,
     [CANCEL, AWAIT_END, RELEASE_LEASE, RESUBMIT_EFFECT]),
    ("asked, no stacks but stack_wait_s passed: decide anyway", st(ASKED), live(marks=MARKS0, stacks={}, now=T + 10),
     files(), Phase.RECOVERING, [CANCEL, AWAIT_END, RELEASE_LEASE, RESUBMIT_EFFECT]),
    ("asked, the verdict vanished: drop the suspicion, no action", st(ASKED), live(None), files(), Phase.RUNNING, []),
    ("the same hang twice (step, stacks): stop", st(ASKED, [HUNG_BEFORE]), live(), files(), Phase.STOPPED,
     [CANCEL, NOTIFY]),
]


@pytest.mark.parametrize("name, run, view, seen, phase, effects", CASES, ids=[c[0] for c in CASES])
def test_hang_table(name, run, view, seen, phase, effects):
    outcome = follow(run, Observation(running(), None, seen, view))
    assert outcome.phase is phase, name
    assert [e.kind for e in outcome.effects] == effects, name


def test_suspicion_is_stored_with_the_stack_marks_and_audited():
    outcome = follow(st(), Observation(running(), None, None, live(marks=MARKS0, stacks=None)))
    assert outcome.suspect == Suspicion("9", 0, T, MARKS0, outcome.suspect.verdict)
    assert outcome.suspect.verdict["kind"] == "step" and outcome.suspect.verdict["step"] == 7
    assert outcome.audit[0]["action"] == "hang_suspected" and outcome.decision is None


def test_vanished_verdict_closes_the_suspicion_and_records_it():
    outcome = follow(st(ASKED), Observation(running(), None, files(), live(None)))
    assert outcome.suspect is not None and not outcome.suspect.active
    assert outcome.audit[0]["action"] == "hang_cleared" and not outcome.effects and outcome.decision is None


def test_decision_evidence_names_age_limit_step_stack_and_log():
    outcome = follow(st(ASKED), Observation(running(), None, files(), live()))
    row = outcome.decision
    assert row["cause"] == "hung" and row["action"] == "resubmit" and row["ckpt_step"] == 5
    text = "\n".join(row["evidence"])
    assert "silent 100 s / limit 10 s; last step 7; newest heartbeat 0 s ago" in text
    assert "top frame /w/launch/faults.py:85 in before_step" in text
    assert "log: [hpc_agent] fault: hanging at step 8" in text
    assert row["decision"]["hang"]["step"] == 7 and "before_step" in row["decision"]["hang"]["signature"]
    assert row["patch"] == {}  # every rank in the same frame: no node to blame
    assert outcome.suspect is not None and not outcome.suspect.active
    # the next decision reads it back from the ledger row as the history's hang
    assert history_from([_Row(row)])[0].hang == HUNG_BEFORE.hang


class _Row:
    def __init__(self, row):
        self.job_id, self.cause, self.action, self.patch = row["job_id"], row["cause"], row["action"], row["patch"]
        self.ckpt_step, self.decision = row["ckpt_step"], row["decision"]


@pytest.mark.parametrize("verdict, stacks, beats, nodes, exclude", [
    (VERDICT, ODD, BEATS, "node[1-2]", None),  # a 2-rank tie: no majority, nobody is the odd one out
    (LOST, SAME, BEATS, "node[1-2]", "node2"),  # rank 1's heartbeat stopped while rank 0's went on
    (LOST, SAME, (beat(0, "node1"), beat(1, "login7")), "node[1-2]", None),  # host is not a Slurm node name
    (LOST, SAME, (beat(0, "node1"), beat(1, "node1")), "node1", None),  # the only node: it points at the job
])
def test_exclude_only_with_node_evidence(verdict, stacks, beats, nodes, exclude):
    outcome = follow(st(ASKED), Observation(running(nodes), None, files(), live(verdict, stacks=stacks, beats=beats)))
    assert outcome.decision["patch"].get("slurm.exclude") == exclude


def test_outlier_rank_in_a_three_rank_job_excludes_its_node():
    beats = (beat(0, "node1"), beat(1, "node1"), beat(2, "node2"))
    stacks = {0: dump("before_step"), 1: dump("before_step"), 2: dump("all_reduce", 12, "/w/torch/distributed.py")}
    verdict = HangVerdict("step", 100.0, 10.0, 7, (0, 1, 2), "stuck")
    view = live(verdict, marks={**MARKS1, 2: (400, 2)}, stacks=stacks, beats=beats)
    outcome = follow(st(ASKED), Observation(running(), None, files(), view))
    assert outcome.decision["patch"] == {"slurm.exclude": "node2"}
    assert "outliers: ranks 2" in "\n".join(outcome.decision["evidence"])


def test_wants_heartbeats_for_running_and_stacks_once_asked():
    assert wants(st(), running()) == Wants(live=True)
    assert wants(st(ASKED), running()) == Wants(files=True, live=True, stacks=True)
    assert wants(st(Suspicion("9", 3, T, {}, {})), running()) == Wants(live=True)  # another attempt's suspicion


# --- the watcher, with the fake Slurm: journal, effects, crash -----------------------------------------------
class Crash(BaseException):
    """Stands in for a SIGKILL at a crash point (not an Exception: the watcher's per-run guard must not catch it)."""


def _world(tmp_path):
    from hpc_agent.slurm.job_match import job_name_for
    from hpc_agent.state.ledger import Ledger
    from hpc_agent.config.load import write_run_config
    from tests.helpers.fake_slurm import FakeSlurm
    from tests.unit.test_watcher import FakeSubmitter

    slurm = FakeSlurm()
    root = tmp_path / "runs"
    run_dir = root / "r"
    (run_dir / "slurm").mkdir(parents=True)
    cfg = build_config([{"run": {"name": "t"}, "train": {"max_steps": 100},
                         "resilience": {"heartbeat_s": 1, "hang_floor_s": 10, "stack_wait_s": 5}}])
    path = write_run_config(run_dir, cfg)
    ledger = Ledger(root / "ledger.sqlite", clock=lambda: slurm.now)
    ledger.add_run("r", "t", str(run_dir))
    sid = ledger.record_intent("r", "slurm", str(path), "submit")
    job = slurm.submit(job_name_for("r"))
    ledger.record_submitted(sid, job)
    slurm.start(job, ["node1"])
    ledger.set_phase("r", "running")
    slurm.advance(120)
    return slurm, ledger, root, run_dir, job, FakeSubmitter(slurm)


def _write_beat(run_dir: Path, job: str, now: float) -> None:
    b = Beat(job, 0, 0, 1, "node1", 4242, "training", now - 100, 7, now - 60, 0, (0.1,) * 7, now - 100, now, 1.0)
    path = rundir.heartbeat_path(run_dir, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(encode(b))


def test_watcher_asks_stacks_then_cancels_and_resubmits_once_after_a_crash(tmp_path, monkeypatch):
    from hpc_agent.watcher import loop as watcher_mod
    from hpc_agent.state.journal import Journal
    from hpc_agent.watcher.loop import Watcher

    slurm, ledger, root, run_dir, job, submit = _world(tmp_path)
    out = []
    w = Watcher(ledger, slurm, runs_root=root, clock=lambda: slurm.now, submit=submit, out=out.append)
    _write_beat(run_dir, job, slurm.now)
    lease = rundir.lease_path(run_dir)
    lease.write_text(json.dumps({"job_id": job, "attempt": 0, "host": "node1", "pid": 4242, "heartbeat": slurm.now,
                                 "started": slurm.now, "token": "t"}))
    w.tick()
    assert slurm.signals == [(job, "URG")] and slurm.cancels == [], out
    assert ledger.run("r").phase == "running", out
    stack = rundir.stack_path(run_dir, 0)
    stack.parent.mkdir(parents=True, exist_ok=True)
    stack.write_text(dump("before_step"))
    slurm.advance(1)
    _write_beat(run_dir, job, slurm.now)

    def crash(point):
        if point == "after_journal":
            raise Crash(point)
    monkeypatch.setattr(watcher_mod, "crash_point", crash)
    with pytest.raises(Crash):
        w.tick()
    assert slurm.cancels == [] and submit.calls == []  # journaled, not carried out
    monkeypatch.undo()
    w2 = Watcher(ledger, slurm, runs_root=root, clock=lambda: slurm.now, submit=submit, out=out.append)
    w2.reconcile()
    for _ in range(3):
        slurm.advance(1)
        w2.tick()
    assert slurm.cancels == [job] and len(submit.calls) == 1 and slurm.signals == [(job, "URG")]
    assert not lease.exists()  # the ended job's lease was moved aside before the resubmission
    decisions = ledger.decisions("r")
    assert [(d.cause, d.action) for d in decisions] == [("hung", "resubmit")]
    kinds = [k for k, _, status in Journal(ledger).effects("r") if status == "done"]
    assert kinds == [STACKS, CANCEL, AWAIT_END, RELEASE_LEASE, RESUBMIT_EFFECT]
    events = [json.loads(line) for line in rundir.events_path(run_dir).read_text().splitlines()]
    assert [e.get("action") for e in events if e.get("action") in ("hang_suspected", "cancel", "resubmit")] == \
        ["hang_suspected", "cancel", "resubmit"]


def test_release_lease_moves_only_the_ended_jobs_own_lease(tmp_path):
    from hpc_agent.watcher import effects
    from hpc_agent.state.journal import EffectRow
    from hpc_agent.state.ledger import Run

    run_dir = tmp_path / "r"
    run_dir.mkdir()
    run = Run("r", "t", str(run_dir), 0.0, "recovering")
    ctx = effects.Context(None, None, None, lambda *a: None, lambda: T)
    lease = rundir.lease_path(run_dir)
    other = {"job_id": "77", "attempt": 0, "host": "node1", "pid": 1, "heartbeat": T, "started": T, "token": "x"}
    lease.write_text(json.dumps(other))
    row = EffectRow(1, "r", RELEASE_LEASE, "9", {}, 0, T, 0)
    assert effects.carry_out(ctx, run, row) == "no lease of this job" and lease.exists()
    lease.write_text(json.dumps({**other, "job_id": "9"}))
    assert effects.carry_out(ctx, run, row) == "released" and not lease.exists()

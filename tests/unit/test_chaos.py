"""The chaos driver's pure parts (schedule, progress, report, checks) and the job's run-time trigger."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hpc_agent.chaos.log_segments import Progress, Segment, parse_progress, recovered_segment, steps_lost
from hpc_agent.chaos.report import (FaultRecord, TargetSummary, continuity_check, ended_after, fault_checks,
                                    final_checkpoint_check, p3, passed, render)
from hpc_agent.chaos.schedule import (DEFAULT_MIX, KINDS, Fault, ScheduleError, from_seed, load_schedule_text,
                                      parse_schedule)
from hpc_agent.runs.goodput import time_lost, wall_ettr
from tests.conftest import REPO, run_cli

# --- schedule -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("data, expected", [
    ([{"kind": "preempt", "at_s": 30}], [Fault("preempt", 30.0)]),
    ({"faults": [{"kind": "nan", "at_s": 90}, {"kind": "preempt", "at_s": 10.5}]},
     [Fault("preempt", 10.5), Fault("nan", 90.0)]),  # sorted by time
    ([{"kind": k, "at_s": i} for i, k in enumerate(KINDS)], [Fault(k, float(i)) for i, k in enumerate(KINDS)]),
])
def test_parse_schedule(data, expected):
    assert parse_schedule(data) == expected


@pytest.mark.parametrize("data, message", [
    ([], "non-empty list"),
    ({"faults": "preempt"}, "non-empty list"),
    (None, "non-empty list"),
    (["preempt"], "fault 1: expected a mapping"),
    ([{"kind": "meteor", "at_s": 1}], "kind 'meteor' is not one of"),
    ([{"kind": "nan", "at_s": -1}], "at_s must be a number"),
    ([{"kind": "nan", "at_s": True}], "at_s must be a number"),
    ([{"kind": "nan", "at_s": "soon"}], "at_s must be a number"),
    ([{"kind": "nan"}], "at_s must be a number"),
    ([{"kind": "nan", "at_s": 1, "when": 2}], "unknown keys when"),
])
def test_parse_schedule_rejects(data, message):
    with pytest.raises(ScheduleError, match=message):
        parse_schedule(data)


def test_parse_schedule_reports_every_problem_at_once():
    with pytest.raises(ScheduleError) as err:
        parse_schedule([{"kind": "meteor", "at_s": 1}, {"kind": "nan", "at_s": -5}])
    assert "fault 1" in str(err.value) and "fault 2" in str(err.value)


@pytest.mark.parametrize("text, first", [
    ('{"faults": [{"kind": "gpu_oom", "at_s": 5}]}', Fault("gpu_oom", 5.0)),
    ("- {kind: host_oom, at_s: 7}\n", Fault("host_oom", 7.0)),
])
def test_load_schedule_text(text, first):
    assert load_schedule_text(text)[0] == first


def test_load_schedule_text_bad_yaml():
    with pytest.raises(ScheduleError, match="not valid YAML"):
        load_schedule_text("faults: [unclosed")


def test_ci_schedule_file_parses():
    faults = load_schedule_text((REPO / "configs" / "chaos_ci_schedule.yaml").read_text())
    assert {f.kind for f in faults} >= {"preempt", "nan", "kill_during_save", "gpu_oom", "watcher_kill"}


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_from_seed_is_reproducible_and_covers_every_kind_before_repeating(seed):
    kinds = list(dict.fromkeys(DEFAULT_MIX))
    one = from_seed(seed, count=len(kinds) + 3, every_s=60)
    assert one == from_seed(seed, count=len(kinds) + 3, every_s=60)
    assert len(one) == len(kinds) + 3
    assert [f.at_s for f in one] == sorted(f.at_s for f in one)
    # the first len(kinds) slots (about every_s apart, jitter < half a gap) hold each kind once
    assert sorted(f.kind for f in one[:len(kinds)]) == sorted(kinds)
    for i, f in enumerate(one):
        assert abs(f.at_s - 60 * (i + 1)) <= 0.2 * 60 + 1e-9


def test_from_seed_differs_across_seeds():
    assert [f.kind for f in from_seed(1, 8, 30)] != [f.kind for f in from_seed(2, 8, 30)]


@pytest.mark.parametrize("kwargs, message", [
    ({"count": 0, "every_s": 10}, "count >= 1"),
    ({"count": 3, "every_s": 0}, "every_s > 0"),
    ({"count": 3, "every_s": 10, "jitter": 1.0}, "jitter"),
    ({"count": 3, "every_s": 10, "kinds": ["preempt", "flood"]}, "unknown fault kinds flood"),
])
def test_from_seed_rejects(kwargs, message):
    with pytest.raises(ScheduleError, match=message):
        from_seed(0, **kwargs)


# --- progress -------------------------------------------------------------------------------------------
def _header(attempt, start, end=100):
    return f"[hpc_agent] attempt {attempt}: training steps {start}..{end}, global batch 8 = 8 x 1 x 1 ranks"


_REPAIR = "[hpc_agent] in-job repair 1 of 2: nan at step 41: roll back to the newest checkpoint, lr x 0.5"


def _step(n):
    return f"[hpc_agent] step {n} loss 1.23 lr 1e-3 grad_norm 0.5 step_time 0.01s ({n}/100)"


@pytest.mark.parametrize("texts, segments, done", [
    ([""], (), False),
    (["\n".join([_step(1), "noise"])], (), False),  # a step line before any header belongs to no attempt
    (["\n".join([_header(0, 1), _step(1), _step(2)])], (Segment(0, 1, 2),), False),
    # a requeued job appends to its own log
    (["\n".join([_header(0, 1), _step(1), _step(5), "[hpc_agent] signal SIGUSR2 at step 5", _header(1, 6), _step(6)])],
     (Segment(0, 1, 5), Segment(1, 6, 6)), False),
    # a resubmission is another job's log; an attempt that trained nothing yet has no last step
    (["\n".join([_header(0, 1), _step(3)]), _header(1, 3)], (Segment(0, 1, 3), Segment(1, 3, None)), False),
    (["\n".join([_header(2, 41), _step(100), "[hpc_agent] done: 100 steps"])], (Segment(2, 41, 100),), True),
    # an in-job repair rolls back inside the same attempt: the steps after its resume are a new segment
    (["\n".join([_header(0, 1), _step(40), _REPAIR, "[hpc_agent] resumed at step 30 (data position 120 samples) "
                 "from step_00000030", _step(31)])], (Segment(0, 1, 40), Segment(0, 31, 31)), False),
    # ... from the start when there was no checkpoint yet; a resume line without a repair opens nothing
    (["\n".join([_header(0, 1), _step(7), _REPAIR, _step(1), _step(2)])], (Segment(0, 1, 7), Segment(0, 1, 2)), False),
    (["\n".join([_header(1, 31), "[hpc_agent] resumed at step 30 (data position 120 samples) from x", _step(31)])],
     (Segment(1, 31, 31),), False),
])
def test_parse_progress(texts, segments, done):
    progress = parse_progress(texts)
    assert progress.segments == segments and progress.done is done


@pytest.mark.parametrize("before, now, expected", [
    ((Segment(0, 1, 10),), (Segment(0, 1, 12),), None),                                   # same attempt still
    ((Segment(0, 1, 10),), (Segment(0, 1, 12), Segment(1, 13, None)), None),              # new one not training yet
    ((Segment(0, 1, 10),), (Segment(0, 1, 12), Segment(1, 13, 14)), (Segment(0, 1, 12), Segment(1, 13, 14))),
    # an attempt that died before its first step is passed over
    ((Segment(0, 1, 10),), (Segment(0, 1, 12), Segment(1, 11, None), Segment(2, 11, 11)),
     (Segment(0, 1, 12), Segment(2, 11, 11))),
    ((), (Segment(0, 1, 3),), None),                                                      # nothing was hit
])
def test_recovered_segment(before, now, expected):
    assert recovered_segment(Progress(before, False), Progress(now, False)) == expected


@pytest.mark.parametrize("hit, new, lost", [
    (Segment(0, 1, 2139), Segment(1, 2140, 2141), 0),       # signalled preemption: saved at the signal step
    (Segment(1, 2140, 3554), Segment(2, 3401, 3401), 154),  # NaN at 3555, back to the step-3400 checkpoint
    (Segment(2, 3401, 5200), Segment(3, 5001, 5010), 200),  # killed during the step-5200 save
    (Segment(0, 1, None), Segment(1, 1, 1), 0),             # nothing trained yet
])
def test_steps_lost(hit, new, lost):
    assert steps_lost(hit, new) == lost


# --- report and the nothing-lost checks -----------------------------------------------------------------
@pytest.mark.parametrize("steps, max_steps, ok, fragment", [
    (list(range(1, 11)), 10, True, "10 points"),
    ([1, 2, 4, 5], 5, False, "1 missing (first [3])"),
    ([1, 2, 2, 3], 3, False, "1 duplicated"),
    ([1, 2, 3, 4], 3, False, "unexpected [4]"),
    ([], 3, False, "3 missing"),
])
def test_continuity_check(steps, max_steps, ok, fragment):
    check = continuity_check(steps, max_steps)
    assert check.ok is ok and fragment in check.detail


@pytest.mark.parametrize("step, problem, ok", [
    (100, None, True),
    (80, None, False),
    (None, "no COMPLETE.json", False),
])
def test_final_checkpoint_check(step, problem, ok):
    check = final_checkpoint_check(step, problem, 100)
    assert check.ok is ok
    if problem:
        assert problem in check.detail


def _rec(kind, lost=0, recovered=True, injected=1.0):
    return FaultRecord(kind, "watched", 0.0, injected_at_s=injected, recovered=recovered, steps_lost=lost)


@pytest.mark.parametrize("records, failing", [
    ([_rec("preempt"), _rec("nan", 150)], []),
    ([_rec("preempt", 3)], ["zero steps lost on signalled preemptions"]),
    ([_rec("gpu_oom", recovered=False)], ["every fault recovered"]),
    ([_rec("nan", injected=None, recovered=False)], ["every fault injected"]),
])
def test_fault_checks(records, failing):
    assert [c.name for c in fault_checks(records) if not c.ok] == failing


def test_p3_counts_only_signalled_preemptions():
    records = [_rec("preempt", 0), _rec("kill_during_save", 200), _rec("preempt", 0), _rec("nan", 50)]
    assert p3(records) == {"preemptions": 2, "steps_lost": [0, 0], "mean": 0, "max": 0}
    assert p3([_rec("nan")])["preemptions"] == 0


@pytest.mark.parametrize("productive, start, end, expected", [
    (90.0, 0.0, 100.0, 0.9),
    (120.0, 0.0, 100.0, 1.0),   # clock skew between the job and here never gives more than 1
    (10.0, None, 100.0, None),
    (10.0, 100.0, 100.0, None),
])
def test_ettr(productive, start, end, expected):
    assert wall_ettr(productive, start, end) == expected


# (step, wall time as the step ended, step time): steps of 1 s from t=10, 0.01 s of loop work between steps
STEADY = [(1, 11.0, 1.0), (2, 12.01, 1.0), (3, 13.02, 1.0)]


@pytest.mark.parametrize("start, end, points, before, gaps, between, after", [
    (0.0, 14.0, STEADY, 10.0, [], 0.02, 0.98),
    # a recovery of 6 s between steps 3 and 4 (the redone steps included), then steady again
    (0.0, 22.0, STEADY + [(4, 20.02, 1.0), (5, 21.03, 1.0)], 10.0, [{"before_step": 4, "at_s": 13.02, "s": 6.0}],
     0.03, 0.97),
    # two gaps, listed biggest first; an idle of exactly GAP_S (1 s) is still loop work
    (5.0, 40.0, [(1, 6.0, 1.0), (2, 9.0, 1.0), (3, 11.0, 1.0), (4, 30.0, 1.0)], 0.0,
     [{"before_step": 4, "at_s": 6.0, "s": 18.0}, {"before_step": 2, "at_s": 1.0, "s": 2.0}], 1.0, 10.0),
    (0.0, 5.0, [], 5.0, [], 0.0, 0.0),                          # nothing trained: all of it before the first step
    (0.0, 12.0, STEADY, 10.0, [], 0.0, 1.0),                    # steps that ended after the window do not count
])
def test_time_lost_splits_what_ettr_does_not_count(start, end, points, before, gaps, between, after):
    lost = time_lost(start, end, points)
    assert lost["before_first_step_s"] == before and lost["gaps"] == gaps
    assert lost["between_steps_s"] == pytest.approx(between) and lost["after_last_step_s"] == pytest.approx(after)
    productive = sum(p[2] for p in points if p[1] <= end)
    assert lost["productive_s"] == pytest.approx(productive)
    assert lost["lost_s"] == pytest.approx(end - start - productive, abs=1e-3)  # the parts add up


@pytest.mark.parametrize("ends, injected, until, expected", [
    ([], 100.0, 200.0, None),                      # sacct knows no end yet
    ([50.0], 100.0, 200.0, None),                  # an earlier attempt's end is not this fault's
    ([104.0, 130.0], 100.3, 200.0, 4.2),           # the first end after the injection, mid-second
    ([100.0], 100.3, 200.0, 0.2),                  # ended within the injection's own second
    ([99.0], 100.3, 200.0, None),                  # that second was over before the injection
    ([100.0], 100.8, 200.0, 0.0),                  # never negative
    ([250.0], 100.0, 200.0, None),                 # after the recovery: a later attempt's end
])
def test_ended_after_takes_the_first_attempt_end_after_the_injection(ends, injected, until, expected):
    assert ended_after(ends, injected, until) == expected


def test_render_shows_every_fault_and_check():
    records = [_rec("preempt"), FaultRecord("nan", "watched", 30, injected_at_s=31, detected_cause="diverged",
                                            decision="resubmit", recovery_s=9.2, ended_after_s=7.3, steps_lost=154,
                                            recovered=True)]
    summary = TargetSummary("watched", True, 100, 0.5, 50.0, 100.0,
                            [continuity_check(list(range(1, 101)), 100), final_checkpoint_check(90, None, 100)])
    text = render(records, [summary])
    assert "preempt" in text and "diverged" in text and "resubmit" in text and "154" in text
    assert "ended_s" in text and " 9.2     7.3 " in text
    assert "ETTR 0.500" in text and "[ok] continuous step series" in text and "[FAIL] final checkpoint" in text
    assert not passed([summary])


# --- the job's run-time trigger --------------------------------------------------------------------------
def _trigger(tmp_path, enabled=True, rank=0):
    from launch.chaos_trigger import RuntimeTrigger

    return RuntimeTrigger(tmp_path, rank, enabled, poll_s=0)  # looks at every step (the throttle: its own test)


def _write(tmp_path, **spec):
    from hpc_agent.chaos.inject import write_trigger

    write_trigger(tmp_path, spec.pop("kind"), spec.pop("nonce"), **spec)


def test_trigger_off_ignores_the_file(tmp_path):
    _write(tmp_path, kind="nan", nonce="a")
    trig = _trigger(tmp_path, enabled=False)
    trig.before_step(1)
    assert trig.loss(2.0) == 2.0 and not (tmp_path / "chaos" / "fired").exists()


def test_trigger_nan_fires_once_even_across_attempts(tmp_path):
    import math

    _write(tmp_path, kind="nan", nonce="n1")
    trig = _trigger(tmp_path)
    trig.before_step(5)
    assert math.isnan(trig.loss(2.0)) and trig.loss(2.0) == 2.0  # one micro-step only
    trig.before_step(6)
    assert trig.loss(2.0) == 2.0
    resumed = _trigger(tmp_path)  # a new attempt finds the same file: already fired
    resumed.before_step(3)
    assert resumed.loss(2.0) == 2.0
    assert json.loads((tmp_path / "chaos" / "fired" / "n1.rank0").read_text())["step"] == 5
    _write(tmp_path, kind="nan", nonce="n2")  # a new nonce fires again
    resumed.before_step(4)
    assert math.isnan(resumed.loss(2.0))


def test_trigger_looks_at_the_file_at_most_every_poll_interval(tmp_path, monkeypatch):
    import math

    import launch.chaos_trigger as ct

    now = [100.0]
    trig = ct.RuntimeTrigger(tmp_path, 0, True, poll_s=0.25, clock=lambda: now[0])
    seen = []
    real_stat = os.stat
    monkeypatch.setattr(ct.os, "stat", lambda p, *a, **k: seen.append(str(p)) or real_stat(p, *a, **k))

    def looks():  # stat calls on the trigger file (Path.exists stats the fired marks too)
        return sum(p.endswith(ct.TRIGGER_FILE) for p in seen)

    trig.before_step(1)  # the first step looks at once
    assert looks() == 1
    _write(tmp_path, kind="nan", nonce="p1")
    now[0] += 0.1
    trig.before_step(2)  # 0.1 s later: not yet
    assert looks() == 1 and trig.loss(2.0) == 2.0
    now[0] += 0.2
    trig.before_step(3)  # 0.3 s after the last look: seen, and fired at this step
    assert looks() == 2 and math.isnan(trig.loss(2.0))
    assert json.loads((tmp_path / "chaos" / "fired" / "p1.rank0").read_text())["step"] == 3
    trig.before_step(4)
    assert looks() == 2


def test_trigger_ignores_unknown_kinds(tmp_path, capsys):
    (tmp_path / "chaos").mkdir()
    (tmp_path / "chaos" / "inject.json").write_text(json.dumps({"kind": "flood", "nonce": "x"}))
    trig = _trigger(tmp_path)
    trig.before_step(1)
    assert "ignoring" in capsys.readouterr().out and trig.loss(1.0) == 1.0


def test_trigger_host_oom_allocates_on_rank0_only(tmp_path, monkeypatch):
    import launch.chaos_trigger as ct

    monkeypatch.setattr(ct, "_HELD", [])
    _write(tmp_path, kind="host_oom", nonce="h", mb=1)
    _trigger(tmp_path, rank=1).before_step(2)
    assert ct._HELD == []
    trigger = _trigger(tmp_path, rank=0)
    trigger.before_step(2)  # returns at once: the allocation is made beside the training thread
    assert trigger.leak is not None and trigger.leak.name == "hpc_agent-chaos-host-oom"
    trigger.leak.join(timeout=30)
    (block,) = ct._HELD
    assert block.numel() == 2**20 and bool((block == 1).all())  # every page touched


def test_kill_during_save_stalls_before_the_marker(tmp_path):
    """The save reaches the hook after every shard and before COMPLETE.json; a kill there leaves a
    checkpoint that the resume skips."""
    from hpc_agent.core.checkpoint_format import MARKER, scan, select, tag_for
    from launch.checkpoint import save
    from tests.job.test_checkpoint import FakeEngine

    _write(tmp_path, kind="kill_during_save", nonce="k", stall_s=0)
    trig = _trigger(tmp_path)
    trig.before_step(7)
    seen = {}

    def hook(step, tag_dir):
        seen["files"] = sorted(p.name for p in tag_dir.iterdir())
        trig.before_marker(step, tag_dir)
        raise SystemExit("killed")  # stands for Slurm's SIGKILL arriving during the stall

    ckpts = tmp_path / "checkpoints"
    with pytest.raises(SystemExit):
        save(FakeEngine(0), ckpts, 7, {"step": 7}, {}, 0, lambda: None, lambda mine: [mine], before_marker=hook)
    assert MARKER not in seen["files"] and "mp_rank_00_model_states.pt" in seen["files"]
    note = json.loads((tmp_path / "chaos" / "in_save.json").read_text())
    assert note["nonce"] == "k" and note["tag"] == tag_for(7) and note["pid"] == os.getpid()
    assert select(scan(ckpts)).chosen is None and "no COMPLETE.json" in select(scan(ckpts)).skipped[0][1]
    # armed once: the next save goes through untouched
    save(FakeEngine(0), ckpts, 8, {"step": 8}, {}, 0, lambda: None, lambda mine: [mine],
         before_marker=trig.before_marker)
    assert select(scan(ckpts)).chosen.step == 8


# --- the CLI ----------------------------------------------------------------------------------------------
def test_cli_help_and_schedule_without_slurm():
    help_ = run_cli("-m", "hpc_agent.chaos", "--help")
    assert help_.returncode == 0 and "--schedule" in help_.stdout and "ETTR" in help_.stdout
    shown = run_cli("-m", "hpc_agent.chaos", "--seed", "4", "--faults", "3", "--every", "20", "--print-schedule")
    assert shown.returncode == 0 and len(json.loads(shown.stdout)["faults"]) == 3


@pytest.mark.parametrize("content, message", [
    ("faults: [{kind: meteor, at_s: 1}]", "bad schedule: fault 1: kind 'meteor'"),
    ("faults: [", "bad schedule: not valid YAML"),
])
def test_cli_bad_schedule_is_a_clear_error(tmp_path, content, message):
    path = tmp_path / "s.yaml"
    path.write_text(content)
    proc = run_cli("-m", "hpc_agent.chaos", "--schedule", str(path), "--print-schedule")
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


def test_cli_missing_schedule_file(tmp_path):
    proc = run_cli("-m", "hpc_agent.chaos", "--schedule", str(tmp_path / "nope.yaml"))
    assert proc.returncode == 2 and "cannot read schedule" in proc.stderr


def test_chaos_cli_imports_no_torch():
    code = ("import sys; from hpc_agent.chaos.__main__ import main; import hpc_agent.chaos.campaign; "
            "main(['--print-schedule']); assert 'torch' not in sys.modules and 'deepspeed' not in sys.modules")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(REPO), timeout=120)
    assert proc.returncode == 0, proc.stderr


# --- attribution of a recovery to the watcher's event ----------------------------------------------------
class _FakeTarget:
    """progress() and events() as a run directory shows them, changed by the test between polls."""

    def __init__(self):
        self.name, self.watcher = "watcher", None
        self.progress_now = Progress((Segment(0, 1, 40),), False)
        self.events_now = [{"cause": "preempted", "decision": {"action": "expedite"}}]  # before the injection

    def progress(self):
        return self.progress_now

    def events(self):
        return list(self.events_now)


def test_an_in_job_repair_is_attributed_to_the_event_the_watcher_writes_after_training_went_on(monkeypatch):
    """The job repairs a NaN and trains on before the watcher's next poll copies its journal line into
    events.jsonl: the record stays open (up to ATTRIBUTION_WAIT_S) for that event, and its recovery time is
    the moment training went on, not the moment the event arrived."""
    from hpc_agent.chaos import campaign as chaos_driver
    from hpc_agent.chaos.campaign import ATTRIBUTION_WAIT_S, ChaosDriver, _Open

    clock = [1000.0]
    monkeypatch.setattr(chaos_driver.time, "time", lambda: clock[0])
    target, said = _FakeTarget(), []
    chaos = ChaosDriver([target], [], duration_s=60, out=said.append, slurm=object())
    monkeypatch.setattr(chaos, "_attempt_ends", lambda t: [900.0])  # sacct: the only attempt end predates the fault
    rec = FaultRecord("nan", "watcher", 30.0)
    chaos.open.append(_Open(rec, target, target.progress(), injected=1000.0, events_seen=1))
    clock[0] = 1004.0  # rolled back to step 30 and trained on: recovered, but no event yet
    target.progress_now = Progress((Segment(0, 1, 40), Segment(0, 31, 45)), False)
    chaos._follow_recoveries()
    assert chaos.open and rec.recovered and rec.recovery_s == 4.0 and rec.detected_cause is None
    clock[0] = 1007.0  # the watcher's poll copied the job's journal line
    target.events_now.append({"cause": "diverged", "action": "in_job_repair"})
    chaos._follow_recoveries()
    assert not chaos.open
    assert (rec.detected_cause, rec.decision, rec.recovery_s, rec.steps_lost) == ("diverged", "in_job_repair", 4.0, 10)
    assert rec.ended_after_s is None  # repaired inside the job: no attempt ended
    assert said[-1].endswith("recovered in 4.0s, cause diverged, decision in_job_repair, steps lost 10")

    # without a watcher's event the record is closed ATTRIBUTION_WAIT_S after the recovery, unattributed
    rec2 = FaultRecord("gpu_oom", "watcher", 60.0)
    chaos.open.append(_Open(rec2, target, target.progress(), injected=1100.0, events_seen=len(target.events())))
    clock[0] = 1103.0
    target.progress_now = Progress((Segment(0, 1, 40), Segment(0, 31, 45), Segment(0, 41, 60)), False)
    chaos._follow_recoveries()
    assert chaos.open and rec2.recovery_s == 3.0
    clock[0] = 1103.0 + ATTRIBUTION_WAIT_S + 0.5
    chaos._follow_recoveries()
    assert not chaos.open and rec2.detected_cause is None and rec2.recovery_s == 3.0


def test_attempt_end_reads_sacct_end_and_none_while_running():
    """The chaos driver's attempt ends come from sacct's End through the same attempt grouping the watcher uses."""
    import datetime as dt

    from hpc_agent.watcher.observe import attempt_end, attempt_start
    from hpc_agent.slurm.sacct import group_attempts, parse_sacct

    text = ("JobID|JobName|State|ExitCode|NodeList|Start|End|Elapsed\n"
            "41|hpc_agent:r|OUT_OF_MEMORY|0:125|node1|2026-12-03T19:17:15|2026-12-03T19:17:53|00:00:38\n"
            "41.batch|batch|FAILED|1:0|node1|2026-12-03T19:17:15|2026-12-03T19:17:53|00:00:38\n"
            "42|hpc_agent:r|RUNNING|0:0|node1|2026-12-03T19:17:55|Unknown|00:00:05\n")
    attempts = group_attempts(parse_sacct(text))
    (ended,), (running,) = attempts["41"], attempts["42"]
    assert attempt_end(ended) == dt.datetime(2026, 12, 3, 19, 17, 53).timestamp()
    assert attempt_end(ended) - attempt_start(ended) == 38.0
    assert attempt_end(running) is None and attempt_start(running) is not None


def test_the_summary_reads_tensorboard_one_flush_after_the_window_and_counts_steps_up_to_its_end(monkeypatch):
    """A job still training appends its TensorBoard events every FLUSH_EVERY_S: the steps of the window's last
    seconds reach the disk after it ends. The driver waits one flush interval before reading, and credits only
    the steps that ended by the window's end."""
    from hpc_agent.chaos import campaign as chaos_driver
    from hpc_agent.chaos.campaign import FLUSH_MARGIN_S, ChaosDriver
    from hpc_agent.metrics.tb_reader import TB_FLUSH_EVERY_S

    clock = [1000.0]
    monkeypatch.setattr(chaos_driver.time, "time", lambda: clock[0])
    monkeypatch.setattr(chaos_driver.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    target = _FakeTarget()
    target.done_at = None
    chaos = ChaosDriver([target], [], duration_s=60, out=lambda line: None, slurm=object())
    read = []
    monkeypatch.setattr(chaos, "_summary", lambda t, end: read.append((clock[0], end)) or end)
    assert chaos._summaries() == [1000.0]
    assert read == [(1000.0 + TB_FLUSH_EVERY_S + FLUSH_MARGIN_S, 1000.0)]

    target.done_at = 990.0  # finished: its last events were flushed as it closed, nothing to wait for
    read.clear()
    assert chaos._summaries() == [1000.0 + TB_FLUSH_EVERY_S + FLUSH_MARGIN_S]
    assert read == [(1000.0 + TB_FLUSH_EVERY_S + FLUSH_MARGIN_S, 1000.0 + TB_FLUSH_EVERY_S + FLUSH_MARGIN_S)]


def test_run_queue_finds_the_runs_jobs_by_the_name_its_run_id_gives(tmp_path):
    from types import SimpleNamespace

    from hpc_agent.chaos import inject
    from hpc_agent.slurm.cli import SlurmError

    asked = []

    class Slurm:
        def run(self, argv, check=True):
            asked.append(argv)
            return SimpleNamespace(stdout="PENDING (None)\nRUNNING node2,node3\n", stderr="", returncode=0)

    run_dir = tmp_path / "p2-run-20261205-090000"
    assert inject.run_queue(Slurm(), run_dir) == [("PENDING", "(None)"), ("RUNNING", "node2")]
    assert inject.running_node(Slurm(), run_dir) == "node2"
    assert asked[0][asked[0].index("--name") + 1] == "hpc_agent:p2-run-20261205-090000"

    class Down:
        def run(self, argv, check=True):
            raise SlurmError("squeue: slurmctld not answering")

    assert inject.run_queue(Down(), run_dir) is None and inject.running_node(Down(), run_dir) is None

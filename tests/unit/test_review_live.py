"""``review`` on a live run: how long ago its last step was, a hang when the watcher's judge says so, the
throughput plot running up to now with the silence shaded, and in-job decisions marked. No Slurm, no torch.

A fabricated run dir + ledger (phase ``running``): TensorBoard steps 1..40 at 1 s each, the last one at
``LAST``; ``now`` is injected, so every age and every verdict is exact.
"""
from __future__ import annotations

import io
import json
from datetime import datetime
from pathlib import Path

import pytest
from rich.console import Console

from hpc_agent.config.load import build_config, write_run_config
from hpc_agent.config.resilience import ResilienceConfig
from hpc_agent.core import heartbeat_format, in_job_journal, rundir
from hpc_agent.diagnosis.hang import judge
from hpc_agent.review import decision_lines, main, render_table
from hpc_agent.runs.history import review_run
from hpc_agent.runs.liveness import describe, duration, live_view
from hpc_agent.runs.plot import boundary_labels, build_figure, in_job_markers
from hpc_agent.state.ledger import Ledger
from hpc_agent.watcher.in_job import audit_record
from tests.unit.test_review import RUN_ID, T0, _write_attempt, make_run

STEP_S = 1.0
START = T0 + 60             # the attempt's first TensorBoard event
LAST = START + 40 * STEP_S  # wall time of step 40, the last one TensorBoard has
DEFAULTS = ResilienceConfig()


def make_live_run(root: Path, phase: str = "running") -> Path:
    run_dir = root / RUN_ID
    (run_dir / "tb").mkdir(parents=True)
    write_run_config(run_dir, build_config([{"train": {"max_steps": 100}}]))
    ledger = Ledger.in_runs_root(root)
    ledger.clock = lambda: T0
    ledger.add_run(RUN_ID, "gpt", str(run_dir))
    ledger.record_submitted(ledger.record_intent(RUN_ID, "slurm", str(run_dir / "config.yaml"), "submit"), "2001")
    ledger.set_phase(RUN_ID, phase)
    ledger.close()
    _write_attempt(run_dir / "tb", 0, list(range(1, 41)), START, STEP_S)
    return run_dir


def write_beat(run_dir: Path, *, step: int, step_at, written_at: float, phase: str = "training",
               rank: int = 0) -> heartbeat_format.Beat:
    beat = heartbeat_format.Beat(job_id="2001", attempt=0, rank=rank, world=1, host="node1", pid=4242, phase=phase,
                                 phase_since=START, step=step, step_at=step_at, start_step=0,
                                 recent_step_s=(STEP_S,) * 20, started_at=START - 5, written_at=written_at,
                                 interval_s=DEFAULTS.heartbeat_s)
    path = rundir.heartbeat_path(run_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(heartbeat_format.encode(beat))
    return beat


def table_text(runs) -> str:
    buffer = io.StringIO()
    render_table(runs, Console(file=buffer, width=1000))
    return " ".join(buffer.getvalue().split())  # the table pads its cells: compare on single spaces


@pytest.fixture
def root(tmp_path):
    return tmp_path / "runs"


def test_duration_words():
    assert [duration(s) for s in (0, 42, 60, 252, 3600, 7500)] == ["0 s", "42 s", "1 min", "4 min 12 s",
                                                                     "1 h", "2 h 5 min"]


def test_hung_run_says_how_long_and_why(root):
    run_dir = make_live_run(root)
    now = LAST + 252  # 4 min 12 s after the last step; the limit is max(5 x 1 s, 120 s) = 2 min
    beat = write_beat(run_dir, step=40, step_at=LAST, written_at=now - 2)
    run = review_run(run_dir, root, now=now)
    expected = judge([beat], now, T0, DEFAULTS)  # the watcher's own verdict: review must say the same
    assert expected is not None and expected.kind == "step" and expected.limit_s == 120
    live = run["live"]
    assert (live["last_step"], live["silent_s"]) == (40, 252)
    assert live["verdict"]["kind"] == "step" and live["verdict"]["limit_s"] == expected.limit_s
    assert live["verdict"]["silent_s"] == pytest.approx(expected.silent_s)
    text = table_text([run])
    assert "running: last step 4 min 12 s ago (step 40)" in text
    assert "no step for 4 min 10 s (limit 2 min): looks hung (kind step," in text  # silence on the job's clock
    assert expected.reason in text


def test_within_the_limit_nothing_alarming(root):
    run_dir = make_live_run(root)
    now = LAST + 90
    write_beat(run_dir, step=40, step_at=LAST, written_at=now - 3)
    run = review_run(run_dir, root, now=now)
    assert run["live"]["verdict"] is None
    text = table_text([run])
    assert "running: last step 1 min 30 s ago (step 40)" in text
    assert "hung" not in text and "no heartbeat" not in text


def test_newer_heartbeat_step_wins_over_tensorboard(root):
    run_dir = make_live_run(root)
    now = LAST + 600  # TensorBoard alone would say 10 min: the heartbeat has seen steps since
    write_beat(run_dir, step=75, step_at=now - 30, written_at=now - 1)
    live = review_run(run_dir, root, now=now)["live"]
    assert (live["source"], live["last_step"], live["silent_s"]) == ("heartbeat", 75, 30)
    assert live["verdict"] is None
    assert describe(live) == "last step 30 s ago (step 75)"


def test_without_heartbeat_the_age_shows_and_no_verdict_is_claimed(root):
    run_dir = make_live_run(root)
    live = review_run(run_dir, root, now=LAST + 252)["live"]
    assert live["source"] == "tensorboard" and live["verdict"] is None
    assert describe(live) == "last step 4 min 12 s ago (step 40); no heartbeat, so no hang verdict"


def test_queued_run_is_not_judged(root):
    run_dir = make_live_run(root, phase="pending")
    write_beat(run_dir, step=40, step_at=LAST, written_at=LAST + 1)
    live = review_run(run_dir, root, now=LAST + 3600)["live"]
    assert live["verdict"] is None and describe(live) == "last step 1 h ago (step 40)"


@pytest.mark.parametrize("phase, kind, words", [
    ("saving", "saving", "saving for"), ("evaluating", "evaluating", "evaluating for")])
def test_other_verdict_kinds_read_in_words(phase, kind, words):
    now = LAST + 2000
    beat = heartbeat_format.Beat("2001", 0, 0, 1, "node1", 1, phase, LAST, 40, LAST, 0, (STEP_S,) * 20, START, now - 1, 5.0)
    live = live_view("running", now, (40, LAST), [beat], T0, DEFAULTS)
    assert live["verdict"]["kind"] == kind
    assert f"; {words} " in describe(live) and "looks hung" in describe(live)


def _throughput_axes(fig):
    [ax] = [a for a in fig.axes if a.get_xlabel() == "wall time"]
    return ax


def test_plot_runs_up_to_now_with_the_silence_shaded(root):
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    run_dir = make_live_run(root)
    now = LAST + 252
    write_beat(run_dir, step=40, step_at=LAST, written_at=now - 2)
    fig = build_figure([review_run(run_dir, root, now=now)])
    try:
        ax = _throughput_axes(fig)
        assert ax.get_xlim()[1] == pytest.approx(mdates.date2num(datetime.fromtimestamp(now)))
        [span] = [p for p in ax.patches if p.get_label() == "silent"]  # axvspan's Rectangle
        assert span.get_x() == pytest.approx(mdates.date2num(datetime.fromtimestamp(LAST)))
        assert span.get_x() + span.get_width() == pytest.approx(mdates.date2num(datetime.fromtimestamp(now)))
        assert any(t.get_text() == "silent 4 min 12 s: looks hung" for t in ax.texts)
    finally:
        plt.close(fig)


def test_ended_run_is_unchanged(tmp_path):
    import matplotlib.pyplot as plt

    run_dir = make_run(tmp_path / "runs")  # completed: the run of tests/unit/test_review.py
    run = review_run(run_dir, now=T0 + 99999)
    assert run["live"] is None and describe(run["live"]) == ""
    assert "ago" not in table_text([run]) and "hung" not in table_text([run])
    fig = build_figure([run])
    try:
        ax = _throughput_axes(fig)
        assert not [p for p in ax.patches if p.get_label() == "silent"]
        assert not any(t.get_text().startswith("silent") for t in ax.texts)
        walls = [line.get_xdata() for line in ax.lines if line.get_linestyle() == "None"]  # the throughput dots
        import matplotlib.dates as mdates
        assert ax.get_xlim()[1] < mdates.date2num(datetime.fromtimestamp(T0 + 99999))
        assert walls
    finally:
        plt.close(fig)


def in_job_record(reason: str = "next OOM-ladder rung", **changes) -> dict:
    """An in-job decision as the watcher records it (hpc_agent.core.in_job_journal, from the job's journal line)."""
    decision = in_job_journal.InJobDecision(seq=1, job_id="2001", attempt=0, step=37, cause="gpu_oom",
                                            action=in_job_journal.ACTION, patch={"train.micro_batch_size": 4},
                                            rollback_to_step=None, evidence=("CUDA out of memory",), at=LAST - 3,
                                            budget_left=1, reason=reason,
                                            before={"train.micro_batch_size": 8})
    return dict(audit_record(decision), run_id=RUN_ID, time="2026-01-01T00:05:00", **changes)


def test_in_job_decisions_are_marked(root, capsys):
    run_dir = make_live_run(root)
    watcher = {"job_id": "2001", "attempt": 1, "cause": "timeout", "evidence": ["sacct: TIMEOUT"],
               "decision": {"action": "requeue", "cause": "timeout", "reason": "time limit: requeue"}}
    action = {"action": "requeue", "job_id": "2001", "reason": "time limit: requeue", "decided_in": 3,
              "by": {"process": "watcher"}}  # the watcher's action record: decided_in is a seq, not a place
    record = in_job_record()
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in (watcher, action, record)))
    run = review_run(run_dir, root, now=LAST + 10)
    assert [(d["cause"], d["in_job"]) for d in run["decisions"]] == [("timeout", False), ("gpu_oom", True)]
    lines = decision_lines([run])
    assert lines[0].endswith("attempt 1 (job 2001): timeout -> requeue: time limit: requeue")
    assert lines[1].endswith("attempt 1 (job 2001) at step 37: gpu_oom -> in_job_repair: next OOM-ladder rung (in job)")
    assert "(in job)" in table_text([run])
    assert main([str(root), "--json"]) == 0
    [shown] = json.loads(capsys.readouterr().out)["runs"]
    assert shown["decisions"][1]["in_job"] is True
    # not an attempt boundary: a marker at its step in the loss panel
    assert boundary_labels([record]) == []
    assert in_job_markers([record]) == [{"step": 37, "label": "(in job) gpu_oom: micro_batch 8→4", "adaptive": False}]



def adaptation_record(reason: str, step: int, seq: int = 2) -> dict:
    """An adaptation of the LR schedule as the watcher records it from the job's journal line: the same
    encode/parse/audit path as ``launch.recovery.InJobRecovery.record_adaptation``'s line."""
    line = in_job_journal.encode(in_job_journal.InJobDecision(seq, "2001", 0, step, in_job_journal.ADAPT_CAUSE, in_job_journal.ADAPT_ACTION, {}, None,
                                                              ('[30, 2.5]', '[40, 2.49]'), LAST - 2, 2, reason))
    (decision,), problems = in_job_journal.parse(line)
    assert problems == []
    return dict(audit_record(decision), run_id=RUN_ID, time="2026-01-01T00:05:00")


def test_adaptations_are_markers_of_their_own_with_their_kind(root, capsys):
    run_dir = make_live_run(root)
    records = [adaptation_record("warm_restart: train plateau: best 2.49 of the last 3 points", 40),
               adaptation_record("lr_decay: gradient norm 96 > 10 x median 1.2: LR scale 1 -> 0.5", 45, seq=3),
               adaptation_record("\x1b[2Jsomething: else", 50, seq=4), in_job_record()]
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in records))
    run = review_run(run_dir, root, now=LAST + 10)
    assert run["in_job"] == [
        {"step": 40, "label": "(in job) adaptive: warm_restart", "adaptive": True},
        {"step": 45, "label": "(in job) adaptive: lr_decay", "adaptive": True},
        {"step": 50, "label": "(in job) adaptive", "adaptive": True},  # an unknown kind is not echoed
        {"step": 37, "label": "(in job) gpu_oom: micro_batch 8→4", "adaptive": False}]
    assert boundary_labels(records) == []  # no attempt ended
    lines = decision_lines([run])
    assert lines[0].endswith("at step 40: adaptive -> adaptive_schedule: warm_restart: train plateau: best 2.49 of "
                             "the last 3 points (in job)")
    assert "\x1b" not in "".join(lines)
    fig = build_figure([run])
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgba

    try:
        texts = {t.get_text(): t for ax in fig.axes for t in ax.texts}
        assert {"(in job) adaptive: warm_restart", "(in job) adaptive: lr_decay",
                "(in job) gpu_oom: micro_batch 8→4"} <= set(texts)
        lines_at = {line.get_xdata()[0]: to_rgba(line.get_color()) for ax in fig.axes for line in ax.get_lines()
                    if line.get_linestyle() == ":"}
        assert lines_at[40] == lines_at[45] == to_rgba("tab:olive") != lines_at[37] == to_rgba("tab:gray")
    finally:
        plt.close(fig)

def test_in_job_decisions_from_events_alone(tmp_path):
    run_dir = make_run(tmp_path / "runs")
    with open(run_dir / "events.jsonl", "a") as handle:
        handle.write(json.dumps(in_job_record(job_id="1002", attempt=3, step=70)) + "\n")
    Path(tmp_path / "runs" / "ledger.sqlite").unlink()  # no ledger: the events are all there is
    run = review_run(run_dir)
    assert [(d["cause"], d["in_job"]) for d in run["decisions"]] == [("gpu_oom", False), ("gpu_oom", True)]
    assert [b["label"] for b in run["boundaries"]] == ["preempted", "gpu_oom: micro_batch 8→4"]  # unchanged
    assert run["in_job"] == [{"step": 70, "label": "(in job) gpu_oom: micro_batch 8→4", "adaptive": False}]
    fig = build_figure([run])
    import matplotlib.pyplot as plt

    try:
        assert any(t.get_text() == "(in job) gpu_oom: micro_batch 8→4" for ax in fig.axes for t in ax.texts)
    finally:
        plt.close(fig)


def test_hung_is_a_cause_like_any_other(root):
    run_dir = make_live_run(root)
    verdict = {"kind": "step", "silent_s": 250.0, "limit_s": 120.0, "step": 40, "ranks": [0], "reason": "r"}
    events = [  # as the watcher writes them (hpc_agent.watcher.follow_hang): two notices, then the decision
        {"job_id": "2001", "attempt": 1, "action": "hang_suspected", "cause": "hung", "verdict": verdict},
        {"job_id": "2001", "attempt": 1, "action": "hang_cleared", "cause": "hung", "verdict": verdict},
    ]
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    run = review_run(run_dir, root, now=LAST + 10)
    assert "hung" not in run["causes"] and run["boundaries"] == []  # suspected, then it moved on: no hang
    events += [{"job_id": "2001", "attempt": 1, "action": "hang_suspected", "cause": "hung", "verdict": verdict},
               {"job_id": "2001", "attempt": 1, "cause": "hung", "evidence": ["hung (step): r"],
                "decision": {"action": "resubmit", "cause": "hung", "reason": "resubmit from step 30"}}]
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    run = review_run(run_dir, root, now=LAST + 10)
    assert run["causes"] == ["hung"]
    assert [b["label"] for b in run["boundaries"]] == ["hung"]
    assert decision_lines([run]) == [f"  {RUN_ID} attempt 1 (job 2001): hung -> resubmit: resubmit from step 30"]
    assert "hung" in table_text([run])


def test_ledger_decisions_stand_in_without_events(root):
    make_live_run(root)  # no events.jsonl: the watcher has not written it yet
    ledger = Ledger.in_runs_root(root)
    ledger.record_decision(RUN_ID, "2001", 0, "hung", "resubmit", "resubmit from step 30", {}, ["hung (step): r"], 30)
    ledger.close()
    run = review_run(run_dir=root / RUN_ID, runs_root=root, now=LAST + 10)
    assert run["causes"] == ["hung"]
    assert decision_lines([run]) == [f"  {RUN_ID} attempt 1 (job 2001): hung -> resubmit: resubmit from step 30"]


def test_diagnose_of_a_running_job_says_what_review_says(tmp_path, capsys, monkeypatch):
    import time as _time

    from hpc_agent import diagnose

    monkeypatch.delenv("HPC_AGENT_RUNS", raising=False)
    now = _time.time()
    run_dir = tmp_path / "runs" / RUN_ID
    (run_dir / "tb").mkdir(parents=True)
    write_run_config(run_dir, build_config([{"train": {"max_steps": 100}}]))
    _write_attempt(run_dir / "tb", 0, list(range(1, 41)), now - 300, STEP_S)  # step 40 at now - 260
    beat = heartbeat_format.Beat("102", 0, 0, 1, "node1", 7, "training", now - 600, 40, now - 260, 0, (STEP_S,) * 20,
                                 now - 600, now - 2, 5.0)
    rundir.heartbeat_path(run_dir, 0).parent.mkdir()
    rundir.heartbeat_path(run_dir, 0).write_bytes(heartbeat_format.encode(beat))
    start = datetime.fromtimestamp(now - 610).strftime("%Y-%m-%dT%H:%M:%S")
    sacct = tmp_path / "sacct.txt"
    sacct.write_text("JobID|JobName|State|ExitCode|NodeList|Start|End|Elapsed\n"
                     f"102|hpc_agent:{RUN_ID}|RUNNING|0:0|node1|{start}|Unknown|00:10:10\n")
    argv = ["102", "--sacct-file", str(sacct), "--runs-root", str(tmp_path / "runs")]
    assert diagnose.main(argv) == 0
    text = capsys.readouterr().out
    assert text.startswith("job 102: hung")  # diagnose names the live verdict as the cause (diagnose.name_hung)
    assert "  live: last step 4 min 2" in text and "(step 40); no step for 4 min" in text
    assert "(limit 2 min): looks hung (kind step," in text
    assert diagnose.main(argv + ["--json"]) == 0
    live = json.loads(capsys.readouterr().out)["live"]
    assert live["verdict"]["kind"] == "step" and live["last_step"] == 40


def test_plot_is_reproducible_and_job_text_cannot_escape(root, tmp_path):
    from hpc_agent.runs.plot import plot_runs

    run_dir = make_live_run(root)
    write_beat(run_dir, step=40, step_at=LAST, written_at=LAST + 250)
    (run_dir / "events.jsonl").write_text(json.dumps(in_job_record(reason="rung\x1b[2J\x07")) + "\n")
    run = review_run(run_dir, root, now=LAST + 252)
    first, second = plot_runs([run], tmp_path / "a.png"), plot_runs([run], tmp_path / "b.png")
    assert first.read_bytes() == second.read_bytes()  # the clock is injected: same inputs, same PNG
    [line] = decision_lines([run])
    assert line.endswith("rung?[2J? (in job)") and "\x1b" not in line

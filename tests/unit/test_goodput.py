"""Goodput (``hpc_agent.runs.goodput`` and ``review --goodput``): where a run's allocated device-hours went.

The run of the end-to-end test, 2 GPUs (sacct's AllocTRES), ``train.ckpt_every=10``, steps of 1 s, T = its submission:

====  ==========  =========  ========  ======  ======  =============================================================
att.  job         eligible   start     end     state   what happened
====  ==========  =========  ========  ======  ======  =============================================================
1     1001        T+0        T+20      T+100   PREEMP  start-up 15 s; steps 1-35 with a 5 s save after 10, 20, 30;
                                                       preempted 15 s after step 35; resumes from 30 (31-35 redone)
2     1001 (req)  T+220      T+230     T+280   FAILED  restore 20 s; 31-45, save after 40; GPU OOM 10 s after 45;
                                                       the watcher resubmits with a smaller micro-batch (41-45 redone)
3     1002        T+290      T+300     T+500   CANCEL  restore 20 s; 41-52, save after 50; hangs: the watcher cancels
                                                       it 163 s after step 52 and requeues (51-52 redone)
4     1002 (req)  T+510      T+530     T+600   COMPL.  restore 10 s; 51-55; an in-job OOM repair (8 s) rolls back to
                                                       50 (51-55 redone); 51-60; 37 s of final save and exit
====  ==========  =========  ========  ======  ======  =============================================================

By hand, in seconds per device (x2 for device-seconds): allocated 80+50+200+70 = 400; queued while eligible
20+10+10+20 = 60 (attempt 2 waited 120 s for the requeue's begin time: not eligible, not counted); productive
30+10+10+10 = 60; restart overhead 15+20+20+10 = 65; checkpoint save 15+5+5 = 25; steps redone 5+5+2+5 = 17;
preemption 15; OOM 10+8 = 18; hang 163; other 37 (attempt 4's end after its last step).
"""
from __future__ import annotations

import csv
import datetime as _dt
import io
import json
from pathlib import Path

import pytest

from hpc_agent.config.load import build_config, write_run_config
from hpc_agent.review import main
from hpc_agent.runs.goodput import (BUCKETS, InJob, StepPoint, Window, account, devices_of, ettr, totals, wall_ettr,
                                    windows)
from hpc_agent.slurm.sacct import group_attempts, parse_sacct
from hpc_agent.state.ledger import Ledger

RUN_ID = "gpt-20260302-100000"
T = _dt.datetime(2026, 3, 2, 10, 0, 0).timestamp()  # local time, as sacct prints it


def _at(offset: float) -> str:
    return _dt.datetime.fromtimestamp(T + offset).strftime("%Y-%m-%dT%H:%M:%S")


def _elapsed(seconds: int) -> str:
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


HEADER = "JobID|JobName|State|ExitCode|NodeList|Submit|Eligible|Start|End|Elapsed|AllocTRES"


def _row(job, state, code, submit, eligible, start, end, tres="billing=2,cpu=2,gres/gpu=2,mem=8G,node=1"):
    return "|".join([job, "gpt" if "." not in job else job.split(".")[1], state, code, "node1", _at(submit),
                     _at(eligible), _at(start), _at(end), _elapsed(int(end - start)), tres])


SACCT = "\n".join([
    HEADER,
    _row("1001", "PREEMPTED", "0:0", 0, 0, 20, 100),
    _row("1001.batch", "CANCELLED", "0:15", 20, 20, 20, 100, "cpu=2,gres/gpu=2,mem=8G,node=1"),
    _row("1001", "FAILED", "1:0", 100, 220, 230, 280),
    _row("1001.batch", "FAILED", "1:0", 230, 230, 230, 280, "cpu=2,gres/gpu=2,mem=8G,node=1"),
    _row("1002", "CANCELLED by 1000", "0:0", 290, 290, 300, 500),
    _row("1002.batch", "CANCELLED", "0:15", 300, 300, 300, 500, "cpu=2,gres/gpu=2,mem=8G,node=1"),
    _row("1002", "COMPLETED", "0:0", 500, 510, 530, 600),
    _row("1002.batch", "COMPLETED", "0:0", 530, 530, 530, 600, "cpu=2,gres/gpu=2,mem=8G,node=1"),
]) + "\n"


def _steps(first_start: float, steps, saves_after=(), ckpt_s=5.0, pause=None):
    """``[(step, wall)]`` of 1 s steps from ``first_start``, a ``ckpt_s`` gap after each step in ``saves_after``,
    and ``pause=(after_step, seconds)`` once (an in-job repair)."""
    out, wall = [], first_start
    for step in steps:
        wall += 1.0
        out.append((step, wall))
        if step in saves_after:
            wall += ckpt_s
        if pause and out and len(out) == pause[0]:
            wall += pause[1]
    return out


ATTEMPTS = [  # (TB file attempt, resumed from, [(step, wall offset)])
    (0, None, _steps(35, range(1, 36), saves_after=(10, 20, 30))),
    (1, 30, _steps(250, range(31, 46), saves_after=(40,))),
    (2, 40, _steps(320, range(41, 53), saves_after=(50,))),
    (3, 50, _steps(540, list(range(51, 56)) + list(range(51, 61)), pause=(5, 8.0))),
]


def _write_tb(tb: Path, attempt: int, resumed_from, points) -> None:
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(str(tb), filename_suffix=f".attempt{attempt}")
    first_wall = T + points[0][1] - 1.0
    if resumed_from is not None:  # what SummaryWriter(purge_step=S+1) writes first
        writer.add_event(event_pb2.Event(wall_time=first_wall, step=resumed_from + 1,
                                         session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)))
    for step, offset in points:
        values = {"train/loss": 5.0 / (1 + 0.05 * step), "perf/step_time_s": 1.0, "perf/samples_per_s": 64.0}
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=t, simple_value=v) for t, v in values.items()])
        writer.add_event(event_pb2.Event(wall_time=T + offset, step=step, summary=summary))
    writer.close()
    [path] = [p for p in tb.iterdir() if p.name.endswith(f".attempt{attempt}")]
    path.rename(tb / f"events.out.tfevents.{int(first_wall)}.node1.{2000 + attempt}.0.attempt{attempt}")


def make_run(root: Path) -> Path:
    run_dir = root / RUN_ID
    (run_dir / "tb").mkdir(parents=True)
    write_run_config(run_dir, build_config([{"train": {"max_steps": 60, "micro_batch_size": 8, "ckpt_every": 10}}]))
    ledger = Ledger.in_runs_root(root)
    ledger.clock = lambda: T
    ledger.add_run(RUN_ID, "gpt", str(run_dir))
    ledger.record_submitted(ledger.record_intent(RUN_ID, "slurm", str(run_dir / "config.yaml"), "submit"), "1001")
    ledger.clock = lambda: T + 290
    ledger.record_submitted(ledger.record_intent(RUN_ID, "slurm", str(run_dir / "config.yaml"), "gpu_oom"), "1002")
    ledger.set_phase(RUN_ID, "completed")
    ledger.close()
    for attempt, resumed_from, points in ATTEMPTS:
        _write_tb(run_dir / "tb", attempt, resumed_from, points)
    events = [
        {"job_id": "1001", "attempt": 1, "cause": "preempted", "action": "expedite", "reason": "requeued by Slurm"},
        {"job_id": "1001", "attempt": 2, "cause": "gpu_oom", "evidence": ["CUDA out of memory"],
         "decision": {"action": "resubmit", "cause": "gpu_oom", "patch": {"train.micro_batch_size": 4}},
         "config_diff": {"train.micro_batch_size": {"from": 8, "to": 4}}},
        {"job_id": "1002", "attempt": 3, "action": "hang_suspected", "reason": "no step for 120 s"},
        {"job_id": "1002", "attempt": 3, "cause": "hung", "decision": {"action": "requeue", "cause": "hung"}},
        {"job_id": "1002", "attempt": 4, "cause": "gpu_oom", "action": "in_job_repair", "decided_in": "job",
         "step": 56, "in_job_seq": 1, "decision": {"action": "in_job_repair", "cause": "gpu_oom",
                                                    "patch": {"train.micro_batch_size": 2}}},
        {"job_id": "1002", "cause": "completed", "action": "done", "reason": "finished"},
    ]
    with open(run_dir / "events.jsonl", "w") as handle:
        for seq, record in enumerate(events, 1):
            handle.write(json.dumps({"run_id": RUN_ID, "seq": seq, **record}) + "\n")
    return run_dir


EXPECTED_PER_DEVICE = {"productive": 60, "preemption": 15, "oom": 18, "hang": 163, "node_failure": 0,
                       "divergence": 0, "restart_overhead": 65, "steps_redone": 17, "checkpoint_save": 25,
                       "in_progress": 0, "other": 37}


@pytest.fixture
def goodput_run(tmp_path):
    run_dir = make_run(tmp_path / "runs")
    sacct = tmp_path / "sacct.txt"
    sacct.write_text(SACCT)
    return run_dir, sacct


def test_review_goodput_puts_each_hour_in_its_bucket(goodput_run, capsys):
    run_dir, sacct = goodput_run
    assert main([str(run_dir), "--goodput", "--json", "--sacct-file", str(sacct)]) == 0
    data = json.loads(capsys.readouterr().out)
    [run] = data["runs"]
    acc = run["account"]
    assert acc["device_s"] == {b: pytest.approx(2 * v, abs=1e-3) for b, v in EXPECTED_PER_DEVICE.items()}
    assert acc["allocated_s"] == pytest.approx(800) and acc["queued_s"] == pytest.approx(120)
    assert sum(acc["device_s"].values()) == pytest.approx(acc["allocated_s"], rel=0.01)  # the buckets add up
    assert sum(acc["device_s"].values()) == pytest.approx(acc["allocated_s"], abs=1e-3)  # exactly, in fact
    assert acc["ettr"] == pytest.approx(120 / (120 + 800), abs=1e-4)  # Meta's: productive / (queued + allocated)
    assert acc["steps_redone"] == 17 and acc["unplaced_points"] == 0
    assert [(a["attempt"], a["job_id"], a["cause"], a["devices"]) for a in acc["attempts"]] == [
        (1, "1001", "preempted", 2), (2, "1001", "gpu_oom", 2), (3, "1002", "hung", 2), (4, "1002", "completed", 2)]
    # per attempt: the hang's 163 s are attempt 3's, the in-job OOM repair's 8 s attempt 4's
    per = {a["attempt"]: a["device_s"] for a in acc["attempts"]}
    assert per[3]["hang"] == pytest.approx(326) and per[4]["oom"] == pytest.approx(16) and per[2]["oom"] == pytest.approx(20)
    assert acc["other_by_cause"] == {"completed": pytest.approx(74)}
    assert run["row"]["hang_h"] == pytest.approx(326 / 3600, abs=1e-4)
    assert data["total"]["allocated_s"] == pytest.approx(800) and data["total"]["ettr"] == acc["ettr"]


def test_review_goodput_table_csv_and_plot(goodput_run, capsys, tmp_path):
    run_dir, sacct = goodput_run
    assert main([str(run_dir), "--goodput", "--csv", "--sacct-file", str(sacct)]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["run"] for r in rows] == [RUN_ID, "total"]
    assert float(rows[0]["allocated_h"]) == pytest.approx(800 / 3600, abs=1e-4)
    assert sum(float(rows[0][f"{b}_h"]) for b in BUCKETS) == pytest.approx(800 / 3600, rel=0.01)
    out = tmp_path / "goodput.png"
    assert main([str(run_dir.parent), "--goodput", "--sacct-file", str(sacct), "--plot", str(out)]) == 0
    text = capsys.readouterr().out
    assert "goodput" in text and "hang" in text and RUN_ID in text and f"plot: {out}" in text
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000


def test_review_goodput_refuses_mixed_flags(goodput_run, capsys):
    run_dir, sacct = goodput_run
    assert main([str(run_dir), "--csv"]) == 2
    assert "--csv goes with --goodput" in capsys.readouterr().err
    assert main([str(run_dir), "--goodput", "--json", "--csv", "--sacct-file", str(sacct)]) == 2
    bad = sacct.parent / "not-sacct.txt"
    bad.write_text("hello\n")
    assert main([str(run_dir), "--goodput", "--sacct-file", str(bad)]) == 2
    assert "not sacct output" in capsys.readouterr().err


def test_review_goodput_without_rows_for_the_run_says_so(goodput_run, capsys):
    run_dir, sacct = goodput_run
    other = sacct.parent / "other.txt"
    other.write_text(HEADER + "\n" + _row("7", "COMPLETED", "0:0", 0, 0, 1, 5) + "\n")
    assert main([str(run_dir), "--goodput", "--json", "--sacct-file", str(other)]) == 0
    out = capsys.readouterr()
    [run] = json.loads(out.out)["runs"]
    assert run["account"] is None and "sacct has no rows for 1001, 1002" in run["problem"]
    assert "allocation unknown" in out.err


# --- the pure accounting, as tables ----------------------------------------------------------------------------
def _win(start, end, eligible=None, submit=None, devices=1, cause="completed", state="COMPLETED", job="1", index=0):
    return Window(job, index, state, cause, submit, eligible, start, end, devices)


def _pts(*triples, kept=True):
    return [StepPoint(s, w, t, kept) for s, w, t in triples]


@pytest.mark.parametrize("name, wins, points, causes, in_job, now, expected, queued", [
    ("steady, completed", [_win(0, 20, eligible=-5)], _pts((1, 11, 1), (2, 12, 1), (3, 13, 1)), {}, [], 100,
     {"restart_overhead": 10, "productive": 3, "other": 7}, 5),
    ("still running: the time since the last step is in progress, now is the end",
     [_win(0, None, eligible=0, cause="running", state="RUNNING")], _pts((1, 5, 1), (2, 6, 1)), {}, [], 30,
     {"restart_overhead": 4, "productive": 2, "in_progress": 24}, 0),
    ("pending, no Start: no allocation, queued until now", [_win(None, None, eligible=10, cause="pending",
                                                                   state="PENDING")], [], {}, [], 70, {}, 60),
    ("no Eligible column: queued from Submit", [_win(10, 12, submit=4)], [], {}, [], 50, {"restart_overhead": 2}, 6),
    ("zero GPUs in the config: counted as 1 device", [_win(0, 4, devices=1)], _pts((1, 3, 1)), {}, [], 10,
     {"restart_overhead": 2, "productive": 1, "other": 1}, 0),
    ("4 devices scale every bucket", [_win(0, 4, devices=4)], _pts((1, 3, 1)), {}, [], 10,
     {"restart_overhead": 8, "productive": 4, "other": 4}, 0),
    ("a step logged before Start (clock skew) is clipped to the window", [_win(10, 20)], _pts((1, 10.5, 1)), {}, [],
     30, {"productive": 0.5, "other": 9.5}, 0),
    ("overlapping steps (out of order in the file) never count twice", [_win(0, 10)],
     _pts((2, 6, 2), (1, 5, 2)), {}, [], 30, {"restart_overhead": 3, "productive": 3, "other": 4}, 0),
    ("a step logged just after sacct's whole-second End still belongs to the attempt", [_win(0, 10)],
     _pts((1, 10.4, 1)), {}, [], 30, {"restart_overhead": 9, "productive": 1}, 0),
    ("a point outside every attempt is not counted", [_win(0, 10)], _pts((1, 50, 1)), {}, [], 60,
     {"restart_overhead": 10}, 0),
    ("a node failure's tail; sacct's own cause when the watcher decided nothing",
     [_win(0, 10, cause="node_fail", state="NODE_FAIL")], _pts((1, 3, 1)), {}, [], 60,
     {"restart_overhead": 2, "productive": 1, "node_failure": 7}, 0),
    ("the watcher's cause wins over sacct's", [_win(0, 10, cause="unknown", state="FAILED")], _pts((1, 3, 1)),
     {1: "diverged"}, [], 60, {"restart_overhead": 2, "productive": 1, "divergence": 7}, 0),
    ("an in-job divergence rollback: the gap is divergence, the thrown-away steps redone", [_win(0, 20)],
     _pts((1, 1, 1), (2, 2, 1)) + _pts((3, 3, 1), kept=False) + _pts((3, 9, 1)), {},
     [InJob(1, 3, "diverged")], 60, {"productive": 3, "steps_redone": 1, "divergence": 5, "other": 11}, 0),
    ("a gap after a checkpoint step is the save; a gap nothing explains is other", [_win(0, 30)],
     _pts((1, 1, 1), (2, 2, 1), (3, 8, 1), (4, 15, 1)), {}, [], 60,
     {"productive": 4, "checkpoint_save": 5, "other": 21}, 0),
])
def test_account_table(name, wins, points, causes, in_job, now, expected, queued):
    acc = account(wins, points, causes, in_job, now, ckpt_every=2)
    want = {b: float(expected.get(b, 0)) for b in BUCKETS}
    assert acc["device_s"] == pytest.approx(want, abs=1e-6), name
    assert sum(acc["device_s"].values()) == pytest.approx(acc["allocated_s"], abs=1e-6), name
    assert acc["queued_s"] == pytest.approx(queued), name


def test_account_overlapping_attempts_give_each_point_to_the_later_one():
    """A successor that starts while its predecessor ends: both are allocated; the step is the successor's."""
    wins = [_win(0, 10, cause="preempted", state="PREEMPTED"), _win(8, 20, index=1)]
    acc = account(wins, _pts((1, 9, 0.5)), {}, [], 60)
    first, second = (a["device_s"] for a in acc["attempts"])
    assert first["productive"] == 0 and first["restart_overhead"] == 10
    assert second["productive"] == 0.5 and second["restart_overhead"] == 0.5 and second["other"] == 11
    assert acc["allocated_s"] == 22


def test_windows_from_sacct_rows():
    """Out-of-order attempts come back sorted by Start; missing columns and End before Start are said."""
    text = "\n".join([
        "JobID|State|Start|End|Elapsed",
        f"12|COMPLETED|{_at(100)}|{_at(160)}|00:01:00",
        f"11|PREEMPTED|{_at(0)}|{_at(50)}|00:00:50",
        f"13|FAILED|Unknown|{_at(300)}|00:00:30",     # no Start: End - Elapsed
        f"14|FAILED|{_at(400)}|{_at(390)}|00:00:00",  # End before Start
    ])
    jobs = group_attempts(parse_sacct(text))
    wins, notes = windows([a for j in ("12", "11", "13", "14") for a in jobs[j]], default_devices=3)
    assert [w.job_id for w in wins] == ["11", "12", "13", "14"]
    assert [w.cause for w in wins] == ["preempted", "completed", "unknown", "unknown"]
    assert wins[2].start == pytest.approx(T + 270) and wins[3].end == wins[3].start
    assert all(w.devices == 3 and not w.devices_from_sacct for w in wins)
    assert any("no AllocTRES" in n for n in notes) and any("End before Start" in n for n in notes)
    assert any("no Eligible or Submit column" in n for n in notes)
    assert account(wins, [], {}, [], T + 1000)["queued_s"] == 0


@pytest.mark.parametrize("tres, expected", [
    ("billing=8,cpu=8,gres/gpu=4,mem=64G,node=1", 4),
    ("cpu=8,gres/gpu:a100=2,gres/gpu=2,node=1", 2),
    ("cpu=8,gres/gpu:a100=2,gres/gpu:v100=1", 3),
    ("cpu=2,mem=1G,node=1", None),
    ("", None),
])
def test_devices_of(tres, expected):
    assert devices_of(tres) == expected


@pytest.mark.parametrize("productive, available, expected", [
    (90.0, 100.0, 0.9), (120.0, 100.0, 1.0), (10.0, 0.0, None), (10.0, None, None), (-1.0, 10.0, 0.0)])
def test_ettr(productive, available, expected):
    assert ettr(productive, available) == expected
    assert wall_ettr(90.0, 0.0, 100.0) == 0.9 and wall_ettr(1.0, None, 5.0) is None


def test_totals_sum_runs():
    a = account([_win(0, 10, eligible=0)], _pts((1, 5, 1)), {}, [], 60)
    b = account([_win(0, 30, eligible=-10, devices=2)], _pts((1, 5, 1)), {}, [], 60)
    t = totals([a, b])
    assert t["allocated_s"] == 70 and t["queued_s"] == 20 and t["device_s"]["productive"] == 3
    assert t["ettr"] == ettr(3, 90)


def test_review_goodput_asks_sacct_once_for_every_job(goodput_run, capsys, monkeypatch):
    """Without --sacct-file: one batched ``sacct -D`` for all the runs' job ids, with the columns goodput reads."""
    import subprocess

    from hpc_agent.runs.goodput import GOODPUT_FIELDS
    from hpc_agent.slurm.cli import SlurmCLI

    run_dir, _ = goodput_run
    calls = []

    def execute(argv, timeout_s):
        calls.append(list(argv))
        return subprocess.CompletedProcess(argv, 0, SACCT, "")

    monkeypatch.setattr(SlurmCLI, "_execute", staticmethod(execute))
    monkeypatch.setattr(SlurmCLI, "available", staticmethod(lambda: True))
    monkeypatch.delenv("HPC_AGENT_CLUSTERS", raising=False)
    assert main([str(run_dir.parent), "--goodput", "--json"]) == 0
    assert calls == [["sacct", "--duplicates", "--parsable2", "--format", ",".join(GOODPUT_FIELDS), "--jobs",
                      "1001,1002"]]
    [run] = json.loads(capsys.readouterr().out)["runs"]
    assert run["account"]["allocated_s"] == pytest.approx(800)
    monkeypatch.setattr(SlurmCLI, "available", staticmethod(lambda: False))
    assert main([str(run_dir), "--goodput"]) == 2
    assert "--sacct-file" in capsys.readouterr().err


def test_sacct_json_gives_the_columns_goodput_reads():
    """A saved ``sacct --json`` reply: Eligible and AllocTRES come through like text mode's columns."""
    from hpc_agent.slurm.sacct_json import parse_sacct_json

    job = {"job_id": 77, "name": "gpt", "state": {"current": ["PREEMPTED"]}, "exit_code": {"return_code": 0},
           "time": {"submission": int(T), "eligible": int(T) + 5, "start": int(T) + 20, "end": int(T) + 120,
                    "elapsed": 100},
           "tres": {"allocated": [{"type": "cpu", "name": "", "count": 8}, {"type": "gres", "name": "gpu", "count": 4},
                                  {"type": "mem", "count": {"set": True, "number": 1024}}, "junk"]}}
    [row] = parse_sacct_json(json.dumps({"jobs": [job]}))
    assert row.get("Eligible") == _at(5) and devices_of(row.get("AllocTRES")) == 4
    wins, _ = windows(group_attempts([row])["77"], default_devices=1)
    acc = account(wins, [], {}, [], T + 500)
    assert acc["allocated_s"] == 400 and acc["queued_s"] == 60 and wins[0].cause == "preempted"


def test_review_goodput_cpu_only_counts_one_device_and_says_so(goodput_run, capsys):
    run_dir, sacct = goodput_run
    sacct.write_text(SACCT.replace("gres/gpu=2,", ""))  # a CPU-only allocation; the config asks for no GPU
    assert main([str(run_dir), "--goodput", "--json", "--sacct-file", str(sacct)]) == 0
    out = capsys.readouterr()
    [run] = json.loads(out.out)["runs"]
    assert run["account"]["allocated_s"] == pytest.approx(400)  # 1 device per attempt
    assert run["account"]["device_s"]["hang"] == pytest.approx(163)
    assert "CPU-only" in run["devices_note"] and "CPU-only: each attempt counts as 1 device" in out.err


# --- lost time charged to the injected faults (the benchmarks' split by cause) ----------------------------------
def test_lost_by_cause_charges_each_gap_to_the_fault_behind_it():
    from hpc_agent.runs.goodput import lost_by_cause, time_lost

    # 1 s steps from 10 s; a preemption injected at 30.5 s (back at 40 s), a save gap after step 40 (2 s), a hang
    # injected at 70 s (the last step ends at 69 s; nothing more until the window ends at 100 s)
    points = [(i, 10.0 + i, 1.0) for i in range(1, 20)]                 # steps 1-19 end at 11-29 s
    points += [(i, 20.0 + i, 1.0) for i in range(20, 41)]               # a 10 s gap before step 20
    points += [(i, 22.0 + i, 1.0) for i in range(41, 48)]               # a 2 s gap after step 40
    lost = time_lost(0.0, 100.0, points)
    charged = lost_by_cause(lost, [("preempt", 30.5), ("hang", 70.0)], window_s=100.0, ckpt_every=20)
    assert charged["start_up"] == pytest.approx(10.0)
    assert charged["preempt"] == pytest.approx(10.0)
    assert charged["checkpoint_save"] == pytest.approx(2.0)  # the preemption was charged to the gap it caused
    assert charged["hang"] == pytest.approx(100.0 - 69.0)
    assert sum(charged.values()) == pytest.approx(lost["lost_s"])


@pytest.mark.parametrize("faults,ckpt_every,expect", [
    ([], 0, "other"),                        # nothing explains it
    ([], 5, "checkpoint_save"),              # after step 5, a multiple of ckpt_every
    ([("nan", 8.0)], 5, "nan"),              # a fault injected just before wins over the save
    ([("nan", 3.0), ("gpu_oom", 4.0)], 0, "gpu_oom"),  # two before it: the newest
    ([("nan", 8.0), ("gpu_oom", 9.0)], 0, "gpu_oom"),  # the newest one before it ended
    ([("nan", 30.0)], 0, "other"),           # injected after the gap ended: not its cause
    ([("nan", 8.0 - 61.0)], 0, "nan"),       # long before it, but a real fault recurs until its cause is gone
    ([("nan", 8.0 - 61.0)], 5, "checkpoint_save"),  # ... unless the gap is the periodic save's
])
def test_lost_by_cause_table(faults, ckpt_every, expect):
    from hpc_agent.runs.goodput import lost_by_cause

    lost = {"before_first_step_s": 0.0, "between_steps_s": 0.5, "after_last_step_s": 0.2,
            "gaps": [{"before_step": 6, "at_s": 10.0, "s": 5.0}], "lost_s": 5.7}
    charged = lost_by_cause(lost, faults, window_s=40.0, ckpt_every=ckpt_every)
    assert charged == {expect: 5.0, "between_steps": 0.7}


def test_lost_by_cause_splits_a_stretch_among_the_faults_in_it():
    from hpc_agent.runs.goodput import lost_by_cause

    # no kept step before 200 s: started (first step at 10 s), a host OOM at 40 s threw the first attempt's work
    # away (no checkpoint), a NaN at 120 s rolled back to step 0 again; kept steps from 200 s on
    lost = {"before_first_step_s": 200.0, "between_steps_s": 1.0, "after_last_step_s": 0.5, "gaps": [],
            "lost_s": 201.5}
    charged = lost_by_cause(lost, [("host_oom", 40.0), ("nan", 120.0)], window_s=300.0, startup_s=10.0)
    assert charged == {"start_up": 10.0, "host_oom": 110.0, "nan": 80.0, "between_steps": 1.5}
    # a gap with two faults: each from its injection to the next one's
    gap = {"before_first_step_s": 0.0, "between_steps_s": 0.0, "after_last_step_s": 0.0,
           "gaps": [{"before_step": 9, "at_s": 50.0, "s": 40.0}], "lost_s": 40.0}
    assert lost_by_cause(gap, [("preempt", 48.0), ("gpu_oom", 70.0)], window_s=100.0) == {"preempt": 20.0,
                                                                                         "gpu_oom": 20.0}

"""``python -m hpc_agent.review`` on a synthetic run: no Slurm, no torch.

The run: attempt 0 logs steps 1..60 and is preempted (checkpoint at 50); attempt 1 resumes from 50,
logs its attempt number at step 51 and dies of a GPU OOM; attempt 2 resumes from 50 with micro-batch
4 and logs 51..100. Steps 51..60 of attempt 0 are lost.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from hpc_agent.config.load import build_config, write_run_config
from hpc_agent.review import main, start_tensorboard
from hpc_agent.runs.history import review_run
from hpc_agent.runs.plot import boundary_labels, event_label
from hpc_agent.state.ledger import Ledger

REPO = Path(__file__).resolve().parents[2]
RUN_ID = "gpt-20260101-000000"
T0 = time.time() - 7200.0


def _lr(step: int) -> float:
    """Linear warmup over 10 steps, cosine decay to 10% at step 100 (like the training job)."""
    if step <= 10:
        return 3e-4 * step / 10
    return 3e-4 * (0.1 + 0.45 * (1 + math.cos(math.pi * (step - 10) / 90)))


def _write_attempt(tb: Path, attempt: int, steps, start_wall: float, step_time: float, resumed_from=None):
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(str(tb), filename_suffix=f".attempt{attempt}")
    if resumed_from is not None:  # what SummaryWriter(purge_step=S+1) writes first
        writer.add_event(event_pb2.Event(wall_time=start_wall, step=resumed_from + 1, session_log=event_pb2.SessionLog(
            status=event_pb2.SessionLog.START)))

    def scalars(step, wall, values):
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=t, simple_value=v) for t, v in values.items()])
        writer.add_event(event_pb2.Event(wall_time=wall, step=step, summary=summary))

    first = steps[0] if steps else (resumed_from or 0) + 1
    scalars(first, start_wall, {"run/attempt": float(attempt)})
    for i, step in enumerate(steps):
        scalars(step, start_wall + (i + 1) * step_time, {
            "train/loss": 5.0 / (1 + 0.05 * step), "train/lr": _lr(step),
            "perf/step_time_s": step_time, "perf/samples_per_s": 64 / step_time, "train/grad_norm": 1.0})
    writer.close()
    # name it like SummaryWriter would at that time (the name's timestamp orders the attempts)
    [path] = [p for p in tb.iterdir() if p.name.endswith(f".attempt{attempt}")]
    path.rename(tb / f"events.out.tfevents.{int(start_wall)}.host.{1000 + attempt}.0.attempt{attempt}")


def make_run(root: Path) -> Path:
    run_dir = root / RUN_ID
    (run_dir / "tb").mkdir(parents=True)
    write_run_config(run_dir, build_config([{"train": {"max_steps": 100, "micro_batch_size": 8}}]))
    ledger = Ledger.in_runs_root(root)
    ledger.clock = lambda: T0
    ledger.add_run(RUN_ID, "gpt", str(run_dir))
    ledger.record_submitted(ledger.record_intent(RUN_ID, "slurm", str(run_dir / "config.yaml"), "submit"), "1001")
    ledger.clock = lambda: T0 + 500
    ledger.record_submitted(ledger.record_intent(RUN_ID, "slurm", str(run_dir / "config.yaml"), "gpu_oom"), "1002")
    ledger.set_phase(RUN_ID, "completed")
    ledger.close()
    tb = run_dir / "tb"
    _write_attempt(tb, 0, list(range(1, 61)), T0 + 60, 1.0)
    _write_attempt(tb, 1, [], T0 + 300, 1.0, resumed_from=50)
    _write_attempt(tb, 2, list(range(51, 101)), T0 + 600, 1.1, resumed_from=50)
    events = [
        {"run_id": RUN_ID, "job_id": "1001", "attempt": 1, "cause": "preempted", "action": "expedite",
         "reason": "requeued after preemption", "evidence": ["sacct: PREEMPTED"]},
        {"run_id": RUN_ID, "job_id": "1001", "attempt": 2, "cause": "gpu_oom", "evidence": ["CUDA out of memory"],
         "decision": {"action": "resubmit", "cause": "gpu_oom", "patch": {"train.micro_batch_size": 4}},
         "config_diff": {"train.micro_batch_size": {"from": 8, "to": 4}}},
        {"run_id": RUN_ID, "job_id": "1002", "cause": "completed", "action": "done", "reason": "finished"},
    ]
    with open(run_dir / "events.jsonl", "w") as handle:
        for i, record in enumerate(events):
            record["time"] = f"2026-01-01T00:0{i}:00"
            handle.write(json.dumps(record) + "\n")
    return run_dir


@pytest.fixture
def run_dir(tmp_path):
    return make_run(tmp_path / "runs")


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_json_for_one_run(run_dir, capsys):
    [run] = _json(capsys, [str(run_dir), "--json"])["runs"]
    assert run["run_id"] == RUN_ID and run["phase"] == "completed"
    assert run["steps"] == {"first": 1, "last": 100, "count": 100, "duplicates": 0}
    assert [p[0] for p in review_run(run_dir)["_curves"]["train/loss"]] == list(range(1, 101))
    assert [p[0] for p in review_run(run_dir)["_curves"]["lost_loss"]] == list(range(51, 61))
    assert run["step"] == 100 and run["max_steps"] == 100
    assert run["steps_lost"] == 10
    assert run["attempts"] == 3
    assert {"preempted", "gpu_oom"} <= set(run["causes"])
    assert 0 < run["ettr"] <= 1
    # productive = 50 steps x 1.0 s (attempt 0, 1..50) + 50 x 1.1 s (attempt 2); wall from the ledger's created_at
    assert run["productive_s"] == pytest.approx(105.0)
    assert run["ettr"] == pytest.approx(105.0 / (600 + 55), abs=1e-3)
    assert run["throughput"] == pytest.approx((64 + 64 / 1.1) / 2, rel=1e-3)  # median: 50 steps each
    assert [(b["attempt"], b["step"], b["label"]) for b in run["boundaries"]] == [
        (1, 51, "preempted"), (2, 51, "gpu_oom: micro_batch 8→4")]


def test_boundary_labels_are_pure():
    assert boundary_labels([]) == []
    records = [{"attempt": 1, "cause": "preempted", "action": "expedite"},
               {"attempt": 2, "cause": "gpu_oom", "config_diff": {"train.micro_batch_size": {"from": 8, "to": 4}}},
               {"cause": "completed", "action": "done"}]
    assert [b["label"] for b in boundary_labels(records)] == ["preempted", "gpu_oom: micro_batch 8→4"]
    assert event_label({"cause": "node_fail", "config_diff": {"slurm.exclude": {"from": "", "to": "n3"}}}) \
        == "node_fail: exclude none→n3"


def test_plot_writes_png_with_markers(run_dir, tmp_path, capsys):
    out = tmp_path / "out.png"
    assert main([str(run_dir), "--plot", str(out)]) == 0
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    run = review_run(run_dir)
    assert [b["label"] for b in run["boundaries"]] == ["preempted", "gpu_oom: micro_batch 8→4"]
    assert all(b["step"] is not None and b["wall_time"] is not None for b in run["boundaries"])


def test_runs_root_table_and_missing_path(run_dir, tmp_path, capsys):
    assert main([str(run_dir.parent)]) == 0
    out = capsys.readouterr().out
    assert RUN_ID in out and "preempted" in out
    assert main([str(tmp_path / "nope")]) == 2
    assert "not a directory" in capsys.readouterr().err


def test_cli_imports_no_torch():
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "hpc_agent.review", "--help"],
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 0 and "usage" in proc.stdout
    assert "torch" not in proc.stderr


def test_serve_tensorboard_returns_each_step_once(run_dir):
    proc, url = start_tensorboard(run_dir / "tb")
    try:
        deadline, tags = time.monotonic() + 20, {}
        while time.monotonic() < deadline:
            with urllib.request.urlopen(url + "data/plugin/scalars/tags", timeout=5) as resp:
                tags = json.loads(resp.read())
            if any("train/loss" in t for t in tags.values()):
                break
            time.sleep(0.5)
        [run_name] = [name for name, t in tags.items() if "train/loss" in t]
        query = urllib.parse.urlencode({"tag": "train/loss", "run": run_name})
        with urllib.request.urlopen(f"{url}data/plugin/scalars/scalars?{query}", timeout=5) as resp:
            points = json.loads(resp.read())
        steps = [step for _, step, _ in points]
        # TensorBoard honours the SessionLog START (purge_step) of the resumed attempt: 51..60 of attempt 0 go
        assert steps == list(range(1, 101))
        assert points[-1][1] == 100 and points[50][0] >= T0 + 600  # step 51 comes from attempt 2
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _one_job_run(root: Path, events) -> Path:
    """A run with one Slurm job and one attempt (one event file), whose events.jsonl holds ``events``."""
    run_id = "gpt-20260102-000000"
    run_dir = root / run_id
    (run_dir / "tb").mkdir(parents=True)
    write_run_config(run_dir, build_config([{"train": {"max_steps": 20}}]))
    ledger = Ledger.in_runs_root(root)
    ledger.clock = lambda: T0
    ledger.add_run(run_id, "gpt", str(run_dir))
    ledger.record_submitted(ledger.record_intent(run_id, "slurm", str(run_dir / "config.yaml"), "submit"), "2001")
    ledger.set_phase(run_id, "completed")
    ledger.close()
    _write_attempt(run_dir / "tb", 0, list(range(1, 21)), T0 + 60, 1.0)
    with open(run_dir / "events.jsonl", "w") as handle:
        for record in events:
            handle.write(json.dumps({"run_id": run_id, "job_id": "2001", **record}) + "\n")
    return run_dir


ADAPTED = {"attempt": 1, "cause": "adaptive", "action": "adaptive_schedule", "decided_in": "job", "step": 7,
           "decision": {"action": "adaptive_schedule", "cause": "adaptive", "patch": {}}}
HANG = {"attempt": 1, "action": "hang_suspected", "reason": "no step for 600 s"}
STOPPED = {"attempt": 1, "cause": "code_error", "evidence": ["Traceback"],
           "decision": {"action": "stop", "cause": "code_error", "reason": "a bug: fix the code"}}
DONE = {"cause": "completed", "action": "done", "reason": "finished"}


@pytest.mark.parametrize("events", [
    [DONE], [ADAPTED, DONE], [HANG, {**HANG, "action": "hang_cleared"}, DONE], [STOPPED], [],
], ids=["completed", "in-job-adaptation", "hang-notices", "stopped", "no-events"])
def test_a_run_with_one_job_has_one_attempt(tmp_path, events):
    """Issue 44: review counted 2 attempts for a run with one job: events.jsonl numbers the attempt a record is
    about from 1, and only a requeue or resubmit (or Slurm's own requeue, expedited) starts another."""
    assert review_run(_one_job_run(tmp_path / "runs", events))["attempts"] == 1


def test_a_requeue_decision_shows_the_next_attempt(tmp_path):
    requeued = {"attempt": 1, "cause": "preempted", "decision": {"action": "requeue", "cause": "preempted"}}
    assert review_run(_one_job_run(tmp_path / "runs", [requeued]))["attempts"] == 2
    expedited = {"attempt": 1, "cause": "preempted", "action": "expedite"}
    assert review_run(_one_job_run(tmp_path / "runs2", [expedited, DONE]))["attempts"] == 2

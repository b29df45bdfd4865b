"""The watcher's tick, driven tick by tick with an injected Slurm client, clock and submitter.

These are unit tests of the loop's logic; tests/test_watch_slurm.py runs the same watcher against the
real localhost Slurm.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List

import pytest

from hpc_agent.config.load import build_config, load_snapshot
from hpc_agent.ledger import Ledger
from hpc_agent.slurm.cli import Result, SlurmError
from hpc_agent.submission import write_config
from hpc_agent.watcher import Watcher

HEADER = "JobID|JobName|State|ExitCode|NodeList|Start|End|Elapsed"
OOM_LOG = """[rank 0/1] host=node1 job={job} local_rank=0
[hpc_agent] step 3 loss 2.5
Traceback (most recent call last):
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity)
[hpc_agent] out of memory at step 4 during training (micro_batch_size 8, ZeRO-1); exiting 3
"""
CODE_LOG = """[rank 0/1] host=node1 job={job}
Traceback (most recent call last):
  File "/work/launch/engine.py", line 10, in train
ZeroDivisionError: division by zero
"""


class FakeSlurm:
    """Answers sacct from a script and records every other command."""

    def __init__(self):
        self.sacct_text = HEADER + "\n"
        self.sacct_calls: List[List[str]] = []
        self.commands: List[List[str]] = []
        self.fail_sacct = False
        self.named: Dict[str, List[str]] = {}
        self.scontrol_text = ""
        self.queue_state = ""  # what squeue --jobs says: "" means the job left the queue

    def sacct(self, job_ids, fields=(), all_attempts=True):
        self.sacct_calls.append(list(job_ids))
        if self.fail_sacct:
            raise SlurmError("sacct: error: slurmdbd: Connection refused")
        return self.sacct_text

    def run(self, argv, check=True, timeout_s=None):
        self.commands.append(list(argv))
        if argv[0] == "squeue" and "--name" not in argv:
            return Result(argv, 0, self.queue_state, "")
        if argv[0] == "squeue":
            name = argv[argv.index("--name") + 1]
            return Result(argv, 0, "\n".join(self.named.get(name, [])), "")
        if argv[0] == "sacct":
            return Result(argv, 0, "JobID|JobName|State\n", "")
        if argv[:2] == ["scontrol", "--oneliner"]:
            return Result(argv, 0, self.scontrol_text, "")
        return Result(argv, 0, "", "")


class FakeSubmitter:
    def __init__(self, first_job_id: int = 500):
        self.next_id = first_job_id
        self.calls = []

    def __call__(self, ledger, run_id, run_dir, cfg, config_path, kind, reason):
        sid = ledger.record_intent(run_id, kind, str(config_path), reason)
        job_id = str(self.next_id)
        self.next_id += 1
        ledger.record_submitted(sid, job_id)
        ledger.set_phase(run_id, "pending")
        self.calls.append({"run_id": run_id, "cfg": cfg, "reason": reason, "job_id": job_id})
        return job_id


@pytest.fixture
def world(tmp_path):
    root = tmp_path / "runs"
    ledger = Ledger.in_runs_root(root)
    slurm = FakeSlurm()
    submitter = FakeSubmitter()
    clock = [1_800_000_000.0]
    out: List[str] = []
    watcher = Watcher(ledger, slurm, runs_root=root, clock=lambda: clock[0], submit=submitter, out=out.append)
    return {"root": root, "ledger": ledger, "slurm": slurm, "submit": submitter, "watcher": watcher, "out": out,
            "clock": clock}


def add_run(world, run_id: str, job_id: str, log: str = "", **train) -> Path:
    run_dir = world["root"] / run_id
    (run_dir / "slurm").mkdir(parents=True)
    cfg = build_config([{"run": {"name": "t"}, "train": {"micro_batch_size": 8, "grad_accum_steps": 1, **train}}])
    path = write_config(run_dir, cfg)
    ledger = world["ledger"]
    ledger.add_run(run_id, "t", str(run_dir))
    sid = ledger.record_intent(run_id, "slurm", str(path), "submit")
    ledger.record_submitted(sid, job_id)
    ledger.set_phase(run_id, "running")
    if log:
        (run_dir / "slurm" / f"{job_id}_0_log.out").write_text(log.format(job=job_id))
    return run_dir


def rows(*lines: str) -> str:
    return HEADER + "\n" + "\n".join(lines) + "\n"


def test_one_batched_sacct_call_per_tick_for_all_runs(world):
    for i in range(5):
        add_run(world, f"r{i}", str(100 + i))
    world["slurm"].sacct_text = rows(*[f"{100 + i}|hpc_agent:r{i}|RUNNING|0:0|node1|2026-11-30T10:00:00|Unknown|00:01:00"
                                       for i in range(5)])
    report = world["watcher"].tick()
    assert report.sacct_calls == 1
    assert world["slurm"].sacct_calls == [[str(100 + i) for i in range(5)]]
    assert world["slurm"].commands == []


def test_without_accounting_slurmctld_states_are_used(world):
    add_run(world, "r", "7", log=OOM_LOG)
    world["slurm"].fail_sacct = True
    world["slurm"].scontrol_text = "JobId=7 JobName=hpc_agent:r JobState=FAILED Restarts=0 ExitCode=3:0 NodeList=node1\n"
    report = world["watcher"].tick()
    assert report.sacct_calls == 1 and report.fallback_calls == 2 and not report.unknown
    assert len(world["submit"].calls) == 1  # the OOM was seen through scontrol and repaired


@pytest.mark.parametrize("failure", ["error", "empty"])
def test_unknown_state_never_acts(world, failure):
    add_run(world, "r", "7", log=OOM_LOG)
    if failure == "error":
        world["slurm"].fail_sacct = True
    else:
        world["slurm"].sacct_text = ""
    report = world["watcher"].tick()
    assert report.unknown
    acting = [c for c in world["slurm"].commands if c[0] != "squeue" and c[:2] != ["scontrol", "--oneliner"]]
    assert world["submit"].calls == [] and acting == []
    assert world["ledger"].run("r").phase == "running"


def test_gpu_oom_resubmits_with_half_micro_batch_double_accumulation(world):
    run_dir = add_run(world, "r", "7", log=OOM_LOG)
    world["slurm"].sacct_text = rows("7|hpc_agent:r|FAILED|3:0|node1|2026-11-30T10:00:00|2026-11-30T10:01:00|00:01:00",
                                     "7.0|python|FAILED|3:0|node1|2026-11-30T10:00:00|2026-11-30T10:01:00|00:01:00")
    world["watcher"].tick()
    (call,) = world["submit"].calls
    assert (call["cfg"].train.micro_batch_size, call["cfg"].train.grad_accum_steps) == (4, 2)
    assert load_snapshot(run_dir / "config.yaml").train.micro_batch_size == 4
    (decision,) = world["ledger"].decisions("r")
    assert decision.cause == "gpu_oom" and decision.action == "resubmit"
    (event,) = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert event["cause"] == "gpu_oom" and event["job_id"] == "7"
    assert event["config_diff"]["train.micro_batch_size"] == {"from": 8, "to": 4}
    assert any("out of memory" in line.lower() for line in event["evidence"])
    assert world["ledger"].run("r").phase == "pending"
    # The next tick sees the new job; the old attempt is not decided twice.
    world["slurm"].sacct_text = rows("500|hpc_agent:r|RUNNING|0:0|node1|2026-11-30T10:02:00|Unknown|00:00:10")
    world["watcher"].tick()
    assert len(world["submit"].calls) == 1
    assert world["ledger"].run("r").phase == "running"
    # The new job's first attempt is the run's second: attempt numbers count across resubmissions.
    assert world["watcher"]._run_attempt(world["ledger"].run("r"), "500", 0) == 2


def write_complete_checkpoint(run_dir: Path, step: int) -> None:
    tag = run_dir / "checkpoints" / f"step_{step:08d}"
    tag.mkdir(parents=True)
    (tag / "mp_rank_00_model_states.pt").write_bytes(b"x" * 10)
    (tag / "COMPLETE.json").write_text(json.dumps({"step": step, "files": {"mp_rank_00_model_states.pt": 10}}))


def test_finished_training_is_never_requeued_whatever_the_exit(world):
    """A rank that aborts in teardown after the final checkpoint makes Slurm say FAILED: the work is done."""
    run_dir = add_run(world, "r", "7", log="[hpc_agent] done: 100 steps\nterminate called without an active exception\n",
                      max_steps=100)
    write_complete_checkpoint(run_dir, 100)
    world["slurm"].sacct_text = rows("7|hpc_agent:r|FAILED|15:0|node1|2026-11-30T10:00:00|2026-11-30T10:01:00|00:01:00")
    world["watcher"].tick()
    assert world["ledger"].run("r").phase == "completed"
    assert world["submit"].calls == [] and world["slurm"].commands == []


def test_code_error_is_not_requeued(world):
    add_run(world, "r", "7", log=CODE_LOG)
    world["slurm"].sacct_text = rows("7|hpc_agent:r|FAILED|1:0|node1|2026-11-30T10:00:00|2026-11-30T10:01:00|00:01:00")
    world["watcher"].tick()
    assert world["submit"].calls == [] and world["slurm"].commands == []
    assert world["ledger"].run("r").phase == "stopped"
    assert world["ledger"].decisions("r")[0].cause == "code_error"


def test_slurm_requeued_preemption_is_expedited_once(world):
    add_run(world, "r", "9")
    world["slurm"].sacct_text = rows(
        "9|hpc_agent:r|PREEMPTED|0:0|node1|2026-11-30T10:00:00|2026-11-30T10:05:00|00:05:00",
        "9|hpc_agent:r|PENDING|0:0|None assigned|Unknown|Unknown|00:00:00")
    world["watcher"].tick()
    world["watcher"].tick()
    assert world["slurm"].commands == [["scontrol", "update", "JobId=9", "StartTime=now"]]
    (event,) = [json.loads(line) for line in (world["root"] / "r" / "events.jsonl").read_text().splitlines()]
    assert event["action"] == "expedite" and event["attempt"] == 1  # the attempt that ended, counted from 1
    assert world["ledger"].run("r").phase == "pending"
    assert any("expedite" in line for line in world["out"])


def test_no_second_job_while_slurm_requeues_a_node_failure(world):
    """sacct may show NODE_FAIL a moment before the attempt Slurm requeued: squeue has the last word."""
    add_run(world, "r", "9")
    world["slurm"].sacct_text = rows("9|hpc_agent:r|NODE_FAIL|0:0|node1|2026-11-30T10:00:00|2026-11-30T10:05:00|00:05:00")
    world["slurm"].queue_state = "PENDING"
    world["watcher"].tick()
    assert world["submit"].calls == [] and world["ledger"].decisions("r") == []
    world["slurm"].sacct_text = rows(
        "9|hpc_agent:r|NODE_FAIL|0:0|node1|2026-11-30T10:00:00|2026-11-30T10:05:00|00:05:00",
        "9|hpc_agent:r|PENDING|0:0|None assigned|Unknown|Unknown|00:00:00")
    world["watcher"].tick()
    assert world["submit"].calls == []
    assert ["scontrol", "update", "JobId=9", "ExcNodeList=node1"] in world["slurm"].commands
    assert ["scontrol", "update", "JobId=9", "StartTime=now"] in world["slurm"].commands
    assert load_snapshot(world["root"] / "r" / "config.yaml").slurm.exclude == "node1"


def test_completed_run_is_done(world):
    add_run(world, "r", "7")
    world["slurm"].sacct_text = rows("7|hpc_agent:r|COMPLETED|0:0|node1|2026-11-30T10:00:00|2026-11-30T10:09:00|00:09:00")
    world["watcher"].tick()
    assert world["ledger"].run("r").phase == "completed"
    world["watcher"].tick()
    assert world["slurm"].sacct_calls[-1:] == [["7"]] and len(world["slurm"].sacct_calls) == 1  # no live runs left


def test_pause_file_stops_all_actions(world):
    add_run(world, "r", "7", log=OOM_LOG)
    world["slurm"].sacct_text = rows("7|hpc_agent:r|FAILED|3:0|node1|2026-11-30T10:00:00|2026-11-30T10:01:00|00:01:00")
    world["watcher"].pause_file.write_text("paused")
    report = world["watcher"].tick()
    assert report.paused and world["slurm"].sacct_calls == [] and world["submit"].calls == []
    world["watcher"].pause_file.unlink()
    world["watcher"].tick()
    assert len(world["submit"].calls) == 1


def test_dry_run_changes_nothing(world):
    run_dir = add_run(world, "r", "7", log=OOM_LOG)
    world["watcher"].dry_run = True
    world["slurm"].sacct_text = rows("7|hpc_agent:r|FAILED|3:0|node1|2026-11-30T10:00:00|2026-11-30T10:01:00|00:01:00")
    world["watcher"].tick()
    assert world["submit"].calls == [] and world["ledger"].decisions("r") == []
    assert not (run_dir / "events.jsonl").exists()
    assert any("resubmit" in line for line in world["out"])


def test_recorded_decision_without_action_is_carried_out_after_restart(world):
    """The watcher died after recording a decision and before submitting: a new watcher finishes it once."""
    add_run(world, "r", "7", log=OOM_LOG)
    ledger = world["ledger"]
    ledger.record_decision("r", "7", 0, "gpu_oom", "resubmit", "GPU out of memory",
                           {"train.micro_batch_size": 4, "train.grad_accum_steps": 2}, [], None)
    ledger.set_phase("r", "recovering")
    world["slurm"].sacct_text = rows("7|hpc_agent:r|FAILED|3:0|node1|2026-11-30T10:00:00|2026-11-30T10:01:00|00:01:00")
    world["watcher"].tick()
    assert len(world["submit"].calls) == 1
    world["slurm"].sacct_text = rows("500|hpc_agent:r|PENDING|0:0|None assigned|Unknown|Unknown|00:00:00")
    world["watcher"].tick()
    assert len(world["submit"].calls) == 1


@pytest.mark.parametrize("slurm_knows_it", [True, False])
def test_reconcile_intent_without_job_id(world, slurm_knows_it):
    run_dir = add_run(world, "r", "7")
    ledger = world["ledger"]
    sid = ledger.record_intent("r", "slurm", str(run_dir / "config.yaml"), "gpu_oom: resubmit")
    if slurm_knows_it:
        world["slurm"].named["hpc_agent:r"] = ["7", "8"]
    world["watcher"].reconcile()
    latest = ledger.latest_submission("r")
    if slurm_knows_it:
        assert latest.id == sid and latest.job_id == "8"
        assert world["submit"].calls == []
    else:
        assert world["submit"].calls and latest.job_id == "500"
        assert "abandoned" in ledger.submissions("r")[-2].error


def write_loss_events(tb_dir: Path, losses: Dict[int, float]) -> None:
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(str(tb_dir))
    for step, loss in sorted(losses.items()):
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag="train/loss", simple_value=loss)])
        writer.add_event(event_pb2.Event(step=step, wall_time=1_800_000_000.0 + step, summary=summary))
    writer.close()


def test_nan_loss_rolls_back_past_the_divergence_and_lowers_lr(world):
    """TensorBoard says the loss went NaN at step 25: resume from step 20's checkpoint with half the LR."""
    run_dir = add_run(world, "r", "7", log="[hpc_agent] step 24 loss 2.1\n", lr=1e-3)
    for step in (10, 20, 30):
        write_complete_checkpoint(run_dir, step)
    write_loss_events(run_dir / "tb", {s: (float("nan") if s >= 25 else 3.0 - s / 100) for s in range(1, 31)})
    world["slurm"].sacct_text = rows("7|hpc_agent:r|FAILED|65:0|node1|2026-11-30T10:00:00|2026-11-30T10:01:00|00:01:00")
    world["watcher"].tick()
    (call,) = world["submit"].calls
    assert call["cfg"].train.lr == pytest.approx(5e-4)
    (decision,) = world["ledger"].decisions("r")
    assert decision.cause == "diverged" and decision.decision["rollback_to_step"] == 20
    assert (run_dir / "checkpoints" / "set_aside" / "step_00000030").is_dir()
    assert (run_dir / "checkpoints" / "step_00000020").is_dir()

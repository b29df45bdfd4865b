"""The watcher's tick, driven tick by tick with an injected Slurm client, clock and submitter.

These are unit tests of the loop's logic. Slurm is the canonical fake (tests/helpers/fake_slurm.py, held to
the real cluster by tests/cluster/test_slurm_contract.py): each test makes the job do what it does (fail, oom,
preempt...) through the fake's API, and the watcher reads it back through sacct/squeue/scontrol as it would
on the cluster. One clock (the fake's) drives Slurm, the ledger and the watcher. tests/cluster/test_watch_slurm.py
runs the same watcher against the real localhost Slurm.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from hpc_agent.config.load import build_config, load_snapshot, write_run_config
from hpc_agent.jobs.submission import record_job
from hpc_agent.slurm.job_match import job_name_for
from hpc_agent.slurm.queries import own_jobs
from hpc_agent.state import run_config
from hpc_agent.state.ledger import Ledger
from hpc_agent.watcher.loop import Watcher
from tests.helpers.fake_slurm import FakeSlurm

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


class FakeSubmitter:
    """submit_attempt's bookkeeping around the fake's sbatch: the config, intent, sbatch (the run's job name), job id."""

    def __init__(self, slurm: FakeSlurm):
        self.slurm = slurm
        self.calls = []

    def __call__(self, ledger, run_id, run_dir, cfg, config_path, kind, reason):
        run_config.record(ledger, run_id, cfg, f"submitted ({reason})")
        sid = ledger.record_intent(run_id, kind, str(config_path), reason)
        argv = ["sbatch", "--parsable", "--job-name", job_name_for(run_id), "--wrap", "x"]
        job_id = self.slurm.run(argv).stdout.strip()
        record_job(ledger, sid, run_id, job_id)
        self.calls.append({"run_id": run_id, "cfg": cfg, "reason": reason, "job_id": job_id})
        return job_id


@pytest.fixture
def world(tmp_path):
    root = tmp_path / "runs"
    slurm = FakeSlurm()  # job ids from 100; its clock is the one clock of the test
    clock = lambda: slurm.now  # noqa: E731
    ledger = Ledger(root / "ledger.sqlite", clock=clock)
    submitter = FakeSubmitter(slurm)
    out: List[str] = []
    watcher = Watcher(ledger, slurm, runs_root=root, clock=clock, submit=submitter, out=out.append)
    return {"root": root, "ledger": ledger, "slurm": slurm, "submit": submitter, "watcher": watcher, "out": out}


def add_run(world, run_id: str, log: str = "", start: bool = True, **train) -> Tuple[Path, str]:
    """A followed run whose job Slurm has (submitted under the run's job name, started unless ``start`` is
    False, a minute ago), with the job's log; returns the run dir and the job id."""
    slurm: FakeSlurm = world["slurm"]
    run_dir = world["root"] / run_id
    (run_dir / "slurm").mkdir(parents=True)
    cfg = build_config([{"run": {"name": "t"}, "train": {"micro_batch_size": 8, "grad_accum_steps": 1, **train}}])
    path = write_run_config(run_dir, cfg)
    ledger = world["ledger"]
    ledger.add_run(run_id, "t", str(run_dir))
    run_config.record(ledger, run_id, cfg, "submitted (submit)")  # as submit_attempt does
    sid = ledger.record_intent(run_id, "slurm", str(path), "submit")
    job_id = slurm.submit(job_name_for(run_id))
    ledger.record_submitted(sid, job_id)
    if start:
        slurm.start(job_id)
        ledger.set_phase(run_id, "running")
    else:
        ledger.set_phase(run_id, "pending")
    slurm.advance(60)
    if log:
        (run_dir / "slurm" / f"{job_id}_0_log.out").write_text(log.format(job=job_id))
    return run_dir, job_id


def acting(slurm: FakeSlurm) -> List[List[str]]:
    """Commands that change Slurm (not the squeue/scontrol show questions of the fallback or a requeue)."""
    return [c for c in slurm.commands if c[0] != "squeue" and c[:2] != ["scontrol", "--oneliner"]]


def test_one_batched_sacct_call_per_tick_for_all_runs(world):
    for i in range(5):
        add_run(world, f"r{i}")
    report = world["watcher"].tick()
    assert report.sacct_calls == 1
    assert world["slurm"].sacct_calls == [[str(100 + i) for i in range(5)]]
    assert world["slurm"].commands == []
    assert all(world["ledger"].run(f"r{i}").phase == "running" for i in range(5))


def test_without_accounting_slurmctld_states_are_used(world):
    slurm = world["slurm"]
    _, job = add_run(world, "r", log=OOM_LOG)
    slurm.fail(job, 3)
    slurm.break_command("sacct", "sacct: error: slurmdbd: Connection refused")
    report = world["watcher"].tick()
    assert report.sacct_calls == 1 and report.fallback_calls == 2 and not report.unknown
    assert slurm.ran("squeue") and slurm.ran("scontrol", "--oneliner", "show", "job")
    assert len(world["submit"].calls) == 1  # the OOM was seen through scontrol and repaired


@pytest.mark.parametrize("failure", ["error", "down", "empty"])
def test_unknown_state_never_acts(world, failure):
    """The job failed (a GPU OOM the watcher would repair), but nothing says so: wait, never act on a guess."""
    slurm = world["slurm"]
    _, job = add_run(world, "r", log=OOM_LOG)
    slurm.fail(job, 3)
    if failure == "error":  # accounting down, and slurmctld has already forgotten the job (MinJobAge)
        slurm.break_command("sacct", "sacct: error: slurmdbd: Connection refused")
        slurm.purge(job)
    elif failure == "down":  # accounting and slurmctld both down
        for command in ("sacct", "squeue", "scontrol"):
            slurm.break_command(command, timeout=True)
    else:  # accounting answers, but has no record of the job yet (slurmdbd behind)
        slurm.sacct_lag_s = 3600
    report = world["watcher"].tick()
    assert report.unknown
    assert world["submit"].calls == [] and acting(slurm) == [] and slurm.submissions == []
    assert world["ledger"].run("r").phase == "running"


def test_gpu_oom_resubmits_with_half_micro_batch_double_accumulation(world):
    slurm = world["slurm"]
    run_dir, job = add_run(world, "r", log=OOM_LOG)
    slurm.step(job, "python")
    slurm.end_step(job, "0", "FAILED", "3:0")
    slurm.fail(job, 3)
    world["watcher"].tick()
    (call,) = world["submit"].calls
    assert (call["cfg"].train.micro_batch_size, call["cfg"].train.grad_accum_steps) == (4, 2)
    assert load_snapshot(run_dir / "config.yaml").train.micro_batch_size == 4
    (decision,) = world["ledger"].decisions("r")
    assert decision.cause == "gpu_oom" and decision.action == "resubmit"
    (event,) = [e for e in map(json.loads, (run_dir / "events.jsonl").read_text().splitlines())
                if "by" not in e]  # the decision; the resubmit's own action record (hpc_agent.state.audit) follows it
    assert event["cause"] == "gpu_oom" and event["job_id"] == job
    assert event["config_diff"]["train.micro_batch_size"] == {"from": 8, "to": 4}
    assert any("out of memory" in line.lower() for line in event["evidence"])
    assert world["ledger"].run("r").phase == "pending"
    # The next tick sees the new job run; the old attempt is not decided twice.
    new = call["job_id"]
    assert slurm.job(new).name == job_name_for("r") and slurm.schedule() == [new]
    slurm.advance(10)
    world["watcher"].tick()
    assert len(world["submit"].calls) == 1 and len(slurm.submissions) == 1
    assert world["ledger"].run("r").phase == "running"
    # The new job's first attempt is the run's second: attempt numbers count across resubmissions.
    from hpc_agent.watcher.follow_model import RunState
    from hpc_agent.state.lifecycle import Phase

    from hpc_agent.watcher.observe import run_state

    state = run_state(world["ledger"], world["ledger"].run("r"), RunState("r", Phase.RUNNING, new))
    assert state.attempt_offset + 0 + 1 == 2


def write_complete_checkpoint(run_dir: Path, step: int) -> None:
    tag = run_dir / "checkpoints" / f"step_{step:08d}"
    tag.mkdir(parents=True)
    (tag / "mp_rank_00_model_states.pt").write_bytes(b"x" * 10)
    (tag / "COMPLETE.json").write_text(json.dumps({"step": step, "files": {"mp_rank_00_model_states.pt": 10}}))


def test_finished_training_is_never_requeued_whatever_the_exit(world):
    """A rank that aborts in teardown after the final checkpoint makes Slurm say FAILED: the work is done."""
    run_dir, job = add_run(world, "r", max_steps=100,
                           log="[hpc_agent] done: 100 steps\nterminate called without an active exception\n")
    write_complete_checkpoint(run_dir, 100)
    world["slurm"].fail(job, 15)
    world["watcher"].tick()
    assert world["ledger"].run("r").phase == "completed"
    assert world["submit"].calls == [] and world["slurm"].commands == []


def test_code_error_is_not_requeued(world):
    _, job = add_run(world, "r", log=CODE_LOG)
    world["slurm"].fail(job, 1)
    world["watcher"].tick()
    assert world["submit"].calls == [] and world["slurm"].commands == []
    assert world["ledger"].run("r").phase == "stopped"
    assert world["ledger"].decisions("r")[0].cause == "code_error"


def test_slurm_requeued_preemption_is_expedited_once(world):
    slurm = world["slurm"]
    _, job = add_run(world, "r")
    slurm.advance(240)
    slurm.preempt(job)  # PREEMPTED, and Slurm's own new attempt pending until its BeginTime (+121 s)
    world["watcher"].tick()
    world["watcher"].tick()
    assert slurm.commands == [["scontrol", "update", f"JobId={job}", "StartTime=now"]]
    assert slurm.expedites == [job] and slurm.job(job).begin == slurm.now
    (event,) = [e for e in map(json.loads, (world["root"] / "r" / "events.jsonl").read_text().splitlines())
                if "by" not in e]  # the decision; the expedite's own action record (hpc_agent.state.audit) follows it
    assert event["action"] == "expedite" and event["attempt"] == 1  # the attempt that ended, counted from 1
    assert world["ledger"].run("r").phase == "pending"
    assert any("expedite" in line for line in world["out"])
    assert slurm.schedule() == [job] and world["submit"].calls == []  # attempt 2 runs now, not in 121 s


def test_no_second_job_while_slurm_requeues_a_node_failure(world):
    """sacct may show NODE_FAIL a moment before the attempt Slurm requeued: squeue has the last word."""
    slurm = world["slurm"]
    _, job = add_run(world, "r")
    slurm.sacct_lag_s = 4  # accounting records the requeued attempt a few seconds late (as measured)
    slurm.node_fail(job, requeue=True)
    world["watcher"].tick()  # sacct: NODE_FAIL only; squeue: PENDING
    assert slurm.ran("squeue")
    assert world["submit"].calls == [] and world["ledger"].decisions("r") == [] and slurm.submissions == []
    slurm.advance(5)  # sacct: NODE_FAIL, then the pending attempt
    world["watcher"].tick()
    assert world["submit"].calls == [] and slurm.submissions == []
    assert ["scontrol", "update", f"JobId={job}", "ExcNodeList=node1"] in slurm.commands
    assert ["scontrol", "update", f"JobId={job}", "StartTime=now"] in slurm.commands
    assert slurm.excludes == [(job, "node1")] and slurm.job(job).exclude == ["node1"]
    assert load_snapshot(world["root"] / "r" / "config.yaml").slurm.exclude == "node1"


def test_completed_run_is_done(world):
    _, job = add_run(world, "r")
    world["slurm"].advance(480)
    world["slurm"].complete(job)
    world["watcher"].tick()
    assert world["ledger"].run("r").phase == "completed"
    world["watcher"].tick()
    assert world["slurm"].sacct_calls == [[job]]  # no live runs left: the second tick asks nothing


def test_pause_file_stops_all_actions(world):
    _, job = add_run(world, "r", log=OOM_LOG)
    world["slurm"].fail(job, 3)
    world["watcher"].pause_file.write_text("paused")
    report = world["watcher"].tick()
    assert report.paused and world["slurm"].sacct_calls == [] and world["submit"].calls == []
    assert world["slurm"].calls == []
    world["watcher"].pause_file.unlink()
    world["watcher"].tick()
    assert len(world["submit"].calls) == 1


def test_dry_run_changes_nothing(world):
    run_dir, job = add_run(world, "r", log=OOM_LOG)
    world["watcher"].dry_run = True
    world["slurm"].fail(job, 3)
    world["watcher"].tick()
    assert world["submit"].calls == [] and world["ledger"].decisions("r") == []
    assert acting(world["slurm"]) == [] and world["slurm"].submissions == []
    assert not (run_dir / "events.jsonl").exists()
    assert any("resubmit" in line for line in world["out"])


def test_recorded_decision_without_action_is_carried_out_after_restart(world):
    """The watcher died after recording a decision and before submitting: a new watcher finishes it once."""
    slurm = world["slurm"]
    _, job = add_run(world, "r", log=OOM_LOG)
    slurm.fail(job, 3)
    ledger = world["ledger"]
    ledger.record_decision("r", job, 0, "gpu_oom", "resubmit", "GPU out of memory",
                           {"train.micro_batch_size": 4, "train.grad_accum_steps": 2}, [], None)
    ledger.set_phase("r", "recovering")
    world["watcher"].tick()
    assert len(world["submit"].calls) == 1
    (new,) = [call["job_id"] for call in world["submit"].calls]
    assert slurm.job(new).state == "PENDING"
    slurm.advance(5)
    world["watcher"].tick()
    assert len(world["submit"].calls) == 1 and len(slurm.submissions) == 1


@pytest.mark.parametrize("slurm_knows_it", [True, False])
def test_reconcile_intent_without_job_id(world, slurm_knows_it):
    """The watcher decided to resubmit and died after recording its intent: Slurm's jobs under the run's
    name settle it (the job id it got, or a new sbatch once the intent is old enough)."""
    slurm = world["slurm"]
    run_dir, job = add_run(world, "r")
    slurm.oom(job)
    ledger = world["ledger"]
    ledger.set_phase("r", "recovering")
    sid = ledger.record_intent("r", "slurm", str(run_dir / "config.yaml"), "gpu_oom: resubmit")
    reached = slurm.submit(job_name_for("r")) if slurm_knows_it else None  # its sbatch answered, then it died
    world["watcher"].reconcile()  # too young: its sbatch may still be in flight, so Slurm is not even asked
    assert ledger.latest_submission("r").job_id is None and world["submit"].calls == []
    assert not any(c[0] in ("squeue", "sacct") for c in slurm.commands)
    slurm.advance(121)
    world["watcher"].reconcile()
    latest = ledger.latest_submission("r")
    assert slurm.ran("squeue", "--noheader", "--states", "all", *own_jobs(), "--name", job_name_for("r"))
    if slurm_knows_it:
        assert latest.id == sid and latest.job_id == reached != job
        assert world["submit"].calls == [] and slurm.submissions == []
    else:
        (call,) = world["submit"].calls
        assert latest.job_id == call["job_id"] and slurm.job(call["job_id"]).name == job_name_for("r")
        assert "abandoned" in ledger.submissions("r")[-2].error
    assert ledger.run("r").phase == "pending"


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
    run_dir, job = add_run(world, "r", log="[hpc_agent] step 24 loss 2.1\n", lr=1e-3)
    for step in (10, 20, 30):
        write_complete_checkpoint(run_dir, step)
    write_loss_events(run_dir / "tb", {s: (float("nan") if s >= 25 else 3.0 - s / 100) for s in range(1, 31)})
    world["slurm"].fail(job, 65)
    world["watcher"].tick()
    (call,) = world["submit"].calls
    assert call["cfg"].train.lr == pytest.approx(5e-4)
    (decision,) = world["ledger"].decisions("r")
    assert decision.cause == "diverged" and decision.decision["rollback_to_step"] == 20
    assert (run_dir / "checkpoints" / "set_aside" / "step_00000030").is_dir()
    assert (run_dir / "checkpoints" / "step_00000020").is_dir()

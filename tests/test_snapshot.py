"""Asynchronous snapshots (launch/snapshot.py): which one a resume takes (table), retention (table),
the background write and its marker, and exact resume after SIGKILL with 2 ranks under ZeRO-1 and -3."""
import json
import signal
import threading
import time

import pytest

from helpers.common import expect, losses, run_ranks, snapshot, start, wait_for_snapshot
from hpc_agent.checkpoints import (MARKER, Candidate, problem, retention, scan, select, snap_tag_for, step_of,
                                   tag_for)

FILES = {"mp_rank_00_model_states.pt": 10}


def ok(step, snap=False):
    name = snap_tag_for(step) if snap else tag_for(step)
    return Candidate(name, step, {"step": step, "files": FILES}, None, dict(FILES))


def torn(step, snap=True):
    name = snap_tag_for(step) if snap else tag_for(step)
    return Candidate(name, step, None, None, dict(FILES))


def S(step):
    return ok(step, snap=True)


# (candidates, chosen name or None, skipped names)
SELECT_CASES = [
    ([ok(10), S(12)], snap_tag_for(12), []),                                # newer complete snapshot wins
    ([ok(10), S(12), torn(14)], snap_tag_for(12), [snap_tag_for(14)]),     # torn snapshot skipped
    ([ok(10), torn(12)], tag_for(10), [snap_tag_for(12)]),
    ([S(10), ok(10)], tag_for(10), []),                                     # a tie goes to the checkpoint
    ([S(8), ok(10)], tag_for(10), []),                                      # older snapshot ignored
    ([torn(12), torn(4, snap=False)], None, [snap_tag_for(12), tag_for(4)]),
]


@pytest.mark.parametrize("candidates,chosen,skipped", SELECT_CASES)
def test_select_with_snapshots(candidates, chosen, skipped):
    selection = select(candidates)
    assert (selection.chosen.name if selection.chosen else None) == chosen
    assert [name for name, _ in selection.skipped] == skipped


def test_selection_says_snapshot():
    assert select([ok(10), S(12)]).lines() == ["resuming from snapshot snap_00000012 (step 12)"]
    assert step_of(snap_tag_for(12)) == 12 and step_of("snap_12") is None


# (candidates, keep, deleted names)
RETENTION_CASES = [
    ([S(2), S(4), S(6)], 3, [snap_tag_for(2), snap_tag_for(4)]),            # only the newest snapshot stays
    ([ok(4), S(2), S(6)], 3, [snap_tag_for(2)]),
    ([ok(6), S(4), S(6)], 3, [snap_tag_for(4), snap_tag_for(6)]),           # superseded by a checkpoint
    ([ok(4), S(6), torn(8)], 3, []),                                        # newer torn one: maybe in flight
    ([ok(4), torn(6), S(8)], 3, [snap_tag_for(6)]),
    ([torn(6)], 1, []),                                                     # nothing complete: keep all
    ([ok(10), ok(20), S(22), ok(30)], 1, [tag_for(10), tag_for(20), snap_tag_for(22)]),
]


@pytest.mark.parametrize("candidates,keep,deleted", RETENTION_CASES)
def test_retention_with_snapshots(candidates, keep, deleted):
    assert retention(candidates, keep) == deleted


class FakeEngine:
    """Calls its checkpoint engine like DeepSpeed's save_checkpoint does (one file per rank)."""

    def __init__(self, weight):
        self.weight, self.checkpoint_engine = weight, None

    def save_checkpoint(self, save_dir, tag, client_state, save_latest):
        assert save_latest is False
        self.checkpoint_engine.makedirs(f"{save_dir}/{tag}", exist_ok=True)
        self.checkpoint_engine.save({"module": {"w": self.weight}, **client_state},
                                    f"{save_dir}/{tag}/mp_rank_00_model_states.pt")


def test_snapshot_is_written_in_the_background_from_a_host_copy(tmp_path, monkeypatch):
    import torch
    from launch import snapshot as snap

    release, writing = threading.Event(), threading.Event()
    real_save = torch.save

    def slow_save(obj, f):  # the write blocks until the test lets it go
        writing.set()
        assert release.wait(30)
        real_save(obj, f)

    monkeypatch.setattr(torch, "save", slow_save)
    lines = []
    snaps = snap.Snapshots(2, tmp_path, rank=0, world=1, layout={"zero_stage": 1}, keep_checkpoints=1,
                           agree_max=lambda v: v, say=lines.append)
    engine = FakeEngine(torch.zeros(4))
    assert not snaps.after_step(engine, 3, lambda: {"step": 3})             # not due
    started = time.perf_counter()
    assert snaps.after_step(engine, 4, lambda: {"step": 4})
    assert time.perf_counter() - started < 5 and writing.wait(10) and snaps.busy()
    engine.weight.add_(1.0)                                                   # training goes on meanwhile
    assert not snaps.after_step(engine, 6, lambda: {"step": 6}) and snaps.skipped == 1
    tag_dir = tmp_path / snap_tag_for(4)
    assert not (tag_dir / MARKER).exists()                                    # no marker before the files
    release.set()
    snaps.settle()
    assert not snaps.busy()
    (chosen,) = [c for c in scan(tmp_path) if c.name == snap_tag_for(4)]
    assert problem(chosen) is None and chosen.marker["layout"] == {"zero_stage": 1}
    assert chosen.marker["files"] == {"mp_rank_00_model_states.pt": chosen.sizes["mp_rank_00_model_states.pt"]}
    saved = torch.load(tag_dir / "mp_rank_00_model_states.pt")
    assert saved["step"] == 4 and torch.equal(saved["module"]["w"], torch.zeros(4))  # the state at step 4
    assert any("snapshot snap_00000004 complete" in line for line in lines)
    assert snaps.after_step(engine, 8, lambda: {"step": 8})                  # free again
    snaps.settle()
    assert sorted(p.name for p in tmp_path.iterdir()) == [snap_tag_for(8)]   # only the newest kept


def test_abandoned_snapshot_gets_no_marker(tmp_path, monkeypatch):
    import torch
    from launch import snapshot as snap

    release = threading.Event()
    real_save = torch.save
    monkeypatch.setattr(torch, "save", lambda obj, f: (release.wait(30), real_save(obj, f)))
    snaps = snap.Snapshots(1, tmp_path, 0, 1, {}, 1, lambda v: v, lambda line: None)
    assert snaps.after_step(FakeEngine(torch.ones(2)), 1, lambda: {"step": 1})
    snaps.settle(abandon=True)   # a preemption: do not wait
    release.set()
    snaps._thread.join(10)
    assert not (tmp_path / snap_tag_for(1) / MARKER).exists()
    assert select(scan(tmp_path)).chosen is None


def _cfg(tmp_path, stage, world, steps):
    return snapshot(tmp_path / f"cfg{stage}.yaml", train={"max_steps": steps, "ckpt_every": 1000, "zero_stage": stage,
                                                          "precision": "fp32", "warmup_steps": 3},
                    resilience={"snapshot_every": 3}, slurm={"tasks_per_node": world})


@pytest.mark.slow
@pytest.mark.parametrize("stage", [1, 3])
def test_two_ranks_resume_bit_exact_from_snapshot(tmp_path, stage):
    """2 ranks (gloo): SIGKILL both after a snapshot is complete; the resume takes the newest complete
    snapshot, every rank's shard comes back, and the losses match the uninterrupted run."""
    from launch.distributed import free_port

    steps = 120  # long enough that the kill lands mid-run
    cfg = _cfg(tmp_path, stage, 2, steps)
    straight = run_ranks(cfg, tmp_path / "straight", world=2)
    expect(straight[0], 0, f"done: {steps} steps")

    run_dir = tmp_path / "killed"
    port = free_port()
    procs = [start(cfg, run_dir, rank, 2, port) for rank in range(2)]
    wait_for_snapshot(run_dir, 9, procs[0])
    for proc in procs:
        proc.send_signal(signal.SIGKILL)
    for proc in procs:
        proc.wait(timeout=30)
    chosen = select(scan(run_dir / "checkpoints")).chosen
    assert chosen.name.startswith("snap_") and chosen.step >= 9
    shards = [f for f in chosen.marker["files"] if "pp_rank_" in f]
    assert {("pp_rank_0_" in f, "pp_rank_1_" in f) for f in shards} == {(True, False), (False, True)}

    resumed = run_ranks(cfg, run_dir, world=2)
    expect(resumed[0], 0, f"resuming from snapshot {chosen.name} (step {chosen.step})", f"done: {steps} steps")
    want, got = losses(straight[0].stdout), losses(resumed[0].stdout)
    assert min(got) == chosen.step + 1
    for step in range(chosen.step + 1, steps + 1):
        assert got[step] == pytest.approx(want[step], abs=1e-6), step
    final = json.loads((run_dir / "checkpoints" / tag_for(steps) / MARKER).read_text())
    assert final["step"] == steps
    assert not any(p.name.startswith("snap_") for p in (run_dir / "checkpoints").iterdir())


def test_rank0_gives_up_when_another_rank_reports_a_failure(tmp_path):
    import torch
    from launch import snapshot as snap

    lines = []
    snaps = snap.Snapshots(1, tmp_path, 0, 2, {}, 1, lambda v: v, lines.append)  # rank 0 of 2
    assert snaps.after_step(FakeEngine(torch.ones(2)), 1, lambda: {"step": 1})
    (tmp_path / snap_tag_for(1) / "report_rank_00001.json").write_text(
        json.dumps({"step": 1, "rank": 1, "error": "OSError: disk full"}))
    snaps._thread.join(30)
    assert not snaps.busy() and not (tmp_path / snap_tag_for(1) / MARKER).exists()
    snaps.after_step(FakeEngine(torch.ones(2)), 2, lambda: {"step": 2})      # says why the last one failed
    assert any("rank 1 could not write its files: OSError: disk full" in line for line in lines)
    snaps.settle(abandon=True)

"""Asynchronous snapshots (launch/snapshot.py): which one a resume takes (table), retention (table),
the background write and its marker, and exact resume after SIGKILL with 2 ranks under ZeRO-1 and -3."""
import json
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from helpers.common import expect, losses, run_ranks, snapshot, start, wait_for_snapshot
from hpc_agent.core.checkpoint_format import (MARKER, Candidate, problem, retention, scan, select, snap_tag_for,
                                              step_of, tag_for)

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


class FakeZeroEngine(FakeEngine):
    """Also does the two parts of DeepSpeed's save that a capture leaves out: the tag check and the scripts' copy."""
    save_zero_checkpoint = True

    def __init__(self, weight):
        super().__init__(weight)
        self.calls = []

    def _checkpoint_tag_validation(self, tag):
        self.calls.append(("validate", tag))

    def _copy_recovery_script(self, save_path):
        self.calls.append(("scripts", save_path))

    def save_checkpoint(self, save_dir, tag, client_state, save_latest):
        self._checkpoint_tag_validation(tag)
        super().save_checkpoint(save_dir, tag, client_state, save_latest)
        self._copy_recovery_script(save_dir)


def test_a_capture_skips_the_tag_check_and_the_writer_copies_the_recovery_scripts_once(tmp_path):
    import torch
    from launch import snapshot as snap
    from launch.host_copy import HostCapture

    snaps = snap.Snapshots(2, tmp_path, rank=0, world=1, layout={"zero_stage": 1}, keep_checkpoints=1,
                           agree_max=lambda v: v, say=lambda _: None)
    engine = FakeZeroEngine(torch.zeros(4))
    for step in (2, 4, 6):
        assert snaps.after_step(engine, step, lambda: {"step": step})
        snaps.settle()
    assert engine.calls == [("scripts", str(tmp_path))]  # once per attempt, from the writer; never the tag check
    assert "_copy_recovery_script" not in vars(engine) and "_checkpoint_tag_validation" not in vars(engine)
    engine.checkpoint_engine = HostCapture()
    engine.save_checkpoint(str(tmp_path), "x", {}, False)  # outside a capture, DeepSpeed's own methods again
    assert engine.calls[-2:] == [("validate", "x"), ("scripts", str(tmp_path))]


def test_host_copy_shares_immutable_leaves_and_copies_everything_else():
    import collections
    import dataclasses

    import torch
    from launch.host_copy import to_host

    @dataclasses.dataclass
    class Record:  # like DeepSpeed's fragment_address, one per parameter in the ZeRO state
        numel: int
        start: int

    class Holder:
        def __init__(self):
            self.items = [1]

    weight, record, holder, shape = torch.arange(4.0), Record(3, 5), Holder(), torch.Size([2, 3])
    source = {"w": weight, "meta": collections.OrderedDict(shape=shape, name="w"), "records": [record],
              "holder": holder, "ids": (1, 2), "scale": 2.0**16}
    copied = to_host(source)
    weight.add_(1.0)
    record.start = 9
    holder.items.append(2)
    assert torch.equal(copied["w"], torch.arange(4.0))
    assert copied["records"] == [Record(3, 5)] and type(copied["records"][0]) is Record
    assert copied["holder"].items == [1]
    assert type(copied["meta"]) is collections.OrderedDict and copied["meta"]["shape"] is shape
    assert copied["ids"] == (1, 2) and copied["scale"] == 2.0**16


def test_a_capture_copies_into_the_previous_captures_host_tensors_where_they_fit():
    import torch
    from launch.host_copy import HostBuffers, to_host

    weight = torch.arange(6.0).reshape(2, 3).requires_grad_()
    moment, steps = torch.ones(5), torch.tensor(3)
    buffers = HostBuffers()

    def take():
        buffers.start()
        copied = to_host({"w": weight, "opt": [moment, steps], "t": weight.detach().t()}, buffers)
        buffers.finish()
        return copied

    first = take()
    with torch.no_grad():
        weight.mul_(2.0)
    moment.add_(1.0)
    second = take()
    for key in ("w", "t"):  # the same host tensors, now holding the new values
        assert second[key] is first[key]
    assert second["opt"][0] is first["opt"][0] and second["opt"][1] is first["opt"][1]
    assert torch.equal(second["w"], weight.detach()) and torch.equal(second["t"], weight.detach().t())
    assert torch.equal(second["opt"][0], torch.full((5,), 2.0)) and int(second["opt"][1]) == 3
    assert second["t"].stride() == weight.detach().t().stride()  # the layout a fresh copy would have had
    assert not second["w"].requires_grad and second["w"].grad_fn is None  # no autograd history in the copy
    assert second["w"].data_ptr() != weight.data_ptr()
    moment = torch.ones(7)  # a rebuilt engine whose state changed shape: that tensor gets a fresh copy
    third = take()
    assert third["opt"][0] is not first["opt"][0] and torch.equal(third["opt"][0], torch.ones(7))
    assert third["w"] is first["w"]
    assert to_host({"w": weight})["w"] is not first["w"]  # without buffers: fresh tensors, as before


def test_snapshots_reuse_host_tensors_and_each_file_holds_its_own_steps_state(tmp_path):
    import torch
    from launch import snapshot as snap

    snaps = snap.Snapshots(2, tmp_path, rank=0, world=1, layout={"zero_stage": 1}, keep_checkpoints=2,
                           agree_max=lambda v: v, say=lambda _: None)
    engine = FakeEngine(torch.zeros(4))
    held = []
    real = snap.capture

    def spy(*args, **kwargs):
        files = real(*args, **kwargs)
        held.append(files[0][1]["module"]["w"])
        return files

    snap.capture = spy
    try:
        for step in (2, 4):
            engine.weight.fill_(float(step))
            assert snaps.after_step(engine, step, lambda: {"step": step}, full=(step == 2))
            snaps.settle()
    finally:
        snap.capture = real
    assert held[0] is held[1]  # the second capture copied into the first one's host tensor
    for step, tag in ((2, tag_for(2)), (4, snap_tag_for(4))):  # each file was written before the next copy
        saved = torch.load(tmp_path / tag / "mp_rank_00_model_states.pt")
        assert saved["step"] == step and torch.equal(saved["module"]["w"], torch.full((4,), float(step)))


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


def _signal_both_ranks_after_a_snapshot(cfg, run_dir, at_least: int, signum: int):
    """Start 2 ranks, send both ``signum`` once a snapshot of step ``at_least`` or later is complete; wait for them."""
    from launch.distributed import free_port

    port = free_port()
    procs = [start(cfg, run_dir, rank, 2, port) for rank in range(2)]
    wait_for_snapshot(run_dir, at_least, procs[0])
    for proc in procs:
        proc.send_signal(signum)
    for proc in procs:
        proc.wait(timeout=60)
    return procs


def _cfg(tmp_path, stage, world, steps, ckpt_every=1000):
    return snapshot(tmp_path / f"cfg{stage}.yaml", train={"max_steps": steps, "ckpt_every": ckpt_every, "zero_stage": stage,
                                                          "precision": "fp32", "warmup_steps": 3},
                    resilience={"snapshot_every": 3}, slurm={"tasks_per_node": world})


@pytest.mark.slow
@pytest.mark.parametrize("stage, ckpt_every", [(1, 1000), (3, 1000), (3, 4)])
def test_two_ranks_resume_bit_exact_from_snapshot(tmp_path, stage, ckpt_every):
    """2 ranks (gloo): SIGKILL both after a snapshot is complete; the resume takes the newest complete
    snapshot, every rank's shard comes back, and the losses match the uninterrupted run. With
    ``ckpt_every`` 4 the periodic checkpoints are written in the background too, with a checkpoint's marker."""
    steps = 120  # long enough that the kill lands mid-run
    cfg = _cfg(tmp_path, stage, 2, steps, ckpt_every)
    straight = run_ranks(cfg, tmp_path / "straight", world=2)
    expect(straight[0], 0, f"done: {steps} steps")
    if ckpt_every < steps:
        held = re.findall(r"checkpoint (step_\d+) complete in [\d.]+s \(training held", straight[0].stdout)
        assert held[:3] == [tag_for(4), tag_for(8), tag_for(12)], straight[0].stdout[-3000:]
        assert f"checkpoint {tag_for(steps)} complete in" in straight[0].stdout  # the last one: synchronous
        kept = [c for c in scan(tmp_path / "straight" / "checkpoints") if c.name.startswith("step_")]
        assert kept and all(problem(c) is None and "snapshot" not in c.marker for c in kept)

    run_dir = tmp_path / "killed"
    _signal_both_ranks_after_a_snapshot(cfg, run_dir, 9, signal.SIGKILL)
    chosen = select(scan(run_dir / "checkpoints")).chosen
    assert (run_dir / "checkpoints" / "zero_to_fp32.py").is_file()  # copied by the snapshot writer
    # the newest complete save: the snapshot waited for, or a later one (with ckpt_every 4, maybe a checkpoint)
    assert chosen.step >= 9 and (chosen.name.startswith("snap_") or ckpt_every < steps)
    shards = [f for f in chosen.marker["files"] if "pp_rank_" in f]
    assert {("pp_rank_0_" in f, "pp_rank_1_" in f) for f in shards} == {(True, False), (False, True)}

    resumed = run_ranks(cfg, run_dir, world=2)
    kind = "snapshot" if chosen.name.startswith("snap_") else "checkpoint"
    expect(resumed[0], 0, f"resuming from {kind} {chosen.name} (step {chosen.step})", f"done: {steps} steps")
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
    snaps._thread.join(30)  # so that its torch.save never runs inside a later test's patch


# ---- periodic checkpoints on the snapshot path (snapshots on: train.ckpt_every is written in the background)
def test_periodic_checkpoint_is_written_in_the_background_and_never_skipped_or_abandoned(tmp_path, monkeypatch):
    import torch
    from launch import snapshot as snap

    release = threading.Event()
    real_save = torch.save
    writers = []

    def slow_save(obj, f):
        writers.append(threading.current_thread().name)
        assert release.wait(30)
        real_save(obj, f)

    monkeypatch.setattr(torch, "save", slow_save)
    lines, hooked = [], []
    snaps = snap.Snapshots(2, tmp_path, 0, 1, {"zero_stage": 1}, 2, lambda v: v, lines.append)
    engine = FakeEngine(torch.zeros(3))
    started = time.perf_counter()
    assert snaps.after_step(engine, 4, lambda: {"step": 4}, full=True,
                            before_marker=lambda step, tag_dir: hooked.append((step, tag_dir.name,
                                                                                (tag_dir / MARKER).exists())))
    assert time.perf_counter() - started < 5 and snaps.busy()               # the loop goes on meanwhile
    assert not snaps.after_step(engine, 6, lambda: {"step": 6}) and snaps.skipped == 1  # a snapshot gives way
    threading.Timer(0.5, release.set).start()
    snaps.settle(abandon=True)                                                # a preemption waits for it ...
    assert not snaps.busy()
    (chosen,) = scan(tmp_path)
    assert chosen.name == tag_for(4) and problem(chosen) is None and "snapshot" not in chosen.marker
    assert writers == [f"snapshot-{tag_for(4)}"] and hooked == [(4, tag_for(4), False)]  # hook before marker
    assert any(f"checkpoint {tag_for(4)} complete in" in line and "training held" in line for line in lines)
    release.clear()
    assert snaps.after_step(engine, 8, lambda: {"step": 8}, full=True)
    threading.Timer(0.5, release.set).start()
    assert snaps.after_step(engine, 12, lambda: {"step": 12}, full=True)     # ... and so does the next one
    snaps.settle()
    assert [c.name for c in scan(tmp_path)] == [tag_for(8), tag_for(12)]     # retention: keep_checkpoints 2


def test_a_failed_background_checkpoint_stops_the_job_at_the_next_due_point(tmp_path, monkeypatch):
    import torch
    from launch import snapshot as snap

    def full_disk(obj, f):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    lines = []
    snaps = snap.Snapshots(2, tmp_path, 0, 1, {}, 1, lambda v: v, lines.append)
    assert snaps.after_step(FakeEngine(torch.ones(2)), 4, lambda: {"step": 4}, full=True)
    snaps.settle()
    assert snaps.failed_full is not None and snaps.failed_full[0] == 4
    with pytest.raises(RuntimeError, match="a checkpoint could not be written: step_00000004: OSError.*No space"):
        snaps.after_step(FakeEngine(torch.ones(2)), 6, lambda: {"step": 6})  # a snapshot due: the job stops
    peer = snap.Snapshots(2, tmp_path, 1, 2, {}, 1, lambda v: max(v, 2), lines.append)  # another rank failed
    with pytest.raises(RuntimeError, match="on another rank"):
        peer.after_step(FakeEngine(torch.ones(2)), 6, lambda: {"step": 6})


@pytest.mark.slow
def test_sigterm_while_periodic_checkpoints_are_written_in_the_background(tmp_path):
    """2 ranks, a snapshot every step and a checkpoint every 2nd, both on the background writer: a SIGTERM
    ends the job with a complete checkpoint of the last step (the one in flight waited for, never torn or
    written twice), and the resume continues bit-exact."""
    steps = 60
    cfg = snapshot(tmp_path / "cfg.yaml", train={"max_steps": steps, "ckpt_every": 2, "precision": "fp32",
                                                 "warmup_steps": 3},
                   resilience={"snapshot_every": 1}, slurm={"tasks_per_node": 2})
    straight = run_ranks(cfg, tmp_path / "straight", world=2)
    expect(straight[0], 0, f"done: {steps} steps")
    run_dir = tmp_path / "run"
    procs = _signal_both_ranks_after_a_snapshot(cfg, run_dir, 5, signal.SIGTERM)
    log = Path(procs[0].log_path).read_text()
    assert [p.returncode for p in procs] == [75, 75], log[-3000:]
    match = re.search(r"signal SIGTERM at step (\d+): checkpoint (step_\d+) (already )?complete", log)
    assert match and match.group(2) == tag_for(int(match.group(1))), log[-3000:]
    chosen = select(scan(run_dir / "checkpoints")).chosen
    assert chosen.name == match.group(2) and "snapshot" not in chosen.marker
    resumed = run_ranks(cfg, run_dir, world=2)
    expect(resumed[0], 0, f"resuming from checkpoint {chosen.name}", f"done: {steps} steps")
    want, got = losses(straight[0].stdout), losses(resumed[0].stdout)
    assert min(got) == chosen.step + 1
    for step in range(chosen.step + 1, steps + 1):
        assert got[step] == pytest.approx(want[step], abs=1e-6), step


def test_exit_paths_wait_for_the_checkpoint_in_flight_and_forget_a_failed_one(tmp_path, monkeypatch):
    """Trainer._saved_on_disk, run before a signal-time exit: it returns only once the background checkpoint
    of ``saved_step`` has its marker; if that write failed, saved_step is dropped so the step is saved again."""
    import types

    import torch
    from launch import snapshot as snap
    from launch.engine import Trainer

    release = threading.Event()
    real_save = torch.save
    monkeypatch.setattr(torch, "save", lambda obj, f: (release.wait(30), real_save(obj, f)))
    snaps = snap.Snapshots(1, tmp_path, 0, 1, {}, 1, lambda v: v, lambda line: None)
    trainer = types.SimpleNamespace(snapshots=snaps, saved_step=4, coll=types.SimpleNamespace(max_int=lambda v: v))
    assert snaps.after_step(FakeEngine(torch.ones(2)), 4, lambda: {"step": 4}, full=True)
    threading.Timer(0.5, release.set).start()
    Trainer._saved_on_disk(trainer)
    assert (tmp_path / tag_for(4) / MARKER).exists() and trainer.saved_step == 4

    monkeypatch.setattr(torch, "save", lambda obj, f: (_ for _ in ()).throw(OSError(5, "Input/output error")))
    assert snaps.after_step(FakeEngine(torch.ones(2)), 6, lambda: {"step": 6}, full=True)
    trainer.saved_step = 6
    Trainer._saved_on_disk(trainer)
    assert trainer.saved_step == -1 and snaps.failed_full is None  # _save writes step 6 synchronously now


class _Slots:
    __slots__ = ("a",)


class _OwnState:
    def __getstate__(self):
        return {}


class _OwnCopy:
    def __deepcopy__(self, memo):
        return self


class _OwnReduce:
    def __reduce__(self):
        return (_OwnReduce, ())


class _Plain:
    pass


@pytest.mark.parametrize("kind, plain", [(_Plain, True), (_Slots, False), (_OwnState, False), (_OwnCopy, False),
                                         (_OwnReduce, False)])
def test_only_plain_records_are_copied_through_their_dict(kind, plain):
    """A class with its own copy or pickle protocol (or slots) goes through deepcopy, which honours it."""
    from launch.host_copy import _plain

    assert _plain(kind) is plain

"""launch/tblog.py: one event per logged step, flushed on a clock and before every checkpoint; and the
one-process shortcut of launch/distributed.Collectives. Both are per-step costs (scripts/bench/step_overhead.py)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from hpc_agent.core.rundir import tb_dir
from hpc_agent.metrics.tb_reader import RunScalars
from launch.tblog import TBLog

VALUES = {"train/loss": 2.5, "train/lr": 1e-3, "train/grad_norm": None, "perf/step_time_s": 0.11}


def _read(run_dir):
    scalars = RunScalars(tb_dir(run_dir))
    scalars.update()
    return {tag: [(p.step, p.value) for p in scalars.series(tag)] for tag in ("train/loss", "train/lr",
                                                                               "train/grad_norm", "perf/step_time_s")}


def test_every_value_of_a_step_is_read_back_and_none_is_skipped(tmp_path):
    tb = TBLog(tmp_path, 0, 0, "cfg")
    for step in (1, 2, 3):
        tb.scalars({**VALUES, "train/loss": float(step)}, step)
    tb.close()
    got = _read(tmp_path)
    assert got["train/loss"] == [(1, 1.0), (2, 2.0), (3, 3.0)]
    assert got["perf/step_time_s"] == [(s, pytest.approx(0.11)) for s in (1, 2, 3)]
    assert got["train/grad_norm"] == []
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb_dir(tmp_path)))
    acc.Reload()  # TensorBoard itself reads the several values of one event
    assert [e.step for e in acc.Scalars("train/lr")] == [1, 2, 3]


def test_with_a_flush_interval_steps_wait_for_the_next_flush_and_flush_writes_them_all(tmp_path):
    tb = TBLog(tmp_path, 0, 10, "cfg", flush_every_s=3600.0)
    tb.scalars(VALUES, 11)  # the attempt's first step: written at once
    assert _read(tmp_path)["train/loss"] == [(11, 2.5)]
    tb.scalars(VALUES, 12)
    tb.scalars(VALUES, 13)  # queued only: an hour to the next periodic flush
    assert [s for s, _ in _read(tmp_path)["train/loss"]] == [11]
    tb.flush()  # what the trainer calls before a checkpoint or a snapshot
    assert [s for s, _ in _read(tmp_path)["train/loss"]] == [11, 12, 13]
    tb.scalars(VALUES, 14)
    tb.close()  # close writes what is queued
    assert [s for s, _ in _read(tmp_path)["train/loss"]] == [11, 12, 13, 14]


def test_the_flusher_thread_writes_queued_steps_while_the_main_thread_is_stuck(tmp_path):
    import time

    tb = TBLog(tmp_path, 0, 10, "cfg", flush_every_s=0.2)
    for step in (11, 12, 13):
        tb.scalars(VALUES, step)
    deadline = time.monotonic() + 10  # no call from here on: as if the main thread hung after step 13
    while [s for s, _ in _read(tmp_path)["train/loss"]] != [11, 12, 13] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [s for s, _ in _read(tmp_path)["train/loss"]] == [11, 12, 13]
    tb.close()


def test_a_step_is_queued_as_numbers_and_keeps_its_own_wall_time_when_encoded_later(tmp_path, monkeypatch):
    """The loop only queues a step's numbers; the flush encodes them, with the wall time of the step (ETTR and the
    time-lost split read it), not of the flush."""
    import launch.tblog as tblog
    from hpc_agent.metrics.tb_reader import RunScalars

    clock = [1000.0]
    monkeypatch.setattr(tblog.time, "time", lambda: clock[0])
    tb = TBLog(tmp_path, 0, 10, "cfg", flush_every_s=3600.0)
    tb.scalars(VALUES, 11)  # the attempt's first step: on disk at once
    encoded = []
    real = tblog._scalars_event
    monkeypatch.setattr(tblog, "_scalars_event", lambda *a: encoded.append(a[0]) or real(*a))
    clock[0] = 1001.0
    tb.scalars({**VALUES, "train/loss": 3.0}, 12)
    assert encoded == [] and tb._queued[-1] == (12, 1001.0, (("train/loss", 3.0), ("train/lr", 1e-3),
                                                             ("perf/step_time_s", 0.11)))
    clock[0] = 1005.0
    tb.flush()
    assert encoded == [12]
    tb.close()
    scalars = RunScalars(tb_dir(tmp_path), tags=("train/loss",))
    scalars.update()
    assert [(p.step, p.value, p.wall_time) for p in scalars.series("train/loss")] == [(11, 2.5, 1000.0),
                                                                                     (12, 3.0, 1001.0)]


def test_a_rollback_makes_tensorboard_drop_the_steps_logged_past_it(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from hpc_agent.core.rundir import tb_dir

    tb = TBLog(tmp_path, 0, 0, "cfg", flush_every_s=3600.0)
    for step in (1, 2, 3, 4):
        tb.scalars({**VALUES, "train/loss": float(step)}, step)
    tb.restart_at(3)  # an in-job repair reloaded step 2's state
    for step in (3, 4, 5):
        tb.scalars({**VALUES, "train/loss": 10.0 + step}, step)
    tb.close()
    assert _read(tmp_path)["train/loss"] == [(1, 1.0), (2, 2.0), (3, 13.0), (4, 14.0), (5, 15.0)]
    acc = EventAccumulator(str(tb_dir(tmp_path)))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [(1, 1.0), (2, 2.0), (3, 13.0), (4, 14.0), (5, 15.0)]


def test_the_event_file_is_made_without_following_links_in_the_run_directory_mode(tmp_path):
    import stat

    from hpc_agent.core.filemodes import file_mode_in
    from hpc_agent.core.rundir import tb_dir

    tb = TBLog(tmp_path, 0, 0, "cfg")
    path = tb.file.path
    tb.close()
    assert path.parent == tb_dir(tmp_path) and path.name.startswith("events.out.tfevents.")
    assert path.name.endswith(".attempt0") and not path.is_symlink()
    assert stat.S_IMODE(path.stat().st_mode) == file_mode_in(tb_dir(tmp_path))
    again = TBLog(tmp_path, 0, 0, "cfg")
    assert again.attempt == 1  # the next attempt counts this file
    again.close()


def test_without_a_flush_interval_every_call_is_on_disk(tmp_path):
    tb = TBLog(tmp_path, 0, 0, "cfg")  # the script API's: it cannot know when the user's script checkpoints
    for step in (1, 2):
        tb.scalars(VALUES, step)
        assert [s for s, _ in _read(tmp_path)["train/loss"]] == list(range(1, step + 1))
    tb.close()


class _NoDist:
    """A process group of one; any collective call would be a bug."""

    class ReduceOp:
        MAX = SUM = None

    def __init__(self, world):
        self.world = world

    def is_available(self):
        return True

    def is_initialized(self):
        return True

    def get_world_size(self):
        return self.world

    def __getattr__(self, name):
        raise AssertionError(f"torch.distributed.{name} called in a one-process job")


def test_a_one_process_group_runs_no_collective():
    from launch.distributed import Collectives

    coll = Collectives("cpu")
    coll.dist = _NoDist(1)
    assert coll.single
    assert coll.max_int(3) == 3 and coll.mean(2.5) == 2.5
    state = {"rng": [1, 2]}
    assert coll.gather_objects(state) == [state] and coll.broadcast_object(state) is state


def test_a_group_not_yet_initialised_is_not_taken_for_one_process():
    from launch.distributed import Collectives

    coll = Collectives("cpu")
    coll.dist = SimpleNamespace(is_available=lambda: True, is_initialized=lambda: False)
    assert not coll.single  # the script API builds Collectives before the rendezvous: ask again later
    coll.dist = _NoDist(2)
    with pytest.raises(AssertionError, match="all_reduce"):
        coll.max_int(1)  # two processes: the real reduction

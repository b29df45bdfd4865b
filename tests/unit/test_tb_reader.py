"""Incremental TensorBoard reading: new bytes only, attempts/purge_step, truncated and replaced files."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter
from tensorboard.summary.writer.record_writer import RecordWriter
from tensorboard.util import tensor_util

from hpc_agent.metrics.tb_reader import Point, RunScalars

LOSS = "train/loss"


def scalar_event(step, value, tag=LOSS, wall=None):
    return event_pb2.Event(step=step, wall_time=1000.0 + step if wall is None else wall,
                           summary=summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)]))


def tensor_event(step, value, tag=LOSS):
    """A scalar as a tensor with scalars-plugin metadata (what new-style writers and the loader's migration give)."""
    meta = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))
    tensor = tensor_util.make_tensor_proto(np.float32(value))
    return event_pb2.Event(step=step, wall_time=1000.0 + step,
                           summary=summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, tensor=tensor,
                                                                                        metadata=meta)]))


def text_event(step, text="hello", tag="config"):
    meta = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="text"))
    tensor = tensor_util.make_tensor_proto(np.array([text.encode()], dtype=object))
    return event_pb2.Event(step=step, wall_time=1000.0 + step,
                           summary=summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, tensor=tensor,
                                                                                        metadata=meta)]))


def purge_event(step):
    return event_pb2.Event(step=step, wall_time=1000.0 + step,
                           session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START))


def frame(event) -> bytes:
    """One TFRecord, framed by TensorBoard's own RecordWriter."""
    class Buf:
        def __init__(self):
            self.data = b""

        def write(self, b):
            self.data += b

        def flush(self):
            pass

    buf = Buf()
    RecordWriter(buf).write(event.SerializeToString())
    return buf.data


def event_path(tb: Path, attempt: int, created: int = 1700000000) -> Path:
    tb.mkdir(parents=True, exist_ok=True)
    return tb / f"events.out.tfevents.{created}.host.1234.0.attempt{attempt}"


def append(path: Path, events) -> None:
    with open(path, "ab") as f:
        for e in events:
            f.write(frame(e))


def steps(points):
    return [p.step for p in points]


def test_unknown_dir_is_empty(tmp_path):
    r = RunScalars(tmp_path / "nope")
    assert r.update() == 0
    assert r.tags() == [] and r.series(LOSS) == [] and r.raw(LOSS) == []
    empty = tmp_path / "tb"
    empty.mkdir()
    assert RunScalars(empty).update() == 0


def test_incremental_reads_return_only_new_points(tmp_path):
    tb = tmp_path / "tb"
    path = event_path(tb, 0)
    append(path, [event_pb2.Event(wall_time=1.0, file_version="brain.Event:2")])
    append(path, [scalar_event(s, 1.0 / s) for s in range(1, 11)])
    r = RunScalars(tb)
    assert r.update() == 10
    assert r.update() == 0  # nothing new, nothing read
    append(path, [scalar_event(s, 1.0 / s) for s in range(11, 16)])
    assert r.update() == 5
    assert steps(r.series(LOSS)) == list(range(1, 16))
    assert r.series(LOSS)[0] == Point(1, 1001.0, 1.0)
    assert r.tags() == [LOSS]


def test_real_event_file_writer_tensor_scalars_and_text(tmp_path):
    tb = tmp_path / "tb"
    w = EventFileWriter(str(tb), filename_suffix=".attempt0")
    w.add_event(text_event(1))
    for s in range(1, 6):
        w.add_event(scalar_event(s, float(s), tag="a"))
        w.add_event(tensor_event(s, 2.0 * s, tag="b"))
    w.flush()
    r = RunScalars(tb)
    assert r.update() == 10
    assert r.tags() == ["a", "b"]  # the text summary is ignored
    assert [p.value for p in r.series("b")] == [2.0, 4.0, 6.0, 8.0, 10.0]
    w.add_event(tensor_event(6, 12.0, tag="b"))  # metadata only on the first value in real files
    w.add_event(text_event(6))
    w.close()
    assert r.update() == 1
    assert r.series("b")[-1] == Point(6, 1006.0, 12.0)
    only_a = RunScalars(tb, tags=["a"])
    assert only_a.update() == 5 and only_a.tags() == ["a"]


def test_attempts_overlap_newest_file_wins_and_purge_step(tmp_path):
    tb = tmp_path / "tb"
    # attempt 0 ran to step 12, its last checkpoint was at step 8.
    append(event_path(tb, 0), [scalar_event(s, 10.0 + s) for s in range(1, 13)])
    # attempt 1 (same second: the .attemptN suffix orders it) resumed from 8: purge_step 9, logs 9..10.
    append(event_path(tb, 1), [purge_event(9)] + [scalar_event(s, 100.0 + s) for s in range(9, 11)])
    r = RunScalars(tb)
    assert r.update() == 14
    series = r.series(LOSS)
    assert steps(series) == list(range(1, 11))  # 11 and 12 of attempt 0 are purged
    assert [p.value for p in series[-2:]] == [109.0, 110.0]
    raw = r.raw(LOSS)
    assert len(raw) == 14 and raw[0][0].endswith(".attempt0") and raw[-1][0].endswith(".attempt1")
    # attempt 2 with no SessionLog, overlapping 10: newest wins, no duplicates.
    append(event_path(tb, 2, created=1700000100), [scalar_event(s, 200.0 + s) for s in range(10, 14)])
    assert r.update() == 4
    series = r.series(LOSS)
    assert steps(series) == list(range(1, 14))
    assert series[9].value == 210.0 and series[8].value == 109.0


def test_truncated_last_record_is_retried(tmp_path):
    tb = tmp_path / "tb"
    path = event_path(tb, 0)
    append(path, [scalar_event(s, float(s)) for s in range(1, 6)])
    last = frame(scalar_event(6, 6.0))
    with open(path, "ab") as f:
        f.write(last[:-3])  # a writer killed mid-record (or not yet flushed)
    r = RunScalars(tb)
    assert r.update() == 5
    assert steps(r.series(LOSS)) == [1, 2, 3, 4, 5]
    with open(path, "ab") as f:
        f.write(last[-3:])
    append(path, [scalar_event(7, 7.0)])
    assert r.update() == 2
    assert steps(r.series(LOSS)) == list(range(1, 8))
    # a header cut short, too
    nxt = frame(scalar_event(8, 8.0))
    with open(path, "ab") as f:
        f.write(nxt[:5])
    assert r.update() == 0
    with open(path, "ab") as f:
        f.write(nxt[5:])
    assert r.update() == 1 and steps(r.series(LOSS))[-1] == 8


def test_shrunk_or_replaced_file_is_reread(tmp_path):
    tb = tmp_path / "tb"
    path = event_path(tb, 0)
    append(path, [scalar_event(s, float(s)) for s in range(1, 11)])
    r = RunScalars(tb)
    assert r.update() == 10
    path.write_bytes(b"".join(frame(scalar_event(s, -float(s))) for s in range(1, 4)))  # shrunk
    assert r.update() == 3
    assert [p.value for p in r.series(LOSS)] == [-1.0, -2.0, -3.0]
    # replaced by a bigger file (new inode) through a rename
    tmp = tb / "tmp.bin"
    tmp.write_bytes(b"".join(frame(scalar_event(s, 5.0)) for s in range(1, 21)))
    os.replace(tmp, path)
    assert r.update() == 20
    assert len(r.series(LOSS)) == 20 and {p.value for p in r.series(LOSS)} == {5.0}
    path.unlink()
    r.update()
    assert r.series(LOSS) == []


def test_second_read_touches_only_new_bytes(tmp_path):
    tb = tmp_path / "tb"
    path = event_path(tb, 0)
    n, extra = 20_000, 1_000
    path.write_bytes(b"".join(frame(scalar_event(s, 1.0)) for s in range(n)))
    r = RunScalars(tb)
    assert r.update() == n
    first_bytes = r.bytes_read
    assert first_bytes == path.stat().st_size and r.records_read == n
    added = b"".join(frame(scalar_event(s, 2.0)) for s in range(n, n + extra))
    with open(path, "ab") as f:
        f.write(added)
    assert r.update() == extra
    assert r.bytes_read - first_bytes == len(added)
    assert r.records_read == n + extra
    assert len(r.series(LOSS)) == n + extra


def test_import_pulls_in_neither_torch_nor_tensorboard():
    import subprocess
    import sys

    code = ("import sys, hpc_agent.metrics; "
            "print(sorted(m for m in ('torch', 'deepspeed', 'tensorflow', 'tensorboard') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_file_vanishing_mid_read_is_not_a_crash(tmp_path, monkeypatch):
    tb = tmp_path / "tb"
    path = event_path(tb, 0)
    append(path, [scalar_event(s, 1.0) for s in range(1, 4)])
    r = RunScalars(tb)
    assert r.update() == 3
    append(path, [scalar_event(4, 1.0)])
    state = next(iter(r._files.values()))

    def gone():
        path.unlink()
        raise FileNotFoundError(str(path))
        yield  # pragma: no cover

    monkeypatch.setattr(state.loader, "Load", gone)
    assert r.update() == 0
    assert r.series(LOSS) == []


def test_a_corrupt_tail_is_skipped_and_reported_not_raised(tmp_path):
    """A framed record that is not an Event, and a header with a bad CRC: the points before are kept."""
    import struct

    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    from hpc_agent.metrics.tb_reader import RunScalars

    for tail in ("framed garbage", "bad crc"):
        tb = tmp_path / tail.replace(" ", "_")
        writer = EventFileWriter(str(tb))
        for step in (1, 2):
            value = summary_pb2.Summary.Value(tag="train/loss", simple_value=1.5)
            writer.add_event(event_pb2.Event(step=step, wall_time=float(step), summary=summary_pb2.Summary(value=[value])))
        writer.close()  # flushes its queue: the good records are on disk before the tail is added
        if tail == "framed garbage":  # a valid TFRecord frame (good CRCs) around bytes that are no Event
            from tensorboard.summary.writer.record_writer import RecordWriter

            with open(next(tb.glob("events*")), "ab") as handle:
                RecordWriter(handle).write(b"\xff" * 7)
        if tail == "bad crc":
            with open(next(tb.glob("events*")), "ab") as handle:
                handle.write(struct.pack("<Q", 9) + b"\0\0\0\0" + b"junkjunkj")
        scalars = RunScalars(tb, tags=("train/loss",))
        scalars.update()
        assert [p.step for p in scalars.series("train/loss")] == [1, 2], tail
        (problem,) = scalars.problems()
        assert ("corrupt record" if tail == "framed garbage" else "unreadable") in problem, problem


def test_watcher_and_diagnose_judge_the_same_points(tmp_path):
    """Attempt 0 went NaN after step 450 and wrote no purge marker on resume; attempt 1 resumed from its
    step-400 checkpoint and is healthy so far. The per-step series still holds attempt 0's NaN past
    attempt 1's last step; the alarms must judge the newest attempt's own points, and the watcher's
    inputs (hpc_agent.watcher.observe) and diagnose's must be one and the same."""
    import math

    from hpc_agent.diagnosis.alarms import fatal_alarms, run_alarms
    from hpc_agent.diagnose import read_tb_scalars

    tb = tmp_path / "tb"
    append(event_path(tb, 0), [scalar_event(s, 1.0 if s <= 450 else math.nan, wall=2000.0 + s) for s in range(1, 601)])
    append(event_path(tb, 1), [scalar_event(s, 0.9, wall=1500.0 + s) for s in range(401, 451)])  # a slower clock
    r = RunScalars(tb)
    r.update()
    assert [p.step for p in r.written(LOSS)][-50:] == list(range(401, 451))  # file order, not wall time
    assert fatal_alarms(r.series(LOSS), [], 1.0), "the merged series does show attempt 0's NaN"
    assert run_alarms(r, 1.0) == []
    read = read_tb_scalars(tb)[LOSS]  # diagnose's reader: the same points in the same order
    assert [step for step, _ in read] == [p.step for p in r.written(LOSS)]
    assert sum(math.isnan(v) for _, v in read) == 150

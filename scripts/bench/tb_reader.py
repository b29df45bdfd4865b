"""Benchmark: incremental ``RunScalars.update()`` after an append vs a full ``EventAccumulator`` reload.

Writes an event file with ``--events`` scalar events (default 1,000,000), reads it fully once with
``RunScalars``, appends ``--append`` events (default 1,000) and times the second ``update()``; then times a
full reload of the appended file through TensorBoard's ``EventAccumulator`` (``size_guidance={"scalars": 0}``
so nothing is dropped). Writes ``results/bench_tb_reader.json`` and prints the speed-up.

    python -m scripts.bench.tb_reader [--events 1000000] [--append 1000] [--out results/bench_tb_reader.json]
"""
from __future__ import annotations

import argparse
import json
import platform
import struct
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tensorboard.compat.proto import event_pb2, summary_pb2  # noqa: E402
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c  # noqa: E402

from hpc_agent.core.fsutil import atomic_write_json  # noqa: E402
from hpc_agent.metrics.tb_reader import RunScalars  # noqa: E402

TAG = "train/loss"


def records(first: int, count: int) -> bytes:
    """``count`` framed TFRecords of scalar events (TFRecord framing, TensorBoard's masked CRC32C)."""
    out = []
    event = event_pb2.Event(summary=summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=TAG)]))
    value = event.summary.value[0]
    for step in range(first, first + count):
        event.step = step
        event.wall_time = 1.7e9 + step * 0.1
        value.simple_value = 2.0 + 1.0 / (step + 1)
        data = event.SerializeToString()
        header = struct.pack("<Q", len(data))
        out.append(header + struct.pack("<I", masked_crc32c(header)) + data
                   + struct.pack("<I", masked_crc32c(data)))
    return b"".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--append", type=int, default=1_000)
    ap.add_argument("--out", default=str(REPO / "results" / "bench_tb_reader.json"))
    args = ap.parse_args(argv)

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with tempfile.TemporaryDirectory() as tmp:
        tb = Path(tmp) / "tb"
        tb.mkdir()
        path = tb / "events.out.tfevents.1700000000.bench.1.0.attempt0"
        t0 = time.perf_counter()
        header_event = event_pb2.Event(wall_time=1.7e9, file_version="brain.Event:2").SerializeToString()
        hdr = struct.pack("<Q", len(header_event))
        with open(path, "wb") as f:
            f.write(hdr + struct.pack("<I", masked_crc32c(hdr)) + header_event
                    + struct.pack("<I", masked_crc32c(header_event)))
            chunk = 100_000
            for first in range(0, args.events, chunk):
                f.write(records(first, min(chunk, args.events - first)))
        write_s = time.perf_counter() - t0
        size_before = path.stat().st_size

        reader = RunScalars(tb)
        t0 = time.perf_counter()
        n_first = reader.update()
        first_read_s = time.perf_counter() - t0

        added = records(args.events, args.append)
        with open(path, "ab") as f:
            f.write(added)
        size_after = path.stat().st_size

        bytes_before = reader.bytes_read
        t0 = time.perf_counter()
        n_second = reader.update()
        incremental_s = time.perf_counter() - t0
        bytes_second = reader.bytes_read - bytes_before

        t0 = time.perf_counter()
        acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
        acc.Reload()
        full_points = len(acc.Scalars(TAG))
        full_reload_s = time.perf_counter() - t0

        # same answer both ways
        series = reader.series(TAG)
        assert n_first == args.events and n_second == args.append, (n_first, n_second)
        assert full_points == len(series) == args.events + args.append, (full_points, len(series))

    ratio = full_reload_s / incremental_s if incremental_s > 0 else float("inf")
    result = {
        "events_initial": args.events,
        "events_appended": args.append,
        "file_bytes_initial": size_before,
        "file_bytes_after_append": size_after,
        "bytes_read_by_incremental_update": bytes_second,
        "write_seconds": round(write_s, 3),
        "runscalars_first_full_read_seconds": round(first_read_s, 3),
        "runscalars_incremental_update_seconds": round(incremental_s, 6),
        "event_accumulator_full_reload_seconds": round(full_reload_s, 3),
        "event_accumulator_points": full_points,
        "speedup_full_reload_over_incremental": round(ratio, 1),
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    out = Path(args.out)
    atomic_write_json(out, result)
    print(json.dumps(result, indent=2))
    print(f"incremental update: {incremental_s * 1e3:.1f} ms for {args.append} new events; full EventAccumulator "
          f"reload: {full_reload_s:.2f} s for {full_points} events; ratio {ratio:.0f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The heartbeat's cost to training: the main-thread calls per step, one beat written by the thread, the
final beat on the exit path, and the watcher's read of every rank's beat.

    python -m scripts.bench.heartbeat [--out results/bench_heartbeat.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hpc_agent.core import rundir  # noqa: E402
from launch.heartbeat import Heartbeat  # noqa: E402


def per_call_us(fn, n: int = 200_000) -> float:
    started = time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.perf_counter() - started) / n * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/bench_heartbeat.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        hb = Heartbeat(Path(tmp), 0, 1, interval_s=3600).start()  # the thread writes once, then sleeps
        stepped = per_call_us(lambda i: hb.stepped(i + 1, 0.5))
        phase = per_call_us(lambda i: hb.phase("saving" if i % 2 else "training"))
        writes = []
        for _ in range(50):
            started = time.perf_counter()
            hb._write()  # what the thread does every resilience.heartbeat_s (atomic write + fsync)
            writes.append((time.perf_counter() - started) * 1e3)
        started = time.perf_counter()
        hb.stop()
        stop_ms = (time.perf_counter() - started) * 1e3
        for rank in range(1, 64):
            Heartbeat(Path(tmp), rank, 64, 5.0)._write()
        started = time.perf_counter()
        beats = rundir.read_heartbeats(Path(tmp))
        read_ms = (time.perf_counter() - started) * 1e3
    result = {"stepped_us": round(stepped, 3), "phase_us": round(phase, 3),
              "beat_write_ms_median": round(statistics.median(writes), 3), "beat_write_ms_max": round(max(writes), 3),
              "stop_final_beat_ms": round(stop_ms, 3), "read_64_beats_ms": round(read_ms, 3),
              "beats_read": len(beats)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The jobs' side of the live watcher benchmark (P4): a separate OS process that writes what running jobs write.

    python -m scripts.bench.run_writer MANIFEST        (then, on stdin: ``round NOW STEP`` ... ``quit``)

MANIFEST is a JSON list of ``[run_dir, job_id, attempt, world, started_at]``, one per RUNNING job. On each
``round NOW STEP`` line the writer does, for every listed run, what a training job does between two watcher
ticks (``watch --interval`` 5 s by default, ``resilience.heartbeat_s`` 5 s by default, steps of ~1 s):

- every rank rewrites ``heartbeat/rank-R.json`` once (the job's own encoder, ``core.heartbeat_format.encode``,
  and its atomic replace; without the job's fsync, which changes durability, not what a reader sees): step
  ``STEP``, ``step_at`` half a second before ``NOW``, ``written_at`` ``NOW``;
- rank 0 appends the step lines of the steps since the last round to its submitit log
  ``slurm/<job>_0_log.out``, in the engine's words (``[hpc_agent] step N loss X lr ...``);
- rank 0 appends one scalar event per step to its TensorBoard event file in ``tb/`` (tensorboard's record
  framing and protos, as ``launch/tblog.py`` writes them; the file is made on the first round with the
  version record and the SessionLog START a resumed attempt writes).

It answers ``done FILES SECONDS`` when every file is in place. The benchmark waits for that line, then syncs,
then times the tick: the writes happen between ticks (on a real cluster they come from compute nodes, not
from the login node's CPUs).
"""
from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import List, Sequence

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

STEPS_PER_ROUND = 5  # 1 s steps between two ticks 5 s apart
TB_TAGS = ("train/loss", "train/lr", "train/grad_norm", "perf/samples_per_s", "perf/step_time_s", "train/loss_scale")


def beat_bytes(job_id: str, attempt: int, rank: int, world: int, now: float, step: int, started_at: float) -> bytes:
    from hpc_agent.core import heartbeat_format

    beat = heartbeat_format.Beat(job_id=job_id, attempt=attempt, rank=rank, world=world, host=f"gpu{rank:03d}",
                                 pid=4242 + rank, phase="training", phase_since=started_at + 30.0, step=step,
                                 step_at=now - 0.5, start_step=0, recent_step_s=(1.0,) * min(step, 20),
                                 started_at=started_at, written_at=now, interval_s=5.0)
    return heartbeat_format.encode(beat)


def step_line(step: int, max_steps: int = 100_000) -> str:
    loss = 4.0 / (1.0 + step / 1000.0)
    return (f"[hpc_agent] step {step} loss {loss:.8f} lr {3e-4:.3e} grad_norm {0.8123:.4f} step_time 1.002s "
            f"({step}/{max_steps})\n")


class RunFiles:
    """One running job's files, written as the job writes them."""

    def __init__(self, run_dir: str, job_id: str, attempt: int, world: int, started_at: float):
        from hpc_agent.core import rundir

        self.run_dir, self.job_id, self.attempt, self.world = Path(run_dir), job_id, attempt, world
        self.started_at = started_at
        self.beats = [rundir.heartbeat_path(self.run_dir, r) for r in range(world)]
        self.log = rundir.slurm_dir(self.run_dir) / f"{job_id}_0_log.out"
        self.tb = None
        self.last_step = 0

    def write(self, now: float, step: int) -> int:
        from tensorboard.summary.writer.record_writer import RecordWriter
        from launch.tblog import _event, _scalars_event

        for rank, path in enumerate(self.beats):
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_bytes(beat_bytes(self.job_id, self.attempt, rank, self.world, now, step, self.started_at))
            os.replace(tmp, path)
        steps = range(self.last_step + 1, step + 1)
        with open(self.log, "a") as handle:
            handle.write("".join(step_line(s) for s in steps))
        new = self.tb is None
        if new:
            tb_dir = self.run_dir / "tb"
            tb_dir.mkdir(exist_ok=True)
            self.tb = tb_dir / (f"events.out.tfevents.{int(now):010d}.{socket.gethostname()}.{os.getpid()}.0"
                                f".attempt{self.attempt}")
        with open(self.tb, "ab") as handle:
            records = RecordWriter(handle)
            if new:
                from tensorboard.compat.proto.event_pb2 import SessionLog

                records.write(_event(max(1, steps.start), now, file_version="brain.Event:2"))
                records.write(_event(max(1, steps.start), now, session_log=SessionLog(status=SessionLog.START)))
            for s in steps:
                records.write(_scalars_event(s, now - (step - s), tuple((tag, 1.0 / s) for tag in TB_TAGS)))
        self.last_step = step
        return len(self.beats) + 2


def serve(manifest: Sequence[Sequence], stdin, stdout) -> None:
    runs: List[RunFiles] = [RunFiles(*entry) for entry in manifest]
    for line in stdin:
        words = line.split()
        if not words or words[0] == "quit":
            return
        now, step = float(words[1]), int(words[2])
        t0 = time.perf_counter()
        files = sum(run.write(now, step) for run in runs)
        stdout.write(f"done {files} {time.perf_counter() - t0:.3f}\n")
        stdout.flush()


def main() -> int:
    manifest = json.loads(Path(sys.argv[1]).read_text())
    serve(manifest, sys.stdin, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""TensorBoard scalars from rank 0, one event file per attempt, without overlapping steps.

Every attempt writes into ``<run_dir>/tb/`` (so TensorBoard and the watcher see one run) with its
own event file (suffix ``.attempt<N>``). An attempt that resumed from step S logs only steps > S, and
its writer is opened with ``purge_step=S+1``: the first record of the new file is a SessionLog START
at S+1, on which TensorBoard drops whatever earlier files logged at steps >= S+1 (the steps a killed
attempt ran past its last checkpoint). So each step shows exactly one value, from the attempt whose
weights survived. Readers of the raw event files must apply the same rule.

The attempt number (0 for the first) is ``SLURM_RESTART_COUNT`` (Slurm requeues) or the number of
earlier attempts' event files in ``tb/`` (watcher resubmissions are new jobs), whichever is larger.
It is logged as ``run/attempt`` at S+1, with the effective config as text.

Writing: each attempt's events go into one file of its own, in TensorBoard's record format (tensorboard's own
``RecordWriter`` frames them; its protos encode them). :meth:`TBLog.scalars` only queues a step's numbers with its
wall time; a small flusher thread encodes and appends what is queued every ``flush_every_s`` seconds (also while
the main thread is stuck), and :meth:`TBLog.flush` does it at once -- the trainer calls it before each checkpoint and
snapshot, so the series is on disk up to any step an attempt can resume from. ``flush_every_s=0`` appends at
every call (the script API, which cannot know when the user's script checkpoints). tensorboard's
``SummaryWriter`` woke its writer thread for every event, which checksummed it in Python and reopened the
file to append it: with one CPU a job paid ~0.3 ms a step for it, about 0.03 ms this way
(scripts/bench/step_overhead.py). Encoding the event (7 protobuf values) in the loop still cost ~85 us a step (P2's
model, timed inside the loop: its caches are cold after the step's compute); queueing the numbers costs a few us,
and the flusher encodes a batch at ~12 us an event.
"""
from __future__ import annotations

import collections
import itertools
import os
import resource
import socket
import threading
import time
from pathlib import Path
from typing import Any, Deque, Dict, Iterator, Mapping, Optional, Tuple, Union

from hpc_agent.core import rundir
from hpc_agent.core.filemodes import make_dir, open_created
from hpc_agent.metrics.tb_reader import EVENT_GLOB

_FILE_NUMBER = itertools.count()  # event files this process opened: part of each one's name


def attempt_number(tb_dir: Path, environ: Mapping[str, str] = os.environ) -> int:
    restarts = environ.get("SLURM_RESTART_COUNT", "")
    previous = len(list(tb_dir.glob(EVENT_GLOB))) if tb_dir.is_dir() else 0
    return max(int(restarts) if restarts.isdigit() else 0, previous)


def peak_memory_bytes(on_cuda: bool) -> int:
    """CUDA: peak allocated by this process's caching allocator. CPU: peak resident set (ru_maxrss,
    which Linux reports in KiB)."""
    if on_cuda:
        import torch

        return int(torch.cuda.max_memory_allocated())
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


class EventFile:
    """One event file, appended to by whoever holds its lock: tensorboard's record framing over a file opened
    without following links, in the run directory's mode."""

    def __init__(self, tb_dir: Path, suffix: str):
        from tensorboard.summary.writer.record_writer import RecordWriter

        # tensorboard's own naming (EventFileWriter): readers sort an attempt's files by the time in the name
        name = (f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}."
                f"{next(_FILE_NUMBER)}{suffix}")
        self.path = tb_dir / name
        self._file = os.fdopen(open_created(self.path, os.O_WRONLY | os.O_APPEND | os.O_EXCL), "ab")
        self._records = RecordWriter(self._file)
        self.lock = threading.Lock()

    def append(self, encoded: Any) -> None:
        """Append already encoded events (an iterable of bytes) and hand them to the kernel; caller holds the lock."""
        for data in encoded:
            self._records.write(data)
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _event(step: int, wall_time: Optional[float] = None, **fields: Any) -> bytes:
    from tensorboard.compat.proto.event_pb2 import Event

    return Event(wall_time=time.time() if wall_time is None else wall_time, step=step, **fields).SerializeToString()


def _scalars_event(step: int, wall_time: float, points: Tuple[Tuple[str, float], ...]) -> bytes:
    from tensorboard.compat.proto.summary_pb2 import Summary

    # One event holding every value, as SummaryWriter.add_scalar encodes each (simple_value); readers take every
    # value of a summary, as TensorBoard does.
    return _event(step, wall_time, summary=Summary(value=[Summary.Value(tag=tag, simple_value=value)
                                                          for tag, value in points]))


class TBLog:
    """TensorBoard events of one attempt, from rank 0; a no-op everywhere else."""

    def __init__(self, run_dir: Path, rank: int, start_step: int, config_text: str,
                 environ: Mapping[str, str] = os.environ, flush_every_s: float = 0.0):
        self.file: Optional[EventFile] = None
        self.first_step = start_step + 1
        self.attempt = 0
        self.flush_every_s = flush_every_s
        self._queued: Deque[Union[bytes, Tuple[int, float, Tuple[Tuple[str, float], ...]]]] = collections.deque()
        self._stop = threading.Event()
        self._flusher: Optional[threading.Thread] = None
        if rank != 0:
            return
        from tensorboard.compat.proto.event_pb2 import SessionLog
        from torch.utils.tensorboard.summary import scalar, text

        tb_dir = rundir.tb_dir(run_dir)
        self.attempt = attempt_number(tb_dir, environ)
        make_dir(tb_dir)
        self.file = EventFile(tb_dir, f".attempt{self.attempt}")
        # What SummaryWriter(purge_step=S+1) writes first: the format version, then a SessionLog START at S+1,
        # on which TensorBoard drops what earlier files logged at steps >= S+1.
        head = [_event(self.first_step, file_version="brain.Event:2"),
                _event(self.first_step, session_log=SessionLog(status=SessionLog.START)),
                _event(self.first_step, summary=scalar("run/attempt", self.attempt)),
                _event(self.first_step, summary=text("config", "```yaml\n" + config_text + "\n```"))]
        with self.file.lock:
            self.file.append(head)
        if flush_every_s > 0:
            self._flusher = threading.Thread(target=self._flush_periodically, name="hpc_agent-tb-flush", daemon=True)
            self._flusher.start()

    def scalars(self, values: Dict[str, Optional[float]], step: int) -> None:
        if self.file is None or step < self.first_step:
            return
        # Queued as plain numbers with the step's wall time; the flush encodes them (_drain), mostly on the flusher
        # thread and many at a time, so the training thread builds no protobuf at each step.
        points = tuple((tag, float(value)) for tag, value in values.items() if value is not None)
        if points:
            self._queued.append((step, time.time(), points))
        if self.flush_every_s <= 0 or step == self.first_step:  # the attempt's first step: on disk at once
            self.flush()

    def restart_at(self, step: int) -> None:
        """An in-job rollback to ``step - 1``: steps from ``step`` on are logged again, and TensorBoard drops what
        this attempt logged at them before (a SessionLog START, as a resumed attempt's first record)."""
        from tensorboard.compat.proto.event_pb2 import SessionLog

        self.first_step = min(self.first_step, step)
        if self.file is not None:
            self._queued.append(_event(step, session_log=SessionLog(status=SessionLog.START)))
            self.flush()

    def flush(self) -> None:
        """Everything logged so far is in the file when this returns (before a checkpoint or a snapshot)."""
        if self.file is None:
            return
        with self.file.lock:
            self.file.append(self._drain())

    def _drain(self) -> Iterator[bytes]:
        while self._queued:
            item = self._queued.popleft()
            yield _scalars_event(*item) if isinstance(item, tuple) else item

    def _flush_periodically(self) -> None:
        while not self._stop.wait(self.flush_every_s):
            try:
                self.flush()
            except (OSError, ValueError):  # a full or vanished file system: the main thread's flush reports it
                pass

    def close(self) -> None:
        if self.file is None:
            return
        self._stop.set()
        if self._flusher is not None:
            self._flusher.join(timeout=5)
        self.flush()
        self.file.close()
        self.file = None

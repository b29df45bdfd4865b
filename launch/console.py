"""The job's standard output while it trains: buffered, and written out at least every ``FLUSH_EVERY_S``.

submitit starts the job's Python with ``-u``, so every ``print`` is a ``write`` to the job's log (under
``srun --output`` the task's stdout is that file itself; a pipe when run outside Slurm). With the default
``train.log_every=1`` that is one write per optimizer step for the step line, ~60 us of the loop's time between
steps on the P2 model (``docs/benchmarks.md``), where the CPU's caches are cold after the step's compute.

:func:`buffered_stdout` switches ``sys.stdout`` to block buffering for the length of a ``with``. Lines printed
with ``flush=True`` (every ``say``: faults, repairs, checkpoints, signals) still go out at once, and with them,
in order, every buffered line before them. The step lines, printed without a flush, go out with the next such
line, when the buffer fills, or from a daemon thread every ``FLUSH_EVERY_S``: a thread of its own, so a main
thread stuck in a collective still gets its last lines into the log for the hang's evidence, and a write that
blocks (a stalled file system or pipe) holds nothing else up. The ``with`` flushes at its end, and ``launch.train`` flushes
before its ``os._exit``. A hard kill (SIGKILL, the OOM killer) loses at most the last ``FLUSH_EVERY_S`` of
step lines; the TensorBoard series (``launch/tblog.py``) has those steps too.
"""
from __future__ import annotations

import contextlib
import sys
import threading
from typing import Iterator, Optional

FLUSH_EVERY_S = 1.0


def _flush_quietly(stream) -> None:
    try:
        stream.flush()
    except (OSError, ValueError):  # a closed or broken stream: the main thread's own writes report it
        pass


def _flush_periodically(stream, stop: threading.Event, every_s: float) -> None:
    while not stop.wait(every_s):
        _flush_quietly(stream)


@contextlib.contextmanager
def buffered_stdout(every_s: float = FLUSH_EVERY_S) -> Iterator[bool]:
    """Block-buffer ``sys.stdout`` inside the ``with`` (yields whether it could), as it was after."""
    stream = sys.stdout
    reconfigure = getattr(stream, "reconfigure", None)
    was: Optional[bool] = getattr(stream, "write_through", None)
    if reconfigure is None or was is None:  # not a TextIOWrapper (a test's capture, say): left alone
        yield False
        return
    try:
        reconfigure(write_through=False)
    except (OSError, ValueError):
        yield False
        return
    stop = threading.Event()
    flusher = threading.Thread(target=_flush_periodically, args=(stream, stop, every_s),
                               name="hpc_agent-stdout", daemon=True)
    flusher.start()
    try:
        yield True
    finally:
        stop.set()
        flusher.join(timeout=every_s)
        _flush_quietly(stream)
        with contextlib.suppress(OSError, ValueError):
            reconfigure(write_through=was)

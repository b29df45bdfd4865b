"""Asynchronous snapshots: a checkpoint every few steps that costs the training loop only a host copy.

A SIGKILL or a node failure gives the job no warning, so everything since the last checkpoint is lost.
Snapshots shorten that: every ``resilience.snapshot_every`` optimizer steps each rank

1. (main thread, at the step boundary, on every rank together) runs DeepSpeed's own
   ``engine.save_checkpoint`` with its checkpoint engine swapped for one that keeps a host copy of each
   state dict instead of writing it (launch/host_copy.py), into the previous snapshot's host tensors
   where they still fit. So the files, their names and the ZeRO sharding
   are exactly what a full checkpoint holds, the collectives (ZeRO-3 gathers, barriers) run where every
   rank runs them, and nothing in the background thread is a collective;
2. (a background thread) ``torch.save``s its files into ``checkpoints/snap_<step>/``, fsyncs them and
   writes a report (its file names and sizes);
3. rank 0's thread waits for every rank's report, checks the sizes on disk and only then writes
   ``COMPLETE.json`` (the same marker and rules as checkpoints: ``hpc_agent.core.checkpoint_format``), then applies
   retention (only the newest complete snapshot is kept, and only while it is newer than every
   checkpoint).

One snapshot is in flight at a time: when any rank is still writing the previous one, the ranks agree
to skip this one (counted in :attr:`Snapshots.skipped`).

With snapshots on, the periodic checkpoints (``train.ckpt_every``) take the same path (``full=True``):
captured at the step boundary, written in the background under their ``step_`` tag, with a checkpoint's
marker. At one checkpoint every 150 steps of ~0.1 s the synchronous save held the loop ~50 ms, a third
of P2's loop overhead (docs/benchmarks.md). Unlike a snapshot, a checkpoint is never skipped (it waits
for the write in flight), never abandoned (:meth:`Snapshots.settle` waits for it), and a failed write stops
the job at the next due point, on every rank, as a synchronous save's failure would.

Why not DeepSpeed's own decoupled engine (``checkpoint.writer.decoupled``): it hands the live tensors to a spawned process through shared memory
(the optimizer keeps changing them while it writes), blocks the next step until the save is done, writes
no completion marker, and its default FAST writer needs the async-I/O op built, which a job must never do.
"""
from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from hpc_agent.core import checkpoint_format, json_safe, rundir
from hpc_agent.core.filemodes import dir_mode, group_of, make_dir, open_created, set_mode
from hpc_agent.core.fsutil import atomic_write_json
from launch import checkpoint
from launch.host_copy import HostBuffers, capture, copy_recovery_scripts

REPORT_WAIT_S = 600.0
"""How long rank 0's writer waits for the other ranks' reports before it gives the snapshot up."""

_REPORT = "report_rank_{:05d}.json"


class Snapshots:
    """The job's snapshot taker; one per attempt. Main-thread calls: :meth:`after_step`, :meth:`settle`."""

    def __init__(self, every: int, root: Path, rank: int, world: int, layout: Dict[str, Any],
                 keep_checkpoints: int, agree_max: Callable[[int], int], say: Callable[[str], None]):
        self.every, self.root, self.rank, self.world, self.layout = every, Path(root), rank, world, layout
        self.keep, self.agree_max, self.say = keep_checkpoints, agree_max, say
        self.skipped = 0
        self.taken = 0
        self.capture_s: List[float] = []  # main-thread seconds per snapshot taken
        self.completed: List[Tuple[int, float]] = []  # rank 0: (step, seconds from capture to marker)
        self._thread: Optional[threading.Thread] = None
        self._abandon = threading.Event()
        self._error: Optional[str] = None
        self._full = False  # the write in flight is a checkpoint's (never abandoned)
        self.failed_full: Optional[Tuple[int, str]] = None  # (step, why): a checkpoint write that failed
        self._recovery_scripts: Optional[Any] = None  # rank 0: the engine whose scripts are still to copy
        self._scripts_copied = False
        self._buffers = HostBuffers()

    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def due(self, step: int, saved: bool = False) -> bool:
        """A snapshot of ``step`` is to be taken (unless one is still being written)."""
        return bool(self.every) and step % self.every == 0 and not saved

    def after_step(self, engine: Any, step: int, client_state: Callable[[], Dict[str, Any]],
                   saved: bool = False, full: bool = False,
                   before_marker: Optional[Callable[[int, Path], None]] = None) -> bool:
        """At the step boundary, on every rank: take a snapshot of ``step`` when one is due; True when
        taken. ``saved``: a full checkpoint of this step exists (or is about to), so none is needed.
        ``full``: take the periodic checkpoint of ``step`` this way instead (always, waiting for a write in
        flight); ``before_marker`` as in ``launch.checkpoint.save``, on rank 0's writer thread."""
        if not full and not self.due(step, saved):
            return False
        if self._error is not None:
            self.say(f"snapshot failed on rank {self.rank}: {self._error}")
            self._error = None
        worst = self.agree_max(2 if self.failed_full else (1 if self.busy() else 0))
        if worst >= 2:  # a checkpoint that did not get written stops the job, like a failed synchronous save
            why = self.failed_full[1] if self.failed_full else "on another rank"
            raise RuntimeError(f"a checkpoint could not be written: {why}")
        if worst and not full:  # one in flight anywhere: every rank skips
            self.skipped += 1
            if self.rank == 0:
                self.say(f"snapshot at step {step} skipped: the previous one is still being written "
                         f"({self.skipped} skipped)")
            return False
        if worst:
            self.settle()  # a checkpoint waits for the write in flight (the caller's phase says "saving")
        started = time.perf_counter()
        tag = checkpoint_format.tag_for(step) if full else checkpoint_format.snap_tag_for(step)
        if self.rank == 0:
            make_dir(self.root)
            if (self.root / tag).exists():  # torn leftover of an earlier attempt (or of a rollback)
                shutil.rmtree(self.root / tag)
        # save_checkpoint's first barrier keeps the other ranks from writing before that rmtree.
        # No writer is alive here (skipped or waited for above), so the previous copy is free to reuse.
        files = capture(engine, self.root, tag, client_state(), None if self.busy() else self._buffers)
        if self.rank == 0 and not self._scripts_copied:
            self._recovery_scripts = engine
        self.capture_s.append(time.perf_counter() - started)
        self.taken += 1
        self._abandon.clear()
        self._full = full
        self._thread = threading.Thread(target=self._write, args=(step, tag, files, started, full, before_marker),
                                        name=f"snapshot-{tag}", daemon=True)
        self._thread.start()
        return True

    def settle(self, abandon: bool = False) -> None:
        """Before a full checkpoint: wait for the snapshot in flight to finish (so retention never races
        it), or, when the job must go now (a preemption signal), tell it to stop before its marker and
        do not wait: a snapshot without its marker is never resumed from. A checkpoint in flight is always
        waited for: the job may be about to exit on the strength of it."""
        if not self.busy():
            return
        if abandon and not self._full:
            self._abandon.set()
            return
        self._thread.join()  # type: ignore[union-attr]

    # ---- the background thread --------------------------------------------------------------
    def _write(self, step: int, tag: str, files: List[Tuple[str, Any]], started: float, full: bool,
               before_marker: Optional[Callable[[int, Path], None]]) -> None:
        try:
            self._write_files(step, tag, files)
            engine, self._recovery_scripts = self._recovery_scripts, None
            if engine is not None:
                try:
                    copy_recovery_scripts(engine, self.root)
                except OSError:  # a convenience for converting by hand; never worth a lost snapshot
                    pass
                self._scripts_copied = True
            if self.rank == 0 and not self._abandon.is_set():
                self._complete(step, tag, started, full, before_marker)
        except Exception as exc:  # a snapshot never kills training (the next checkpoint still comes)
            self._error = f"{tag}: {exc.__class__.__name__}: {exc}"
            if full:  # ... a checkpoint does, at the next due point (after_step)
                self.failed_full, self._error = (step, self._error), None
            if self.rank != 0:  # so rank 0 stops waiting for this rank's files
                try:
                    atomic_write_json(self.root / tag / _REPORT.format(self.rank),
                                      {"step": step, "rank": self.rank, "error": self._error})
                except OSError:
                    pass

    def _write_files(self, step: int, tag: str, files: List[Tuple[str, Any]]) -> None:
        import torch

        tag_dir = self.root / tag
        written: Dict[str, int] = {}
        while files:
            if self._abandon.is_set():
                return
            path, state = files.pop(0)  # the host copy stays in HostBuffers for the next capture
            fd = open_created(path, os.O_WRONLY | os.O_TRUNC)
            with os.fdopen(fd, "wb") as handle:
                torch.save(state, handle)
                handle.flush()
                os.fsync(handle.fileno())
                written[Path(path).relative_to(tag_dir).as_posix()] = handle.tell()
            del state
        atomic_write_json(tag_dir / _REPORT.format(self.rank), {"step": step, "rank": self.rank, "files": written})

    def _reports(self, tag_dir: Path, step: int) -> Optional[Dict[str, int]]:
        """Every rank's reported files once all reports are there, else None (still waiting)."""
        files: Dict[str, int] = {}
        for rank in range(self.world):
            path = tag_dir / _REPORT.format(rank)
            if not path.exists():
                return None
            report, problem = json_safe.loads_object(rundir.read_bounded(path, rundir.JSON_MAX_BYTES))
            if problem:
                raise RuntimeError(f"{path.name}: {problem}")
            if report.get("step") != step:
                raise RuntimeError(f"{path.name} reports step {report.get('step')!r}, not {step}")
            if "error" in report:
                raise RuntimeError(f"rank {rank} could not write its files: {report['error']}")
            files.update({str(k): int(v) for k, v in report["files"].items()})
        return files

    def _complete(self, step: int, tag: str, started: float, full: bool = False,
                  before_marker: Optional[Callable[[int, Path], None]] = None) -> None:
        tag_dir = self.root / tag
        deadline = time.monotonic() + REPORT_WAIT_S
        while True:
            if self._abandon.is_set():
                return
            files = self._reports(tag_dir, step)
            if files is not None:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"not every rank reported its files within {REPORT_WAIT_S:g}s")
            time.sleep(0.02)
        lost = checkpoint._unconfirmed(tag_dir, files)
        if lost:  # shared file system out of sync: better no marker than a false one
            raise RuntimeError(f"files reported by the ranks do not match the disk: {lost}")
        set_mode(tag_dir, dir_mode(group_of(self.root)))
        if before_marker is not None:
            before_marker(step, tag_dir)
        if self._abandon.is_set():
            return
        checkpoint.write_marker(tag_dir, step, files, self.layout, **({} if full else {"snapshot": True}))
        seconds = time.perf_counter() - started
        self.completed.append((step, seconds))
        deleted = checkpoint.apply_retention(self.root, self.keep)
        held = self.capture_s[-1] if self.capture_s else 0.0
        kind = "checkpoint" if full else "snapshot"
        self.say(f"{kind} {tag} complete in {seconds:.2f}s (training held {held:.2f}s of it)"
                 + (f"; deleted {', '.join(deleted)}" if deleted else ""))

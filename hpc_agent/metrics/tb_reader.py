"""Incremental reading of TensorBoard scalars from a run's event files (login node: no torch, no TF).

Built on TensorBoard's own ``RawEventFileLoader``: it keeps its offset between ``Load()`` calls and, when
the last record is only partly written, stops there and retries that record on the next call. So each
``update()`` reads only the bytes appended since the previous one; files that did not grow are not read
at all (one ``os.stat`` each).

Our training job writes one event file per attempt into ``<run_dir>/tb/`` (suffix ``.attempt<N>``), opened
with ``purge_step``: its first record is a SessionLog START at S+1, on which TensorBoard drops whatever
older files logged at steps >= S+1 (see ``launch/tblog.py``). ``series()`` applies the same rule, and
where attempts still overlap the newest file wins, so each step has exactly one point.

The job writes ``tb/``, so a link there (to a file or folder, or ``tb/`` itself) is never followed out of
the run directory: it is skipped and named in :meth:`RunScalars.problems`.
"""
from __future__ import annotations

import heapq
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from hpc_agent.core.read_caps import DEFAULT_CAPS, ReadCaps, over_cap

EVENT_GLOB = "events.out.tfevents.*"
"""The event files' names: ``launch/tblog.py`` writes them, this module reads them."""
TB_FLUSH_EVERY_S = 2.0
"""The built-in trainer's flush interval (seconds, ``launch/tblog.py``): a bound on how late the event file shows
a step."""
RECORD_OVERHEAD = 16
"""TFRecord framing around each event: u64 length, u32 crc of the length, data, u32 crc of the data."""


@dataclass(frozen=True)
class Point:
    step: int
    wall_time: float
    value: float


_CREATED = re.compile(r"tfevents\.(\d+)")
_ATTEMPT = re.compile(r"\.attempt(\d+)$")
_EVENT_PREFIX = EVENT_GLOB.rstrip("*")


def file_order_key(name: str) -> Tuple[int, int, str]:
    """Oldest first: the writer's creation time in the name, then ``.attemptN``, then the name."""
    m = _CREATED.search(name)
    created = int(m.group(1)) if m else 0
    a = _ATTEMPT.search(name)
    attempt = int(a.group(1)) if a else -1
    return (created, attempt, name)


def _op_error() -> type:
    from tensorboard.compat import tf

    return tf.errors.OpError


class _FileState:
    """One event file: its loader, how many bytes were consumed, and the points read from it."""

    def __init__(self, path: Path):
        from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader

        self.path = path
        self.name = path.name
        st = os.lstat(path)
        self.ino = (st.st_dev, st.st_ino)
        self.size_seen = -1
        self.corrupt: Optional[str] = None
        """Why this file stopped being read (a corrupt record); None while it reads fine."""
        self.offset = 0
        """Bytes of complete records consumed so far."""
        self.records = 0
        self.purge_step: Optional[int] = None
        """Step of this file's SessionLog START (``purge_step``), if it has one."""
        self.points: Dict[str, List[Point]] = {}
        self.ignored_tags: set = set()
        """Tags whose summary metadata names a plugin other than scalars (text, histograms, ...)."""
        self.loader = RawEventFileLoader(str(path))


class RunScalars:
    """Scalars of one run directory (``<run_dir>/tb``), read incrementally."""

    def __init__(self, tb_dir, tags: Optional[Sequence[str]] = None, caps: ReadCaps = DEFAULT_CAPS):
        self.tb_dir = Path(tb_dir)
        self.caps = caps
        self.capped: Dict[str, str] = {}
        """The caps the last :meth:`update` met (cap name -> note): what is beyond them was not read."""
        self._wanted = set(tags) if tags is not None else None
        self._files: Dict[str, _FileState] = {}
        self._series_cache: Dict[str, List[Point]] = {}
        self.bytes_read = 0
        """Bytes of complete records read by all ``update()`` calls together (for tests and benchmarks)."""
        self.records_read = 0
        self.skipped: Dict[str, str] = {}
        """Links met under ``tb_dir`` (path -> why not read): never followed (see :meth:`problems`)."""

    # --- reading ------------------------------------------------------------------------------------
    def update(self) -> int:
        """Read whatever was appended to the event files since the last call; returns the new points.

        New files are picked up. A file that shrank below what was already read, or was replaced by another
        file (new inode), is read again from its start and its old points are dropped."""
        if self.tb_dir.is_symlink():  # a job-planted link to elsewhere: not the run's events
            self.skipped[str(self.tb_dir)] = f"{self.tb_dir} is a symbolic link; not following it out of the run directory"
            return 0
        if not self.tb_dir.is_dir():
            return 0
        paths = sorted(self._event_files(self.tb_dir), key=lambda p: file_order_key(p.name))
        present = {str(p) for p in paths}
        changed = False
        for key in [k for k in self._files if k not in present]:  # deleted: forget its points
            del self._files[key]
            changed = True
        new_points = 0
        budget = self.bytes_read + self.caps.tb_bytes
        for path in paths:
            key = str(path)
            if self.bytes_read >= budget:  # the rest on the next update (size_seen is left as it was)
                self.capped["tb_bytes"] = over_cap("tb_bytes", self.caps.tb_bytes, "event records left for the next "
                                                   f"read under {self.tb_dir}")
                break
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(st.st_mode):  # became a link (or other) since the walk: not read
                continue
            state = self._files.get(key)
            if state is not None and ((st.st_dev, st.st_ino) != state.ino or st.st_size < state.offset):
                state = None  # replaced or truncated: start over
                changed = True
            if state is None:
                try:
                    state = _FileState(path)
                except (FileNotFoundError, OSError):
                    continue
                self._files[key] = state
                changed = True
            if st.st_size == state.size_seen or state.corrupt:
                continue  # nothing appended, or unreadable past a corrupt record: do not touch the file
            state.size_seen = st.st_size
            try:
                n = self._read_new(state)
            except Exception as e:  # the file vanished mid-read (TensorBoard's NotFoundError is no OSError)
                if os.path.exists(path) and not isinstance(e, (OSError, _op_error())):
                    raise
                del self._files[key]  # start over from its beginning next time
                changed = True
                continue
            if n:
                changed = True
            new_points += n
        if changed:
            self._series_cache.clear()
        return new_points

    def _event_files(self, folder: Path) -> List[Path]:
        """Regular event files under ``folder``, walked without following a link: a symbolic link (to a
        file or a folder) is skipped and noted in :meth:`problems`, since it can point out of the run dir.
        Within the caps (hpc_agent/core/read_caps.py): ``tb_depth`` folder levels, ``listing`` entries in all,
        the newest ``event_files`` files by the creation time in their names; the rest is named in
        :meth:`problems` (``capped``), never walked into. Iterative: a tree thousands deep costs no stack."""
        caps = self.caps
        found: List[Tuple[str, str]] = []  # (name, path): a Path is made only for the files kept
        seen = 0
        self.capped = {}
        todo = [(str(folder), 0)]
        while todo:
            here, depth = todo.pop()
            try:
                with os.scandir(here) as it:
                    for entry in it:
                        seen += 1
                        if seen > caps.listing:
                            self.capped["listing"] = over_cap("listing", caps.listing, f"{self.tb_dir} holds more "
                                                              "entries; the rest are not looked at")
                            todo = []
                            break
                        name = entry.name
                        if entry.is_symlink():
                            if name.startswith(_EVENT_PREFIX) or entry.is_dir():
                                self.skipped[entry.path] = (f"{name} is a symbolic link; not following it "
                                                            "out of the run directory")
                        elif entry.is_dir(follow_symlinks=False):
                            if depth + 1 > caps.tb_depth:
                                self.capped["tb_depth"] = over_cap("tb_depth", caps.tb_depth, "folders deeper under "
                                                                   f"{self.tb_dir} are not walked ({entry.path})")
                            else:
                                todo.append((entry.path, depth + 1))
                        elif name.startswith(_EVENT_PREFIX) and entry.is_file(follow_symlinks=False):
                            found.append((name, entry.path))
            except OSError:
                continue
        if len(found) > caps.event_files:
            self.capped["event_files"] = over_cap("event_files", caps.event_files, f"{len(found)} event files under "
                                                  f"{self.tb_dir}; read the newest {caps.event_files}")
            found = heapq.nlargest(caps.event_files, found, key=lambda f: file_order_key(f[0]))
        return [Path(path) for _, path in found]

    def _read_new(self, state: _FileState) -> int:
        from tensorboard.compat.proto import event_pb2

        count = 0
        start_offset = state.offset
        wanted = self._wanted
        records: list = []
        try:
            records.extend(self._records(state, event_pb2))
        except Exception as exc:  # noqa: BLE001 - bad CRC, bad protobuf, a huge length: job-written bytes
            if not os.path.exists(state.path):
                raise  # vanished mid-read: update() starts it over
            # A corrupt record is skipped and reported, never raised: one bad file must not stop a reader
            # that follows many runs. Points before it are kept; TFRecord has no resync marker, so the rest
            # of the file is unreadable.
            state.corrupt = (f"{state.name}: corrupt record after byte {state.offset} ({type(exc).__name__}); "
                             "the rest of this file is skipped")
        for event in records:
            what = event.WhichOneof("what")
            if what == "session_log":
                if event.session_log.status == event.session_log.START:
                    state.purge_step = int(event.step)
                continue
            if what != "summary":
                continue
            for value in event.summary.value:
                tag = value.tag
                if wanted is not None and tag not in wanted:
                    continue
                number = self._scalar(value, state)
                if number is None:
                    continue
                state.points.setdefault(tag, []).append(Point(int(event.step), float(event.wall_time), number))
                count += 1
        self.bytes_read += state.offset - start_offset
        return count

    def _records(self, state: _FileState, event_pb2):
        for record in state.loader.Load():
            event = event_pb2.Event.FromString(record)
            state.offset += len(record) + RECORD_OVERHEAD
            state.records += 1
            self.records_read += 1
            yield event

    def problems(self) -> List[str]:
        """The event files that stopped being read, and why (shown in the audit trail, never raised). Bytes
        after the last complete record count too: for an ended job that is a torn or corrupt tail (while a
        job still writes, it can be a record half written)."""
        out = [self.skipped[key] for key in sorted(self.skipped)] + [self.capped[k] for k in sorted(self.capped)]
        for s in self._ordered_files():
            if s.corrupt:
                out.append(s.corrupt)
            elif s.size_seen > s.offset:  # a CRC mismatch makes the loader wait, as for a half-written record
                out.append(f"{s.name}: {s.size_seen - s.offset} bytes after the last complete record are unreadable "
                           "(torn or corrupt; skipped)")
        return out

    @staticmethod
    def _scalar(value, state: _FileState) -> Optional[float]:
        """The scalar in one ``Summary.Value`` (``simple_value`` or a one-element numeric tensor), else None."""
        tag = value.tag
        if value.HasField("metadata") and value.metadata.plugin_data.plugin_name:
            if value.metadata.plugin_data.plugin_name != "scalars":
                state.ignored_tags.add(tag)
                return None
            state.ignored_tags.discard(tag)
        if tag in state.ignored_tags:
            return None
        kind = value.WhichOneof("value")
        if kind == "simple_value":
            return float(value.simple_value)
        if kind == "tensor":
            from tensorboard.util import tensor_util

            try:
                array = tensor_util.make_ndarray(value.tensor)
            except Exception:  # an odd dtype: not a scalar we can use
                return None
            if array.size != 1 or array.dtype.kind not in "biuf":
                return None  # text (strings) and anything bigger than a scalar
            return float(array.reshape(()).item())
        return None  # images, histograms, audio

    # --- queries ------------------------------------------------------------------------------------
    def _ordered_files(self) -> List[_FileState]:
        return sorted(self._files.values(), key=lambda s: file_order_key(s.name))

    def tags(self) -> List[str]:
        return sorted({t for s in self._files.values() for t, pts in s.points.items() if pts})

    def raw(self, tag: str) -> List[Tuple[str, Point]]:
        """``(file name, point)`` for every point of ``tag``, oldest file first, in write order within a
        file; nothing dropped (attempt boundaries and overlaps are visible here)."""
        return [(state.name, p) for state in self._ordered_files() for p in state.points.get(tag, ())]

    def written(self, tag: str) -> List[Point]:
        """Every point of ``tag`` in the order it was written: oldest file first (each attempt writes its
        own), write order within a file; a resumed attempt shows as the step going back. Not sorted by wall
        time: nodes' clocks can disagree by seconds. What the fatal alarms read
        (``hpc_agent.diagnosis.alarms.run_alarms``), so they judge the newest attempt's own points."""
        return [p for _, p in self.raw(tag)]

    def series(self, tag: str) -> List[Point]:
        """One point per step, sorted by step. An attempt's ``purge_step`` drops the points older files
        logged at steps >= it; where files still overlap, the newest file's point wins."""
        cached = self._series_cache.get(tag)
        if cached is not None:
            return list(cached)
        files = self._ordered_files()
        by_step: Dict[int, Point] = {}
        for state in files:
            if state.purge_step is not None:
                for step in [s for s in by_step if s >= state.purge_step]:
                    del by_step[step]
            for point in state.points.get(tag, ()):
                by_step[point.step] = point  # later (newer) wins
        result = [by_step[s] for s in sorted(by_step)]
        self._series_cache[tag] = result
        return list(result)

"""How much of a run directory a reader may look at: the one home of the caps on job-written files.

A job (or another member of a group-shared runs root) can fill its run directory with thousands of rank logs,
tens of thousands of TensorBoard event files or a folder tree thousands of levels deep. Every reader of a run
directory (the watcher's tick: ``hpc_agent.watcher.observe``; ``diagnose``; ``review``) works within these caps,
so one such run costs a bounded amount of time and memory, and what lies beyond a cap is named in a note
(:func:`over_cap`), never followed into. Pure: no I/O here; the readers (``hpc_agent.core.rundir.find_logs``,
``hpc_agent.metrics.tb_reader.RunScalars``) apply them.

The caps are the watcher owner's, never the run's: they come from the command line (``--read-cap KEY=N`` on
``watch``, ``diagnose`` and ``review``), not from anything in a run directory.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Iterable


@dataclass(frozen=True)
class ReadCaps:
    """Caps per run, per read (one watcher tick, one ``diagnose``, one run of ``review``)."""

    rank_logs: int = 8
    """Ranks whose logs (``<job>_<rank>_log.out``/``.err``) are read: the ranks whose newest log file is newest
    by mtime. A job with more ranks gets the note; the cause of an end is in the rank that wrote last."""
    listing: int = 4096
    """Directory entries looked at in one run's ``slurm/`` and, all folders together, under its ``tb/``
    (each one a ``readdir`` entry and at most one ``lstat``): the newest logs and event files are picked from
    these, so a folder stuffed with a million names is not listed to its end (4096: the ``.out`` and ``.err``
    of 2048 ranks)."""
    run_bytes: int = 16 << 20
    """Bytes of log tails read from one run per read, all its logs together (each log's own tail cap still
    applies: 256 KiB for the watcher, ``diagnose --tail-bytes``, 1 MiB by default: 8 ranks' ``.out`` and ``.err``
    fit)."""
    event_files: int = 256
    """TensorBoard event files read per run: the newest by the writer's creation time in the name (the job
    writes one per attempt, so this is hundreds of requeues)."""
    tb_depth: int = 4
    """Folder levels walked under ``tb/`` (``tb/`` itself is level 0; the job writes its files there)."""
    tb_bytes: int = 256 << 20
    """Bytes of event records read from one run's ``tb/`` per read; files not reached are read on the next
    read (the watcher's reader is incremental), ``review`` says the curves are cut."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"read cap {f.name} must be a positive integer, not {value!r}")

    def with_overrides(self, items: Iterable[str]) -> "ReadCaps":
        """These caps with ``KEY=N`` items applied (``rank_logs=16``); ValueError naming the bad item."""
        names = [f.name for f in fields(self)]
        changes = {}
        for item in items:
            key, sep, text = str(item).partition("=")
            key = key.strip().replace("-", "_")
            if not sep or key not in names:
                raise ValueError(f"--read-cap {item!r}: give KEY=N with KEY one of {', '.join(names)}")
            try:
                number = int(text.strip())
            except ValueError:
                raise ValueError(f"--read-cap {item!r}: N must be a whole number") from None
            if not 1 <= number <= 1 << 40:
                raise ValueError(f"--read-cap {item!r}: N must be between 1 and {1 << 40}")
            changes[key] = number
        return replace(self, **changes)


DEFAULT_CAPS = ReadCaps()


def over_cap(cap: str, limit: int, what: str) -> str:
    """The note a reader gives when a run is over one cap: ``over the read cap rank_logs=8: ...``. The watcher
    says each cap's note once per run (it keys on the text before the colon)."""
    return f"over the read cap {cap}={limit}: {what}"


def cap_of(note: str) -> str:
    """The cap a note of :func:`over_cap` names ('' for any other text)."""
    prefix = "over the read cap "
    return note[len(prefix):].split("=", 1)[0] if note.startswith(prefix) else ""

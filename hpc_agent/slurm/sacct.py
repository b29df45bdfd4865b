"""Parse ``sacct --parsable2`` text into records, and records into attempts. Pure: text in, records out.

The parser is driven by the header line, so any ``--format`` that contains JobID and State works.
Quirks it copes with (all seen on Slurm 22.05):

- Steps are rows of their own: ``123.batch`` (the batch script), ``123.extern`` (the PrologFlags=contain
  step), ``123.0`` (the first srun step). Step rows can end after their allocation row and their
  state (usually CANCELLED 0:9 or OUT_OF_MEMORY 0:125) often says more than the allocation row's.
- ``-D`` (``--duplicates``) prints every attempt of a requeued job under the *same* JobID, oldest
  first, each followed by its own steps and possibly interleaved with other jobs' rows. 22.05 has no
  Restarts field, so the attempt number is the position in that order.
- Array tasks are ``12_3``; a pending array is ``12_[1-4]`` (one row for all its unstarted tasks).
- Heterogeneous jobs are ``12+0``, ``12+1``: components of *one* job, grouped here under ``12``.
- State can read ``CANCELLED by 1234`` (the uid that ran scancel) and, in fixed-width output pasted by a
  user, be truncated with ``+`` (``OUT_OF_ME+``).
- A pending job has Start/End ``Unknown`` and NodeList ``None assigned``.
"""
from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from hpc_agent.slurm.hostlist import expand_hostlist

# The format diagnose asks for (hpc_agent.slurm.cli.SlurmCLI.sacct(fields=...)).
SACCT_FIELDS = ("JobID", "JobName", "State", "ExitCode", "NodeList", "Start", "End", "Elapsed")
# The watcher's: no Elapsed, which nothing reads and which changes every second for a running job, so a
# running job's lines stay the same from tick to tick and its parse is reused (``attempt_cache.AttemptCache``). Submit
# (fixed per attempt) tells an older job that had the same id from the run's own (hpc_agent/slurm/job_match.py).
WATCH_FIELDS = tuple(f for f in SACCT_FIELDS if f != "Elapsed") + ("Submit",)

STATES = ("BOOT_FAIL", "CANCELLED", "COMPLETED", "COMPLETING", "CONFIGURING", "DEADLINE", "FAILED",
          "NODE_FAIL", "OUT_OF_MEMORY", "PENDING", "PREEMPTED", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD",
          "RESIZING", "RESV_DEL_HOLD", "REVOKED", "RUNNING", "SIGNALING", "SPECIAL_EXIT", "STAGE_OUT",
          "STOPPED", "SUSPENDED", "TIMEOUT")

# When the components of a heterogeneous job disagree, the one that explains the end wins: one
# component fails or runs out of memory, Slurm then cancels the others.
_STATE_WEIGHT = {s: i for i, s in enumerate((
    "NODE_FAIL", "BOOT_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT", "DEADLINE", "FAILED", "SPECIAL_EXIT",
    "REQUEUED", "CANCELLED", "REVOKED", "RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT", "RESIZING",
    "SUSPENDED", "STOPPED", "CONFIGURING", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "PENDING",
    "COMPLETED"))}

_JOBID_RE = re.compile(r"^(?P<base>\d+)(?:_(?P<task>\d+|\[[^\]]*\]))?(?:\+(?P<het>\d+))?(?:\.(?P<step>.+))?$")


_STATE_SET = frozenset(STATES)
_CANCELLED_BY_RE = re.compile(r"^(\S+)\s+by\s+(\S+)")
_EXIT_CODE_RE = re.compile(r"^\s*(\d+):(\d+)\s*$")


def parse_parsable2(text: str) -> List[Dict[str, str]]:
    """Rows of ``sacct --parsable2`` output as dicts keyed by the header line's field names."""
    lines = [line for line in text_lines(text) if line.strip()]
    if not lines:
        return []
    header = lines[0].split("|")
    return [dict(zip(header, line.split("|"))) for line in lines[1:]]


def job_state(records: List[Dict[str, str]], job_id: str) -> str | None:
    """State of the newest allocation row (not a step) of ``job_id``, or None if sacct has none."""
    rows = [r for r in records if r.get("JobID") == str(job_id)]
    if not rows:
        return None
    # sacct -D lists attempts oldest first; the last row is the newest attempt.
    return normalize_state(rows[-1].get("State", ""))[0] or None


def normalize_state(raw: str) -> Tuple[str, Optional[str]]:
    """``"CANCELLED by 0"`` -> ``("CANCELLED", "0")``; ``"OUT_OF_ME+"`` -> ``("OUT_OF_MEMORY", None)``.

    A truncated name is completed only when exactly one state starts with it; otherwise it is kept as
    written (and classifies as unknown rather than as a guess).
    """
    text = (raw or "").strip()
    if text in _STATE_SET:  # the common case, a full state name as sacct prints it (hot: once per row)
        return text, None
    by = None
    match = _CANCELLED_BY_RE.match(text)
    if match:
        text, by = match.group(1), match.group(2)
    text = text.split(" ")[0].upper() if text else ""
    if text.endswith("+"):
        candidates = [s for s in STATES if s.startswith(text[:-1])]
        if len(candidates) == 1:
            text = candidates[0]
    return text, by


def parse_exit_code(raw: str) -> Tuple[Optional[int], Optional[int]]:
    """``"1:0"`` -> ``(1, 0)``: sacct's ExitCode is ``<exit status>:<signal>``."""
    match = _EXIT_CODE_RE.match(raw or "")
    return (int(match.group(1)), int(match.group(2))) if match else (None, None)


@dataclass(frozen=True)
class SacctRow:
    """One line of sacct output (an allocation or a step)."""

    job_id: str
    """The JobID column as printed: ``123``, ``123.batch``, ``12_3.0``, ``12+1.batch``."""
    base_id: str
    """The numeric job id: ``123`` (or the array's / heterogeneous job's id)."""
    array_task: Optional[str]
    """``3`` for ``12_3``, ``[1-4]`` for a pending array; None otherwise."""
    het_offset: Optional[int]
    """Component of a heterogeneous job (``12+1`` -> 1); None otherwise."""
    step: Optional[str]
    """``batch``, ``extern``, ``0``...; None for the allocation row."""
    state: str
    """Normalized state: ``CANCELLED`` for ``CANCELLED by 0``, the full name for a truncated one."""
    cancelled_by: Optional[str]
    """The uid from ``CANCELLED by <uid>``."""
    exit_status: Optional[int]
    signal: Optional[int]
    fields: Mapping[str, str] = field(default_factory=dict)
    """Every column of the row, by header name."""

    @property
    def job_key(self) -> str:
        """What groups the rows of one job: ``123``, ``12_3``; a heterogeneous job's components share ``12``."""
        return self.base_id + (f"_{self.array_task}" if self.array_task is not None else "")

    def get(self, name: str, default: str = "") -> str:
        return self.fields.get(name, default)

    @property
    def exit_code(self) -> str:
        return self.get("ExitCode")

    @property
    def nodes(self) -> List[str]:
        return expand_hostlist(self.get("NodeList"))


class SacctFormatError(ValueError):
    """Text that is not sacct output in any format the reader knows; the message says what to change."""


FIELD_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


def text_lines(text: str) -> List[str]:
    """Lines split at ``\\n`` only, a trailing ``\\r`` dropped (CRLF). Not ``str.splitlines``: that also splits
    at ``\\x0b``, ``\\x1c``, ``\\x85``, ``\\u2028``... which a job name may contain."""
    return [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]


def is_header(values: Sequence[str]) -> bool:
    """Is this ``|``-split line a sacct header? Every field a field name (a row always has a job id,
    which starts with a digit), JobID and State among them."""
    names = list(values[:-1]) if values and values[-1] == "" else list(values)
    return ("JobID" in names and "State" in names
            and all(FIELD_NAME_RE.match(name) for name in names))


def header_fields(values: Sequence[str]) -> Tuple[List[str], bool]:
    """(field names, is ``--parsable``): with ``-p`` (not ``-P``) every line, the header too, ends with a
    ``|``. Decided here, from the header, never from a row: a row's empty last field (an empty Comment)
    looks just like that trailing ``|``."""
    if values and values[-1] == "":
        return list(values[:-1]), True
    return list(values), False


def pipe_row(header: Sequence[str], trailing_bar: bool, line: str) -> Optional[SacctRow]:
    """One ``-P``/``-p`` data line under ``header`` as a row; None when it is not one (wrong field count
    that a '|' in the job name cannot explain, or no job id)."""
    values = line.split("|")
    if trailing_bar and len(values) > 1 and values[-1] == "":
        values = values[:-1]
    values = _rejoin_job_name(header, values)
    if len(values) != len(header):
        return None
    return row_from_fields(dict(zip(header, values)))


def parse_sacct(text: str) -> List[SacctRow]:
    """All recognisable rows of ``sacct --parsable2`` (or ``--parsable``) text, in order.

    Text without a header naming JobID and State (an error message, an empty reply, garbage) gives
    ``[]``: to the caller that means *unknown*, never *gone*. Rows whose JobID is not a job id are
    skipped; a header repeated later (outputs concatenated) starts a new section. Lenient by design (the
    watcher's own format); :func:`hpc_agent.slurm.sacct_read.read_sacct_text` reads every format and says
    when text is none of them.
    """
    header: Optional[List[str]] = None
    trailing_bar = False
    rows: List[SacctRow] = []
    for line in text_lines(text):
        if not line.strip():
            continue
        values = line.split("|")
        if is_header(values):
            header, trailing_bar = header_fields(values)
            continue
        if header is None:
            continue
        row = pipe_row(header, trailing_bar, line)
        if row is not None:
            rows.append(row)
    return rows


def has_sacct_header(text: str) -> bool:
    """Does ``text`` contain a sacct header line (even with no rows: the job is simply not known yet)?"""
    return any(is_header(line.split("|")) for line in text_lines(text))


def _rejoin_job_name(header: Sequence[str], values: List[str]) -> List[str]:
    """sacct does not escape '|' inside a job name; give the extra pieces back to JobName."""
    extra = len(values) - len(header)
    if extra > 0 and "JobName" in header:
        i = list(header).index("JobName")
        return values[:i] + ["|".join(values[i:i + extra + 1])] + values[i + extra + 1:]
    return values


# Step names as fixed-width output truncates them (``12345.bat+``): completed when unambiguous.
_STEP_NAMES = ("batch", "extern", "interactive")


def _complete_step(step: Optional[str]) -> Optional[str]:
    if step and step.endswith("+"):
        candidates = [s for s in _STEP_NAMES if s.startswith(step[:-1])]
        if len(candidates) == 1:
            return candidates[0]
    return step


def row_from_fields(cols: Mapping[str, str]) -> Optional[SacctRow]:
    """A row from its columns by field name (any format's reader ends here); None without a job id."""
    cols = dict(cols)
    match = _JOBID_RE.match(cols.get("JobID", "").strip())
    if not match:
        return None
    state, by = normalize_state(cols.get("State", ""))
    status, signal = parse_exit_code(cols.get("ExitCode", ""))
    het = match.group("het")
    step = _complete_step(match.group("step"))
    job_id = cols["JobID"].strip()
    if step != match.group("step"):
        job_id = job_id[:len(job_id) - len(match.group("step"))] + str(step)
    return SacctRow(job_id=job_id, base_id=match.group("base"), array_task=match.group("task"),
                    het_offset=int(het) if het is not None else None, step=step,
                    state=state, cancelled_by=by, exit_status=status, signal=signal, fields=cols)


@dataclass(frozen=True)
class Attempt:
    """One run of a job: its allocation row(s) (several for a heterogeneous job) and its steps."""

    job_id: str
    """The job key: ``123``, ``12_3`` (array task) or ``12`` (heterogeneous job)."""
    index: int
    """0 for the first attempt, 1 after the first requeue, ... (position in ``sacct -D`` order)."""
    allocations: Tuple[SacctRow, ...]
    steps: Tuple[SacctRow, ...] = ()

    @cached_property  # an Attempt never changes; the watcher reads this tens of thousands of times a tick
    def primary(self) -> Optional[SacctRow]:
        """The allocation row that explains the attempt (the worst component of a heterogeneous job)."""
        rows = self.allocations or tuple(s for s in self.steps if s.step == "batch") or self.steps
        if not rows:
            return None
        return min(rows, key=lambda r: _STATE_WEIGHT.get(r.state, len(_STATE_WEIGHT)))

    @property
    def state(self) -> str:
        return self.primary.state if self.primary else ""

    @property
    def oom_step(self) -> Optional[SacctRow]:
        """The first step the cgroup OOM killer ended (``12.batch``/``12.0`` OUT_OF_MEMORY 0:125). It says
        *host OOM* even when the allocation row reads ``FAILED 1:0`` (the batch script exited 1 after
        its srun step was killed)."""
        return next((s for s in self.steps if s.state == "OUT_OF_MEMORY"), None)

    @property
    def cancelled_by(self) -> Optional[str]:
        return self.primary.cancelled_by if self.primary else None

    @property
    def exit_code(self) -> str:
        return self.primary.exit_code if self.primary else ""

    @property
    def rows(self) -> Tuple[SacctRow, ...]:
        return self.allocations + self.steps

    @property
    def nodes(self) -> List[str]:
        seen: Dict[str, None] = {}
        for row in self.allocations or self.steps:
            for node in row.nodes:
                seen.setdefault(node, None)
        return list(seen)

    @property
    def start(self) -> str:
        return self.primary.get("Start") if self.primary else ""

    @property
    def end(self) -> str:
        return self.primary.get("End") if self.primary else ""

    @property
    def job_name(self) -> str:
        return self.primary.get("JobName") if self.primary else ""

    def with_step(self, row: SacctRow) -> "Attempt":
        return Attempt(self.job_id, self.index, self.allocations, self.steps + (row,))

    def with_allocation(self, row: SacctRow) -> "Attempt":
        return Attempt(self.job_id, self.index, self.allocations + (row,), self.steps)


def group_attempts(rows: Iterable[SacctRow]) -> Dict[str, List[Attempt]]:
    """Rows -> ``{job key: [attempt, ...]}`` (oldest attempt first, keys in order of appearance).

    An allocation row starts a new attempt of its job, except the components ``+1``, ``+2``... of a
    heterogeneous job, which join the attempt their ``+0`` row started. A step row belongs to the
    newest attempt of its job seen so far (sacct prints an attempt's steps right after it); steps seen
    before any allocation row of their job (a hand-sorted paste) wait for it, so that its first
    allocation row still reads them (a step's OUT_OF_MEMORY decides the cause).
    """
    jobs: Dict[str, List[Attempt]] = {}
    for row in rows:
        attempts = jobs.setdefault(row.job_key, [])
        if row.step is None:
            joins_het = row.het_offset not in (None, 0) and attempts and any(
                a.het_offset is not None for a in attempts[-1].allocations)
            adopts_steps = attempts and not attempts[-1].allocations  # steps printed before their allocation
            if joins_het or adopts_steps:
                attempts[-1] = attempts[-1].with_allocation(row)
            else:
                attempts.append(Attempt(row.job_key, len(attempts), (row,)))
        elif attempts:
            attempts[-1] = attempts[-1].with_step(row)
        else:  # a step whose allocation row sacct did not print: keep it, its state still counts
            attempts.append(Attempt(row.job_key, 0, (), (row,)))
    return jobs


def job_key_of(job_id: str) -> str:
    """The key :func:`group_attempts` files ``job_id`` under: ``12+1`` -> ``12``, ``123.batch`` -> ``123``."""
    match = _JOBID_RE.match(str(job_id).strip())
    if not match:
        return str(job_id).strip()
    return match.group("base") + (f"_{match.group('task')}" if match.group("task") is not None else "")


def attempts_of(rows: Sequence[SacctRow], job_id: str) -> List[Attempt]:
    """Every attempt of ``job_id`` in ``rows`` (oldest first); ``[]`` if sacct has no row for it."""
    return group_attempts(rows).get(job_key_of(job_id), [])


def latest_attempts(rows: Sequence[SacctRow]) -> Dict[str, Attempt]:
    """``{job key: newest attempt}`` for a batched sacct reply covering many jobs (one watcher tick)."""
    return {key: attempts[-1] for key, attempts in group_attempts(rows).items() if attempts}


SACCT_TIME = "%Y-%m-%dT%H:%M:%S"
"""sacct's Submit/Eligible/Start/End: local time, whole seconds."""


def sacct_epoch(text: str) -> Optional[float]:
    """sacct's ``2026-12-03T19:17:53`` (local time, whole seconds) as epoch seconds; None for anything else
    (``Unknown``, ``None``, an empty column)."""
    return _epoch(str(text))


@lru_cache(maxsize=65536)
def _epoch(text: str) -> Optional[float]:
    """Cached: the watcher asks for every running run's start time every tick, and strptime is the slow part."""
    try:
        return _dt.datetime.strptime(text, SACCT_TIME).timestamp()
    except ValueError:
        return None

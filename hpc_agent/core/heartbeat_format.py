"""The job's heartbeat: what one rank says about its progress, and the signal that asks it for its stacks.

One rank writes ``heartbeat/rank-RRRRR.json`` in its run directory every ``resilience.heartbeat_s``
seconds from a thread (``launch.heartbeat``); the watcher reads it (``rundir.read_heartbeats``) and judges
it (``diagnosis.hang``). This module is the format both sides share, and nothing else: no torch, no I/O.

All times are the writer's ``time.time()``. The judge compares them with each other where it can
(``written_at - step_at``), so a node whose clock is off does not look hung. The file is untrusted on the
watcher side: :func:`decode` checks every field's type, finiteness and bounds, and raises ValueError.
"""
from __future__ import annotations

import json
import math
import signal
from dataclasses import asdict, dataclass
from typing import Any, Dict, Optional, Tuple

from hpc_agent.core import json_safe

STACK_SIGNAL = signal.SIGURG
"""The signal on which a rank dumps every thread's Python stack into ``stacks/rank-R.txt`` (faulthandler).
SIGURG's default action is to ignore it, so sending it to a process that has not registered yet (still
importing) is harmless; NCCL uses SIGUSR1, and hpc_agent uses SIGUSR2/SIGTERM for preemption."""
STACK_SIGNAL_NAME = "URG"  # for ``scancel --signal=URG``

PHASES = ("starting", "loading", "training", "evaluating", "saving", "done")
RECENT_STEPS = 20  # durations kept in ``recent_step_s``

MAX_BYTES = 8 << 10          # a beat is ~500 bytes; anything near this is not one
MAX_TEXT = 256               # job id, host
MAX_INT = 1 << 53            # steps, pids, ranks: exact in a JSON number
MAX_TIME = 1e11              # seconds since the epoch (year 5138): a sanity bound, not a policy


@dataclass(frozen=True)
class Beat:
    """One rank's progress at ``written_at``. ``step`` counts completed optimizer steps; ``step_at`` is when
    the last one of this attempt completed (None before the first); ``start_step`` is the step this attempt
    resumed from; ``recent_step_s`` holds the durations of up to the 20 latest steps of this attempt."""

    job_id: str
    attempt: int
    rank: int
    world: int
    host: str
    pid: int
    phase: str
    phase_since: float
    step: int
    step_at: Optional[float]
    start_step: int
    recent_step_s: Tuple[float, ...]
    started_at: float
    written_at: float
    interval_s: float

    @property
    def steps_this_attempt(self) -> int:
        return max(0, self.step - self.start_step)


_TEXT = ("job_id", "host", "phase")
_INTS = ("attempt", "rank", "world", "pid", "step", "start_step")
_TIMES = ("phase_since", "started_at", "written_at")


def encode(beat: Beat) -> bytes:
    data: Dict[str, Any] = asdict(beat)
    data["recent_step_s"] = list(beat.recent_step_s)
    return (json.dumps(data, sort_keys=True, allow_nan=False) + "\n").encode()


def _number(name: str, value: Any, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} is {type(value).__name__}, not a number")
    value = float(value)
    if not math.isfinite(value) or not low <= value <= high:
        raise ValueError(f"{name} = {value!r} is out of bounds [{low:g}, {high:g}]")
    return value


def _integer(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} is {type(value).__name__}, not an integer")
    if not 0 <= value <= MAX_INT:
        raise ValueError(f"{name} = {value} is out of bounds")
    return value


def _text(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name} is {type(value).__name__}, not a string")
    if len(value) > MAX_TEXT or not value.isprintable():
        raise ValueError(f"{name} is longer than {MAX_TEXT} characters or holds control characters")
    return value


_FIELDS = tuple(Beat.__dataclass_fields__)
_REAL = (int, float)


def _fast(raw: Any) -> Optional[Beat]:
    """The beat of a well-formed decoded object, checked with the rules of :func:`decode` in a few comparisons;
    None for anything else (then :func:`decode` checks it field by field and names what is wrong). The watcher
    decodes every running rank's beat every tick: this is that path."""
    try:
        if type(raw) is not dict or len(raw) != len(_FIELDS):
            return None
        values = [raw[name] for name in _FIELDS]
    except KeyError:
        return None
    (job_id, attempt, rank, world, host, pid, phase, phase_since, step, step_at, start_step, recent, started_at,
     written_at, interval_s) = values
    for text in (job_id, host, phase):
        if type(text) is not str or len(text) > MAX_TEXT or not text.isprintable():
            return None
    for number in (attempt, rank, world, pid, step, start_step):
        if type(number) is not int or not 0 <= number <= MAX_INT:
            return None
    for moment in (phase_since, started_at, written_at):  # NaN and infinities fail the comparison
        if type(moment) not in _REAL or not 0.0 <= moment <= MAX_TIME:
            return None
    if step_at is not None and (type(step_at) not in _REAL or not 0.0 <= step_at <= MAX_TIME):
        return None
    if type(interval_s) not in _REAL or not 1e-3 <= interval_s <= 86400.0:
        return None
    if type(recent) is not list or len(recent) > RECENT_STEPS:
        return None
    for duration in recent:
        if type(duration) not in _REAL or not 0.0 <= duration <= 1e7:
            return None
    if phase not in PHASES or world < 1 or rank >= world or start_step > step:
        return None
    return Beat(job_id, attempt, rank, world, host, pid, phase, float(phase_since), step,
                None if step_at is None else float(step_at), start_step, tuple(map(float, recent)),
                float(started_at), float(written_at), float(interval_s))


def decode(data: bytes) -> Beat:
    """The beat in ``data``; ValueError on anything malformed or out of bounds (the file is untrusted)."""
    if len(data) > MAX_BYTES:
        raise ValueError(f"a heartbeat is at most {MAX_BYTES} bytes, this one {len(data)}")
    try:
        text = data.decode("utf-8")
    except (UnicodeDecodeError, AttributeError) as exc:
        raise ValueError(f"not UTF-8 text: {exc}") from None
    raw, problem = json_safe.loads(text, _LIMITS)  # bounded depth, never RecursionError
    if problem:
        raise ValueError(problem)
    beat = _fast(raw)
    if beat is not None:
        return beat
    if not isinstance(raw, dict):
        raise ValueError("a heartbeat is a JSON object")
    missing = [name for name in Beat.__dataclass_fields__ if name not in raw]
    if missing:
        raise ValueError(f"missing fields: {', '.join(missing)}")
    fields: Dict[str, Any] = {}
    for name in _TEXT:
        fields[name] = _text(name, raw[name])
    for name in _INTS:
        fields[name] = _integer(name, raw[name])
    for name in _TIMES:
        fields[name] = _number(name, raw[name], 0.0, MAX_TIME)
    fields["step_at"] = None if raw["step_at"] is None else _number("step_at", raw["step_at"], 0.0, MAX_TIME)
    fields["interval_s"] = _number("interval_s", raw["interval_s"], 1e-3, 86400.0)
    recent = raw["recent_step_s"]
    if not isinstance(recent, list) or len(recent) > RECENT_STEPS:
        raise ValueError(f"recent_step_s is a list of at most {RECENT_STEPS} durations")
    fields["recent_step_s"] = tuple(_number("recent_step_s[]", v, 0.0, 1e7) for v in recent)
    beat = Beat(**fields)
    if beat.phase not in PHASES:
        raise ValueError(f"phase {beat.phase!r} is not one of {', '.join(PHASES)}")
    if beat.world < 1 or beat.rank >= beat.world:
        raise ValueError(f"rank {beat.rank} does not fit a world of {beat.world}")
    if beat.start_step > beat.step:
        raise ValueError(f"start_step {beat.start_step} is past step {beat.step}")
    return beat


_LIMITS = json_safe.Limits(max_depth=4, max_line_bytes=MAX_BYTES, max_total_bytes=MAX_BYTES, constants=False)
"""A beat is one flat object with one list: NaN/Infinity and nesting are not ours."""

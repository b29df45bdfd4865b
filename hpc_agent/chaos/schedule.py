"""A chaos schedule: which faults, when. Pure: parsed from a file's data, or made from a seed.

A schedule file (YAML or JSON) is a list of faults, or a mapping with a ``faults`` list::

    faults:
      - {kind: preempt, at_s: 30}
      - {kind: nan, at_s: 90}

``at_s`` counts seconds from the first training step the driver sees. A fault is injected at its
``at_s`` or, if the previous fault has not recovered yet, once it has (``sequential``), so one fault
never lands in the middle of another's recovery unless the bench asks for fixed times.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence

# Faults that end the job and need the watcher (or Slurm) to bring it back.
PREEMPT, HOST_OOM, GPU_OOM, NAN = "preempt", "host_oom", "gpu_oom", "nan"
NODE_FAIL, CTLD_RESTART, WATCHER_KILL, KILL_DURING_SAVE = "node_fail", "slurmctld_restart", "watcher_kill", "kill_during_save"
HANG = "hang"
KINDS = (PREEMPT, HOST_OOM, GPU_OOM, NAN, NODE_FAIL, CTLD_RESTART, WATCHER_KILL, KILL_DURING_SAVE, HANG)
RUNTIME_KINDS = (NAN, GPU_OOM, HOST_OOM, KILL_DURING_SAVE, HANG)
"""Faults delivered through the job's run-time trigger file (launch/chaos_trigger.py). With the driver's
``persistent`` setting ``node_fail`` is one too (a bad node, not a killed slurmd)."""
INTERRUPTING = (PREEMPT, HOST_OOM, GPU_OOM, NAN, NODE_FAIL, KILL_DURING_SAVE, HANG)
"""Faults that end the running attempt: recovery is a new attempt training again."""
DEFAULT_MIX = (PREEMPT, GPU_OOM, NAN, PREEMPT, KILL_DURING_SAVE, HOST_OOM, WATCHER_KILL, CTLD_RESTART, NODE_FAIL)


class ScheduleError(ValueError):
    """A schedule file or seed request that cannot be used (message is for the user)."""


@dataclass(frozen=True)
class Fault:
    kind: str
    at_s: float

    def to_dict(self) -> dict:
        return {"kind": self.kind, "at_s": self.at_s}


def parse_schedule(data: Any) -> List[Fault]:
    """Faults from a schedule file's parsed content, sorted by time; every problem is reported at once."""
    items = data.get("faults") if isinstance(data, dict) else data
    if not isinstance(items, list) or not items:
        raise ScheduleError("a schedule is a non-empty list of faults (or a mapping with a 'faults' list)")
    faults, problems = [], []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            problems.append(f"fault {i + 1}: expected a mapping with kind and at_s, got {item!r}")
            continue
        kind, at_s = item.get("kind"), item.get("at_s")
        unknown = sorted(set(item) - {"kind", "at_s"})
        if kind not in KINDS:
            problems.append(f"fault {i + 1}: kind {kind!r} is not one of {', '.join(KINDS)}")
        if isinstance(at_s, bool) or not isinstance(at_s, (int, float)) or at_s < 0:
            problems.append(f"fault {i + 1}: at_s must be a number of seconds >= 0, got {at_s!r}")
        if unknown:
            problems.append(f"fault {i + 1}: unknown keys {', '.join(unknown)}")
        if kind in KINDS and isinstance(at_s, (int, float)) and not isinstance(at_s, bool) and at_s >= 0:
            faults.append(Fault(kind, float(at_s)))
    if problems:
        raise ScheduleError("; ".join(problems))
    return sorted(faults, key=lambda f: f.at_s)


def load_schedule_text(text: str) -> List[Fault]:
    """YAML or JSON text (JSON is YAML) -> faults."""
    from hpc_agent.config.problems import ConfigError
    from hpc_agent.config.yaml_safe import parse_text

    try:  # the configs' safe reader: no aliases (no bombs), no tags, bounded
        data = parse_text(text, "schedule")
    except ConfigError as exc:
        raise ScheduleError(f"not valid YAML/JSON: {'; '.join(map(str, exc.problems))}") from None
    return parse_schedule(data)


def from_seed(seed: int, count: int, every_s: float, kinds: Optional[Sequence[str]] = None,
              jitter: float = 0.2, first_s: Optional[float] = None) -> List[Fault]:
    """``count`` faults about ``every_s`` apart (+-``jitter`` of it), kinds drawn from ``kinds`` so that
    each kind appears before any repeats (a shuffled cycle). The same seed gives the same schedule."""
    kinds = list(kinds or DEFAULT_MIX)
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ScheduleError(f"unknown fault kinds {', '.join(bad)}; choose from {', '.join(KINDS)}")
    if count < 1 or every_s <= 0 or not 0 <= jitter < 1:
        raise ScheduleError("need count >= 1, every_s > 0 and 0 <= jitter < 1")
    rng = random.Random(seed)
    order: List[str] = []
    while len(order) < count:
        cycle = list(dict.fromkeys(kinds))
        rng.shuffle(cycle)
        order += cycle
    start = every_s if first_s is None else first_s
    out = []
    for i, kind in enumerate(order[:count]):
        at = start + i * every_s + rng.uniform(-jitter, jitter) * every_s
        out.append(Fault(kind, round(max(0.0, at), 1)))
    return sorted(out, key=lambda f: f.at_s)


def dumps(faults: Sequence[Fault]) -> str:
    return json.dumps({"faults": [f.to_dict() for f in faults]}, indent=2)

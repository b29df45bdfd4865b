"""Is a live attempt hung? A pure verdict from its ranks' heartbeats, and its ranks' stacks grouped.

:func:`judge` rules (``settings`` has the ``resilience:`` field names; one rank at a time, then the attempt):

1. Only the newest attempt counts: the job id of the latest ``started_at``, and within it the highest
   ``(attempt, started_at)``; beats of other job ids or attempts (files left by an earlier attempt or a
   larger world) are ignored, and so is every beat written before ``attempt_started_at`` (the Slurm start of the attempt being
   judged, watcher clock): those are the previous attempt's. Ranks in phase ``done`` have finished.
2. No beats: once ``now - attempt_started_at > startup_budget_s`` the attempt is a start-up stall (``startup``,
   ``ranks=()``): it never got as far as starting its heartbeat (imports, a held lock, a dead file system).
3. A beat whose ``written_at`` is older than ``max(4 x interval_s, hang_floor_s)`` by ``now`` means its
   writer thread stopped: the process is frozen with the GIL held, or its node or file system is dead
   (``heartbeat_lost``). This is the one rule that compares the writer's clock with the watcher's.
4. Otherwise silence is measured on the writer's own clock (``written_at - <since>``), so a node whose
   clock is off by any amount is judged as if it were right:

   ========================================================  ==================  ================================
   rank is in                                                 since               limit (kind)
   ========================================================  ==================  ================================
   ``saving``                                                 ``phase_since``     ``save_budget_s`` (saving)
   ``evaluating``                                             ``phase_since``     ``eval_budget_s`` (evaluating)
   ``starting``/``loading``, or ``training`` with fewer than  ``started_at``      ``startup_budget_s`` (startup)
   ``max(1, hang_warmup_steps)`` steps done this attempt
   ``training`` after the warm-up                             the later of        ``max(hang_factor x median of
                                                              ``step_at`` and     recent steps after the warm-up,
                                                              ``phase_since``     hang_floor_s)`` (step)
   ========================================================  ==================  ================================

   So a long evaluation, a big save, a slow first step (``torch.compile``) each get their own budget, slow
   but steady steps raise their own limit, and the return to ``training`` after an evaluation or a save
   restarts the step clock.
5. The attempt is hung when any rank is past its limit. A lost heartbeat wins (it names the frozen rank;
   the others are likely waiting on it in a collective), else the rank furthest past its limit gives the
   kind; ``ranks`` lists every rank stuck with that verdict.

:func:`group_stacks` reads faulthandler dumps (``stacks/rank-R.txt``) and groups ranks by where their main
thread is: ByteRobust's way to find the odd rank out without localizing the fault exactly.
"""
from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from hpc_agent.core.heartbeat_format import Beat

KINDS = ("step", "startup", "saving", "evaluating", "heartbeat_lost")
LOST_BEATS = 4  # heartbeats missed before the writer counts as gone


@dataclass(frozen=True)
class HangVerdict:
    kind: str
    silent_s: float
    limit_s: float
    step: Optional[int]
    ranks: Tuple[int, ...]
    reason: str


@dataclass(frozen=True)
class _Stuck:
    rank: int
    kind: str
    silent_s: float
    limit_s: float
    step: int
    phase: str


def _newest_attempt(beats: Iterable[Any], attempt_started_at: Optional[float]) -> List[Beat]:
    current = [b for b in beats if isinstance(b, Beat) and b.phase != "done"]
    if attempt_started_at is not None:
        current = [b for b in current if b.written_at >= attempt_started_at]
    if not current:
        return []
    # The job of the latest start (a resubmission is a new job id whose restart count begins at 0 again),
    # then that job's highest (attempt, started_at): within one job the restart count orders attempts even
    # where node clocks disagree.
    job_id = max(current, key=lambda b: b.started_at).job_id
    newest = max((b for b in current if b.job_id == job_id), key=lambda b: (b.attempt, b.started_at))
    return sorted((b for b in current if b.job_id == job_id and b.attempt == newest.attempt), key=lambda b: b.rank)


def step_limit(beat: Beat, settings: Any) -> float:
    """The silence after which a rank past its warm-up is stuck in a step (rule 4, last row)."""
    warmup = int(settings.hang_warmup_steps)
    after_warmup = max(0, beat.steps_this_attempt - warmup)  # recent_step_s ends at the newest step
    kept = beat.recent_step_s[-after_warmup:] if after_warmup else ()
    recent = [s for s in kept if math.isfinite(s)]
    median = statistics.median(recent) if recent else 0.0
    return max(float(settings.hang_factor) * median, float(settings.hang_floor_s))


def _rank_state(beat: Beat, now: float, settings: Any) -> Optional[_Stuck]:
    """Whether this one rank is past its limit, and which (rules 3 and 4)."""
    lost_limit = max(LOST_BEATS * beat.interval_s, float(settings.hang_floor_s))
    if now - beat.written_at > lost_limit:
        return _Stuck(beat.rank, "heartbeat_lost", now - beat.written_at, lost_limit, beat.step, beat.phase)
    if beat.phase == "saving":
        kind, since, limit = "saving", beat.phase_since, float(settings.save_budget_s)
    elif beat.phase == "evaluating":
        kind, since, limit = "evaluating", beat.phase_since, float(settings.eval_budget_s)
    elif beat.phase != "training" or beat.step_at is None \
            or beat.steps_this_attempt < max(1, int(settings.hang_warmup_steps)):
        kind, since, limit = "startup", beat.started_at, float(settings.startup_budget_s)
    else:
        kind, since, limit = "step", max(beat.step_at, beat.phase_since), step_limit(beat, settings)
    silent = beat.written_at - since
    return _Stuck(beat.rank, kind, silent, limit, beat.step, beat.phase) if silent > limit else None


def judge(beats: Sequence[Any], now: float, attempt_started_at: Optional[float], settings: Any) -> Optional[HangVerdict]:
    """The verdict on the newest attempt, or None while it is making progress (see the module doc)."""
    current = _newest_attempt(beats, attempt_started_at)
    if not current:
        if attempt_started_at is not None and now - attempt_started_at > float(settings.startup_budget_s):
            silent = now - attempt_started_at
            return HangVerdict("startup", silent, float(settings.startup_budget_s), None, (),
                               f"no heartbeat since the attempt started {silent:.0f} s ago (start-up budget "
                               f"{float(settings.startup_budget_s):.0f} s): stuck before training began")
        return None
    stuck = [s for s in (_rank_state(b, now, settings) for b in current) if s is not None]
    if not stuck:
        return None
    lost = [s for s in stuck if s.kind == "heartbeat_lost"]
    chosen = lost or [max(stuck, key=lambda s: s.silent_s / s.limit_s if s.limit_s > 0 else math.inf)]
    kind = chosen[0].kind
    same = lost or [s for s in stuck if s.kind == kind]
    worst = max(same, key=lambda s: s.silent_s)
    ranks = tuple(s.rank for s in same)
    step = min(s.step for s in same)
    return HangVerdict(kind, worst.silent_s, worst.limit_s, step, ranks,
                       _reason(kind, worst, ranks, len(current), len(stuck) - len(same)))


def _reason(kind: str, worst: _Stuck, ranks: Tuple[int, ...], world: int, others: int) -> str:
    who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {_span(ranks)}"
    of = f" of {world}"
    head = {
        "heartbeat_lost": f"{who}{of} stopped writing its heartbeat {worst.silent_s:.0f} s ago (limit "
                          f"{worst.limit_s:.0f} s; phase {worst.phase}, step {worst.step}): process frozen, "
                          "or its node or file system is gone",
        "step": f"{who}{of} made no step for {worst.silent_s:.0f} s after step {worst.step} (limit "
                f"{worst.limit_s:.0f} s from the recent step times)",
        "startup": f"{who}{of} still starting {worst.silent_s:.0f} s after the attempt began (phase "
                   f"{worst.phase}, step {worst.step}; start-up budget {worst.limit_s:.0f} s)",
        "saving": f"{who}{of} saving a checkpoint for {worst.silent_s:.0f} s at step {worst.step} (save budget "
                  f"{worst.limit_s:.0f} s)",
        "evaluating": f"{who}{of} evaluating for {worst.silent_s:.0f} s at step {worst.step} (eval budget "
                      f"{worst.limit_s:.0f} s)",
    }[kind]
    return head + (f"; {others} more rank(s) stuck otherwise" if others else "")


def _span(ranks: Sequence[int]) -> str:
    shown = ", ".join(str(r) for r in ranks[:8])
    return shown + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")


# --- stacks ------------------------------------------------------------------------------------------------
_HEADER = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):\s*$")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+|\?\?\?) in (.*?)\s*$')
SIGNATURE_FRAMES = 3


@dataclass(frozen=True)
class StackGroups:
    groups: Dict[str, Tuple[int, ...]]
    majority: str
    outliers: Tuple[int, ...]
    top_frame: str


def parse_dumps(text: str) -> List[List[List[str]]]:
    """faulthandler text -> dumps -> threads -> frames ("file:line in func", innermost first). A new dump
    starts at a thread header that no blank line precedes (faulthandler separates the threads of one dump
    by a blank line and nothing else), or at a thread id seen already in the current dump."""
    dumps: List[List[List[str]]] = []
    seen: set = set()
    blank_before = True
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header:
            if not dumps or not blank_before or header.group(2) in seen:
                dumps.append([])
                seen = set()
            seen.add(header.group(2))
            dumps[-1].append([])
        else:
            frame = _FRAME.match(line)
            if frame and dumps and dumps[-1]:
                dumps[-1][-1].append(f"{frame.group(1)}:{frame.group(2)} in {frame.group(3)}")
        blank_before = not line.strip()
    return [dump for dump in dumps if any(dump)]


def main_thread(text: str) -> Optional[List[str]]:
    """The main thread's frames in the newest dump: the thread with a ``<module>`` frame, else the first."""
    dumps = parse_dumps(text)
    if not dumps:
        return None
    threads = dumps[-1]
    for frames in threads:
        if any(frame.endswith(" in <module>") for frame in frames):
            return frames
    return threads[0]


def group_stacks(stacks: Mapping[int, str]) -> StackGroups:
    """Ranks grouped by the signature (innermost SIGNATURE_FRAMES frames) of their main thread. The majority
    is the biggest group (ties: the one holding the lowest rank); outliers are the ranks of groups smaller
    than it, none when the biggest size is shared. Ranks without a parsable dump are in no group."""
    by_signature: Dict[str, List[int]] = defaultdict(list)
    innermost: Dict[str, str] = {}
    for rank in sorted(stacks):
        frames = main_thread(stacks[rank] or "")
        if not frames:
            continue
        signature = " <- ".join(frames[:SIGNATURE_FRAMES])
        by_signature[signature].append(rank)
        innermost.setdefault(signature, frames[0])
    if not by_signature:
        return StackGroups({}, "", (), "")
    groups = {sig: tuple(ranks) for sig, ranks in by_signature.items()}
    biggest = max(len(r) for r in groups.values())
    majority = min((sig for sig, r in groups.items() if len(r) == biggest), key=lambda sig: groups[sig][0])
    tied = sum(1 for r in groups.values() if len(r) == biggest) > 1
    outliers = () if tied else tuple(sorted(r for sig, rs in groups.items() if sig != majority for r in rs))
    return StackGroups(groups, majority, outliers, innermost[majority])

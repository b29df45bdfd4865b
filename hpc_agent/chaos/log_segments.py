"""Attempts and steps as the job logs show them. Pure: log texts in, segments out.

Every attempt that trains prints ``[hpc_agent] attempt N: training steps A..B`` before its first step
and ``[hpc_agent] step S loss ...`` for each logged step, so the logs of a run's jobs (in job order;
a requeued job appends to its own log) split into segments, one per attempt that trained. An in-job repair
(``[hpc_agent] in-job repair K of B: ...``, ``launch/recovery.py``) rebuilds the engine inside the same attempt
and resumes from a checkpoint (``resumed at step R``) or from the start: the steps after it are a new segment
of the same attempt, so a repair reads like a recovery that needed no new job.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, List, Optional, Tuple

from hpc_agent.diagnosis.logscan import IN_JOB_REPAIR_MARKER

_HEADER = re.compile(r"\[hpc_agent\] attempt (\d+): training steps (\d+)\.\.(\d+)")
_STEP = re.compile(r"\[hpc_agent\] step (\d+) loss ")
_DONE = re.compile(r"\[hpc_agent\] done: (\d+) steps")
_RESUMED = re.compile(r"\[hpc_agent\] resumed at step (\d+) ")


@dataclass(frozen=True)
class Segment:
    """One attempt that trained: it resumed after ``start_step - 1`` and logged up to ``last_step``."""

    attempt: int
    start_step: int
    last_step: Optional[int]
    """The last step logged; None while it has logged none."""

    @property
    def resumed_from(self) -> int:
        return self.start_step - 1


@dataclass(frozen=True)
class Progress:
    segments: Tuple[Segment, ...]
    done: bool
    """A log says ``done: N steps`` (the final checkpoint was written)."""

    @property
    def last_step(self) -> int:
        return max((s.last_step for s in self.segments if s.last_step is not None), default=0)

    @property
    def training(self) -> Optional[Segment]:
        """The newest segment if it has logged a step (the attempt that trains now or trained last)."""
        return self.segments[-1] if self.segments and self.segments[-1].last_step is not None else None


def parse_progress(texts: Iterable[str]) -> Progress:
    """Segments from the logs of a run's jobs, given in job order."""
    segments: List[Segment] = []
    done = False
    for text in texts:
        repaired = False  # an in-job repair was logged; its resume (or first step) opens the next segment
        for line in text.splitlines():
            header = _HEADER.search(line)
            if header:
                segments.append(Segment(int(header.group(1)), int(header.group(2)), None))
                repaired = False
                continue
            if segments and IN_JOB_REPAIR_MARKER.search(line):
                repaired = True
                continue
            resumed = _RESUMED.search(line) if repaired else None
            if resumed:
                segments.append(Segment(segments[-1].attempt, int(resumed.group(1)) + 1, None))
                repaired = False
                continue
            step = _STEP.search(line)
            if step and segments:
                if repaired:  # no checkpoint to roll back to: the repair started over from step 1
                    segments.append(Segment(segments[-1].attempt, 1, None))
                    repaired = False
                last = segments[-1]
                segments[-1] = Segment(last.attempt, last.start_step, int(step.group(1)))
                continue
            if _DONE.search(line):
                done = True
    return Progress(tuple(segments), done)


def recovered_segment(before: Progress, now: Progress) -> Optional[Tuple[Segment, Segment]]:
    """``(hit, new)`` once an attempt newer than the ones ``before`` knew has logged a step: ``hit`` is
    the segment the fault ended (as the logs show it now, including steps it logged after the
    injection), ``new`` the first segment after it that trained. None while there is none."""
    index = len(before.segments)
    later = [s for s in now.segments[index:] if s.last_step is not None]
    if not later or index == 0:
        return None
    return now.segments[index - 1], later[0]


def steps_lost(hit: Segment, new: Segment) -> int:
    """Steps trained by the ended attempt that the next one trains again (0 if it resumed at its last step)."""
    return max(0, (hit.last_step or hit.resumed_from) - new.resumed_from)

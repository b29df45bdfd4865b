"""Live progress of runs, rendered: pure (a :class:`RunView` in, lines out), so it is table-tested.

``submit --wait``, ``sweep`` and ``chaos`` show the same lines: where a job waits in the queue and why
(squeue's reason and its position among the partition's pending jobs by priority), how far a running job
is (step N of M, steps/s and the ETA from its heartbeats), the last cause the watcher found and what it
decided, and the final state. Gathering the views is I/O and lives in ``hpc_agent/runs/progress.py``.

Two ways to show them: :class:`PlainPrinter` (a log or a pipe: one line per change, never per poll, never
ANSI) and :class:`RichPrinter` (a TTY: one live block redrawn in place, ``rich.live``). Login-node code.
"""
from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, TextIO, Tuple

from hpc_agent.runs.liveness import duration

QUEUED = ("PENDING", "REQUEUED", "REQUEUE_HOLD", "CONFIGURING")


@dataclass(frozen=True)
class RunView:
    """What is known about one run right now; every field but ``label`` may be unknown (None or "")."""

    label: str                        # "run quickstart-2026...", "trial 3"
    job_id: str = ""
    state: str = ""                   # Slurm's state of the run's newest job
    reason: str = ""                  # squeue %r while it is pending ("Resources", "Priority", ...)
    position: Optional[int] = None    # 1-based place among the partition's pending jobs, by priority
    queued: Optional[int] = None      # how many jobs pend in that partition
    partition: str = ""
    step: Optional[int] = None
    max_steps: Optional[int] = None
    rate: Optional[float] = None      # steps per second (the newest heartbeat's recent step times)
    job_phase: str = ""               # the job's own phase in its heartbeat (loading, training, saving ...)
    cause: str = ""                   # the watcher's last diagnosis of an ended attempt
    decision: str = ""                # ... and what it did about it
    phase: str = ""                   # the run's phase in the ledger (pending, running, stopped ...)
    final: str = ""                   # set once the run is over: its true final state


def eta_s(view: RunView) -> Optional[float]:
    if view.step is None or not view.max_steps or not view.rate or view.rate <= 0:
        return None
    return max(0, view.max_steps - view.step) / view.rate


def status_line(view: RunView) -> str:
    """The one line that says where the run is: final, queued (reason, position) or running (step, rate, ETA)."""
    job = f"job {view.job_id} " if view.job_id else ""
    if view.final:
        return f"{view.label}: {job}finished {view.final}" + (f" (run {view.phase})" if view.phase else "")
    if view.state in QUEUED or (not view.state and view.phase in ("submitting", "pending")):
        text = f"{view.label}: {job}{view.state or 'PENDING'}"
        if view.reason and view.reason != "None":  # squeue's "None": not yet looked at by the scheduler
            text += f", reason {view.reason}"
        if view.position is not None:
            text += f", position {view.position}" + (f" of {view.queued}" if view.queued else "") + \
                    (f" in {view.partition}" if view.partition else "")
        return text
    text = f"{view.label}: {job}{view.state or view.phase or 'UNKNOWN'}"
    if view.step is None:
        return text + (f", {view.job_phase}" if view.job_phase else ", no step yet")
    text += f", step {view.step}" + (f" of {view.max_steps}" if view.max_steps else "")
    if view.max_steps:
        text += f" ({100 * min(view.step, view.max_steps) // view.max_steps}%)"
    if view.job_phase == "done" or view.state not in ("", "RUNNING", "COMPLETING"):
        return text  # the attempt ended (FAILED at step 2 ...): a rate and an ETA would be a lie
    if view.rate:
        text += f", {view.rate:.3g} steps/s"
    eta = eta_s(view)
    if eta is not None:
        text += f", ETA {duration(eta)}"
    if view.job_phase and view.job_phase != "training":
        text += f" ({view.job_phase})"
    return text


def decision_line(view: RunView) -> str:
    """The watcher's last cause and decision, or "" before it decided anything."""
    if not view.cause and not view.decision:
        return ""
    return f"{view.label}: last cause {view.cause or '?'}, decision {view.decision or '?'}"


def lines(view: RunView) -> List[str]:
    return [text for text in (status_line(view), decision_line(view)) if text]


def change_key(view: RunView) -> Tuple:
    """What makes a plain line worth printing: anything but the step count and its rate (those are
    throttled by :class:`PlainPrinter`, or a running job would print a line every poll)."""
    return (view.job_id, view.state, view.reason, view.position, view.phase, view.job_phase, view.step is None,
            view.final)


class PlainPrinter:
    """Non-TTY output: a line when a run's state, reason, place, cause or decision changes; a running job's
    step line at most every ``every_s`` seconds. No ANSI, ever."""

    def __init__(self, write: Callable[[str], None], every_s: float = 10.0):
        self.write, self.every_s = write, every_s
        self._key: Dict[str, Tuple] = {}
        self._said: Dict[str, str] = {}
        self._status: Dict[str, str] = {}
        self._step_at: Dict[str, float] = {}
        self._step: Dict[str, Optional[int]] = {}

    def update(self, views: Sequence[RunView], now: float) -> List[str]:
        out: List[str] = []
        for view in views:
            status, decided = status_line(view), decision_line(view)
            key = change_key(view)
            # A change that does not show (the ledger's pending -> running under an unchanged line) is no line.
            changed = self._key.get(view.label) != key and self._status.get(view.label) != status
            stepped = view.step is not None and view.step != self._step.get(view.label) and \
                now - self._step_at.get(view.label, float("-inf")) >= self.every_s
            if changed or stepped:
                out.append(status)
                self._key[view.label], self._step[view.label], self._status[view.label] = key, view.step, status
                self._step_at[view.label] = now
            if decided and self._said.get(view.label) != decided:
                out.append(decided)
                self._said[view.label] = decided
        for line in out:
            self.write(line)
        return out

    def close(self) -> None:
        pass


class RichPrinter:
    """TTY output: every run's lines in one block that ``rich.live`` redraws in place."""

    def __init__(self, stream: TextIO):
        from rich.console import Console
        from rich.live import Live

        self.console = Console(file=stream)
        self.live = Live(console=self.console, refresh_per_second=4, transient=False)
        self.live.start()

    def update(self, views: Sequence[RunView], now: float) -> List[str]:
        from rich.text import Text

        shown = [line for view in views for line in lines(view)]
        self.live.update(Text("\n".join(shown)))
        return shown

    def close(self) -> None:
        self.live.stop()


def chatter() -> Callable[[str], None]:
    """Where progress lines go: the ``hpc_agent`` logger when a command configured it (``cli.flags``: ``-q``
    silences progress, never the result), else stdout."""
    log = logging.getLogger("hpc_agent.runs.progress")
    if logging.getLogger("hpc_agent").handlers:
        return log.info
    return lambda text: print(text, flush=True)


def make_printer(stream: Optional[TextIO] = None, every_s: float = 10.0):
    """Rich on a terminal, plain lines otherwise (a pipe, a file, CI, or rich missing); nothing under ``-q``."""
    if stream is None and logging.getLogger("hpc_agent").handlers and \
            not logging.getLogger("hpc_agent.runs.progress").isEnabledFor(logging.INFO):
        return PlainPrinter(lambda text: None, every_s)
    if getattr(stream or sys.stdout, "isatty", lambda: False)():
        try:
            return RichPrinter(stream or sys.stdout)
        except ImportError:
            pass
    write = chatter() if stream is None else (lambda text: print(text, file=stream, flush=True))
    # A clock on each line: a log read later must say when the job started or was preempted.
    return PlainPrinter(lambda text: write(f"[{time.strftime('%H:%M:%S')}] {text}"), every_s)

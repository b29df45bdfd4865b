"""What a sweep driver does on each turn besides ask/tell: the embedded watcher and the live progress.

A sweep never waits on a watcher that is not there: on each turn it steps an
:class:`hpc_agent.watcher.embedded.EmbeddedWatch`, which ticks the watcher in this process when no watcher
holds the runs root's lease, and only observes when one does. Failed trials are therefore judged (and
told FAIL) within a few polls. Then every followed trial's progress is shown (``hpc_agent.runs.progress``).
The final summary counts both the study's trial states and the trials' runs' phases in the ledger.
"""
from __future__ import annotations

from typing import Dict, Optional, TextIO

from hpc_agent.runs.progress import Tracker
from hpc_agent.runs.progress_view import chatter, make_printer
from hpc_agent.sweep.trial_attrs import A_RUN_ID
from hpc_agent.watcher.embedded import EmbeddedWatch


class SweepLive:
    """The driver's ``on_poll``: step the embedded watcher, then show the followed trials."""

    def __init__(self, driver, slurm, poll_s: float = 2.0, stream: Optional[TextIO] = None):
        self.driver = driver
        self.embedded = EmbeddedWatch(driver.runs_root, slurm=slurm, interval_s=poll_s, out=chatter())
        self.printer = make_printer(stream)
        self.tracker = Tracker(driver.ledger, slurm, self.printer)

    def __call__(self) -> None:
        self.embedded.step()
        followed = sorted(self.driver.followed.items())
        if followed:
            self.tracker.show([(f"trial {number}", f.run_id) for number, f in followed])

    def close(self) -> None:
        try:
            self.printer.close()
        finally:
            self.embedded.close()


def run_phases(driver) -> Dict[str, int]:
    """How many of the study's trials' runs are in each ledger phase (trials never submitted: not counted)."""
    out: Dict[str, int] = {}
    for trial in driver.study.get_trials(deepcopy=False):
        run_id = trial.user_attrs.get(A_RUN_ID)
        run = driver.ledger.run(run_id) if run_id else None
        if run is not None:
            out[run.phase] = out.get(run.phase, 0) + 1
    return out


def summary(driver) -> str:
    """``trials {'FAIL': 2}; runs {'stopped': 2}``: the study's word and the ledger's, side by side."""
    return f"trials {driver.counts()}; runs {run_phases(driver)}"

"""``submit --wait``, on Slurm or the local executor: wait for the run's true end, repaired on the way, with live
progress.

The run is over when the watcher says so in the ledger (completed, stopped, or parked in
needs_attention), not when its first job leaves the queue or its process exits: a preempted job is requeued,
an OOM-ed one resubmitted as a new job (a local one as a new local process), and the wait follows the run's
newest job. A local job is never sent to squeue or sacct: its state comes from its process and files. The watcher is whichever holds the
runs root's lease, else this process's own (``hpc_agent.watcher.embedded``): nothing waits on a watcher
that is not there. Under the kill switch nobody decides, so the wait ends once Slurm's state is final.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Optional, TextIO, Tuple

from hpc_agent.runs.progress import Tracker
from hpc_agent.runs.progress_view import chatter, make_printer
from hpc_agent.state import killswitch
from hpc_agent.watcher.embedded import EmbeddedWatch

FINAL_PHASES = frozenset({"completed", "stopped", "needs_attention"})
SLURM_FINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED",
                         "BOOT_FAIL", "DEADLINE"})


def final_state(phase: str, slurm_state: str) -> str:
    """The run's final state in Slurm's words: COMPLETED only when the run completed; a parked run says so."""
    if phase == "completed":
        return "COMPLETED"
    state = slurm_state or "UNKNOWN"
    if state == "COMPLETED":  # the job ended 0 but the run did not complete (e.g. stopped): not a success
        state = "COMPLETED (run not completed)"
    return f"{state} (needs attention)" if phase == "needs_attention" else state


def wait_run(runs_root: Path, run_id: str, timeout_s: float, *, slurm=None, poll_s: float = 2.0,
             out: Optional[Callable[[str], None]] = None, stream: Optional[TextIO] = None) -> Tuple[str, str, str]:
    """Wait for the run; returns (its final state, the newest job id, the run's phase). On the timeout the
    state is the job's current one (RUNNING, PENDING ...)."""
    from hpc_agent.state.ledger import Ledger
    from hpc_agent.slurm.cli import SlurmCLI

    slurm = slurm or SlurmCLI(timeout_s=60)
    ledger = Ledger.in_runs_root(runs_root)
    latest = ledger.latest_submission(run_id)
    printer = make_printer(stream)
    embedded = EmbeddedWatch(runs_root, slurm=slurm, out=out or chatter(), interval_s=poll_s,
                             node_memory=latest is None or latest.executor != "local")
    tracker = Tracker(ledger, slurm, printer)
    runs = [(f"run {run_id}", run_id)]
    deadline = time.monotonic() + timeout_s
    state, job, phase = "UNKNOWN", "", ""
    try:
        while True:
            embedded.step()
            view = tracker.show(runs)[0]
            job, state, phase = view.job_id or job, view.state or state, view.phase
            paused = killswitch.is_paused(killswitch.pause_path(runs_root))
            if phase in FINAL_PHASES or (paused and state in SLURM_FINAL):
                # Paused: no verdict will come, Slurm's word is the run's state.
                final = final_state(phase, state) if phase in FINAL_PHASES else state
                tracker.show(runs, finals={run_id: final})
                return final, job, phase
            if time.monotonic() >= deadline:
                return state, job, phase
            time.sleep(poll_s)
    finally:
        printer.close()
        embedded.close()
        ledger.close()

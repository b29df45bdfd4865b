"""The job's side of the run-directory lease (``hpc_agent/core/runlease.py``; its rules: ``lease_rules.py``).

Global rank 0 takes ``<run dir>/train.lease`` after the rendezvous and before anything is written into
the run directory, then broadcasts the outcome, so every rank returns the same exit code: another live
job holding the lease ends this attempt with ``EXIT_RUN_DIR_BUSY`` and one line on stderr that
names the holder. While training, a daemon thread renews the heartbeat; the lease is released when
training ends, whatever the exit code (a killed process leaves it to go stale, or to be taken over by
the same job's requeued attempt).
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Optional, Tuple

from hpc_agent.core.exit_codes import EXIT_RUN_DIR_BUSY, EXIT_SIGNALLED_AFTER_CHECKPOINT
from hpc_agent.core.lease_rules import TAKEOVER, LeaseWaitCancelled, RunDirBusy
from hpc_agent.core.rundir import lease_path
from hpc_agent.core.runlease import RunLease
from launch.signals import StopRequest

OK, BUSY, SIGNALLED = "ok", "busy", "signalled"


def take(run_dir: Path, rank: int, broadcast: Callable[[Any], Any], stop: StopRequest,
         say: Callable[[str], None]) -> Tuple[Optional[int], Optional[RunLease]]:
    """(exit code to return now or None to train, the lease rank 0 holds). Every rank must call it."""
    lease: Optional[RunLease] = None
    outcome: Tuple[str, str, int] = (OK, "", 0)
    if rank == 0:
        lease = RunLease(lease_path(run_dir), log=say)
        try:
            verdict = lease.acquire(cancelled=lambda: bool(stop.signum))
        except RunDirBusy as exc:
            outcome, lease = (BUSY, exc.line, 0), None
        except LeaseWaitCancelled:
            outcome, lease = (SIGNALLED, "", stop.signum), None
        else:
            if verdict.action == TAKEOVER:
                say(f"run lease {lease.path}: taken over ({verdict.reason})")
            lease.start_heartbeat(on_lost=lambda holder: print(
                f"[hpc_agent] run lease lost: {lease.path} now names "
                f"{holder.describe(lease.clock()) if holder else 'nobody'}; another attempt may be training in "
                "this run directory", file=sys.stderr, flush=True))
    kind, line, signum = broadcast(outcome)
    if kind == BUSY:
        if rank == 0:
            print(f"[hpc_agent] {line}; exiting {EXIT_RUN_DIR_BUSY}", file=sys.stderr, flush=True)
        return EXIT_RUN_DIR_BUSY, None
    if kind == SIGNALLED:
        if not stop.signum:
            stop.signum = signum
        if rank == 0:
            say(f"signal {signum} while waiting for the run lease: nothing trained; exiting {EXIT_SIGNALLED_AFTER_CHECKPOINT}")
        return EXIT_SIGNALLED_AFTER_CHECKPOINT, None
    return None, lease

"""The kill switch: one pause file per runs root, honoured by everything that acts on Slurm for it.

``python -m hpc_agent.watch --pause`` (or ``python -m hpc_agent.sweep CONFIG SWEEP --pause``) creates
``<runs root>/watch.paused``. The watcher checks it before every tick, again before each run's action and
in each effect it carries out (``hpc_agent/watcher/effects.py``: a paused effect is refused, audited, and
left pending); a sweep driver checks it before every submission, release and cancel, and stops (``Paused``)
with its state kept, so the same sweep command continues after ``--resume``; ``submit`` refuses (exit 5)
before it creates anything; and the job's batch shell neither requeues itself nor hands over to a successor
while it is set (``hpc_agent/core/handback.py``: it exits 75 and the watcher resumes the run after
``--resume``). This module is the one home of the check (the file's name: ``hpc_agent.core.rundir.PAUSE_FILE``,
which the job side reads too). A refusal is recorded as an audit record ``{"action": "refused", ...}``
(:func:`hpc_agent.state.audit.record_refused`) where there is a ledger, and in the job's log in the job.

Only a runs root can be paused: a mistyped path must not "succeed" by creating a directory nobody
watches, so pausing (or resuming) a folder without the runs ledger is a usage error (exit 2).
"""
from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path
from typing import Optional

from hpc_agent.cli import exit_status
from hpc_agent.core.rundir import PAUSE_FILE
from hpc_agent.state.ledger import LEDGER_FILE

EXIT_OK, EXIT_USAGE, EXIT_PAUSED = exit_status.OK, exit_status.USAGE, exit_status.PAUSED


class Paused(RuntimeError):
    """The runs root is paused: stop before the next action (nothing half-done is left behind)."""

    def __init__(self, pause_file: Path, before: str):
        self.pause_file, self.before = pause_file, before
        super().__init__(f"paused: {pause_file} exists (the kill switch); stopped before {before}")


def pause_path(runs_root: Path) -> Path:
    return Path(runs_root) / PAUSE_FILE


def is_paused(pause_file: Path) -> bool:
    """Any entry at that name pauses, even a dangling link: a kill switch fails towards stopping."""
    return os.path.lexists(pause_file)


def check(runs_root: Path, before: str) -> None:
    """Raise :class:`Paused` when the runs root is paused; call it right before each action."""
    path = pause_path(runs_root)
    if is_paused(path):
        raise Paused(path, before)


def not_a_runs_root(runs_root: Path) -> Optional[str]:
    """Why ``runs_root`` cannot be paused (None when it is a runs root: a folder holding the ledger)."""
    root = Path(runs_root)
    if not root.exists():
        return f"{root} does not exist"
    if not root.is_dir():
        return f"{root} is not a directory"
    if not (root / LEDGER_FILE).is_file():
        return f"{root} holds no {LEDGER_FILE}, so it is not a runs root (nothing was ever submitted there)"
    return None


def switch(runs_root: Path, pause: bool, out=print, err=lambda text: print(text, file=sys.stderr)) -> int:
    """``--pause`` / ``--resume`` for a CLI: 0 when done, 2 (nothing created) when the root is not a runs root."""
    from hpc_agent.core.fsutil import atomic_write_text

    problem = not_a_runs_root(runs_root)
    if problem is not None:
        err(f"cannot {'pause' if pause else 'resume'}: {problem}. Expected a runs root (the folder with "
            f"{LEDGER_FILE}); pass --runs-root DIR, or check run.runs_root in the config.")
        return EXIT_USAGE
    path = pause_path(runs_root)
    if pause:
        atomic_write_text(path, f"paused at {time.ctime()} by {os.environ.get('USER', '?')}@{socket.gethostname()} "
                                f"pid {os.getpid()}\n")
        out(f"paused: {path} exists; the watcher and every sweep driver on {runs_root} take no action "
            "until `--resume`")
    else:
        path.unlink(missing_ok=True)
        out("resumed: the watcher acts again from its next tick; run a stopped sweep's command again to continue")
    return EXIT_OK

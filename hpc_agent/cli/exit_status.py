"""The exit codes of every ``hpc-agent`` command: one table, one meaning per code (docs/cli.md).

Before this table, 3 meant "sbatch refused" to submit, "another watcher holds the lease" to watch and "Slurm
error" to sweep, and 4 and 5 had two meanings each. A script that runs several commands now reads a code the
same way whichever command returned it. These are the *commands'* codes; the training *job's* exit codes
(72 env_error, 75 hand-back, ...) are another table: ``hpc_agent.core.exit_codes``, docs/exit_codes.md.
"""
from __future__ import annotations

from typing import Dict, Tuple

OK = 0
FAILED = 1
USAGE = 2
SLURM = 3
BUSY = 4
PAUSED = 5
WONT_FIT = 6
REMOTE = 255  # ssh's own code; hpc_agent.remote.ssh passes it through

TABLE: Dict[int, Tuple[str, str]] = {
    OK: ("OK", "success: done, submitted, every check passed, or stopped cleanly by a signal"),
    FAILED: ("FAILED", "the command ran and found a failure: the job failed (submit --wait), a doctor check "
                       "FAILed, chaos lost something, prepare --check found an op to build or a build failed, "
                       "review/status/diagnose met a run whose job-written files could not be read (each named "
                       "on stderr; the other runs were shown)"),
    USAGE: ("USAGE", "usage or config error (bad arguments, invalid config, not a runs root, unknown run, "
                     "missing extra); nothing was done"),
    SLURM: ("SLURM", "Slurm refused or did not answer (sbatch refused or timed out, no sbatch on PATH); "
                     "a timed-out sbatch may still have queued the job: the watcher settles it"),
    BUSY: ("BUSY", "another process holds the runs root or the sweep (a watcher's lease, a sweep driver's "
                   "lock); nothing was done: try later, or watch --wait-for-lease"),
    PAUSED: ("PAUSED", "the kill switch is on (watch --pause): stopped with its state kept; after "
                       "watch --resume run the same command again"),
    WONT_FIT: ("WONT_FIT", "submit: the memory estimate exceeds the GPU's memory, or --place auto found no "
                           "partition that can run the job; nothing was submitted (the message names the cheapest "
                           "change that fits; --force submits anyway)"),
    REMOTE: ("REMOTE", "--remote: ssh could not connect or the connection broke (ssh's own code 255); whether "
                       "the command ran on the login node is unknown: check with status --remote"),
}


BY_COMMAND: Dict[str, Tuple[int, ...]] = {
    "submit": (OK, FAILED, USAGE, SLURM, PAUSED, WONT_FIT, REMOTE),  # FAILED: --wait's job failed, or copying the code failed
    "watch": (OK, USAGE, BUSY),
    "diagnose": (OK, FAILED, USAGE, REMOTE),  # OK also when Slurm does not answer: the report says unknown (wait)
    "review": (OK, FAILED, USAGE, REMOTE),
    "status": (OK, FAILED, USAGE, REMOTE),
    "cancel": (OK, USAGE, SLURM),  # USAGE: an unknown run, or one not under Slurm; SLURM: squeue/scancel failed
    "doctor": (OK, FAILED, USAGE),
    "sweep": (OK, USAGE, SLURM, BUSY, PAUSED),
    "chaos": (OK, FAILED, USAGE),
    "prepare": (OK, FAILED, USAGE, BUSY),  # BUSY: another prepare held the ops' lock past the wait
    "export": (OK, USAGE),
    "init": (OK, USAGE),
    "config": (OK, USAGE),
}
"""The codes each command can return (tests/unit/test_exit_status.py runs each one; docs/cli.md lists them)."""


def markdown_table() -> str:
    """The table as docs/cli.md shows it (a test keeps the page and this module in sync)."""
    rows = ["| code | name | meaning |", "| --- | --- | --- |"]
    rows += [f"| {code} | `{name}` | {meaning} |" for code, (name, meaning) in TABLE.items()]
    return "\n".join(rows)


def commands_markdown() -> str:
    """Which command returns which codes, as docs/cli.md shows it."""
    rows = ["| command | exit codes |", "| --- | --- |"]
    rows += [f"| `{name}` | {', '.join(f'{c} `{TABLE[c][0]}`' for c in codes)} |" for name, codes in BY_COMMAND.items()]
    return "\n".join(rows)


def epilog(*codes: int) -> str:
    """A command's ``--help`` line for the codes it can return."""
    return "Exit codes: " + ", ".join(f"{code} {TABLE[code][0].lower()}" for code in codes) + " (docs/cli.md)."

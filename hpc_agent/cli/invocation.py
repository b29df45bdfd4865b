"""How a command runs as a process: the name its usage line shows (``prog``) and what it does when its reader
goes away (``run``). Every command's ``build_parser`` takes its ``prog`` from here, and every process entry point
(``hpc-agent``, each ``python -m hpc_agent.<command>``) goes through :func:`run`.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable, Optional, Sequence

CONSOLE_SCRIPT = "hpc-agent"
PIPE_CLOSED = 141
"""The exit status when stdout's reader closed early (``hpc-agent config | head``): 128 + SIGPIPE, what a shell
reports for ``git log | head`` and ``yes | head``, which die of SIGPIPE when head stops reading. Not 0: the output
was cut short, and a script under ``set -o pipefail`` tells the two apart as it does for git and coreutils. Not a
signal death: the number is the same whichever shell or Python parent reads it, and nothing is printed."""


def prog(command: str, argv0: Optional[str] = None) -> str:
    """``command``'s name in its usage line, as the user started the process: ``hpc-agent submit`` under the
    console script, ``python -m hpc_agent submit`` under the front door's module, else ``python -m
    hpc_agent.submit``. ``argv0`` defaults to ``sys.argv[0]``."""
    started = Path(sys.argv[0] if argv0 is None and sys.argv else argv0 or "")
    if started.name in (CONSOLE_SCRIPT, f"{CONSOLE_SCRIPT}.exe"):
        return f"{CONSOLE_SCRIPT} {command}"
    if started.name == "__main__.py" and started.parent.name == "hpc_agent":
        return f"python -m hpc_agent {command}"
    return f"python -m hpc_agent.{command}"


def run(main: Callable[..., Optional[int]], argv: Optional[Sequence[str]] = None) -> int:
    """``main(argv)``'s exit code, with stdout flushed. When stdout's reader has gone (a ``| head`` that read what
    it wanted), no ``BrokenPipeError`` traceback: stdout is pointed at /dev/null, so that the interpreter's own
    flush at exit cannot fail again, and the code is :data:`PIPE_CLOSED`."""
    try:
        try:
            return int(main(argv) or 0)
        finally:  # also after argparse's SystemExit (--help | head): what is still buffered is written here
            sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return PIPE_CLOSED

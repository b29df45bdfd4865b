"""What every ``hpc-agent`` command shares: ``--version``, ``-v``/``-q`` and, for the commands that talk to
Slurm, ``--clusters`` (docs/cli.md).

Each command's ``build_parser`` calls :func:`add_common_arguments` and its ``main`` calls :func:`configure`
right after parsing. Progress and diagnostic chatter goes through stdlib ``logging`` (the ``hpc_agent``
logger tree), results stay ``print()``: ``-q`` silences the chatter and never the answer a user asked for.
"""
from __future__ import annotations

import argparse
import logging
import os
import platform
import re
import sys
from typing import List, Optional, Sequence, Tuple

from hpc_agent import __version__
from hpc_agent.slurm.cli import CLUSTERS_ENV, clusters

LOGGER = "hpc_agent"
_CLUSTER_NAMES = re.compile(r"^[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*$")


class _StreamsHandler(logging.Handler):
    """INFO and DEBUG to stdout, WARNING and above to stderr: the streams this chatter used as ``print()``,
    so the default output is what users saw before. The stream is looked up per record, not bound at
    set-up: pytest's capture and a caller's redirection replace ``sys.stdout`` after ``configure``. With
    ``chatter_on_stderr`` every line goes to stderr: stdout then carries only what the command was asked for
    (``submit --script-only > job.sh``)."""

    def __init__(self, chatter_on_stderr: bool = False):
        super().__init__()
        self.chatter_on_stderr = chatter_on_stderr

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
            if record.levelno < logging.INFO:
                text = f"[debug {record.name}] {text}"
            stream = sys.stderr if record.levelno >= logging.WARNING or self.chatter_on_stderr else sys.stdout
            stream.write(text + "\n")
            stream.flush()  # a log that is tailed, or read after a kill -9, must not sit in a buffer
        except Exception:  # noqa: BLE001 - a closed pipe: chatter is never worth a traceback over the result
            pass


def version_line() -> str:
    """What ``--version`` prints, the same for every command (they ship together)."""
    return f"hpc_agent {__version__}"


def _cluster_names(value: str) -> str:
    """``--clusters`` goes into the argv of every Slurm command: names only, never an option or a path."""
    value = value.strip()
    if not _CLUSTER_NAMES.match(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not NAME or NAME,NAME (letters, digits, '_', '-', '.')")
    return value


def add_common_arguments(parser: argparse.ArgumentParser, slurm: bool = False) -> argparse.ArgumentParser:
    """``--version``, ``-v``/``-q`` and, with ``slurm``, ``--clusters``; returns ``parser``."""
    parser.add_argument("--version", action="version", version=version_line())
    group = parser.add_mutually_exclusive_group()
    group.add_argument("-v", "--verbose", action="count", default=0,
                       help="more detail: debug lines (each Slurm command run, with its exit status and time)")
    group.add_argument("-q", "--quiet", action="store_true", help="only warnings, errors and results")
    if slurm:
        parser.add_argument("--clusters", metavar="NAME[,NAME]", type=_cluster_names, default=None,
                            help=f"Slurm cluster(s) every Slurm command of this run addresses (their -M); "
                                 f"default ${CLUSTERS_ENV}, else Slurm's default cluster")
    return parser


def configure_logging(args: argparse.Namespace, chatter_on_stderr: bool = False) -> None:
    """The ``hpc_agent`` logger at INFO (today's output), DEBUG with ``-v``, WARNING with ``-q``. Idempotent:
    a command whose main calls another's (submit --wait runs diagnose) replaces the handler, never adds one.
    ``chatter_on_stderr``: INFO and DEBUG lines too go to stderr (see _StreamsHandler)."""
    level = (logging.DEBUG if getattr(args, "verbose", 0) else
             logging.WARNING if getattr(args, "quiet", False) else logging.INFO)
    logger = logging.getLogger(LOGGER)
    for handler in [h for h in logger.handlers if isinstance(h, _StreamsHandler)]:
        logger.removeHandler(handler)
    logger.addHandler(_StreamsHandler(chatter_on_stderr))
    logger.setLevel(level)
    logger.propagate = False  # a root handler (optuna's, a user's basicConfig) would print every line twice


def configure(args: argparse.Namespace, chatter_on_stderr: bool = False) -> None:
    """Logging, then ``--clusters``: kept in the environment, so that every SlurmCLI of this process and every
    hpc_agent process it starts (chaos's submit and watcher) address the same cluster."""
    configure_logging(args, chatter_on_stderr)
    if getattr(args, "clusters", None):
        os.environ[CLUSTERS_ENV] = args.clusters
    logging.getLogger(LOGGER).debug("hpc_agent %s, Python %s, %s; Slurm clusters: %s", __version__,
                                    platform.python_version(), sys.executable, clusters() or "Slurm's default")


def parse(parser: argparse.ArgumentParser, argv: Optional[Sequence[str]]) -> Tuple[Optional[argparse.Namespace], int]:
    """Parse and :func:`configure`; ``(None, code)`` where argparse exits (``--help``/``--version`` 0, a usage
    error 2), so a main can return that code instead of raising SystemExit past an in-process caller."""
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return None, int(exc.code or 0)
    configure(args)
    return args, 0


def passthrough(args: argparse.Namespace) -> List[str]:
    """The ``-v``/``-q`` flags to hand a command this one runs in-process (its main configures logging again)."""
    if getattr(args, "quiet", False):
        return ["-q"]
    return ["-v"] * int(getattr(args, "verbose", 0) or 0)


class _ReadCapAction(argparse.Action):
    """``--read-cap KEY=N``, repeatable: each one applied to ``args.read_caps`` (a ReadCaps)."""

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            setattr(namespace, self.dest, getattr(namespace, self.dest).with_overrides([values]))
        except ValueError as exc:
            raise argparse.ArgumentError(self, str(exc)) from None


def add_read_cap_argument(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``--read-cap KEY=N`` (repeatable) -> ``args.read_caps``: how much of each run directory the command reads
    (hpc_agent/core/read_caps.py, one docstring per cap; e.g. ``--read-cap rank_logs=32``)."""
    from hpc_agent.core.read_caps import DEFAULT_CAPS, ReadCaps

    names = ", ".join(ReadCaps.__dataclass_fields__)
    parser.add_argument("--read-cap", dest="read_caps", action=_ReadCapAction, default=DEFAULT_CAPS, metavar="KEY=N",
                        help=f"cap on what is read of each run directory (repeatable; KEY: {names}; defaults: "
                             f"rank_logs={DEFAULT_CAPS.rank_logs}, event_files={DEFAULT_CAPS.event_files})")
    return parser

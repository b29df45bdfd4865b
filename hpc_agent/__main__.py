"""``hpc-agent <command> ...``: one entry point whose subcommands are the ``python -m hpc_agent.<command>`` modules."""
from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import List, Optional

from hpc_agent.cli import exit_status, invocation
from hpc_agent.core.extras import MissingExtra

COMMANDS = {
    "submit": "validate a config and submit it to Slurm (or run it locally)",
    "watch": "follow runs, diagnose failures and requeue with an adjusted config",
    "diagnose": "explain why a job died and what to do",
    "status": "one line per run: phase, job, Slurm state, step, last decision, last step's age",
    "review": "tables and plots of runs; start TensorBoard",
    "cancel": "stop a run: cancel its current Slurm job and any held job of its hand-overs",
    "doctor": "check Slurm, GPUs and a config's memory estimate before submitting",
    "sweep": "hyperparameter sweeps with Optuna",
    "chaos": "inject faults into a real run and check that the watcher recovers from each, with nothing lost",
    "prepare": "build the DeepSpeed ops jobs load, once, so that no job compiles",
    "config": "print the config reference; --list or --copy DIR: the shipped configs and templates",
    "export": "one checkpoint of a run as model.safetensors + config.json + README.md",
    "init": "start a project here: a starter hpc_agent.yaml and sbatch_templates/ to edit",
}


def _available() -> List[str]:
    found = []
    for name in COMMANDS:
        if importlib.util.find_spec(f"hpc_agent.{name}") is not None:
            found.append(name)
    return found


def _usage() -> str:
    lines = ["usage: hpc-agent <command> [args...]   (same as python -m hpc_agent.<command>)", "", "commands:"]
    lines += [f"  {name:<10} {COMMANDS[name]}" for name in _available()]
    lines += ["", "Run 'hpc-agent <command> --help' for a command's options. Every command takes --version, "
              "-v/-q, and the exit codes mean the same in all of them (docs/cli.md)."]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    """The console script's entry point: a closed stdout ends it quietly (hpc_agent.cli.invocation.run)."""
    return invocation.run(_dispatch, argv)


def _dispatch(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return exit_status.OK
    if argv[0] == "--version":
        from hpc_agent.cli.flags import version_line

        print(version_line())
        return exit_status.OK
    command, rest = argv[0], argv[1:]
    if command not in _available():
        print(f"hpc-agent: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return exit_status.USAGE
    module = importlib.import_module(f"hpc_agent.{command}")
    if not hasattr(module, "main"):  # a package (hpc_agent.sweep, hpc_agent.config): its CLI is its __main__ module
        module = importlib.import_module(f"hpc_agent.{command}.__main__")
    try:
        return int(module.main(rest) or 0)
    except MissingExtra as exc:  # a feature whose pip extra is not installed: one line, no traceback
        print(exc, file=sys.stderr)
        return exit_status.USAGE


if __name__ == "__main__":
    sys.exit(main())

"""``hpc-agent <command> ...``: one entry point whose subcommands are the ``python -m hpc_agent.<command>`` modules."""
from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import List, Optional

COMMANDS = {
    "submit": "validate a config and submit it to Slurm (or run it locally)",
    "watch": "follow runs, diagnose failures and requeue with an adjusted config",
    "diagnose": "explain why a job died and what to do",
    "review": "tables and plots of runs; start TensorBoard",
    "doctor": "check Slurm, GPUs and a config's memory estimate before submitting",
    "sweep": "hyperparameter sweeps with Optuna",
    "config": "print the config reference (every key, its default and meaning)",
}


def _available() -> List[str]:
    found = []
    for name in COMMANDS:
        module = "hpc_agent.config.docs" if name == "config" else f"hpc_agent.{name}"
        if importlib.util.find_spec(module) is not None:
            found.append(name)
    return found


def _usage() -> str:
    lines = ["usage: hpc-agent <command> [args...]   (same as python -m hpc_agent.<command>)", "", "commands:"]
    lines += [f"  {name:<10} {COMMANDS[name]}" for name in _available()]
    lines += ["", "Run 'hpc-agent <command> --help' for a command's options."]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    command, rest = argv[0], argv[1:]
    if command not in _available():
        print(f"hpc-agent: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    if command == "config":
        from hpc_agent.config.docs import reference_markdown

        print(reference_markdown())
        return 0
    module = importlib.import_module(f"hpc_agent.{command}")
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())

"""``hpc-agent <command> ...``: one entry point whose subcommands are the ``python -m hpc_agent.<command>`` modules."""
from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import List, Optional

from hpc_agent import exit_status
from hpc_agent.extras import MissingExtra

COMMANDS = {
    "submit": "validate a config and submit it to Slurm (or run it locally)",
    "watch": "follow runs, diagnose failures and requeue with an adjusted config",
    "diagnose": "explain why a job died and what to do",
    "status": "one line per run: phase, job, Slurm state, step, last decision, last step's age",
    "review": "tables and plots of runs; start TensorBoard",
    "doctor": "check Slurm, GPUs and a config's memory estimate before submitting",
    "sweep": "hyperparameter sweeps with Optuna",
    "prepare": "build the DeepSpeed ops jobs load, once, so that no job compiles",
    "config": "print the config reference; --list or --copy DIR: the shipped configs and templates",
    "init": "start a project here: a starter hpc_agent.yaml and sbatch_templates/ to edit",
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
    lines += ["", "Run 'hpc-agent <command> --help' for a command's options. Every command takes --version, "
              "-v/-q, and the exit codes mean the same in all of them (docs/cli.md)."]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return exit_status.OK
    if argv[0] == "--version":
        from hpc_agent.cli_common import version_line

        print(version_line())
        return exit_status.OK
    command, rest = argv[0], argv[1:]
    if command not in _available():
        print(f"hpc-agent: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return exit_status.USAGE
    if command == "config":
        return config_command(rest)
    module = importlib.import_module(f"hpc_agent.{command}")
    if not hasattr(module, "main"):  # a package (hpc_agent.sweep): its CLI is its __main__ module
        module = importlib.import_module(f"hpc_agent.{command}.__main__")
    try:
        return int(module.main(rest) or 0)
    except MissingExtra as exc:  # a feature whose pip extra is not installed: one line, no traceback
        print(exc, file=sys.stderr)
        return exit_status.USAGE


def config_command(argv: List[str]) -> int:
    """``hpc-agent config``: the reference; ``--list`` the shipped files; ``--copy DIR`` copies them to edit.

    A wheel install keeps the shipped configs inside site-packages; ``--copy`` gives a user an editable
    copy, which ``HPC_AGENT_HOME`` then makes the one that config and template names resolve in."""
    import argparse

    from hpc_agent import paths

    parser = argparse.ArgumentParser(prog="hpc-agent config", description=COMMANDS["config"])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--list", action="store_true", help="list the shipped configs and sbatch templates")
    group.add_argument("--copy", metavar="DIR", help=f"copy {' and '.join(paths.FOLDERS)} into DIR (never overwrites)")
    from hpc_agent.cli_common import add_common_arguments, configure

    args = add_common_arguments(parser).parse_args(argv)
    configure(args)
    home = paths.shipped_home()
    if args.list:
        for folder in paths.FOLDERS:
            print(f"{home / folder}:")
            for file in sorted((home / folder).glob("*.yaml")):
                print(f"  {file.stem}")
        return 0
    if args.copy:
        return copy_shipped(home, Path(args.copy).expanduser())
    from hpc_agent.config.docs import reference_markdown

    print(reference_markdown())
    return 0


def copy_shipped(home: Path, dest: Path) -> int:
    import shutil

    from hpc_agent import paths

    # rglob: configs/profiles/ (the shipped cluster profiles) comes along, at the same place
    pairs = [(file, dest / folder / file.relative_to(home / folder)) for folder in paths.FOLDERS
             for file in sorted((home / folder).rglob("*.yaml"))]
    existing = [str(target) for _, target in pairs if target.exists()]
    if existing:
        print(f"hpc-agent config: not copying, these files exist: {', '.join(existing)}", file=sys.stderr)
        return exit_status.USAGE
    for source, target in pairs:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    print(f"copied {len(pairs)} files from {home} to {dest}")
    print(f"to use them by name (python -m hpc_agent.submit quickstart): export {paths.HOME_ENV}={dest.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""python -m hpc_agent.config [--list | --copy DIR | --update-docs]  (``hpc-agent config``)

Prints the config reference, generated from the schema's field docstrings (``hpc_agent/config/docs.py``);
``--list`` the shipped configs and sbatch templates; ``--copy DIR`` copies them to edit.

A wheel install keeps the shipped configs inside site-packages; ``--copy`` gives a user an editable copy, which
``HPC_AGENT_HOME`` then makes the one that config and template names resolve in. ``--update-docs`` (for a
checkout) rewrites the reference section of ``docs/config.md``.
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import List, Optional

from hpc_agent.cli import exit_status, invocation
from hpc_agent.cli.flags import add_common_arguments, configure
from hpc_agent.core import paths

DESCRIPTION = "print the config reference; --list or --copy DIR: the shipped configs and templates"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=invocation.prog("config"), description=DESCRIPTION,
                                     epilog=exit_status.epilog(*exit_status.BY_COMMAND["config"]))
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--list", action="store_true", help="list the shipped configs and sbatch templates")
    group.add_argument("--copy", metavar="DIR", help=f"copy {' and '.join(paths.FOLDERS)} into DIR (never overwrites)")
    group.add_argument("--update-docs", action="store_true",
                       help="rewrite the reference section of docs/config.md (in a checkout)")
    return add_common_arguments(parser)


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    configure(args)
    home = paths.shipped_home()
    if args.list:
        for folder in paths.FOLDERS:
            print(f"{home / folder}:")
            for file in sorted((home / folder).glob("*.yaml")):
                print(f"  {file.stem}")
        return exit_status.OK
    if args.copy:
        return copy_shipped(home, Path(args.copy).expanduser())
    from hpc_agent.config.docs import reference_markdown, update_readme

    if args.update_docs:
        target = Path(__file__).resolve().parents[2] / "docs" / "config.md"
        if not target.is_file():
            print(f"hpc-agent config: {target} not found (--update-docs needs a checkout)", file=sys.stderr)
            return exit_status.USAGE
        print(f"{target}: {'updated' if update_readme(target) else 'already current'}")
        return exit_status.OK
    print(reference_markdown())
    return exit_status.OK


def copy_shipped(home: Path, dest: Path) -> int:
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
    return exit_status.OK


if __name__ == "__main__":
    sys.exit(invocation.run(main))

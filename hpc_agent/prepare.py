"""python -m hpc_agent.prepare [--op NAME ...] [--ops-dir DIR] [--force] [--check]

Builds, once and outside any Slurm job, the DeepSpeed C++ ops that training jobs load, so that no job
ever compiles (``hpc_agent/core/ops_cache.py`` says why and where they go). Run it with the Python the jobs
use (your virtualenv), on a machine like the compute nodes (same CPU generation or older; for GPU ops, a
GPU node or a login node with the CUDA toolkit: ``srun --gpus=1 python -m hpc_agent.prepare``).
``scripts/setup.sh`` runs it. Re-running it is cheap: ops already prepared are kept.

Exit codes (``hpc_agent.cli.exit_status``, shared by every command): 0 prepared (or, with --check, everything
already prepared), 1 --check found something to prepare or a build failed, 2 torch/DeepSpeed are missing or
an unknown --op: nothing was built, 4 another prepare held the ops' lock too long (the message says what to do).
Unlike the other login-node commands this one imports torch and DeepSpeed: it exists to build against them.
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Optional, Sequence

from hpc_agent.cli import exit_status, invocation
from hpc_agent.cli.flags import add_common_arguments, configure
from hpc_agent.core.ops_cache import DEFAULT_OPS, OPS_DIR_ENV, find_prepared, ops_dir, read_cpu_flags

log = logging.getLogger("hpc_agent.prepare")  # not __name__: under python -m it is __main__, outside the tree


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=invocation.prog("prepare"),
        description="Build the DeepSpeed ops that training jobs load, so that no job compiles anything.",
        epilog="Examples: python -m hpc_agent.prepare | python -m hpc_agent.prepare --op cpu_adam | "
               f"{OPS_DIR_ENV}=/shared/ds_ops python -m hpc_agent.prepare")
    parser.add_argument("--op", action="append", default=[], metavar="NAME",
                        help="an op to prepare (DeepSpeed's name, e.g. cpu_adam, or a builder class name); "
                             "repeat; default: the ops hpc_agent jobs use on this accelerator")
    parser.add_argument("--ops-dir", type=Path, help=f"where to put them (default: ${OPS_DIR_ENV}, else "
                                                     "<virtualenv>/share/hpc_agent/deepspeed_ops); jobs must "
                                                     f"see the same directory, so set {OPS_DIR_ENV} for them too")
    parser.add_argument("--force", action="store_true", help="rebuild even what is already prepared")
    parser.add_argument("--check", action="store_true", help="build nothing: exit 0 if every op is prepared, else 1")
    return add_common_arguments(parser)


def say(text: str) -> None:
    log.info("[prepare] %s", text)  # progress: -q leaves only errors


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    configure(args)
    try:
        from launch import ops
    except ImportError as exc:  # torch or deepspeed missing: say so instead of a traceback
        print(f"prepare: cannot import torch/DeepSpeed ({exc}); install hpc_agent with its dependencies first "
              "(bash scripts/setup.sh, or see docs/install.md)", file=sys.stderr)
        return exit_status.USAGE
    root = args.ops_dir or ops_dir()
    try:
        runtime = ops.current_runtime()
        names = args.op or DEFAULT_OPS.get(runtime.accelerator, [])
        if args.check:
            flags = read_cpu_flags()
            missing = [(b.name, why) for b in ops.resolve_builders(names)
                       for path, why in [find_prepared(b.name, runtime, root, flags)] if path is None]
            for name, why in missing:
                say(f"{name}: not prepared ({why})")
            say("all prepared" if not missing else "run: python -m hpc_agent.prepare" +
                (f" --ops-dir {root}" if args.ops_dir else ""))
            return exit_status.FAILED if missing else exit_status.OK
        prepared = ops.prepare(names, root, force=args.force, log=say)
        problems = ops.verify(sorted(prepared), root)
    except (ValueError, RuntimeError, TimeoutError, OSError) as exc:
        print(f"prepare: {exc}", file=sys.stderr)
        # an unknown --op is a usage error; another prepare holding the ops' lock past the wait is busy
        return (exit_status.USAGE if isinstance(exc, ValueError) else
                exit_status.BUSY if isinstance(exc, TimeoutError) else exit_status.FAILED)
    if problems:
        print(f"prepare: the built ops do not load the way a job loads them: {'; '.join(problems)}", file=sys.stderr)
        return exit_status.FAILED
    say(f"ready: {', '.join(sorted(prepared)) or 'no op needed'} for {runtime.describe()}; jobs load them from "
        f"{root} and never compile")
    return 0


if __name__ == "__main__":
    sys.exit(invocation.run(main))

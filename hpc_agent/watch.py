"""python -m hpc_agent.watch [--once] [--dry-run] [--interval S] [--runs-root DIR] [--pause | --resume]

Follows every run in the runs root's ledger. Each tick makes one batched ``sacct -D`` call for all
live jobs, diagnoses attempts that ended, and requeues, expedites or resubmits them with a config
adjusted to the cause; every decision goes to the ledger and the run's ``events.jsonl``.

It runs in the foreground, stops cleanly on SIGTERM/SIGINT (after the current tick), and holds a
single-instance lock on ``<runs root>/watch.lock``. ``--pause`` creates ``<runs root>/watch.paused``:
every watcher stops acting within one tick until ``--resume`` removes it.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from hpc_agent.config.load import RUNS_ENV
from hpc_agent.fsutil import hold_lock
from hpc_agent.ledger import Ledger
from hpc_agent.policy import PolicyLimits
from hpc_agent.slurm.cli import SlurmCLI, SlurmError

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_LOCKED = 3
MAX_BACKOFF_S = 300.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hpc_agent.watch",
        description="Follow runs, diagnose ended attempts and requeue or resubmit them with an adjusted config.",
        epilog="Keep it running on a login node with a systemd user unit or scrontab (see README).")
    parser.add_argument("--runs-root", default=os.environ.get(RUNS_ENV, "./runs"),
                        help=f"runs root holding ledger.sqlite (default: ${RUNS_ENV} or ./runs)")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between ticks (default 5)")
    parser.add_argument("--once", action="store_true", help="run one tick (after start-up reconciliation) and exit")
    parser.add_argument("--dry-run", action="store_true", help="print the decisions; change nothing, submit nothing")
    parser.add_argument("--executor", choices=("slurm", "local"), default="slurm",
                        help="how resubmissions are launched (default slurm)")
    parser.add_argument("--max-ticks", type=int, default=0, help="stop after N ticks (0: run until stopped)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--pause", action="store_true", help="kill switch: make every watcher stop acting, then exit")
    group.add_argument("--resume", action="store_true", help="lift --pause, then exit")
    return parser


def largest_node_memory_mb(slurm: SlurmCLI) -> Optional[int]:
    """The most ``--mem`` any node can give (sinfo's RealMemory); None if Slurm does not say."""
    try:
        out = slurm.run(["sinfo", "--noheader", "--format", "%m"], check=False).stdout
    except SlurmError:
        return None
    sizes = [int(tok.rstrip("+")) for tok in out.split() if tok.rstrip("+").isdigit()]
    return max(sizes) if sizes else None


class _Stop:
    def __init__(self) -> None:
        self.requested = False

    def __call__(self, signum: int, frame: object) -> None:
        self.requested = True


def _sleep(seconds: float, stop: _Stop) -> None:
    deadline = time.monotonic() + seconds
    while not stop.requested and time.monotonic() < deadline:
        time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    runs_root = Path(args.runs_root).expanduser().resolve()
    pause_file = runs_root / "watch.paused"
    if args.pause:
        runs_root.mkdir(parents=True, exist_ok=True)
        pause_file.write_text(f"paused at {time.ctime()} by pid {os.getpid()}\n")
        print(f"paused: {pause_file} exists; watchers take no action until `--resume`")
        return EXIT_OK
    if args.resume:
        pause_file.unlink(missing_ok=True)
        print("resumed: watchers act again from their next tick")
        return EXIT_OK
    if args.interval <= 0:
        print("--interval must be positive", file=sys.stderr)
        return EXIT_USAGE
    if not (runs_root / "ledger.sqlite").exists():
        print(f"no ledger at {runs_root / 'ledger.sqlite'} yet: submit a run first, or pass --runs-root", file=sys.stderr)
        if args.once:
            return EXIT_OK
        runs_root.mkdir(parents=True, exist_ok=True)

    # One watcher per runs root: two would both act on the same ended attempt.
    lock = hold_lock(runs_root / "watch.lock")
    if lock is None:
        print(f"another watcher holds {runs_root / 'watch.lock'}; exiting", file=sys.stderr)
        return EXIT_LOCKED

    from hpc_agent.watcher import Watcher

    stop = _Stop()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    ledger = Ledger.in_runs_root(runs_root)
    slurm = SlurmCLI(timeout_s=60)
    watcher = Watcher(ledger, slurm, runs_root=runs_root, dry_run=args.dry_run, executor=args.executor,
                      pause_file=pause_file, limits=PolicyLimits(max_mem_mb=largest_node_memory_mb(slurm)))
    print(f"[watch] following {runs_root} every {args.interval:g} s"
          + (" (dry run: acting on nothing)" if args.dry_run else ""), flush=True)
    if not watcher.paused():
        watcher.reconcile()
    backoff = args.interval
    ticks = 0
    while not stop.requested:
        report = watcher.tick()
        ticks += 1
        sys.stdout.flush()
        if args.once or (args.max_ticks and ticks >= args.max_ticks):
            break
        # Back off while Slurm does not answer (never hammer a struggling slurmctld), reset when it does.
        backoff = min(backoff * 2, MAX_BACKOFF_S) if report.unknown else args.interval
        _sleep(backoff, stop)
    print("[watch] stopped", flush=True)
    ledger.close()
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())

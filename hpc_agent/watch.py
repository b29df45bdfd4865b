"""python -m hpc_agent.watch [--once] [--dry-run] [--interval S] [--runs-root DIR] [--pause | --resume]
                            [--resume-run RUN_ID] [--rebuild-events RUN_ID] [--lease-ttl S] [--wait-for-lease]

Follows every run in the runs root's ledger. Each tick makes one batched ``sacct -D`` call for all
live jobs, diagnoses attempts that ended, and requeues, expedites or resubmits them with a config
adjusted to the cause; every decision goes to the ledger and the run's ``events.jsonl``.

It runs in the foreground, stops cleanly on SIGTERM/SIGINT (after the current tick), and holds the runs
root's watcher lease in the ledger (a heartbeat every tick): a second watcher exits with code 4 (busy) naming
the holder, or with ``--wait-for-lease`` waits until the lease expires and takes over. ``--pause`` creates
``<runs root>/watch.paused`` (``hpc_agent.state.killswitch``): every watcher stops acting within one tick, and
every sweep driver on the root stops before its next submission or cancel, until ``--resume`` removes it.
Pausing or resuming a folder that is not a runs root (no ledger: a mistyped path) exits 2 and creates nothing.
A run the watcher could not follow is parked in ``needs_attention``, and so is a run whose attempts ended without a
known cause twice at the same checkpoint step; ``--resume-run RUN_ID`` puts it back (for the latter, the next tick
requeues its attempt once from the newest checkpoint).
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from hpc_agent.cli import exit_status, invocation
from hpc_agent.cli.flags import add_common_arguments, add_read_cap_argument, configure
from hpc_agent.config.load import RUNS_ENV
from hpc_agent.config.problems import ConfigError
from hpc_agent.core import handback
from hpc_agent.core import filemodes
from hpc_agent.core.filemodes import make_dir
from hpc_agent.policy.decide import PolicyLimits
from hpc_agent.slurm.cli import SBATCH_IN_FLIGHT_S as INTENT_GRACE_S, SlurmCLI, SlurmError
from hpc_agent.slurm.sinfo import max_node_memory_mb, node_memory_argv
from hpc_agent.state import killswitch
from hpc_agent.state.ledger import LEDGER_FILE, Ledger, ledger_problem
from hpc_agent.watcher import notifier

EXIT_OK = exit_status.OK
EXIT_USAGE = exit_status.USAGE
EXIT_LOCKED = exit_status.BUSY  # another watcher holds the runs root's lease (or took it over)
log = logging.getLogger("hpc_agent.watch")  # not __name__: under python -m it is __main__, outside the tree
MAX_BACKOFF_S = 300.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=invocation.prog("watch"),
        description="Follow runs, diagnose ended attempts and requeue or resubmit them with an adjusted config.",
        epilog="Keep it running on a login node with a systemd user unit or scrontab (see docs/watcher.md). "
               + exit_status.epilog(exit_status.OK, exit_status.USAGE, exit_status.BUSY))
    parser.add_argument("--runs-root", default=os.environ.get(RUNS_ENV, "./runs"),
                        help=f"runs root holding ledger.sqlite (default: ${RUNS_ENV} or ./runs)")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between ticks (default 5)")
    parser.add_argument("--once", action="store_true", help="run one tick (after start-up reconciliation) and exit")
    parser.add_argument("--dry-run", action="store_true", help="print the decisions; change nothing, submit nothing")
    parser.add_argument("--max-ticks", type=int, default=0, help="stop after N ticks (0: run until stopped)")
    parser.add_argument("--intent-grace", type=float, default=INTENT_GRACE_S, metavar="S",
                        help="seconds an sbatch may still be in flight after its intent was recorded; an older intent "
                             f"without a job id is settled by asking Slurm for the run's job name (default {INTENT_GRACE_S:g})")
    parser.add_argument("--lease-ttl", type=float, default=60.0,
                        help="seconds without a heartbeat after which another watcher may take over (default 60)")
    parser.add_argument("--wait-for-lease", action="store_true",
                        help="if another watcher holds the runs root, wait for its lease to expire instead of exiting")
    parser.add_argument("--shared-runs-root", action="store_true",
                        help=f"accept a group-writable runs root (a project directory shared on purpose; also "
                             f"{filemodes.SHARED_ROOT_ENV}=1): the watcher then acts only on run directories this user "
                             f"owns and nobody else can write (docs/security.md)")
    add_read_cap_argument(parser)  # --read-cap rank_logs=N ...: how much of a run dir one tick reads
    notifier.add_arguments(parser)  # --notify-webhook/--notify-command: the runs-root default (docs/notifications.md)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--pause", action="store_true",
                       help="kill switch: make every watcher and sweep driver on the runs root stop acting, then "
                            "exit (exit 2 if the folder is not a runs root)")
    group.add_argument("--resume", action="store_true", help="lift --pause, then exit")
    group.add_argument("--resume-run", metavar="RUN_ID", help="follow a run parked in needs_attention again, then exit")
    group.add_argument("--rebuild-events", metavar="RUN_ID",
                       help="rewrite the run's events.jsonl from the ledger's audit journal, then exit")
    group.add_argument("--install-systemd", action="store_true",
                       help="write ~/.config/systemd/user/hpc-agent-watch.service for this runs root and Python, "
                            "print the systemctl command that starts it (or run it with --now), then exit")
    group.add_argument("--print-scrontab", action="store_true",
                       help="print the scrontab entry that keeps this watcher running as a Slurm job, then exit")
    parser.add_argument("--now", action="store_true", help="with --install-systemd: also enable and start the unit")
    return add_common_arguments(parser, slurm=True)


def largest_node_memory_mb(slurm: SlurmCLI) -> Optional[int]:
    """The most ``--mem`` any node can give (sinfo's RealMemory); None if Slurm does not say."""
    try:
        return max_node_memory_mb(slurm.run(node_memory_argv(), check=False).stdout)
    except SlurmError:
        return None


class _Stop:
    def __init__(self) -> None:
        self.requested = False

    def __call__(self, signum: int, frame: object) -> None:
        self.requested = True


def _sleep(seconds: float, stop: _Stop, woken: Callable[[], bool] = lambda: False) -> bool:
    """Sleep; True when ``woken()`` ended it early (checked every 50 ms: one stat)."""
    deadline = time.monotonic() + seconds
    while not stop.requested and time.monotonic() < deadline:
        if woken():
            return True
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
    return False


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    configure(args)
    if args.install_systemd or args.print_scrontab:  # rendered in one place: hpc_agent.watcher.service_files
        from hpc_agent.watcher import service_files

        return service_files.main(args)
    runs_root = Path(args.runs_root).expanduser().resolve()
    pause_file = killswitch.pause_path(runs_root)
    if args.pause or args.resume:
        return killswitch.switch(runs_root, pause=args.pause)
    if args.interval <= 0 or args.lease_ttl <= 0 or args.intent_grace < 0:
        print("--interval and --lease-ttl must be positive, --intent-grace not negative", file=sys.stderr)
        return EXIT_USAGE
    try:
        args.notify_default = notifier.default_from_args(args)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return EXIT_USAGE
    opted_in = args.shared_runs_root or os.environ.get(filemodes.SHARED_ROOT_ENV) == "1"
    shared = filemodes.check_runs_root(runs_root, opted_in) or ledger_problem(runs_root)
    if shared is not None:
        print(shared, file=sys.stderr)
        return EXIT_USAGE
    if not (runs_root / LEDGER_FILE).exists():
        print(f"no ledger at {runs_root / LEDGER_FILE} yet: submit a run first, or pass --runs-root", file=sys.stderr)
        if args.once or args.resume_run or args.rebuild_events:
            return EXIT_OK if args.once else EXIT_USAGE
        make_dir(runs_root)
    ledger = Ledger.in_runs_root(runs_root)
    try:
        if args.resume_run or args.rebuild_events:
            return _one_run_command(ledger, args)
        return _watch(ledger, runs_root, pause_file, args)
    finally:
        ledger.close()


def _one_run_command(ledger: Ledger, args: argparse.Namespace) -> int:
    from hpc_agent.state.journal import Journal
    from hpc_agent.state.lifecycle import Event, EventKind, InvalidTransition

    run_id = args.resume_run or args.rebuild_events
    run = ledger.run(run_id)
    if run is None:
        print(f"no run {run_id!r} in {ledger.path}", file=sys.stderr)
        return EXIT_USAGE
    journal = Journal(ledger)
    if args.rebuild_events:
        n = journal.rebuild_events(run_id, Path(run.run_dir), lambda at: time.strftime("%Y-%m-%dT%H:%M:%S",
                                                                                        time.localtime(at)))
        print(f"{run_id}: events.jsonl rewritten from the journal ({n} records)")
        return EXIT_OK
    try:
        with ledger.transaction():
            ledger.advance(run_id, Event(EventKind.RESUMED))
            journal.add_audit(run_id, {"action": "resumed", "reason": "a person cleared needs_attention"})
    except InvalidTransition:
        print(f"{run_id} is {run.phase}, not needs_attention: nothing to resume", file=sys.stderr)
        return EXIT_USAGE
    print(f"{run_id}: followed again from the next tick")
    return EXIT_OK


def _take_lease(lease, args: argparse.Namespace, stop: "_Stop") -> bool:
    holder = lease.acquire()
    while holder is not None:
        age = lease.ledger.clock() - holder["heartbeat"]
        left = holder["heartbeat"] + holder["ttl"] - lease.ledger.clock()
        text = (f"another watcher follows this runs root: {holder['host']} pid {holder['pid']}, heartbeat "
                f"{age:.0f} s ago; its lease expires in {max(0.0, left):.0f} s unless it renews it")
        if not args.wait_for_lease:
            print(f"{text}. Exiting (use --wait-for-lease to take over when it expires).", file=sys.stderr)
            return False
        log.info("[watch] %s; waiting", text)
        _sleep(min(max(left, 1.0), 10.0), stop)
        if stop.requested:
            return False
        previous, holder = holder, lease.acquire()
        if holder is None:
            log.info("[watch] took the lease over from %s pid %s", previous["host"], previous["pid"])
    return True


def _watch(ledger: Ledger, runs_root: Path, pause_file: Path, args: argparse.Namespace) -> int:
    from hpc_agent.state.journal import LeaseLost, WatcherLease
    from hpc_agent.watcher.loop import Watcher

    stop = _Stop()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    lease = None if args.dry_run else WatcherLease(ledger, ttl_s=args.lease_ttl)
    if lease is not None and not _take_lease(lease, args, stop):
        return EXIT_LOCKED
    slurm = SlurmCLI(timeout_s=60)
    watcher = Watcher(ledger, slurm, runs_root=runs_root, dry_run=args.dry_run,
                      pause_file=pause_file, limits=PolicyLimits(max_mem_mb=largest_node_memory_mb(slurm)), lease=lease,
                      intent_grace_s=args.intent_grace, notify=getattr(args, "notify_default", None),
                      caps=args.read_caps,
                      out=log.info)  # its lines are progress (decisions are in events.jsonl): -q silences them
    log.info(f"[watch] following {runs_root} every {args.interval:g} s; ledger journal {ledger.journal_mode[0]} "
             f"({ledger.journal_mode[1]})" + (" (dry run: acting on nothing)" if args.dry_run else ""))
    try:
        if not watcher.paused():
            watcher.reconcile()
        backoff, ticks = args.interval, 0
        wake = handback.WakeFile(runs_root)  # a job's batch shell touches it right after its requeue
        fast_until = 0.0
        while not stop.requested:
            report = watcher.tick()
            ticks += 1
            sys.stdout.flush()
            if args.once or (args.max_ticks and ticks >= args.max_ticks):
                break
            # Back off while Slurm does not answer (never hammer a struggling slurmctld), reset when it does;
            # poll fast while a job is between its requeue and its expedite (hpc_agent/core/handback.py).
            # sacct can lag slurmctld by a second or more, so a wake also means a few seconds of fast polling.
            hot = report.handing_back or time.monotonic() < fast_until
            fast = min(args.interval, handback.FAST_POLL_S) if hot else args.interval
            backoff = min(backoff * 2, MAX_BACKOFF_S) if report.unknown else fast
            if _sleep_renewing(backoff, stop, lease, wake.touched):
                fast_until = time.monotonic() + handback.FAST_WINDOW_S
    except LeaseLost as exc:
        print(f"[watch] {exc}", file=sys.stderr, flush=True)
        return EXIT_LOCKED
    if lease is not None:
        lease.release()
    log.info("[watch] stopped")
    return EXIT_OK


def _sleep_renewing(seconds: float, stop: "_Stop", lease, woken: Callable[[], bool] = lambda: False) -> bool:
    """Sleep, renewing the lease at least every third of its TTL (a long --interval must not lose it); end
    early, returning True, when ``woken()`` says so."""
    step = seconds if lease is None else max(0.5, min(seconds, lease.ttl_s / 3))
    deadline = time.monotonic() + seconds
    while not stop.requested and time.monotonic() < deadline:
        if _sleep(min(step, deadline - time.monotonic()), stop, woken):
            return True
        if lease is not None and not stop.requested and time.monotonic() < deadline:
            lease.renew()
    return False


if __name__ == "__main__":
    sys.exit(invocation.run(main))

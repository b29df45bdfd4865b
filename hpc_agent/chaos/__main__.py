"""python -m hpc_agent.chaos [CONFIG] [--schedule FILE | --seed N] [--duration S] [key=value ...]

Submits one run (with ``faults.runtime_trigger=true``) to the Slurm cluster, runs the watcher on its
runs root, injects the schedule's faults, waits for each recovery, and stops by itself when the run
completes or ``--duration`` is up. It prints a report (every fault, the detected cause, the decision,
the recovery time, steps lost, the final ETTR) and exits 0 only if nothing was lost: every fault
injected and recovered, zero steps lost on signalled preemptions, the final checkpoint complete and
the TensorBoard step series continuous.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from hpc_agent.cli import exit_status, invocation
from hpc_agent.cli.flags import add_common_arguments, configure
from hpc_agent.core.fsutil import atomic_write_json

EXIT_OK, EXIT_FAILED, EXIT_USAGE = exit_status.OK, exit_status.FAILED, exit_status.USAGE


def build_parser() -> argparse.ArgumentParser:
    from hpc_agent.chaos.schedule import HANG, KINDS

    # A hang is found only after resilience.hang_floor_s (120 s by default): put it in --kinds to have one.
    seed_kinds = [k for k in KINDS if k != HANG]

    p = argparse.ArgumentParser(prog=invocation.prog("chaos"), description=__doc__.split("\n\n")[1].replace("\n", " "),
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("config", nargs="?", default="configs/chaos.yaml", help="the training config to run")
    p.add_argument("overrides", nargs="*", help="key=value config overrides (e.g. train.max_steps=6000)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--schedule", metavar="FILE", help="YAML/JSON schedule: a list of {kind, at_s}")
    src.add_argument("--seed", type=int, default=0, help="make a schedule from this seed (when no --schedule)")
    p.add_argument("--faults", type=int, default=len(seed_kinds), help="number of faults for --seed")
    p.add_argument("--every", type=float, default=45.0, help="seconds between faults for --seed")
    p.add_argument("--kinds", default=",".join(seed_kinds),
                   help=f"comma-separated fault kinds for --seed (default all but {HANG}; choose from {', '.join(KINDS)})")
    p.add_argument("--persistent", action="store_true",
                   help="faults behave as real ones do: an OOM recurs at the same size, a NaN at the same step and LR, "
                        "a bad node stays bad until excluded (node_fail), a hang recurs at the same step on the same "
                        "node (docs/chaos.md)")
    p.add_argument("--duration", type=float, default=1800.0, help="stop after this many seconds whatever happened")
    p.add_argument("--runs-root", default=None, help="runs root for the chaos run (default ./runs/chaos-<time>)")
    p.add_argument("--report-json", metavar="OUT", help="also write the report as JSON")
    p.add_argument("--print-schedule", action="store_true", help="print the schedule and exit")
    return add_common_arguments(p, slurm=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    from hpc_agent.chaos.schedule import ScheduleError, dumps, from_seed, load_schedule_text

    args = build_parser().parse_args(argv)
    configure(args)
    overrides = list(args.overrides)
    if args.config and "=" in args.config:  # only overrides given: keep the default config
        overrides.insert(0, args.config)
        args.config = "configs/chaos.yaml"
    try:
        if args.schedule:
            schedule = load_schedule_text(Path(args.schedule).read_text())
        else:
            schedule = from_seed(args.seed, args.faults, args.every, [k for k in args.kinds.split(",") if k])
    except OSError as exc:
        print(f"chaos: cannot read schedule: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ScheduleError as exc:
        print(f"chaos: bad schedule: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.print_schedule:
        print(dumps(schedule))
        return EXIT_OK
    return run(args.config, overrides, schedule, args.duration, args.runs_root, args.report_json, args.persistent)


def run(config: str, overrides: Sequence[str], schedule, duration: float, runs_root: Optional[str],
        report_json: Optional[str], persistent: bool = False) -> int:
    from hpc_agent.chaos import inject
    from hpc_agent.chaos.campaign import ChaosDriver, Target, submit_run
    from hpc_agent.chaos.report import p3, passed, render
    from hpc_agent.watcher.embedded import describe_holder, lease_holder
    from hpc_agent.state.ledger import Ledger
    from hpc_agent.runs.progress import Tracker
    from hpc_agent.runs.progress_view import make_printer
    from hpc_agent.slurm.cli import SlurmCLI

    root = Path(runs_root or f"runs/chaos-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    try:
        run_dir = submit_run(root, config, overrides)
    except (RuntimeError, ValueError) as exc:
        print(f"chaos: {exc}", file=sys.stderr)
        return EXIT_USAGE
    # One rule with submit --wait and sweep: a watcher that holds the runs root's lease is used; else one is
    # started. Here a process (not embedded): the watcher_kill fault SIGKILLs and restarts it.
    holder = lease_holder(root)
    watcher = None if holder is not None else inject.Watcher(root)
    if watcher is not None:
        watcher.start()
    target = Target("watched", root, run_dir, watcher)
    print(f"chaos: run {run_dir} under the watcher " + (f"(log {watcher.log})" if watcher else
          f"{describe_holder(holder, time.time())} already on {root}") + f"; at most {duration:.0f}s", flush=True)
    ledger = Ledger.in_runs_root(root)
    printer = make_printer()
    tracker = Tracker(ledger, SlurmCLI(timeout_s=60), printer)
    driver = ChaosDriver([target], schedule, duration_s=duration, out=lambda line: print(line, flush=True),
                         on_poll=lambda: tracker.show([(target.name, run_dir.name)]), persistent=persistent)
    try:
        summaries = driver.run()
    finally:
        printer.close()
        ledger.close()
        if watcher is not None:
            watcher.stop()
        _cancel(target)
    print(render(driver.records, summaries))
    print(f"P3 (steps lost per signalled preemption): {p3(driver.records)}")
    if report_json:
        out = {"faults": [r.to_dict() for r in driver.records], "p3": p3(driver.records),
               "targets": [{"name": s.name, "completed": s.completed, "ettr": s.ettr, "productive_s": s.productive_s,
                            "wall_s": s.wall_s, "time_lost": s.time_lost, "checks": [c.__dict__ for c in s.checks]}
                           for s in summaries],
               "run_dir": str(run_dir), "passed": passed(summaries)}
        atomic_write_json(Path(report_json), out)
    return EXIT_OK if passed(summaries) else EXIT_FAILED


def _cancel(target) -> None:
    """Cancel whatever of the run is still queued (a run stopped by --duration)."""
    from hpc_agent.slurm.cli import SlurmCLI, SlurmError

    ids = target.job_ids()
    if ids:
        try:
            SlurmCLI(timeout_s=30).run(["scancel", *ids], check=False)
        except SlurmError:
            pass


if __name__ == "__main__":
    sys.exit(invocation.run(main))

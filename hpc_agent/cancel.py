"""python -m hpc_agent.cancel RUN [--runs-root DIR] [--dry-run] [--json]

Stop a run: cancel its current Slurm job and any other job of the run still queued (a held job a preemption
handed over from, a successor it handed over to), in one ``scancel``.

A run can go through several job ids: at a preemption its job hands over to a successor job
(``resilience.successor_on_preempt``, docs/resilience.md), and the watcher resubmits a failed run as a new job. The
jobs of the run are the ones the ledger records, then the successors each job named in its run directory
(``hpc_agent.core.handback.job_chain``; without a watcher only those say where the run went). ``RUN`` is a run id
as ``hpc-agent status`` lists it, or a run directory. A watcher that follows the run sees the cancel as a person's
and stops following it; cancelling is not refused while the runs root is paused (it stops, it never starts).
Login-node code: no torch.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from hpc_agent.cli import exit_status, invocation
from hpc_agent.cli.flags import add_common_arguments, parse
from hpc_agent.config.load import RUNS_ENV
from hpc_agent.core import handback, rundir

ACTIVE = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD", "RESIZING",
          "SIGNALING", "STAGE_OUT", "REQUEUE_FED", "SPECIAL_EXIT", "STOPPED")
"""squeue's states of a job slurmctld still holds (anything else has ended)."""


class UsageError(Exception):
    """A run that cannot be found or cancelled: the message names the fix."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=invocation.prog("cancel"), description=__doc__.split("\n\n")[1],
                                     epilog=exit_status.epilog(*exit_status.BY_COMMAND["cancel"]))
    parser.add_argument("run", metavar="RUN", help="a run id (as `hpc-agent status` lists it) or a run directory")
    parser.add_argument("--runs-root", default=None, help=f"runs root (default: ${RUNS_ENV} or ./runs)")
    parser.add_argument("--dry-run", action="store_true", help="say which jobs would be cancelled; cancel nothing")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    return add_common_arguments(parser, slurm=True)


def resolve(run: str, runs_root: Path) -> Tuple[str, Path, List[str], str]:
    """(run id, run dir, the run's Slurm job ids in order, its executor) or UsageError."""
    from hpc_agent.state.ledger import LEDGER_FILE, Ledger

    ledger_subs, row = [], None
    candidate = Path(run).expanduser()
    run_dir = candidate if candidate.is_dir() and (rundir.run_json_path(candidate).exists()
                                                   or (candidate.parent / LEDGER_FILE).is_file()) else None
    if run_dir is not None:
        runs_root = run_dir.parent
    if (runs_root / LEDGER_FILE).is_file():
        ledger = Ledger.in_runs_root(runs_root)
        try:
            row = ledger.run(run_dir.name if run_dir is not None else run)
            if row is None and run_dir is not None:
                row = next((r for r in ledger.runs() if Path(r.run_dir).resolve() == run_dir.resolve()), None)
            if row is not None:
                ledger_subs = ledger.submissions(row.run_id)
                run_dir = run_dir or Path(row.run_dir)
        finally:
            ledger.close()
    if run_dir is None and (runs_root / run).is_dir() and os.sep not in run and run not in (".", ".."):
        run_dir = runs_root / run
    if run_dir is None:
        raise UsageError(f"no run {run!r} under {runs_root}: pass a run id as `hpc-agent status --runs-root "
                         f"{runs_root}` lists it, a run directory, or the right --runs-root")
    info, _ = rundir.read_json(rundir.run_json_path(run_dir), within=run_dir)
    info = info if isinstance(info, dict) else {}
    run_id = row.run_id if row is not None else str(info.get("run_id") or run_dir.name)
    executor = (ledger_subs[-1].executor if ledger_subs else str(info.get("executor") or "slurm"))
    known = [s.job_id for s in ledger_subs if s.job_id] or [str(j) for j in info.get("job_ids") or [] if j]
    return run_id, run_dir, handback.job_chain(run_dir, known), executor


def queued(cli, job_ids: Sequence[str]) -> List[Tuple[str, str]]:
    """``[(job id, state)]`` of the jobs slurmctld still holds, from one squeue call."""
    from hpc_agent.slurm.cli import SlurmError

    result = cli.run(["squeue", "--noheader", "--jobs", ",".join(job_ids), "--format", "%i|%T"], check=False)
    if result.returncode != 0:
        if "Invalid job id" in result.stderr:  # every id ended and purged
            return []
        raise SlurmError(f"squeue failed ({result.returncode}): {result.stderr.strip()}")
    out = []
    for line in result.stdout.splitlines():
        job_id, _, state = line.strip().partition("|")
        if job_id in job_ids and state in ACTIVE:
            out.append((job_id, state))
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    args, code = parse(build_parser(), argv)
    if args is None:
        return code
    from hpc_agent.slurm.cli import SlurmCLI, SlurmError

    root = Path(args.runs_root or os.environ.get(RUNS_ENV) or "./runs").expanduser()
    try:
        run_id, run_dir, jobs, executor = resolve(args.run, root)
        if executor == "local":
            raise UsageError(f"run {run_id} runs on the local executor (process {jobs[-1] if jobs else '?'}), not "
                             "under Slurm: stop that process (kill PID), or submit with --executor slurm")
        if not jobs:
            raise UsageError(f"run {run_id} has no Slurm job yet (its submission did not get a job id): nothing "
                             "to cancel; `hpc-agent status` shows its phase")
    except UsageError as exc:
        print(f"cancel: {exc}", file=sys.stderr)
        return exit_status.USAGE
    cli = SlurmCLI(timeout_s=20)
    try:
        live = queued(cli, jobs)
        if live and not args.dry_run:
            cli.run(["scancel", *[j for j, _ in live]])
    except SlurmError as exc:
        print(f"cancel: Slurm did not answer ({exc}); nothing is known to be cancelled: run it again", file=sys.stderr)
        return exit_status.SLURM
    verb = "would cancel" if args.dry_run else "cancelled"
    if args.json:
        print(json.dumps({"run_id": run_id, "jobs": jobs, "current": jobs[-1], "dry_run": args.dry_run,
                          "cancelled": [] if args.dry_run else [j for j, _ in live],
                          "queued": [{"job_id": j, "state": s} for j, s in live]}, indent=2))
    elif live:
        print(f"run {run_id}: {verb} " + ", ".join(f"job {j} ({s.lower()}{', current' if j == jobs[-1] else ''})"
                                                   for j, s in live) + f" of its jobs {', '.join(jobs)}")
    else:
        print(f"run {run_id}: none of its jobs ({', '.join(jobs)}) is queued or running: nothing to cancel")
    return exit_status.OK


if __name__ == "__main__":
    sys.exit(invocation.run(main))

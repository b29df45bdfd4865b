"""python -m hpc_agent.status [--runs-root DIR] [--json] [--remote USER@LOGIN]

One line per run: run id, phase, newest job id (across the run's hand-overs to successor jobs), its state (Slurm's; a local run's from its process and files,
e.g. ``COMPLETED (local)``), step N/M, the last decision (or cause) and
how long ago the last step was. The short answer to "what are my runs doing?"; ``review`` has the details.

Reads what review reads (:func:`hpc_agent.runs.history.review_run`: the ledger, events.jsonl, TensorBoard,
heartbeats) plus one batched ``sacct`` call for every Slurm run's newest job (never one call per run; never
a local run's process id). With
``--remote`` it runs on the login node over ssh (docs/remote.md). Login-node code: no torch.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from hpc_agent.cli import exit_status, invocation
from hpc_agent.cli.flags import add_common_arguments, parse
from hpc_agent.config.load import RUNS_ENV
from hpc_agent.remote import ssh
from hpc_agent.runs.liveness import duration

COLUMNS = (("run", "run_id"), ("phase", "phase"), ("job", "job_id"), ("state", "slurm_state"), ("step", "step"),
           ("last decision", "last"), ("last step", "age"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=invocation.prog("status"), description=__doc__.split("\n\n")[1],
                                     epilog=exit_status.epilog(exit_status.OK, exit_status.USAGE))
    parser.add_argument("--runs-root", default=None, help=f"runs root (default: ${RUNS_ENV} or ./runs)")
    parser.add_argument("--json", action="store_true", help='print {"runs": [...]} instead of the lines')
    ssh.add_arguments(parser)
    return add_common_arguments(parser, slurm=True)


def slurm_states(job_ids: Sequence[str], cli=None) -> Dict[str, str]:
    """``{job id: state}`` from one ``sacct -D`` call; {} without Slurm (a laptop, a local executor)."""
    from hpc_agent.slurm.cli import SlurmCLI, SlurmError
    from hpc_agent.slurm.sacct import job_state, parse_parsable2

    ids = sorted({j for j in job_ids if j})
    if not ids or (cli is None and not SlurmCLI.available()):
        return {}
    cli = cli or SlurmCLI(timeout_s=20)
    try:
        rows = parse_parsable2(cli.sacct(ids, fields=("JobID", "State")))
    except SlurmError as exc:  # accounting down: the lines still say what the run directories say
        print(f"status: sacct failed ({exc}); Slurm states unknown", file=sys.stderr)
        return {}
    return {j: state for j in ids if (state := job_state(rows, j))}


def _last_job_ids(runs_root: Path) -> Tuple[Dict[str, str], Dict[str, Tuple[str, Optional[float]]]]:
    """({run id: its newest job id}, {run id: (process id, when it started)} for the runs whose newest job ran on
    the local executor: a process id there, which must never be sent to sacct as a Slurm job id)."""
    from hpc_agent.state.ledger import LEDGER_FILE, Ledger

    if not (runs_root / LEDGER_FILE).exists():
        return {}, {}
    ledger = Ledger.in_runs_root(runs_root)
    try:
        latest = {run.run_id: sub for run in ledger.runs()
                  if (sub := ledger.latest_submission(run.run_id)) is not None and sub.job_id}
        return {r: sub.job_id for r, sub in latest.items()}, \
            {r: (sub.job_id, sub.submitted_at or sub.intent_at) for r, sub in latest.items() if sub.executor == "local"}
    finally:
        ledger.close()


def _last_step_at(review: Dict[str, Any]) -> Optional[float]:
    live = review.get("live") or {}
    if live.get("last_step_at") is not None:
        return live["last_step_at"]
    walls = [point[1] for curve in review.get("_curves", {}).values() for point in curve]
    return max(walls) if walls else None


def line_of(review: Dict[str, Any], job_id: Optional[str], state: Optional[str], now: float) -> Dict[str, Any]:
    """One run's line as data (what --json prints). Pure."""
    decisions = review.get("decisions") or []
    if decisions:
        d = decisions[-1]
        last = f"{d.get('cause')} -> {d.get('action')}" + (" (in job)" if d.get("in_job") else "")
    else:
        last = review["causes"][-1] if review.get("causes") else "-"
    at = _last_step_at(review)
    step = review.get("step")
    return {"run_id": review["run_id"], "phase": review["phase"], "job_id": job_id, "jobs": review.get("jobs") or [],
            "slurm_state": state,
            "step": step, "max_steps": review.get("max_steps"), "last": last,
            "last_step_at": at, "last_step_age_s": round(now - at, 3) if at is not None else None}


def collect(path: Path, now: Optional[float] = None, cli=None,
            problems: Optional[List[Dict[str, str]]] = None) -> List[Dict[str, Any]]:
    """One line per run that could be reviewed; ``problems`` gets ``{"run_dir", "problem"}`` for each run whose
    job-written files are not what the watcher writes (a run that could not be read at all has no line)."""
    from hpc_agent.runs.history import find_runs, review_runs

    now = time.time() if now is None else now
    runs_root, run_dirs = find_runs(path)
    reviews, bad = review_runs(run_dirs, runs_root, now)
    if problems is not None:
        problems.extend(bad)
    job_ids, local = _last_job_ids(runs_root)
    for r in reviews:  # no ledger row (a run dir given alone): the newest job the decisions name
        job_ids.setdefault(r["run_id"], next((d["job_id"] for d in reversed(r["decisions"]) if d.get("job_id")), None))
        chain = r.get("jobs") or []
        if r["run_id"] not in local and job_ids[r["run_id"]] in chain:  # handed over since: the chain's newest job
            job_ids[r["run_id"]] = chain[-1]
    states = slurm_states([j for run_id, j in job_ids.items() if j and run_id not in local], cli)
    dirs = {r["run_id"]: Path(r["run_dir"]) for r in reviews}
    for run_id, (job_id, started_at) in local.items():  # a process id: its state from the process and its files
        if run_id in dirs:
            from hpc_agent.jobs.local_process import observe_local

            seen = observe_local(dirs[run_id], job_id, started_at)
            states[job_id] = f"{seen.attempt.state} (local)" if seen.attempt is not None else "unknown (local)"
    return [line_of(r, job_ids.get(r["run_id"]), states.get(job_ids.get(r["run_id"]) or ""), now) for r in reviews]


def _cells(line: Dict[str, Any]) -> List[str]:
    step = f"{line['step'] if line['step'] is not None else '-'}/{line['max_steps'] or '?'}"
    age = f"{duration(line['last_step_age_s'])} ago" if line["last_step_age_s"] is not None else "-"
    values = {**line, "step": step, "age": age}
    # run ids and causes come from files a job can write: nothing unprintable reaches the terminal
    return ["".join(c if c.isprintable() else "?" for c in str(values[key] or "-")) for _, key in COLUMNS]


def render(lines: Sequence[Dict[str, Any]]) -> str:
    rows = [[title for title, _ in COLUMNS]] + [_cells(line) for line in lines]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args, code = parse(build_parser(), argv)
    if args is None:
        return code
    if args.remote:
        return ssh.forward("status", ssh.local_argv(argv), args)
    root = Path(args.runs_root or os.environ.get(RUNS_ENV) or "./runs").expanduser()
    if not root.is_dir():
        print(f"status: no runs root at {root} (pass --runs-root, or submit a run first)", file=sys.stderr)
        return exit_status.USAGE
    bad: List[Dict[str, str]] = []
    lines = collect(root, problems=bad)
    if args.json:
        print(json.dumps({"runs_root": str(root.resolve()), "runs": lines, "problems": bad}, indent=2, default=str))
    elif lines:
        print(render(lines))
    elif not bad:
        print(f"no runs under {root}")
    from hpc_agent.runs.history import problem_lines

    for line in problem_lines(bad):
        print(f"status: {line}", file=sys.stderr)
    return exit_status.FAILED if bad else exit_status.OK  # every good run was listed; a bad one is a problem line


if __name__ == "__main__":
    sys.exit(invocation.run(main))

"""python -m hpc_agent.diagnose JOBID | --sacct-file F [--log F ...] [--tb DIR] [--runs-root DIR] [--json]

Why did my job die, and what should I do? Reads sacct (one ``sacct -D --parsable2`` call through
``SlurmCLI``, or a saved copy with ``--sacct-file`` in any format sacct prints: ``-P``, ``-p``, the default
fixed-width table, ``--json``; see :mod:`hpc_agent.slurm.sacct_read`), the job's log tails and its TensorBoard scalars,
names the cause of the newest attempt with the lines that show it, and says what ``watch`` would do.
It acts on nothing: no requeue, no cancel, no submit. Runs on login nodes: imports neither torch nor
deepspeed (TensorBoard's event reader is imported only when there are event files to read).

Exit codes: 0 a diagnosis was printed (including "unknown"), 1 a diagnosis was printed but a job-written file
of the run dir could not be read (a FIFO log, a corrupt tb/: each named on stderr), 2 bad arguments or an
unreadable file the user named (a ``--sacct-file`` that is no sacct output in any known format is an error,
never a silent "unknown").
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from hpc_agent.cli import exit_status
from hpc_agent.cli.flags import add_common_arguments, add_read_cap_argument, configure
from hpc_agent.config.load import RUNS_ENV, load_run_config, patch_as_overrides
from hpc_agent.config.problems import ConfigError
from hpc_agent.config.schema import Config
from hpc_agent.core import rundir
from hpc_agent.core.causes import ADVICE, SUMMARY, Cause
from hpc_agent.core.rundir import LogText, find_logs, tail_logs
from hpc_agent.diagnosis.alarms import LOSS_SCALE_TAG, LOSS_TAG, run_alarms
from hpc_agent.diagnosis.classify import Diagnosis, classify_job
from hpc_agent.metrics.alarm_kinds import Alarm
from hpc_agent.metrics.tb_reader import RunScalars
from hpc_agent.policy.decide import Decision, PastAttempt, Situation, decide
from hpc_agent.remote import ssh
from hpc_agent.slurm.job_match import run_id_from_job_name
from hpc_agent.slurm.sacct import SACCT_FIELDS, Attempt, SacctRow, group_attempts, job_key_of
from hpc_agent.slurm.sacct_read import SacctFormatError, read_sacct
from hpc_agent.watcher.follow import situation_from

EXIT_OK = exit_status.OK  # also when Slurm does not answer: the report says "unknown", which means wait
EXIT_USAGE = exit_status.USAGE
DEFAULT_TAIL_BYTES = 1 << 20
# A saved sacct reply for a few jobs is kilobytes; a month of a busy cluster's -D history is megabytes.
MAX_SACCT_FILE_BYTES = 64 << 20


class UsageError(Exception):
    """Bad arguments or an unreadable input file (exit code 2)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hpc_agent.diagnose",
        description="Explain why a Slurm training job ended and what to do about it. Acts on nothing.",
        epilog="Examples: python -m hpc_agent.diagnose 1234 | "
               "python -m hpc_agent.diagnose --sacct-file sacct.txt --log 1234_0_log.out --json")
    parser.add_argument("job_id", nargs="?", help="Slurm job id (12, 12_3 for an array task); asks sacct")
    parser.add_argument("--sacct-file", help="saved sacct output to read instead of asking Slurm (replay/offline): "
                                             "-P, -p, the default fixed-width table or --json, any columns "
                                             "that include JobID and State")
    parser.add_argument("--log", action="append", default=[], metavar="FILE",
                        help="job log to read (repeat for per-rank logs); default: found via the run directory")
    parser.add_argument("--tb", metavar="DIR", help="TensorBoard directory for NaN/inf loss and loss-scale alarms "
                                                   "(default: <run dir>/tb when the run directory is found)")
    parser.add_argument("--runs-root", help=f"where run directories live (default: ${RUNS_ENV} or ./runs)")
    parser.add_argument("--tail-bytes", type=int, default=DEFAULT_TAIL_BYTES,
                        help="bytes read from the end of each log (default 1 MiB)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    add_read_cap_argument(parser)
    ssh.add_arguments(parser)  # --remote USER@LOGIN: diagnose on the login node over ssh (docs/remote.md)
    return add_common_arguments(parser, slurm=True)


# --- inputs (I/O) -------------------------------------------------------------------------------------
def read_tb_scalars(tb_dir: Path,
                    tags: Sequence[str] = (LOSS_TAG, LOSS_SCALE_TAG)) -> Dict[str, List[Tuple[int, float]]]:
    """``{tag: [(step, value), ...]}`` in write (wall-time) order, every point of every event file under
    ``tb_dir`` (attempt overlaps included: the alarms look at what was logged, in the order it was)."""
    tb_dir = Path(tb_dir)
    if not tb_dir.is_dir():
        return {tag: [] for tag in tags}
    scalars = RunScalars(tb_dir, tags=tags)
    scalars.update()
    return {tag: [(p.step, p.value) for p in scalars.written(tag)] for tag in tags}


def _stdout_from_scontrol(cli, job_id: str) -> Optional[str]:
    try:
        out = cli.run(["scontrol", "show", "job", job_id], check=False).stdout
    except Exception:  # SlurmError, or anything odd: the log path is a nicety
        return None
    m = re.search(r"\bStdOut=(\S+)", out)
    return m.group(1) if m else None


# --- the command --------------------------------------------------------------------------------------
def history_from_attempts(diagnoses: Sequence[Diagnosis]) -> List[PastAttempt]:
    """The policy's history from the earlier attempts of one Slurm job (sacct -D alone: no ledger).
    A later attempt exists, so each earlier one was requeued; checkpoint progress is unknown here."""
    return [PastAttempt(d.job_id, d.cause.value, action="requeue") for d in diagnoses[:-1]]


def diagnose(job_id: Optional[str], sacct_text: str, logs: Sequence[LogText], alarms: Sequence[Alarm],
             cfg: Config, sacct_error: Optional[str] = None) -> Dict[str, Any]:
    """The report as a dict (what ``--json`` prints). Pure: every input is already read."""
    rows, sacct_notes = sacct_rows(sacct_text)
    jobs = group_attempts(rows)
    if not job_id and jobs:
        job_id = list(jobs)[-1]  # a saved file without a JOBID: the job sacct printed last
    attempts = attempts_for(jobs, job_id or "")
    diagnoses = classify_job(attempts, logs, alarms, job_id=job_id or "")
    latest = diagnoses[-1]
    notes: List[str] = []
    if sacct_error:
        notes.append(f"sacct failed: {sacct_error}")
    elif sacct_text.strip():
        notes.extend(sacct_notes)
    decision = decide(latest.cause, history_from_attempts(diagnoses), cfg, situation_from(diagnoses))
    return {
        "job_id": job_id or "",
        "cause": latest.cause.value,
        "state": latest.state,
        "exit_code": latest.exit_code,
        "nodes": list(latest.nodes),
        "bad_nodes": list(latest.bad_nodes),
        "evidence": notes + list(latest.evidence),
        "summary": SUMMARY[latest.cause.value],
        "suggestion": _suggestion(latest.cause, decision),
        "decision": decision.to_dict(),
        "attempts": [{"job_id": d.job_id, "attempt": d.attempt_index + 1, "state": d.state, "cause": d.cause.value}
                     for d in diagnoses if d.state or d.cause != Cause.UNKNOWN],
    }


def attempts_for(jobs: Dict[str, List[Attempt]], job_id: str) -> List[Attempt]:
    """The attempts of ``job_id``; an array asked for by its own id (``164``) when sacct printed exactly
    one task of it (``164_[0]``, ``164_3``) means that task."""
    key = job_key_of(job_id)
    if key in jobs or not key.isdigit():
        return jobs.get(key, [])
    tasks = [k for k in jobs if job_key_of(k).split("_", 1)[0] == key]
    return jobs[tasks[0]] if len(tasks) == 1 else []


def sacct_rows(sacct_text: str) -> Tuple[List[SacctRow], List[str]]:
    """(rows, notes) of sacct text in any format; text that is none gives no rows and a note saying so
    (live sacct: unknown means wait; a ``--sacct-file`` was already refused by :func:`load_inputs`)."""
    if not sacct_text.strip():
        return [], []
    try:
        reading = read_sacct(sacct_text)
    except SacctFormatError as exc:
        return [], [f"sacct output not understood: {exc}"]
    notes = []
    if reading.skipped_count:
        notes.append(f"{reading.skipped_count} line(s) under the sacct header were not rows of it and were "
                     f"skipped (first: {reading.skipped[0][:120]!r})")
    return list(reading.rows), notes


def read_sacct_file(path: str) -> str:
    """A saved sacct reply, read bounded, checked to be sacct output in some format (UsageError if not)."""
    limit = MAX_SACCT_FILE_BYTES
    try:
        with open(path, "rb") as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        raise UsageError(f"cannot read --sacct-file {path}: {exc.strerror or exc}")
    if len(data) > limit:
        raise UsageError(f"--sacct-file {path} is larger than {limit >> 20} MiB: save only the job's rows "
                         f"(sacct -j JOBID -D -P)")
    text = data.decode("utf-8", errors="replace")
    try:
        read_sacct(text)
    except SacctFormatError as exc:
        raise UsageError(f"--sacct-file {path} is not sacct output: {exc}")
    return text


def _suggestion(cause: Cause, decision: Decision) -> str:
    text = ADVICE[cause.value]
    if decision.patch:
        text += " Proposed: " + " ".join(patch_as_overrides(decision.patch)) + "."
    if decision.action == "stop" and cause not in (Cause.CODE_ERROR, Cause.ENV_ERROR, Cause.RUN_DIR_BUSY, Cause.CANCELLED):
        text += f" The watcher would stop: {decision.reason}."
    return text


def name_hung(report: Dict[str, Any], cfg: Config) -> None:
    """A running job whose heartbeats the hang judge calls stuck (``report["live"]["verdict"]``) is ``hung``:
    the cause, the summary, the verdict first in the evidence, and what the watcher would do."""
    verdict = (report.get("live") or {}).get("verdict")
    if not verdict:
        return
    decision = decide(Cause.HUNG, [], cfg, Situation(job_id=report["job_id"], hang=(verdict.get("step"), "")))
    report.update(cause=Cause.HUNG.value, summary=SUMMARY[Cause.HUNG.value], decision=decision.to_dict(),
                  suggestion=_suggestion(Cause.HUNG, decision),
                  evidence=[f"hung ({verdict.get('kind')}): {verdict.get('reason')}"] + list(report["evidence"]))
    if report["attempts"]:
        report["attempts"][-1]["cause"] = Cause.HUNG.value


def render_text(report: Dict[str, Any]) -> str:
    d = report["decision"]
    lines = [f"job {report['job_id'] or '?'}: {report['cause']} -- {report['summary']}"]
    if report.get("live"):
        from hpc_agent.runs.liveness import describe

        lines.append(f"  live: {describe(report['live'])}")
    if report["state"]:
        blamed = f"; blamed: {','.join(report['bad_nodes'])}" if report["bad_nodes"] else ""
        lines.append(f"  state {report['state']}, exit {report['exit_code'] or '?'}, "
                     f"nodes {','.join(report['nodes']) or '-'}{blamed}")
    lines.append("evidence:")
    lines += [f"  - {e}" for e in report["evidence"]]
    lines.append(f"what to do: {report['suggestion']}")
    expedite = " + expedite (StartTime=now)" if d["expedite"] else ""
    lines.append(f"watch would: {d['action']} ({d['reason']}){expedite}")
    if str(report.get("config", "")).startswith("schema defaults"):
        lines.append("  (numbers from the schema defaults: the run directory was not found; pass --runs-root)")
    if len(report["attempts"]) > 1:
        lines.append("attempts (oldest first):")
        lines += [f"  {a['attempt']}. {a['job_id']} {a['state']}: {a['cause']}" for a in report["attempts"]]
    return "\n".join(lines)


@dataclass
class Inputs:
    """Everything read from Slurm and the file system, before the pure :func:`diagnose` runs."""

    job_id: Optional[str]
    sacct_text: str
    sacct_error: Optional[str] = None
    logs: List[LogText] = field(default_factory=list)
    alarms: List[Alarm] = field(default_factory=list)
    cfg: Config = field(default_factory=Config)
    config_source: str = "schema defaults (run directory not found)"
    run_dir: Optional[Path] = None
    attempt_start: Optional[float] = None  # sacct's Start of the newest attempt (a live job's hang verdict)
    notes: List[str] = field(default_factory=list)  # the read caps met (hpc_agent/core/read_caps.py): not read
    problems: List[str] = field(default_factory=list)
    """Job-written files of the run dir that could not be read (a FIFO log, a corrupt or too deep tb/, a
    config that is no config): each said, the diagnosis goes on without it, and the exit code is 1."""


def _read_sacct(args: argparse.Namespace) -> Tuple[str, Optional[str], Any]:
    """(sacct text, error, the SlurmCLI used or None)."""
    if args.sacct_file:
        return read_sacct_file(args.sacct_file), None, None
    from hpc_agent.slurm.cli import SlurmCLI, SlurmError

    cli = SlurmCLI()
    try:
        return cli.sacct([args.job_id], fields=SACCT_FIELDS), None, cli
    except SlurmError as exc:  # slurmdbd busy or down: unknown, which means wait
        return "", str(exc), cli


def _run_dir_from_ledger(runs_root: Path, job_key: str) -> Optional[Path]:
    """A sweep trial runs as an array task named for its array, not its run: the ledger knows its run dir."""
    from hpc_agent.state.ledger import Ledger

    ledger = Ledger.in_runs_root(runs_root)
    try:
        for run in ledger.runs():
            if Path(run.run_dir).is_dir() and any(s.job_id == job_key for s in ledger.submissions(run.run_id)):
                return Path(run.run_dir)
    finally:
        ledger.close()
    return None


def load_inputs(args: argparse.Namespace) -> Inputs:
    sacct_text, sacct_error, cli = _read_sacct(args)
    jobs = group_attempts(sacct_rows(sacct_text)[0])
    job_id = args.job_id or (list(jobs)[-1] if jobs else None)
    found = Inputs(job_id, sacct_text, sacct_error)
    attempts = attempts_for(jobs, job_id or "")
    if attempts:
        from hpc_agent.watcher.observe import attempt_start

        found.attempt_start = attempt_start(attempts[-1])
    runs_root = Path(args.runs_root or os.environ.get(RUNS_ENV) or "./runs").expanduser()
    run_id = run_id_from_job_name(attempts[-1].job_name) if attempts else None
    if run_id and (runs_root / run_id).is_dir():
        found.run_dir = runs_root / run_id
    elif job_id and (runs_root / "ledger.sqlite").exists():
        found.run_dir = _run_dir_from_ledger(runs_root, job_key_of(job_id))

    caps = args.read_caps
    paths = [Path(p) for p in args.log]
    if not paths and job_id:
        stdout = _stdout_from_scontrol(cli, job_id) if cli is not None and found.run_dir is None else None
        choice = find_logs(found.run_dir, job_key_of(job_id), stdout, caps)
        paths, found.notes = list(choice.paths), list(choice.notes)
    within = found.run_dir if not args.log else None  # the job's logs: no link followed below its run dir
    for path, got in tail_logs(paths, args.tail_bytes, caps, within=within):
        if isinstance(got, str):
            found.notes.append(got)
        elif isinstance(got, OSError):
            if args.log:  # a file the user named: a usage error
                raise UsageError(f"cannot read log {path}: {got.strerror or got}")
            found.problems.append(f"log not read: {got.strerror or got}")  # the job's: said, and the rest goes on
        else:
            found.logs.append(got)

    snapshot = rundir.config_path(found.run_dir) if found.run_dir is not None else None
    if snapshot is not None and snapshot.exists():
        try:  # bounded, regular-file-only: the job can write its run directory
            found.cfg, found.config_source = load_run_config(found.run_dir), str(snapshot)
        except Exception as exc:  # noqa: BLE001 - ConfigError, OSError, or anything a job-written file causes
            reason = "did not validate" if isinstance(exc, ConfigError) else f"unreadable: {exc}"
            found.config_source = f"schema defaults ({snapshot} {reason})"
            if not isinstance(exc, (ConfigError, OSError)):
                found.problems.append(f"{snapshot} not read: {type(exc).__name__}")
    tb_dir = Path(args.tb) if args.tb else (rundir.tb_dir(found.run_dir) if found.run_dir is not None else None)
    if args.tb and not tb_dir.is_dir():
        raise UsageError(f"--tb {args.tb} is not a directory")
    if tb_dir is not None and tb_dir.is_dir():
        try:
            scalars = RunScalars(tb_dir, tags=(LOSS_TAG, LOSS_SCALE_TAG), caps=caps)
            scalars.update()
            found.alarms = run_alarms(scalars, found.cfg.train.min_loss_scale)
            found.notes.extend(scalars.capped.values())
            found.problems += [f"TensorBoard: {p}" for p in scalars.problems() if p not in scalars.capped.values()]
        except Exception as exc:  # noqa: BLE001 - event files are job-written bytes
            found.problems.append(f"TensorBoard {tb_dir} not read: {type(exc).__name__}: {str(exc)[:200]}")
    return found


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed by argparse
        return int(exc.code or 0)
    configure(args)
    if args.remote:  # every path (--log, --tb, --sacct-file, --runs-root) is one on the login node
        return ssh.forward("diagnose", ssh.local_argv(argv), args)
    if not args.job_id and not args.sacct_file:
        parser.print_usage(sys.stderr)
        print("diagnose: give a JOBID or --sacct-file FILE", file=sys.stderr)
        return EXIT_USAGE
    if args.tail_bytes <= 0:
        print("diagnose: --tail-bytes must be positive", file=sys.stderr)
        return EXIT_USAGE
    try:
        found = load_inputs(args)
    except UsageError as exc:
        print(f"diagnose: {exc}", file=sys.stderr)
        return EXIT_USAGE
    report = diagnose(found.job_id, found.sacct_text, found.logs, found.alarms, found.cfg, found.sacct_error)
    report["run_dir"] = str(found.run_dir) if found.run_dir else None
    report["config"] = found.config_source  # where the decision's numbers (batch, --mem, lr) came from
    report["logs"] = [log.name for log in found.logs]
    report["evidence"].extend(found.notes)  # what the read caps left out, so a cut reading is never silent
    if report["cause"] == Cause.RUNNING.value and found.run_dir is not None:
        from hpc_agent.runs.history import live_status  # as review shows it: time since the last step, a hang verdict

        try:
            report["live"] = live_status(found.run_dir, Cause.RUNNING.value, time.time(), found.attempt_start)
            name_hung(report, found.cfg)
        except Exception as exc:  # noqa: BLE001 - heartbeats, stacks and tb/ are job-written
            found.problems.append(f"live status not read: {type(exc).__name__}: {str(exc)[:200]}")
    report["problems"] = found.problems
    print(json.dumps(report, indent=2) if args.json else render_text(report))
    for problem in found.problems:
        print("diagnose: " + "".join(c if c.isprintable() else "?" for c in problem), file=sys.stderr)
    return exit_status.FAILED if found.problems else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())

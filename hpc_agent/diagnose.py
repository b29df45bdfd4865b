"""python -m hpc_agent.diagnose [JOBID | RUN_ID | RUN_DIR] [--sacct-file F] [--log F ...] [--tb DIR] [--runs-root DIR] [--json]

Why did my job die, and what should I do? Names the cause of the newest attempt with the lines that show it, and
says what ``watch`` would do. It acts on nothing: no requeue, no cancel, no submit. Runs on login nodes: imports
neither torch nor deepspeed (TensorBoard's event reader is imported only when there are event files to read).

What it takes (whatever the user has):

- ``JOBID`` (``12``, ``12_3`` for an array task, ``12+1`` for a heterogeneous job's component): one
  ``sacct -D --parsable2`` call through ``SlurmCLI``; the run directory (logs, TensorBoard, config) is found by the
  job's name or through the ledger.
- ``RUN_ID`` (a run directory's name under the runs root, ``gpt-20261204-101500``) or ``RUN_DIR`` (a path to one;
  its runs root is its parent): the run's submissions from the ledger. The newest job is diagnosed, and the
  attempts of the run's earlier jobs come from the same one sacct call. A local-executor run (``submit --executor
  local``) is never sent to sacct: its job id is a process id, and how it ended is read from whether that process
  is alive, its result files (read without unpickling) and the log's ``exiting N`` line
  (:mod:`hpc_agent.diagnosis.local_job`); the report says which.
- ``--sacct-file F``: a saved sacct reply instead of asking Slurm (replay/offline), in any format sacct prints
  (``-P``, ``-p``, the default fixed-width table, ``--json``; see :mod:`hpc_agent.slurm.sacct_read`); alone, the
  job it printed last.
- ``--log F`` alone (no job, no run, no sacct file): the cause from the logs alone; the state is reported
  ``unknown`` and no Slurm command runs.

Exit codes: 0 a diagnosis was printed (including "unknown"), 1 a diagnosis was printed but a job-written file
of the run dir could not be read (a FIFO log, a corrupt tb/: each named on stderr), 2 bad arguments, a name that
is neither a job id nor a run (what was tried is said), or an unreadable file the user named (a ``--sacct-file``
that is no sacct output in any known format is an error, never a silent "unknown").
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

from hpc_agent.cli import exit_status, invocation
from hpc_agent.cli.flags import add_common_arguments, add_read_cap_argument, configure
from hpc_agent.config.load import RUNS_ENV, load_run_config, patch_as_overrides
from hpc_agent.config.problems import ConfigError
from hpc_agent.config.schema import Config
from hpc_agent.core import rundir
from hpc_agent.core.causes import ADVICE, SUMMARY, Cause
from hpc_agent.core.rundir import LogText, find_logs, tail_logs
from hpc_agent.diagnosis.alarms import LOSS_SCALE_TAG, LOSS_TAG, run_alarms
from hpc_agent.diagnosis.classify import Diagnosis, classify_job, classify_logs
from hpc_agent.diagnosis.local_job import LocalFacts, classify_local
from hpc_agent.metrics.alarm_kinds import Alarm
from hpc_agent.metrics.tb_reader import RunScalars
from hpc_agent.policy.decide import Decision, PastAttempt, Situation, decide
from hpc_agent.remote import ssh
from hpc_agent.slurm.job_match import run_id_from_job_name
from hpc_agent.slurm.sacct import SACCT_FIELDS, Attempt, SacctRow, group_attempts, job_key_of
from hpc_agent.slurm.sacct_read import INFERRED, SacctFormatError, read_sacct
from hpc_agent.watcher.follow import history_from, situation_from

EXIT_OK = exit_status.OK  # also when Slurm does not answer: the report says "unknown", which means wait
EXIT_USAGE = exit_status.USAGE
DEFAULT_TAIL_BYTES = 1 << 20
EARLIER_TAIL_BYTES = 256 << 10  # each log of a run's earlier job: its end names why that job ended
MAX_EARLIER_JOBS = 16  # a run's earlier jobs diagnosed with the newest (the newest of them)
# A saved sacct reply for a few jobs is kilobytes; a month of a busy cluster's -D history is megabytes.
MAX_SACCT_FILE_BYTES = 64 << 20
JOB_ID_RE = re.compile(r"^\d+(?:_(?:\d+|\[[\d,\-]+\]))?(?:\+\d+)?(?:\.[A-Za-z0-9]+)?$")
"""A Slurm job id as users type it: ``12``, ``12_3`` (array task), ``12+1`` (a heterogeneous job's component),
``12.batch`` / ``12.0`` (a step: its job is diagnosed)."""

# Where the report's state comes from (report["state_from"]).
FROM_SACCT, FROM_SACCT_FILE, FROM_NOTHING, FROM_LOCAL = "sacct", "sacct file", "nothing", "local process"
UNKNOWN_STATE = "unknown"


class UsageError(Exception):
    """Bad arguments or an unreadable input file (exit code 2)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=invocation.prog("diagnose"),
        usage="%(prog)s [JOBID | RUN_ID | RUN_DIR] [--sacct-file FILE] [--log FILE ...] [--tb DIR] "
              "[--runs-root DIR] [--json] [options]",
        description="Explain why a training job ended and what to do about it, from what you have:\n"
                    "  a Slurm job id (asks sacct once);\n"
                    "  a run, by its id or its directory (the ledger names its jobs; a local-executor run is judged\n"
                    "    from its process, result files and exit line, never from sacct);\n"
                    "  a saved sacct reply (--sacct-file);\n"
                    "  or only its logs (--log: the state is unknown and no Slurm command runs).\n"
                    "Acts on nothing: no requeue, no cancel, no submit.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
               "  python -m hpc_agent.diagnose 1234                        # a Slurm job: asks sacct once\n"
               "  python -m hpc_agent.diagnose gpt-20261204-101500-ab12    # a run id under the runs root\n"
               "  python -m hpc_agent.diagnose runs/gpt-20261204-101500-ab12   # a run directory\n"
               "  python -m hpc_agent.diagnose --log 1234_0_log.out        # the logs alone: state unknown\n"
               "  python -m hpc_agent.diagnose --sacct-file sacct.txt --log 1234_0_log.out --json   # offline\n"
               + exit_status.epilog(exit_status.OK, exit_status.FAILED, exit_status.USAGE, exit_status.REMOTE))
    parser.add_argument("job_id", nargs="?", metavar="JOBID | RUN_ID | RUN_DIR",
                        help="a Slurm job id (12, 12_3 for an array task, 12+1): asks sacct; a run id (a directory "
                             "name under the runs root) or a path to a run directory: the run's newest job, from "
                             "the ledger; omit it to diagnose --sacct-file or --log alone")
    parser.add_argument("--sacct-file", help="saved sacct output to read instead of asking Slurm (replay/offline): "
                                             "-P, -p, the default fixed-width table or --json, any columns "
                                             "that include JobID and State")
    parser.add_argument("--log", action="append", default=[], metavar="FILE",
                        help="job log to read (repeat for per-rank logs); default: found via the run directory. "
                             "Alone (no job, run or --sacct-file): the cause from the logs, the state unknown")
    parser.add_argument("--tb", metavar="DIR", help="TensorBoard directory for NaN/inf loss and loss-scale alarms "
                                                   "(default: <run dir>/tb when the run directory is found)")
    parser.add_argument("--runs-root", help=f"where run directories live (default: ${RUNS_ENV} or ./runs); "
                                            "a RUN_DIR's runs root is its parent")
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
    """The policy's history from the earlier attempts (sacct -D alone: no ledger decisions). A later attempt
    of the same job means this one was requeued; a later job of the run means it was resubmitted. Checkpoint
    progress is unknown here."""
    return [PastAttempt(d.job_id, d.cause.value, action="requeue" if after.job_id == d.job_id else "resubmit")
            for d, after in zip(diagnoses, diagnoses[1:])]


def run_history(diagnoses: Sequence[Diagnosis], decisions: Optional[Sequence[Any]]) -> List[PastAttempt]:
    """The history the watcher decides with: the ledger's decision rows (``Ledger.decisions``), less the one it
    may already have recorded for the newest attempt; without rows, the attempts sacct shows."""
    if not decisions:
        return history_from_attempts(diagnoses)
    latest = diagnoses[-1]
    return list(history_from([r for r in decisions
                              if not (r.job_id == latest.job_id and r.attempt == latest.attempt_index)]))


def diagnose(job_id: Optional[str], sacct_text: str, logs: Sequence[LogText], alarms: Sequence[Alarm],
             cfg: Config, sacct_error: Optional[str] = None,
             earlier: Sequence[Tuple[str, Sequence[LogText]]] = (),
             decisions: Optional[Sequence[Any]] = None) -> Dict[str, Any]:
    """The report as a dict (what ``--json`` prints). Pure: every input is already read.

    ``earlier``: a run's earlier jobs (oldest first) with their logs; their attempts, from the same sacct text,
    come before this job's in ``attempts`` and in the policy's history. ``decisions``: the run's decision rows
    from the ledger, the history the watcher used (:func:`run_history`)."""
    rows, sacct_notes = sacct_rows(sacct_text)
    jobs = group_attempts(rows)
    if not job_id and jobs:
        job_id = list(jobs)[-1]  # a saved file without a JOBID: the job sacct printed last
    before = [d for jid, jlogs in earlier if (found := attempts_for(jobs, jid))
              for d in classify_job(found, jlogs, (), job_id=jid)]
    attempts = attempts_for(jobs, job_id or "")
    notes: List[str] = []
    if sacct_error:
        notes.append(f"sacct failed: {sacct_error}")
    elif sacct_text.strip():
        notes.extend(sacct_notes)
    if not attempts and not before and logs and sacct_text.strip() and not sacct_error:
        # Saved sacct text with no record of the job (not sacct output after all, or another job's): the logs
        # still speak. (A live sacct that has no record yet means wait, so this is for saved text only.)
        report = diagnose_logs(logs, alarms, cfg, job_id or "")
        report["evidence"] = notes + ["no attempt of this job in the sacct text: the cause is from the logs alone"] \
            + report["evidence"]
        return report
    diagnoses = before + classify_job(attempts, logs, alarms, job_id=job_id or "")
    latest = diagnoses[-1]
    decision = decide(latest.cause, run_history(diagnoses, decisions), cfg, situation_from(diagnoses))
    return _report(latest, decision, notes, diagnoses, job_id or "")


def diagnose_logs(logs: Sequence[LogText], alarms: Sequence[Alarm], cfg: Config, job_id: str = "") -> Dict[str, Any]:
    """The report from logs alone (no job id, no sacct text): the cause the lines show, the state unknown. Pure."""
    latest = classify_logs(logs, alarms, job_id=job_id)
    decision = decide(latest.cause, [], cfg, situation_from([latest]))
    report = _report(latest, decision, [], [latest], job_id)
    report.update(state=UNKNOWN_STATE, state_from=FROM_NOTHING)
    return report


def diagnose_local(facts: LocalFacts, logs: Sequence[LogText], alarms: Sequence[Alarm], cfg: Config) -> Dict[str, Any]:
    """The report on a local-executor job (no sacct: its process, result files and exit line). Pure."""
    latest = classify_local(facts, logs, alarms)
    decision = decide(latest.cause, [], cfg, situation_from([latest]))
    report = _report(latest, decision, [], [latest], facts.pid)
    report.update(state=latest.state or UNKNOWN_STATE, state_from=FROM_LOCAL,
                  local={"pid": facts.pid, "alive": facts.alive, "alive_basis": facts.alive_basis,
                         "results": [{"rank": r, "tag": t} for r, t in facts.results]})
    return report


def _report(latest: Diagnosis, decision: Decision, notes: Sequence[str], diagnoses: Sequence[Diagnosis],
            job_id: str) -> Dict[str, Any]:
    return {
        "job_id": job_id,
        "cause": latest.cause.value,
        "state": latest.state,
        "state_from": FROM_SACCT,
        "exit_code": latest.exit_code,
        "nodes": list(latest.nodes),
        "bad_nodes": list(latest.bad_nodes),
        "evidence": list(notes) + list(latest.evidence),
        "hypotheses": list(latest.hypotheses),
        "summary": SUMMARY[latest.cause.value],
        "suggestion": _suggestion(latest.cause, decision),
        "decision": decision.to_dict(),
        "attempts": [{"job_id": d.job_id, "attempt": d.attempt_index + 1, "state": d.state, "cause": d.cause.value}
                     for d in diagnoses if d.state or d.cause != Cause.UNKNOWN],
        "last_end": _last_end(diagnoses),
    }


def _last_end(diagnoses: Sequence[Diagnosis]) -> Optional[Dict[str, Any]]:
    """While the newest attempt is queued or running again (Slurm requeued the job), why the one before it
    ended: what "why did my job die" asks of a requeued job. None otherwise."""
    if len(diagnoses) < 2 or diagnoses[-1].cause not in (Cause.PENDING, Cause.RUNNING):
        return None
    d = diagnoses[-2]
    return {"job_id": d.job_id, "attempt": d.attempt_index + 1, "state": d.state, "cause": d.cause.value,
            "evidence": list(d.evidence[:4])}


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
    if INFERRED in reading.formats:
        notes.append("sacct text without a header line: JobID, State, ExitCode and times read from what the values look "
                     "like, other columns left unread (sacct without -n gives a sure reading)")
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
    if cause == Cause.ENV_ERROR and "fix: " in decision.reason:  # the fix the evidence names (policy/env_fix.py)
        text += " For this job, " + decision.reason.split("fix: ", 1)[1].rstrip(".") + "."
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


def _state_line(report: Dict[str, Any]) -> Optional[str]:
    source = report.get("state_from", FROM_SACCT)
    if source == FROM_NOTHING:
        return "  state unknown: no sacct consulted; the cause is from the logs alone"
    if source == FROM_LOCAL:
        local = report.get("local") or {}
        exit_code = report["exit_code"] or "?"
        if report["state"] == UNKNOWN_STATE:
            return f"  state unknown, local process {local.get('pid', '?')} (no sacct: {local.get('alive_basis', '')})"
        return f"  state {report['state']}, exit {exit_code}, local process {local.get('pid', '?')} (no sacct)"
    if not report["state"]:
        return None
    blamed = f"; blamed: {','.join(report['bad_nodes'])}" if report["bad_nodes"] else ""
    return (f"  state {report['state']}, exit {report['exit_code'] or '?'}, "
            f"nodes {','.join(report['nodes']) or '-'}{blamed}")


def render_text(report: Dict[str, Any]) -> str:
    d = report["decision"]
    run = f"run {report['run_id']}, " if report.get("run_id") else ""
    lines = [f"{run}job {report['job_id'] or '?'}: {report['cause']} -- {report['summary']}"]
    if report.get("live"):
        from hpc_agent.runs.liveness import describe

        lines.append(f"  live: {describe(report['live'])}")
    state = _state_line(report)
    if state:
        lines.append(state)
    lines.append("evidence:")
    lines += [f"  - {e}" for e in report["evidence"]]
    lines.append(f"what to do: {report['suggestion']}")
    expedite = " + expedite (StartTime=now)" if d["expedite"] else ""
    lines.append(f"watch would: {d['action']} ({d['reason']}){expedite}")
    if str(report.get("config", "")).startswith("schema defaults"):
        hint = "give the RUN_ID or RUN_DIR" if report.get("state_from") == FROM_NOTHING else "pass --runs-root"
        lines.append(f"  (numbers from the schema defaults: the run directory was not found; {hint})")
    if report.get("last_end"):
        end = report["last_end"]
        lines.append(f"attempt {end['attempt']} before it ended: {end['cause']} ({end['state']})")
        lines += [f"  - {e}" for e in end["evidence"][1:3]]
    if len(report["attempts"]) > 1:
        lines.append("attempts (oldest first):")
        lines += [f"  {i}. {a['job_id']} {a['state']}: {a['cause']}" for i, a in enumerate(report["attempts"], 1)]
    return "\n".join(lines)


@dataclass
class Inputs:
    """Everything read from Slurm, the ledger and the file system, before the pure :func:`diagnose`,
    :func:`diagnose_logs` or :func:`diagnose_local` runs."""

    job_id: Optional[str]
    sacct_text: str = ""
    sacct_error: Optional[str] = None
    mode: str = "job"
    """``job`` (sacct or a saved reply), ``logs`` (the logs alone) or ``local`` (a local-executor job)."""
    state_from: str = FROM_SACCT
    run_id: Optional[str] = None
    earlier: List[Tuple[str, List[LogText]]] = field(default_factory=list)
    """A run's earlier Slurm jobs (oldest first) and their logs."""
    decisions: Optional[List[Any]] = None
    """The run's decision rows in the ledger (the watcher's history)."""
    local: Optional[LocalFacts] = None
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


@dataclass(frozen=True)
class RunTarget:
    """A run named on the command line, and its ledger record (None: the ledger has none)."""

    run_id: str
    runs_root: Path
    run_dir: Path
    run: Any = None
    submissions: Tuple[Any, ...] = ()
    decisions: Tuple[Any, ...] = ()


def target_kind(text: str) -> str:
    """How the positional argument reads: ``job`` (a Slurm job id), ``path`` (it names a directory by a path)
    or ``name`` (a run id, or a directory name relative to here). Pure."""
    if JOB_ID_RE.match(text):
        return "job"
    if os.sep in text or (os.altsep and os.altsep in text) or text.startswith((".", "~")):
        return "path"
    return "name"


def _runs_root(args: argparse.Namespace) -> Path:
    # Absolute: the readers walk a log's path down from its run dir (no link followed), by components.
    return Path(args.runs_root or os.environ.get(RUNS_ENV) or "./runs").expanduser().absolute()


def _ledger_record(runs_root: Path, run_id: str) -> Tuple[Any, Tuple[Any, ...], Tuple[Any, ...]]:
    """``(run, submissions, decisions)`` of ``run_id`` in the runs root's ledger; ``(None, (), ())`` when there is
    no ledger there or it has no such run. A ledger others could write is refused (UsageError)."""
    from hpc_agent.state.ledger import LEDGER_FILE, Ledger, ledger_problem

    if not (runs_root / LEDGER_FILE).is_file():
        return None, (), ()
    problem = ledger_problem(runs_root)
    if problem is not None:
        raise UsageError(problem)
    ledger = Ledger.in_runs_root(runs_root)
    try:
        run = ledger.run(run_id)
        if run is None:
            return None, (), ()
        return run, tuple(ledger.submissions(run_id)), tuple(ledger.decisions(run_id))
    finally:
        ledger.close()


def resolve_run(text: str, args: argparse.Namespace) -> RunTarget:
    """The run that ``text`` (not a job id) names; UsageError when it names none, listing what was tried. A name
    is a run id in the runs root's ledger, else a directory of that name there, else a directory here; a path
    must be a directory: its name is the run id, its parent the runs root."""
    from hpc_agent.state.ledger import LEDGER_FILE

    tried = []
    if target_kind(text) == "name":
        root = _runs_root(args)
        run, subs, decisions = _ledger_record(root, text)
        if run is not None:
            run_dir = Path(run.run_dir) if run.run_dir and Path(run.run_dir).is_dir() else root / text
            return RunTarget(text, root, run_dir, run, subs, decisions)
        tried.append(f"a run id in the ledger at {root} (" +
                     ("no such run" if (root / LEDGER_FILE).is_file() else "no ledger there") + ")")
        if (root / text).is_dir():
            return RunTarget(text, root, root / text)
        tried.append(f"a run directory {root / text} (none)")
    path = Path(text).expanduser()
    if path.is_dir():
        real = path.resolve()
        run, subs, decisions = _ledger_record(real.parent, real.name)
        return RunTarget(real.name, real.parent, path.absolute(), run, subs, decisions)
    tried.append(f"a run directory {text} (" + ("not a directory" if path.exists() else "none") + ")")
    raise UsageError(f"{text!r} is neither a Slurm job id (12, 12_3, 12+1) nor a run; tried " + "; ".join(tried))


def _newest_job_key(run_dir: Path, caps) -> Optional[str]:
    """The job id of the newest log in ``<run dir>/slurm`` (``<job>_<rank>_log.out``), by mtime; None if none."""
    folder = rundir.slurm_dir(run_dir)
    if folder.is_symlink() or not folder.is_dir():
        return None
    newest: Tuple[int, Optional[str]] = (-1, None)
    try:
        with os.scandir(folder) as entries:
            for seen, entry in enumerate(entries):
                if seen >= caps.listing:
                    break
                m = re.match(r"^(\d+(?:_\d+)?)_\d+_log\.(?:out|err)$", entry.name)
                if m:
                    try:
                        mtime = entry.stat(follow_symlinks=False).st_mtime_ns
                    except OSError:
                        continue
                    newest = max(newest, (mtime, m.group(1)), key=lambda t: t[0])
    except OSError:  # unreadable folder: no log to go by
        return None
    return newest[1]


def _read_logs(found: Inputs, paths: Sequence[Path], tail_bytes: int, caps, within: Optional[Path],
               user_named: bool) -> List[LogText]:
    """The logs' tails; a log the user named that cannot be read is a UsageError, a job-written one a problem."""
    logs: List[LogText] = []
    for path, got in tail_logs(paths, tail_bytes, caps, within=within):
        if isinstance(got, str):
            found.notes.append(got)
        elif isinstance(got, OSError):
            if user_named:  # a file the user named: a usage error
                raise UsageError(f"cannot read log {path}: {got.strerror or got}")
            found.problems.append(f"log not read: {got.strerror or got}")  # the job's: said, and the rest goes on
        else:
            logs.append(got)
    return logs


def _job_logs(found: Inputs, args: argparse.Namespace, job_key: str, cli=None) -> None:
    """The logs of the job diagnosed: ``--log`` files, else the run dir's (or Slurm's StdOut path)."""
    caps = args.read_caps
    paths = [Path(p) for p in args.log]
    if not paths and job_key:
        stdout = _stdout_from_scontrol(cli, job_key) if cli is not None and found.run_dir is None else None
        choice = find_logs(found.run_dir, job_key_of(job_key), stdout, caps)
        paths, found.notes = list(choice.paths), found.notes + list(choice.notes)
    within = found.run_dir if not args.log else None  # the job's logs: no link followed below its run dir
    found.logs = _read_logs(found, paths, args.tail_bytes, caps, within, bool(args.log))


def _read_sacct(args: argparse.Namespace, job_ids: Sequence[str]) -> Tuple[str, Optional[str], Any]:
    """(sacct text, error, the SlurmCLI used or None): one call for every job id."""
    if args.sacct_file:
        return read_sacct_file(args.sacct_file), None, None
    from hpc_agent.slurm.cli import SlurmCLI, SlurmError

    cli = SlurmCLI()
    try:
        return cli.sacct(list(job_ids), fields=SACCT_FIELDS), None, cli
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
    """Read what the arguments name (UsageError for a bad name or an unreadable file the user named)."""
    if args.job_id and target_kind(args.job_id) != "job":
        found = _load_run(args, resolve_run(args.job_id, args))
    elif not args.job_id and not args.sacct_file:
        found = Inputs(None, mode="logs", state_from=FROM_NOTHING)  # --log alone: no Slurm command at all
        found.logs = _read_logs(found, [Path(p) for p in args.log], args.tail_bytes, args.read_caps, None, True)
    else:
        found = _load_job(args)
    _read_run_files(found, args)
    return found


def _load_job(args: argparse.Namespace) -> Inputs:
    """A Slurm job id (or a saved sacct reply): sacct, then the run dir by the job's name or the ledger."""
    sacct_text, sacct_error, cli = _read_sacct(args, [args.job_id] if args.job_id else [])
    jobs = group_attempts(sacct_rows(sacct_text)[0])
    job_id = args.job_id or (list(jobs)[-1] if jobs else None)
    found = Inputs(job_id, sacct_text, sacct_error, state_from=FROM_SACCT_FILE if args.sacct_file else FROM_SACCT)
    attempts = attempts_for(jobs, job_id or "")
    if attempts:
        from hpc_agent.watcher.observe import attempt_start

        found.attempt_start = attempt_start(attempts[-1])
    runs_root = _runs_root(args)
    run_id = run_id_from_job_name(attempts[-1].job_name) if attempts else None
    if run_id and (runs_root / run_id).is_dir():
        found.run_dir = runs_root / run_id
    elif job_id and (runs_root / "ledger.sqlite").exists():
        found.run_dir = _run_dir_from_ledger(runs_root, job_key_of(job_id))
    _job_logs(found, args, job_id or "", cli)
    return found


def _load_run(args: argparse.Namespace, target: RunTarget) -> Inputs:
    """A run: its newest job from the ledger, diagnosed with sacct (every Slurm job of the run in one call)
    or, for a local-executor job, from its process and files; no ledger record: its newest log alone."""
    submitted = [s for s in target.submissions if s.job_id]
    if target.run is None or not submitted:
        return _load_unrecorded_run(args, target)
    newest = submitted[-1]
    if newest.executor == "local":
        return _load_local(args, target, newest)
    ids = list(dict.fromkeys(s.job_id for s in submitted if s.executor != "local"))
    earlier_ids = [j for j in ids if j != newest.job_id][-MAX_EARLIER_JOBS:]
    sacct_text, sacct_error, _cli = _read_sacct(args, earlier_ids + [newest.job_id])
    found = Inputs(newest.job_id, sacct_text, sacct_error, run_id=target.run_id, run_dir=target.run_dir,
                   state_from=FROM_SACCT_FILE if args.sacct_file else FROM_SACCT, decisions=list(target.decisions))
    if len(ids) - 1 > len(earlier_ids):
        found.notes.append(f"the run has {len(ids) - 1} earlier jobs: the newest {len(earlier_ids)} are shown")
    attempts = attempts_for(group_attempts(sacct_rows(sacct_text)[0]), newest.job_id)
    if attempts:
        from hpc_agent.watcher.observe import attempt_start

        found.attempt_start = attempt_start(attempts[-1])
    for job_id in earlier_ids:
        choice = find_logs(target.run_dir, job_key_of(job_id), None, args.read_caps)
        found.notes.extend(choice.notes)
        logs = _read_logs(found, choice.paths, min(args.tail_bytes, EARLIER_TAIL_BYTES), args.read_caps,
                          target.run_dir, False)
        found.earlier.append((job_id, logs))
    _job_logs(found, args, newest.job_id)
    return found


def _load_local(args: argparse.Namespace, target: RunTarget, newest: Any) -> Inputs:
    """A local-executor job: never sent to sacct. Its logs, its result files and whether its process lives."""
    from hpc_agent.jobs.local_process import local_facts

    found = Inputs(newest.job_id, mode="local", state_from=FROM_LOCAL, run_id=target.run_id, run_dir=target.run_dir)
    _job_logs(found, args, newest.job_id)
    ranks = sorted({rank for log in found.logs if (rank := rundir.rank_of(Path(log.name))) is not None})
    marker_dir = Path(target.run.run_dir) if target.run is not None and target.run.run_dir else target.run_dir
    found.local = local_facts(marker_dir, newest.job_id, found.logs, ranks, newest.submitted_at)
    return found


def _load_unrecorded_run(args: argparse.Namespace, target: RunTarget) -> Inputs:
    """A run directory the ledger has no job for: the cause from its newest job's logs alone (the job id
    could be Slurm's or a local process's, so no Slurm command runs)."""
    from hpc_agent.state.ledger import LEDGER_FILE

    where = f"the ledger at {target.runs_root}" if (target.runs_root / LEDGER_FILE).is_file() else \
        f"no ledger at {target.runs_root}"
    if target.run is not None:
        errors = [s.error for s in target.submissions if s.error]
        why = f"run {target.run_id} has no submitted job in {where}" + (f" (last error: {errors[-1]})" if errors else "")
    else:
        why = f"run {target.run_id} is not recorded ({where})"
    job_key = _newest_job_key(target.run_dir, args.read_caps)
    if job_key is None and not args.log:
        raise UsageError(f"{why}, and {rundir.slurm_dir(target.run_dir)} has no job log: nothing to diagnose")
    found = Inputs(job_key, mode="logs", state_from=FROM_NOTHING, run_id=target.run_id, run_dir=target.run_dir)
    found.notes.append(f"{why}: the state is unknown; the cause is from the logs of job {job_key or '?'} alone")
    _job_logs(found, args, job_key or "")
    return found


def _read_run_files(found: Inputs, args: argparse.Namespace) -> None:
    """The run's config (the policy's numbers) and TensorBoard alarms, where a run directory (or --tb) is known."""
    caps = args.read_caps
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


def report_of(found: Inputs) -> Dict[str, Any]:
    """The pure diagnosis that fits what was read."""
    if found.mode == "logs":
        report = diagnose_logs(found.logs, found.alarms, found.cfg, job_id=found.job_id or "")
    elif found.mode == "local" and found.local is not None:
        report = diagnose_local(found.local, found.logs, found.alarms, found.cfg)
    else:
        report = diagnose(found.job_id, found.sacct_text, found.logs, found.alarms, found.cfg, found.sacct_error,
                          found.earlier, found.decisions)
        report["state_from"] = found.state_from
    if found.run_id:
        report["run_id"] = found.run_id
    return report


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed by argparse
        return int(exc.code or 0)
    configure(args)
    if args.remote:  # every path (--log, --tb, --sacct-file, --runs-root) is one on the login node
        return ssh.forward("diagnose", ssh.local_argv(argv), args)
    if not args.job_id and not args.sacct_file and not args.log:
        parser.print_usage(sys.stderr)
        print("diagnose: give a JOBID, a RUN_ID or RUN_DIR, --sacct-file FILE, or --log FILE", file=sys.stderr)
        return EXIT_USAGE
    if args.tail_bytes <= 0:
        print("diagnose: --tail-bytes must be positive", file=sys.stderr)
        return EXIT_USAGE
    try:
        found = load_inputs(args)
    except UsageError as exc:
        print(f"diagnose: {exc}", file=sys.stderr)
        return EXIT_USAGE
    report = report_of(found)
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
    sys.exit(invocation.run(main))

"""How a local-executor job ended, from what is known without Slurm. Pure.

``submit --executor local`` runs the job through submitit's ``LocalExecutor``: the ledger's job id is the id of
the process that runs the tasks on the submitting machine (``<run dir>/slurm/<pid>_<rank>_log.out``), and sacct
never heard of it. Nothing records that process's exit status: submitit's controller drops its tasks' codes,
and the submit command that started it has usually exited. So the end is read from three facts, and the report
says which ones it rests on:

- whether the process is alive (the caller looks: ``/proc/<pid>`` and its command line, else ``os.kill(pid, 0)``;
  the log's ``JobEnvironment(job_id=..., hostname=H`` line says which host it ran on: on another host the id
  means nothing here, so liveness is unknown);
- each rank's result file ``<pid>_<rank>_result.pkl``: submitit writes ``("success", value)`` when the job's
  callable returned, ``("error", traceback)`` when an exception escaped it. Its first string is read from the
  pickle's opcodes (``hpc_agent.core.pickle_scan``), never by unpickling. The job callables (``launch/job.py``)
  raise ``SystemExit(code)`` for a non-zero code, which leaves no result file;
- the log's last ``[hpc_agent] ... exiting N`` line (:func:`hpc_agent.core.exit_codes.announced_exit_code`).

A live process is ``RUNNING``; a process that is gone, or that said how it ended, gets the state those facts
give (``COMPLETED`` 0:0, ``FAILED`` N:0), and the cause comes from the same classifier the Slurm path uses
(:func:`hpc_agent.diagnosis.classify.classify_attempt`); with no fact at all the state stays unknown and the cause
is read from the logs alone (:func:`hpc_agent.diagnosis.classify.classify_logs`).

The watcher follows a local job through the same core as a Slurm one: :func:`local_attempt` turns the state and
the two times the machine knows (the process started when the ledger recorded it; it ended when its last result
file or log was written) into the one-attempt sacct record ``follow`` reads.
"""
from __future__ import annotations

import re
import datetime as _dt
from dataclasses import dataclass, replace
from typing import List, Optional, Sequence, Tuple

from hpc_agent.core.exit_codes import announced_exit_code
from hpc_agent.core.rundir import LogText
from hpc_agent.diagnosis.classify import Diagnosis, classify_attempt, classify_logs
from hpc_agent.metrics.alarm_kinds import Alarm
from hpc_agent.slurm.sacct import SACCT_TIME, Attempt, SacctRow, row_from_fields

SUCCESS, ERROR = "success", "error"  # the first string of submitit's result pickle
_HOST_RE = re.compile(r"JobEnvironment\(job_id=(?P<job>[^,\s)]+), hostname=(?P<host>[^,\s)]+)")


@dataclass(frozen=True)
class LocalFacts:
    """What the caller found out about one local job (``pid``: the ledger's job id)."""

    pid: str
    alive: Optional[bool]
    """True: the process runs; False: it is gone; None: cannot tell (another host, no such check here)."""
    alive_basis: str
    """How ``alive`` was judged, in words (``"no process 4242 on this host"``)."""
    results: Tuple[Tuple[int, str], ...] = ()
    """``(rank, first string)`` of each result file found: ``success``, ``error``, or ``""`` (unreadable)."""
    submitted_at: str = ""
    """When the ledger recorded the job (for the report's first line)."""


def host_of(logs: Sequence[LogText], pid: str) -> Optional[str]:
    """The host submitit's ``Starting with JobEnvironment(job_id=PID, hostname=H, ...)`` line names, or None."""
    for log in logs:
        for m in _HOST_RE.finditer(log.text):
            if m.group("job") == pid:
                return m.group("host")
    return None


def _announced(logs: Sequence[LogText]) -> Optional[Tuple[int, str]]:
    """The exit line that says most: the first non-zero ``exiting N`` of any rank's log, else any ``exiting 0``."""
    found = [a for a in (announced_exit_code(log.text.splitlines()) for log in logs) if a is not None]
    return next((a for a in found if a[0] != 0), found[0] if found else None)


def local_state(facts: LocalFacts, logs: Sequence[LogText]) -> Tuple[str, str, List[str]]:
    """``(state, exit code, basis)``: a Slurm-like state (``""`` when unknown), ``N:0`` or ``""``, and the
    lines saying what the state rests on."""
    head = f"local process {facts.pid} (executor local: no sacct record; the ledger recorded it" + \
           (f" at {facts.submitted_at})" if facts.submitted_at else ")")
    basis = [head, facts.alive_basis]
    tags = {tag for _, tag in facts.results}
    if facts.results:
        shown = ", ".join(f"rank {rank}: {tag or 'unreadable'}" for rank, tag in facts.results)
        basis.append(f"result file(s), read without unpickling: {shown}")
    announced = _announced(logs)
    if announced is not None:
        basis.append(f"exit line in the log: {announced[1]}")
    if facts.alive:
        return "RUNNING", "", basis
    if announced is not None and announced[0] != 0:
        return "FAILED", f"{announced[0]}:0", basis + [f"state FAILED, exit {announced[0]}: from the exit line"]
    if ERROR in tags:
        return "FAILED", "1:0", basis + ["state FAILED, exit 1: an exception escaped the job (its result file says "
                                         "error; submitit then exits 1)"]
    if tags == {SUCCESS} or (announced is not None and not tags - {SUCCESS}):
        why = "the result file says success" if tags == {SUCCESS} else "the exit line says 0"
        return "COMPLETED", "0:0", basis + [f"state COMPLETED, exit 0: {why}"]
    if facts.alive is False:
        return "FAILED", "", basis + ["state FAILED, exit status not recorded: the process is gone and left no "
                                      "success result (our jobs leave none for a non-zero exit, nor does a kill)"]
    return "", "", basis + ["state unknown: liveness cannot be checked here and the job left no result or exit line"]


def classify_local(facts: LocalFacts, logs: Sequence[LogText], alarms: Sequence[Alarm] = ()) -> Diagnosis:
    """The cause of a local job's end (or its being alive), with the basis lines first in the evidence."""
    state, exit_code, basis = local_state(facts, logs)
    if not state:
        found = classify_logs(logs, alarms, job_id=facts.pid)
        return replace(found, evidence=tuple(basis) + found.evidence)
    row = row_from_fields({"JobID": facts.pid, "State": state, "ExitCode": exit_code})
    if row is None:  # not a process id (the ledger is ours, so only a hand-made row): state unknown
        found = classify_logs(logs, alarms, job_id=facts.pid)
        return replace(found, evidence=tuple(basis) + found.evidence)
    found = classify_attempt(Attempt(row.job_key, 0, (row,)), logs, alarms)
    # classify_attempt's first line is its sacct line ("sacct: job P attempt 1: ..."): there was no sacct.
    rest = found.evidence[1:] if found.evidence and found.evidence[0].startswith("sacct:") else found.evidence
    return replace(found, evidence=tuple(basis) + rest)




def sacct_time(at: Optional[float]) -> str:
    """Epoch seconds as sacct prints a time; ``Unknown`` (sacct's word for a running job's End) for None."""
    if at is None:
        return "Unknown"
    return _dt.datetime.fromtimestamp(int(at)).strftime(SACCT_TIME)


def elapsed_text(seconds: float) -> str:
    """sacct's Elapsed: ``[D-]HH:MM:SS``."""
    total = max(0, int(seconds))
    days, rest = divmod(total, 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text


def local_row(pid: str, state: str, exit_code: str, started_at: Optional[float], ended_at: Optional[float],
              host: str = "") -> Optional[SacctRow]:
    """The sacct-like allocation row of a local job; None when ``pid`` is no process id or ``state`` is unknown.

    ``started_at``: when the process started (the ledger's record of it); ``ended_at``: when it ended (its
    newest result file or log), used only for an ended state, and never before the start (a clock step, or a
    file touched before the start). A running job's row has ``End`` ``Unknown`` and no ``Elapsed``, as sacct's
    rows the watcher reads (fixed from tick to tick while the job runs)."""
    if not state or not pid.isdigit():
        return None
    ended = state != "RUNNING"  # local_state gives RUNNING, COMPLETED or FAILED
    end = max(ended_at, started_at) if ended and ended_at is not None and started_at is not None else \
        (ended_at if ended else None)
    fields = {"JobID": pid, "JobName": "", "State": state, "ExitCode": exit_code or ("0:0" if state == "COMPLETED"
                                                                                    else ""),
              "NodeList": host.split(".")[0], "Start": sacct_time(started_at), "End": sacct_time(end)}
    if ended and end is not None and started_at is not None:
        fields["Elapsed"] = elapsed_text(end - started_at)
    return row_from_fields(fields)


def local_attempt(pid: str, state: str, exit_code: str, started_at: Optional[float], ended_at: Optional[float],
                  host: str = "") -> Optional[Attempt]:
    """The one attempt of a local job, as ``group_attempts`` would give it from sacct (index 0: a local job is
    never requeued under its id; a repair is a new process, a new job); None while its state is unknown."""
    row = local_row(pid, state, exit_code, started_at, ended_at, host)
    return Attempt(row.job_key, 0, (row,)) if row is not None else None

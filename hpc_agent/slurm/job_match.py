"""Does a sacct record belong to this run's job? Pure: a run's claim and an attempt in, a verdict out.

Job ids are not unique forever. After a slurmdbd reset, or on a federated cluster, ``sacct --jobs 123``
can list an older job that had id 123 too, and list it first (a known submitit/hydra report). Acting on
that row would requeue, resubmit or stop a run for what another job did. So the watcher keeps an
attempt only when nothing in its allocation row says it is another job's:

- its job name is one hpc_agent gives this run: ``hpc_agent:<run id>`` (:func:`job_name_for`), or the
  sweep array name ``hpc_agent:sweep:<sweep>:<batch>`` (``sweep.batch.array_name``) for a trial whose run
  id is ``<sweep>-tNNN`` (``sweep.spec.trial_run_id``);
- its comment, where it names a run id (``hpc_agent run_id=<run id>``, :func:`comment_for`) or a
  sweep (``hpc_agent sweep=<sweep> ...``), names this one;
- for a plain run, it was submitted no earlier than the run's recorded intent to submit, less
  :data:`SUBMIT_SLACK_S` for clock skew between this host and slurmctld. (A sweep registers its trials
  after sbatch, possibly much later on adoption, so its ledger time is no lower bound: name and comment
  carry a trial's identity.)

Evidence that is missing (a column the reply has not, an empty comment, ``Unknown`` times, the squeue
fallback's rows, slurmdbd's placeholder name ``allocation``) never disqualifies a row; evidence that disagrees always does. Step rows (``123.batch``,
``123.0``) carry the step's name, not the job's, and are judged with the attempt they belong to.
"""
from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass, replace
from typing import Dict, Optional, Sequence, Tuple

from hpc_agent.slurm.sacct import Attempt, SacctRow

JOB_NAME_PREFIX = "hpc_agent:"


def job_name_for(run_id: str) -> str:
    """The Slurm job name carries the run id, so a watcher can find a run's jobs from sacct alone."""
    return f"{JOB_NAME_PREFIX}{run_id}"


def run_id_from_job_name(job_name: str) -> str | None:
    return job_name[len(JOB_NAME_PREFIX):] if job_name.startswith(JOB_NAME_PREFIX) else None


def comment_for(run_id: str) -> str:
    """The Slurm comment of a run's job: it names the run (read back by :func:`judge` through ``_COMMENT_RUN``)."""
    return f"hpc_agent run_id={run_id}"


SUBMIT_SLACK_S = 300.0
"""How much earlier than the recorded intent a job's Submit time may read and still be the run's (clock skew
between the login node and slurmctld; a reused id's older job is typically days older)."""

_SWEEP_NAME = re.compile("^" + re.escape(JOB_NAME_PREFIX) + r"sweep:(?P<sweep>.+):(?P<batch>[^:]*)$")
_TRIAL_RUN_ID = re.compile(r"^(?P<sweep>.+)-t\d{3,}$")
_COMMENT_RUN = re.compile(r"\bhpc_agent run_id=(?P<run>\S+)")
_COMMENT_SWEEP = re.compile(r"\bhpc_agent sweep=(?P<sweep>\S+)")
_NO_TIME = ("", "Unknown", "None", "N/A")
SLURMDBD_PLACEHOLDER_NAME = "allocation"
"""The JobName slurmdbd (22.05, measured on the localhost cluster) shows for a job whose record is not complete
yet: from submission until a moment after the job ends, ``sacct`` reads ``624|allocation|PENDING`` while its
batch step runs. It says nothing about whose job it is; the submit time still does."""


@dataclass(frozen=True)
class Claim:
    """What the ledger says about the job a run follows."""

    job_id: str
    run_id: str
    intent_at: Optional[float] = None
    """Epoch seconds at which the run recorded its intent to submit (before sbatch); None: unknown."""


@dataclass(frozen=True)
class Foreign:
    """An attempt listed under the run's job id that is another job's, with why."""

    job_id: str
    position: int
    """Its position among the job id's attempts in sacct's order (0: listed first)."""
    reason: str
    job_name: str
    submit: str

    def describe(self) -> str:
        return (f"ignored a sacct record under job id {self.job_id} (listed #{self.position + 1}): {self.reason} "
                f"-- another job with the same id (job name {self.job_name!r}, submitted {self.submit or 'unknown'})")


def parse_submit(text: str) -> Optional[float]:
    """sacct's ``Submit`` (``2026-12-01T12:40:03``, local time as sacct prints it) -> epoch seconds; None
    when it states no time or is not a time."""
    text = (text or "").strip()
    if text in _NO_TIME:
        return None
    try:
        return _dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return None


def row_foreign_reason(row: SacctRow, claim: Claim) -> Optional[str]:
    """Why this allocation row is another job's, or None when nothing in it says so."""
    name = row.get("JobName")
    sweep = None
    if name and name != SLURMDBD_PLACEHOLDER_NAME:
        if name == job_name_for(claim.run_id):
            pass
        else:
            match = _SWEEP_NAME.match(name)
            trial = _TRIAL_RUN_ID.match(claim.run_id)
            if not (match and trial and match.group("sweep") == trial.group("sweep")):
                return f"job name {name!r} is not this run's ({job_name_for(claim.run_id)!r})"
            sweep = match.group("sweep")
    comment = row.get("Comment")
    if comment:
        named = _COMMENT_RUN.search(comment)
        if named and named.group("run") != claim.run_id:
            return f"its comment names run {named.group('run')!r}, not {claim.run_id!r}"
        swept = _COMMENT_SWEEP.search(comment)
        trial = _TRIAL_RUN_ID.match(claim.run_id)
        if swept and not (trial and swept.group("sweep") == trial.group("sweep")):
            return f"its comment names sweep {swept.group('sweep')!r}, which run {claim.run_id!r} is not part of"
    if sweep is None and claim.intent_at is not None:
        submitted = parse_submit(row.get("Submit"))
        if submitted is not None and submitted < claim.intent_at - SUBMIT_SLACK_S:
            intent = _dt.datetime.fromtimestamp(claim.intent_at).strftime("%Y-%m-%dT%H:%M:%S")
            return (f"submitted {row.get('Submit')}, before this run asked for its job ({intent}, "
                    f"{SUBMIT_SLACK_S:.0f} s slack)")
    return None


def attempt_foreign_reason(attempt: Attempt, claim: Claim) -> Optional[str]:
    """An attempt is judged by its allocation rows (every component of a heterogeneous job must be the
    run's); an attempt that has only step rows by its submit time alone (a step's name is the step's)."""
    for row in attempt.allocations:
        reason = row_foreign_reason(row, claim)
        if reason:
            return reason
    if not attempt.allocations and claim.intent_at is not None:
        for row in attempt.steps:
            submitted = parse_submit(row.get("Submit"))
            if submitted is not None and submitted < claim.intent_at - SUBMIT_SLACK_S:
                return f"its step {row.job_id} was submitted {row.get('Submit')}, before this run asked for its job"
    return None


def own_attempts(attempts: Sequence[Attempt], claim: Claim) -> Tuple[Tuple[Attempt, ...], Tuple[Foreign, ...]]:
    """``(the run's attempts renumbered 0, 1, ... in sacct's order, the other jobs' attempts)``.

    Renumbering keeps the run's attempt indexes (the ledger's decided/expedited marks) independent of how
    many older jobs sacct lists under the same id. An empty first element: sacct has nothing of this run's
    job yet (unknown, never gone)."""
    own = []
    foreign = []
    for position, attempt in enumerate(attempts):
        reason = attempt_foreign_reason(attempt, claim)
        if reason is None:
            own.append(attempt if attempt.index == len(own) else replace(attempt, index=len(own)))
        else:
            row = attempt.primary
            foreign.append(Foreign(claim.job_id, position, reason, row.get("JobName") if row else "",
                                   row.get("Submit") if row else ""))
    return tuple(own), tuple(foreign)


def claims_by_job(rows: Sequence[Tuple[str, str, str, Optional[float]]]) -> Dict[str, Claim]:
    """``{job id: Claim}`` from the ledger's ``(run id, phase, job id, intent_at)`` rows."""
    return {job_id: Claim(job_id, run_id, intent_at) for run_id, _, job_id, intent_at in rows if job_id}

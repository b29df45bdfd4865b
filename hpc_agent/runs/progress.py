"""Gathering the live progress of runs (I/O) for ``hpc_agent.runs.progress_view`` to render.

Per poll, for every followed run together: one ``squeue`` for their state and pending reason, one more
(only while one pends) for the partition's pending jobs, whose order by priority is the run's place in
the queue; one ``sacct`` only for jobs squeue no longer lists (ended); each run's heartbeat files (step,
recent step times: steps/s and ETA) and its last cause and decision in the ledger's audit trail. A Slurm
error leaves the fields unknown: progress is never a reason to stop waiting. A local-executor job (a process
id) is never sent to squeue or sacct: its state is read from its process and files.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from hpc_agent.config.load import load_run_config
from hpc_agent.core import rundir
from hpc_agent.core.lease_rules import LOCAL_PREFIX
from hpc_agent.runs.progress_view import QUEUED, RunView
from hpc_agent.slurm.cli import SlurmError

QUEUE_FORMAT = "%i|%T|%r|%P|%Q"


def _job_order(job: str) -> Tuple[int, str]:
    head = job.split("_")[0]
    return (int(head) if head.isdigit() else 0, job)


def _row_for(job_id: str, rows: Dict[str, Tuple[str, ...]]) -> Optional[Tuple[str, ...]]:
    """squeue's row for a job; an array task still pending in its array's record (``123_[4-7%2]``) counts."""
    if job_id in rows:
        return rows[job_id]
    base = job_id.split("_")[0]
    return next((row for key, row in rows.items() if "_" in job_id and key.startswith(f"{base}_[")), None)


def parse_queue(text: str) -> Dict[str, Tuple[str, ...]]:
    """``squeue --format %i|%T|%r|%P|%Q`` -> {job id: (state, reason, partition, priority)}."""
    rows: Dict[str, Tuple[str, ...]] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) >= 5 and parts[0]:
            rows[parts[0]] = tuple(parts[1:5])
    return rows


def positions(pending: Dict[str, Tuple[str, ...]]) -> Dict[str, Tuple[int, int]]:
    """{job id: (1-based place, pending jobs)} within each partition, highest priority first, then oldest."""
    by_part: Dict[str, List[Tuple[float, str]]] = {}
    for job, (state, _, part, prio) in pending.items():
        if state != "PENDING":
            continue
        try:
            value = float(prio)
        except ValueError:
            value = 0.0
        for name in part.split(","):  # a job pending in several partitions queues in each
            by_part.setdefault(name, []).append((value, job))
    out: Dict[str, Tuple[int, int]] = {}
    for jobs in by_part.values():
        jobs.sort(key=lambda pj: (-pj[0], _job_order(pj[1])))
        for place, (_, job) in enumerate(jobs, 1):
            if job not in out or place < out[job][0]:
                out[job] = (place, len(jobs))
    return out


def queue_info(slurm, job_ids: Sequence[str]) -> Tuple[Dict[str, Tuple[str, ...]], Dict[str, Tuple[int, int]]]:
    """(squeue's rows for these jobs, their places among their partitions' pending jobs); ({}, {}) on error."""
    if not job_ids:
        return {}, {}
    try:
        ours = parse_queue(slurm.run(["squeue", "--noheader", "--jobs", ",".join(job_ids), "--format", QUEUE_FORMAT],
                                     check=False).stdout)
        parts = sorted({row[2] for row in ours.values() if row[0] == "PENDING"})
        if not parts:
            return ours, {}
        pending = parse_queue(slurm.run(["squeue", "--noheader", "--states", "PENDING", "--partition", ",".join(parts),
                                         "--format", QUEUE_FORMAT], check=False).stdout)
    except SlurmError:
        return {}, {}
    return ours, positions(pending)


def ended_states(slurm, job_ids: Iterable[str]) -> Dict[str, str]:
    """Accounting's state of each job's newest attempt (for jobs that left the queue); {} on error."""
    from hpc_agent.slurm.sacct import group_attempts, parse_sacct

    ids = sorted(set(job_ids))
    if not ids:
        return {}
    try:
        found = group_attempts(parse_sacct(slurm.sacct(ids)))
    except SlurmError:
        return {}
    return {job: attempts[-1].state for job, attempts in found.items() if attempts}


def heartbeat_progress(run_dir: Path, job_id: str = "") -> Tuple[Optional[int], Optional[float], str]:
    """(step, steps/s, the job's phase) from the ranks' newest heartbeat of ``job_id`` (a resubmitted run's
    old job's beats are not this job's progress); (None, None, "") without one."""
    beats = [b for b in rundir.read_heartbeats(run_dir) if not job_id or b.job_id == job_id]
    if not beats:
        return None, None, ""
    newest = max(beats, key=lambda b: (b.written_at, b.step))
    recent = [s for s in newest.recent_step_s if s > 0]
    rate = len(recent) / sum(recent) if recent else None
    return (newest.step if newest.step_at is not None or newest.step else None), rate, newest.phase


def local_state_of(run_dir: Path, job_id: str, started_at: Optional[float]) -> str:
    """A local job's state (RUNNING, COMPLETED, FAILED; "" unknown) from its process and files."""
    from hpc_agent.jobs.local_process import observe_local

    seen = observe_local(run_dir, job_id, started_at)
    return seen.attempt.state if seen.attempt is not None else ""


def last_decision(ledger, run_id: str) -> Tuple[str, str]:
    """(cause, action) of the run's newest audit record that carries both: a decision on an ended attempt,
    or an expedite of a requeued one (which writes no decision row). ("", "") before any."""
    import json

    rows = ledger.db.execute("SELECT record FROM audit WHERE run_id = ? ORDER BY seq DESC LIMIT 50", (run_id,))
    for (text,) in rows:
        try:
            record = json.loads(text)
        except ValueError:
            continue
        action = (record.get("decision") or {}).get("action") or record.get("action")
        if record.get("cause") and action:
            return str(record["cause"]), str(action)
    return "", ""


class Tracker:
    """The views of a set of runs, read from Slurm, the ledger and their files, shown by a printer."""

    def __init__(self, ledger, slurm, printer, clock: Callable[[], float] = time.time):
        self.ledger, self.slurm, self.printer, self.clock = ledger, slurm, printer, clock
        self._max_steps: Dict[str, Optional[int]] = {}

    def max_steps(self, run_id: str, run_dir: Path) -> Optional[int]:
        if run_id not in self._max_steps:
            try:
                self._max_steps[run_id] = int(load_run_config(run_dir).train.max_steps)
            except Exception:  # noqa: BLE001 - a config that cannot be read: the total is unknown, not an error
                self._max_steps[run_id] = None
        return self._max_steps[run_id]

    def views(self, runs: Sequence[Tuple[str, str]], finals: Optional[Dict[str, str]] = None) -> List[RunView]:
        """``runs``: (label, run id) pairs. ``finals``: run id -> its final state, for runs that are over."""
        finals = finals or {}
        rows, local = [], {}
        for label, run_id in runs:
            run, sub = self.ledger.run(run_id), self.ledger.latest_submission(run_id)
            job = (sub.job_id or "") if sub else ""
            if sub is not None and sub.executor == "local" and job and run is not None:
                local[run_id] = local_state_of(Path(run.run_dir), job, sub.submitted_at or sub.intent_at)
            rows.append((label, run_id, run, job))
        # A local job's id is a process id: its state comes from the process, never from squeue or sacct.
        live = [job for _, run_id, _, job in rows if job and run_id not in finals and run_id not in local]
        ours, places = queue_info(self.slurm, live)
        gone = ended_states(self.slurm, [job for job in live if _row_for(job, ours) is None])
        views = []
        for label, run_id, run, job in rows:
            if run is None:
                views.append(RunView(label, final=finals.get(run_id, "")))
                continue
            row = _row_for(job, ours) if job and run_id not in local else None
            state = local[run_id] if run_id in local else row[0] if row else gone.get(job, "")
            place = places.get(job) or next((p for key, p in places.items() if row and key.startswith(
                f"{job.split('_')[0]}_[")), None)
            queued = state in QUEUED or (not state and run.phase in ("submitting", "pending"))
            # A queued (or requeued) job's heartbeats are its previous attempt's: not this one's progress.
            # A local job's ranks name it local-<pid> in their heartbeats (launch/heartbeat.py).
            beat_job = f"{LOCAL_PREFIX}{job}" if run_id in local and job else job
            step, rate, job_phase = (None, None, "") if queued else heartbeat_progress(Path(run.run_dir), beat_job)
            cause, action = last_decision(self.ledger, run_id)
            views.append(RunView(
                label, job_id=job, state=state, reason=row[1] if row and row[0] == "PENDING" else "",
                position=place[0] if place and state == "PENDING" else None,
                queued=place[1] if place and state == "PENDING" else None,
                partition=row[2] if row and state == "PENDING" else "", step=step,
                max_steps=self.max_steps(run_id, Path(run.run_dir)), rate=rate, job_phase=job_phase,
                cause=cause, decision=action, phase=run.phase,
                final=finals.get(run_id, "")))
        return views

    def show(self, runs: Sequence[Tuple[str, str]], finals: Optional[Dict[str, str]] = None) -> List[RunView]:
        views = self.views(runs, finals)
        self.printer.update(views, self.clock())
        return views

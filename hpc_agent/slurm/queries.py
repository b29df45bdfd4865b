"""Small questions the watcher asks slurmctld and accounting, over the one Slurm adapter (``SlurmCLI`` or
an injected fake with the same ``run``). Each answers None when Slurm cannot be asked, never a guess."""
from __future__ import annotations

import datetime as _dt
import os
from typing import List, Optional

from hpc_agent.slurm.cli import SlurmError
from hpc_agent.slurm.sacct import parse_sacct


def own_jobs(uid: Optional[int] = None) -> List[str]:
    """The option that scopes a squeue/sacct/scancel lookup to this user's jobs: ``--user=<uid>`` (all three
    take it, Slurm 20.11 to 24.x). squeue lists every user's jobs unless the cluster sets PrivateData=jobs,
    and sacct run by root (or an operator) lists everyone's, so a lookup by job name without it can match
    another user's job of the same name, and the watcher would adopt (or scancel would cancel) it. The one
    home of that scope: every lookup by name adds it."""
    return [f"--user={os.getuid() if uid is None else uid}"]


def queue_state(slurm, job_id: str) -> Optional[str]:
    """slurmctld's word on whether the job is queued or running again: its state (``PENDING``...),
    "" when it is not in the queue, None when squeue cannot be asked."""
    try:
        out = slurm.run(["squeue", "--noheader", "--jobs", job_id, "--format", "%T"], check=False)
    except SlurmError:
        return None
    if out.returncode != 0 and "Invalid job id" not in out.stderr:
        return None
    return out.stdout.strip()


def jobs_named(slurm, name: str, since: float) -> Optional[List[str]]:
    """Job ids of this user's jobs (:func:`own_jobs`) that Slurm knows under job name ``name``, submitted after
    ``since`` (epoch seconds), from squeue and sacct together (a job can have left the queue, or not yet reached accounting). squeue is asked for
    every state: a job that ended seconds ago is in neither squeue's default (active) list nor, while
    slurmdbd lags, in accounting, and a missed job here is a job submitted twice."""
    start = _dt.datetime.fromtimestamp(since - 60).strftime("%Y-%m-%dT%H:%M:%S")
    try:
        queued = slurm.run(["squeue", "--noheader", "--states", "all", *own_jobs(), "--name", name,
                            "--format", "%i"]).stdout.split()
        text = slurm.run(["sacct", "--parsable2", "--allocations", *own_jobs(), "--name", name,
                          "--starttime", start, "--format", "JobID,JobName,State"]).stdout
    except SlurmError:
        return None
    accounted = [row.job_id for row in parse_sacct(text)]

    def order(job: str) -> int:
        head = job.split("_")[0]
        return int(head) if head.isdigit() else 0

    return sorted(set(queued) | set(accounted), key=order)

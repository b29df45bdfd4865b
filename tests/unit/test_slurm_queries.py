"""hpc_agent.slurm.queries against the canonical FakeSlurm: what each answer means, and None when Slurm is silent."""
from __future__ import annotations

import pytest

from hpc_agent.slurm.queries import jobs_named, queue_state
from tests.helpers.fake_slurm import FakeSlurm


def queue_state_case(case: str):
    slurm = FakeSlurm(first_job_id=12)
    job = slurm.submit("r", hold=True)
    if case == "ended":
        slurm.run(["scontrol", "release", job])
        slurm.schedule()
        slurm.complete(job)
    elif case == "purged":
        slurm.cancel(job)
        slurm.purge(job)  # slurmctld forgot it (MinJobAge): squeue says "Invalid job id specified", rc 1
    elif case == "controller down":
        slurm.break_command("squeue", "slurm_load_jobs error: Unable to contact slurm controller (connect failure)")
    elif case == "timeout":
        slurm.break_command("squeue", timeout=True)
    return slurm, job


@pytest.mark.parametrize("case, state", [
    ("held", "PENDING"),
    ("ended", ""),             # not queued any more
    ("purged", ""),            # purged from slurmctld
    ("controller down", None),
    ("timeout", None),
])
def test_queue_state(case, state):
    slurm, job = queue_state_case(case)
    assert queue_state(slurm, job) == state
    assert slurm.counts["squeue"] == 1


def named_world(case: str):
    slurm = FakeSlurm(first_job_id=7, sacct_lag_s=5)
    if case == "empty":
        return slurm
    done = slurm.submit("hpc_agent:r1")
    slurm.start(done)
    slurm.complete(done)
    slurm.next_id = 12
    array = slurm.submit("hpc_agent:r1", array=[3])
    slurm.start(f"{array}_3")
    slurm.submit("hpc_agent:other")
    slurm.advance(10)
    slurm.submit("hpc_agent:r1")  # job 14: queued, not yet in accounting (sacct lags a few seconds)
    if case == "ended, not yet accounted":
        slurm.start("14")
        slurm.complete("14")  # out of squeue's default (active) list, and still past sacct's lag
    if case == "squeue fails":
        slurm.break_command("squeue", timeout=True)
    if case == "sacct fails":
        slurm.break_command("sacct", "sacct: error: Problem talking to the database: Connection refused")
    return slurm


@pytest.mark.parametrize("case, found", [
    ("union", ["7", "12_3", "14"]),   # squeue and sacct together, numeric order, array ids kept
    ("ended, not yet accounted", ["7", "12_3", "14"]),  # slurmctld still remembers it (MinJobAge)
    ("empty", []),
    ("squeue fails", None),
    ("sacct fails", None),
])
def test_jobs_named(case, found):
    slurm = named_world(case)
    assert jobs_named(slurm, "hpc_agent:r1", since=slurm.now - 3600) == found

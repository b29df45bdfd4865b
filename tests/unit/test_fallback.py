"""Job states from squeue/scontrol where accounting is off, in the sacct shape the watcher reads."""
from __future__ import annotations

import pytest

from hpc_agent.slurm.fallback import as_sacct_text, parse_scontrol_jobs, parse_squeue
from hpc_agent.slurm.sacct import group_attempts, parse_sacct

SCONTROL = ("JobId=41 JobName=hpc_agent:r-1 UserId=root(0) JobState=FAILED Reason=NonZeroExitCode Requeue=1 "
            "Restarts=0 BatchFlag=1 ExitCode=3:0 RunTime=00:00:12 StartTime=2026-11-30T10:00:00 "
            "EndTime=2026-11-30T10:00:12 NodeList=node1\n"
            "JobId=42 JobName=hpc_agent:r-2 JobState=PENDING Reason=BeginTime Restarts=2 ExitCode=0:0 "
            "NodeList=(null)\n")
SQUEUE = "43|hpc_agent:r-3|RUNNING|node2|2026-11-30T10:01:00\n"


@pytest.mark.parametrize("job_id, state, attempts, exit_code", [
    ("41", "FAILED", 1, "3:0"),
    ("42", "PENDING", 3, "0:0"),
    ("43", "RUNNING", 1, "0:0"),
])
def test_fallback_rows_read_like_sacct(job_id, state, attempts, exit_code):
    text = as_sacct_text(["41", "42", "43", "44"], parse_squeue(SQUEUE), parse_scontrol_jobs(SCONTROL))
    jobs = group_attempts(parse_sacct(text))
    assert "44" not in jobs  # unknown to slurmctld: left out, which the watcher reads as unknown (wait)
    assert len(jobs[job_id]) == attempts
    assert jobs[job_id][-1].state == state and jobs[job_id][-1].exit_code == exit_code


def test_squeue_wins_over_stale_scontrol_state():
    text = as_sacct_text(["43"], parse_squeue(SQUEUE), parse_scontrol_jobs("JobId=43 JobState=PENDING Restarts=0"))
    assert group_attempts(parse_sacct(text))["43"][-1].state == "RUNNING"


def test_array_tasks_are_keyed_as_squeue_and_sacct_name_them():
    """scontrol prints an array task's own raw JobId; sweeps follow it as <array>_<task>."""
    line = ("JobId=902 ArrayJobId=900 ArrayTaskId=2 JobName=hpc_agent:sweep:s:b JobState=FAILED Restarts=0 "
            "ExitCode=1:0 NodeList=node1 StartTime=2026-11-30T10:00:00 EndTime=2026-11-30T10:00:09\n")
    jobs = parse_scontrol_jobs(line)
    assert list(jobs) == ["900_2"]
    text = as_sacct_text(["900_2"], {}, jobs)
    assert group_attempts(parse_sacct(text))["900_2"][-1].state == "FAILED"

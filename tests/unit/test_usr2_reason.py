"""Why a job got SIGUSR2 (hpc_agent/slurm/usr2.py), from slurmctld's fields: only Slurm's preemption notice and
its time-limit warning hand over to a successor; a person's ``scancel --signal=USR2`` is a checkpoint request."""
from __future__ import annotations

import pytest

from hpc_agent.core.handback import PREEMPTED, STRAY, TIME_LIMIT, UNKNOWN
from hpc_agent.slurm.fallback import parse_scontrol_jobs
from hpc_agent.slurm.usr2 import EARLY_SLACK_S, usr2_reason

LEAD = 120
RUNNING = {"JobId": "41", "JobState": "RUNNING", "PreemptTime": "None", "TimeLimit": "01:00:00", "RunTime": "00:10:00"}


@pytest.mark.parametrize("change, expected", [
    ({}, STRAY),                                                        # 50 min left: a person's signal
    ({"PreemptTime": "2026-12-05T06:10:00"}, PREEMPTED),                # slurmctld began to preempt it
    ({"PreemptTime": "2026-12-05T06:10:00", "RunTime": "00:59:00"}, PREEMPTED),  # preemption wins near the limit
    ({"RunTime": "00:58:00"}, TIME_LIMIT),                              # exactly the lead left
    ({"RunTime": "00:59:59"}, TIME_LIMIT),
    ({"RunTime": "01:00:30"}, TIME_LIMIT),                              # past the limit (OverTimeLimit)
    ({"RunTime": f"00:{(3600 - LEAD - EARLY_SLACK_S) // 60:02d}:{(3600 - LEAD - EARLY_SLACK_S) % 60:02d}"},
     TIME_LIMIT),                                                       # Slurm may signal up to 60 s early
    ({"RunTime": "00:56:00"}, STRAY),                                   # 4 min left: more than lead + slack
    ({"TimeLimit": "UNLIMITED"}, STRAY),
    ({"TimeLimit": "1-00:00:00", "RunTime": "23:58:30"}, TIME_LIMIT),
    ({"PreemptTime": "Unknown"}, STRAY),
    ({"PreemptTime": "N/A"}, STRAY),
    ({"TimeLimit": "bogus"}, UNKNOWN),
])
def test_the_reason_of_a_sigusr2(change, expected):
    reason, detail = usr2_reason({**RUNNING, **change}, LEAD)
    assert reason == expected, detail


def test_without_slurms_answer_the_reason_is_unknown():
    assert usr2_reason({}, LEAD)[0] == UNKNOWN


def test_a_real_scontrol_line_is_read():
    """A line of ``scontrol --oneliner show job`` as Slurm 22.05 prints it (tests/data/contract/squeue_scontrol.txt)."""
    line = ("JobId=141 JobName=ct JobState=RUNNING Reason=None Restarts=0 RunTime=00:00:03 TimeLimit=UNLIMITED "
            "SubmitTime=2026-12-01T09:31:05 StartTime=2026-12-01T09:31:06 EndTime=Unknown "
            "PreemptEligibleTime=2026-12-01T09:31:06 PreemptTime=None SuspendTime=None Partition=low")
    assert usr2_reason(parse_scontrol_jobs(line)["141"], LEAD)[0] == STRAY
    preempted = line.replace("PreemptTime=None", "PreemptTime=2026-12-01T09:32:00")
    assert usr2_reason(parse_scontrol_jobs(preempted)["141"], LEAD) == (PREEMPTED, "PreemptTime=2026-12-01T09:32:00")


def test_the_job_asks_slurm_and_logs_the_reason_diagnosis_reads():
    """launch/signals.py: one bounded scontrol call; its log line is the one logscan reads as a preemption."""
    from hpc_agent.core.rundir import LogText
    from hpc_agent.diagnosis.logscan import scan_log
    from hpc_agent.slurm.cli import SlurmError
    from launch.signals import say_usr2_reason, usr2_reason as ask
    from tests.helpers.fake_slurm import FakeSlurm

    slurm = FakeSlurm()
    job = slurm.submit("hpc_agent:r1", time_limit="01:00:00")
    slurm.start(job)
    slurm.advance(60)
    assert ask(job, LEAD, slurm)[0] == STRAY
    assert slurm.commands[-1] == ["scontrol", "--oneliner", "show", "job", job]
    assert ask(None, LEAD, slurm)[0] == UNKNOWN
    slurm.break_command("scontrol", timeout=True)
    assert ask(job, LEAD, slurm)[0] == UNKNOWN
    assert isinstance(slurm.broken["scontrol"], SlurmError)

    said = []
    say_usr2_reason(PREEMPTED, "PreemptTime=2026-12-01T09:32:00", said.append)
    assert any(f.cause.value == "preempted" for f in scan_log(LogText("41_0_log.out", "[hpc_agent] " + said[0])))
    say_usr2_reason(STRAY, "no preemption and 3000 s left", said.append)
    assert "checkpoint request" in said[1]
    assert not any(f.cause.value == "preempted" for f in scan_log(LogText("41_0_log.out", "[hpc_agent] " + said[1])))

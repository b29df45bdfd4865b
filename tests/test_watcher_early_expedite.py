"""The watcher expedites a job that requeued itself as soon as slurmctld shows it pending again, before
sacct records the new attempt (measured lag ~4 s; scripts/bench_recovery.py). Fake Slurm, no cluster."""
from __future__ import annotations

from tests.test_watcher import add_run, rows, world  # noqa: F401 - the fixture is used by name

REQUEUED = "9|hpc_agent:r|REQUEUED|0:0|node[1-2]|2026-11-30T10:00:00|2026-11-30T10:05:00|00:05:00"
PENDING = "9|hpc_agent:r|PENDING|0:0|None assigned|Unknown|Unknown|00:00:00"
PREEMPTION_LOG = ("[hpc_agent] signal SIGUSR2 at step 143: checkpoint step_00000143 complete in 0.0s; exiting 75\n"
                  "[hpc_agent] SIGUSR2 with 9:54 left before the time limit: a preemption notice\n"
                  "[hpc_agent] requeued job 9 (scontrol requeue); this attempt ends now\n")
EXPEDITE = ["scontrol", "update", "JobId=9", "StartTime=now"]


def test_expedited_from_squeue_before_sacct_shows_the_pending_attempt(world):  # noqa: F811
    add_run(world, "r", "9", log=PREEMPTION_LOG)
    world["slurm"].sacct_text = rows(REQUEUED)
    world["slurm"].queue_state = "PENDING"
    world["watcher"].tick()
    assert EXPEDITE in world["slurm"].commands
    world["slurm"].commands.clear()
    world["slurm"].sacct_text = rows(REQUEUED, PENDING)  # sacct catches up: no second expedite, no squeue
    world["watcher"].tick()
    world["slurm"].sacct_text = rows(REQUEUED)
    world["watcher"].tick()
    assert world["slurm"].commands == []
    assert world["submit"].calls == [] and world["ledger"].decisions("r") == []


def test_no_expedite_while_the_ended_attempt_is_still_completing(world):  # noqa: F811
    add_run(world, "r", "9", log=PREEMPTION_LOG)
    world["slurm"].sacct_text = rows(REQUEUED)
    world["slurm"].queue_state = "COMPLETING"
    world["watcher"].tick()
    assert EXPEDITE not in world["slurm"].commands
    assert world["submit"].calls == [] and world["ledger"].decisions("r") == []

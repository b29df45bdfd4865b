"""The watcher expedites a job that requeued itself as soon as slurmctld shows it pending again, before
sacct records the new attempt (measured lag ~4 s; scripts/bench/recovery.py). Fake Slurm, no cluster: the
canonical FakeSlurm with its ``sacct_lag_s`` (accounting behind slurmctld) and ``completing_s`` (slurmctld
still cleaning up the attempt that ended)."""
from __future__ import annotations

from tests.unit.test_watcher import add_run, world  # noqa: F401 - the fixture is used by name

PREEMPTION_LOG = ("[hpc_agent] signal SIGUSR2 at step 143: checkpoint step_00000143 complete in 0.0s; exiting 75\n"
                  "[hpc_agent] SIGUSR2 with 9:54 left before the time limit: a preemption notice\n"
                  "[hpc_agent] requeued job {job} (scontrol requeue); this attempt ends now\n")


def expedite(job: str):
    return ["scontrol", "update", f"JobId={job}", "StartTime=now"]


def requeued_itself(world, completing_s: float = 0.0) -> str:  # noqa: F811
    """A running job got a preemption notice, checkpointed and ran ``scontrol requeue`` on itself; accounting
    records the new attempt 4 s late."""
    slurm = world["slurm"]
    _, job = add_run(world, "r", log=PREEMPTION_LOG)
    slurm.sacct_lag_s, slurm.completing_s = 4.0, completing_s
    slurm.requeue(job)
    return job


def test_expedited_from_squeue_before_sacct_shows_the_pending_attempt(world):  # noqa: F811
    slurm = world["slurm"]
    job = requeued_itself(world)
    world["watcher"].tick()  # sacct: REQUEUED only; squeue: PENDING
    assert [a.state for a in slurm.job(job).attempts] == ["REQUEUED", "PENDING"]
    assert expedite(job) in slurm.commands and slurm.expedites == [job]
    slurm.commands.clear()
    slurm.advance(1)  # sacct still behind: the attempt is expedited already, squeue is not asked again
    world["watcher"].tick()
    slurm.advance(4)  # sacct catches up (REQUEUED, PENDING): no second expedite, no squeue
    world["watcher"].tick()
    assert slurm.commands == []
    assert world["submit"].calls == [] and world["ledger"].decisions("r") == []
    assert slurm.schedule() == [job]  # attempt 2 starts now, not after the requeue's 121 s BeginTime


def test_no_expedite_while_the_ended_attempt_is_still_completing(world):  # noqa: F811
    slurm = world["slurm"]
    job = requeued_itself(world, completing_s=2.0)
    world["watcher"].tick()  # sacct: REQUEUED only; squeue: COMPLETING (the nodes are still cleaned up)
    assert slurm.ran("squeue", "--noheader", "--jobs", job)
    assert expedite(job) not in slurm.commands
    assert world["submit"].calls == [] and world["ledger"].decisions("r") == []
    slurm.advance(3)  # cleaned up: squeue says PENDING, sacct still has only the ended attempt
    world["watcher"].tick()
    assert slurm.expedites == [job] and world["submit"].calls == []

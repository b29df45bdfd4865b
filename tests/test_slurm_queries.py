"""hpc_agent.slurm.queries with a fake Slurm client: what each answer means, and None when Slurm is silent."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from hpc_agent.slurm.cli import SlurmError
from hpc_agent.slurm.queries import jobs_named, queue_state


class FakeSlurm:
    def __init__(self, answers):
        self.answers, self.calls = answers, []

    def run(self, argv, check=True):
        self.calls.append(argv)
        answer = self.answers[argv[0]]
        if isinstance(answer, Exception):
            raise answer
        return SimpleNamespace(returncode=answer[0], stdout=answer[1], stderr=answer[2])


@pytest.mark.parametrize("answer, state", [
    ((0, "PENDING\n", ""), "PENDING"),
    ((0, "", ""), ""),                                                    # not queued any more
    ((1, "", "slurm_load_jobs error: Invalid job id specified"), ""),      # purged from slurmctld
    ((1, "", "slurm_load_jobs error: Unable to contact slurm controller"), None),
    (SlurmError("squeue timed out after 30 s"), None),
])
def test_queue_state(answer, state):
    assert queue_state(FakeSlurm({"squeue": answer}), "12") == state


SACCT = "JobID|JobName|State\n7|hpc_agent:r1|COMPLETED\n12_3|hpc_agent:r1|RUNNING\n"


@pytest.mark.parametrize("squeue, sacct, found", [
    ((0, "12_3\n13\n", ""), (0, SACCT, ""), ["7", "12_3", "13"]),   # union, numeric order, array ids kept
    ((0, "", ""), (0, "JobID|JobName|State\n", ""), []),
    (SlurmError("squeue failed"), (0, SACCT, ""), None),
    ((0, "13\n", ""), SlurmError("sacct failed"), None),
])
def test_jobs_named(squeue, sacct, found):
    fake = FakeSlurm({"squeue": squeue, "sacct": sacct})
    assert jobs_named(fake, "hpc_agent:r1", since=1_700_000_000) == found

"""The Slurm contract: what hpc_agent relies on Slurm to do, checked the same way against every Slurm it is
tested with -- the real localhost cluster (scripts/cluster.sh) and every fake in tests/.

A *backend* (:class:`Cluster`) gives the suite a Slurm client with ``SlurmCLI``'s interface (``run``,
``sacct``) plus the few things a client cannot do itself: make a job end its own way (exit code, OOM),
preempt it, and let the scheduler act. Every other step (submit, requeue, expedite, exclude, release,
cancel) goes through the client as hpc_agent sends it, and every answer is read through hpc_agent's own
parsers (``parse_sacct``/``group_attempts``, ``queue_state``, ``jobs_named``, the squeue/scontrol fallback).
A fake that answers differently from Slurm fails here.
"""
from __future__ import annotations

import os
import re
import time
import uuid
from pathlib import Path
from typing import Callable, List, Optional

from hpc_agent.slurm.cli import SlurmCLI
from hpc_agent.slurm.fallback import parse_scontrol_jobs
from hpc_agent.slurm.sacct import SACCT_FIELDS, Attempt, attempts_of, parse_sacct

TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d$")
ELAPSED = re.compile(r"^(\d+-)?\d\d:\d\d:\d\d$")

JOB_SCRIPT = """#!/bin/bash
# A contract job: waits for its order, then exits with it (or runs out of memory).
f="{ctl}/${{SLURM_JOB_ID}}.${{SLURM_RESTART_COUNT:-0}}"
while [ ! -f "$f" ]; do sleep 0.2; done
order=$(cat "$f")
if [ "$order" = oom ]; then exec python3 -c 'import time; b = bytearray(1 << 30); time.sleep(30)'; fi
exit "$order"
"""


class Cluster:
    """One Slurm the contract runs against. Subclasses say how a job ends, how it is preempted, how time passes."""

    name = "?"
    poll_s = 0.0
    uid = str(os.getuid())
    node_a, node_b = "node1", "node2"   # ordinary contract jobs run on node_a; the preempted one on node_b

    def __init__(self, client, ctl_dir: Path):
        self.client = client
        self.ctl = Path(ctl_dir)
        self.ctl.mkdir(parents=True, exist_ok=True)
        self.script = self.ctl / "contract_job.sh"
        self.script.write_text(JOB_SCRIPT.format(ctl=self.ctl))
        self.script.chmod(0o755)
        self.submitted: List[str] = []
        self.tag = uuid.uuid4().hex[:8]

    # --- what every backend does the same way (through the client) ----------------------------------------
    def unique_name(self, what: str) -> str:
        return f"contract-{self.tag}-{what}"

    def submit(self, what: str, hold: bool = False, node: Optional[str] = None, name: Optional[str] = None) -> str:
        argv = ["sbatch", "--parsable", "--job-name", name or self.unique_name(what), "--output", "/dev/null",
                "--mem", "200M", "--nodes", "1", "--ntasks", "1", "--nodelist", node or self.node_a]
        if hold:
            argv.append("--hold")
        job = self.client.run(argv + [str(self.script)]).stdout.strip().split(";")[0]
        self.submitted.append(job)
        return job

    def attempts(self, job: str) -> List[Attempt]:
        return attempts_of(parse_sacct(self.client.sacct([job], fields=SACCT_FIELDS)), job)

    def states(self, job: str) -> List[str]:
        return [a.state for a in self.attempts(job)]

    def scontrol(self, job: str) -> dict:
        text = self.client.run(["scontrol", "--oneliner", "show", "job", job], check=False).stdout
        return parse_scontrol_jobs(text).get(job, {})

    def restarts(self, job: str) -> int:
        return int(self.scontrol(job).get("Restarts", "0") or 0)

    def wait(self, predicate: Callable[[], object], timeout: float, what: str):
        deadline = time.monotonic() + timeout
        polls = 0
        while True:
            self.settle()
            value = predicate()
            if value:
                return value
            polls += 1
            if time.monotonic() > deadline or (self.poll_s == 0 and polls > timeout):
                raise AssertionError(f"[{self.name}] timed out after {timeout:.0f} s waiting for {what}")
            if self.poll_s:
                time.sleep(self.poll_s)

    def wait_states(self, job: str, expected: List[str], timeout: float = 60) -> List[Attempt]:
        self.wait(lambda: self.states(job) == expected, timeout, f"job {job} attempts {expected} "
                                                                  f"(now {self.states(job)})")
        return self.attempts(job)

    def pause(self, seconds: float) -> None:
        """Let time pass (the scheduler acts meanwhile)."""
        for _ in range(int(seconds / max(self.poll_s, 0.5))):
            self.settle()
            if self.poll_s:
                time.sleep(self.poll_s)

    def cleanup(self) -> None:
        if self.submitted:
            self.client.run(["scancel", *self.submitted], check=False)

    # --- what differs ---------------------------------------------------------------------------------------
    def settle(self) -> None:
        """One scheduler pass / one unit of time."""

    def order(self, job: str, order: str) -> None:
        """The running job ends: ``order`` is an exit code or ``oom``."""
        raise NotImplementedError

    def preempt(self, job: str) -> None:
        """Start preempting the running job ``job`` (on ``node_b``) from the high partition."""
        raise NotImplementedError


class RealCluster(Cluster):
    name = "real"
    poll_s = 0.5

    def __init__(self, ctl_dir: Path):
        super().__init__(SlurmCLI(timeout_s=60), ctl_dir)

    def order(self, job: str, order: str) -> None:
        (self.ctl / f"{job}.{self.restarts(job)}").write_text(str(order))

    def preempt(self, job: str) -> None:
        out = self.client.run(["sbatch", "--parsable", "--partition", "high", "--nodes", "1", "--ntasks", "2",
                               "--nodelist", self.node_b, "--mem", "200M", "--job-name", self.unique_name("preemptor"),
                               "--output", "/dev/null", "--wrap", "sleep 1"]).stdout
        self.submitted.append(out.strip().split(";")[0])


class FakeCluster(Cluster):
    """Any fake with the canonical FakeSlurm's driving methods (tests/helpers/fake_slurm.py)."""

    def __init__(self, fake, ctl_dir: Path, name: str = "FakeSlurm"):
        super().__init__(fake, ctl_dir)
        self.fake = fake
        self.name = name
        self.uid = fake.uid

    def settle(self) -> None:
        self.fake.advance(1)
        self.fake.schedule()

    def order(self, job: str, order: str) -> None:
        if order == "oom":
            self.fake.oom(job)
        elif int(order) == 0:
            self.fake.complete(job)
        else:
            self.fake.fail(job, int(order))

    def preempt(self, job: str) -> None:
        self.fake.advance(30)  # the partition's GraceTime
        self.fake.preempt(job)


# --- the contract --------------------------------------------------------------------------------------------
def check_row_formats(text: str) -> None:
    """Every row of a sacct answer is in --parsable2 with the asked fields, timestamps as Slurm prints them."""
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines[0] == "|".join(SACCT_FIELDS)
    for line in lines[1:]:
        cols = dict(zip(SACCT_FIELDS, line.split("|")))
        assert len(line.split("|")) == len(SACCT_FIELDS), line
        assert re.match(r"^\d+(_\d+|_\[[\d,-]+\])?(\.(batch|extern|\d+))?$", cols["JobID"]), line
        assert re.match(r"^\d+:\d+$", cols["ExitCode"]), line
        assert cols["Start"] in ("Unknown", "None") or TS.match(cols["Start"]), line
        assert cols["End"] == "Unknown" or TS.match(cols["End"]), line
        assert ELAPSED.match(cols["Elapsed"]), line


def step(attempt: Attempt, name: str):
    found = [s for s in attempt.steps if s.step == name]
    return found[0] if found else None

"""The watcher follows a run on the local executor (``submit --executor local``) through the same ledger,
lifecycle and core as a Slurm run (issue 44): its attempt is built from the process and its files, never from
sacct; an ended run reaches its end phase; a GPU OOM is resubmitted through the local executor with the
adjusted config; a requeue becomes a local resubmission; a cancel signals only the job's own processes.

The local jobs here are real processes standing in for submitit's controller: their command line names the
run's ``slurm/`` folder (as the controller's does), they write the log, the exit line and the result pickle
submitit and our job callables write, and they end when the test says so. The Slurm client is the fake, to
show that nothing is asked of Slurm.
"""
from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest

from hpc_agent.config.load import build_config, write_run_config
from hpc_agent.core import rundir
from hpc_agent.core.causes import Cause
from hpc_agent.diagnosis.local_job import local_attempt
from hpc_agent.jobs import local_process
from hpc_agent.jobs.submission import record_job
from hpc_agent.policy.decide import ATTENTION, REQUEUE, RESUBMIT, Decision
from hpc_agent.state import run_config
from hpc_agent.state.journal import Journal
from hpc_agent.state.ledger import Ledger
from hpc_agent.state.lifecycle import Phase
from hpc_agent.watcher import effects
from hpc_agent.watcher.follow import follow, local_decision
from hpc_agent.watcher.follow_model import Observation, RunFiles, RunState
from hpc_agent.watcher.loop import Watcher
from tests.helpers.fake_slurm import FakeSlurm

# The stand-in job: argv = [marker (the run's slurm/ folder), mode]. It writes <folder>/<pid>_0_log.out and, on
# success, <pid>_0_result.pkl; it waits for <folder>/go, then ends as its mode says.
JOB = r"""
import os, pickle, sys, time
folder, mode = sys.argv[1], sys.argv[2]
pid = os.getpid()
log = open(os.path.join(folder, f"{pid}_0_log.out"), "a")
log.write(f"submitit INFO - Starting with JobEnvironment(job_id={pid}, hostname=here, local_rank=0(1))\n")
log.write("[hpc_agent] step 3 loss 2.5\n"); log.flush()
while not os.path.exists(os.path.join(folder, "go")):
    time.sleep(0.02)
if mode == "oom":
    log.write("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    log.write("[hpc_agent] out of memory at step 4 during training (micro_batch_size 8, ZeRO-1); exiting 3\n")
    log.close()
    sys.exit(3)
log.write("[hpc_agent] done: 10 steps\n"); log.close()
with open(os.path.join(folder, f"{pid}_0_result.pkl"), "wb") as f:
    pickle.dump(("success", None), f)
"""


class LocalJobs:
    """Starts the stand-in jobs; a config whose micro batch is above 4 runs out of GPU memory (the injected
    ``faults.oom_above_micro_batch=4``). Also ``ctx.submit`` of the watcher: submit_attempt's bookkeeping."""

    def __init__(self):
        self.procs: List[subprocess.Popen] = []
        self.calls = []

    def start(self, run_dir: Path, mode: str) -> str:
        folder = rundir.slurm_dir(run_dir)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "go").unlink(missing_ok=True)
        proc = subprocess.Popen([sys.executable, "-c", JOB, str(folder), mode])
        self.procs.append(proc)
        log = folder / f"{proc.pid}_0_log.out"
        deadline = time.time() + 20
        while not (log.exists() and "step 3" in log.read_text()) and time.time() < deadline:
            time.sleep(0.02)
        return str(proc.pid)

    def end(self, run_dir: Path) -> None:
        """Let the newest job end, and wait until it has (reaped: its process is gone)."""
        (rundir.slurm_dir(run_dir) / "go").touch()
        self.procs[-1].wait(timeout=20)

    def __call__(self, ledger, run_id, run_dir, cfg, config_path, kind, reason):
        run_config.record(ledger, run_id, cfg, f"submitted ({reason})")
        sid = ledger.record_intent(run_id, kind, str(config_path), reason)
        pid = self.start(Path(run_dir), "oom" if cfg.train.micro_batch_size > 4 else "ok")
        record_job(ledger, sid, run_id, pid)
        self.calls.append({"kind": kind, "cfg": cfg, "reason": reason, "job_id": pid})
        return pid

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture
def world(tmp_path):
    root = tmp_path / "runs"
    slurm = FakeSlurm()
    ledger = Ledger(root / "ledger.sqlite")
    jobs = LocalJobs()
    out: List[str] = []
    watcher = Watcher(ledger, slurm, runs_root=root, submit=jobs, out=out.append)
    yield {"root": root, "ledger": ledger, "slurm": slurm, "jobs": jobs, "watcher": watcher, "out": out}
    jobs.close()
    ledger.close()


def add_local_run(world, run_id: str, micro_batch: int) -> Path:
    """A run submitted with the local executor, as submit records it: its pending phase and its process's id."""
    run_dir = world["root"] / run_id
    run_dir.mkdir(parents=True)
    cfg = build_config([{"run": {"name": "t"}, "train": {"micro_batch_size": micro_batch, "grad_accum_steps": 1,
                                                        "max_steps": 10}}])
    path = write_run_config(run_dir, cfg)
    world["ledger"].add_run(run_id, "t", str(run_dir))
    world["jobs"](world["ledger"], run_id, run_dir, cfg, path, "local", "submit")
    return run_dir


def nothing_asked_of_slurm(slurm: FakeSlurm) -> bool:
    return slurm.sacct_calls == [] and slurm.commands == []


def test_a_local_run_that_completes_reaches_the_completed_phase(world):
    ledger, watcher, jobs = world["ledger"], world["watcher"], world["jobs"]
    run_dir = add_local_run(world, "r", micro_batch=4)
    assert ledger.run("r").phase == "pending"
    report = watcher.tick()
    assert ledger.run("r").phase == "running" and report.sacct_calls == 0
    watcher.tick()  # still running: nothing changes
    assert ledger.run("r").phase == "running"
    jobs.end(run_dir)
    watcher.tick()
    assert ledger.run("r").phase == "completed", world["out"]
    records = [r for _, _, r in Journal(ledger).audit_records("r")]
    assert [(r["cause"], r["action"]) for r in records if r.get("cause")] == [("completed", "done")]
    assert nothing_asked_of_slurm(world["slurm"])  # a process id never reaches sacct, squeue or scontrol
    assert (run_dir / "events.jsonl").is_file()


def test_a_local_gpu_oom_is_resubmitted_locally_with_the_adjusted_config_and_completes(world):
    ledger, watcher, jobs = world["ledger"], world["watcher"], world["jobs"]
    run_dir = add_local_run(world, "r", micro_batch=8)
    first = jobs.calls[-1]["job_id"]
    watcher.tick()
    jobs.end(run_dir)  # it runs out of GPU memory: exit line "exiting 3"
    watcher.tick()
    assert len(jobs.calls) == 2, world["out"]
    again = jobs.calls[-1]
    assert again["kind"] == "local"  # the same executor as the job it replaces
    assert (again["cfg"].train.micro_batch_size, again["cfg"].train.grad_accum_steps) == (4, 2)
    (decision,) = ledger.decisions("r")
    assert (decision.job_id, decision.cause, decision.action) == (first, "gpu_oom", "resubmit")
    assert decision.evidence[0].startswith("local process (no sacct")
    assert ledger.run("r").phase == "pending"
    assert [s.executor for s in ledger.submissions("r")] == ["local", "local"]
    watcher.tick()
    assert ledger.run("r").phase == "running"
    jobs.end(run_dir)
    watcher.tick()
    assert ledger.run("r").phase == "completed", world["out"]
    assert nothing_asked_of_slurm(world["slurm"])
    actions = [r.get("action") for _, _, r in Journal(ledger).audit_records("r")]
    assert "resubmit" in actions and "done" in actions  # the effect carried out, audited, then the end


def test_a_local_run_is_followed_beside_slurm_runs_and_its_pid_never_reaches_sacct(world):
    from tests.unit.test_watcher import add_run

    slurm = world["slurm"]
    slurm_dir, slurm_job = add_run({**world, "submit": None}, "s")  # a Slurm run in the same runs root
    add_local_run(world, "l", micro_batch=4)
    pid = world["jobs"].calls[-1]["job_id"]
    world["watcher"].tick()
    assert slurm.sacct_calls == [[slurm_job]] and pid not in slurm.sacct_calls[0]
    assert world["ledger"].run("l").phase == "running"


# --- the pure core for a local job ------------------------------------------------------------------------------
def _state(job_id: str = "4242") -> RunState:
    return RunState("r", Phase.RUNNING, job_id, executor="local")


def test_a_requeue_is_carried_out_as_a_local_resubmission():
    cfg = build_config([{"run": {"name": "t"}, "train": {"max_steps": 100}}])
    attempt = local_attempt("4242", "TIMEOUT", "0:0", 1.0e9, 1.0e9 + 600)
    log = rundir.LogText("4242_0_log.out", "[hpc_agent] step 50 loss 2.0\n")
    files = RunFiles(cfg, (log,), (), (10, 20), (), ())
    outcome = follow(_state(), Observation((attempt,), queue="", files=files))
    assert outcome.decision["action"] == REQUEUE, outcome
    assert [e.kind for e in outcome.effects] == ["release_lease", "resubmit"]  # no scontrol requeue, no expedite
    assert outcome.effects[1].args["patch"] == {} and outcome.expedite_attempt is None
    (audit,) = outcome.audit
    assert "carried out as a resubmission" in audit["executor"]
    slurm = follow(RunState("r", Phase.RUNNING, "4242"), Observation((attempt,), queue="", files=files))
    assert [e.kind for e in slurm.effects] == ["requeue", "expedite"]  # the same end on Slurm


@pytest.mark.parametrize("decision, action, patch, note", [
    (Decision(REQUEUE, "timeout", "t"), REQUEUE, {}, "carried out as a resubmission"),
    (Decision(RESUBMIT, "gpu_oom", "ladder", {"train.micro_batch_size": 4}), RESUBMIT,
     {"train.micro_batch_size": 4}, ""),
    (Decision(RESUBMIT, "gpu_oom", "ladder", {"train.micro_batch_size": 4, "slurm.partition": "big"}), RESUBMIT,
     {"train.micro_batch_size": 4}, "slurm.partition dropped"),
    (Decision(RESUBMIT, "node_fail", "exclude", {"slurm.exclude": "node1"}), ATTENTION, {}, "no local meaning"),
    (Decision(RESUBMIT, "host_oom", "more mem", {"slurm.mem": "8G"}), ATTENTION, {}, "no local meaning"),
    (Decision("stop", "code_error", "fix it"), "stop", {}, ""),
], ids=["requeue", "resubmit-kept", "partition-dropped", "node-fail-parks", "host-oom-parks", "stop-kept"])
def test_local_decision_table(decision, action, patch, note):
    got, said = local_decision(decision)
    assert (got.action, dict(got.patch)) == (action, patch)
    assert (note in said) if note else said == ""
    if action == ATTENTION:
        assert "this one machine" in got.reason and got.cause == decision.cause


def test_a_node_failure_of_a_local_job_parks_the_run():
    cfg = build_config([{"run": {"name": "t"}}])
    attempt = local_attempt("4242", "NODE_FAIL", "", 1.0e9, 1.0e9 + 60, host="lap")
    outcome = follow(_state(), Observation((attempt,), queue="", files=RunFiles(cfg, (), (), (), (), ())))
    assert outcome.phase is Phase.NEEDS_ATTENTION and [e.kind for e in outcome.effects] == ["notify"]
    assert outcome.decision["cause"] == Cause.NODE_FAIL.value


# --- effects on a local process ---------------------------------------------------------------------------------
def test_cancel_signals_the_jobs_own_processes_only(world, tmp_path):
    ledger, jobs = world["ledger"], world["jobs"]
    run_dir = add_local_run(world, "r", micro_batch=4)
    pid = jobs.calls[-1]["job_id"]
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # not the job's
    try:
        assert local_process.job_processes(pid, local_process.marker_of(run_dir)) == [int(pid)]
        row = effects.EffectRow(1, "r", "cancel", pid, {}, 0, time.time(), 0)
        assert effects.carry_out(world["watcher"].ctx, ledger.run("r"), row) == "cancelled (1 processes)"
        assert jobs.procs[-1].wait(timeout=20) == -signal.SIGTERM
        assert bystander.poll() is None
        # Gone now: a second cancel (a watcher killed before marking it done) signals nothing, and a reused
        # pid is never signalled (its command line does not name the run).
        assert effects.carry_out(world["watcher"].ctx, ledger.run("r"), row) == "cancelled (0 processes)"
        assert local_process.job_processes(str(bystander.pid), local_process.marker_of(run_dir)) == []
        wait = effects.EffectRow(2, "r", "await_end", pid, {}, 0, time.time(), 0)
        assert effects.carry_out(world["watcher"].ctx, ledger.run("r"), wait) == "ended"
        expedite = effects.EffectRow(3, "r", "expedite", pid, {}, 0, time.time(), 0)
        assert "local process" in effects.carry_out(world["watcher"].ctx, ledger.run("r"), expedite)
    finally:
        bystander.kill()
        bystander.wait()
    assert nothing_asked_of_slurm(world["slurm"])


def test_a_local_intent_without_a_job_id_is_found_on_this_machine(world):
    """submit died between starting the local job and recording its pid: the watcher finds the process by its
    command line (the run's slurm/ folder and submitit), never by asking Slurm."""
    ledger, jobs = world["ledger"], world["jobs"]
    run_dir = world["root"] / "r"
    run_dir.mkdir(parents=True)
    cfg = build_config([{"run": {"name": "t"}}])
    path = write_run_config(run_dir, cfg)
    ledger.add_run("r", "t", str(run_dir))
    sid = ledger.record_intent("r", "local", str(path), "submit")
    folder = rundir.slurm_dir(run_dir)
    folder.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "-m", "submitit.local._local",
                             str(folder)])
    jobs.procs.append(proc)
    ctx = world["watcher"].ctx
    ctx.clock = lambda: time.time() + 3600  # past the grace any sbatch may still be in flight
    (sub,) = [s for s in ledger.submissions("r") if s.id == sid]
    assert effects.settle_intent(ctx, ledger.run("r"), sub) == str(proc.pid)
    assert ledger.latest_submission("r").job_id == str(proc.pid) and ledger.run("r").phase == "pending"
    assert nothing_asked_of_slurm(world["slurm"])

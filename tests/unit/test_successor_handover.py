"""resilience.successor_on_preempt: the job script's hand-over to a successor job at a preemption
(hpc_agent/core/handback.py), and the watcher's side of it: the marker read as untrusted, the pure core's
decision (tests/unit/test_follow.py's style), and the adopt effect run twice after a crash. The real cluster
runs it end to end in tests/cluster/test_successor_slurm.py."""
from __future__ import annotations

import subprocess
import time

import pytest

from hpc_agent.core import handback
from hpc_agent.core.exit_codes import EXIT_SIGNALLED_AFTER_CHECKPOINT
from hpc_agent.core.rundir import PAUSE_FILE
from hpc_agent.slurm.job_match import job_name_for
from hpc_agent.slurm.sacct import group_attempts, parse_sacct
from hpc_agent.state.lifecycle import Phase
from hpc_agent.watcher.follow import follow
from hpc_agent.watcher.follow_model import ADOPT, CANCEL, Observation, RunState
from tests.helpers import slurm_on_path
from tests.helpers.fake_slurm import FakeSlurm
from tests.unit.test_watcher import world  # noqa: F401 (the fixture)

OLD = "41"  # the watcher tests' job id (the bash tests take theirs from the FakeSlurm)


class Job:
    """One job of a run under hpc_agent's job script with ``resilience.successor_on_preempt``, its batch shell run
    by bash against the FakeSlurm on PATH (tests/helpers/slurm_on_path.py): no watcher anywhere."""

    def __init__(self, tmp_path, slurm=None, with_pickle: bool = True):
        self.root = tmp_path / "runs"
        self.run_dir = self.root / "r1"
        self.folder = self.run_dir / "slurm"
        self.folder.mkdir(parents=True)
        self.state = tmp_path / "slurm.pickle"
        slurm = slurm or FakeSlurm()
        self.old = slurm.submit(job_name_for("r1"))
        slurm.start(self.old)
        (self.folder / f"{self.old}_submission.sh").write_text(
            f"#!/bin/bash\n#SBATCH --job-name={job_name_for('r1')}\nsrun true\n")
        if with_pickle:
            (self.folder / f"{self.old}_submitted.pkl").write_bytes(b"pickled call")
        self.path = slurm_on_path.install(tmp_path / "bin", self.state, slurm)

    @property
    def slurm(self) -> FakeSlurm:
        return slurm_on_path.load(self.state)

    def change(self, what) -> None:
        """Drive the FakeSlurm (``what(slurm)``) between two bash runs, as the cluster would."""
        with slurm_on_path.locked(self.state):
            slurm = slurm_on_path.load(self.state)
            what(slurm)
            slurm_on_path.save(slurm, self.state)

    def script(self, step: str) -> str:
        return "\n".join([*handback.batch_setup_lines(str(self.folder), runs_root=str(self.root)), step,
                          *handback.batch_teardown_lines(successor=True)])

    def run(self, job_id: str, reason=handback.PREEMPTED, step_rc: int = 0, env_extra=None, background=False):
        """The job's batch shell; its srun step stands in as rank 0's marker (``<job id> <reason>``, as
        launch/signals.py writes it after the signal's checkpoint) and the exit code ``step_rc``."""
        marker = f'"$HPC_AGENT_RUN_DIR/{handback.MARKER_PREFIX}$SLURM_JOB_ID"'
        step = (f"printf '%s %s\\n' \"$SLURM_JOB_ID\" {reason} > {marker}; " if reason is not None else "") + \
            f"(exit {step_rc})"
        env = {"PATH": self.path, "SLURM_JOB_ID": job_id, "SLURM_RESTART_COUNT": "2", "SLURM_CONF": "/etc/slurm/slurm.conf",
               "HPC_AGENT_RUN_DIR": str(self.run_dir), **(env_extra or {})}
        argv = ["bash", "-c", self.script(step)]
        if background:
            return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)

    def calls(self):
        return [" ".join(c) for c in self.slurm.commands]

    def queued(self, *job_ids):
        """The jobs slurmctld still holds (pending, running or completing) among ``job_ids``."""
        out = self.slurm.run(["squeue", "--noheader", "--jobs", ",".join(job_ids), "--format", "%i"], check=False)
        return out.stdout.split()


def test_without_a_watcher_the_hand_over_leaves_nothing_in_the_queue(tmp_path):
    """The preempted job submits its successor held, names it, releases it and requeues itself held; the
    successor, once started, cancels the held job itself; when it completes, the run has nothing queued."""
    job = Job(tmp_path)
    proc = job.run(job.old)
    assert proc.returncode == EXIT_SIGNALLED_AFTER_CHECKPOINT, proc.stderr
    new = handback.read_successor(job.run_dir, job.old)
    assert new and f"handed over to job {new}" in proc.stderr
    assert job.calls() == [f"sbatch --parsable --hold {job.folder}/{job.old}_submission.sh", f"scontrol release {new}",
                           f"scontrol requeuehold {job.old}"]  # released before this job ends: eligible in that pass
    assert (job.folder / f"{new}_submitted.pkl").read_bytes() == b"pickled call"  # what submitit's _submit loads
    assert (job.folder / f"{new}_submission.sh").is_file()  # the successor can hand over in turn
    assert not list(job.run_dir.glob("*.tmp")) and (job.root / handback.WAKE_FILE).is_file()
    slurm = job.slurm
    assert slurm.jobs[job.old].state == "PENDING" and slurm.jobs[job.old].held  # requeued held: it never starts
    assert slurm.jobs[new].state == "PENDING" and not slurm.jobs[new].held
    job.change(lambda s: s.start(new))

    proc = job.run(new, reason=None)  # the successor runs (and completes); its setup cancels its predecessor
    assert proc.returncode == 0, proc.stderr
    assert f"job {new} took over from job {job.old}: cancelled held job {job.old}" in proc.stderr
    assert f"scancel --state=PENDING {job.old}" in job.calls()
    assert job.slurm.jobs[job.old].state == "CANCELLED"
    assert job.queued(job.old, new) == [new]
    job.change(lambda s: s.complete(new))
    assert job.queued(job.old, new) == []  # nothing of the run is left in the queue, and no watcher ran


def test_the_successor_waits_for_its_predecessor_to_be_held_before_it_cancels_it(tmp_path):
    """The successor can start before its predecessor's batch shell has requeued itself (a free node): a running
    predecessor is never cancelled, it is asked again until it is held."""
    job = Job(tmp_path)
    (job.run_dir / f"{handback.SUCCESSOR_PREFIX}{job.old}").write_text("177\n")  # job.old handed over to 177
    job.change(lambda s: s.submit(job_name_for("r1")))
    proc = job.run("101", reason=None, background=True)  # not the named successor: it leaves job.old alone
    assert proc.wait(60) == 0 and f"scancel --state=PENDING {job.old}" not in job.calls()
    (job.run_dir / f"{handback.SUCCESSOR_PREFIX}{job.old}").write_text("101\n")
    proc = job.run("101", reason=None, background=True)
    time.sleep(2)
    assert proc.poll() is None and job.slurm.jobs[job.old].state == "RUNNING"  # still waiting, nothing cancelled
    job.change(lambda s: s.run(["scontrol", "requeuehold", job.old]))
    assert proc.wait(60) == 0
    assert job.slurm.jobs[job.old].state == "CANCELLED", proc.stderr.read()


@pytest.mark.parametrize("schedules", [False, True])
def test_a_hand_over_that_fails_after_the_release_is_rolled_back_and_requeues(tmp_path, schedules):
    """The kill point ``after_release``: the successor is released (with a free node the scheduler even starts it),
    then the hand-over fails. The successor is cancelled, squeue confirms it is gone, the marker goes only then, and
    the job requeues itself as it would without a successor."""
    job = Job(tmp_path, FakeSlurm(auto_schedule=schedules))
    proc = job.run(job.old, env_extra={handback.HANDOVER_FAULT_ENV: "after_release"})
    assert proc.returncode == EXIT_SIGNALLED_AFTER_CHECKPOINT, proc.stderr
    slurm = job.slurm
    new = next(j for j in slurm.jobs if j != job.old)
    calls = job.calls()
    assert calls[:2] == [f"sbatch --parsable --hold {job.folder}/{job.old}_submission.sh", f"scontrol release {new}"]
    assert f"scancel {new}" in calls and calls[-1] == f"scontrol requeue {job.old}", calls
    assert calls.index(f"scontrol requeue {job.old}") > max(i for i, c in enumerate(calls) if c.startswith("squeue"))
    assert slurm.jobs[new].state == "CANCELLED" and (slurm.jobs[new].attempt.start is not None) == schedules
    assert slurm.jobs[job.old].state == "PENDING" and not slurm.jobs[job.old].held  # the plain requeue
    assert handback.read_successor(job.run_dir, job.old) is None and not list(job.run_dir.glob(".successor-*"))
    assert not (job.folder / f"{new}_submitted.pkl").exists()
    assert f"job {new} cancelled and gone from the queue; requeueing job {job.old} instead" in proc.stderr


def test_a_rollback_that_cannot_confirm_the_successor_is_gone_keeps_the_marker_and_does_not_requeue(tmp_path,
                                                                                                  monkeypatch):
    """scancel fails (slurmctld unreachable) for the whole rollback: the released successor may still run the run,
    so the job must not requeue itself too; the marker keeps naming the successor (the watcher follows it)."""
    monkeypatch.setattr(handback, "ROLLBACK_WAIT_S", 2)
    job = Job(tmp_path)
    job.change(lambda s: s.break_command("scancel"))
    proc = job.run(job.old, env_extra={handback.HANDOVER_FAULT_ENV: "after_release"})
    assert proc.returncode == EXIT_SIGNALLED_AFTER_CHECKPOINT, proc.stderr
    new = next(j for j in job.slurm.jobs if j != job.old)
    assert handback.read_successor(job.run_dir, job.old) == new
    assert not any(c.startswith("scontrol requeue ") for c in job.calls())
    assert job.slurm.jobs[job.old].state == "RUNNING"  # the batch shell exits 75; Slurm ends the job
    assert "could not confirm within 2 s" in proc.stderr and "never run twice" in proc.stderr


@pytest.mark.parametrize("reason, hands_over", [
    (handback.PREEMPTED, True),
    (handback.TIME_LIMIT, True),
    (handback.STRAY, False),     # a person's scancel --signal=USR2 (the built-in trainer never gets here with it)
    (handback.UNKNOWN, False),   # Slurm could not be asked: saved and requeued, never handed over
    ("", False),                 # rank 0's marker without a reason (an older job)
    ("preempted;rm", False),
])
def test_only_a_preemption_or_the_time_limit_hands_over(tmp_path, reason, hands_over):
    job = Job(tmp_path)
    proc = job.run(job.old, reason=reason or "''")
    assert proc.returncode == EXIT_SIGNALLED_AFTER_CHECKPOINT, proc.stderr
    sbatched = any(c.startswith("sbatch") for c in job.calls())
    assert sbatched is hands_over
    if not hands_over:
        assert job.calls() == [f"scontrol requeue {job.old}"] and "is not handed over to a successor" in proc.stderr


def test_rank_0_exiting_75_without_its_marker_requeues_without_a_hand_over(tmp_path):
    job = Job(tmp_path)
    proc = job.run(job.old, reason=None, step_rc=EXIT_SIGNALLED_AFTER_CHECKPOINT)
    assert proc.returncode == EXIT_SIGNALLED_AFTER_CHECKPOINT and job.calls() == [f"scontrol requeue {job.old}"]


def test_the_kill_switch_blocks_the_hand_over_and_the_requeue(tmp_path):
    job = Job(tmp_path)
    (job.root / PAUSE_FILE).write_text("")
    proc = job.run(job.old)
    assert proc.returncode == EXIT_SIGNALLED_AFTER_CHECKPOINT
    assert job.calls() == [] and "kill switch is set" in proc.stderr  # no sbatch, no scontrol: nothing acted
    assert handback.read_successor(job.run_dir, job.old) is None


def test_the_kill_switch_keeps_a_successor_from_cancelling_its_held_predecessor(tmp_path):
    job = Job(tmp_path)
    job.change(lambda s: (s.submit(job_name_for("r1")), s.run(["scontrol", "requeuehold", job.old])))
    new = max(job.slurm.jobs, key=int)
    (job.run_dir / f"{handback.SUCCESSOR_PREFIX}{job.old}").write_text(f"{new}\n")
    (job.root / PAUSE_FILE).write_text("")
    proc = job.run(new, reason=None)
    assert proc.returncode == 0 and "not cancelled" in proc.stderr
    assert job.slurm.jobs[job.old].state == "PENDING" and not any(c.startswith("scancel") for c in job.calls())


def test_without_submitits_pickle_or_in_a_job_array_the_job_just_requeues(tmp_path):
    job = Job(tmp_path / "a", with_pickle=False)
    job.run(job.old)
    assert job.calls() == [f"scontrol requeue {job.old}"]
    job = Job(tmp_path / "b")
    job.run(job.old, env_extra={"SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "3"})
    assert job.calls() == ["scontrol requeue 40_3"]


def test_none_of_this_jobs_slurm_variables_reach_the_successor(tmp_path):
    """sbatch inherits the batch shell's environment: SLURM_* of this job would pin the successor to its ids
    (SLURM_CONF, which sbatch needs, stays)."""
    job = Job(tmp_path)
    spy = tmp_path / "spy"
    spy.mkdir()
    (spy / "sbatch").write_text('#!/bin/sh\nenv | sed -n "s/^\\(SLURM_[A-Z_]*\\)=.*/\\1/p" | sort > '
                                f'{tmp_path}/sbatch.env\nexec {tmp_path}/bin/sbatch "$@"\n')
    (spy / "sbatch").chmod(0o755)
    job.path = f"{spy}:{job.path}"
    assert job.run(job.old).returncode == EXIT_SIGNALLED_AFTER_CHECKPOINT
    assert (tmp_path / "sbatch.env").read_text().split() == ["SLURM_CONF"]


def test_the_hand_over_is_in_the_script_only_when_the_run_asks_for_it():
    off, on = handback.batch_teardown_lines(), handback.batch_teardown_lines(successor=True)
    assert not any("hpc_agent_hand_over" in line for line in off)
    assert any("hpc_agent_hand_over" in line for line in on)
    assert handback.batch_setup_lines()[-1].startswith("if ")  # no successor folder exported
    setup = handback.batch_setup_lines("/a b")
    assert f"export {handback.SUCCESSOR_DIR_ENV}='/a b'" in setup
    assert setup[-1] == "hpc_agent_cancel_predecessor & hpc_agent_predecessor_pid=$!"


@pytest.mark.parametrize("content, kind, expected", [
    (b"57\n", "file", "57"),
    (b"57", "file", "57"),
    (b"41\n", "file", None),              # itself
    (b"57; rm -rf /\n", "file", None),    # not a job number
    (b"", "file", None),
    (b"5" * 100, "file", None),           # bigger than any job id
    (b"57\n", "link", None),              # a link is not followed
    (b"", "dir", None),
    (b"", "missing", None),
])
def test_the_successor_marker_is_read_as_untrusted(tmp_path, content, kind, expected):
    path = tmp_path / f"{handback.SUCCESSOR_PREFIX}{OLD}"
    if kind == "file":
        path.write_bytes(content)
    elif kind == "link":
        (tmp_path / "elsewhere").write_bytes(content)
        path.symlink_to(tmp_path / "elsewhere")
    elif kind == "dir":
        path.mkdir()
    assert handback.read_successor(tmp_path, OLD) == expected


HEADER = "JobID|JobName|State|ExitCode|NodeList|Start|End|Elapsed"
REQUEUED = f"{OLD}|hpc_agent:r1|REQUEUED|0:0|node1|2026-12-02T10:00:00|2026-12-02T10:05:00|00:05:00"


def attempts(*rows: str):
    return tuple(group_attempts(parse_sacct(HEADER + "\n" + "\n".join(rows) + "\n"))[OLD])


@pytest.mark.parametrize("phase", [Phase.RUNNING, Phase.PENDING])
def test_a_handed_over_job_is_followed_by_its_successor_and_the_held_one_cancelled(phase):
    held = attempts(REQUEUED, f"{OLD}|hpc_agent:r1|PENDING|0:0|None assigned|Unknown|Unknown|00:00:00")
    assert held[-1].state == "PENDING"
    out = follow(RunState("r1", phase, OLD), Observation(held, successor="57"))
    assert out.phase is Phase.PENDING
    assert [(e.kind, e.job_id, e.args) for e in out.effects] == [(ADOPT, OLD, {"successor": "57"}), (CANCEL, OLD, {})]
    (record,) = out.audit
    assert record["action"] == "handed_over" and record["evidence"] == {"successor": "57"}
    # Without the marker the same sacct answer is a requeue by Slurm: expedite it (today's path).
    plain = follow(RunState("r1", phase, OLD), Observation(held, queue="PENDING"))
    assert all(e.kind != ADOPT for e in plain.effects)


def test_a_running_attempt_is_never_handed_over_even_with_a_marker():
    running = attempts(REQUEUED, f"{OLD}|hpc_agent:r1|RUNNING|0:0|node2|2026-12-02T10:05:02|Unknown|00:00:05")
    out = follow(RunState("r1", Phase.RUNNING, OLD), Observation(running, successor="57"))
    assert all(e.kind != ADOPT for e in out.effects)


def test_the_watcher_adopts_the_successor_once_and_cancels_the_held_job(world):  # noqa: F811
    """Through tick() on the canonical FakeSlurm: the job is requeued by its preemption and has named its
    successor; the watcher follows the successor, cancels the old job, and says so in events.jsonl. A second
    run of the adopt effect (a crash before the journal marked it done) adds nothing."""
    from hpc_agent.watcher import effects
    from hpc_agent.state.journal import EffectRow
    from hpc_agent.slurm.job_match import job_name_for
    from tests.unit.test_watcher import add_run

    slurm, ledger, watcher = world["slurm"], world["ledger"], world["watcher"]
    run_dir, old = add_run(world, "r")
    slurm.advance(240)
    slurm.preempt(old)
    new = slurm.submit(job_name_for("r"))  # the successor the batch shell submitted
    (run_dir / f"{handback.SUCCESSOR_PREFIX}{old}").write_text(f"{new}\n")
    watcher.tick()
    assert [s.job_id for s in ledger.submissions("r")] == [old, new]
    assert ledger.run("r").phase == "pending"
    assert ["scancel", old] in slurm.calls
    assert not any(c[:2] == ["scontrol", "update"] and f"JobId={old}" in c for c in slurm.calls)  # never expedited
    events = [line for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert any('"handed_over"' in e for e in events) and any('"adopt"' in e for e in events)
    again = EffectRow(0, "r", "adopt", old, {"successor": new}, 0, 0.0, 0)
    assert effects.carry_out(watcher.ctx, ledger.run("r"), again) == f"already following job {new}"
    assert [s.job_id for s in ledger.submissions("r")] == [old, new]
    slurm.start(new)
    watcher.tick()
    assert ledger.run("r").phase == "running"  # the successor is the run's job now

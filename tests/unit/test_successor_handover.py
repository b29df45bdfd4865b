"""resilience.successor_on_preempt: the job script's hand-over to a successor job at a preemption
(hpc_agent/core/handback.py), and the watcher's side of it: the marker read as untrusted, the pure core's
decision (tests/unit/test_follow.py's style), and the adopt effect run twice after a crash. The real cluster
runs it end to end in tests/cluster/test_successor_slurm.py."""
from __future__ import annotations

import os
import subprocess

import pytest

from hpc_agent.core import handback
from hpc_agent.core.exit_codes import EXIT_SIGNALLED_AFTER_CHECKPOINT
from hpc_agent.slurm.sacct import group_attempts, parse_sacct
from hpc_agent.state.lifecycle import Phase
from hpc_agent.watcher.follow import follow
from hpc_agent.watcher.follow_model import ADOPT, CANCEL, Observation, RunState
from tests.unit.test_watcher import world  # noqa: F401 (the fixture)

OLD, NEW = "41", "57"


def _stubs(tmp_path, fail: str = "") -> dict:
    """sbatch, scontrol and scancel stand-ins that log their argv (and sbatch its environment's SLURM_* names);
    the command named ``fail`` (e.g. ``requeuehold``) exits 1."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    calls = tmp_path / "calls"
    for name, body in {
        "sbatch": f'env | sed -n "s/^\\(SLURM_[A-Z_]*\\)=.*/\\1/p" | sort | tr "\\n" " " >> {calls}.env\n'
                  f'echo "sbatch $*" >> {calls}\necho "{NEW};cluster"',
        "scontrol": f'echo "scontrol $*" >> {calls}\n[ "$1" = "{fail}" ] && exit 1\nexit 0',
        "scancel": f'echo "scancel $*" >> {calls}',
    }.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return {"bin": bin_dir, "calls": calls}


def _hand_over(tmp_path, fail: str = "", env_extra=None, with_pickle: bool = True):
    run_dir = tmp_path / "runs" / "r1"
    folder = run_dir / "slurm"
    folder.mkdir(parents=True)
    (folder / f"{OLD}_submission.sh").write_text("#!/bin/bash\n#SBATCH --job-name=hpc_agent:r1\nsrun true\n")
    if with_pickle:
        (folder / f"{OLD}_submitted.pkl").write_bytes(b"pickled call")
    stubs = _stubs(tmp_path, fail)
    script = "\n".join([*handback.batch_setup_lines(str(folder)), f"(exit {EXIT_SIGNALLED_AFTER_CHECKPOINT})",
                        *handback.batch_teardown_lines(successor=True)])
    env = {"PATH": f"{stubs['bin']}:{os.environ['PATH']}", "SLURM_JOB_ID": OLD, "SLURM_RESTART_COUNT": "2",
           "SLURM_CONF": "/etc/slurm/slurm.conf", "HPC_AGENT_RUN_DIR": str(run_dir), **(env_extra or {})}
    proc = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)
    calls = stubs["calls"].read_text().splitlines() if stubs["calls"].exists() else []
    return proc, calls, run_dir, folder


def test_the_job_hands_over_then_requeues_itself_held(tmp_path):
    proc, calls, run_dir, folder = _hand_over(tmp_path)
    assert proc.returncode == EXIT_SIGNALLED_AFTER_CHECKPOINT, proc.stderr
    assert calls == [f"sbatch --parsable --hold {folder}/{OLD}_submission.sh", f"scontrol release {NEW}",
                     f"scontrol requeuehold {OLD}"]  # released before this job ends: it is eligible in that pass
    assert (folder / f"{NEW}_submitted.pkl").read_bytes() == b"pickled call"  # what submitit's _submit loads
    assert (folder / f"{NEW}_submission.sh").is_file()  # the successor can hand over in turn
    assert handback.read_successor(run_dir, OLD) == NEW
    assert not list(run_dir.glob("*.tmp")) and (run_dir.parent / handback.WAKE_FILE).is_file()
    # None of this job's SLURM_* variables reach the successor's environment, bar SLURM_CONF (sbatch needs it).
    assert (tmp_path / "calls.env").read_text().split() == ["SLURM_CONF"]
    assert f"handed over to job {NEW}" in proc.stderr


@pytest.mark.parametrize("fail", ["release", "requeuehold"])
def test_a_failed_hand_over_cancels_the_successor_and_requeues_as_before(tmp_path, fail):
    proc, calls, run_dir, _ = _hand_over(tmp_path, fail=fail)
    assert f"scancel {NEW}" in calls and calls[-1] == f"scontrol requeue {OLD}", calls
    assert handback.read_successor(run_dir, OLD) is None and not list(run_dir.glob(".successor-*"))
    assert "requeueing it instead" in proc.stderr


def test_without_submitits_pickle_or_in_a_job_array_the_job_just_requeues(tmp_path):
    _, calls, _, _ = _hand_over(tmp_path, with_pickle=False)
    assert calls == [f"scontrol requeue {OLD}"]
    _, calls, _, _ = _hand_over(tmp_path / "array", env_extra={"SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "3"})
    assert calls == ["scontrol requeue 40_3"]


def test_the_hand_over_is_in_the_script_only_when_the_run_asks_for_it():
    off, on = handback.batch_teardown_lines(), handback.batch_teardown_lines(successor=True)
    assert not any("hpc_agent_hand_over" in line for line in off)
    assert any("hpc_agent_hand_over" in line for line in on)
    assert handback.batch_setup_lines()[-1].startswith("if ")  # no successor folder exported
    assert handback.batch_setup_lines("/a b")[-1] == f"export {handback.SUCCESSOR_DIR_ENV}='/a b'"


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
    out = follow(RunState("r1", phase, OLD), Observation(held, successor=NEW))
    assert out.phase is Phase.PENDING
    assert [(e.kind, e.job_id, e.args) for e in out.effects] == [(ADOPT, OLD, {"successor": NEW}), (CANCEL, OLD, {})]
    (record,) = out.audit
    assert record["action"] == "handed_over" and record["evidence"] == {"successor": NEW}
    # Without the marker the same sacct answer is a requeue by Slurm: expedite it (today's path).
    plain = follow(RunState("r1", phase, OLD), Observation(held, queue="PENDING"))
    assert all(e.kind != ADOPT for e in plain.effects)


def test_a_running_attempt_is_never_handed_over_even_with_a_marker():
    running = attempts(REQUEUED, f"{OLD}|hpc_agent:r1|RUNNING|0:0|node2|2026-12-02T10:05:02|Unknown|00:00:05")
    out = follow(RunState("r1", Phase.RUNNING, OLD), Observation(running, successor=NEW))
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

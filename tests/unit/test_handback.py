"""hpc_agent/core/handback.py: the job script's requeue after a signal's checkpoint, and the watcher's wake file."""
from __future__ import annotations

import os
import subprocess
import time

import pytest

from hpc_agent.core import handback
from hpc_agent.core.exit_codes import EXIT_SIGNALLED_AFTER_CHECKPOINT


def _run_teardown(tmp_path, step_rc: int, env_extra: dict, scontrol_rc: int = 0):
    """The teardown lines after a stand-in for srun that exits ``step_rc``; scontrol is a stub that logs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    calls = tmp_path / "scontrol.calls"
    stub = bin_dir / "scontrol"
    stub.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexit {scontrol_rc}\n')
    stub.chmod(0o755)
    script = "\n".join([f"(exit {step_rc})", *handback.batch_teardown_lines()])
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "41", **env_extra}
    proc = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)
    return proc, calls.read_text().splitlines() if calls.exists() else []


@pytest.mark.parametrize("env, expected", [
    ({}, "requeue 41"),
    ({"SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "3"}, "requeue 40_3"),  # scontrol reads 40 as every task
])
def test_exit_75_requeues_the_job_and_wakes_the_watcher(tmp_path, env, expected):
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    proc, calls = _run_teardown(tmp_path, EXIT_SIGNALLED_AFTER_CHECKPOINT, {"HPC_AGENT_RUN_DIR": str(run_dir), **env})
    assert proc.returncode == EXIT_SIGNALLED_AFTER_CHECKPOINT  # the job's exit code is kept
    assert calls == [expected]
    assert (tmp_path / "runs" / handback.WAKE_FILE).is_file()


def test_exit_0_with_rank_0s_marker_requeues_and_reports_75(tmp_path):
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    marker = handback.marker_path(run_dir, "41")
    open(marker, "w").close()
    proc, calls = _run_teardown(tmp_path, 0, {"HPC_AGENT_RUN_DIR": str(run_dir)})
    assert proc.returncode == EXIT_SIGNALLED_AFTER_CHECKPOINT and calls == ["requeue 41"]
    assert not os.path.exists(marker)  # used once


def test_a_linked_marker_or_another_jobs_marker_does_not_requeue(tmp_path):
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    open(handback.marker_path(run_dir, "40"), "w").close()  # an earlier job's
    proc, calls = _run_teardown(tmp_path, 0, {"HPC_AGENT_RUN_DIR": str(run_dir)})
    assert proc.returncode == 0 and calls == []
    (tmp_path / "elsewhere").write_text("")
    os.symlink(tmp_path / "elsewhere", handback.marker_path(run_dir, "41"))
    proc, calls = _run_teardown(tmp_path, 0, {"HPC_AGENT_RUN_DIR": str(run_dir)})
    assert proc.returncode == 0 and calls == []


def test_the_setup_lines_remove_a_stale_marker_of_this_job(tmp_path):
    run_dir = tmp_path / "r1"
    run_dir.mkdir()
    open(handback.marker_path(run_dir, "41"), "w").close()
    script = "\n".join(handback.batch_setup_lines())
    subprocess.run(["bash", "-c", script], env={**os.environ, "HPC_AGENT_RUN_DIR": str(run_dir), "SLURM_JOB_ID": "41"},
                   check=True, timeout=30)
    assert not os.path.exists(handback.marker_path(run_dir, "41"))


@pytest.mark.parametrize("step_rc", [0, 1, 137])
def test_any_other_exit_code_is_left_alone(tmp_path, step_rc):
    proc, calls = _run_teardown(tmp_path, step_rc, {})
    assert proc.returncode == step_rc and calls == []


@pytest.mark.parametrize("step_rc, wakes", [(0, False), (1, True), (137, True), (76, True)])
def test_a_failed_step_wakes_the_watcher_without_requeueing(tmp_path, step_rc, wakes):
    # 137: the kernel's OOM killer; the watcher resubmits with more memory as soon as sacct shows the end
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    proc, calls = _run_teardown(tmp_path, step_rc, {"HPC_AGENT_RUN_DIR": str(run_dir)})
    assert proc.returncode == step_rc and calls == []
    assert (tmp_path / "runs" / handback.WAKE_FILE).is_file() is wakes


def test_a_refused_requeue_says_so_and_leaves_the_run_to_the_watcher(tmp_path):
    proc, calls = _run_teardown(tmp_path, EXIT_SIGNALLED_AFTER_CHECKPOINT, {}, scontrol_rc=1)
    assert calls == ["requeue 41"] and proc.returncode == EXIT_SIGNALLED_AFTER_CHECKPOINT
    assert "could not requeue job 41" in proc.stderr


@pytest.mark.parametrize("state, attempts, expedited, expected", [
    ("REQUEUED", 1, frozenset(), True),      # Slurm is requeueing it, not yet expedited: poll fast
    ("REQUEUED", 1, frozenset({1}), False),  # its next attempt is expedited already
    ("RUNNING", 1, frozenset(), False),
    ("PENDING", 2, frozenset(), False),
    ("PREEMPTED", 1, frozenset(), False),    # ended for good (cancel mode): the decision path, not a requeue
])
def test_handing_back(state, attempts, expedited, expected):
    assert handback.handing_back(state, attempts, expedited) is expected


def test_wake_file_reports_each_touch_once_and_ignores_its_absence(tmp_path):
    wake = handback.WakeFile(tmp_path)
    assert not wake.touched()
    (tmp_path / handback.WAKE_FILE).write_text("")
    assert wake.touched() and not wake.touched()
    time.sleep(0.01)
    os.utime(tmp_path / handback.WAKE_FILE)
    assert wake.touched()


def test_the_job_script_sets_the_hand_back_variable():
    assert handback.batch_setup_lines()[0] == f"export {handback.BATCH_REQUEUE_ENV}=1"


def test_under_hpc_agents_job_script_rank_0_leaves_the_requeue_to_the_batch_shell(monkeypatch, tmp_path):
    import signal

    from launch import signals

    ran = []
    monkeypatch.setattr(signals, "usr2_reason", lambda job_id, lead_s: (handback.PREEMPTED, "PreemptTime=x"))
    monkeypatch.setattr("hpc_agent.slurm.cli.SlurmCLI.run", lambda self, argv, **kw: ran.append(argv))
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("HPC_AGENT_RUN_DIR", str(tmp_path))
    monkeypatch.setenv(handback.BATCH_REQUEUE_ENV, "1")
    said = []
    # exit 0 (srun does not terminate the step) with the marker the batch shell turns back into 75
    assert signals.hand_back_to_slurm(signal.SIGUSR2, said.append) == 0
    assert ran == [] and "the batch script requeues job 41" in said[-1] and "this attempt ends now" in said[-1]
    assert (tmp_path / ".handback-41").read_text() == "41 preempted\n"  # the reason: the batch shell hands over on it
    assert "SIGUSR2 (PreemptTime=x): a preemption notice" in said[0]
    monkeypatch.setenv("SLURM_PROCID", "1")  # the other ranks exit 0 and leave no marker
    (tmp_path / ".handback-41").unlink()
    assert signals.hand_back_to_slurm(signal.SIGUSR2, said.append) == 0 and not (tmp_path / ".handback-41").exists()
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("HPC_AGENT_RUN_DIR", str(tmp_path / "missing"))  # no marker possible: exit 75, the slow path
    assert signals.hand_back_to_slurm(signal.SIGUSR2, said.append) == EXIT_SIGNALLED_AFTER_CHECKPOINT
    monkeypatch.delenv(handback.BATCH_REQUEUE_ENV)  # a user's own script: rank 0 requeues, as before
    assert signals.hand_back_to_slurm(signal.SIGUSR2, said.append) == EXIT_SIGNALLED_AFTER_CHECKPOINT
    assert ran == [["scontrol", "requeue", "41"]]

"""``diagnose`` takes what users have (issue 43, part 5): the logs alone, a run id, a run directory, a local-executor
run, and a name that is none of these. No Slurm: sacct is the in-memory FakeSlurm, or refused outright where no
Slurm command may run."""
from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import List, Sequence, Tuple

import pytest

from hpc_agent import diagnose
from hpc_agent.state.ledger import Ledger
from tests.conftest import run_cli
from tests.helpers.fake_slurm import FakeSlurm

DATA = Path(__file__).resolve().parents[1] / "data"
SACCT = DATA / "sacct"
LOGS = DATA / "logs"
RUN_ID = "gpt-20261204-101500-ab12"
OOM_LOG = (LOGS / "gpu_oom_111_0_log.out").read_text()
CODE_LOG = (LOGS / "code_error_value.log").read_text()
NO_PID = "99999999"  # above any pid_max: never a live process


@pytest.fixture(autouse=True)
def _no_runs_root(monkeypatch, tmp_path):
    monkeypatch.delenv("HPC_AGENT_RUNS", raising=False)
    monkeypatch.chdir(tmp_path)  # ./runs does not exist here: no run directory is found by accident


@pytest.fixture
def slurm_refused(monkeypatch) -> List[str]:
    """Any SlurmCLI made, or any Slurm command run, is recorded (and the command fails): must stay empty."""
    import hpc_agent.slurm.cli as cli

    made: List[str] = []

    class Refused:
        def __init__(self, *args, **kwargs):
            made.append("SlurmCLI()")

        def sacct(self, job_ids, *args, **kwargs):
            made.append(f"sacct {list(job_ids)}")
            raise cli.SlurmError("no Slurm in this test")

        def run(self, argv, *args, **kwargs):
            made.append(" ".join(argv))
            raise cli.SlurmError("no Slurm in this test")

    def execute(argv, timeout_s):
        made.append(" ".join(argv))
        raise FileNotFoundError(argv[0])

    monkeypatch.setattr(cli, "SlurmCLI", Refused)
    monkeypatch.setattr(cli.SlurmCLI, "_execute", staticmethod(execute), raising=False)
    return made


def run_json(capsys, *argv: str, code: int = 0) -> dict:
    got = diagnose.main([*argv, "--json"])
    out = capsys.readouterr().out
    assert got == code, out
    return json.loads(out)


def make_run(root: Path, run_id: str, submissions: Sequence[Tuple[str, str]],
             logs: Sequence[Tuple[str, str]] = (), config: str = "") -> Path:
    """A run made through the Ledger API as submit leaves it: its dir, its config and its submissions
    (``(executor, job id)``; an empty id: an intent sbatch never answered)."""
    run_dir = root / run_id
    (run_dir / "slurm").mkdir(parents=True)
    (run_dir / "config.yaml").write_text("run:\n  name: gpt\ntrain:\n  micro_batch_size: 16\n  grad_accum_steps: 2\n"
                                         + config)
    ledger = Ledger.in_runs_root(root)
    try:
        ledger.add_run(run_id, "gpt", str(run_dir))
        for executor, job_id in submissions:
            sub = ledger.record_intent(run_id, executor, str(run_dir / "config.yaml"), reason="submit")
            if job_id:
                ledger.record_submitted(sub, job_id)
    finally:
        ledger.close()
    for name, text in logs:
        (run_dir / "slurm" / name).write_text(text)
    return run_dir


# --- the logs alone ------------------------------------------------------------------------------------------
def test_logs_alone_json_says_the_state_is_unknown_and_runs_no_slurm(capsys, slurm_refused):
    report = run_json(capsys, "--log", str(LOGS / "gpu_oom_111_0_log.out"))
    assert report["cause"] == "gpu_oom"
    assert report["state"] == "unknown" and report["state_from"] == "nothing"
    assert report["summary"] and report["suggestion"]
    assert report["decision"]["action"] == "resubmit"  # what watch would do
    assert report["evidence"][0].startswith("no sacct record: the state is unknown")
    assert slurm_refused == []


def test_logs_alone_text(capsys, slurm_refused):
    assert diagnose.main(["--log", str(LOGS / "code_error_value.log")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("job ?: code_error -- ")
    assert "state unknown: no sacct consulted" in out
    assert "what to do:" in out and "watch would: stop" in out
    assert slurm_refused == []


def test_logs_alone_nothing_recognisable_is_unknown_and_wait(capsys, slurm_refused):
    report = run_json(capsys, "--log", str(LOGS / "nothing_recognisable.log"))
    assert (report["cause"], report["state"], report["decision"]["action"]) == ("unknown", "unknown", "wait")
    assert slurm_refused == []


def test_logs_alone_missing_log_is_exit_2(capsys, slurm_refused):
    assert diagnose.main(["--log", "/nonexistent/log.out"]) == 2
    assert "cannot read log /nonexistent/log.out" in capsys.readouterr().err
    assert slurm_refused == []


def _stub_slurm(tmp_path: Path) -> Tuple[dict, Path]:
    """sacct, scontrol, squeue and sbatch first on PATH, each recording that it ran."""
    bin_dir, record = tmp_path / "bin", tmp_path / "slurm-called"
    bin_dir.mkdir()
    for name in ("sacct", "scontrol", "squeue", "sbatch"):
        stub = bin_dir / name
        stub.write_text(f"#!/bin/sh\necho {name} \"$@\" >> {record}\nexit 1\n")
        stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}, record


def test_logs_alone_as_a_user_runs_it_calls_no_sacct(tmp_path):
    env, record = _stub_slurm(tmp_path)
    proc = run_cli("-m", "hpc_agent", "diagnose", "--log", str(LOGS / "gpu_oom_111_0_log.out"), "--json",
                   env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["cause"], report["state"]) == ("gpu_oom", "unknown")
    assert not record.exists(), record.read_text()


# --- a run: by its id, by its directory --------------------------------------------------------------------
def two_jobs(monkeypatch) -> FakeSlurm:
    """Run RUN_ID's two Slurm jobs: 111 ran out of GPU memory, its resubmission 112 hit a code error."""
    import hpc_agent.slurm.cli as cli

    slurm = FakeSlurm(first_job_id=111, extern_step=True)
    for exit_code in (3, 1):
        job = slurm.submit(f"hpc_agent:{RUN_ID}")
        slurm.start(job)
        slurm.step(job, "python")
        slurm.advance(60)
        slurm.end_step(job, "0", "FAILED", f"{exit_code}:0")
        slurm.fail(job, exit_code)
    monkeypatch.setattr(cli, "SlurmCLI", lambda *args, **kwargs: slurm)
    return slurm


def slurm_run(root: Path) -> Path:
    return make_run(root, RUN_ID, [("slurm", "111"), ("slurm", "112")],
                    [("111_0_log.out", OOM_LOG), ("112_0_log.out", CODE_LOG)])


def test_run_id_diagnoses_the_newest_job_with_every_attempt_from_one_sacct_call(tmp_path, capsys, monkeypatch):
    slurm = two_jobs(monkeypatch)
    root = tmp_path / "runs"
    run_dir = slurm_run(root)
    report = run_json(capsys, RUN_ID, "--runs-root", str(root))
    assert slurm.sacct_calls == [["111", "112"]] and slurm.counts == {"sacct": 1}  # one call for the run's jobs
    assert (report["run_id"], report["job_id"], report["cause"]) == (RUN_ID, "112", "code_error")
    assert report["state_from"] == "sacct" and report["state"] == "FAILED"
    assert [(a["job_id"], a["cause"]) for a in report["attempts"]] == [("111", "gpu_oom"), ("112", "code_error")]
    assert report["run_dir"] == str(run_dir) and report["config"] == str(run_dir / "config.yaml")
    assert report["logs"] == ["112_0_log.out"]
    assert any("ValueError" in e for e in report["evidence"])


def test_run_id_text_lists_the_runs_jobs(tmp_path, capsys, monkeypatch):
    two_jobs(monkeypatch)
    root = tmp_path / "runs"
    slurm_run(root)
    assert diagnose.main([RUN_ID, "--runs-root", str(root)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"run {RUN_ID}, job 112: code_error")
    assert "attempts (oldest first):" in out and "1. 111 FAILED: gpu_oom" in out and "2. 112 FAILED: code_error" in out


def test_run_id_from_the_environments_runs_root(tmp_path, capsys, monkeypatch):
    two_jobs(monkeypatch)
    root = tmp_path / "elsewhere"
    slurm_run(root)
    monkeypatch.setenv("HPC_AGENT_RUNS", str(root))
    assert run_json(capsys, RUN_ID)["job_id"] == "112"


@pytest.mark.parametrize("how", ["absolute", "relative", "dot"])
def test_run_dir_path_its_parent_is_the_runs_root(tmp_path, capsys, monkeypatch, how):
    slurm = two_jobs(monkeypatch)
    run_dir = slurm_run(tmp_path / "somewhere" / "runs")
    arg = {"absolute": str(run_dir), "relative": f"somewhere/runs/{RUN_ID}", "dot": "."}[how]
    if how == "dot":
        monkeypatch.chdir(run_dir)
    report = run_json(capsys, arg)  # no --runs-root: the path's parent is the runs root
    assert (report["run_id"], report["job_id"], report["cause"]) == (RUN_ID, "112", "code_error")
    assert slurm.sacct_calls == [["111", "112"]]
    assert report["logs"] == ["112_0_log.out"] and report["problems"] == []


def test_run_id_with_a_saved_sacct_reply_asks_no_slurm(tmp_path, capsys, slurm_refused):
    root = tmp_path / "runs"
    make_run(root, RUN_ID, [("slurm", "111")], [("111_0_log.out", OOM_LOG)])
    report = run_json(capsys, RUN_ID, "--runs-root", str(root), "--sacct-file", str(SACCT / "failed.txt"))
    assert (report["job_id"], report["cause"], report["state_from"]) == ("111", "gpu_oom", "sacct file")
    # The run's own config: 16 x 2 -> 8 x 4 keeps the global batch.
    assert report["decision"]["patch"] == {"train.micro_batch_size": 8, "train.grad_accum_steps": 4}
    assert slurm_refused == []


def test_run_history_is_the_ledgers_decisions(tmp_path, capsys, monkeypatch):
    """With the watcher's decisions in the ledger, 'watch would' uses them, as the watcher does: here the GPU OOM
    budget (gpu_oom resubmitted twice before) is spent."""
    two_jobs(monkeypatch)
    root = tmp_path / "runs"
    make_run(root, RUN_ID, [("slurm", "111"), ("slurm", "112")],
             [("111_0_log.out", OOM_LOG), ("112_0_log.out", OOM_LOG)], config="watch:\n  max_retries: 2\n")
    ledger = Ledger.in_runs_root(root)
    for job_id in ("109", "111"):
        ledger.record_decision(RUN_ID, job_id, 0, "gpu_oom", "resubmit", "GPU out of memory", {}, [], None)
    ledger.record_decision(RUN_ID, "112", 0, "gpu_oom", "resubmit", "the newest attempt's own", {}, [], None)
    ledger.close()
    report = run_json(capsys, RUN_ID, "--runs-root", str(root))
    assert report["cause"] == "gpu_oom"
    assert report["decision"]["action"] == "stop" and "2 of watch.max_retries=2" in report["decision"]["reason"]


# --- a local-executor run: never sacct ------------------------------------------------------------------------
LOCAL_LOG = ("submitit INFO (2026-12-04 10:15:01,000) - Starting with JobEnvironment(job_id=99999999, hostname=HOST, "
             "local_rank=0(1), node=0(1), global_rank=0(1))\n[hpc_agent] step 3 loss 4.12\n" + OOM_LOG +
             "[hpc_agent] out of memory at step 4 during training (micro_batch_size 16, ZeRO-1); exiting 3\n")


def test_local_run_gpu_oom_from_its_log_and_exit_line_without_sacct(tmp_path, capsys, slurm_refused):
    import socket

    root = tmp_path / "runs"
    make_run(root, RUN_ID, [("local", NO_PID)],
             [(f"{NO_PID}_0_log.out", LOCAL_LOG.replace("HOST", socket.gethostname()))])
    report = run_json(capsys, RUN_ID, "--runs-root", str(root))
    assert (report["cause"], report["state"], report["exit_code"]) == ("gpu_oom", "FAILED", "3:0")
    assert report["state_from"] == "local process" and report["job_id"] == NO_PID
    assert report["local"]["alive"] is False and f"no process {NO_PID}" in report["local"]["alive_basis"]
    evidence = "\n".join(report["evidence"])
    assert f"local process {NO_PID} (executor local: no sacct record" in evidence
    assert "state FAILED, exit 3: from the exit line" in evidence and "CUDA out of memory" in evidence
    assert report["decision"]["patch"] == {"train.micro_batch_size": 8, "train.grad_accum_steps": 4}
    assert slurm_refused == []  # not sacct, not scontrol, not even a SlurmCLI


def test_local_run_text_and_by_its_directory(tmp_path, capsys, slurm_refused):
    root = tmp_path / "runs"
    run_dir = make_run(root, RUN_ID, [("local", NO_PID)], [(f"{NO_PID}_0_log.out", LOCAL_LOG)])
    assert diagnose.main([str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"run {RUN_ID}, job {NO_PID}: gpu_oom")
    assert f"state FAILED, exit 3:0, local process {NO_PID} (no sacct)" in out
    assert "it ran on HOST, not on this host" in out  # the log names another host: liveness not judged here
    assert slurm_refused == []


def test_local_run_alive_is_running(tmp_path, capsys, slurm_refused):
    import subprocess

    root = tmp_path / "runs"
    run_dir = make_run(root, RUN_ID, [])
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(run_dir / "slurm")])
    try:
        ledger = Ledger.in_runs_root(root)
        ledger.record_submitted(ledger.record_intent(RUN_ID, "local", str(run_dir / "config.yaml"), "submit"),
                                str(proc.pid))
        ledger.close()
        (run_dir / "slurm" / f"{proc.pid}_0_log.out").write_text("[hpc_agent] step 3 loss 4.12\n")
        report = run_json(capsys, RUN_ID, "--runs-root", str(root))
    finally:
        proc.kill()
        proc.wait()
    assert (report["cause"], report["state"], report["local"]["alive"]) == ("running", "RUNNING", True)
    assert report["decision"]["action"] == "wait"
    assert slurm_refused == []


def test_local_run_completed_from_its_result_file(tmp_path, capsys, slurm_refused):
    import pickle

    root = tmp_path / "runs"
    run_dir = make_run(root, RUN_ID, [("local", NO_PID)], [(f"{NO_PID}_0_log.out", "[hpc_agent] done: 10 steps\n")])
    (run_dir / "slurm" / f"{NO_PID}_0_result.pkl").write_bytes(pickle.dumps(("success", 0)))
    report = run_json(capsys, RUN_ID, "--runs-root", str(root))
    assert (report["cause"], report["state"], report["exit_code"]) == ("completed", "COMPLETED", "0:0")
    assert report["local"]["results"] == [{"rank": 0, "tag": "success"}]
    assert slurm_refused == []


# --- names that are nothing, runs without a job -----------------------------------------------------------------
@pytest.mark.parametrize("name, tried", [
    ("gpt-nope", ["a run id in the ledger at", "(no ledger there)", "a run directory", "gpt-nope (none)"]),
    ("./no/such/dir", ["a run directory ./no/such/dir (none)"]),
    ("12x", ["(no ledger there)"]),
])
def test_a_name_that_is_neither_job_nor_run_is_exit_2(name, tried, tmp_path, capsys, slurm_refused):
    assert diagnose.main([name, "--runs-root", str(tmp_path / "runs")]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"diagnose: {name!r} is neither a Slurm job id (12, 12_3, 12+1) nor a run; tried" in captured.err
    for needle in tried:
        assert needle in captured.err
    assert slurm_refused == []


def test_unknown_run_in_an_existing_ledger_says_no_such_run(tmp_path, capsys):
    root = tmp_path / "runs"
    make_run(root, RUN_ID, [("slurm", "111")])
    assert diagnose.main(["gpt-other", "--runs-root", str(root)]) == 2
    assert f"a run id in the ledger at {root} (no such run)" in capsys.readouterr().err


def test_a_file_is_not_a_run_directory(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("x")
    assert diagnose.main(["./notes.txt"]) == 2
    assert "a run directory ./notes.txt (not a directory)" in capsys.readouterr().err


def test_unknown_name_as_a_user_runs_it_no_traceback(tmp_path):
    env, record = _stub_slurm(tmp_path)
    proc = run_cli("-m", "hpc_agent.diagnose", "gpt-20261204-nope", env=env, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("diagnose: 'gpt-20261204-nope' is neither")
    assert not record.exists()


def test_run_whose_submission_failed_is_exit_2_with_the_error(tmp_path, capsys, slurm_refused):
    root = tmp_path / "runs"
    make_run(root, RUN_ID, [("slurm", "")])
    ledger = Ledger.in_runs_root(root)
    ledger.record_failed(ledger.submissions(RUN_ID)[0].id, "sbatch: error: invalid partition specified: nope")
    ledger.close()
    assert diagnose.main([RUN_ID, "--runs-root", str(root)]) == 2
    err = capsys.readouterr().err
    assert f"run {RUN_ID} has no submitted job in the ledger at {root}" in err and "invalid partition" in err
    assert slurm_refused == []


def test_run_dir_without_a_ledger_record_reads_its_newest_logs_alone(tmp_path, capsys, slurm_refused):
    run_dir = tmp_path / "copied" / RUN_ID
    (run_dir / "slurm").mkdir(parents=True)
    (run_dir / "config.yaml").write_text("run:\n  name: gpt\n")
    (run_dir / "slurm" / "111_0_log.out").write_text(CODE_LOG)
    os.utime(run_dir / "slurm" / "111_0_log.out", (1, 1))
    (run_dir / "slurm" / "112_0_log.out").write_text(OOM_LOG)
    report = run_json(capsys, str(run_dir))
    assert (report["job_id"], report["cause"], report["state"]) == ("112", "gpu_oom", "unknown")
    assert report["logs"] == ["112_0_log.out"]
    assert any(f"run {RUN_ID} is not recorded (no ledger at" in e for e in report["evidence"])
    assert slurm_refused == []


# --- job ids still mean Slurm ------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, kind", [
    ("12", "job"), ("12_3", "job"), ("12+1", "job"), ("12_[3]", "job"), (RUN_ID, "name"), ("12x", "name"),
    ("runs/" + RUN_ID, "path"), (".", "path"), ("~/runs/x", "path"), ("./12", "path"), ("12.batch", "job"), ("12.0", "job"),
    ("12.", "name"), ("1 2", "name"),
])
def test_target_kind(text, kind):
    assert diagnose.target_kind(text) == kind


def test_job_id_with_a_relative_runs_root_reads_the_runs_logs(tmp_path, capsys):
    """The default ./runs: the run dir's logs are read below it (they were 'not read' with a relative root)."""
    run_dir = tmp_path / "runs" / "gpt-20261130-130000"  # the run in failed.txt's job name
    (run_dir / "slurm").mkdir(parents=True)
    (run_dir / "slurm" / "111_0_log.out").write_text(OOM_LOG)
    report = run_json(capsys, "111", "--sacct-file", str(SACCT / "failed.txt"))
    assert report["cause"] == "gpu_oom" and report["logs"] == ["111_0_log.out"] and report["problems"] == []

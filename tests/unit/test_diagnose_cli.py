"""``python -m hpc_agent.diagnose``: a table of recorded/realistic sacct + log cases through ``--json``.

sacct fixtures are Slurm 22.05 ``sacct -D --parsable2 --format JobID,JobName,State,ExitCode,NodeList,Start,
End,Elapsed`` text (a few recorded on the localhost cluster, marked so in the files); logs are what
submitit, PyTorch, NCCL, DeepSpeed and slurmstepd write into a job's output.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pytest

from hpc_agent import diagnose
from hpc_agent.core.causes import ALL_CAUSES
from hpc_agent.slurm.sacct import SACCT_FIELDS
from tests.conftest import run_cli
from tests.helpers.fake_slurm import FakeSlurm

DATA = Path(__file__).resolve().parents[1] / "data"
SACCT = DATA / "sacct"
LOGS = DATA / "logs"


@dataclass
class Case:
    id: str
    sacct: str
    cause: str
    logs: Sequence[str] = ()
    evidence: Sequence[str] = ()
    job_id: Optional[str] = None
    action: Optional[str] = None
    patch: Optional[Dict[str, object]] = None
    bad_nodes: Optional[List[str]] = None
    attempts: Optional[List[tuple]] = None
    expedite: Optional[bool] = None
    extra: Dict[str, object] = field(default_factory=dict)


CASES = [
    # --- the job is fine, or not finished ----------------------------------------------------------------
    Case("completed", "completed.txt", "completed", ["completed_0_log.out"], ["COMPLETED"], action="done"),
    Case("running", "running.txt", "running", [], ["RUNNING", "node1,node2"], action="wait"),
    Case("pending", "pending.txt", "pending", [], ["PENDING"], action="wait", expedite=False),
    # --- preemption ---------------------------------------------------------------------------------------
    Case("preempted", "preempted.txt", "preempted", ["preempted.log"], ["DUE TO PREEMPTION"], action="requeue",
         expedite=True),
    Case("preempted-echo-tracebacks-ignored", "preempted.txt", "preempted", ["preempted_echo_only.log"], ["PREEMPTED"],
         action="requeue"),
    Case("preempted-no-log", "preempted.txt", "preempted", [], ["PREEMPTED"]),
    Case("signalled-exit-75-without-log", "exit_signal_checkpointed.txt", "timeout", [], ["exit code 75 of 126.0"],
         action="requeue"),
    Case("launch-sigusr2-line", "exit_signal_checkpointed.txt", "timeout", ["launch_sigusr2.log"],
         ["signal SIGUSR2 at step 4101"]),
    Case("launch-sigusr2-preemption-notice", "exit_signal_checkpointed.txt", "preempted",
         ["launch_sigusr2_preemption.log"], ["a preemption notice"]),
    Case("requeued-by-slurm-no-log", "requeued_by_submitit.txt", "preempted", [], ["requeued"]),
    # --- time limit ---------------------------------------------------------------------------------------
    Case("timeout", "timeout.txt", "timeout", ["timeout_limit.log"], ["DUE TO TIME LIMIT"], action="requeue",
         expedite=True),
    Case("timeout-no-log", "timeout.txt", "timeout", [], ["TIMEOUT"]),
    Case("timeout-state-reads-cancelled", "timeout_reads_cancelled.txt", "timeout", ["timeout_reads_cancelled.log"],
         ["DUE TO TIME LIMIT", "CANCELLED"]),
    Case("timeout-submitit-usr2-requeued", "requeued_by_submitit.txt", "timeout", ["timeout_submitit_usr2.log"],
         ["this job is timed-out"]),
    Case("code-error-then-hang-until-time-limit", "timeout.txt", "code_error", ["code_error_then_hang.log"],
         ["IndexError", "DUE TO TIME LIMIT"], action="stop"),
    # --- nodes --------------------------------------------------------------------------------------------
    Case("node-fail-recorded", "node_fail.txt", "node_fail", ["node_fail.log"], ["Node failure on node2"],
         action="resubmit", patch={"slurm.exclude": "node2"}, bad_nodes=["node2"]),
    Case("node-fail-one-node-no-log", "node_fail_single.txt", "node_fail", [], ["NODE_FAIL"],
         patch={"slurm.exclude": "gpu-a17"}, bad_nodes=["gpu-a17"]),
    Case("node-fail-unkillable-processes", "node_fail_single.txt", "node_fail", ["node_fail_unkillable.log"],
         ["STEPD TERMINATED ON gpu-a17"], bad_nodes=["gpu-a17"]),
    Case("boot-fail", "boot_fail.txt", "node_fail", [], ["BOOT_FAIL"], bad_nodes=["gpu-b03"]),
    # --- host memory --------------------------------------------------------------------------------------
    Case("host-oom-state-and-oom-kill-line", "host_oom_state.txt", "host_oom", ["host_oom_oom_kill_event.log"],
         ["Detected 1 oom_kill event in StepId=108.0", "OUT_OF_MEMORY"], action="resubmit", patch={"slurm.mem": "6G"}),
    Case("host-oom-step-only-recorded", "host_oom_step.txt", "host_oom", ["host_oom_recorded.log"],
         ["task 0: Out Of Memory", "109.0 OUT_OF_MEMORY"]),
    Case("host-oom-step-only-no-log", "host_oom_step.txt", "host_oom", [], ["109.0 OUT_OF_MEMORY 0:125"]),
    Case("host-oom-truncated-state", "host_oom_truncated.txt", "host_oom", [], ["OUT_OF_MEMORY"]),
    Case("host-oom-dataloader-killed", "failed.txt", "host_oom", ["host_oom_dataloader.log"],
         ["is killed by signal: Killed"]),
    Case("host-oom-cpu-allocator", "failed.txt", "host_oom", ["host_oom_cpu_alloc.log"], ["DefaultCPUAllocator"]),
    Case("shm-bus-error-in-data-loader-workers", "failed.txt", "shm_exhausted", ["shm_bus_error.log"],
         ["insufficient shared memory"], action="resubmit"),
    Case("het-job-oom", "hetjob.txt", "host_oom", ["het_117.log"], ["StepId=117+0.0"], job_id="117"),
    Case("het-job-by-component-id", "hetjob.txt", "host_oom", [], ["OUT_OF_MEMORY"], job_id="117+1"),
    # --- GPU memory ---------------------------------------------------------------------------------------
    Case("gpu-oom-submitit-traceback", "failed.txt", "gpu_oom", ["gpu_oom_111_0_log.out"],
         ["torch.OutOfMemoryError: CUDA out of memory"], action="resubmit",
         patch={"train.micro_batch_size": 4, "train.grad_accum_steps": 2}),
    Case("gpu-oom-old-torch", "failed.txt", "gpu_oom", ["gpu_oom_old_torch.log"], ["RuntimeError: CUDA out of memory"]),
    Case("launch-oom-announced-exit-3", "failed.txt", "gpu_oom", ["launch_oom_quiet.log"],
         ["exit code 3 of log line", "micro_batch_size 32"]),
    Case("gpu-oom-cuda-namespace-srun-label", "failed.txt", "gpu_oom", ["gpu_oom_cuda_namespace.log"],
         ["torch.cuda.OutOfMemoryError"]),
    # --- several ranks: the earliest fatal error is the root cause ---------------------------------------------
    Case("multirank-merged-log-oom-then-nccl", "failed_2nodes.txt", "gpu_oom", ["multirank_merged.log"],
         ["rank 0, node1", "OutOfMemoryError", "also nccl_error", "Watchdog caught collective operation timeout"]),
    Case("multirank-per-rank-files", "failed_2nodes.txt", "gpu_oom", ["112_0_log.out", "112_1_log.out"],
         ["112_0_log.out:8", "also nccl_error: 112_1_log.out"], bad_nodes=["node1"]),
    Case("multirank-oom-on-rank-1", "failed_2nodes.txt", "gpu_oom", ["swapped/112_0_log.out", "swapped/112_1_log.out"],
         ["112_1_log.out:2 [rank 1, node2]"], bad_nodes=["node2"]),
    Case("multirank-timestamps-say-nccl-first", "failed_2nodes.txt", "nccl_error",
         ["nccl_first/112_0_log.out", "nccl_first/112_1_log.out"], ["NCCL error in", "also gpu_oom"]),
    Case("multirank-code-error-then-nccl", "failed_2nodes.txt", "code_error",
         ["code_then_nccl/112_0_log.out", "code_then_nccl/112_1_log.out"], ["NameError", "also nccl_error"]),
    # --- collectives --------------------------------------------------------------------------------------
    Case("nccl-watchdog-both-ranks", "failed_2nodes.txt", "nccl_error", ["nccl_watchdog_both.log"],
         ["Connection closed by remote peer", "Watchdog caught collective operation timeout"], action="requeue",
         bad_nodes=["node2", "node1"]),
    Case("nccl-dist-backend-error", "failed.txt", "nccl_error", ["nccl_dist_backend.log"], ["DistBackendError"]),
    Case("gloo-connection-closed", "failed.txt", "nccl_error", ["gloo_connection.log"], ["Connection closed by peer"]),
    # --- GPU hardware -------------------------------------------------------------------------------------
    Case("xid-79-fallen-off-the-bus", "failed_2nodes.txt", "gpu_hw_error", ["xid79.log"],
         ["Xid (PCI:0000:3b:00): 79"], action="resubmit", patch={"slurm.exclude": "node1"},
         bad_nodes=["node1"]),
    Case("ecc-on-rank-1-nccl-on-rank-0", "failed_2nodes.txt", "gpu_hw_error", ["ecc_112_0_log.out", "ecc_112_1_log.out"],
         ["uncorrectable ECC error"], bad_nodes=["node2"], patch={"slurm.exclude": "node2"}),
    Case("gpu-health-critical-line", "exit_gpu_health.txt", "gpu_hw_error", ["gpu_health_critical.log"],
         ["GPU health CRITICAL"], bad_nodes=["gpu-c09"]),
    Case("gpu-health-exit-code-82", "exit_gpu_health.txt", "gpu_hw_error", [], ["exit code 82", "GPU health check"],
         patch={"slurm.exclude": "gpu-c09"}),
    Case("xid-13-is-the-programs-fault", "failed.txt", "code_error", ["xid13_is_code.log"], ["illegal memory access"]),
    # --- code errors --------------------------------------------------------------------------------------
    Case("code-error-valueerror", "failed.txt", "code_error", ["code_error_value.log"],
         ["ValueError: data.num_classes=5"], action="stop"),
    # A misspelt submodule of a package that is there: the code is wrong.
    Case("code-error-import", "failed.txt", "code_error", ["code_error_import.log"], ["ModuleNotFoundError"]),
    # --- the job's environment (a retry there fails the same way) ---------------------------------------
    # Recorded on the localhost cluster: HPC_AGENT_OPS_DIR pointed at an empty directory.
    Case("env-unprepared-deepspeed-op-exit-72", "env_unprepared_op.txt", "env_error",
         ["env_unprepared_op_4_0_log.out"], ["environment problem", "-m hpc_agent.prepare"], action="stop"),
    Case("run-dir-busy-exit-73", "run_dir_busy.txt", "run_dir_busy", ["run_dir_busy_182_0_log.out"],
         ["run directory busy", "job 179"], action="stop"),
    Case("env-exit-72-without-log", "env_unprepared_op.txt", "env_error", [], ["exit code 72"], action="stop"),
    Case("env-missing-top-level-package", "failed.txt", "env_error", ["env_missing_package.log"],
         ["No module named 'lightgbm'"], action="stop"),
    Case("code-error-rank-prefixed-traceback", "failed.txt", "code_error", ["code_error_rank_prefix.log"],
         ["KeyError: 'input_ids'"]),
    Case("code-error-chained-first-exception", "failed.txt", "code_error", ["code_error_chained.log"],
         ["FileNotFoundError", "checkpoint step_50 is incomplete"]),
    # No exception from the code, so no code_error (issue 43): a crash, nothing recognisable or no log at all is
    # unknown, with the hypotheses; the watcher requeues it once unchanged, then asks for attention.
    Case("segfault-is-a-hypothesis", "failed.txt", "unknown", ["segfault.log"],
         ["hypothesis: code_error: a crash", "Segmentation fault"], action="requeue"),
    Case("failed-nothing-recognisable", "failed.txt", "unknown", ["nothing_recognisable.log"],
         ["no recognised error in the log", "no positive evidence"], action="requeue"),
    Case("failed-no-log", "failed.txt", "unknown", [], ["no log to read"]),
    Case("launch-cannot-resume-exit-78", "failed.txt", "code_error", ["launch_config.log"],
         ["exit code 78", "global batch changed"], action="stop"),
    Case("failed-signal-6-no-log", "failed_signal6.txt", "unknown", [], ["exit 6:0"]),
    Case("array-task-config-error", "array.txt", "code_error", ["array_116_2.log"], ["ConfigError"], job_id="116_2"),
    Case("parsable1-other-column-order", "parsable1_other_order.txt", "code_error", ["code_error_value.log"],
         ["ValueError"]),
    # --- divergence ---------------------------------------------------------------------------------------
    Case("nan-loss", "failed.txt", "diverged", ["nan_loss.log"], ["step 57 loss nan"], action="resubmit",
         patch={"train.lr": 0.00015}, extra={"rollback_before_step": 57}),
    Case("launch-diverged-but-wrapper-exited-0", "completed.txt", "diverged", ["launch_diverged_exit_lost.log"],
         ["diverged: loss is nan at step 57"], extra={"rollback_before_step": 57}),
    Case("deepspeed-loss-scale-at-minimum", "failed.txt", "diverged", ["deepspeed_loss_scale.log"],
         ["Current loss scale already at minimum"]),
    # --- cancellations ------------------------------------------------------------------------------------
    Case("cancelled-by-user", "cancelled_by_user.txt", "cancelled", ["cancelled.log"],
         ["CANCELLED by 1000", "CANCELLED AT 2026-11-30T14:20:09 ***"], action="stop"),
    Case("cancelled-after-an-oom-stays-cancelled", "cancelled_by_user.txt", "cancelled", ["cancelled_after_oom.log"],
         ["before the cancel", "CUDA out of memory"]),
    Case("cancelled-truncated-state", "cancelled_truncated.txt", "cancelled", [], ["CANCELLED"]),
    Case("preempted-then-cancelled-recorded", "preempted_then_cancelled.txt", "cancelled", ["preempted_then_cancelled.log"],
         ["CANCELLED AT 2026-11-30T10:30:17 ***"], job_id="2",
         attempts=[("PREEMPTED", "preempted"), ("CANCELLED", "cancelled")]),
    # --- requeued jobs, arrays ----------------------------------------------------------------------------
    Case("requeued-3-attempts", "requeued_3_attempts.txt", "running", ["requeued_114_0_log.out"], ["attempt 3"],
         action="wait", attempts=[("PREEMPTED", "preempted"), ("PREEMPTED", "preempted"), ("RUNNING", "running")]),
    Case("requeued-now-pending-expedite", "requeued_pending.txt", "pending", ["requeued_115_0_log.out"], ["PENDING"],
         action="wait", expedite=True, attempts=[("PREEMPTED", "preempted"), ("PENDING", "pending")]),
    Case("array-task-completed", "array.txt", "completed", [], ["116_1"], job_id="116_1"),
    Case("array-pending-range-is-last", "array.txt", "pending", [], ["116_[3-4]"]),
    # --- recorded on the localhost cluster: launch/ with faults.* injected (submit quickstart) -----------------
    Case("recorded-fault-error-at-step", "recorded_launch_2.txt", "code_error", ["recorded_code_error_2_0_log.out"],
         ["[rank0]: RuntimeError: injected code bug at step 3"], action="stop"),
    Case("recorded-fault-oom-exit-status-lost", "recorded_launch_3.txt", "gpu_oom", ["recorded_gpu_oom_3_0_log.out"],
         ["torch.OutOfMemoryError: CUDA out of memory", "COMPLETED"],
         patch={"train.micro_batch_size": 4, "train.grad_accum_steps": 2}),
    Case("recorded-fault-host-alloc", "recorded_launch_4.txt", "host_oom", ["recorded_host_oom_4_0_log.out"],
         ["oom-kill event(s) in StepId=4.0", "4.0 OUT_OF_MEMORY"], bad_nodes=["node2"]),
    # --- sacct said nothing useful: unknown means wait ------------------------------------------------------
    # A header and no rows: sacct knows no such job (yet). Empty or garbage files are refused (exit 2) below.
    Case("sacct-header-only", "header_only.txt", "unknown", [], ["no record"], job_id="5", action="wait"),
]


def run_json(capsys, *argv: str) -> dict:
    code = diagnose.main([*argv, "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out)


@pytest.fixture(autouse=True)
def _no_runs_root(monkeypatch, tmp_path):
    monkeypatch.delenv("HPC_AGENT_RUNS", raising=False)
    monkeypatch.chdir(tmp_path)  # ./runs does not exist here: no run directory is found by accident


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_diagnose_table(case: Case, capsys):
    argv = ["--sacct-file", str(SACCT / case.sacct)]
    for log in case.logs:
        argv += ["--log", str(LOGS / log)]
    if case.job_id:
        argv.insert(0, case.job_id)
    report = run_json(capsys, *argv)
    assert report["cause"] == case.cause, report["evidence"]
    assert set(report) >= {"job_id", "cause", "evidence", "suggestion", "decision", "attempts"}
    text = "\n".join(report["evidence"])
    for needle in case.evidence:
        assert needle in text, f"{needle!r} not in evidence:\n{text}"
    decision = report["decision"]
    if case.action:
        assert decision["action"] == case.action, decision
    if case.patch is not None:
        assert decision["patch"] == case.patch, decision
    if case.bad_nodes is not None:
        assert report["bad_nodes"] == case.bad_nodes
    if case.expedite is not None:
        assert decision["expedite"] is case.expedite
    if case.attempts is not None:
        assert [(a["state"], a["cause"]) for a in report["attempts"]] == case.attempts
    for key, value in case.extra.items():
        assert decision[key] == value
    if report["attempts"]:
        assert report["attempts"][-1]["cause"] == report["cause"]  # the top-level cause is the newest attempt's


def test_the_table_covers_every_cause():
    assert len(CASES) >= 40
    # hung needs a live run directory (heartbeats): test_diagnose_names_hung_for_a_live_run_whose_heartbeat_says_so
    assert {c.cause for c in CASES} | {"hung"} == set(ALL_CAUSES)


def test_diagnose_names_hung_for_a_live_run_whose_heartbeat_says_so(capsys, tmp_path):
    import time

    from hpc_agent.core import rundir
    from hpc_agent.config.load import build_config
    from hpc_agent.core.heartbeat_format import Beat, encode
    from hpc_agent.config.load import write_run_config

    run_dir = tmp_path / "runs" / "gpt-20261130-101500"  # the run id in running.txt's job name
    write_run_config(run_dir, build_config([{"run": {"name": "gpt"}}]))
    now = time.time()
    beat = Beat("102", 0, 0, 1, "node1", 7, "training", now - 900, 40, now - 600, 0, (0.5,) * 20, now - 900, now, 5.0)
    rundir.heartbeat_path(run_dir, 0).parent.mkdir(parents=True)
    rundir.heartbeat_path(run_dir, 0).write_bytes(encode(beat))
    report = run_json(capsys, "102", "--sacct-file", str(SACCT / "running.txt"), "--runs-root", str(tmp_path / "runs"))
    assert report["cause"] == "hung" and report["attempts"][-1]["cause"] == "hung", report
    assert report["evidence"][0].startswith("hung (step): rank 0 of 1 made no step for 600 s after step 40")
    assert report["decision"]["action"] == "resubmit" and report["decision"]["cause"] == "hung"
    beat = Beat("102", 0, 0, 1, "node1", 7, "training", now - 900, 40, now - 1, 0, (0.5,) * 20, now - 900, now, 5.0)
    rundir.heartbeat_path(run_dir, 0).write_bytes(encode(beat))
    assert run_json(capsys, "102", "--sacct-file", str(SACCT / "running.txt"), "--runs-root",
                    str(tmp_path / "runs"))["cause"] == "running"  # stepping: not hung


# --- TensorBoard alarms ------------------------------------------------------------------------------------
def write_events(folder: Path, scalars: Dict[str, List[tuple]], wall0: float = 1.0e9) -> None:
    """A TensorBoard event file written without torch (what SummaryWriter.add_scalar produces)."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(str(folder))
    t = wall0
    for tag, points in scalars.items():
        for step, value in points:
            t += 1
            writer.add_event(Event(wall_time=t, step=step,
                                   summary=Summary(value=[Summary.Value(tag=tag, simple_value=value)])))
    writer.close()


def test_tb_nan_loss_makes_a_silent_failure_diverged(tmp_path, capsys):
    write_events(tmp_path / "tb", {"train/loss": [(1, 5.0), (2, 4.0), (3, math.nan), (4, math.nan)]})
    report = run_json(capsys, "--sacct-file", str(SACCT / "failed.txt"), "--log", str(LOGS / "nothing_recognisable.log"),
                      "--tb", str(tmp_path / "tb"))
    assert report["cause"] == "diverged"
    assert any("train/loss is nan at step 3" in e for e in report["evidence"])
    assert report["decision"]["rollback_before_step"] == 3


def test_tb_loss_scale_stuck_at_minimum(tmp_path, capsys):
    write_events(tmp_path / "tb", {"train/loss": [(s, 3.0) for s in range(1, 7)],
                                   "train/loss_scale": [(1, 1024.0), (2, 8.0), (3, 1.0), (4, 1.0), (5, 1.0), (6, 1.0)]})
    report = run_json(capsys, "--sacct-file", str(SACCT / "failed.txt"), "--tb", str(tmp_path / "tb"))
    assert report["cause"] == "diverged"
    assert any("loss_scale stuck at the minimum 1 since step 3" in e for e in report["evidence"])


def test_tb_nan_before_a_restart_is_history(tmp_path, capsys):
    # NaN at step 30, then the run was rolled back to step 20 and is fine since.
    write_events(tmp_path / "tb", {"train/loss": [(29, 2.0), (30, math.nan), (21, 2.1), (22, 2.0)]})
    report = run_json(capsys, "--sacct-file", str(SACCT / "failed.txt"), "--log", str(LOGS / "code_error_value.log"),
                      "--tb", str(tmp_path / "tb"))
    assert report["cause"] == "code_error"


# --- live mode: JOBID through SlurmCLI, logs and config found via the run directory ----------------------------
def failed_job_111(monkeypatch) -> FakeSlurm:
    """The canonical FakeSlurm in place of SlurmCLI, holding job 111 whose training step failed with exit 1."""
    import hpc_agent.slurm.cli as cli

    slurm = FakeSlurm(first_job_id=111, extern_step=True)
    job = slurm.submit("hpc_agent:gpt-20261130-130000")
    slurm.start(job)
    slurm.step(job, "python")
    slurm.advance(147)
    slurm.end_step(job, "0", "FAILED", "1:0")
    slurm.fail(job, 1)
    monkeypatch.setattr(cli, "SlurmCLI", lambda *args, **kwargs: slurm)
    return slurm


def make_run_dir(root: Path, run_id: str, overrides: str = "") -> Path:
    run_dir = root / run_id
    (run_dir / "slurm").mkdir(parents=True)
    (run_dir / "config.yaml").write_text(
        "run:\n  name: gpt\ntrain:\n  micro_batch_size: 16\n  grad_accum_steps: 2\n" + overrides)
    return run_dir


def test_live_job_id_reads_sacct_logs_and_config(tmp_path, capsys, monkeypatch):
    slurm = failed_job_111(monkeypatch)
    root = tmp_path / "runs"
    run_dir = make_run_dir(root, "gpt-20261130-130000")
    (run_dir / "slurm" / "111_0_log.out").write_text((LOGS / "gpu_oom_111_0_log.out").read_text())
    report = run_json(capsys, "111", "--runs-root", str(root))
    assert slurm.sacct_calls == [["111"]] and slurm.counts == {"sacct": 1}  # one batched sacct call ...
    assert slurm.ran("sacct", "--duplicates", "--parsable2", "--format", ",".join(SACCT_FIELDS))  # ... with -D
    assert report["cause"] == "gpu_oom"
    assert report["logs"] == ["111_0_log.out"]
    assert report["run_dir"] == str(run_dir)
    # The policy used the run's own config: 16 x 2 -> 8 x 4 keeps the global batch.
    assert report["decision"]["patch"] == {"train.micro_batch_size": 8, "train.grad_accum_steps": 4}


def test_live_runs_root_from_environment(tmp_path, capsys, monkeypatch):
    failed_job_111(monkeypatch)
    root = tmp_path / "elsewhere"
    run_dir = make_run_dir(root, "gpt-20261130-130000")
    (run_dir / "slurm" / "111_0_log.out").write_text((LOGS / "code_error_value.log").read_text())
    monkeypatch.setenv("HPC_AGENT_RUNS", str(root))
    assert run_json(capsys, "111")["cause"] == "code_error"


def test_live_sacct_failure_is_unknown_and_wait(capsys, monkeypatch):
    slurm = failed_job_111(monkeypatch)
    slurm.break_command("sacct", timeout=True)
    slurm.break_command("scontrol", timeout=True)
    report = run_json(capsys, "4242")
    assert report["cause"] == "unknown"
    assert report["decision"]["action"] == "wait"
    assert any("sacct failed: sacct timed out" in e for e in report["evidence"])


# --- human output and exit codes -------------------------------------------------------------------------
def test_text_output_explains_and_proposes(capsys):
    code = diagnose.main(["--sacct-file", str(SACCT / "failed.txt"), "--log", str(LOGS / "gpu_oom_111_0_log.out")])
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith("job 111: gpu_oom")
    assert "what to do:" in out and "train.micro_batch_size=4 train.grad_accum_steps=2" in out
    assert "watch would: resubmit" in out


def test_text_output_lists_attempts(capsys):
    diagnose.main(["--sacct-file", str(SACCT / "requeued_3_attempts.txt")])
    out = capsys.readouterr().out
    assert "attempts (oldest first):" in out and "2. 114 PREEMPTED: preempted" in out


@pytest.mark.parametrize("argv", [
    [],
    ["--sacct-file", "/nonexistent/sacct.txt"],
    ["--sacct-file", str(SACCT / "failed.txt"), "--log", "/nonexistent/log.out"],
    ["--sacct-file", str(SACCT / "failed.txt"), "--tb", "/nonexistent/tb"],
    ["--sacct-file", str(SACCT / "failed.txt"), "--tail-bytes", "0"],
    ["--no-such-flag"],
], ids=["no-job", "missing-sacct-file", "missing-log", "missing-tb", "bad-tail", "unknown-flag"])
def test_bad_arguments_exit_2(argv, capsys):
    assert diagnose.main(argv) == 2
    assert capsys.readouterr().err.strip()


@pytest.mark.parametrize("name, needle", [
    ("empty.txt", "empty: no sacct output"),
    ("garbage.txt", "no sacct header line"),
], ids=["empty", "garbage"])
def test_unreadable_sacct_file_is_exit_2_never_unknown(name, needle, capsys):
    assert diagnose.main(["5", "--sacct-file", str(SACCT / name), "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no report at all, so no "unknown" to act on
    assert f"--sacct-file {SACCT / name} is not sacct output" in captured.err and needle in captured.err


def test_sacct_file_read_bounded(tmp_path, monkeypatch, capsys):
    big = tmp_path / "big.txt"
    big.write_text((SACCT / "failed.txt").read_text() + "x" * 4096)
    monkeypatch.setattr(diagnose, "MAX_SACCT_FILE_BYTES", 1024)
    assert diagnose.main(["--sacct-file", str(big)]) == 2
    assert "larger than" in capsys.readouterr().err


def test_binary_sacct_file_is_exit_2(tmp_path, capsys):
    blob = tmp_path / "core"
    blob.write_bytes(bytes(range(256)) * 64)
    assert diagnose.main(["--sacct-file", str(blob)]) == 2
    assert "binary data" in capsys.readouterr().err


def test_tail_bytes_reads_only_the_end(tmp_path, capsys):
    log = tmp_path / "big.log"
    log.write_text("x" * 5000 + "\n" + "ValueError: early\n" + "y\n" * 3000 + (LOGS / "gpu_oom_old_torch.log").read_text())
    report = run_json(capsys, "--sacct-file", str(SACCT / "failed.txt"), "--log", str(log), "--tail-bytes", "2000")
    assert report["cause"] == "gpu_oom"


# --- as a user runs it ------------------------------------------------------------------------------------
def test_subprocess_json_and_dispatcher(tmp_path):
    args = ["--sacct-file", str(SACCT / "host_oom_state.txt"), "--log", str(LOGS / "host_oom_oom_kill_event.log"), "--json"]
    for prefix in (["-m", "hpc_agent.diagnose"], ["-m", "hpc_agent", "diagnose"]):
        proc = run_cli(*prefix, *args, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["cause"] == "host_oom"


def test_subprocess_bad_file_exit_2(tmp_path):
    proc = run_cli("-m", "hpc_agent.diagnose", "--sacct-file", str(tmp_path / "missing.txt"), cwd=tmp_path)
    assert proc.returncode == 2
    assert "cannot read --sacct-file" in proc.stderr
    garbage = run_cli("-m", "hpc_agent.diagnose", "--sacct-file", str(SACCT / "garbage.txt"), cwd=tmp_path)
    assert garbage.returncode == 2 and "Traceback" not in garbage.stderr
    assert "no sacct header line" in garbage.stderr


@pytest.mark.parametrize("argv", [["--help"], ["--sacct-file", str(SACCT / "failed.txt"), "--json"]])
def test_diagnose_imports_neither_torch_nor_deepspeed(argv, tmp_path):
    proc = run_cli("-X", "importtime", "-m", "hpc_agent.diagnose", *argv, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    modules = [line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")]
    assert "hpc_agent.diagnosis.classify" in modules  # the importtime output was really read
    heavy = [m for m in modules if m.split(".")[0] in ("torch", "deepspeed")]
    assert heavy == [], heavy[:5]

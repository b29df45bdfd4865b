"""Classification: log lines -> findings, the root cause across ranks, alarms, the exit code table."""
from __future__ import annotations

import datetime as dt
import math
from pathlib import Path

import pytest

from hpc_agent.core.causes import ADVICE, ALL_CAUSES, SUMMARY, Cause
from hpc_agent.core.exit_codes import EXIT_CODES, as_table, cause_for_exit
from hpc_agent.core.rundir import LogText
from hpc_agent.diagnosis.alarms import fatal_alarms, latest_run
from hpc_agent.diagnosis.classify import choose_root, classify_attempt, classify_job, classify_logs, logs_per_attempt
from hpc_agent.diagnosis.logscan import (FAULT, HINT, KILL, Finding, host_by_rank, parse_timestamp, scan_log,
                                         since_last_repair, split_attempts, split_by_time)
from hpc_agent.metrics.alarm_kinds import LOSS_SCALE_AT_MINIMUM, NONFINITE_LOSS, Alarm
from hpc_agent.slurm.sacct import attempts_of, parse_sacct

DATA = Path(__file__).resolve().parents[1] / "data"


def attempts(name: str, job_id: str):
    return attempts_of(parse_sacct((DATA / "sacct" / name).read_text()), job_id)


def log(name: str) -> LogText:
    return LogText(Path(name).name, (DATA / "logs" / name).read_text())


# --- single lines -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("line,cause,kind", [
    ("slurmstepd: error: *** JOB 123 ON node1 CANCELLED AT 2026-11-30T12:00:13 DUE TO TIME LIMIT ***", "timeout", KILL),
    ("slurmstepd: error: *** JOB 123 ON node2 CANCELLED AT 2026-11-30T12:00:13 DUE TO PREEMPTION ***", "preempted", KILL),
    ("slurmstepd: error: *** JOB 123 ON node1 CANCELLED AT 2026-11-30T12:00:13 DUE TO JOB REQUEUE ***", "preempted", KILL),
    ("slurmstepd-node1: error: *** JOB 7 ON node1 CANCELLED AT 2026-11-30T10:30:14 DUE TO NODE FAILURE, SEE SLURMCTLD "
     "LOG FOR DETAILS ***", "node_fail", KILL),
    ("slurmstepd: error: *** JOB 123 ON node1 CANCELLED AT 2026-11-30T12:00:13 ***", "cancelled", KILL),
    ("srun: error: Node failure on node2", "node_fail", KILL),
    ("submitit WARNING (2026-11-30 17:58:03,010) - Caught signal SIGUSR2 on node1: this job is timed-out.", "timeout", KILL),
    ("submitit WARNING (2026-11-30 17:58:03,010) - Caught signal SIGUSR2 on node1: this job is preempted.", "preempted", KILL),
    ("slurmstepd: error: Detected 1 oom_kill event in StepId=123.0. Some of the step tasks have been OOM Killed.",
     "host_oom", FAULT),
    ("slurmstepd: error: Detected 2 oom-kill event(s) in StepId=5.batch.", "host_oom", FAULT),
    ("slurmstepd: error: Job 41176 exceeded memory limit (3940736 > 2068480), being killed", "host_oom", FAULT),
    ("[Mon Nov 30 12:00:00 2026] Memory cgroup out of memory: Killed process 4242 (python) total-vm:9000kB", "host_oom",
     FAULT),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", "gpu_oom", FAULT),
    ("node1:1:2 [0] NCCL WARN Cuda failure 'out of memory'", "gpu_oom", FAULT),
    ("RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", "gpu_oom", FAULT),
    ("NVRM: Xid (PCI:0000:3b:00): 79, pid=48213, name=python, GPU has fallen off the bus.", "gpu_hw_error", FAULT),
    ("NVRM: Xid (PCI:0000:65:00): 48, pid=1, name=python, An uncorrectable double bit error (DBE) has been detected",
     "gpu_hw_error", FAULT),
    ("RuntimeError: CUDA error: uncorrectable ECC error encountered", "gpu_hw_error", FAULT),
    ("pynvml.NVMLError_GpuIsLost: GPU is lost", "gpu_hw_error", FAULT),
    ("[rank 0] step 57 loss nan", "diverged", FAULT),
    ("step=12 loss=inf lr=3e-4", "diverged", FAULT),
    ("Exception: Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.", "diverged", FAULT),
    ("[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE)", "nccl_error", FAULT),
    ("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error",
     "nccl_error", FAULT),
    ("node2:30877:30950 [0] NCCL WARN NET/IB : Connection closed by remote peer node1<41742>", "nccl_error", FAULT),
    # Issue 43: the lines users pasted that used to end as code_error, each with its cause.
    ("ninja: build stopped: subcommand failed.", "env_error", FAULT),
    ("RuntimeError: Error building extension 'fused_adam'", "env_error", FAULT),
    ("slurmstepd: error: execve(): torchrun: No such file or directory", "env_error", FAULT),
    ("/bin/sh: 1: deepspeed: not found", "env_error", FAULT),
    ("bash: torchrun: command not found", "env_error", FAULT),
    ("ImportError: libcudnn.so.8: cannot open shared object file: No such file or directory", "env_error", FAULT),
    ("RuntimeError: The NVIDIA driver on your system is too old (found version 11040).", "env_error", FAULT),
    ("memory allocation of 150994960 bytes failed", "host_oom", FAULT),
    ("ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 0 (pid: 31631) of binary: "
     "/usr/bin/python3", "host_oom", FAULT),
    ("/var/spool/slurmd/job603995/slurm_script: line 9:  4727 Killed                  python train.py", "host_oom", FAULT),
    ("Killed", "host_oom", FAULT),
    ("srun: error: gpu-a07: task 3: Exited with exit code 137", "host_oom", FAULT),
    ("srun: error: gpu-a07: task 3: Killed", "host_oom", HINT),
    ("srun: error: node1: task 0: Exited with exit code 1", "code_error", HINT),
    ("jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 4770354232 bytes.",
     "gpu_oom", FAULT),
    ("RuntimeError: cuDNN error: CUDNN_STATUS_NOT_INITIALIZED", "gpu_oom", FAULT),
    ("[E314 16:42:10.528865173 ProcessGroupGloo.cpp:143] Gloo connectFullMesh failed with [pair.cc:144] no error",
     "nccl_error", FAULT),
    ("hai-a100-3:3778851:3779883 [4] ibvwrap.c:130 NCCL WARN Call to ibv_create_qp failed", "nccl_error", FAULT),
    ("host:19402:19419 [0] transport/p2p.cc:237 NCCL WARN Cuda failure 'invalid argument'", "nccl_error", FAULT),
    ("kernel: [ 2237.944235] [drm:amdgpu_job_timedout [amdgpu]] *ERROR* ring sdma0 timeout, signaled seq=16060",
     "gpu_hw_error", FAULT),
    ('usable "srun" command in its path. Please check your path', "env_error", FAULT),
    ("W0409 07:28:49.530000 1359 torch/distributed/elastic/agent/server/api.py:719] Received 15 death signal, "
     "shutting down workers", "cancelled", KILL),
    ("[rank3]: found NaN in local grad norm in backward pass before data-parallel communication collective",
     "diverged", FAULT),
    ("{'loss': 7.1384, 'grad_norm': nan, 'learning_rate': 2.77e-05, 'epoch': 1.95}", "diverged", FAULT),
    ("frame #1: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration<long, "
     "std::ratio<1l, 1000l> > >) + 0x1d2 (0x1554e9e0f8f2 in libtorch_cuda.so)", "nccl_error", FAULT),
    ("RuntimeError: CUDA error: unknown error", "gpu_hw_error", FAULT),
    ("RuntimeError: DataLoader worker (pid 46794) is killed by signal: Bus error. It is possible that dataloader's "
     "workers are out of shared memory. Please try to raise your shared memory limit.", "shm_exhausted", FAULT),
    ("Fatal Python error: Bus error", "shm_exhausted", FAULT),
    ("node1:1:2 [0] NCCL WARN Error: failed to extend /dev/shm/nccl-7jH2 to 9637892 bytes", "shm_exhausted", FAULT),
    ("RuntimeError: CUDA error: device-side assert triggered", "code_error", FAULT),
    ("../aten/src/ATen/native/cuda/Indexing.cu:1141: indexSelectLargeIndex: block: [615,0,0], thread: [121,0,0] "
     "Assertion `srcIndex < srcSelectDimSize` failed.", "code_error", FAULT),
    ("node3:1:2 [0] include/alloc.h:228 NCCL WARN Cuda failure 2 'out of memory'", "gpu_oom", FAULT),
    # Suggestive, not shown: hints (offered as hypotheses of an unknown, never the cause).
    ("Fatal Python error: Segmentation fault", "code_error", HINT),
    ("OSError: [Errno 28] No space left on device", "env_error", HINT),
    ("[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768", "diverged", HINT),
    ("RuntimeError: CUDA error: unspecified launch failure", "gpu_hw_error", HINT),
])
def test_single_lines(line, cause, kind):
    findings = scan_log(LogText("x.log", line))
    assert [(f.cause.value, f.kind) for f in findings] == [(cause, kind)]


@pytest.mark.parametrize("line", [
    "[rank 0] step 10 loss 2.3311",
    "babel-0-31:2324239:2324522 [3] NCCL INFO TUNER/Plugin: Plugin load returned 2 : libnccl-net.so: cannot open "
    "shared object file: No such file or directory",  # NCCL INFO lines never carry a fault
    "node1:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] via P2P/IPC",
    "NVRM: Xid (PCI:0000:3b:00): 13, Graphics SM Warp Exception",  # Xid 13: usually the program, not the GPU
    "train/loss_scale 1.0 at step 5",
    "submitit WARNING (2026-11-30 10:48:40,502) - Bypassing signal SIGTERM",
])
def test_harmless_lines(line):
    assert scan_log(LogText("x.log", line)) == []


def test_traceback_exception_line_is_a_code_error_but_signal_echoes_are_not():
    text = ("Traceback (most recent call last):\n  File \"a.py\", line 1, in <module>\n    raise KeyboardInterrupt\n"
            "KeyboardInterrupt\n"
            "Traceback (most recent call last):\n  File \"b.py\", line 2\n    raise FloatingPointError('loss is nan')\n"
            "FloatingPointError: loss is nan\n"
            "Traceback (most recent call last):\n  File \"c.py\", line 3\nsubmitit.core.utils.UncompletedJobError: "
            "Job not requeued because: timed-out and not checkpointable.\n")
    findings = scan_log(LogText("x.log", text))
    # Only the exception line speaks (not the indented 'raise FloatingPointError(...)' source line).
    assert [(f.cause.value, f.line_no) for f in findings] == [("diverged", 8)]


def test_interleaved_rank_lines_do_not_end_a_traceback():
    text = "Traceback (most recent call last):\n[rank 1] step 3 loss 2.0\n  File \"a.py\", line 1\nKeyError: 'x'\n"
    assert [(f.cause.value, f.line_no) for f in scan_log(LogText("x.log", text))] == [("code_error", 4)]


def test_rank_node_and_timestamp_of_a_finding():
    text = ("submitit INFO (2026-11-30 11:00:09,402) - Starting with JobEnvironment(job_id=112, hostname=node2, "
            "local_rank=0(1), node=1(2), global_rank=1(2))\n"
            "[rank1]:[E1130 11:12:40.482113816 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation "
            "timeout: WorkNCCL(SeqNum=2045)\n")
    (finding,) = scan_log(LogText("112_1_log.out", text), hosts=host_by_rank([text]), year=2026)
    assert (finding.rank, finding.node) == (1, "node2")
    assert finding.timestamp == dt.datetime(2026, 11, 30, 11, 12, 40, 482113)
    assert finding.where() == "112_1_log.out:2 [rank 1, node2]"


@pytest.mark.parametrize("line,expected", [
    ("slurmstepd: error: *** JOB 1 ON n CANCELLED AT 2026-11-30T12:00:13 ***", dt.datetime(2026, 11, 30, 12, 0, 13)),
    ("[2026-11-30 13:01:02,480] [INFO] x", dt.datetime(2026, 11, 30, 13, 1, 2, 480000)),
    ("[rank0]:[E1130 11:12:40.482113816 ProcessGroupNCCL.cpp:616]", dt.datetime(2026, 11, 30, 11, 12, 40, 482113)),
    ("I1130 09:00:01.5 x", dt.datetime(2026, 11, 30, 9, 0, 1, 500000)),
    ("[Sun Nov 30 11:20:03 2026] NVRM: Xid", dt.datetime(2026, 11, 30, 11, 20, 3)),
    ("Nov 30 11:20:03 node1 kernel: NVRM: Xid", dt.datetime(2026, 11, 30, 11, 20, 3)),
    ("[rank 0] step 10 loss 2.0", None),
    ("2026-13-45 10:00:00 not a date", None),
])
def test_parse_timestamp(line, expected):
    assert parse_timestamp(line, year=2026) == expected


# --- appended logs: one piece per attempt -----------------------------------------------------------------------
def test_split_attempts_by_submitit_start_lines():
    pieces = split_attempts(log("requeued_114_0_log.out"))
    assert len(pieces) == 3
    assert "DUE TO PREEMPTION" in pieces[0].text and "node1" in pieces[0].text
    assert pieces[1].line_numbers[0] == 5  # evidence keeps the file's line numbers
    assert "step 2400" in pieces[2].text


def test_split_attempts_merged_ranks_are_one_attempt():
    assert len(split_attempts(log("multirank_merged.log"))) == 1
    doubled = log("multirank_merged.log").text + "\n" + log("multirank_merged.log").text
    assert len(split_attempts(LogText("m.log", doubled))) == 2


def test_split_by_time_without_markers_recorded():
    starts = [dt.datetime(2026, 11, 30, 10, 26, 48), dt.datetime(2026, 11, 30, 10, 30, 16)]
    first, second = split_by_time(log("preempted_then_cancelled.log"), starts)
    assert "DUE TO PREEMPTION" in first.text and "DUE TO PREEMPTION" not in second.text
    assert "10:30:17 ***" in second.text


def test_logs_per_attempt_skip_a_pending_attempt():
    tries = attempts("requeued_pending.txt", "115")
    shares = logs_per_attempt(tries, [log("requeued_115_0_log.out")])
    assert len(shares[0]) == 1 and shares[1] == []  # the pending attempt has written nothing yet


def test_logs_per_attempt_tail_lost_the_oldest_attempt():
    tries = attempts("requeued_3_attempts.txt", "114")
    tail = LogText("t.log", "\n".join(log("requeued_114_0_log.out").text.splitlines()[4:]))  # attempt 1 cut off
    shares = logs_per_attempt(tries, [tail])
    assert shares[0] == [] and "node2" in shares[1][0].text and "step 2400" in shares[2][0].text


# --- root cause --------------------------------------------------------------------------------------------
def finding(cause, source=0, line=1, ts=None, kind=FAULT):
    return Finding(Cause(cause), kind, f"r{source}", source, line, cause, ts)


def test_choose_root_orders_by_line_in_one_log_and_by_time_across_logs():
    t = dt.datetime(2026, 1, 1, 10)
    assert choose_root([finding("nccl_error", 0, 1), finding("gpu_oom", 0, 9)]).cause == "nccl_error"
    assert choose_root([finding("gpu_oom", 0, 9, t + dt.timedelta(seconds=5)),
                        finding("nccl_error", 1, 1, t)]).cause == "nccl_error"
    # Unordered: the primary fault is the likelier root cause.
    assert choose_root([finding("nccl_error", 1, 1, t), finding("gpu_oom", 0, 9)]).cause == "gpu_oom"
    assert choose_root([finding("code_error", 0, 2), finding("nccl_error", 1, 1)]).cause == "code_error"
    assert choose_root([]) is None


def test_no_attempt_is_unknown():
    d = classify_attempt(None, job_id="77")
    assert (d.cause, d.job_id) == (Cause.UNKNOWN, "77") and "no record" in d.evidence[0]
    assert classify_job([], job_id="77")[0].cause == Cause.UNKNOWN


def test_running_job_with_nan_loss_is_running_with_a_warning():
    (attempt,) = attempts("running.txt", "102")
    d = classify_attempt(attempt, [LogText("l", "[rank 0] step 57 loss nan")])
    assert d.cause == Cause.RUNNING and any(e.startswith("warning:") for e in d.evidence)


def test_tensorboard_alarm_on_a_timed_out_attempt_wins():
    (attempt,) = attempts("timeout.txt", "105")
    d = classify_attempt(attempt, [log("timeout_limit.log")], [Alarm(NONFINITE_LOSS, 2500, "train/loss is nan at step 2500")])
    assert d.cause == Cause.DIVERGED and d.divergence_step == 2500


def test_classify_job_gives_each_attempt_its_share_of_the_log():
    ds = classify_job(attempts("requeued_3_attempts.txt", "114"), [log("requeued_114_0_log.out")])
    assert [d.cause.value for d in ds] == ["preempted", "preempted", "running"]
    assert "CANCELLED AT 2026-11-30T15:51:32 DUE TO PREEMPTION" in ds[1].evidence[1]


def test_diagnosis_to_dict_is_json_ready():
    (attempt,) = attempts("node_fail.txt", "7")
    d = classify_attempt(attempt, [log("node_fail.log")]).to_dict()
    assert d["cause"] == "node_fail" and d["bad_nodes"] == ["node2"] and d["nodes"] == ["node1", "node2"]


# --- alarms ------------------------------------------------------------------------------------------------
def test_alarms_nonfinite_loss_first_step():
    (alarm,) = fatal_alarms([(1, 3.0), (2, math.inf), (3, math.nan)], [], 1.0)
    assert (alarm.kind, alarm.step) == (NONFINITE_LOSS, 2)


def test_alarms_only_the_run_since_the_last_restart():
    assert latest_run([(5, 1.0), (6, 1.0), (3, 1.0), (4, 1.0)]) == [(3, 1.0), (4, 1.0)]
    assert fatal_alarms([(5, math.nan), (3, 1.0), (4, 1.0)], [], 1.0) == []


def test_alarms_loss_scale_stuck():
    (alarm,) = fatal_alarms([], [(1, 4.0), (2, 1.0), (3, 1.0), (4, 1.0)], min_loss_scale=1.0)
    assert (alarm.kind, alarm.step) == (LOSS_SCALE_AT_MINIMUM, 2)
    assert fatal_alarms([], [(1, 1.0), (2, 1.0), (3, 2.0)], 1.0) == []  # it recovered
    assert fatal_alarms([], [(1, 1.0), (2, 1.0)], 1.0) == []  # too short to call it stuck


# --- the taxonomy and the exit code table ----------------------------------------------------------------------
def test_every_cause_has_words():
    assert ALL_CAUSES == ("completed", "running", "pending", "preempted", "timeout", "node_fail", "host_oom", "gpu_oom",
                          "shm_exhausted",
                          "nccl_error", "gpu_hw_error", "diverged", "cancelled", "code_error", "env_error",
                          "run_dir_busy", "hung", "unknown")
    assert set(SUMMARY) == set(ADVICE) == set(ALL_CAUSES)
    assert f"{Cause.GPU_OOM}" == "gpu_oom"


def test_exit_code_table_agrees_with_launch():
    """The codes the job exits with (``NAMES``, what launch/ uses) and the classifier's table are the same codes."""
    from hpc_agent.core.exit_codes import (EXIT_CONFIG, EXIT_CRASHED, EXIT_DIVERGED, EXIT_OK, EXIT_OUT_OF_MEMORY,
                                           EXIT_SIGNALLED_AFTER_CHECKPOINT, EXIT_UNAVAILABLE, NAMES)

    produced = {code for code in NAMES if code != EXIT_OK}
    assert produced == {code for code, m in EXIT_CODES.items() if not m.placeholder}
    assert EXIT_CODES[EXIT_OUT_OF_MEMORY].cause == Cause.GPU_OOM
    assert EXIT_CODES[EXIT_DIVERGED].cause == Cause.DIVERGED
    assert EXIT_CODES[EXIT_SIGNALLED_AFTER_CHECKPOINT].cause == Cause.TIMEOUT  # FAILED 75: SIGUSR2 (PREEMPTED/CANCELLED come first)
    assert {EXIT_CODES[c].cause for c in (EXIT_CRASHED, EXIT_CONFIG, EXIT_UNAVAILABLE)} == {Cause.CODE_ERROR}
    assert not set(EXIT_CODES) & ({2, 125, 126, 127} | set(range(129, 160)))  # shell/argparse/signal codes
    assert as_table()[82] == {"cause": "gpu_hw_error", "meaning": EXIT_CODES[82].meaning, "placeholder": False}
    assert cause_for_exit(0, 125).cause == Cause.HOST_OOM  # Slurm's OOM marker
    assert cause_for_exit(2, 0) is None and cause_for_exit(None, None) is None


def test_exit_code_table_can_be_replaced():
    from hpc_agent.core.exit_codes import ExitCodeMeaning

    (attempt,) = attempts("failed.txt", "111")  # exit 1
    custom = {1: ExitCodeMeaning(1, Cause.NCCL_ERROR, "this site's launcher uses 1 for network trouble")}
    d = classify_attempt(attempt, (), exit_codes=custom)
    assert d.cause == Cause.NCCL_ERROR and "exit code 1 of 111.0" in d.evidence[-1]


def test_announced_exit_code_is_the_last_one():
    from hpc_agent.core.exit_codes import announced_exit_code

    lines = ["[hpc_agent] cannot resume: x; exiting 78", "noise", "[hpc_agent] diverged: loss is nan; exiting 65"]
    assert announced_exit_code(lines) == (65, lines[-1])
    assert announced_exit_code(["exiting 3"]) is None  # only launch/'s own lines count


# A job requeued in place appends every attempt to one log and the watcher reads only its tail. When the
# tail starts inside an earlier attempt, those lines are that attempt's end, not part of the next one
# (found by the chaos benchmark: an injected GPU OOM was diagnosed as the previous attempt's preemption).
APPENDED_TAIL = "\n".join([
    "[hpc_agent] step 880 loss 1.9",
    "[hpc_agent] SIGUSR2 with 30 s left before SIGKILL: a preemption notice",
    "slurmstepd: error: *** JOB 376 ON node1 CANCELLED AT 2026-11-30T14:12:01 DUE TO JOB REQUEUE ***",
    "submitit INFO (2026-11-30 14:12:09,000) - Starting with JobEnvironment(job_id=376, hostname=node1, "
    "local_rank=0(1), node=0(1), global_rank=0(1))",
    "[hpc_agent] resumed at step 880 (data position 7040 samples) from step_00000880",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
])


@pytest.mark.parametrize("truncated, pieces, last_has_preemption", [
    (True, 2, False),   # a tail: the lines before the first start are an earlier attempt's
    (False, 1, True),   # the whole file: lines before the first start go with the first attempt
])
def test_split_attempts_of_a_truncated_tail(truncated, pieces, last_has_preemption):
    got = split_attempts(LogText("376_0_log.out", APPENDED_TAIL, truncated=truncated))
    assert len(got) == pieces
    assert ("preemption notice" in got[-1].text) is last_has_preemption
    assert "CUDA out of memory" in got[-1].text


def test_tail_log_marks_a_cut_file(tmp_path):
    from hpc_agent.core.rundir import tail_log

    path = tmp_path / "1_0_log.out"
    path.write_text("a" * 100 + "\n" + APPENDED_TAIL + "\n")
    assert tail_log(path, 10_000).truncated is False
    cut = tail_log(path, len(APPENDED_TAIL) + 5)
    assert cut.truncated is True and cut.text.startswith("[hpc_agent] step 880")


# --- a step OUT_OF_MEMORY under an allocation that says FAILED (issue 16) -----------------------------------
@pytest.mark.parametrize("corpus_file", ["real_590_fixed_truncated.txt", "real_590_P_wide.txt", "real_6_json2205.json",
                                         "real_590_json24.json"])
@pytest.mark.parametrize("log_name", [None, "code_error_value.log", "code_error_chained.log",
                                      "nothing_recognisable.log"])
def test_step_oom_under_failed_allocation_is_host_oom(corpus_file, log_name):
    """Real jobs 590 and 6: allocation FAILED 1:0 (the batch script's exit after srun died), step
    OUT_OF_MEMORY 0:125. The cgroup OOM kill is the cause, whatever the allocation row or a traceback says."""
    from hpc_agent.slurm.sacct_read import read_sacct_text

    job = corpus_file.split("_")[1]
    [attempt] = attempts_of(read_sacct_text((DATA / "sacct_corpus" / corpus_file).read_text()), job)
    assert attempt.state == "FAILED" and attempt.oom_step is not None
    diagnosis = classify_attempt(attempt, [log(log_name)] if log_name else [])
    assert diagnosis.cause == Cause.HOST_OOM
    assert any("OUT_OF_MEMORY" in line for line in diagnosis.evidence)


def test_completed_allocation_with_an_oom_step_stays_completed():
    """Not every OOM step ends a job: an .extern step can read OUT_OF_MEMORY on a job that finished its work
    (its script went on and exited 0). The allocation's COMPLETED decides; the odd step is shown."""
    text = "JobID|State|ExitCode\n12|COMPLETED|0:0\n12.batch|COMPLETED|0:0\n12.extern|OUT_OF_MEMORY|0:125\n"
    [attempt] = attempts_of(parse_sacct(text), "12")
    diagnosis = classify_attempt(attempt)
    assert diagnosis.cause == Cause.COMPLETED and "12.extern OUT_OF_MEMORY" in diagnosis.evidence[0]


# --- an in-job repair (issue 17) ---------------------------------------------------------------------------
REPAIRED_THEN_PREEMPTED = "\n".join([
    "submitit INFO (2026-11-30 14:00:00,000) - Starting with JobEnvironment(job_id=376, hostname=node1, "
    "local_rank=0(1), node=0(1), global_rank=0(1))",
    "[hpc_agent] step 40 loss 1.9",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    "[hpc_agent] in-job repair 1 of 2: gpu_oom at step 41: micro batch 8 -> 4 x accumulation 2, global batch kept",
    "[hpc_agent] resumed at step 25 (data position 200 samples) from snap_00000025",
    "[hpc_agent] step 60 loss 1.8",
    "[hpc_agent] SIGUSR2 with 4:56 left before the time limit: a preemption notice",
    "slurmstepd: error: *** JOB 376 ON node1 CANCELLED AT 2026-11-30T14:12:01 DUE TO JOB REQUEUE ***",
])


@pytest.mark.parametrize("text, kept, dropped", [
    (REPAIRED_THEN_PREEMPTED, "preemption notice", "CUDA out of memory"),
    # no repair: the piece as it is
    ("torch.OutOfMemoryError: CUDA out of memory.\n[hpc_agent] step 3 loss 1", "CUDA out of memory", None),
    # the budget was spent: the second OOM comes after the last repair and is what ended the attempt
    (REPAIRED_THEN_PREEMPTED.replace("[hpc_agent] SIGUSR2", "torch.OutOfMemoryError: CUDA out of memory again\n#"),
     "CUDA out of memory again", "Tried to allocate"),
])
def test_since_last_repair(text, kept, dropped):
    piece = since_last_repair(LogText("376_0_log.out", text))
    assert kept in piece.text and (dropped is None or dropped not in piece.text)


def test_an_attempt_that_repaired_an_oom_in_the_job_and_was_then_requeued_is_preempted():
    """Found in the P2 chaos run: the requeued attempt was diagnosed gpu_oom from the OOM the job had already
    repaired, and the watcher did not expedite it (128 s instead of ~8 s)."""
    text = "\n".join(["JobID|JobName|State|ExitCode|Start|End|NodeList|Reason",
                      "376|hpc_agent:r|REQUEUED|0:0|2026-11-30T14:00:00|2026-11-30T14:12:01|node1|None"])
    (attempt,) = attempts_of(parse_sacct(text), "376")
    diagnosis = classify_attempt(attempt, logs_per_attempt([attempt], [LogText("376_0_log.out",
                                                                             REPAIRED_THEN_PREEMPTED)])[0])
    assert diagnosis.cause.value == "preempted", diagnosis
    without_repair_line = REPAIRED_THEN_PREEMPTED.replace("[hpc_agent] in-job repair", "[hpc_agent] something")
    before = classify_attempt(attempt, [LogText("376_0_log.out", without_repair_line)])
    assert before.cause.value == "gpu_oom"  # the same log read whole: the OOM would win


# --- the cause from log text alone (diagnose --log FILE), issue 43 -------------------------------------------
_STEP_CANCEL = "slurmstepd: error: *** STEP 43.0 ON n1 CANCELLED AT 2021-07-14T08:00:36 ***"
_DONE = ("Training finished, exiting ...\n[rank0]:[W730 15:32:17.8 ProcessGroupNCCL.cpp:1479] Warning: WARNING: "
         "destroy_process_group() was not called before program exit, which can leak resources.")


@pytest.mark.parametrize("text, cause", [
    (_STEP_CANCEL, "cancelled"),  # Slurm's cancel with no reason: a person's scancel
    # srun ended the step because a task failed: the cancel line that follows is srun's, and nothing shows why
    # the task failed
    (f"srun: error: n1: task 5: Exited with exit code 1\nsrun: launch/slurm: _step_signal: Terminating StepId=43.0\n"
     f"{_STEP_CANCEL}\nsrun: error: n1: tasks 0-4: Killed", "unknown"),
    (_DONE, "completed"),  # finished, with PyTorch's warning at a normal exit
    (_DONE + "\n[ERROR] [launch.py:325:sigkill_handler] ['python', 'train.py'] exits with return code = 1", "unknown"),
    ("[rank 0] step 10 loss 2.3311", "unknown"),
    ("Traceback (most recent call last):\n  File \"t.py\", line 3, in <module>\nKeyError: 'label'", "code_error"),
    # an infrastructure exception is not a code error
    ("Traceback (most recent call last):\n  File \"t.py\", line 3\nConnectionResetError: [Errno 104] Connection reset "
     "by peer", "nccl_error"),
    ("Traceback (most recent call last):\n  File \"t.py\", line 3\nOSError: [Errno 28] No space left on device", "unknown"),
])
def test_the_cause_from_log_text_alone(text, cause):
    found = classify_logs([LogText("x.log", text)])
    assert (found.cause.value, found.state, found.ended) == (cause, "", False), found.evidence
    if cause == "unknown":
        assert found.hypotheses, found.evidence

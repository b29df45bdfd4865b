"""Find the lines in a job's log that say why it ended. Pure: text in, findings out.

A finding is one line that names a cause, with what is needed to order it against other findings:
its position in its log, its timestamp when the line carries one, its rank and its node. Ordering is
how the root cause of a multi-rank failure is found (the CUDA OOM on rank 0 comes *before* the NCCL
timeouts it causes on the other ranks), so the timestamp formats of the tools that write into a job
log are recognised: ISO (slurmstepd, Python logging, DeepSpeed), glog (PyTorch C++: ``E1130 10:22:31.1``)
and ``dmesg -T`` style (``Nov 30 10:22:31``, for Xid lines copied from the kernel log).

Logs are appended across requeues (``--open-mode=append``), so :func:`split_attempts` cuts a log at
each attempt's start line before it is scanned.
"""
from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Pattern, Sequence, Tuple

from hpc_agent.core.causes import Cause
from hpc_agent.core.rundir import LogText

FAULT = "fault"
"""Something broke inside the job."""
KILL = "kill"
"""Slurm (or submitit on its behalf) ended the job: time limit, preemption, node failure, scancel."""


@dataclass(frozen=True)
class Finding:
    cause: Cause
    kind: str
    source: str
    """Where the line came from: a log name, ``sacct`` or ``tensorboard``."""
    source_index: Optional[int]
    """Index of the log in the list given to :func:`scan_logs`; None for sacct/tensorboard findings."""
    line_no: Optional[int]
    line: str
    timestamp: Optional[_dt.datetime] = None
    rank: Optional[int] = None
    node: Optional[str] = None
    step: Optional[int] = None
    """Training step the line is about (NaN loss lines, TensorBoard alarms)."""

    def where(self) -> str:
        place = f"{self.source}:{self.line_no}" if self.line_no is not None else self.source
        who = ", ".join(x for x in (f"rank {self.rank}" if self.rank is not None else "", self.node or "") if x)
        return f"{place} [{who}]" if who else place


def _rx(pattern: str, flags: int = 0) -> Pattern[str]:
    return re.compile(pattern, flags)


# --- kills: Slurm ended the job -------------------------------------------------------------------
# slurmstepd writes "*** JOB 123 ON node1 CANCELLED AT 2026-11-30T10:22:31 DUE TO TIME LIMIT ***" into the
# job's output; without "DUE TO" it was a plain scancel. A requeue by scontrol reads "DUE TO JOB REQUEUE".
_SLURM_CANCEL = _rx(r"\*\*\* (?:JOB|STEP) \S+ ON (?P<node>\S+) CANCELLED AT (?P<ts>\S+)"
                    r"(?: DUE TO (?P<why>[A-Z ]+?))?(?:,[^*]*)? \*\*\*")
_DUE_TO = {"TIME LIMIT": Cause.TIMEOUT, "PREEMPTION": Cause.PREEMPTED, "NODE FAILURE": Cause.NODE_FAIL,
           "JOB REQUEUE": Cause.PREEMPTED, None: Cause.CANCELLED}
_KILLS: Sequence[Tuple[Cause, Pattern[str]]] = (
    # Processes that ignore SIGKILL (stuck in the kernel, often a dying GPU or filesystem): Slurm drains the node.
    (Cause.NODE_FAIL, _rx(r"STEPD TERMINATED ON (?P<node>\S+) AT \S+ DUE TO JOB NOT ENDING WITH SIGNALS")),
    (Cause.NODE_FAIL, _rx(r"(?:srun|salloc|sbatch): error: Node failure on (?P<node>[\w.-]+)")),
    # The node's prolog failed (Slurm drains it and revokes or requeues the allocation): the node, not the job.
    (Cause.NODE_FAIL, _rx(r"(?:srun|salloc|sbatch): (?:error: )?Prolog failure on node (?P<node>[\w.-]+)|"
                          r"launch failed requeued held")),
    # torchrun's agent stopped from outside (a scancel's or a preemption's SIGTERM; a time limit has its own line).
    (Cause.CANCELLED, _rx(r"Received (?:15|SIGTERM) death signal, shutting down workers")),
    # submitit's handler of our --signal=USR2@lead (and of preemption signals).
    (Cause.TIMEOUT, _rx(r"Caught signal SIG\w+ on (?P<node>[\w.-]+): this job is timed-out")),
    (Cause.PREEMPTED, _rx(r"Caught signal SIG\w+ on (?P<node>[\w.-]+): this job is preempted")),
    # launch/'s own handler: SIGUSR2 is our --signal=USR2@lead, the time-limit warning. Its SIGTERM line
    # is not a kill here: SIGTERM also comes from a person's scancel, which must not be requeued.
    (Cause.TIMEOUT, _rx(r"\[hpc_agent\] signal SIGUSR2 at step")),
    # ...unless the job saw plenty of time left: then SIGUSR2 was Slurm's preemption notice
    # (SlurmctldParameters=preempt_send_user_signal sends the job's --signal when preemption starts). Since the job
    # reads Slurm's PreemptTime (hpc_agent/slurm/usr2.py) the line is "SIGUSR2 (PreemptTime=...): a preemption notice".
    (Cause.PREEMPTED, _rx(r"\[hpc_agent\] SIGUSR2 (?:with .{0,200} left before the time limit|\(.{0,200}\)): "
                          r"a preemption notice")),
)
_USR2_SAVE = _rx(r"\[hpc_agent\] signal SIGUSR2 at step")
_USR2_PREEMPTION = _rx(r"a preemption notice")

# --- faults, most specific first: the first pattern that matches a line names its cause -----------
_HW_XIDS = {48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 109, 119, 120, 121, 123, 136, 140, 143, 144, 145, 146, 147, 148,
            149, 150, 151, 154, 155, 156, 157, 158}
"""Xids that mean hardware (ECC, fallen off the bus, NVLink, GSP, the newer NVLink/C2C and recovery-action codes).
13/31/43 are usually the program's fault; 45 is the channel torn down after another Xid (that one decides)."""
_XID = _rx(r"\bXid\b(?: \([^)]*\))?[:,]?\s*(?P<xid>\d+)")
_PREVIOUS_XID = _rx(r"caused by previous Xid (?P<xid>\d+)")
_FAULTS: Sequence[Tuple[Cause, Pattern[str]]] = (
    # launch/train.py's refusal (exit 73): another live job holds <run dir>/train.lease (hpc_agent/core/runlease.py).
    (Cause.RUN_DIR_BUSY, _rx(r"\[hpc_agent\] run directory busy:")),
    # The environment lacks something no retry in it gets past: launch/train.py's own line (exit 72), a missing
    # top-level package (a missing submodule such as 'launch.workloads.gpt2' is a code error: its package is
    # there, the name is wrong), a DeepSpeed/torch extension that failed to build (JIT op build in the job), an
    # executable that is not on the job's PATH, a shared library or driver that does not match.
    (Cause.ENV_ERROR, _rx(r"\[hpc_agent\] environment problem:|"
                          r"^(?:\S+: )?(?:ModuleNotFoundError|ImportError): No module named '[^'.]+'|"
                          r"ninja: build stopped|Error building extension '|Command '\['ninja'|"
                          r"error: command '\S*(?:gcc|g\+\+|c\+\+|nvcc)\S*' "
                          r"failed|nvcc fatal|CUDA_HOME does not exist|MissingCUDAException|"
                          r"execve\(\): [^:]{1,255}: No such file or directory|: command not found\b|\bsh: \d+: \S+: not found|"
                          r"\bcd: \S+: No such file or directory|usable \"?[\w.-]+\"? command in its path|"
                          r"No such file or directory: '(?:[\w./-]*/)?(?:torchrun|deepspeed|accelerate|srun|python\d?(?:\.\d+)?|"
                          r"nvidia-smi|mpirun|ninja)'|"
                          r"cannot open shared object file|version `GLIBC\w*_[\d.]+' not found|undefined symbol: |"
                          r"NVIDIA driver on your system is too old|CUDA driver version is insufficient|"
                          r"Found no NVIDIA driver on your system|no kernel image is available for execution|"
                          r"is not compatible with the current PyTorch installation|"
                          r"CUDA error: system has unsupported display driver|forward compatibility was attempted|"
                          r"detected CUDA version \([\d.]+\) mismatches|CUDAMismatchException|"
                          r"does not match the version torch was compiled with|"
                          r"(?:is not installed|was not found)\.? [Pp]lease (?:install|see)")),
    (Cause.GPU_HW_ERROR, _rx(r"uncorrectable ECC error|ECCUncorrectable|fallen off the bus|GPU is lost|"
                             r"NVML_ERROR_GPU_IS_LOST|Unable to determine the device handle for GPU|"
                             r"GPU health\b.{0,200}\bCRITICAL|CUDA error: unknown error|uncorrectable NVLink error|"
                             r"RmInitAdapter failed|GPU requires reset|HW Exception by GPU|reason ?:GPU Hang|"
                             r"amdgpu_job_timedout|amdgpu: GPU reset begin|MES might be in unrecoverable state|"
                             r"CUDA-capable device\(s\) (?:is|are)(?:/are)? busy or unavailable", re.I)),
    # /dev/shm full: data-loader workers pass batches through it, NCCL puts its intra-node buffers there.
    # Before host memory: a worker's "Bus error" is its symptom, and the fix differs (fewer workers, --shm-size).
    (Cause.SHM_EXHAUSTED, _rx(r"out of shared memory|insufficient shared memory|shared memory limit|"
                              r"unable to write to file </torch_|/dev/shm\S*.{0,200}No space left|"
                              r"failed to extend /dev/shm|unable to allocate shared memory|"
                              r"(?:^|\W)Bus error\b|signal: Bus error|SIGBUS|"
                              r"DataLoader worker \(pid\(s\)? [\d, ]+\) exited unexpectedly", re.I)),
    # Host memory: the cgroup OOM killer (slurmstepd, srun, the kernel), an allocation refused outright, or a
    # SIGKILL with no other sender (a scancel or a time limit comes with Slurm's own line, which wins).
    (Cause.HOST_OOM, _rx(r"oom[-_]kill|Detected \d+ oom|[Ee]xceeded (?:job |step )?memory limit|"
                         r"task \d+: Out Of Memory|DefaultCPUAllocator: (?:not enough memory|can't allocate)|"
                         r"is killed by signal: Killed|Killed process \d+ .{0,200}total-vm|"
                         r"memory allocation of \d+ bytes failed|std::bad_alloc|Cannot allocate memory|"
                         r"^(?:\S+: )?MemoryError\b|"
                         r"exitcode\s*:\s*-9\b|[Ss]ignal 9 \(SIGKILL\)|return code = -9\b|killed by signal 9\b|"
                         r"[Ee]xit(?:ed with)? (?:exit )?(?:code|status)[:= ]*137\b|exit status 137\b|"
                         r"^Killed\s*$|line \d+:\s+\d+ Killed\b|"
                         r"Memory on the node \(IP: [^)]*\) where the (?:task|worker|actor)|node running low on memory")),
    # Before NCCL: NCCL reports a CUDA OOM inside a collective as "Cuda failure 2 'out of memory'".
    (Cause.GPU_OOM, _rx(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|"
                        r"Cuda failure \d* ?'?out of memory|CUBLAS_STATUS_ALLOC_FAILED|HIP out of memory|"
                        r"THCudaCheck FAIL.{0,200}out of memory|ran out of memory on GPU|cudaErrorMemoryAllocation|"
                        r"RESOURCE_EXHAUSTED: (?:Out of memory|Attempting to (?:reserve|allocate)|OOM)|"
                        r"CUDNN_STATUS_NOT_INITIALIZED|CUDNN_STATUS_ALLOC_FAILED")),
    (Cause.DIVERGED, _rx(r"loss scale already at minimum|cannot decrease scale anymore|[Mm]inimum loss scale reached|"
                         r"\bloss(?: is|\s*[=:])?\s*[-+]?(?:nan|inf)\b|non-finite loss|FloatingPointError|"
                         r"DivergenceError|NaN in (?:local )?grad(?:ient)? norm|"
                         r"\bgrad[_ ]?norm['\"]?\s*[=:]\s*[-+]?(?:nan|inf)\b", re.I)),
    # A kernel that indexed out of bounds or wrote where it may not: a bug in the code (or its input), raised
    # asynchronously as a CUDA error. The GPU is fine (hardware faults come with their own Xid/ECC line above).
    (Cause.CODE_ERROR, _rx(r"device-side assert(?:ion)? triggered|Device-side assertion|"
                           r"an illegal memory access was encountered|CUDA error: an illegal instruction|"
                           r"\.(?:cu|cuh|hip):\d+: \w+: block: \[[\d,]+\], thread: \[")),
    (Cause.NCCL_ERROR, _rx(r"Watchdog caught collective operation timeout|\bNCCL error\b|DistBackendError|"
                           r"DistNetworkError|nccl(?:System|Internal|UnhandledCuda|Remote)Error|"
                           r"NCCL communicator was aborted|NCCL operations have failed or timed out|"
                           r"NCCL watchdog thread terminated|WorkNCCL::checkTimeout|ncclCommWatchdog|"
                           r"watchdog got stuck for \d+ seconds|flight recorder dump signal|"
                           r"dump signal due to a collective timeout|"
                           r"NCCL WARN .{0,200}(?:[Cc]onnection (?:closed|reset)|timed? ?out|NET/IB|[Cc]ompletion|"
                           r"remote process exited|unhandled system error)|"
                           r"Connection closed by peer|Connection reset by peer|"
                           r"ProcessGroup\w*.{0,200}timed out|Timed out waiting for .{0,200}(?:rank|peer)|"
                           r"IBV_WC_\w+|ibv_poll_cq|Gloo.{0,200}(?:timed out|Connection closed)|"
                           r"RendezvousTimeoutError|Socket Timeout|no algorithm/protocol available|"
                           r"NCCL WARN .{0,200}Cuda failure|Gloo connectFullMesh failed|ibv_\w+ failed|"
                           r"NET/IB\s*: .{0,200}(?:failed|error)")),
)

FAILED_EXIT = _rx(r"exits with return code = -?[1-9]|[Ee]xit(?:ed with)? (?:exit )?code -?[1-9]|exitcode\s*:\s*-?[1-9]|"
                  r"returned non-zero exit status|terminated with an error exit status")
"""A process reporting that a child (or itself) ended with a non-zero status: after it, no normal-exit line means
the job completed."""

# Lines that suggest a cause but do not show it: never the root, offered as hypotheses when nothing else is
# found (the answer is then ``unknown``, never a guess that stops the run).
HINT = "hint"
"""A line that suggests a cause without showing it."""
_HINTS: Sequence[Tuple[Cause, str, Pattern[str]]] = (
    (Cause.CODE_ERROR, "a crash: a bug in native code, a broken GPU or driver",
     _rx(r"Segmentation fault|SIGSEGV|Fatal Python error|Illegal instruction|Aborted \(core dumped\)|"
         r"core dumped|free\(\): invalid|double free or corruption")),
    (Cause.GPU_HW_ERROR, "an unspecified CUDA launch failure: a kernel bug (Xid 13/31) or a failing GPU",
     _rx(r"unspecified launch failure|"
         r"CUDA error: misaligned address|cudaErrorLaunchFailure")),
    (Cause.NCCL_ERROR, "an NCCL warning (often harmless, sometimes the first sign of a network fault)",
     _rx(r"NCCL WARN")),
    (Cause.ENV_ERROR, "the file system is full or over quota (not a retryable fault in the job)",
     _rx(r"No space left on device|Disk quota exceeded|\[Errno 28\]|\[Errno 122\]")),
    (Cause.NODE_FAIL, "an I/O error or a vanished file: the node's storage or network mount failed",
     _rx(r"Input/output error|\[Errno 5\]|Stale file handle|Transport endpoint is not connected")),
    (Cause.CODE_ERROR, "a process exited non-zero: a bug whose traceback is not in the log, or a fault that left no "
                       "other trace", FAILED_EXIT),
    (Cause.HOST_OOM, "srun reports a task SIGKILLed: the OOM killer, or srun ending a step whose other task failed",
     _rx(r"srun: error: \S+: tasks? [\d,-]+: Killed")),
    (Cause.DIVERGED, "gradient overflow: fp16 loss scaling backed off (normal early on; a run of them means trouble)",
     _rx(r"OVERFLOW!|overflow detected|Found NaN|Gradient overflow|[Oo]verflow.{0,200}[Ss]kipping")),
)
NORMAL_EXIT = _rx(r"\b[Tt]raining (?:is )?(?:finished|complete[d]?|done)\b|\b[Ff]inished training\b|\btrain_runtime\b|"
                  r"\[hpc_agent\] .{0,200}\bexiting 0\b|\.\.\. passed\s*$|\ball tests passed\b|"
                  r"destroy_process_group\(\) was not called before program exit|"
                  r"process group has NOT been destroyed before it is being destructed")
"""Lines a process prints when it finished its work or reached a normal interpreter exit (PyTorch's warnings about
a process group left for the exit to destroy). Read only when nothing says how a job ended (``diagnose --log``
alone): then they are the positive evidence of ``completed``."""
_LOSS_SCALE = _rx(r"(?:loss[ _]scale(?: to)?[:=]?\s*|reducing to\s*)(?P<scale>\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)\b", re.I)
_SKIPPED = _rx(r"\bstep=(?P<step>\d+), skipped=(?P<skipped>\d+)")
MIN_DIVERGED_SCALE = 2.0
"""An fp16 loss scale this low after a run of overflows means the gradients overflow even unscaled: divergence."""

# Python tracebacks: an exception line that none of the patterns above explains is a code error, unless it is an
# echo (how a process reacts to being told to stop, or a launcher reporting its child's death) or an
# infrastructure exception (networking, storage, the distributed runtime): those say nothing about the code.
_TRACEBACK = _rx(r"^Traceback \(most recent call last\):")
_EXCEPTION = _rx(r"^(?P<exc>[A-Za-z_][\w.]*)(?::\s?(?P<msg>.*))?$")
_BARE_EXCEPTION = _rx(r"^(?:[a-z_][\w]*\.)*[A-Z]\w*(?:Error|Exception)(?::\s.*)?$")
"""An exception line without its traceback (an excerpt that lost it): a dotted lower-case module path at most,
then a class named ...Error or ...Exception."""
_SRUN_ENDS_STEP = _rx(r"srun: error: \S+: tasks? [\d,-]+: Exited with exit code [1-9]|_step_signal: Terminating StepId")
_EMPTY_MESSAGE = _rx(r"^(?:\S+\s)?[\w.]+(?:Error|Exception):\s*$")
_CPP_WHAT = _rx(r"^\s*what\(\):\s+(?P<msg>.+)")
_ECHO_EXCEPTIONS = _rx(r"KeyboardInterrupt|SystemExit|UncompletedJobError|SignalException|ChildFailedError|"
                       r"got signal: ?(?:15|9)|Terminated|CalledProcessError|returned non-zero exit status|"
                       r"ProcessExitedException|ProcessRaisedException|RayTaskError|RayActorError|WorkerCrashedError|"
                       r"FailedJobError")
_INFRA_EXCEPTIONS = _rx(r"ConnectionError|ConnectionResetError|ConnectionRefusedError|BrokenPipeError|TimeoutError|"
                        r"socket\.timeout|DistStoreError|RendezvousError|RendezvousClosedError|DistError|"
                        r"TCPStore|c10d|torch\.distributed|CUDA error|cuda runtime error|CUDNN_STATUS|"
                        r"CUBLAS_STATUS|NCCL|OSError: \[Errno (?:5|28|110|111|112|113|122|116)\]")

# "[rank1]: " (torch), "[rank 0/2] " (launch/), "0: " (srun --label)
_PREFIX = _rx(r"^\s*(?:\[\s*rank\s*\d+(?:/\d+)?\s*\]:?\s?|\d+:\s)", re.I)
_RANK_IN_LINE = _rx(r"\[\s*[Rr]ank\s*(\d+)(?:/\d+)?\s*\]|^\s*(\d+):\s|global_rank=(\d+)")
_RANK_IN_NAME = _rx(r"_(\d+)_log\.(?:out|err)$")
_STEP = _rx(r"\bstep[\s=:]*(\d+)", re.I)
_HOST_FOR_RANK = (
    _rx(r"hostname=(?P<host>[\w.-]+),.{0,200}global_rank=(?P<rank>\d+)"),  # submitit "Starting with JobEnvironment(...)"
    _rx(r"\[rank (?P<rank>\d+)(?:/\d+)?\] host=(?P<host>[\w.-]+)"),  # launch/train.py's first line
    _rx(r"srun: error: (?P<host>[\w.-]+): task (?P<rank>\d+):"),
)
_STEPD_HOST = _rx(r"\bslurmstepd-(?P<host>[\w.-]+?): ")  # Slurm 22.05 names the node: "slurmstepd-node1: error: ..."
_NCCL_HOST = _rx(r"^(?P<host>[A-Za-z][\w.-]*):\d+:\d+ \[\d+\]")  # NCCL's "node2:1234:1290 [0] NCCL WARN ..."

_ISO_TS = _rx(r"(\d{4})-(\d{2})-(\d{2})[T ](\d{2}):(\d{2}):(\d{2})(?:[.,](\d+))?")
_GLOG_TS = _rx(r"\b[IWEF](\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2})\.(\d+)")  # PyTorch prints nanoseconds
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_SYSLOG_TS = _rx(r"\b(" + "|".join(_MONTHS) + r") +(\d{1,2}) (\d{2}):(\d{2}):(\d{2})(?: (\d{4}))?")

# Where a new attempt starts in an appended log; the first kind found in a file is used to cut it.
ATTEMPT_START_MARKERS: Sequence[Pattern[str]] = (
    _rx(r"submitit INFO \(.{0,80}\) - Starting with JobEnvironment"),
    _rx(r"^\s*\[rank \d+/\d+\] host=\S+ job=\S+"),
)


def parse_timestamp(line: str, year: Optional[int] = None) -> Optional[_dt.datetime]:
    """The first timestamp in ``line``; glog and syslog stamps have no year, so ``year`` supplies it."""
    year = year or 2000
    try:
        if m := _ISO_TS.search(line):
            y, mo, d, h, mi, s = (int(x) for x in m.groups()[:6])
            return _dt.datetime(y, mo, d, h, mi, s, int((m.group(7) or "0").ljust(6, "0")[:6]))
        if m := _GLOG_TS.search(line):
            mo, d, h, mi, s = (int(x) for x in m.groups()[:5])
            return _dt.datetime(year, mo, d, h, mi, s, int(m.group(6).ljust(6, "0")[:6]))
        if m := _SYSLOG_TS.search(line):
            return _dt.datetime(int(m.group(6) or year), _MONTHS.index(m.group(1)) + 1, int(m.group(2)),
                                int(m.group(3)), int(m.group(4)), int(m.group(5)))
    except ValueError:  # e.g. month 13 in something that only looked like a timestamp
        return None
    return None


def _piece(log: LogText, numbered: Sequence[Tuple[int, str]]) -> LogText:
    return LogText(log.name, "\n".join(line for _, line in numbered), tuple(n for n, _ in numbered))


def split_attempts(log: LogText) -> List[LogText]:
    """Cut an appended log into one piece per attempt (oldest first); lines before the first start go
    with the first attempt, unless the log is a truncated tail: then they are the end of an earlier
    attempt and make a piece of their own (found in a chaos run: an earlier attempt's preemption lines
    were blamed for the next attempt's OOM). A log without start markers is one piece.

    In a merged multi-rank log every rank prints its own start line, so a marker starts a new attempt
    only when its rank already started in the current piece.
    """
    numbered = list(log.numbered_lines())
    for marker in ATTEMPT_START_MARKERS:
        starts = [i for i, (_, line) in enumerate(numbered) if marker.search(line)]
        if not starts:
            continue
        cuts, ranks, seen = [0], set(), False
        for i in starts:
            rank = _rank_of(numbered[i][1])
            if (not seen and log.truncated and i > 0) or (seen and (rank is None or rank in ranks)):
                cuts.append(i)
                ranks = set()
            seen = True
            if rank is not None:
                ranks.add(rank)
        cuts.append(len(numbered))
        return [_piece(log, numbered[a:b]) for a, b in zip(cuts, cuts[1:]) if b > a]
    return [log]


IN_JOB_REPAIR_MARKER = _rx(r"\[hpc_agent\] in-job repair \d+ of \d+: ")
"""Printed by every rank when the job repairs a GPU OOM or a divergence inside its allocation
(``launch/recovery.py``)."""


def since_last_repair(piece: LogText) -> LogText:
    """An attempt's lines after its last in-job repair: what went wrong before the repair was dealt with inside
    the job (its OOM traceback, its NaN), so it is not what ended the attempt. The piece itself without one.
    Found in a chaos run: an attempt that repaired an OOM and was later preempted was diagnosed ``gpu_oom``,
    and the watcher did not expedite its requeue."""
    numbered = list(piece.numbered_lines())
    last = max((i for i, (_, line) in enumerate(numbered) if IN_JOB_REPAIR_MARKER.search(line)), default=None)
    return piece if last is None else _piece(piece, numbered[last + 1:])


def split_by_time(log: LogText, starts: Sequence[_dt.datetime], year: Optional[int] = None,
                  tolerance_s: float = 5.0) -> List[LogText]:
    """One piece per attempt start (oldest first) for a log without start markers: each line goes to the
    attempt that was running at the last timestamp seen (lines before any timestamp go with the next)."""
    pieces: List[List[Tuple[int, str]]] = [[] for _ in starts]
    waiting: List[Tuple[int, str]] = []
    current: Optional[int] = None
    slack = _dt.timedelta(seconds=tolerance_s)
    for number, line in log.numbered_lines():
        ts = parse_timestamp(line, year)
        if ts is not None and starts:
            current = max((i for i, s in enumerate(starts) if ts >= s - slack), default=0)
            pieces[current].extend(waiting)
            waiting = []
        (waiting if current is None else pieces[current]).append((number, line))
    if waiting and pieces:
        pieces[-1].extend(waiting)
    return [_piece(log, p) for p in pieces]


def _hw_xid(line: str) -> bool:
    """A hardware Xid on this line, or one that an Xid 45 (channel torn down) names as its cause."""
    found = [int(m.group("xid")) for m in _XID.finditer(line)] + [int(m.group("xid")) for m in _PREVIOUS_XID.finditer(line)]
    return any(x in _HW_XIDS for x in found)


_NCCL_INFO = _rx(r"\bNCCL INFO\b")
"""NCCL's informational lines (``NCCL_DEBUG=INFO``): a plugin it could not load, a transport it chose. Never a fault."""


MAX_LINE_CHARS = 2048
"""A longer line is judged by its first and last KiB: the patterns look for short phrases, and a line a job
wrote may be megabytes (a progress bar without newlines, a dumped tensor)."""


def _bounded(line: str) -> str:
    half = MAX_LINE_CHARS // 2
    return line if len(line) <= MAX_LINE_CHARS else line[:half] + " ... " + line[-half:]


def cancel_reason(line: str) -> Optional[str]:
    """The reason Slurm's ``*** STEP|JOB <id> ON <node> CANCELLED AT <time> DUE TO <REASON> ***`` line gives
    (``"TASK FAILURE"``, ``"TIME LIMIT"``, ...), ``""`` when it names none, None for any other line."""
    m = _SLURM_CANCEL.search(_bounded(line))
    return None if m is None else (m.group("why") or "")


def _classify_line(line: str) -> Optional[Tuple[Cause, str, Optional[str]]]:
    """(cause, kind, node named by the kill line) for one line, or None. Kind is KILL, FAULT or HINT."""
    line = _bounded(line)
    if _NCCL_INFO.search(line):
        return None
    m = _SLURM_CANCEL.search(line)
    if m:
        cause = _DUE_TO.get(m.group("why"))
        return (cause, KILL, m.group("node")) if cause else None
    for cause, pattern in _KILLS:
        m = pattern.search(line)
        if m:
            return cause, KILL, m.groupdict().get("node")
    if _hw_xid(line):
        return Cause.GPU_HW_ERROR, FAULT, None
    for cause, pattern in _FAULTS:
        if pattern.search(line):
            return cause, FAULT, None
    for cause, _why, pattern in _HINTS:
        if pattern.search(line):
            return cause, HINT, None
    return None


def hint_reason(finding: "Finding") -> str:
    """What a HINT finding suggests, in words (for the hypotheses of an ``unknown``)."""
    if finding.source == "sacct":
        return finding.line
    for cause, why, pattern in _HINTS:
        if cause == finding.cause and pattern.search(finding.line):
            return why
    if finding.cause == Cause.CODE_ERROR and finding.kind == HINT:
        return "an exception of the distributed runtime, the network or the storage: it says nothing about the code"
    return "suggestive, not shown"


def _exception_kind(text: str) -> Optional[Tuple[Cause, str]]:
    """An exception line's verdict: a code error (an exception raised in user or model code), a hint (an
    infrastructure exception), or None (an echo: a stop request, a launcher reporting its child's death)."""
    if _ECHO_EXCEPTIONS.search(text):
        return None
    if _INFRA_EXCEPTIONS.search(text):
        return Cause.CODE_ERROR, HINT
    return Cause.CODE_ERROR, FAULT


def _rank_of(line: str) -> Optional[int]:
    m = _RANK_IN_LINE.search(line)
    if not m:
        return None
    return int(next(g for g in m.groups() if g is not None))


def _only_rank(text: str) -> Optional[int]:
    """The rank of a single-rank log, read from its start lines (submitit, launch/train.py); None if mixed."""
    ranks = {int(m.group("rank")) for line in text.splitlines() for p in _HOST_FOR_RANK[:2]
             for m in [p.search(line)] if m}
    return ranks.pop() if len(ranks) == 1 else None


def host_by_rank(texts: Sequence[str]) -> Dict[int, str]:
    """``{rank: host}`` from the lines that say where each rank runs (submitit, launch/train.py, srun)."""
    found: Dict[int, str] = {}
    for text in texts:
        for line in text.splitlines():
            for pattern in _HOST_FOR_RANK:
                m = pattern.search(line)
                if m:
                    found.setdefault(int(m.group("rank")), m.group("host"))
    return found


def _node_in(line: str, known_nodes: Sequence[str]) -> Optional[str]:
    m = _NCCL_HOST.match(line) or _STEPD_HOST.search(line)
    if m:
        return m.group("host")
    for node in sorted(known_nodes, key=len, reverse=True):  # node10 before node1
        if re.search(rf"(?<![\w-]){re.escape(node)}(?![\w-])", line):
            return node
    return None


def scan_log(log: LogText, source_index: int = 0, known_nodes: Sequence[str] = (),
             hosts: Optional[Dict[int, str]] = None, year: Optional[int] = None) -> List[Finding]:
    """Every line of ``log`` that names (or hints at) a cause, in order."""
    hosts = hosts or {}
    m = _RANK_IN_NAME.search(log.name)
    file_rank = int(m.group(1)) if m else _only_rank(log.text)
    findings: List[Finding] = []
    in_traceback = False
    scales: List[float] = []  # the fp16 loss scale after each overflow of the current run of them
    for line_no, raw in log.numbered_lines():
        line = _bounded(raw.rstrip())
        body = _PREFIX.sub("", line, count=1)
        # Inside a traceback the indented lines are source code ('raise FloatingPointError("loss is nan")'),
        # not messages: only the exception line that ends it speaks.
        indented = in_traceback and body.startswith((" ", "\t"))
        hit = None if indented else _classify_line(line)
        stripped = body.strip()
        if _TRACEBACK.match(stripped):
            in_traceback = True
        elif in_traceback and not body.startswith((" ", "\t")) and _EXCEPTION.match(stripped):
            # The exception line ends the traceback (interleaved lines of other ranks do not).
            in_traceback = False
            verdict = _exception_kind(stripped)
            if verdict is not None and (hit is None or hit[1] == HINT):
                hit = (*verdict, None)
        elif hit is None and not in_traceback and _BARE_EXCEPTION.match(stripped):
            verdict = _exception_kind(stripped)  # an excerpt that lost its traceback header
            hit = (*verdict, None) if verdict else None
        elif hit is None and (what := _CPP_WHAT.match(stripped)):
            verdict = _exception_kind(what.group("msg"))  # a C++ exception: terminate called ... what(): <msg>
            hit = (*verdict, None) if verdict else None
        hit = _overflow_run(hit, line, scales)
        if hit is None:
            continue
        cause, kind, node = hit
        rank = _rank_of(line)
        rank = file_rank if rank is None else rank
        node = node or _node_in(body, known_nodes) or (hosts.get(rank) if rank is not None else None)
        step = _STEP.search(line)
        findings.append(Finding(cause, kind, log.name, source_index, line_no, line.strip()[:300],
                                parse_timestamp(line, year), rank, node,
                                int(step.group(1)) if step and cause == Cause.DIVERGED else None))
    # srun ends a step whose task failed ("task 5: Exited with exit code 1", "Terminating StepId"), and slurmstepd
    # then logs the step CANCELLED with no reason: srun's doing, not a person's scancel.
    failed_task = next((n for n, line in log.numbered_lines() if _SRUN_ENDS_STEP.search(line)), None)
    if failed_task is not None:
        findings = [f for f in findings if not (f.cause == Cause.CANCELLED and f.kind == KILL
                                                and (f.line_no or 0) > failed_task and "STEP" in f.line)]
    # "AssertionError:" with its message on the next line (older torch, wrapped pastes): the message decides.
    carried = {f.line_no for f in findings if f.cause != Cause.CODE_ERROR and f.kind == FAULT}
    findings = [f for f in findings if not (f.cause == Cause.CODE_ERROR and _EMPTY_MESSAGE.match(f.line)
                                            and f.line_no is not None and f.line_no + 1 in carried)]
    if any(f.cause == Cause.PREEMPTED and _USR2_PREEMPTION.search(f.line) for f in findings):
        # The job said its SIGUSR2 was a preemption notice: its "signal SIGUSR2" save line is not a time limit.
        findings = [f for f in findings if not (f.cause == Cause.TIMEOUT and _USR2_SAVE.search(f.line))]
    return findings


def _overflow_run(hit: Optional[Tuple[Cause, str, Optional[str]]], line: str,
                  scales: List[float]) -> Optional[Tuple[Cause, str, Optional[str]]]:
    """fp16 loss-scale overflows are normal one at a time; a run of them down to a scale of
    :data:`MIN_DIVERGED_SCALE` or less (or a DeepSpeed ``step=N, skipped=M`` with most steps skipped) is a
    divergence shown, not hinted. ``scales`` carries the current run across lines."""
    skipped = _SKIPPED.search(line)
    if skipped and int(skipped.group("step")) >= 20 and int(skipped.group("skipped")) * 2 >= int(skipped.group("step")):
        return Cause.DIVERGED, FAULT, None
    if hit is None or hit[0] != Cause.DIVERGED or hit[1] != HINT:
        if hit is None and re.search(r"\b(?:iteration|step|epoch)\b", line, re.I) and not _LOSS_SCALE.search(line):
            scales.clear()  # a step went through: the run of overflows is over
        return hit
    found = list(_LOSS_SCALE.finditer(line))  # "Attempted loss scale: 64, reducing to 32": the last is the new one
    if found and "lg_loss_scale" not in line:
        scales.append(float(found[-1].group("scale")))
        if len(scales) >= 2 and scales[-1] <= MIN_DIVERGED_SCALE:
            return Cause.DIVERGED, FAULT, None
    return hit


def scan_logs(logs: Sequence[LogText], known_nodes: Sequence[str] = (), year: Optional[int] = None) -> List[Finding]:
    """Findings of several logs (per-rank files, or one merged log); ranks are mapped to hosts across them."""
    hosts = host_by_rank([log.text for log in logs])
    findings: List[Finding] = []
    for i, log in enumerate(logs):
        findings.extend(scan_log(log, i, known_nodes, hosts, year))
    return findings


_CAPACITY = re.compile(r"total capacity of ([0-9.]+) (GiB|MiB)")


def gpu_capacity_bytes(texts: Sequence[str]) -> Optional[int]:
    """The GPU's total memory as CUDA's out-of-memory message states it ("GPU 0 has a total capacity of
    79.15 GiB of which ..."), from the last text that has it; None when none does."""
    for text in reversed(list(texts)):
        found = _CAPACITY.findall(text or "")
        if found:
            value, unit = found[-1]
            return int(float(value) * (2**30 if unit == "GiB" else 2**20))
    return None

"""Why an attempt ended: the cause taxonomy (these strings are the JSON values, exactly).

``Cause`` is a ``str`` enum, so ``Cause.GPU_OOM == "gpu_oom"`` and ``json.dumps`` writes the plain value.
"""
from __future__ import annotations

from enum import Enum
from typing import Dict


class Cause(str, Enum):
    COMPLETED = "completed"
    RUNNING = "running"
    PENDING = "pending"
    PREEMPTED = "preempted"
    TIMEOUT = "timeout"
    NODE_FAIL = "node_fail"
    HOST_OOM = "host_oom"
    GPU_OOM = "gpu_oom"
    SHM_EXHAUSTED = "shm_exhausted"
    NCCL_ERROR = "nccl_error"
    GPU_HW_ERROR = "gpu_hw_error"
    DIVERGED = "diverged"
    CANCELLED = "cancelled"
    CODE_ERROR = "code_error"
    ENV_ERROR = "env_error"
    RUN_DIR_BUSY = "run_dir_busy"
    HUNG = "hung"
    UNKNOWN = "unknown"

    def __str__(self) -> str:  # f"{cause}" gives "gpu_oom", not "Cause.GPU_OOM"
        return self.value


ALL_CAUSES = tuple(c.value for c in Cause)

# Not an ending: the watcher waits. UNKNOWN is here on purpose: a failed or empty sacct reply is never
# a reason to requeue (the job may be running fine while slurmdbd is busy).
WAITING = frozenset({Cause.RUNNING, Cause.PENDING, Cause.UNKNOWN})

# Faults that can *cause* other ranks to fail but are never themselves the echo of another rank's
# failure. NCCL errors and Python tracebacks are often echoes (a peer died, or SIGTERM arrived).
PRIMARY_FAULTS = frozenset({Cause.GPU_HW_ERROR, Cause.ENV_ERROR, Cause.HOST_OOM, Cause.GPU_OOM, Cause.SHM_EXHAUSTED,
                            Cause.DIVERGED})
SECONDARY_FAULTS = frozenset({Cause.CODE_ERROR, Cause.NCCL_ERROR})

SUMMARY: Dict[str, str] = {
    "completed": "the job finished successfully",
    "running": "the job is running",
    "pending": "the job is waiting in the queue",
    "preempted": "a higher-priority job took the nodes (Slurm preempted this one)",
    "timeout": "the job reached its time limit",
    "node_fail": "a node of the job failed or stopped responding",
    "host_oom": "the job used more host (CPU) memory than its --mem allows; the cgroup OOM killer ended it",
    "gpu_oom": "a GPU ran out of memory (CUDA out of memory)",
    "shm_exhausted": "shared memory (/dev/shm) ran full: data-loader workers pass batches through it, and a full "
                     "/dev/shm shows as a Bus error or 'No space left on device' in a worker",
    "nccl_error": "collective communication between ranks failed or timed out (NCCL/Gloo)",
    "gpu_hw_error": "a GPU reported a hardware fault (Xid, uncorrectable ECC, fallen off the bus, health check)",
    "diverged": "training diverged (NaN/inf loss, or the FP16 loss scale hit its minimum)",
    "cancelled": "someone cancelled the job (scancel)",
    "code_error": "the training code raised an error (a bug or a bad input, not the cluster)",
    "env_error": "the job's software environment lacks something (an unprepared DeepSpeed op, a missing package): "
                 "a retry in the same environment fails the same way",
    "run_dir_busy": "another live attempt (another job) holds the run directory's lease: this attempt did not "
                    "train, so the two cannot overwrite each other's checkpoints",
    "hung": "the job stopped making progress while it still held its nodes (no new step, or no training "
            "phase, within the hang limit its heartbeat and resilience settings give)",
    "unknown": "not known: either the state (sacct failed or has no record yet: wait) or, for an attempt that "
               "ended, the cause (no positive evidence for any cause: the hypotheses are in the evidence)",
}

ADVICE: Dict[str, str] = {
    "completed": "Nothing to do. Review the run: python -m hpc_agent.review.",
    "running": "Nothing to do yet; follow it with python -m hpc_agent.watch.",
    "pending": "Wait; `squeue -j JOBID -o %R` shows why it is pending.",
    "preempted": "Resume from the newest checkpoint (Slurm requeues it; `scontrol update JobId=N StartTime=now` "
                 "skips the 121 s requeue delay).",
    "timeout": "Resume from the newest checkpoint; if it makes no progress between attempts it is hanging, "
               "not slow.",
    "node_fail": "Resubmit excluding the failed node (slurm.exclude) and tell the admins.",
    "host_oom": "Ask for more memory (slurm.mem) or offload less to the CPU (train.offload).",
    "gpu_oom": "Halve train.micro_batch_size and double train.grad_accum_steps (same global batch); then "
               "train.activation_checkpointing=true, a higher train.zero_stage, train.offload=optimizer.",
    "shm_exhausted": "Use fewer data-loader workers (train.loader_workers; your script reads HPC_AGENT_LOADER_WORKERS), "
                     "or give the container a larger /dev/shm; shared memory counts against the job's --mem.",
    "nccl_error": "Resume once (often transient); if it repeats, exclude the nodes involved. If another rank "
                  "failed first, fix that rank's error instead.",
    "gpu_hw_error": "Resubmit excluding that node (slurm.exclude) and report the node to the admins.",
    "diverged": "Roll back to the last checkpoint before the divergence and lower train.lr (e.g. x0.5).",
    "cancelled": "Not requeued: a person cancelled it. Resubmit by hand if that was a mistake.",
    "code_error": "Not requeued: fix the error shown in the evidence, then resubmit.",
    "env_error": "Not requeued: run the fix the evidence names in the jobs' environment (for DeepSpeed ops: "
                 "python -m hpc_agent.prepare; for a package: pip install it, or the hpc_agent extra), then resubmit.",
    "run_dir_busy": "Not requeued: the job named in the evidence is training this run. If it should not be, "
                    "scancel it (it releases the lease as it ends; the lease of a killed job frees itself 60 s "
                    "after its last heartbeat), then resubmit.",
    "hung": "The watcher asks the ranks for their Python stacks (SIGURG), cancels the attempt and resubmits it from "
            "the newest checkpoint, excluding a node the evidence points at; a second hang at the same step in "
            "the same frame is a bug: look at the stuck frame in the evidence.",
    "unknown": "While the state is unknown: wait and ask again, a missing sacct answer is not a failure. For an "
               "attempt that ended without positive evidence of a cause: the watcher requeues it once, unchanged, "
               "from the newest checkpoint (a transient fault rarely repeats); a second unknown end at the same "
               "step parks the run in needs_attention with the log lines and the hypotheses.",
}

"""SIGTERM / SIGUSR2 -> save a complete checkpoint at the next micro-step, then exit 75.

Slurm sends SIGTERM on preemption (``PreemptMode=REQUEUE``: SIGCONT+SIGTERM, then SIGKILL when the
partition's GraceTime is over: 30 s on the local cluster) and on ``scancel``; it sends SIGUSR2
``slurm.signal_lead_s`` seconds before the time limit (``--signal=USR2@N``). submitit installs its own
handlers at start-up (it ignores SIGTERM, and on SIGUSR2 calls the callable's ``checkpoint()`` and
requeues); :meth:`StopRequest.install` replaces them once training code runs. SIGCONT keeps submitit's
log-and-ignore handler.

The handler only records the signal: torch and DeepSpeed are not safe to call from a signal
handler, and every rank has to save together. At each micro-step boundary the training loop calls
:meth:`StopRequest.agreed`, an all-reduce (MAX) of the recorded signal number, so a signal seen by any
rank stops all of them at the same point. The checkpoint then holds the state after the last
*completed* optimizer step; a half-accumulated step is dropped and redone after the resume (same
samples: the data position is the step number).

Exit code 75 (``EXIT_SIGNALLED_AFTER_CHECKPOINT``) means "a complete checkpoint exists; resume from it". What
happens to the Slurm job after the save is :func:`hand_back_to_slurm`'s business; under hpc_agent's job
script a SIGUSR2 rank exits 0 instead and the batch shell reports 75 (``hpc_agent/core/handback.py``).
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple

from hpc_agent.core.exit_codes import EXIT_SIGNALLED_AFTER_CHECKPOINT
from hpc_agent.core.handback import (BATCH_REQUEUE_ENV, PREEMPTED, STRAY, TIME_LIMIT, UNKNOWN, marker_path,
                                    pause_file_in_job)

HANDLED = (signal.SIGTERM, signal.SIGUSR2)
WAIT_FOR_SLURM_S = 3600.0  # longer than any GraceTime + KillWait: Slurm ends the wait first


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class StopRequest:
    """The first SIGTERM/SIGUSR2 received by this process, and when."""

    def __init__(self) -> None:
        self.signum = 0
        self.received_at: Optional[float] = None
        self.reason: Optional[Tuple[str, str]] = None
        """Rank 0's (reason, detail) for a SIGUSR2 (:func:`usr2_reason`), once asked."""
        self._previous: Dict[int, object] = {}

    def install(self) -> "StopRequest":
        for sig in HANDLED:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()

    def _handle(self, signum: int, frame: object) -> None:
        # Only plain assignments here: the handler can interrupt any bytecode of the main thread.
        if not self.signum:
            self.signum = signum
            self.received_at = time.monotonic()

    def forget(self) -> None:
        """Back to "no signal" (a SIGUSR2 taken as a checkpoint request): the next signal counts again."""
        self.signum, self.received_at, self.reason = 0, None, None

    def agreed(self, all_reduce_max: Callable[[int], int]) -> int:
        """The signal any rank received (0: none). Must be called by every rank at the same point."""
        seen = all_reduce_max(self.signum)
        if seen and not self.signum:  # another rank got it: remember, so later checks agree too
            self.signum, self.received_at = seen, time.monotonic()
        return seen


def usr2_reason(job_id: Optional[str], lead_s: int, cli=None) -> Tuple[str, str]:
    """Why this job got SIGUSR2, read from Slurm (``hpc_agent.slurm.usr2``): (reason, detail). Outside Slurm, or
    when scontrol fails, ``unknown``."""
    from hpc_agent.slurm.cli import SlurmCLI, SlurmError
    from hpc_agent.slurm.fallback import parse_scontrol_jobs
    from hpc_agent.slurm.usr2 import usr2_reason as classify

    if not job_id:
        return UNKNOWN, "not in a Slurm job"
    try:
        result = (cli or SlurmCLI(timeout_s=10)).run(["scontrol", "--oneliner", "show", "job", job_id], check=False)
    except SlurmError as exc:
        return UNKNOWN, f"scontrol failed: {exc}"
    jobs = parse_scontrol_jobs(result.stdout)
    return classify(jobs.get(job_id) or (next(iter(jobs.values())) if len(jobs) == 1 else {}), lead_s)


def say_usr2_reason(reason: str, detail: str, say: Callable[[str], None]) -> None:
    """The log line diagnosis reads (``hpc_agent/diagnosis/logscan.py``: "... a preemption notice")."""
    what = {PREEMPTED: "a preemption notice", TIME_LIMIT: "the time-limit warning",
            STRAY: "not Slurm's preemption or time-limit signal (a person's scancel --signal=USR2?): a checkpoint "
                   "request"}.get(reason, "of unknown reason (Slurm could not be asked): handled as a preemption")
    say(f"SIGUSR2 ({detail}): {what}")


def own_job_id(environ) -> Optional[str]:
    """This job's id as scontrol must be given it. An array task's SLURM_JOB_ID is its raw id, and one task's
    raw id is the array's own id, which scontrol reads as *every* task of the array (measured: the last task
    of array 177 ran with SLURM_JOB_ID=177): so an array task names itself ``<array>_<index>``."""
    array, task = environ.get("SLURM_ARRAY_JOB_ID"), environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return environ.get("SLURM_JOB_ID") or None


def hand_back_to_slurm(signum: int, say: Callable[[str], None], lead_s: int = 120,
                       reason: Optional[Tuple[str, str]] = None) -> int:
    """After the signal's checkpoint is complete, let Slurm decide the job's fate correctly; returns the
    exit code for this rank.

    Measured on the localhost Slurm: a job whose tasks *exit* during the preemption grace time ends
    FAILED and is NOT requeued. So the job must not simply exit:

    - SIGUSR2 is Slurm's warning (``--signal=USR2@lead``): the time limit is near, or, with
      ``SlurmctldParameters=preempt_send_user_signal``, a preemption has begun. Under hpc_agent's job
      script (``hpc_agent.core.handback.BATCH_REQUEUE_ENV`` set) rank 0 leaves the hand-back marker, every rank
      exits 0 (so that srun does not terminate the step: ``hpc_agent/core/handback.py``), and the batch shell
      requeues the job once the training step has ended. Measured on the localhost Slurm (22.05): a requeue while the step's
      tasks live leaves the step to slurmstepd's kill loop, which ends it ~2.3 s later (1 s sleeps between
      checks), and Slurm requeues only then; a requeue after the step ended is done in ~0.1 s. Elsewhere
      rank 0 requeues the job itself (``scontrol requeue``, as submitit does), which also ends every task.
      On a ``PreemptMode=CANCEL`` partition the same requeue wins the race against the cancel at the end
      of GraceTime (measured on ``lowcancel``), so the run keeps its job id and needs no resubmission.
    - SIGTERM is a preemption without that parameter, or ``scancel``: which one is not knowable here.
      Wait to be ended: on preemption Slurm requeues the job at the end of GraceTime (state
      PREEMPTED); on scancel it is killed and stays CANCELLED. A second SIGTERM (the end of the
      grace) ends the wait at once.

    Outside Slurm (local executor, tests) nothing is done: the caller exits 75 and whoever launched it
    resumes.
    """
    job_id = own_job_id(os.environ)
    if not job_id:
        return EXIT_SIGNALLED_AFTER_CHECKPOINT
    if signum == signal.SIGUSR2:
        batch_requeues = os.environ.get(BATCH_REQUEUE_ENV) == "1"
        if os.environ.get("SLURM_PROCID", "0") != "0":
            return 0 if batch_requeues else EXIT_SIGNALLED_AFTER_CHECKPOINT
        from hpc_agent.slurm.cli import SlurmCLI, SlurmError

        if reason is None:  # the built-in trainer asked already (launch/engine.py); a user's script has not
            reason = usr2_reason(job_id, lead_s)
            say_usr2_reason(*reason, say)
        if batch_requeues:
            if _leave_marker(os.environ, reason[0]):
                say(f"exiting 0 (hand-back marker left): the batch script requeues job {job_id} once every rank "
                    "has ended; this attempt ends now")
                return 0
            say(f"exiting {EXIT_SIGNALLED_AFTER_CHECKPOINT}: the batch script requeues job {job_id} once every "
                "rank has ended; this attempt ends now")
            return EXIT_SIGNALLED_AFTER_CHECKPOINT
        paused = pause_file_in_job(os.environ)
        if paused:  # the kill switch: no requeue; the watcher resumes the run after watch --resume
            say(f"the kill switch is set ({paused}): job {job_id} is not requeued; exiting 75 for the watcher "
                "to resume after watch --resume")
            return EXIT_SIGNALLED_AFTER_CHECKPOINT
        try:
            SlurmCLI(timeout_s=20).run(["scontrol", "requeue", job_id])
            say(f"requeued job {job_id} (scontrol requeue); this attempt ends now")
        except SlurmError as exc:
            say(f"could not requeue job {job_id} ({exc}); exiting 75 for the watcher to resume")
        return EXIT_SIGNALLED_AFTER_CHECKPOINT
    if signum == signal.SIGTERM:
        say(f"checkpoint complete; waiting for Slurm to requeue (preemption) or end (scancel) job {job_id}")
        ended = []
        signal.signal(signal.SIGTERM, lambda s, f: ended.append(s))
        deadline = time.monotonic() + WAIT_FOR_SLURM_S
        while not ended and time.monotonic() < deadline:
            time.sleep(0.5)
    return EXIT_SIGNALLED_AFTER_CHECKPOINT


def _leave_marker(environ, reason: str) -> bool:
    """Rank 0's "checkpoint complete, requeue me" for the batch shell (``hpc_agent.core.handback.marker_path``):
    ``<job id> <reason>``; only a preemption or the time limit hands over to a successor. False when it cannot be
    written, and the rank exits 75 instead (the batch shell then requeues, without a hand-over)."""
    from hpc_agent.core.fsutil import atomic_write_text

    run_dir, job_id = environ.get("HPC_AGENT_RUN_DIR"), environ.get("SLURM_JOB_ID")
    if not run_dir or not job_id or not os.path.isdir(run_dir):  # never create a run dir here
        return False
    try:
        atomic_write_text(Path(marker_path(run_dir, job_id)), f"{job_id} {reason}\n")
    except OSError:
        return False
    return True

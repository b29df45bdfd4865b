"""What the watcher observes each tick (I/O): one batched sacct call, and bounded reads of a run's files.

Reading a run's files never raises: every problem (an invalid ``config.yaml``, a log that is a FIFO or
a link to ``/dev/zero``) becomes a line in :attr:`RunFiles.problems`, and the pure core parks such a run
in ``needs_attention``; a corrupt TensorBoard tail is skipped and reported in :attr:`RunFiles.notes`.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from hpc_agent import rundir
from hpc_agent.checkpoints import complete_steps
from hpc_agent.config.problems import ConfigError
from hpc_agent.diagnosis.alarms import fatal_alarms
from hpc_agent.follow import RunFiles, RunState, history_from
from hpc_agent.metrics.tb_reader import RunScalars
from hpc_agent.slurm.cli import SlurmError
from hpc_agent.slurm.fallback import SQUEUE_FORMAT, as_sacct_text, parse_scontrol_jobs, parse_squeue
from hpc_agent.slurm.sacct import WATCH_FIELDS, Attempt, AttemptCache

TAIL_BYTES = 256 * 1024
ALARM_TAGS = ("train/loss", "train/loss_scale")


def sacct_attempts(slurm, ids: Sequence[str], report, say: Callable[[str], None],
                   cache: AttemptCache) -> Optional[Dict[str, List[Attempt]]]:
    """Every attempt of these jobs from ONE ``sacct -D`` call; when accounting fails, from slurmctld (one
    squeue + one scontrol call). None: states unknown, which means wait (never requeue on a guess)."""
    try:
        report.sacct_calls += 1
        text = slurm.sacct(list(ids), fields=WATCH_FIELDS)
    except SlurmError as exc:
        text = _without_accounting(slurm, list(ids), exc, report, say)
        if text is None:
            return None
    attempts = cache.attempts(text)
    if not attempts:
        report.unknown = True  # accounting answered nothing: unknown means wait, never requeue
        return None
    return attempts


def _without_accounting(slurm, ids: List[str], error: Exception, report, say) -> Optional[str]:
    try:
        report.fallback_calls += 2
        queued = slurm.run(["squeue", "--noheader", "--jobs", ",".join(ids), "--format", SQUEUE_FORMAT],
                           check=False).stdout
        known = slurm.run(["scontrol", "--oneliner", "show", "job"], check=False).stdout
    except SlurmError as exc:
        report.unknown = True
        say(f"sacct failed ({error}) and slurmctld does not answer ({exc}): states unknown, waiting")
        return None
    text = as_sacct_text(ids, parse_squeue(queued), parse_scontrol_jobs(known))
    if len(text.splitlines()) <= 1:
        report.unknown = True
        say(f"sacct failed ({error}); slurmctld knows none of our jobs: waiting")
        return None
    say(f"sacct failed ({error}); using squeue/scontrol")
    return text


def read_files(run_dir: Path, job_id: str, scalars: Optional[RunScalars]) -> RunFiles:
    """The run's config, the job's log tails, fatal TensorBoard alarms and complete checkpoints, each read
    bounded and regular-file-only. ``scalars`` is the run's incremental TensorBoard reader (kept between
    ticks by the watcher, so each tick reads only new bytes)."""
    problems: List[str] = []
    notes: List[str] = []
    config = None
    try:
        config = rundir.load_config(run_dir)
    except ConfigError as exc:
        text = "; ".join(p.expected if p.value == "<file>" else str(p) for p in exc.problems)
        problems.append(f"{rundir.CONFIG} is not a valid config: " + " ".join(text.split())[:500])
    except OSError as exc:
        problems.append(f"{rundir.CONFIG}: {exc.strerror or exc}" if not isinstance(exc, rundir.UnsafeFile) else str(exc))
    logs = []
    for path in rundir.find_logs(run_dir, job_id):
        try:
            logs.append(rundir.tail_log(path, TAIL_BYTES))
        except OSError as exc:
            problems.append(str(exc) if isinstance(exc, rundir.UnsafeFile) else f"{path.name}: {exc.strerror or exc}")
    alarms = []
    if scalars is not None:
        try:
            scalars.update()
            min_scale = config.train.min_loss_scale if config is not None else 1.0
            alarms = fatal_alarms(scalars.series("train/loss"), scalars.series("train/loss_scale"), min_scale)
        except Exception as exc:  # noqa: BLE001 - TensorBoard is evidence, not a reason to stop following
            notes.append(f"TensorBoard events not read ({type(exc).__name__}: {exc})")
        notes.extend(f"TensorBoard: {p}" for p in scalars.problems())
    try:
        steps = tuple(complete_steps(run_dir))
    except OSError as exc:
        problems.append(f"{rundir.CHECKPOINTS}/: {exc.strerror or exc}")
        steps = ()
    return RunFiles(config, tuple(logs), tuple(alarms), steps, tuple(problems), tuple(notes))


def run_state(ledger, run, state: RunState) -> RunState:
    """``state`` completed from the ledger: the policy's history, the last checkpoint step, the attempts
    of the run's earlier jobs, the newest decision. Read only for runs whose attempt ended or was requeued."""
    rows = ledger.decisions(run.run_id)
    offset = 0
    for sub in ledger.submissions(run.run_id):
        if sub.job_id == state.job_id:
            break
        if sub.job_id:
            offset += max((d.attempt for d in rows if d.job_id == sub.job_id), default=0) + 1
    last = rows[-1] if rows else None
    return replace(state, history=history_from(rows), attempt_offset=offset,
                   last_ckpt_step=next((r.ckpt_step for r in reversed(rows) if r.ckpt_step is not None), None),
                   last_decision=last and {"job_id": last.job_id, "attempt": last.attempt, "action": last.action,
                                           "cause": last.cause, "reason": last.reason, "patch": last.patch,
                                           "decision": last.decision})


def scalars_for(run_dir: Path) -> Optional[RunScalars]:
    tb = rundir.tb_dir(run_dir)
    return RunScalars(tb, tags=ALARM_TAGS) if tb.is_dir() and not tb.is_symlink() else None

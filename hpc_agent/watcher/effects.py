"""Carrying out the journaled effects of a decision, each idempotently (the I/O half of the watcher).

Each function may run twice for one effect: the watcher can be killed after the action and before the
journal marks it done. So each first looks at what already happened: a requeue is skipped when the job
is queued again; a resubmission whose intent is in the ledger asks Slurm for the run's job name
instead of calling sbatch again, and only when Slurm has no such job and the intent is older than any
sbatch still in flight could be does it submit.

Every effect carried out (``notify`` aside: it changes nothing outside our log) writes an action record
(``hpc_agent.state.audit``: who, what, why, config diff) in the transaction that marks it done, so each action
is in the audit trail exactly once, however often a crash made it run.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from hpc_agent.config.load import apply_patch, write_run_config
from hpc_agent.core import rundir
from hpc_agent.core.checkpoint_format import set_aside_after
from hpc_agent.core.filemodes import run_dir_problem
from hpc_agent.jobs.submission import SubmittedButIncomplete, crash_point
from hpc_agent.slurm.cli import SBATCH_IN_FLIGHT_S
from hpc_agent.slurm.job_match import job_name_for
from hpc_agent.slurm.queries import jobs_named, queue_state
from hpc_agent.state import audit, run_config
from hpc_agent.state.journal import EffectRow
from hpc_agent.state.ledger import Ledger, Run, Submission
from hpc_agent.state.lifecycle import FOLLOWED, Event, EventKind, Phase

INTENT_GRACE_S = SBATCH_IN_FLIGHT_S  # the default; watch --intent-grace sets it
LOCAL = "local"  # a submission's executor for a process on the submitting machine


class Retry(Exception):
    """Not done yet: leave the effect pending and try again on the next tick."""


class Refused(Retry):
    """The kill switch is set: the effect is not carried out (audited as refused), and stays pending until
    ``watch --resume``."""

    def __init__(self, pause_file: Path, kind: str):
        self.pause_file, self.kind = pause_file, kind
        super().__init__(f"paused: {pause_file} exists (the kill switch); {kind} refused")


@dataclass
class Context:
    ledger: Ledger
    slurm: Any
    submit: Callable[..., Any]
    say: Callable[[str, str], None]
    clock: Callable[[], float]
    intent_grace_s: float = INTENT_GRACE_S
    pause_file: Optional[Path] = None  # the runs root's kill switch; None: not checked (a test without one)


def check_paused(ctx: Context, kind: str) -> None:
    """Raise :class:`Refused` when the kill switch is set: right before every effect and every sbatch."""
    from hpc_agent.state.killswitch import is_paused

    if ctx.pause_file is not None and is_paused(ctx.pause_file):
        raise Refused(ctx.pause_file, kind)


def carry_out(ctx: Context, run: Run, effect: EffectRow) -> str:
    """Do one effect; returns what happened. Raises Retry (Refused while the kill switch is set: every kind,
    checked here, at the one door) or SlurmError/OSError, to be retried later. An effect on a local job (a
    process on this machine: ``submit --executor local``) is carried out on that process, never through Slurm."""
    check_paused(ctx, effect.kind)
    if effect.kind in _LOCAL_HANDLERS and effect.job_id and executor_of(ctx, run, effect.job_id) == LOCAL:
        return _LOCAL_HANDLERS[effect.kind](ctx, run, effect)
    return _HANDLERS[effect.kind](ctx, run, effect)


def executor_of(ctx: Context, run: Run, job_id: str) -> str:
    """The executor of the run's job ``job_id`` (its submission's), ``slurm`` for a job the ledger does not list."""
    return next((s.executor for s in reversed(ctx.ledger.submissions(run.run_id)) if s.job_id == job_id), "slurm")


# --- the local executor: a process on this machine (hpc_agent/jobs/local_process.py) ---------------------------------
def _local_cancel(ctx: Context, run: Run, e: EffectRow) -> str:
    """SIGTERM to the job's processes (each checked to be the job's by its command line); a gone job: nothing."""
    import signal

    from hpc_agent.jobs.local_process import signal_job

    sent = signal_job(Path(run.run_dir), e.job_id, signal.SIGTERM)
    ctx.say(run.run_id, f"cancelled local job {e.job_id} (SIGTERM to {len(sent)} process(es))" if sent
            else f"local job {e.job_id} has no process left to cancel")
    return f"cancelled ({len(sent)} processes)"


def _local_stacks(ctx: Context, run: Run, e: EffectRow) -> str:
    from hpc_agent.core.heartbeat_format import STACK_SIGNAL_NAME
    from hpc_agent.jobs.local_process import signal_job
    import signal

    sent = signal_job(Path(run.run_dir), e.job_id, getattr(signal, f"SIG{STACK_SIGNAL_NAME}"))
    ctx.say(run.run_id, f"asked local job {e.job_id} for its ranks' stacks (SIG{STACK_SIGNAL_NAME} to "
                        f"{len(sent)} process(es))")
    return "stacks requested"


LOCAL_KILL_AFTER_TRIES = 3
"""A local job still alive after this many ``await_end`` tries (a tick each) after its SIGTERM gets SIGKILL."""


def _local_await_end(ctx: Context, run: Run, e: EffectRow) -> str:
    """Done once the job's processes are gone; SIGKILL to what is left after a few tries."""
    import signal

    from hpc_agent.jobs.local_process import job_processes, marker_of, signal_job

    if not job_processes(e.job_id, marker_of(Path(run.run_dir))):
        return "ended"
    if e.tries >= LOCAL_KILL_AFTER_TRIES:
        signal_job(Path(run.run_dir), e.job_id, signal.SIGKILL)
    raise Retry(f"local job {e.job_id} still has processes")


def _not_local(ctx: Context, run: Run, e: EffectRow) -> str:
    """A Slurm-only effect on a local job (never decided for one: ``follow.requeue_effects``; a ledger from before)."""
    return f"skipped: job {e.job_id} is a local process ({e.kind} is a Slurm action)"


def _requeue(ctx: Context, run: Run, e: EffectRow) -> str:
    state = queue_state(ctx.slurm, e.job_id)
    if state is None:
        raise Retry("squeue did not answer")
    if state:  # queued again: we requeued it before a crash, or Slurm did
        return f"already queued ({state})"
    ctx.slurm.run(["scontrol", "requeue", e.job_id])
    crash_point("after_requeue")
    ctx.say(run.run_id, f"requeued job {e.job_id}")
    return "requeued"


def _expedite(ctx: Context, run: Run, e: EffectRow) -> str:
    from hpc_agent.slurm.cli import SlurmError

    try:
        ctx.slurm.run(["scontrol", "update", f"JobId={e.job_id}", "StartTime=now"])
    except SlurmError as exc:  # not worth a retry: the job starts anyway, after Slurm's own delay
        ctx.say(run.run_id, f"expedite of job {e.job_id} failed ({exc}); it starts after Slurm's delay")
        return f"failed: {exc}"
    ctx.say(run.run_id, f"expedited job {e.job_id} (StartTime=now)")
    return "expedited"


def _exclude(ctx: Context, run: Run, e: EffectRow) -> str:
    nodes = e.args["nodes"]
    ctx.slurm.run(["scontrol", "update", f"JobId={e.job_id}", f"ExcNodeList={nodes}"])
    cfg = apply_patch(run_config.current(ctx.ledger, run.run_id, run.run_dir), e.args["patch"])
    run_config.commit(ctx.ledger, run.run_id, run.run_dir, cfg, f"exclude {nodes} from job {e.job_id}")  # twice: harmless
    ctx.say(run.run_id, f"requeued job {e.job_id} now excludes {nodes}")
    return f"excluded {nodes}"


def _cancel(ctx: Context, run: Run, e: EffectRow) -> str:
    ctx.slurm.run(["scancel", e.job_id])  # an ended job: rc 0, nothing happens (so it may run twice)
    return "cancelled"


def _request_stacks(ctx: Context, run: Run, e: EffectRow) -> str:
    from hpc_agent.core.heartbeat_format import STACK_SIGNAL_NAME
    from hpc_agent.slurm.cli import signal_argv

    signal_job = getattr(ctx.slurm, "signal_job", None)
    if signal_job is not None:
        signal_job(e.job_id, STACK_SIGNAL_NAME)
    else:
        ctx.slurm.run(signal_argv(e.job_id, STACK_SIGNAL_NAME))
    ctx.say(run.run_id, f"asked job {e.job_id} for its ranks' stacks (SIG{STACK_SIGNAL_NAME})")
    return "stacks requested"


def _await_end(ctx: Context, run: Run, e: EffectRow) -> str:
    """Done once slurmctld no longer lists the job: its processes are gone (a ``COMPLETING`` job still has
    some), so the next attempt cannot train beside them."""
    state = queue_state(ctx.slurm, e.job_id)
    if state is None:
        raise Retry("squeue did not answer")
    if state:
        raise Retry(f"job {e.job_id} is still {state}")
    return "ended"


def _release_lease(ctx: Context, run: Run, e: EffectRow) -> str:
    """The run lease of the job just ended, moved aside: Slurm says the job is gone (``await_end`` ran
    before), so its lease is dead and the next attempt need not wait for it to go stale. A lease of any
    other job is left alone."""
    from hpc_agent.core.runlease import move_aside_if, read_holder

    path = rundir.lease_path(Path(run.run_dir))
    holder = read_holder(path)
    if holder is None or holder.job_id != e.job_id:
        return "no lease of this job"
    if move_aside_if(path, holder.observed(), f"ended-{e.job_id}"):
        ctx.say(run.run_id, f"run lease of ended job {e.job_id} released")
        return "released"
    return "lease changed meanwhile: left alone"


def _notify(ctx: Context, run: Run, e: EffectRow) -> str:
    ctx.say(run.run_id, str(e.args.get("text", "")))
    return "said"


def _resubmit(ctx: Context, run: Run, e: EffectRow) -> str:
    mine = [s for s in ctx.ledger.submissions(run.run_id) if s.id > e.after_submission]
    for sub in mine:
        if sub.job_id:
            return f"submitted as job {sub.job_id}"
        if not sub.error:
            found = settle_intent(ctx, run, sub)
            if found:
                return f"submitted as job {found} (found in Slurm after a restart)"
    run_dir = Path(run.run_dir)
    # The new job runs where the one it replaces ran: a local run stays local, a Slurm run on Slurm.
    executor = executor_of(ctx, run, e.job_id) if e.job_id else \
        next((s.executor for s in reversed(ctx.ledger.submissions(run.run_id))), "slurm")
    cfg = apply_patch(run_config.current(ctx.ledger, run.run_id, run_dir), e.args.get("patch", {}))
    to_step, before_step = e.args.get("rollback_to_step"), e.args.get("rollback_before_step")
    if to_step is not None or before_step is not None:
        moved = set_aside_after(run_dir, to_step, before_step)
        if moved:
            ctx.say(run.run_id, f"rollback: set aside checkpoints {', '.join(moved)}")
    n = len(ctx.ledger.submissions(run.run_id))
    # The job's copies, from the watcher's own config (never from what the run dir held): every attempt's config,
    # and config.yaml; submit_attempt records this config in the ledger with the intent.
    write_run_config(run_dir, cfg, name=rundir.config_history_path(run_dir, n).name)
    path = write_run_config(run_dir, cfg)
    try:
        job = ctx.submit(ctx.ledger, run.run_id, run_dir, cfg, path, executor, reason=e.args.get("reason", ""))
    except SubmittedButIncomplete as exc:  # sbatch answered; only the bookkeeping after it failed
        ctx.say(run.run_id, f"resubmitted as job {exc.job_id} ({exc})")
        return f"submitted as job {exc.job_id}"
    except Exception as exc:  # noqa: BLE001 - submitit raises plain exceptions carrying sbatch's stderr
        raise Retry(f"sbatch failed: {exc}") from exc
    job_id = getattr(job, "job_id", job)
    ctx.say(run.run_id, f"resubmitted as job {job_id}" + (" (local executor)" if executor == LOCAL else ""))
    return f"submitted as job {job_id}"


def _adopt(ctx: Context, run: Run, e: EffectRow) -> str:
    """The run follows the successor job its job submitted at a preemption (hpc_agent/core/handback.py): a submission
    row with that job id, intent and job id in one transaction, so the next tick's sacct asks for it. Run twice
    (a crash before the journal marked it done), it finds the row and does nothing."""
    successor = str(e.args["successor"])
    subs = ctx.ledger.submissions(run.run_id)
    if any(s.job_id == successor for s in subs):
        return f"already following job {successor}"
    latest = subs[-1]  # the submission of the job that handed over: the successor runs the same script and config
    executor, config_path = latest.executor, latest.config_path
    with ctx.ledger.transaction():
        sub_id = ctx.ledger.record_intent(run.run_id, executor, config_path,
                                          reason=f"successor of job {e.job_id}, submitted by it at its preemption")
        ctx.ledger.record_submitted(sub_id, successor)
    crash_point("after_adopt")
    try:  # run.json is for people and review (its job ids, its logs); the ledger has the truth
        from hpc_agent.jobs.submission import update_run_json

        run_dir = Path(run.run_dir)
        update_run_json(run_dir, run.run_id, executor, successor, Path(config_path),
                        run_config.current(ctx.ledger, run.run_id, run_dir))
    except Exception as exc:  # noqa: BLE001 - see above
        ctx.say(run.run_id, f"run.json not updated for job {successor} ({exc})")
    ctx.say(run.run_id, f"following job {successor}, the successor job {e.job_id} submitted at its preemption")
    return f"following job {successor}"


def settle_intent(ctx: Context, run: Run, sub: Submission) -> Optional[str]:
    """An intent without a job id: the job id Slurm has for it, or None after marking it abandoned (Slurm
    has no job under the run's name and the intent is older than any sbatch in flight). Raises Retry while
    the intent is young or Slurm cannot be asked: never submit a second job on a guess."""
    age = ctx.clock() - sub.intent_at
    if age < ctx.intent_grace_s:
        raise Retry(f"intent #{sub.id} is {age:.0f} s old; an sbatch may still be in flight "
                    f"(waiting {ctx.intent_grace_s:.0f} s before asking Slurm)")
    if sub.executor == LOCAL:  # a process on this machine: asked of /proc, never of Slurm
        from hpc_agent.jobs.local_process import find_job

        pid = find_job(Path(run.run_dir))
        found = [pid] if pid else []
    else:
        found = jobs_named(ctx.slurm, job_name_for(run.run_id), since=sub.intent_at)
    if found is None:
        raise Retry("cannot reach Slurm to settle the pending intent")
    known = {s.job_id for s in ctx.ledger.submissions(run.run_id) if s.job_id}
    new = [j for j in found if j not in known]
    if new:
        with ctx.ledger.transaction():
            ctx.ledger.record_submitted(sub.id, new[-1])
            phase = ctx.ledger.run(run.run_id).phase
            if phase in ("submitting", "recovering"):
                kind = EventKind.FOUND if phase == "submitting" else EventKind.SUBMITTED
                ctx.ledger.advance(run.run_id, Event(kind, new[-1]))
        ctx.say(run.run_id, f"reconciled: intent #{sub.id} reached Slurm as job {new[-1]}")
        return new[-1]
    ctx.ledger.record_failed(sub.id, "abandoned: the submitter died before sbatch")
    ctx.say(run.run_id, f"reconciled: intent #{sub.id} never reached Slurm")
    return None


_LOCAL_HANDLERS = {"cancel": _local_cancel, "request_stacks": _local_stacks, "await_end": _local_await_end,
                   "requeue": _not_local, "expedite": _not_local, "exclude": _not_local}
_HANDLERS = {"requeue": _requeue, "expedite": _expedite, "exclude": _exclude, "cancel": _cancel,
             "notify": _notify, "resubmit": _resubmit, "request_stacks": _request_stacks, "await_end": _await_end,
             "release_lease": _release_lease, "adopt": _adopt}


class Carrier:
    """Carries out the journal: each run's pending effects in order (stopping at the first that must be
    retried), start-up settling of intents without a job id, and events.jsonl from the audit records.
    ``guard(run, job_id, step)`` is the watcher's per-run isolation: one run's failure parks that run."""

    def __init__(self, ctx: Context, journal, guard: Callable[..., None], time_of: Callable[[float], str],
                 process: str = "watcher"):
        self.ctx, self.journal, self.guard, self.time_of, self.process = ctx, journal, guard, time_of, process

    def settle(self) -> None:
        """Pending effects (a previous tick's, or a killed watcher's), then intents without a job id."""
        ledger = self.ctx.ledger
        for run_id in sorted(self.journal.pending_runs()):
            run = ledger.run(run_id)
            if run is not None and Phase(run.phase) in FOLLOWED:
                self.guard(run, "", lambda run=run: self.run_effects(run))
        busy = self.journal.pending_runs()  # a resubmission's own intent is settled by its effect
        for run, sub in ledger.open_intents([p.value for p in FOLLOWED]):
            if run.run_id not in busy:
                self.guard(run, "", lambda run=run, sub=sub: self._settle_intent(run, sub))

    def _settle_intent(self, run: Run, sub: Submission) -> None:
        try:
            found = settle_intent(self.ctx, run, sub)
        except Retry:
            return
        if found is None:
            try:
                check_paused(self.ctx, "submit")
            except Refused as exc:
                self._refused(run, "submit", "", exc)
                return
            self.ctx.say(run.run_id, f"intent #{sub.id} never reached Slurm; submitting it now")
            cfg = run_config.current(self.ctx.ledger, run.run_id, run.run_dir)
            if Path(sub.config_path) == rundir.config_path(Path(run.run_dir)):
                write_run_config(Path(run.run_dir), cfg)  # the job's copy, from the watcher's own
            job = self.ctx.submit(self.ctx.ledger, run.run_id, Path(run.run_dir), cfg, Path(sub.config_path), sub.executor,
                                  reason=sub.reason)
            audit.record_action(self.journal, run.run_id, "submit", str(getattr(job, "job_id", job)),
                                f"intent #{sub.id} ({sub.reason or 'submit'}) never reached Slurm: submitted again",
                                process=self.process, result="submitted")

    def run_effects(self, run: Run) -> None:
        from hpc_agent.slurm.cli import SlurmError

        foreign = run_dir_problem(run.run_dir)  # never submit into, or write, a run dir someone else controls
        for effect in self.journal.pending(run.run_id):
            if foreign is not None:
                self.journal.mark_try(effect.id, foreign)
                self.ctx.say(run.run_id, f"{effect.kind} refused: {foreign}")
                return
            try:
                result = carry_out(self.ctx, run, effect)
            except Refused as exc:  # left pending (tries unchanged): carried out after watch --resume
                self._refused(run, effect.kind, effect.job_id, exc)
                return
            except (Retry, SlurmError, OSError) as exc:
                self.journal.mark_try(effect.id, str(exc))
                self.ctx.say(run.run_id, f"{effect.kind} not done yet ({exc}); will retry next tick")
                return
            self._done(run, effect, result)
        if Phase(self.ctx.ledger.run(run.run_id).phase) is Phase.RECOVERING:
            self.ctx.ledger.advance(run.run_id, Event(EventKind.RECOVERED))
        self.flush_events([run.run_id])

    def _refused(self, run: Run, kind: str, job_id: str, exc: Refused) -> None:
        """Say and audit that the kill switch stopped ``kind`` (the watcher checks it before each tick and each
        run too; this is the last check, right before the action, for a pause set meanwhile)."""
        self.ctx.say(run.run_id, f"{kind} refused: {exc}")
        with (nullcontext() if getattr(self.ctx.ledger.db, "in_transaction", False) else self.ctx.ledger.transaction()):
            audit.record_refused(self.journal, run.run_id, kind, job_id, exc.pause_file, process=self.process)
        self.flush_events([run.run_id])

    def _done(self, run: Run, effect: EffectRow, result: str) -> None:
        """Mark the effect done and write its action record, together (one record per action)."""
        ledger = self.ctx.ledger
        with (nullcontext() if getattr(ledger.db, "in_transaction", False) else ledger.transaction()):
            self.journal.mark_done(effect.id, result)
            if effect.kind not in audit.NOT_ACTIONS:
                decision = audit.decision_for(effect.kind, effect.job_id, effect.created_at,
                                              self.journal.audit_records(run.run_id))
                audit.record_action(self.journal, run.run_id, effect.kind, effect.job_id, process=self.process,
                                    result=result, **audit.effect_fields(effect.kind, effect.args, decision))

    def flush_events(self, run_ids=None) -> None:
        """Each run's unwritten audit records into its events.jsonl, each run under the guard: a file the job
        wrote that the journal's reader chokes on parks that run (its audit stays in the ledger)."""
        for run_id in sorted(run_ids if run_ids is not None else self.journal.unwritten_runs()):
            run = self.ctx.ledger.run(run_id)
            if run is None:  # a sweep-level record (a held job no trial owns): it has no run dir, the ledger keeps it
                continue
            if run_dir_problem(run.run_dir) is not None:  # not ours to write into: the ledger keeps the records
                continue
            self.guard(run, "", lambda run=run: self._flush_one(run))

    def _flush_one(self, run: Run) -> None:
        try:
            self.journal.flush_events(run.run_id, Path(run.run_dir), self.time_of, crash_point,
                                      say=lambda text: self.ctx.say(run.run_id, text))
        except OSError as exc:  # the audit stays in the ledger; retried next tick
            self.ctx.say(run.run_id, f"events.jsonl not written ({exc}); the audit is kept in the ledger")

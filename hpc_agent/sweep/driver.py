"""The sweep driver: Optuna ask/tell around ordinary runs submitted as job arrays.

One loop, resumable at any point because every step is recorded before it is acted on:

* ask: a trial's params come from the sampler (random start-up, then TPE); its run id, run dir and its
  place in the array (batch, index) are written to the trial's user attributes before sbatch.
* submit: the asked trials go out as one array (``batch.py``), at most ``parallel`` running at once;
  then the job ids go to the trial attributes and the runs ledger, where the watcher picks them up.
* follow: each trial's TensorBoard scalars are read incrementally and every new value of the objective
  tag is reported to the pruner; a trial the pruner gives up on is marked, moved to ``stopped`` in the
  ledger (so the watcher does not revive it), ``scancel``-ed and told as PRUNED.
* tell: a trial is COMPLETE when its run completed (the watcher's verdict, or Slurm's COMPLETED), with
  the objective tag's value at its last step; FAIL when the watcher stopped it. A preempted or OOM-ed
  trial is neither: the watcher requeues or resubmits it, and the driver follows the run's latest job.

A restarted driver first adopts what a killed one left: ``adopt.py``.

The kill switch (``python -m hpc_agent.watch --pause``, ``hpc_agent.state.killswitch``) is checked at every turn
of the loop and right before every ask-and-submit, release and cancel: a paused runs root raises
:class:`~hpc_agent.state.killswitch.Paused` before the action, with everything done so far recorded, so the same
sweep command continues after ``--resume``. Each submit and cancel writes an action record
(``hpc_agent.state.audit``) to the trial run's audit trail.
"""
from __future__ import annotations

import datetime as _dt
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from hpc_agent.config.load import load_config, write_run_config
from hpc_agent.core import rundir
from hpc_agent.core.filemodes import make_dir
from hpc_agent.jobs.submission import crash_point
from hpc_agent.metrics.tb_reader import Point, RunScalars
from hpc_agent.slurm.cli import SlurmError
from hpc_agent.slurm.sacct import group_attempts, parse_sacct
from hpc_agent.state import audit, killswitch, run_config
from hpc_agent.state.journal import Journal
from hpc_agent.state.lifecycle import TERMINAL, Event, EventKind, Phase
from hpc_agent.sweep import adopt as adoption
from hpc_agent.sweep.batch import TrialJob, register_trial, release_array, submit_array
from hpc_agent.sweep.spec import SweepSpec, distributions, trial_overrides, trial_run_id
from hpc_agent.sweep.trial_attrs import A_BATCH, A_FAIL, A_INDEX, A_INTENT, A_JOB, A_PRUNED, A_RUN_DIR, A_RUN_ID, A_SIZE


def objective_value(points: Sequence[Point]) -> Optional[float]:
    """The objective: the tag's value at the last step logged (None if the tag never appeared)."""
    return max(points, key=lambda p: p.step).value if points else None


def _say_now(text: str) -> None:
    # progress, so -q silences it; ``cli.flags``' handler flushes each line (a log that is tailed, or read
    # after a kill -9, must not sit in a buffer)
    logging.getLogger(__name__).info(text)


def new_reports(points: Sequence[Point], reported: set) -> List[Point]:
    """Intermediate values not yet reported to the pruner (one per step, in step order)."""
    latest: Dict[int, Point] = {}
    for p in points:
        latest[p.step] = p
    return [latest[s] for s in sorted(latest) if s not in reported]


def trial_outcome(phase: Optional[str], slurm_state: Optional[str], pruned: bool) -> Optional[str]:
    """What to tell Optuna about a followed trial now: "pruned", "complete", "fail" or None (keep following).

    The ledger phase is the watcher's verdict; a COMPLETED Slurm state also counts so that a sweep finishes
    without a watcher when nothing goes wrong. Any other ended state waits for the watcher's decision."""
    if pruned:
        return "pruned"
    if phase == "completed" or slurm_state == "COMPLETED":
        return "complete"
    if phase == "stopped":
        return "fail"
    return None


@dataclass
class Followed:
    """A RUNNING trial the driver follows."""

    trial: Any
    run_id: str
    run_dir: Path
    scalars: RunScalars
    reported: set = field(default_factory=set)
    warned: bool = False
    max_steps: Optional[int] = None
    """The run's ``train.max_steps`` (the ledger's copy of its config), read once; 0 when unknown."""


def still_training(reported: set, max_steps: int) -> bool:
    """Whether pruning a trial would still stop work: False once it has reported its run's last step (it trained
    to the end, and pruning it would discard a complete result rather than save compute). ``max_steps`` 0: not
    known, so pruning is never held back."""
    return not reported or max_steps <= 0 or max(reported) < max_steps


class SweepDriver:
    """Optuna ask/tell around ordinary runs; implements :class:`hpc_agent.sweep.adopt.Adopter` for its start-up."""

    def __init__(self, spec: SweepSpec, study, *, config: str, cli_overrides: Sequence[str], sweep_dir: Path,
                 runs_root: Path, ledger, slurm, out: Callable[[str], None] = _say_now,
                 clock: Callable[[], float] = time.time, submit: Callable[..., List[str]] = submit_array):
        self.spec, self.study, self.config, self.cli_overrides = spec, study, config, list(cli_overrides)
        self.sweep_dir, self.runs_root, self.ledger, self.slurm = sweep_dir, runs_root, ledger, slurm
        self.out, self.clock, self.submit = out, clock, submit
        self.followed: Dict[int, Followed] = {}
        self.unsubmitted: List[Any] = []  # asked trials whose array never reached Slurm

    # --- helpers ----------------------------------------------------------------------------------------
    def say(self, text: str) -> None:
        self.out(f"[sweep {_dt.datetime.fromtimestamp(self.clock()).strftime('%H:%M:%S')}] {text}")

    def halt_if_paused(self, before: str) -> None:
        """The kill switch, checked right before each action: raises ``killswitch.Paused``, after one audit
        record of the refusal (under the sweep's own id, in the ledger)."""
        try:
            killswitch.check(self.runs_root, before)
        except killswitch.Paused as exc:
            try:
                with self.ledger.transaction():
                    audit.record_refused(Journal(self.ledger), adoption.sweep_audit_id(self.spec.name), before, "",
                                         exc.pause_file, process="sweep")
            except Exception as inner:  # noqa: BLE001 - the stop stands; the audit is a record of it
                self.say(f"(could not record the refusal in the ledger: {inner})")
            raise

    @staticmethod
    def set_attr(trial, key: str, value: Any) -> None:
        trial.set_user_attr(key, value)  # written to the storage at once: the trial's durable record

    def trial_config(self, number: int, params: Dict[str, Any]):
        run_id = trial_run_id(self.spec.name, number)
        overrides = trial_overrides(self.spec, params, run_id, str(self.runs_root), fixed=self.cli_overrides)
        return run_id, load_config(self.config, overrides)

    def trial_obj(self, frozen):
        import optuna

        # Optuna's own way back from a stored trial to one that can report and be told (no public alias).
        return optuna.trial.Trial(self.study, frozen._trial_id)

    def counts(self) -> Dict[str, int]:
        out: Dict[str, int] = {}
        for t in self.study.get_trials(deepcopy=False):
            out[t.state.name] = out.get(t.state.name, 0) + 1
        return out

    # --- start-up: adopt what a killed driver left (adopt.py) ---------------------------------------------
    def adopt(self) -> None:
        """Take over the study's RUNNING trials (followed, submitted again or registered; ``adopt.adopt``)."""
        adoption.adopt(self)

    def settle_held(self, adopting: Sequence[str] = ()) -> None:
        """Release or cancel every held task of this sweep's arrays still in the queue (``adopt.settle_held``)."""
        adoption.settle_held(self, adopting)

    def follow(self, trial, attrs: Dict[str, Any], reported: Optional[set] = None) -> None:
        run_dir = Path(attrs[A_RUN_DIR])
        self.followed[trial.number] = Followed(trial, attrs[A_RUN_ID], run_dir,
                                               RunScalars(rundir.tb_dir(run_dir), tags=[self.spec.tag]),
                                               reported=set(reported or ()))

    # --- submit -----------------------------------------------------------------------------------------
    def fill(self) -> None:
        """Ask for as many trials as there are free slots (within the budget) and submit them as one array."""
        free = self.spec.parallel - len(self.followed)
        total = len(self.study.get_trials(deepcopy=False))
        if free > 0 and (self.unsubmitted or total < self.spec.trials):
            self.halt_if_paused("asking and submitting new trials")  # nothing asked yet: nothing to undo
        trials = self.unsubmitted[:free]
        self.unsubmitted = self.unsubmitted[len(trials):]
        dists = distributions(self.spec)
        while len(trials) < free and total < self.spec.trials:
            trials.append(self.study.ask(dists))
            total += 1
        if trials:
            self._submit(trials)

    def _submit(self, trials: List[Any]) -> None:
        self.halt_if_paused(f"submitting trials {[t.number for t in trials]}")
        batch = f"b{trials[0].number:03d}-{int(self.clock())}"
        jobs: List[TrialJob] = []
        for index, trial in enumerate(trials):
            run_id, cfg = self.trial_config(trial.number, trial.params)
            run_dir = self.runs_root / run_id
            for sub in (rundir.tb_dir, rundir.checkpoints_dir, rundir.slurm_dir):
                make_dir(sub(run_dir))
            jobs.append(TrialJob(trial.number, run_id, run_dir, write_run_config(run_dir, cfg), cfg))
            # One attribute per storage write; A_INTENT goes last and marks the intent complete (adopt).
            for key, value in ((A_RUN_ID, run_id), (A_RUN_DIR, str(run_dir)), (A_BATCH, batch), (A_INDEX, index),
                               (A_SIZE, len(trials)), (A_INTENT, self.clock())):
                self.set_attr(trial, key, value)
        crash_point("sweep_after_intent")  # tests: the intent is recorded, sbatch never ran
        try:
            job_ids = self.submit(jobs, self.spec.name, batch, self.spec.parallel, rundir.slurm_dir(self.sweep_dir))
        except Exception as exc:  # noqa: BLE001 - submitit raises plain exceptions carrying sbatch's stderr
            # The trials keep their intent: the next driver finds no array by that name and submits them again.
            raise SlurmError(f"sbatch refused the array for trials {[j.number for j in jobs]}: {exc}") from exc
        crash_point("sweep_before_release")  # tests: the array is in Slurm, held (see settle_held)
        # Paused meanwhile: the array stays held, and the next driver (after --resume) adopts and releases it.
        self.halt_if_paused(f"releasing the array of trials {[j.number for j in jobs]}")
        release_array(self.slurm, job_ids)  # submitted held: submitit has now put every pickle in place
        crash_point("sweep_after_submit")  # tests: the array is in Slurm, its job ids recorded nowhere
        for trial, job, job_id in zip(trials, jobs, job_ids):
            register_trial(self.ledger, job, job_id, self.spec.name, batch, rundir.slurm_dir(self.sweep_dir))
            self.set_attr(trial, A_JOB, job_id)
            self.follow(trial, {A_RUN_ID: job.run_id, A_RUN_DIR: str(job.run_dir)})
            params = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in trial.params.items())
            self.say(f"trial {trial.number}: submitted run {job.run_id} as job {job_id} ({params})")

    # --- follow -----------------------------------------------------------------------------------------
    def poll(self) -> None:
        if not self.followed:
            return
        states = self._slurm_states()
        for number in list(self.followed):
            f = self.followed[number]
            self._report(f)
            pruned = A_PRUNED in f.trial.user_attrs
            run = self.ledger.run(f.run_id)
            sub = self.ledger.latest_submission(f.run_id)
            state = states.get(sub.job_id) if sub is not None else None
            if pruned and run is not None and Phase(run.phase) not in TERMINAL:
                # Pruned by a driver killed before it stopped the run: finish that first.
                self._cancel(f, f.trial.user_attrs[A_PRUNED])
                run = self.ledger.run(f.run_id)
            outcome = trial_outcome(run.phase if run else None, state, pruned)
            if outcome is None and still_training(f.reported, self._max_steps(f)) and f.trial.should_prune():
                # Checked only while the run is unfinished: a trial that already completed is told as
                # complete (its full result is there), pruning exists to stop work, not to discard it.
                self._prune(f, max(f.reported) if f.reported else 0)
                outcome = "pruned"
            if outcome is None:
                if state and state not in ("PENDING", "RUNNING", "REQUEUED", "COMPLETING") and not f.warned:
                    f.warned = True
                    self.say(f"trial {number}: job {sub.job_id} ended {state}; waiting for the watcher's decision")
                continue
            self._tell(f, outcome)

    def _max_steps(self, f: Followed) -> int:
        if f.max_steps is None:
            try:
                f.max_steps = int(run_config.current(self.ledger, f.run_id).train.max_steps)  # recorded at submit
            except Exception:  # noqa: BLE001 - not known: pruning is not held back
                f.max_steps = 0
        return f.max_steps

    def _slurm_states(self) -> Dict[str, str]:
        ids = [s.job_id for f in self.followed.values() if (s := self.ledger.latest_submission(f.run_id)) and s.job_id]
        try:
            attempts = group_attempts(parse_sacct(self.slurm.sacct(ids)))
        except SlurmError:
            return {}
        return {job_id: found[-1].state for job_id, found in attempts.items() if found}

    def _report(self, f: Followed) -> None:
        f.scalars.update()
        for point in new_reports(f.scalars.series(self.spec.tag), f.reported):
            f.trial.report(point.value, point.step)
            f.reported.add(point.step)

    def _prune(self, f: Followed, step: int) -> None:
        """Record, stop following in the ledger, then cancel: a crash at any point leaves a trial that the
        next driver still tells as PRUNED (and stops first, see ``poll``), and a watcher that never mistakes
        the cancel for a failure."""
        self.halt_if_paused(f"pruning trial {f.trial.number}")  # before the mark: a paused driver decides nothing
        self.set_attr(f.trial, A_PRUNED, step)
        ids = self._cancel(f, step)
        self.say(f"trial {f.trial.number}: pruned at step {step} ({self.spec.pruner.kind} pruner); job(s) "
                 f"{', '.join(ids)} cancelled")

    def _cancel(self, f: Followed, step: int) -> List[str]:
        """Move the pruned trial's run to ``stopped`` (the lifecycle's CANCELLED edge), then scancel its jobs.
        Idempotent: a driver killed half-way through ``_prune`` finishes it on adoption."""
        self.halt_if_paused(f"cancelling pruned trial {f.trial.number}")
        ids = [s.job_id for s in self.ledger.submissions(f.run_id) if s.job_id]
        run = self.ledger.run(f.run_id)
        advanced = run is not None and Phase(run.phase) not in TERMINAL
        journal = Journal(self.ledger)
        if advanced:  # the phase and its audit record together (the audit trail lives in the ledger's journal)
            with self.ledger.transaction():
                self.ledger.advance(f.run_id, Event(EventKind.CANCELLED, ids[-1] if ids else None,
                                                    detail={"reason": f"pruned at step {step}"}))
                journal.add_audit(f.run_id, {"action": "pruned", "step": step,
                                             "reason": f"{self.spec.pruner.kind} pruner"})
        try:
            result = self.slurm.run(["scancel", *ids], check=False)
            outcome = "cancelled" if getattr(result, "returncode", 0) == 0 else \
                f"scancel answered {result.returncode}: {(getattr(result, 'stderr', '') or '').strip()}"
        except SlurmError as exc:
            outcome = f"scancel failed: {exc}"
            self.say(f"trial {f.trial.number}: scancel failed ({exc}); the job runs to its end")
        if ids:
            audit.record_action(journal, f.run_id, "cancel", " ".join(ids), process="sweep", result=outcome,
                                reason=f"trial {f.trial.number} pruned at step {step} ({self.spec.pruner.kind} pruner)")
        try:  # events.jsonl from the journal; a failure here is retried by the watcher's next tick
            journal.flush_events(f.run_id, f.run_dir, lambda at: _dt.datetime.fromtimestamp(at).isoformat(
                timespec="seconds"))
        except OSError as exc:
            self.say(f"trial {f.trial.number}: events.jsonl not written ({exc}); the audit is in the ledger")
        return ids

    def _tell(self, f: Followed, outcome: str) -> None:
        import optuna

        del self.followed[f.trial.number]
        if outcome == "pruned":
            self.study.tell(f.trial, state=optuna.trial.TrialState.PRUNED)
            return
        if outcome == "complete":
            f.scalars.update()
            value = objective_value(f.scalars.series(self.spec.tag))
            if value is not None:
                self.study.tell(f.trial, value)
                self.say(f"trial {f.trial.number}: complete, {self.spec.tag} = {value:.4g}")
                return
            reason = f"the run completed without logging {self.spec.tag}"
        else:
            reason = f"the watcher stopped the run (see its {rundir.EVENTS})"
        self.set_attr(f.trial, A_FAIL, reason)
        self.study.tell(f.trial, state=optuna.trial.TrialState.FAIL)
        self.say(f"trial {f.trial.number}: failed: {reason}")

    # --- the loop ---------------------------------------------------------------------------------------
    def finished(self) -> bool:
        return not self.followed and not self.unsubmitted and len(self.study.get_trials(deepcopy=False)) >= self.spec.trials

    def run(self, poll_s: float = 2.0, stop: Callable[[], bool] = lambda: False,
            on_poll: Callable[[], None] = lambda: None) -> None:
        """Adopt, then poll and fill until the budget is spent; raises ``killswitch.Paused`` on the kill switch.
        ``on_poll`` runs first on each turn: the embedded watcher's tick and the progress (``sweep/live.py``)."""
        self.halt_if_paused("adopting the study's running trials")
        self.adopt()
        while not stop():
            self.halt_if_paused("the next poll")
            on_poll()
            self.poll()
            self.fill()
            if self.finished():
                break
            time.sleep(poll_s)

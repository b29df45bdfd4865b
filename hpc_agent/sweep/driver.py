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

A restarted driver adopts the study's RUNNING trials (``adopt``) instead of asking new ones. Each kill
point leaves a state it recognises: a trial asked but cut short inside ``ask`` (params completed, then
submitted), one whose intent is incomplete or whose array never reached Slurm (submitted again), one
whose held array is in Slurm without recorded job ids (found by name, pickles restored, released,
registered), one with a job id (followed). The ledger registration is one transaction.
"""
from __future__ import annotations

import datetime as _dt
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from hpc_agent.config.load import load_config
from hpc_agent.metrics.tb_reader import Point, RunScalars
from hpc_agent.slurm.cli import SlurmError
from hpc_agent.slurm.sacct import group_attempts, parse_sacct
from hpc_agent.submission import crash_point, write_config
from hpc_agent.sweep.batch import (TrialJob, find_array, register_trial, release_array, restore_pickles, submit_array,
                                   task_job_id)
from hpc_agent.sweep.spec import SweepSpec, distributions, trial_overrides, trial_run_id

# Trial user attributes (the trial's own record of where its run is).
A_RUN_ID, A_RUN_DIR, A_BATCH, A_INDEX, A_SIZE, A_INTENT, A_JOB = (
    "run_id", "run_dir", "batch", "batch_index", "batch_size", "intent_at", "job_id")
A_PRUNED = "pruned_at_step"
A_FAIL = "fail_reason"


def objective_value(points: Sequence[Point]) -> Optional[float]:
    """The objective: the tag's value at the last step logged (None if the tag never appeared)."""
    return max(points, key=lambda p: p.step).value if points else None


def complete_params(trial, dists: Dict[str, Any]) -> List[str]:
    """Suggest the params a trial lacks: a driver killed inside ``study.ask`` (which stores the trial, then
    its params one by one) leaves a RUNNING trial that would otherwise run with the config's defaults
    for the rest. Returns the names suggested now."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    missing = [name for name in dists if name not in trial.params]
    for name in missing:
        dist = dists[name]
        if isinstance(dist, CategoricalDistribution):
            trial.suggest_categorical(name, dist.choices)
        elif isinstance(dist, IntDistribution):
            trial.suggest_int(name, dist.low, dist.high, step=dist.step, log=dist.log)
        else:
            trial.suggest_float(name, dist.low, dist.high, step=dist.step, log=dist.log)
    return missing


def _say_now(text: str) -> None:
    print(text, flush=True)  # a log that is tailed, or read after a kill -9, must not sit in a buffer


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


class SweepDriver:
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

    @staticmethod
    def _set(trial, key: str, value: Any) -> None:
        trial.set_user_attr(key, value)  # written to the storage at once: the trial's durable record

    def _trial_config(self, number: int, params: Dict[str, Any]):
        run_id = trial_run_id(self.spec.name, number)
        overrides = trial_overrides(self.spec, params, run_id, str(self.runs_root), fixed=self.cli_overrides)
        return run_id, load_config(self.config, overrides)

    def _trial_obj(self, frozen):
        import optuna

        # Optuna's own way back from a stored trial to one that can report and be told (no public alias).
        return optuna.trial.Trial(self.study, frozen._trial_id)

    def counts(self) -> Dict[str, int]:
        out: Dict[str, int] = {}
        for t in self.study.get_trials(deepcopy=False):
            out[t.state.name] = out.get(t.state.name, 0) + 1
        return out

    # --- start-up: adopt what a killed driver left ------------------------------------------------------
    def adopt(self) -> None:
        import optuna

        running = self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        reached = []  # (trial, frozen trial, job id): in Slurm, its job id recorded nowhere yet
        for frozen in running:
            attrs = frozen.user_attrs
            trial = self._trial_obj(frozen)
            if A_JOB in attrs:
                self._follow(trial, attrs, set(frozen.intermediate_values))
                self.say(f"trial {frozen.number}: adopted run {attrs[A_RUN_ID]} (job {attrs[A_JOB]})")
                continue
            # A_INTENT is the last attribute written before sbatch: without it, sbatch never ran.
            if A_INTENT in attrs:
                found = find_array(self.slurm, self.spec.name, attrs[A_BATCH], attrs[A_INTENT])
                if found is None:
                    raise SlurmError("Slurm does not answer; cannot tell whether an interrupted submission "
                                     "reached it. Run the sweep again when squeue/sacct work.")
                job_id = task_job_id(found, attrs[A_INDEX], attrs[A_SIZE])
                if job_id is not None:
                    reached.append((trial, frozen, job_id))
                    continue
            completed = complete_params(trial, distributions(self.spec))
            if completed:
                self.say(f"trial {frozen.number}: was cut short while being asked; sampled {', '.join(completed)}")
            self.say(f"trial {frozen.number}: was asked but never reached Slurm; submitting it now")
            self.unsubmitted.append(trial)
        if not reached:
            return
        # The array is held (batch.py): every task's pickle in place first, then release, then register.
        restored = restore_pickles(self.sweep_dir / "slurm", {job_id: Path(f.user_attrs[A_RUN_DIR])
                                                              for _, f, job_id in reached})
        release_array(self.slurm, [job_id for _, _, job_id in reached])
        for trial, frozen, job_id in reached:
            attrs = frozen.user_attrs
            self._record_job(trial, frozen.number, attrs[A_BATCH], job_id)
            self._follow(trial, dict(attrs, **{A_JOB: job_id}), set(frozen.intermediate_values))
            note = " (restored its submitit pickle)" if job_id in restored else ""
            self.say(f"trial {frozen.number}: its array reached Slurm as job {job_id}; adopted{note}")

    def _record_job(self, trial, number: int, batch: str, job_id: str) -> None:
        run_id = trial_run_id(self.spec.name, number)
        run_dir = self.runs_root / run_id
        _, cfg = self._trial_config(number, trial.params)
        job = TrialJob(number, run_id, run_dir, run_dir / "config.yaml", cfg)
        register_trial(self.ledger, job, job_id, self.spec.name, batch, self.sweep_dir / "slurm")
        self._set(trial, A_JOB, job_id)

    def _follow(self, trial, attrs: Dict[str, Any], reported: Optional[set] = None) -> None:
        run_dir = Path(attrs[A_RUN_DIR])
        self.followed[trial.number] = Followed(trial, attrs[A_RUN_ID], run_dir,
                                               RunScalars(run_dir / "tb", tags=[self.spec.tag]),
                                               reported=set(reported or ()))

    # --- submit -----------------------------------------------------------------------------------------
    def fill(self) -> None:
        """Ask for as many trials as there are free slots (within the budget) and submit them as one array."""
        free = self.spec.parallel - len(self.followed)
        total = len(self.study.get_trials(deepcopy=False))
        trials = self.unsubmitted[:free]
        self.unsubmitted = self.unsubmitted[len(trials):]
        dists = distributions(self.spec)
        while len(trials) < free and total < self.spec.trials:
            trials.append(self.study.ask(dists))
            total += 1
        if trials:
            self._submit(trials)

    def _submit(self, trials: List[Any]) -> None:
        batch = f"b{trials[0].number:03d}-{int(self.clock())}"
        jobs: List[TrialJob] = []
        for index, trial in enumerate(trials):
            run_id, cfg = self._trial_config(trial.number, trial.params)
            run_dir = self.runs_root / run_id
            for sub in ("tb", "checkpoints", "slurm"):
                (run_dir / sub).mkdir(parents=True, exist_ok=True)
            write_config(run_dir, cfg)
            jobs.append(TrialJob(trial.number, run_id, run_dir, run_dir / "config.yaml", cfg))
            # One attribute per storage write; A_INTENT goes last and marks the intent complete (adopt).
            for key, value in ((A_RUN_ID, run_id), (A_RUN_DIR, str(run_dir)), (A_BATCH, batch), (A_INDEX, index),
                               (A_SIZE, len(trials)), (A_INTENT, self.clock())):
                self._set(trial, key, value)
        crash_point("sweep_after_intent")  # tests: the intent is recorded, sbatch never ran
        try:
            job_ids = self.submit(jobs, self.spec.name, batch, self.spec.parallel, self.sweep_dir / "slurm")
        except Exception as exc:  # noqa: BLE001 - submitit raises plain exceptions carrying sbatch's stderr
            # The trials keep their intent: the next driver finds no array by that name and submits them again.
            raise SlurmError(f"sbatch refused the array for trials {[j.number for j in jobs]}: {exc}") from exc
        release_array(self.slurm, job_ids)  # submitted held: submitit has now put every pickle in place
        crash_point("sweep_after_submit")  # tests: the array is in Slurm, its job ids recorded nowhere
        for trial, job, job_id in zip(trials, jobs, job_ids):
            register_trial(self.ledger, job, job_id, self.spec.name, batch, self.sweep_dir / "slurm")
            self._set(trial, A_JOB, job_id)
            self._follow(trial, {A_RUN_ID: job.run_id, A_RUN_DIR: str(job.run_dir)})
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
            outcome = trial_outcome(run.phase if run else None, state, pruned)
            if outcome is None and f.trial.should_prune():
                # Checked only while the run is unfinished: a trial that already completed is told as
                # complete (its full result is there), pruning exists to stop work, not to discard it.
                self._prune(f, max(f.reported) if f.reported else 0)
                outcome = "pruned"
            if outcome is None:
                if state and state not in ("PENDING", "RUNNING", "REQUEUED", "COMPLETING") and not f.warned:
                    f.warned = True
                    self.say(f"trial {number}: job {sub.job_id} ended {state}; waiting for the watcher's decision "
                             "(is python -m hpc_agent.watch running on this runs root?)")
                continue
            self._tell(f, outcome)

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
        next driver still tells as PRUNED, and a watcher that never mistakes the cancel for a failure."""
        self._set(f.trial, A_PRUNED, step)
        self.ledger.set_phase(f.run_id, "stopped")
        ids = [s.job_id for s in self.ledger.submissions(f.run_id) if s.job_id]
        try:
            self.slurm.run(["scancel", *ids], check=False)
        except SlurmError as exc:
            self.say(f"trial {f.trial.number}: scancel failed ({exc}); the job runs to its end")
        with open(f.run_dir / "events.jsonl", "a") as handle:
            handle.write(json.dumps({"time": _dt.datetime.fromtimestamp(self.clock()).isoformat(timespec="seconds"),
                                     "run_id": f.run_id, "action": "pruned", "step": step,
                                     "reason": f"{self.spec.pruner.kind} pruner"}) + "\n")
        self.say(f"trial {f.trial.number}: pruned at step {step} ({self.spec.pruner.kind} pruner); job(s) "
                 f"{', '.join(ids)} cancelled")

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
            reason = "the watcher stopped the run (see its events.jsonl)"
        self._set(f.trial, A_FAIL, reason)
        self.study.tell(f.trial, state=optuna.trial.TrialState.FAIL)
        self.say(f"trial {f.trial.number}: failed: {reason}")

    # --- the loop ---------------------------------------------------------------------------------------
    def finished(self) -> bool:
        return not self.followed and not self.unsubmitted and len(self.study.get_trials(deepcopy=False)) >= self.spec.trials

    def run(self, poll_s: float = 2.0, stop: Callable[[], bool] = lambda: False) -> None:
        self.adopt()
        while not stop():
            self.poll()
            self.fill()
            if self.finished():
                break
            time.sleep(poll_s)

"""Start-up of the sweep driver: adopt what a killed driver left (``SweepDriver.adopt``).

A restarted driver adopts the study's RUNNING trials instead of asking new ones. Each kill point leaves
a state it recognises: a trial asked but cut short inside ``ask`` (params completed, then submitted), one
whose intent is incomplete or whose array never reached Slurm (submitted again), one whose held array is
in Slurm without recorded job ids (found by name, pickles restored, released, registered), one with a job
id (followed). The ledger registration is one transaction. Any other held task of the sweep still queued
is released (a running trial records it) or cancelled (none does), one line each: :func:`settle_held`.

These functions work on an :class:`Adopter`: the small public interface of the sweep driver they need (its
study, Slurm and ledger, and the trials it follows), which ``hpc_agent.sweep.driver.SweepDriver`` implements; the
driver's ``adopt`` and ``settle_held`` methods call them. This module never imports the driver.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Protocol, Sequence, Tuple

from hpc_agent.core import rundir
from hpc_agent.slurm.cli import SlurmError
from hpc_agent.state import audit
from hpc_agent.state.journal import Journal
from hpc_agent.sweep.batch import (TrialJob, find_array, held_arrays, register_trial, release_array, restore_pickles,
                                   task_job_id)
from hpc_agent.sweep.spec import distributions, trial_run_id
from hpc_agent.sweep.trial_attrs import A_BATCH, A_INDEX, A_INTENT, A_JOB, A_RUN_DIR, A_RUN_ID, A_SIZE


class Adopter(Protocol):
    """What adoption needs of the sweep driver."""

    study: Any
    spec: Any  # SweepSpec
    slurm: Any
    ledger: Any
    sweep_dir: Path
    runs_root: Path
    unsubmitted: List[Any]
    """Asked trials whose array never reached Slurm: the driver submits them next."""

    def say(self, text: str) -> None: ...

    def halt_if_paused(self, before: str) -> None:
        """The kill switch, checked right before each action (raises ``killswitch.Paused``)."""

    def settle_held(self, adopting: Sequence[str] = ()) -> None: ...

    def trial_obj(self, frozen: Any) -> Any:
        """A stored trial as one that can report and be told."""

    def follow(self, trial: Any, attrs: Dict[str, Any], reported: Optional[set] = None) -> None:
        """Follow ``trial``'s run from now on (``attrs``: its user attributes)."""

    def trial_config(self, number: int, params: Dict[str, Any]) -> Tuple[str, Any]:
        """The run id and the config of trial ``number`` with ``params``."""

    def set_attr(self, trial: Any, key: str, value: Any) -> None:
        """Record a user attribute on the trial (its durable record)."""


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


def adopt(driver: "Adopter") -> None:
    """Follow, submit again or register each RUNNING trial of the study, by the state its kill point left."""
    import optuna

    running = driver.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    reached = []  # (trial, frozen trial, job id): in Slurm, its job id recorded nowhere yet
    for frozen in running:
        attrs = frozen.user_attrs
        trial = driver.trial_obj(frozen)
        if A_JOB in attrs:
            driver.follow(trial, attrs, set(frozen.intermediate_values))
            driver.say(f"trial {frozen.number}: adopted run {attrs[A_RUN_ID]} (job {attrs[A_JOB]})")
            continue
        # A_INTENT is the last attribute written before sbatch: without it, sbatch never ran.
        if A_INTENT in attrs:
            found = find_array(driver.slurm, driver.spec.name, attrs[A_BATCH], attrs[A_INTENT])
            if found is None:
                raise SlurmError("Slurm does not answer; cannot tell whether an interrupted submission "
                                 "reached it. Run the sweep again when squeue/sacct work.")
            job_id = task_job_id(found, attrs[A_INDEX], attrs[A_SIZE])
            if job_id is not None:
                reached.append((trial, frozen, job_id))
                continue
        completed = complete_params(trial, distributions(driver.spec))
        if completed:
            driver.say(f"trial {frozen.number}: was cut short while being asked; sampled {', '.join(completed)}")
        driver.say(f"trial {frozen.number}: was asked but never reached Slurm; submitting it now")
        driver.unsubmitted.append(trial)
    driver.settle_held(adopting=[job_id for _, _, job_id in reached])
    if not reached:
        return
    # The array is held (batch.py): every task's pickle in place first, then release, then register.
    driver.halt_if_paused(f"releasing the held array task(s) {[job_id for _, _, job_id in reached]}")
    restored = restore_pickles(rundir.slurm_dir(driver.sweep_dir), {job_id: Path(f.user_attrs[A_RUN_DIR])
                                                                    for _, f, job_id in reached})
    release_array(driver.slurm, [job_id for _, _, job_id in reached])
    for trial, frozen, job_id in reached:
        attrs = frozen.user_attrs
        record_job(driver, trial, frozen.number, attrs[A_BATCH], job_id)
        driver.follow(trial, dict(attrs, **{A_JOB: job_id}), set(frozen.intermediate_values))
        note = " (restored its submitit pickle)" if job_id in restored else ""
        driver.say(f"trial {frozen.number}: its array reached Slurm as job {job_id}; adopted{note}")


def record_job(driver: "Adopter", trial, number: int, batch: str, job_id: str) -> None:
    """Register an adopted trial's job in the ledger, then record its job id on the trial."""
    run_id = trial_run_id(driver.spec.name, number)
    run_dir = driver.runs_root / run_id
    _, cfg = driver.trial_config(number, trial.params)
    job = TrialJob(number, run_id, run_dir, rundir.config_path(run_dir), cfg)
    register_trial(driver.ledger, job, job_id, driver.spec.name, batch, rundir.slurm_dir(driver.sweep_dir))
    driver.set_attr(trial, A_JOB, job_id)


def settle_held(driver: "Adopter", adopting: Sequence[str] = ()) -> None:
    """Release or cancel every held task of this sweep's arrays still in the queue (start-up, from ``adopt``).

    Arrays are submitted held and released once submitit returns (batch.py), so a driver killed in
    between leaves a held array. A held task that a running trial of the study records is released; one
    in ``adopting`` (a running trial's intent that ``adopt`` just mapped to it) is left to ``adopt``,
    which restores its pickle first, then releases it. Any other one would run a trial that nobody
    follows (or, once that trial is submitted again, run it twice): it is cancelled. One line each."""
    import optuna

    held = held_arrays(driver.slurm, driver.spec.name)
    if held is None:
        driver.say("squeue failed: cannot look for held arrays of this sweep now; run the sweep again later")
        return
    owned: Dict[str, int] = {}
    for t in driver.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        if t.user_attrs.get(A_JOB):
            owned[str(t.user_attrs[A_JOB])] = t.number
    for job_id, batch in sorted(held.items()):
        if job_id in adopting:
            continue
        if job_id in owned:
            driver.halt_if_paused(f"releasing held job {job_id}")
            result = driver.slurm.run(["scontrol", "release", job_id], check=False)
            verb, why = "released", f"it runs trial {owned[job_id]} of the study"
        else:
            driver.halt_if_paused(f"cancelling held job {job_id}")
            result = driver.slurm.run(["scancel", job_id], check=False)
            verb, why = "cancelled", "no running trial of the study records it"
        failed = (getattr(result, "stderr", "") or "").strip() if getattr(result, "returncode", 0) != 0 else None
        if failed is not None:
            driver.say(f"held job {job_id} (batch {batch}): {why}, but it could not be {verb}: {failed}")
        else:
            driver.say(f"held job {job_id} (batch {batch}): {verb}; {why}")
        # A held job no trial owns has no run: its record goes under the sweep's own id (ledger only).
        run_id = trial_run_id(driver.spec.name, owned[job_id]) if job_id in owned else sweep_audit_id(driver.spec.name)
        audit.record_action(Journal(driver.ledger), run_id, "release" if job_id in owned else "cancel", job_id,
                            f"held job of batch {batch}: {why}", process="sweep",
                            result=verb if failed is None else f"not {verb}: {failed}")


def sweep_audit_id(sweep: str) -> str:
    """The audit trail's key for a sweep's own actions that belong to no trial run (kept in the ledger only)."""
    return f"sweep:{sweep}"

"""Submitting sweep trials as one submitit job array, and finding an array again after a crash.

Naming (why it is not ``hpc_agent:<run_id>``): every task of a Slurm array shares one job name, so a
trial cannot carry its run id in the name. Each array is named ``hpc_agent:sweep:<sweep>:<batch>``
instead, and the trial's place in it (batch, index) is written to the Optuna trial's user attributes
*before* sbatch runs. That record is the trial's intent: a driver restarted after a crash between sbatch
and recording the job ids asks Slurm for the array by name and maps index i to task ``<array>_<i>``
(submitit submits a batch's jobs in order, one array index each). Only once the job id is known does
the trial enter the runs ledger (run, intent, job id in one go), so the watcher never sees a trial
intent without a job id, and its by-name reconciliation (which looks for ``hpc_agent:<run_id>``) can
never resubmit a trial that is in fact queued as an array task. From then on the watcher follows the
trial like any run: array task ids (``123_4``) work with sacct -D, squeue, scontrol requeue/update.

Held until complete: submitit pickles each task to a temporary ``<uuid>.pkl``, runs sbatch, and only then
renames it ``<job id>_submitted.pkl``, the file a task waits 60 s for before it fails. A driver killed
in between would leave an array in Slurm that can only fail. So the array is submitted with ``--hold``
and released (``scontrol release``) once submitit has returned; a restarted driver that finds a held
array by name first gives any left-over temporary pickle its job's name (``restore_pickles``), then
releases it. Nothing of a trial runs before everything it needs is in place, however late the restart.
Any other held task of the sweep (``held_arrays``: one squeue for the whole sweep) is released if a running
trial records it and cancelled if none does (``SweepDriver.settle_held``): nothing stays held for ever.

Logs: the array writes every task's log into one folder (``<sweep dir>/slurm``). Diagnose and the
watcher look in ``<run dir>/slurm/<job id>_<rank>_log.out``, so each task's log file is hard-linked
there (created empty in append mode first, which never truncates what the job may already have
written; the jobs open their logs in append mode too).
"""
from __future__ import annotations

import datetime as _dt
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence

from hpc_agent.config.schema import Config
from hpc_agent.core import rundir
from hpc_agent.core.fsutil import atomic_write_json
from hpc_agent.jobs.executor import activation_lines, fill, load_template, render_args, slurm_parameters
from hpc_agent.slurm.cli import SlurmError
from hpc_agent.slurm.job_match import JOB_NAME_PREFIX
from hpc_agent.slurm.queries import own_jobs
from hpc_agent.slurm.sacct import parse_sacct
from hpc_agent.state import audit
from hpc_agent.state.journal import Journal

TRIAL_ENV = {"run_dir": "HPC_AGENT_TRIAL_RUN_DIR", "run_id": "HPC_AGENT_TRIAL_RUN_ID",
             "config": "HPC_AGENT_TRIAL_CONFIG"}


@dataclass(frozen=True)
class TrialJob:
    """One trial's place in an array submission."""

    number: int
    run_id: str
    run_dir: Path
    config_path: Path
    cfg: Config


def array_name(sweep: str, batch: str) -> str:
    return f"{JOB_NAME_PREFIX}sweep:{sweep}:{batch}"


def task_job_id(array_ids: Sequence[str], index: int, size: int) -> Optional[str]:
    """The job id of task ``index`` among what Slurm lists under an array's name.

    A batch of one is submitted by submitit as a plain job (``123``), a larger one as an array
    (``123_0`` ..). Pending tasks may still be listed together (``123_[2-3]``): their id is still
    ``<array>_<index>``."""
    if size == 1:
        plain = [j for j in array_ids if "_" not in j]
        return plain[-1] if plain else None
    for job_id in array_ids:
        base, _, task = job_id.partition("_")
        if task == str(index):
            return job_id
        if task.startswith("[") and _in_range(task, index):
            return f"{base}_{index}"
    return None


def _in_range(spec: str, index: int) -> bool:
    """``[0-3%2]`` / ``[1,4-5]`` contains ``index``?"""
    for part in spec.strip("[]").split("%")[0].split(","):
        lo, _, hi = part.partition("-")
        if lo.isdigit() and (int(lo) <= index <= int(hi or lo) if (hi or lo).isdigit() else False):
            return True
    return False


def array_setup(lines: Sequence[str], jobs: Sequence[TrialJob]) -> List[str]:
    """The template's setup/srun lines for an array: the per-run placeholders become shell variables
    that a ``case`` on ``$SLURM_ARRAY_TASK_ID`` sets per task (the template renders them per run)."""
    import shlex

    from hpc_agent.core.paths import code_root

    # One pass (jobs.executor.fill): a value put in is never scanned for placeholders again.
    shell_words = {key: f'"${{{var}}}"' for key, var in TRIAL_ENV.items()}
    out = [fill(line, dict(shell_words, repo=shlex.quote(str(code_root())))) for line in lines]
    if len(jobs) == 1:
        only = jobs[0]
        head = [f"{TRIAL_ENV['run_dir']}={shlex.quote(str(only.run_dir))}",
                f"{TRIAL_ENV['run_id']}={shlex.quote(only.run_id)}",
                f"{TRIAL_ENV['config']}={shlex.quote(str(only.config_path))}"]
        return head + out
    cases = " ".join(
        f"{i}) {TRIAL_ENV['run_dir']}={shlex.quote(str(j.run_dir))}; {TRIAL_ENV['run_id']}={shlex.quote(j.run_id)}; "
        f"{TRIAL_ENV['config']}={shlex.quote(str(j.config_path))};;" for i, j in enumerate(jobs))
    return [f'case "${{SLURM_ARRAY_TASK_ID:-0}}" in {cases} esac'] + out


def array_parameters(jobs: Sequence[TrialJob], sweep: str, batch: str, parallel: int) -> Dict:
    """submitit parameters for the array: the first trial's slurm section (a sweep never varies slurm.*)."""
    from hpc_agent.core.paths import code_root

    first = jobs[0]
    if first.cfg.container.runtime != "none":  # each trial would need its own mounts: not supported yet
        from hpc_agent.config.problems import ConfigError, Problem
        raise ConfigError([Problem("container.runtime", first.cfg.container.runtime, "none for a sweep "
                                   "(sweeps do not run in containers yet; docs/containers.md)")])
    template = load_template(first.cfg.slurm.template)
    params = slurm_parameters(first.cfg, first.run_id, first.run_dir, first.config_path, template)
    # The profile's activation lines after the template's exports, as in a single run's script (jobs.executor).
    params["setup"] = array_setup(template.setup, jobs) + activation_lines(first.cfg)
    # submitit quotes each srun option as one word, so a per-task shell variable cannot reach it: only {repo}.
    params["srun_args"] = render_args(template.srun_args, {"repo": str(code_root())})
    params["job_name"] = array_name(sweep, batch)
    params["comment"] = f"hpc_agent sweep={sweep} batch={batch}"
    params["array_parallelism"] = parallel
    # Held until the driver has seen submitit finish (see the module docstring); released by release_array.
    params["additional_parameters"] = dict(params.get("additional_parameters") or {}, hold=True)
    return params


def submit_array(jobs: Sequence[TrialJob], sweep: str, batch: str, parallel: int, folder: Path) -> List[str]:
    """sbatch one array (or a plain job for a batch of one); returns the job ids in trial order."""
    from hpc_agent.jobs.containers import job_python
    from hpc_agent.slurm.submitit_timeout import TimedSlurmExecutor  # submitit's, with sbatch bounded
    from hpc_agent.jobs.submission import training_job

    executor = TimedSlurmExecutor(folder=folder, python=job_python(jobs[0].cfg, {}))  # slurm.python, else this one
    executor.update_parameters(**array_parameters(jobs, sweep, batch, parallel))
    with executor.batch():
        handles = [executor.submit(training_job(j.run_dir, j.config_path)) for j in jobs]
    return [h.job_id for h in handles]


def release_array(slurm, job_ids: Sequence[str]) -> None:
    """Let a held array (or plain job) start. Idempotent, as adoption may repeat it: Slurm answers 0 for
    tasks already released or running, and "already finished" for an array that ran; both are fine."""
    for base in sorted({job_id.split("_")[0] for job_id in job_ids}):
        result = slurm.run(["scontrol", "release", base], check=False)
        if result.returncode != 0 and "already finished" not in (result.stderr or ""):
            raise SlurmError(f"scontrol release {base} failed ({result.returncode}): {(result.stderr or '').strip()}"
                             " -- the array stays held; run the sweep again to release it")


_TEMP_PICKLE = re.compile(r"[0-9a-f]{32}\.pkl")  # submitit's name for a pickle not yet given its job id
# The only globals our task pickles name (DelayedSubmission around the TrainingJob submitit runs): a file
# naming any other (os.system, builtins.open ...) is not ours, whatever strings it carries.
_TASK_GLOBALS = frozenset({("submitit.core.utils", "DelayedSubmission"), ("launch.job", "TrainingJob")})


def temp_pickle_run_dir(path: Path, run_dirs: Sequence[str]) -> Optional[str]:
    """Which of ``run_dirs`` the temporary task pickle at ``path`` is for, read from its opcodes (never
    unpickled: the folder is job-writable, see ``hpc_agent.core.pickle_scan``). None for a torn, foreign or
    ambiguous file, a link or a FIFO."""
    from hpc_agent.core.pickle_scan import scan

    try:
        text = scan(path)
    except (OSError, ValueError):
        return None
    if set(text.globals) != _TASK_GLOBALS:
        return None
    found = set(text.strings) & set(run_dirs)
    return found.pop() if len(found) == 1 else None


def restore_pickles(folder: Path, run_dirs: Mapping[str, Path]) -> List[str]:
    """Finish submitit's rename for tasks whose driver died between sbatch and that rename: find the
    temporary pickle of each task's trial (by the run dir of the ``TrainingJob`` inside, read from the
    pickle's opcodes) and give it the name the task reads. ``run_dirs``: job id -> run dir. Returns the
    job ids whose pickle was restored. Nothing in the folder is ever unpickled here."""
    from submitit.core.utils import JobPaths

    missing = {job_id: str(run_dir) for job_id, run_dir in run_dirs.items()
               if not os.path.lexists(JobPaths(folder, job_id=job_id).submitted_pickle)}
    if not missing:
        return []
    temporary: Dict[str, Path] = {}
    # Oldest first: a trial pickled again by a later batch keeps its newest pickle (the same job anyway).
    for path in sorted((p for p in folder.glob("*.pkl") if _TEMP_PICKLE.fullmatch(p.name)),
                       key=lambda p: p.lstat().st_mtime):
        run_dir = temp_pickle_run_dir(path, list(missing.values()))
        if run_dir is not None:
            temporary[run_dir] = path
    restored = []
    for job_id, run_dir in missing.items():
        if run_dir in temporary:
            os.replace(temporary.pop(run_dir), JobPaths(folder, job_id=job_id).submitted_pickle)
            restored.append(job_id)
    return restored


def find_array(slurm, sweep: str, batch: str, since: float) -> Optional[List[str]]:
    """Job ids of this user's jobs Slurm lists under an array's name (squeue and sacct); None if Slurm does
    not answer."""
    name = array_name(sweep, batch)
    start = _dt.datetime.fromtimestamp(since - 60).strftime("%Y-%m-%dT%H:%M:%S")
    try:
        queued = slurm.run(["squeue", "--noheader", "--array", *own_jobs(), "--name", name,
                            "--format", "%i"]).stdout.split()
        text = slurm.run(["sacct", "--parsable2", "--allocations", *own_jobs(), "--name", name,
                          "--starttime", start, "--format", "JobID,JobName,State"]).stdout
    except SlurmError:
        return None
    return sorted(set(queued) | {row.job_id for row in parse_sacct(text)})


HELD_REASONS = ("JobHeldUser",)  # squeue's %r for a job submitted with --hold (and not yet released)


def held_arrays(slurm, sweep: str) -> Optional[Dict[str, str]]:
    """This user's held jobs named for this sweep, one per array task (``123_4``; a plain ``123`` for a batch
    of one): job id -> batch. None if squeue fails.

    One squeue for the whole sweep: the name is matched by its prefix ``hpc_agent:sweep:<sweep>:``, which
    the ``--name`` filter cannot do."""
    prefix = array_name(sweep, "")
    try:
        text = slurm.run(["squeue", "--noheader", "--array", *own_jobs(), "--states", "PENDING",
                          "--format", "%i|%r|%j"]).stdout
    except SlurmError:
        return None
    held: Dict[str, str] = {}
    for line in text.splitlines():
        parts = line.strip().split("|", 2)  # the name last: it is the one field that may hold a "|"
        if len(parts) == 3 and parts[1] in HELD_REASONS and parts[2].startswith(prefix):
            held[parts[0]] = parts[2][len(prefix):]
    return held


def link_logs(sweep_slurm: Path, run_dir: Path, job_id: str, ranks: int) -> None:
    """Make the array task's logs appear under the trial's run dir (see the module docstring)."""
    rundir.slurm_dir(run_dir).mkdir(parents=True, exist_ok=True)
    for link in rundir.log_paths(run_dir, job_id, ranks):
        target = sweep_slurm / link.name
        if link.exists() or link.is_symlink():
            continue
        with open(target, "a"):
            pass  # append mode: never truncates a log the running job already writes
        try:
            os.link(target, link)
        except OSError:  # another file system: a symlink still lets diagnose read it
            link.symlink_to(target)


def register_trial(ledger, job: TrialJob, job_id: str, sweep: str, batch: str, sweep_slurm: Path) -> None:
    """Enter a submitted trial in the runs ledger and its run.json (idempotent: adoption may repeat it)."""
    from hpc_agent.state.lifecycle import Event, EventKind, Phase
    from hpc_agent.core.rundir import read_run_json
    from hpc_agent.jobs.submission import update_run_json

    # One transaction: a driver killed half-way must not leave a submission row without its job id, which
    # the watcher would "reconcile" by name (hpc_agent:<run id>), not find, and submit a second time.
    with ledger.transaction():
        if ledger.run(job.run_id) is None:
            ledger.add_run(job.run_id, job.cfg.run.name, str(job.run_dir))
        if job_id not in {s.job_id for s in ledger.submissions(job.run_id)}:
            from hpc_agent.state import run_config

            run_config.record(ledger, job.run_id, job.cfg, f"sweep {sweep} trial {job.number}")
            sub = ledger.record_intent(job.run_id, "slurm", str(job.config_path),
                                       reason=f"sweep {sweep} trial {job.number}")
            ledger.record_submitted(sub, job_id)
            # With the submission row: written once however often adoption repeats this.
            audit.record_action(Journal(ledger), job.run_id, "submit", job_id, f"sweep {sweep} trial {job.number} "
                                f"(array {array_name(sweep, batch)})", process="sweep", result="submitted")
        # Adoption may run this again: only a run still waiting for its job id moves on (never a trial the
        # watcher has since seen run, requeued or stopped).
        if ledger.run(job.run_id).phase == Phase.SUBMITTING.value:
            ledger.advance(job.run_id, Event(EventKind.SUBMITTED, job_id))
    ranks = job.cfg.slurm.tasks_per_node * job.cfg.slurm.nodes
    link_logs(sweep_slurm, job.run_dir, job_id, ranks)
    # Two writes, each redone on adoption until it is there (a kill between them must not leave the
    # trial's run.json naming the plain-run job name, nor list the job id twice).
    if job_id not in read_run_json(job.run_dir).get("job_ids", []):
        update_run_json(job.run_dir, job.run_id, "slurm", job_id, job.config_path, job.cfg)
    info = read_run_json(job.run_dir)
    sweep_info = {"job_name": array_name(sweep, batch), "sweep": sweep, "trial": job.number}
    if any(info.get(k) != v for k, v in sweep_info.items()):
        atomic_write_json(rundir.run_json_path(job.run_dir), dict(info, **sweep_info))

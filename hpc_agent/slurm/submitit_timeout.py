"""submitit's SlurmExecutor with a bounded ``sbatch``.

submitit (1.5) runs ``sbatch`` through ``utils.CommandFunction``: a ``Popen`` read to EOF with no timeout,
so a hung slurmctld hangs ``submit``, the watcher's resubmission and the sweep driver for good. Here the
same submission goes through :class:`hpc_agent.slurm.cli.SlurmCLI` (the one place that runs Slurm
commands: an argv list and a timeout). Both of submitit's paths are covered: a single job
(``_submit_command``) and a job array (``_internal_process_submissions``, which in submitit builds a
plain ``SlurmExecutor`` for the array and would escape the override). The two methods follow submitit
1.5.4's own, line for line, apart from the sbatch call (``tests/unit/test_subprocess_timeouts.py`` checks).

A timed-out sbatch may still have queued the job (slurmctld got the request, the answer was lost), so
:class:`SbatchTimedOut` must not be recorded as a refusal: the submitter leaves its intent open and the
watcher settles it by the run's job name once :data:`SBATCH_IN_FLIGHT_S` has passed (the timeout is half
of it, so no bounded sbatch can still be in flight when the watcher asks).
"""
from __future__ import annotations

import subprocess
import typing as tp
import uuid

import submitit
from submitit.core import core, utils

from hpc_agent.slurm.cli import SBATCH_IN_FLIGHT_S, SlurmCLI, SlurmError

SBATCH_TIMEOUT_S = SBATCH_IN_FLIGHT_S / 2
"""How long one ``sbatch`` may take (it answers in well under a second on a healthy cluster)."""


class SbatchTimedOut(RuntimeError):
    """sbatch did not answer in time: the job may or may not be queued (never resubmit on a guess)."""


def run_sbatch(argv: tp.List[str], timeout_s: float, cli: tp.Optional[SlurmCLI] = None) -> str:
    """sbatch's stdout; :class:`SbatchTimedOut` past ``timeout_s``; submitit's ``FailedJobError`` (what
    callers already handle) when sbatch refuses."""
    try:
        result = (cli or SlurmCLI(timeout_s=timeout_s)).run(argv, check=False, timeout_s=timeout_s)
    except SlurmError as exc:
        if isinstance(exc.__cause__, subprocess.TimeoutExpired):
            raise SbatchTimedOut(f"sbatch did not answer within {timeout_s:.0f} s (slurmctld busy or down?); the "
                                 "job may still have been queued, so it is not submitted again: the watcher "
                                 "looks for it by the run's job name") from exc
        raise utils.FailedJobError(str(exc)) from exc
    if result.returncode != 0:
        raise utils.FailedJobError(result.stderr.strip() or f"sbatch exited with {result.returncode}")
    return result.stdout.strip()


class TimedSlurmExecutor(submitit.SlurmExecutor):
    """``submitit.SlurmExecutor`` whose sbatch runs with a timeout (:data:`SBATCH_TIMEOUT_S`)."""

    sbatch_timeout_s: float = SBATCH_TIMEOUT_S

    def _submit_command(self, command: str) -> core.Job[tp.Any]:
        tmp_uuid = uuid.uuid4().hex
        submission_file_path = (
            utils.JobPaths.get_first_id_independent_folder(self.folder) / f".submission_file_{tmp_uuid}.sh"
        )
        with submission_file_path.open("w") as f:
            f.write(self._make_submission_file_text(command, tmp_uuid))
        command_list = self._make_submission_command(submission_file_path)
        output = run_sbatch(command_list, self.sbatch_timeout_s)  # the one change: bounded
        job_id = self._get_job_id_from_submission_command(output)
        tasks_ids = list(range(self._num_tasks()))
        job: core.Job[tp.Any] = self.job_class(folder=self.folder, job_id=job_id, tasks=tasks_ids)
        job.paths.move_temporary_file(submission_file_path, "submission_file", keep_as_symlink=True)
        self._write_job_id(job.job_id, tmp_uuid)
        self._set_job_permissions(job.paths.folder)
        return job

    def _internal_process_submissions(
        self, delayed_submissions: tp.List[utils.DelayedSubmission]
    ) -> tp.List[core.Job[tp.Any]]:
        if len(delayed_submissions) == 1:
            return super()._internal_process_submissions(delayed_submissions)  # -> our _submit_command
        folder = utils.JobPaths.get_first_id_independent_folder(self.folder)
        folder.mkdir(parents=True, exist_ok=True)
        timeout_min = self.parameters.get("time", 5)
        pickle_paths = []
        for d in delayed_submissions:
            pickle_path = folder / f"{uuid.uuid4().hex}.pkl"
            d.set_timeout(timeout_min, self.max_num_timeout)
            d.dump(pickle_path)
            pickle_paths.append(pickle_path)
        n = len(delayed_submissions)
        array_ex = type(self)(self.folder, self.max_num_timeout)  # submitit: SlurmExecutor(...), unbounded
        array_ex.sbatch_timeout_s = self.sbatch_timeout_s
        array_ex.update_parameters(**self.parameters)
        array_ex.parameters["map_count"] = n
        self._throttle()
        first_job: core.Job[tp.Any] = array_ex._submit_command(self._submitit_command_str)
        tasks_ids = list(range(first_job.num_tasks))
        jobs: tp.List[core.Job[tp.Any]] = [
            submitit.SlurmJob(folder=self.folder, job_id=f"{first_job.job_id}_{a}", tasks=tasks_ids)
            for a in range(n)
        ]
        for job, pickle_path in zip(jobs, pickle_paths):
            job.paths.move_temporary_file(pickle_path, "submitted_pickle")
        return jobs

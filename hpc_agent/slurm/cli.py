"""The only place that runs Slurm commands.

Every call is an argv list with a timeout (never ``shell=True``), so a config value can never be
interpreted by a shell and a hung slurmctld can never hang the caller.
"""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from typing import Iterable, List, Sequence

from hpc_agent.slurm.sacct import SACCT_FIELDS

ALLOWED = ("sbatch", "sacct", "squeue", "scontrol", "scancel", "sinfo", "srun")  # srun: doctor's bounded probe


class SlurmError(RuntimeError):
    """A Slurm command failed, timed out or is not installed."""


@dataclass(frozen=True)
class Result:
    argv: Sequence[str]
    returncode: int
    stdout: str
    stderr: str


SBATCH_IN_FLIGHT_S = 120.0
"""How long an sbatch may still be in flight after its submitter recorded the intent (submitit runs sbatch
with no timeout; sbatch answers in well under a second on a healthy cluster). A younger intent without a
job id is left alone: its submitter, or the sbatch child of a killed one, may still be submitting it."""


class SlurmCLI:
    """Runs Slurm commands. Inject a fake one in tests of code that calls it."""

    def __init__(self, timeout_s: float = 30.0):
        self.timeout_s = timeout_s

    @staticmethod
    def available() -> bool:
        return shutil.which("sbatch") is not None

    def run(self, argv: Sequence[str], check: bool = True, timeout_s: float | None = None) -> Result:
        if not argv or argv[0] not in ALLOWED:
            raise SlurmError(f"refusing to run {argv[:1]}: only {', '.join(ALLOWED)} are allowed")
        try:
            proc = subprocess.run(list(argv), capture_output=True, text=True,
                                  timeout=timeout_s or self.timeout_s, check=False)
        except FileNotFoundError as exc:
            raise SlurmError(f"{argv[0]} is not installed or not on PATH") from exc
        except subprocess.TimeoutExpired as exc:
            raise SlurmError(f"{' '.join(argv)} timed out after {exc.timeout:.0f} s") from exc
        result = Result(list(argv), proc.returncode, proc.stdout, proc.stderr)
        if check and proc.returncode != 0:
            raise SlurmError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return result

    def sacct(self, job_ids: Iterable[str], fields: Sequence[str] = SACCT_FIELDS, all_attempts: bool = True,
              as_json: bool = False) -> str:
        """One batched ``sacct --parsable2`` call for all ``job_ids`` (never one call per job); with
        ``as_json``, ``sacct --json`` (every field: ``fields`` does not apply)."""
        ids: List[str] = [str(j) for j in job_ids]
        if not ids:
            return ""
        argv = sacct_argv(ids, fields, as_json)
        if all_attempts:
            argv.insert(1, "--duplicates")  # -D: every attempt of a requeued job, not only the last
        return self.run(argv).stdout

    def signal_job(self, job_id: str, signal_name: str) -> Result:
        """``scancel --signal=NAME JOB``: the signal to every step of the job (the ranks: srun's tasks), not
        its batch script, without ending it (the watcher asks a job's ranks for their stacks this way).
        Not ``--full``: on 22.05 that signals the batch step *instead of* the job's steps (measured)."""
        return self.run(signal_argv(job_id, signal_name))

    def sacct_probe(self) -> Result:
        """The one ``sacct --json`` probe of a watcher (hpc_agent.observe.SacctSource)."""
        return self.run(JSON_PROBE, check=False)


JSON_PROBE = ["sacct", "--json", "--jobs", "1", "--starttime", "now"]
"""Asks accounting for nothing in JSON: answers whether ``--json`` works here, and the Slurm version."""


def sacct_argv(ids: Sequence[str], fields: Sequence[str], as_json: bool) -> List[str]:
    if as_json:
        return ["sacct", "--json", "--jobs", ",".join(ids)]
    return ["sacct", "--parsable2", "--format", ",".join(fields), "--jobs", ",".join(ids)]


def signal_argv(job_id: str, signal_name: str) -> List[str]:
    return ["scancel", f"--signal={signal_name}", str(job_id)]

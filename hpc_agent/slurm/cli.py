"""The only place that runs Slurm commands.

Every call is an argv list with a timeout (never ``shell=True``), so a config value can never be
interpreted by a shell and a hung slurmctld can never hang the caller.
"""
from __future__ import annotations

import logging
import os
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass
from typing import Any, Iterable, List, Optional, Sequence

from hpc_agent.slurm.sacct import SACCT_FIELDS

ALLOWED = ("sbatch", "sacct", "squeue", "scontrol", "scancel", "sinfo", "srun",  # srun: doctor's bounded probe
           "sacctmgr")  # read-only `list`: doctor --profile's account/qos check (hpc_agent/checks/profile_fit.py)
CLUSTERS_ENV = "HPC_AGENT_CLUSTERS"
"""The run-wide ``--clusters`` (Slurm's ``-M``): set by a command's ``--clusters`` flag or by the user, read
at every call, and inherited by the processes hpc_agent starts (chaos's submit and watcher, the job)."""
_CLUSTER_HEADER = "CLUSTER: "  # squeue/sinfo/scontrol under -M print "CLUSTER: name" above their output
log = logging.getLogger(__name__)


def clusters() -> Optional[str]:
    """The cluster(s) every Slurm command addresses, or None for Slurm's default."""
    return os.environ.get(CLUSTERS_ENV, "").strip() or None


def with_clusters(argv: Sequence[str], names: Optional[str]) -> List[str]:
    """``argv`` with ``--clusters=names`` right after the command (every allowed command takes it there:
    scontrol's option must precede its subcommand); unchanged without names or when argv names one itself."""
    argv = list(argv)
    if not names or any(a in ("-M", "--clusters") or a.startswith(("-M", "--clusters=")) for a in argv[1:]):
        return argv
    if argv[0] == "sacctmgr":  # it has no --clusters (it asks slurmdbd, which serves every cluster)
        return argv
    return [argv[0], f"--clusters={names}", *argv[1:]]


def strip_cluster_headers(text: str) -> str:
    """The output without the ``CLUSTER: name`` lines -M adds, so every parser reads what it reads without -M."""
    if _CLUSTER_HEADER not in text:
        return text
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith(_CLUSTER_HEADER))


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

    def __init__(self, timeout_s: float = 30.0, clusters: Optional[str] = None):
        self.timeout_s = timeout_s
        self.clusters = clusters  # None: the run-wide setting (CLUSTERS_ENV), read at each call

    @staticmethod
    def available() -> bool:
        return shutil.which("sbatch") is not None

    def run(self, argv: Sequence[str], check: bool = True, timeout_s: float | None = None) -> Result:
        if not argv or argv[0] not in ALLOWED:
            raise SlurmError(f"refusing to run {argv[:1]}: only {', '.join(ALLOWED)} are allowed")
        names = self.clusters or clusters()
        argv = with_clusters(argv, names)
        started = time.monotonic()
        try:
            proc = self._execute(argv, timeout_s or self.timeout_s)
        except FileNotFoundError as exc:
            raise SlurmError(f"{argv[0]} is not installed or not on PATH") from exc
        except subprocess.TimeoutExpired as exc:
            log.debug("%s: timed out after %.0f s", shlex.join(argv), exc.timeout)
            raise SlurmError(f"{' '.join(argv)} timed out after {exc.timeout:.0f} s") from exc
        log.debug("%s: exit %d in %.2f s", shlex.join(argv), proc.returncode, time.monotonic() - started)
        stdout = strip_cluster_headers(proc.stdout) if names else proc.stdout
        result = Result(argv, proc.returncode, stdout, proc.stderr)
        if check and proc.returncode != 0:
            raise SlurmError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return result

    @staticmethod
    def _execute(argv: List[str], timeout_s: float) -> subprocess.CompletedProcess:
        """The one subprocess call (tests replace it to record every Slurm argv of a code path)."""
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)

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
        """The one ``sacct --json`` probe of a watcher (hpc_agent.watcher.observe.SacctSource)."""
        return self.run(JSON_PROBE, check=False)


JSON_PROBE = ["sacct", "--json", "--jobs", "1", "--starttime", "now"]
"""Asks accounting for nothing in JSON: answers whether ``--json`` works here, and the Slurm version."""


def sacct_argv(ids: Sequence[str], fields: Sequence[str], as_json: bool) -> List[str]:
    if as_json:
        return ["sacct", "--json", "--jobs", ",".join(ids)]
    return ["sacct", "--parsable2", "--format", ",".join(fields), "--jobs", ",".join(ids)]


def sbatch_test_argv(slurm: Any, profile: Any = None) -> List[str]:
    """``sbatch --test-only`` with the job's real resources (submits nothing), GPUs asked for in the
    profile's style: the same option the job script carries (hpc_agent.config.profile.gpu_request). Here, below
    the CLIs, because doctor and placement (hpc_agent.slurm.partition_facts, one per partition) both ask it."""
    # Imported here: every Slurm call (the watcher's, the job's) loads this module; few need the config.
    from hpc_agent.config.profile import Profile, gpu_request

    argv = ["sbatch", "--test-only", "--job-name", "hpc-agent-doctor", "--nodes", str(slurm.nodes),
            "--ntasks-per-node", str(slurm.tasks_per_node), "--cpus-per-task", str(slurm.cpus_per_task),
            "--time", str(slurm.time)]
    for option, value in (("--partition", slurm.partition), ("--account", slurm.account), ("--qos", slurm.qos),
                          ("--mem", slurm.mem), ("--constraint", slurm.constraint), ("--exclude", slurm.exclude)):
        if value:
            argv += [option, str(value)]
    if slurm.gpus_per_node:
        option, value = gpu_request(profile or Profile(), slurm.gpus_per_node)
        argv += [f"--{option}", value]
    return argv + ["--wrap", "true"]


def signal_argv(job_id: str, signal_name: str) -> List[str]:
    return ["scancel", f"--signal={signal_name}", str(job_id)]

"""The job's interpreter and its container: which Python the job runs, and how (pure; no Slurm, no torch).

One rule picks the template (:func:`template_name`): a ``slurm.template`` other than ``default`` wins;
otherwise ``container.runtime`` pyxis or apptainer picks ``sbatch_templates/pyxis.yaml`` or
``apptainer.yaml``; otherwise ``default``.

Where each value lands (docs/containers.md):

- pyxis: ``srun --container-image={image} --container-mounts={mounts} --container-workdir={workdir}``
  (template placeholders in ``srun_args``: submitit quotes each option as one word), then the job command
  ``<container.python> -u -m submitit.core._submit FOLDER``.
- Apptainer: the job command is ``apptainer exec [--nv] --bind MOUNTS [--pwd WORKDIR] IMAGE
  <container.python> -u -m submitit.core._submit FOLDER``. submitit puts the ``python`` string it is
  given into the script unquoted, so :func:`job_python` shell-quotes every word of it exactly once.

The mounts are the run directory and, for pyxis without ``container.workdir``, the submit directory
(which Apptainer mounts by default), each at the same path, then ``container.mounts``. Both runtimes split
the list at ',' and ':', so these paths may not hold them. hpc_agent's code reaches the container inside
the run directory: ``{repo}`` is ``<run dir>/lib`` in a container job (hpc_agent/jobs/container_lib.py, which
submit fills), never the folder hpc_agent is installed in; that is the host's site-packages for a wheel
install, whose torch and DeepSpeed would shadow the image's.
"""
from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Dict, List, Mapping

from hpc_agent.config.problems import ConfigError, Problem
from hpc_agent.config.schema import Config

PLACEHOLDERS = ("image", "mounts", "workdir")
RUNTIME_TEMPLATES = {"pyxis": "pyxis", "apptainer": "apptainer"}
SUBMIT_MODULE = ["-u", "-m", "submitit.core._submit"]


def template_name(cfg: Config) -> str:
    """The one rule for the template (module docstring)."""
    if cfg.slurm.template != "default" or cfg.container.runtime == "none":
        return cfg.slurm.template
    return RUNTIME_TEMPLATES[cfg.container.runtime]


def in_container(cfg: Config) -> bool:
    return cfg.container.runtime != "none"


def mounts(cfg: Config, values: Mapping[str, str], cwd: str) -> List[str]:
    """The mount list (module docstring); ConfigError when a path we mount holds ',' or ':'."""
    own = [("run.runs_root", values["run_dir"])]  # holds lib/ (hpc_agent's code) and code/ (the snapshot)
    config_dir = str(Path(values["config"]).parent)
    if not (config_dir + "/").startswith(values["run_dir"].rstrip("/") + "/"):
        own.append(("run.runs_root", config_dir))  # the config snapshot lives outside the run dir
    if cfg.container.runtime == "pyxis" and not cfg.container.workdir:
        own.append(("the directory you submit from (or set container.workdir)", cwd))
    problems = [Problem(key, path, "a path without ',' or ':' for a container job (the runtimes split their "
                                   "mount lists there)") for key, path in own if "," in path or ":" in path]
    if problems:
        raise ConfigError(problems)
    given = [str(m) if ":" in str(m) else f"{m}:{m}" for m in cfg.container.mounts or []]
    return list(dict.fromkeys([f"{path}:{path}" for _, path in own] + given))  # SRC:DST, read alike by both


def container_values(cfg: Config, values: Mapping[str, str], cwd: str | None = None) -> Dict[str, str]:
    """The ``{image}``, ``{mounts}`` and ``{workdir}`` placeholder values, and ``{repo}`` pointed at the run's
    ``lib/`` (none outside a container, so a template that uses the first three without one is an error
    naming the placeholder)."""
    if not in_container(cfg):
        return {}
    from hpc_agent.core.rundir import lib_dir

    if cwd is None:
        # The first submit's directory, kept in run.json: the watcher resubmits from wherever it runs.
        from hpc_agent.core.rundir import submit_workdir

        cwd = submit_workdir(Path(values["run_dir"])) if values.get("run_dir") else os.getcwd()
    c = cfg.container
    return {"image": str(c.image), "mounts": ",".join(mounts(cfg, values, cwd)), "workdir": str(c.workdir or cwd),
            "repo": str(lib_dir(Path(values["run_dir"])))}


def job_python(cfg: Config, values: Mapping[str, str], cwd: str | None = None) -> str:
    """The ``python`` string for submitit's executor: every word shell-quoted exactly once (submitit
    inserts it unquoted before ``-u -m submitit.core._submit FOLDER``)."""
    c = cfg.container
    if c.runtime == "apptainer":
        cvalues = container_values(cfg, values, cwd)
        words = ["apptainer", "exec"] + (["--nv"] if cfg.slurm.gpus_per_node else [])
        words += ["--bind", cvalues["mounts"]] + (["--pwd", str(c.workdir)] if c.workdir else [])
        return " ".join(shlex.quote(w) for w in words + [str(c.image), str(c.python)])  # image: no leading -
    if c.runtime == "pyxis":
        return shlex.quote(str(c.python))
    return shlex.quote(str(cfg.slurm.python or sys.executable))


def check_srun_args(cfg: Config, name: str, srun_args: List[str]) -> None:
    """pyxis runs the step in the image only if the template passes it: a template without it is an error."""
    if cfg.container.runtime == "pyxis" and f"--container-image={cfg.container.image}" not in srun_args:
        raise ConfigError([Problem("slurm.template", name, "a template whose srun_args pass the image for "
                                   "container.runtime=pyxis: --container-image={image} (see sbatch_templates/pyxis.yaml)")])


def local_problem(cfg: Config) -> None:
    """The local executor runs the job as a plain process: no srun, so no container."""
    if in_container(cfg):
        raise ConfigError([Problem("container.runtime", cfg.container.runtime, "none with the local executor "
                                   "(a container job needs Slurm: use --executor slurm)")])

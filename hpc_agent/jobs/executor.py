"""Turn a validated config into a submitit executor and a job script.

The pure half (run ids, template rendering, executor parameters) is separated from the half that
creates executors and submits, so the job script can be golden-tested without Slurm.
"""
from __future__ import annotations

import datetime as _dt
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence

from hpc_agent.config.fields import NAME, path_problem
from hpc_agent.config.notify import sbatch_options
from hpc_agent.config.problems import ConfigError, Problem
from hpc_agent.config.profile import gpu_request
from hpc_agent.config.schema import Config
from hpc_agent.config.yaml_safe import load_mapping
from hpc_agent.core import rundir
from hpc_agent.core.handback import batch_setup_lines, batch_teardown_lines
from hpc_agent.core.paths import code_root, find_template, template_dirs
from hpc_agent.core.shell_syntax import bash_syntax_problem
from hpc_agent.jobs import code_snapshot, containers
from hpc_agent.slurm.job_match import comment_for, job_name_for
from hpc_agent.slurm.timelimit import slurm_time_to_minutes

EXECUTORS = ("auto", "slurm", "local")


def make_run_id(name: str, now: _dt.datetime) -> str:
    return f"{name}-{now.strftime('%Y%m%d-%H%M%S')}"


@dataclass(frozen=True)
class Template:
    setup: List[str]
    srun_args: List[str]


PLACEHOLDERS = ("run_dir", "run_id", "config", "repo") + containers.PLACEHOLDERS  # the last only in a container
_PLACEHOLDER = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")


def load_template(name: str, near: Sequence[Path | str] = ()) -> Template:
    """The template ``name``: a project's own ``sbatch_templates/`` (next to a config file in ``near``, or
    in the current directory) before the shipped one; ``hpc_agent.core.paths.template_dirs`` has the order."""
    path = find_template(name, near)
    if path is None:
        folders = [d for d in template_dirs(near) if d.is_dir()]
        known = ", ".join(sorted({p.stem for d in folders for p in d.glob("*.yaml")}))
        raise ConfigError([Problem("slurm.template", name, f"a template in {' or '.join(map(str, folders))}: {known}")])
    data = load_mapping(path, "an sbatch template: a mapping with setup and srun_args lists")
    template = Template(setup=[str(x) for x in data.get("setup", [])],
                        srun_args=[str(x) for x in data.get("srun_args", [])])
    problems = [Problem("slurm.template", f"{name}: {line}", why)
                for line in template.setup if (why := placeholder_context_problem(line))]
    if problems:
        raise ConfigError(problems)
    return template


def placeholder_context_problem(line: str) -> str | None:
    """A setup line's placeholders must stand where bash reads the quoted value as one plain word: not
    inside quotes (inside ``"..."`` the value's own quotes are literal and ``$(..)`` in it would run),
    not after ``$`` (``$'..'`` reads backslash escapes) or a backslash."""
    quote, escaped, starts = "", False, {m.start(): m.group(0) for m in _PLACEHOLDER.finditer(line)}
    for i, ch in enumerate(line):
        if i in starts and (quote or escaped or line[i - 1:i] == "$"):
            where = "inside quotes" if quote else "right after '$' or a backslash"
            return f"setup lines with {starts[i]} outside any quotes (it is {where}; hpc_agent quotes the value itself)"
        if escaped:
            escaped = False
        elif ch == "\\" and quote != "'":
            escaped = True
        elif ch in "'\"" and quote in ("", ch):
            quote = "" if quote else ch
    return None


def fill(text: str, replacements: Mapping[str, str]) -> str:
    """Replace every ``{name}`` of PLACEHOLDERS in ONE pass over ``text``: what goes in is never scanned
    again, so a value that itself holds ``{config}`` stays literal. Other braces (``${SLURM_CPUS_PER_TASK:-1}``)
    are left alone for the shell. A placeholder that has no replacement here is a template error."""
    def replace(match: "re.Match[str]") -> str:
        if match.group(1) not in replacements:
            raise ConfigError([Problem("slurm.template", text, f"placeholders from {sorted(replacements)} only "
                                       f"here ({match.group(0)} cannot be filled in this line)")])
        return replacements[match.group(1)]
    return _PLACEHOLDER.sub(replace, text)


def render_lines(lines: List[str], values: Mapping[str, str]) -> List[str]:
    """Setup lines are bash: each value goes in shell-quoted, exactly once."""
    quoted = {key: shlex.quote(str(value)) for key, value in values.items()}
    return [fill(line, quoted) for line in lines]


def render_args(args: List[str], values: Mapping[str, str]) -> List[str]:
    """srun options are argv words that submitit shell-quotes itself: the values go in unquoted, so that
    they too are quoted exactly once."""
    plain = {key: str(value) for key, value in values.items()}
    return [fill(arg, plain) for arg in args]


def template_values(run_id: str, run_dir: Path, config_path: Path) -> Dict[str, str]:
    """The placeholder values, each checked for where it lands: the run dir reaches ``#SBATCH --output``
    (read by sbatch), the config and code paths only bash lines. Raises ConfigError naming what to change."""
    values = {"run_dir": str(run_dir), "run_id": run_id, "config": str(config_path), "repo": str(code_root())}
    checks = [("run.runs_root", values["run_dir"], path_problem(values["run_dir"], sbatch=True, reserve=64)),
              ("run.runs_root", values["config"], path_problem(values["config"], sbatch=False)),
              ("run.name", run_id, NAME.problem(run_id)),
              ("hpc_agent install folder", values["repo"], path_problem(values["repo"], sbatch=False))]
    problems = [Problem(key, value, why) for key, value, why in checks if why]
    if problems:
        raise ConfigError(problems)
    return values


def slurm_parameters(cfg: Config, run_id: str, run_dir: Path, config_path: Path,
                     template: Template) -> Dict[str, Any]:
    """Keyword arguments for ``submitit.SlurmExecutor.update_parameters``."""
    s = cfg.slurm
    values = template_values(run_id, run_dir, config_path)
    values.update(containers.container_values(cfg, values))
    params: Dict[str, Any] = {
        "job_name": job_name_for(run_id),
        "comment": comment_for(run_id),
        "nodes": s.nodes,
        "ntasks_per_node": s.tasks_per_node,
        "cpus_per_task": s.cpus_per_task,
        # USR2 <lead> s before the limit: time to write a checkpoint (--signal=USR2@lead).
        "signal_delay_s": s.signal_lead_s,
        "stderr_to_stdout": True,
        # The run's code snapshot first on PYTHONPATH, in every attempt (hpc_agent/jobs/code_snapshot.py).
        # The profile's activation lines run as written, after the template's exports (so they may read
        # $HPC_AGENT_RUN_DIR) and before the snapshot's PYTHONPATH line (so a venv's activate cannot hide it).
        "setup": render_lines(template.setup, values) + activation_lines(cfg)
        + render_lines(code_snapshot.setup_lines(cfg), values)
        + batch_setup_lines(str(rundir.slurm_dir(run_dir)) if cfg.resilience.successor_on_preempt else None,
                            runs_root=str(run_dir.parent)),  # a run dir is <runs root>/<run id>: the kill switch
        "srun_args": render_args(template.srun_args, values),
        "teardown": batch_teardown_lines(cfg.resilience.successor_on_preempt),  # requeue after a signal's checkpoint, once the step ended
    }
    containers.check_srun_args(cfg, containers.template_name(cfg), params["srun_args"])
    for name in ("partition", "account", "qos", "constraint", "exclude", "mem"):
        if getattr(s, name) is not None:
            params[name] = getattr(s, name)
    if s.gpus_per_node:  # --gpus-per-node=N or --gres=gpu[:TYPE]:N, as the profile says (one place decides)
        option, value = gpu_request(cfg.profile, s.gpus_per_node)
        params[option.replace("-", "_")] = int(value) if option == "gpus-per-node" else value
    extra: Dict[str, Any] = {
        "time": s.time,  # kept in the user's format; overrides submitit's minutes-only default
        # Requeue after preemption/node failure; append so a requeued attempt never truncates the log.
        "requeue" if s.requeue else "no-requeue": True,
        "open-mode": "append",
    }
    for key, value in (s.extra_sbatch or {}).items():
        extra[key] = True if value in ("", None) else value
    extra.update(sbatch_options(cfg.notify))  # --mail-type/--mail-user: from notify: only (the config refuses both)
    params["additional_parameters"] = extra
    return params


def activation_lines(cfg: Config) -> List[str]:
    """The profile's environment activation lines, as written (the config checked each is one line of shell
    without control characters, here-documents or unclosed quotes), under a comment naming the profile. Each
    must also parse alone under ``bash -n``: a line that opens what the next line would have to close (``if``,
    ``{``, a trailing ``&&``) would take the script's srun line into it. ConfigError names the line."""
    lines = [str(line) for line in cfg.profile.activate or []]
    problems = [Problem(f"profile.activate[{i}]", line, f"one line of shell that bash parses on its own ({why})")
                for i, line in enumerate(lines) if (why := bash_syntax_problem(line + "\n"))]
    if problems:
        raise ConfigError(problems)
    return [f"# activation lines of profile {cfg.profile.name or '(config)'}"] + lines if lines else []


def local_parameters(cfg: Config) -> Dict[str, Any]:
    """Keyword arguments for ``submitit.LocalExecutor.update_parameters``."""
    containers.local_problem(cfg)
    return {
        "tasks_per_node": cfg.slurm.tasks_per_node,
        "gpus_per_node": cfg.slurm.gpus_per_node,
        "timeout_min": slurm_time_to_minutes(cfg.slurm.time),
        "signal_delay_s": cfg.slurm.signal_lead_s,
        "stderr_to_stdout": True,
    }


def job_python(cfg: Config, run_id: str, run_dir: Path, config_path: Path) -> str:
    """The ``python`` string submitit puts, unquoted, before ``-u -m submitit.core._submit FOLDER``:
    ``slurm.python`` (else ``sys.executable``), or the container's command; each word quoted once. Every
    config value here passed its field's check; ``sys.executable`` (from the environment: the venv's path) is
    checked the same way, so no value reaches the srun line with a control character."""
    own = not cfg.slurm.python and not containers.in_container(cfg)
    if own and (why := path_problem(sys.executable, sbatch=False)):
        raise ConfigError([Problem("slurm.python", sys.executable, f"set slurm.python: the interpreter running "
                                   f"submit is no path the job script can carry ({why})")])
    return containers.job_python(cfg, template_values(run_id, run_dir, config_path))


def make_executor(kind: str, folder: Path, cfg: Config, run_id: str, run_dir: Path, config_path: Path):
    """A configured submitit executor (imported here: submitit is only needed when submitting)."""
    import submitit

    if kind == "slurm":
        from hpc_agent.slurm.submitit_timeout import TimedSlurmExecutor  # submitit's, with sbatch bounded

        python = job_python(cfg, run_id, run_dir, config_path)
        params = slurm_parameters(cfg, run_id, run_dir, config_path,
                                  load_template(containers.template_name(cfg), [config_path]))
        executor = TimedSlurmExecutor(folder=folder, python=python)
    elif kind == "local":
        params = local_parameters(cfg)
        if lines := code_snapshot.setup_lines(cfg):  # the same PYTHONPATH line, run by the local job's shell
            params["setup"] = render_lines(lines, {"run_dir": str(run_dir)})
        # local_parameters refused a container: so slurm.python, else this one
        executor = submitit.LocalExecutor(folder=folder, python=containers.job_python(cfg, {}))
    else:
        raise ValueError(f"executor must be slurm or local, not {kind!r}")
    executor.update_parameters(**params)
    return executor


def render_job_script(cfg: Config, run_id: str, run_dir: Path, config_path: Path,
                      near: Sequence[Path | str] = ()) -> str:
    """The full sbatch script that ``make_executor("slurm", ...)`` would submit, without creating anything.

    submitit renders the script itself; we call its renderer directly because building an executor
    creates the job folder, and a dry run must leave no trace. The script must pass ``bash -n`` (else a
    ConfigError): submit renders it before anything is created. ``near``: config files whose
    ``sbatch_templates/`` folder is searched first (the user's config file, before submit copies it).
    """
    from submitit.slurm.slurm import _make_sbatch_string

    folder = rundir.slurm_dir(run_dir)
    python = job_python(cfg, run_id, run_dir, config_path)  # checks the paths before any template is looked up
    params = slurm_parameters(cfg, run_id, run_dir, config_path,
                              load_template(containers.template_name(cfg), [*near, config_path]))
    command = " ".join([python, "-u -m submitit.core._submit", shlex.quote(str(folder))])
    script = _make_sbatch_string(command=command, folder=folder, **params)
    if why := bash_syntax_problem(script):  # the floor: whatever slipped past the checks of each part
        raise ConfigError([Problem("slurm.template / profile.activate", containers.template_name(cfg),
                                   f"setup and activation lines that leave a job script bash can parse ({why})")])
    return script

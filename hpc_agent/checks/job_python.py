"""doctor's job-interpreter check: does the Python (or container) the job will run exist where it runs?

The login node's ``sys.executable`` or a ``slurm.python`` path may not exist on the compute nodes, and a
container image may lack hpc_agent's dependencies; either way the job dies at its first line, after
its wait in the queue. This check runs one short ``srun`` on the config's partition/account/qos (an
argv list through :class:`hpc_agent.slurm.cli.SlurmCLI`; ``--immediate`` so it never waits in the queue,
a subprocess timeout, a one-minute time limit) that imports hpc_agent and submitit with the job's
interpreter, and reports OK, FAIL with the fix, or WARN when it could not be checked (no Slurm, no free
node at once, timeout): never a hang.

In a container the probe runs as the job will: hpc_agent's code copied into a ``lib/`` folder under
``run.runs_root`` (``hpc_agent.jobs.container_lib``, removed afterwards), mounted and on ``PYTHONPATH`` alone,
and it imports torch, DeepSpeed and hpc_agent's job side too; ``hpc_agent.checks.image_python`` has what
the image must have and judges the answer (Python version against ``requires-python`` and this node's).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from typing import Any, List, Optional, Sequence, Tuple

from hpc_agent.checks import image_python
from hpc_agent.slurm.cli import SlurmCLI, SlurmError
from hpc_agent.slurm.queries import own_jobs

NAME = "job python"
IMMEDIATE_S = 10
TIMEOUT_S = 60.0
CONTAINER_TIMEOUT_S = 180.0  # a first pull of the image can take minutes; past this the check says so
MARKER = "HPC_AGENT_PROBE"
_NO_NODE = re.compile(r"Unable to allocate resources|Immediate execution impossible|allocation failure|"
                      r"Requested node configuration is not available|Job submit/allocate failed")
_MISSING = re.compile(r"execve\(\): (.+?): No such file or directory|Unable to exec|"
                      r"(\S+): (?:command )?not found|executable file not found|FATAL:.*no such file or directory",
                      re.IGNORECASE)
_NODE = re.compile(r"srun: error: ([^:\s]+): task \d+")
_IMPORT = re.compile(r"(ModuleNotFoundError|ImportError): (.+)")


def probe_code(repo: Optional[str]) -> str:
    """The probe's Python: imports what the job imports first and prints one marker line."""
    path = f"import sys; sys.path.insert(0, {repo!r}); " if repo else "import sys; "
    return (path + "import os, socket, hpc_agent, submitit; print(" + repr(MARKER) + ", "
            "os.environ.get('SLURMD_NODENAME') or socket.gethostname(), '%d.%d' % sys.version_info[:2], sys.executable)")


def probe_argv(cfg: Any, repo: Optional[str], name: str) -> Tuple[List[str], str]:
    """The srun argv and the interpreter it runs, as the job would (pure)."""
    s, c = cfg.slurm, cfg.container
    argv = ["srun", f"--immediate={IMMEDIATE_S}", f"--job-name={name}", "--nodes=1", "--ntasks=1",
            "--cpus-per-task=1", "--mem=512M", "--time=1"]
    for option, value in (("partition", s.partition), ("account", s.account), ("qos", s.qos),
                          ("constraint", s.constraint), ("exclude", s.exclude)):
        if value:
            argv.append(f"--{option}={value}")
    if c.runtime == "none":
        python = str(s.python or sys.executable)
        return argv + [python, "-c", probe_code(None)], python
    # as the job: only the copied lib/ on PYTHONPATH (never this environment's), the image's own packages
    argv[argv.index("--mem=512M")] = "--mem=1G"  # torch and DeepSpeed get imported: about 250 MB
    argv.append(f"--export=ALL,PYTHONPATH={repo}")
    mounts = ",".join([f"{repo}:{repo}"] + [m if ":" in m else f"{m}:{m}" for m in map(str, c.mounts or [])])
    if c.runtime == "pyxis":
        argv += [f"--container-image={c.image}", f"--container-mounts={mounts}"]
    if c.runtime == "apptainer":
        argv += ["apptainer", "exec", "--bind", mounts, str(c.image)]
    return argv + [str(c.python), "-c", image_python.probe_code(repo, image_python.MODULES)], str(c.python)


def what(cfg: Any, python: str) -> str:
    c = cfg.container
    if c.runtime == "none":
        return f"slurm.python {python}" if cfg.slurm.python else f"this Python ({python}; slurm.python unset)"
    return f"container.python {python} in {c.runtime} image {c.image}"


def classify(cfg: Any, python: str, rc: int, out: str, err: str) -> Tuple[str, str]:
    """(level, detail) of a finished probe: OK, FAIL with the fix, or WARN when nothing was checked."""
    c, subject = cfg.container, what(cfg, python)
    err_lines = [line.strip() for line in err.splitlines() if line.strip()]
    said = " / ".join(err_lines[-3:])[:400] or f"exit code {rc}"
    node_match = _NODE.search(err)
    node = node_match.group(1) if node_match else "the compute node"
    probe = image_python.read_probe(out) if c.runtime != "none" else None
    if probe is not None:
        return image_python.verdict(subject, probe, image_python.requires_python(), "%d.%d" % sys.version_info[:2])
    marker = next((line.split() for line in out.splitlines() if line.startswith(MARKER)), None)
    if rc == 0 and marker and len(marker) >= 4 and c.runtime == "none":
        _, host, version, exe = marker[:4]
        here = "%d.%d" % sys.version_info[:2]
        if version != here:
            return "WARN", (f"{subject} runs on {host} (Python {version}, {exe}) and imports hpc_agent and submitit, "
                            f"but this login node runs Python {here}: submitit's pickled job may not load there; "
                            "use the same Python minor version")
        return "OK", f"{subject} runs on {host} (Python {version}, {exe}) and imports hpc_agent and submitit"
    if _NO_NODE.search(err):
        return "WARN", f"not checked: no node free within {IMMEDIATE_S} s ({said})"
    if c.runtime == "pyxis" and "unrecognized option" in err and "container" in err:
        return "FAIL", ("srun does not know --container-image: this cluster has no pyxis plugin (ask the admins "
                        f"for pyxis/enroot, or use container.runtime=apptainer): {said}")
    missing = _MISSING.search(err)
    if missing:
        gone = missing.group(1) or missing.group(2) or ""
        if c.runtime == "apptainer" and gone.endswith("apptainer"):
            return "FAIL", f"apptainer is not installed on {node} ({said}): install it there or use container.runtime=pyxis"
        if c.runtime == "none":
            fix = ("set slurm.python to a venv on the shared file system" if cfg.slurm.python else
                   "set slurm.python to an interpreter on the shared file system (this one is local to the login node)")
            return "FAIL", f"{subject} does not exist on {node}: {fix} ({said})"
        return "FAIL", f"{subject} does not exist in the image on {node}: set container.python to its interpreter ({said})"
    imported = _IMPORT.search(err)
    if imported:
        return "FAIL", (f"{subject} runs on {node} but cannot import: {imported.group(2)[:200]}; install hpc_agent's "
                        "dependencies (hpc_agent, submitit, torch, deepspeed, omegaconf, ...) into it "
                        "(docs/containers.md)")
    if node_match is None and rc != 0:  # no task ran: srun itself refused (a site rule, a limit, ...)
        return "WARN", f"not checked: srun could not start the probe ({said})"
    return "FAIL", f"{subject} failed on {node}: {said}"


def check_job_python(cli: SlurmCLI, cfg: Any, repo: Optional[str] = None,
                     timeout_s: Optional[float] = None) -> Tuple[str, str, str]:
    """(level, name, detail) for doctor; see the module docstring. ``repo``: the folder the container's
    probe imports hpc_agent from (None: a lib/ copied under run.runs_root for the probe, removed after)."""
    if repo is None and cfg.container.runtime != "none":
        import shutil
        import tempfile
        from pathlib import Path

        from hpc_agent.core.filemodes import make_dir
        from hpc_agent.jobs import container_lib

        try:  # under the runs root: the job's run dir is there, so the compute nodes see it too
            root = make_dir(Path(cfg.run.runs_root).expanduser().absolute())
            tmp = Path(tempfile.mkdtemp(prefix=".doctor-lib-", dir=root))
        except OSError as exc:
            return skipped(f"cannot copy hpc_agent's code under run.runs_root for the container ({exc})")
        try:
            lib = container_lib.stage(tmp)["path"]
            return _probe(cli, cfg, str(lib), timeout_s)
        except (OSError, container_lib.LibError) as exc:
            return skipped(f"cannot copy hpc_agent's code under run.runs_root for the container ({exc})")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return _probe(cli, cfg, repo, timeout_s)


def _probe(cli: SlurmCLI, cfg: Any, repo: Optional[str], timeout_s: Optional[float]) -> Tuple[str, str, str]:
    name = f"hpc-agent-doctor-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    argv, python = probe_argv(cfg, repo, name)
    limit = timeout_s or (TIMEOUT_S if cfg.container.runtime == "none" else CONTAINER_TIMEOUT_S)
    try:
        result = cli.run(argv, check=False, timeout_s=limit)
    except SlurmError as exc:
        if isinstance(exc.__cause__, subprocess.TimeoutExpired):
            cancel(cli, name)
            return "WARN", NAME, (f"not checked: srun did not finish within {limit:.0f} s (a busy node, or a first "
                                  f"pull of the image); {what(cfg, python)} is unverified")
        return "WARN", NAME, f"not checked: {exc}"
    level, detail = classify(cfg, python, result.returncode, result.stdout, result.stderr)
    return level, NAME, detail


def cancel(cli: SlurmCLI, name: str) -> None:
    """A killed srun may leave its allocation behind for up to its minute: cancel it by its unique name."""
    try:
        cli.run(["scancel", *own_jobs(), f"--name={name}"], check=False, timeout_s=15)
    except SlurmError:
        pass


def skipped(reason: str) -> Tuple[str, str, str]:
    return "WARN", NAME, f"not checked: {reason}"


__all__: Sequence[str] = ["check_job_python", "check_code", "classify", "probe_argv", "skipped", "NAME"]


def check_code(cfg: Any, cwd: str) -> Tuple[str, str, str]:
    """Your own code (a ``train.workload`` package, a ``train.command`` script): can submit find and snapshot
    it from here? The same plan submit makes (hpc_agent.jobs.code_snapshot), without copying or importing it."""
    from pathlib import Path

    from hpc_agent.jobs import code_snapshot
    from hpc_agent.config.problems import ConfigError

    if not code_snapshot.wanted(cfg):
        why = "built-in workload: nothing of yours to snapshot" if cfg.train.snapshot_code else \
            "train.snapshot_code=false: the job imports your code live"
        return "OK", "code", why
    try:
        plan = code_snapshot.plan_for(cfg, Path(cwd))
    except ConfigError as exc:
        return "FAIL", "code", "; ".join(f"{p.key}: {p.expected}" for p in exc.problems)
    if plan is None:
        return "WARN", "code", "no .py file of the command found under this directory: nothing will be snapshotted"
    what = code_snapshot.summary(code_snapshot.plan_manifest(plan, Path(cwd)))
    return "OK", "code", f"{plan.source} ({what}) is copied into the run directory at submit and runs in every attempt"


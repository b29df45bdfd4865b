"""Command mode (``train.command``), job side: what each task of the srun step does before it *becomes* the
user's program (docs/your_script.md).

Per task, in this order:

1. read the config snapshot and the rank layout (``launch.distributed.detect``: submitit's job environment,
   the same source and rendezvous-port rule as the built-in training);
2. pick the newest complete checkpoint (``hpc_agent.core.checkpoint_format.select``: the built-in resume's rules) and
   plan its load against this attempt's layout (``launch.universal.plan``): a changed ZeRO stage or world
   size needs DeepSpeed's ``checkpoint.load_universal``, which DeepSpeed reads from its config at
   ``initialize``, so it must be decided here; a change that cannot be honoured exits 78 (as built-in);
3. build the DeepSpeed config with ``launch.dsconfig.build_ds_config`` (the one place that turns ``train``
   into DeepSpeed's dict) and write it atomically to ``rundir.ds_config_path`` (every rank writes the same
   bytes through its own temp file, so no rank waits for another and no reader sees half a file);
4. ``os.execvpe`` the argv with ``HPC_AGENT_*`` and torch.distributed's variables, in the copy of the
   directory submit ran in inside the code snapshot (:func:`command_argv`), else in that directory itself
   (``run.json``'s ``workdir``), unless ``container.workdir`` is set (the runtime enters that one).

exec, not a child: Slurm signals the task's pid, so the user's Python must *be* that process. Before the
exec SIGTERM and SIGUSR2 are set to SIG_IGN (exec keeps an ignored signal ignored; submitit's Python
handlers would be reset to "terminate"): a script that never calls ``install_signal_handler`` then runs
on through the preemption grace time and is requeued by Slurm (a task that exits during the grace ends
FAILED and is not requeued: launch/signals.py), and just runs into its time limit after the SIGUSR2
warning. With submitit's *local* executor the job's state comes only from submitit's result file, which
an exec'ed process never writes, so there the task stays a thin parent: it runs the command as a child,
forwards SIGUSR2/SIGTERM/SIGINT to it, and returns its exit code.

Nothing here imports the in-job repair code (``launch/recovery.py``): a user's script repairs nothing in
place; OOMs and the rest go to the watcher, which patches ``train`` and so the next attempt's config.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from hpc_agent.core import rundir
from hpc_agent.core.checkpoint_format import scan, select
from hpc_agent.core.fsutil import atomic_write_json
from hpc_agent.core.redact import redact_command

ENV_DS_CONFIG = "HPC_AGENT_DS_CONFIG"
ENV_RUN_DIR = "HPC_AGENT_RUN_DIR"
ENV_CKPT_DIR = "HPC_AGENT_CKPT_DIR"
ENV_RESUME_TAG = "HPC_AGENT_RESUME_TAG"
ENV_CONFIG = "HPC_AGENT_CONFIG"
ENV_WORKDIR = "HPC_AGENT_WORKDIR"  # where the script runs (the snapshot's copy of the submit directory, the
# submit directory, or container.workdir)
ENV_LOADER_WORKERS = "HPC_AGENT_LOADER_WORKERS"  # train.loader_workers: the watcher halves it after shm_exhausted
FORWARDED = (signal.SIGUSR2, signal.SIGTERM, signal.SIGINT)


def say(text: str) -> None:
    print(f"[hpc_agent] {text}", flush=True)


def attempt_identity(environ: Mapping[str, str]) -> Tuple[str, int]:
    """(job id, restart count) naming this attempt's files: Slurm's, else submitit's local job (as the
    heartbeat names it: ``local-<id>``)."""
    from hpc_agent.core.lease_rules import job_identity

    job, attempt = job_identity(environ)
    local = environ.get("SUBMITIT_LOCAL_JOB_ID", "")
    return job or (f"local-{local}" if local else "local"), attempt


@dataclass(frozen=True)
class Resume:
    """What a command-mode attempt resumes from: ``tag`` under the checkpoints folder ("" = start fresh),
    whether DeepSpeed must load it as a universal checkpoint, and the lines that say why."""
    tag: str = ""
    universal: bool = False
    refused: str = ""
    lines: Tuple[str, ...] = ()


def plan_resume(ckpt_root: Path, layout: Dict[str, Any]) -> Resume:
    """The newest complete checkpoint (the built-in resume's rules) and how this layout loads it."""
    from launch import universal

    selection = select(scan(ckpt_root))
    lines = list(selection.lines())
    if selection.chosen is None:
        return Resume(lines=tuple(lines))
    saved = selection.chosen.marker.get("layout") or layout  # a marker without a layout: assume it is ours
    plan = universal.plan(saved, layout)
    if plan.mode != universal.NATIVE:  # a plain load is said once, by load_checkpoint (launch/resume.py)
        lines.append(f"resume plan for {selection.chosen.name}: {plan.mode}: {plan.reason}")
    if plan.mode == universal.REFUSE:
        return Resume(selection.chosen.name, refused=plan.reason, lines=tuple(lines))
    return Resume(selection.chosen.name, plan.mode in (universal.UNIVERSAL, universal.FROM_STAGE0), "", tuple(lines))


@dataclass(frozen=True)
class Launch:
    """Everything one task needs to become the user's program (:func:`build_launch`; pure)."""
    argv: List[str]
    env: Dict[str, str]
    cwd: Optional[str]
    ds_config: Dict[str, Any]
    ds_config_path: Path
    notes: List[str] = field(default_factory=list)
    shown: str = ""  # the command for the job log: env-sourced and token-like arguments masked


def build_launch(cfg: Any, run_dir: Path, config_path: Path, denv: Any, *, on_cuda: bool, precision: str,
                 resume: Resume, workdir: Optional[str], environ: Mapping[str, str],
                 argv: Optional[List[str]] = None, code_root: Optional[Path] = None,
                 code_dir: Optional[Path] = None, python: str = sys.executable) -> Launch:
    """The argv, environment, working directory and DeepSpeed config of one task (no I/O).

    ``argv``: the command as it runs (the snapshot's paths, when the code was snapshotted at submit);
    ``cfg.train.command`` by default. A first word ``python``/``python3`` is the job's own interpreter
    (``python``: ``slurm.python``, the container's, or submit's), the one that has DeepSpeed and hpc_agent.
    PYTHONPATH: the snapshot (``code_dir``), then ``code_root`` (so ``launch.script_api`` imports from the
    hpc_agent that runs the job), then what was there."""
    from launch.dsconfig import build_ds_config

    run_dir = Path(run_dir)
    ds_config = build_ds_config(cfg.train, world_size=denv.world_size, precision=precision, on_cuda=on_cuda,
                                load_universal=resume.universal)
    job_id, attempt = attempt_identity(environ)
    path = rundir.ds_config_path(run_dir, job_id, attempt)
    cwd = None if cfg.container.workdir else (workdir or None)
    env = dict(environ)
    env.update({
        ENV_DS_CONFIG: str(path), ENV_RUN_DIR: str(run_dir), ENV_CKPT_DIR: str(rundir.checkpoints_dir(run_dir)),
        ENV_RESUME_TAG: resume.tag, ENV_CONFIG: str(config_path), ENV_LOADER_WORKERS: str(cfg.train.loader_workers),
        "RANK": str(denv.rank), "LOCAL_RANK": str(denv.local_rank), "WORLD_SIZE": str(denv.world_size),
        "MASTER_ADDR": str(denv.master_addr), "MASTER_PORT": str(denv.master_port),
    })
    if cfg.container.workdir or workdir:
        env[ENV_WORKDIR] = str(cfg.container.workdir or workdir)
    paths = [str(p) for p in (code_dir, code_root) if p is not None]
    paths += [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in paths]
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    words = [str(w) for w in (argv or cfg.train.command)]
    if words[0] in ("python", "python3"):
        words[0] = python
    notes = [*resume.lines, f"DeepSpeed config {path}: micro batch {ds_config['train_micro_batch_size_per_gpu']} x "
             f"accumulation {ds_config['gradient_accumulation_steps']} x {denv.world_size} rank(s), ZeRO-"
             f"{ds_config['zero_optimization']['stage']}, {precision}"]
    shown = redact_command(words, (getattr(cfg, "env_origin", None) or {}).get("train.command", []), environ)
    return Launch(words, env, cwd, ds_config, path, notes, shown)


def command_argv(cfg: Any, run_dir: Path,
                 workdir: Optional[str] = None) -> Tuple[List[str], Optional[Path], Optional[str]]:
    """The command as it runs, the snapshot folder, and the folder it runs in: with the copy of the project
    taken at submit (``hpc_agent.jobs.code_snapshot``, ``train.snapshot_code``) the script word points at its
    copy and the command runs in the copy of the submit's folder (when that folder is inside the project);
    else the command as configured, in ``workdir`` (the submit's folder)."""
    from hpc_agent.core.code_manifest import read_manifest, snapshot_argv, snapshot_workdir

    argv = [str(w) for w in cfg.train.command]
    manifest = read_manifest(Path(run_dir)) if cfg.train.snapshot_code else None
    if manifest is None:
        return argv, None, workdir
    code_dir = rundir.code_dir(Path(run_dir))
    return snapshot_argv(argv, manifest, code_dir), code_dir, snapshot_workdir(manifest, code_dir) or workdir


def prepare(run_dir: str, config_path: str, workdir: Optional[str],
            environ: Mapping[str, str] = os.environ) -> Tuple[int, Optional[Launch]]:
    """Steps 1-3 of the module docstring; (exit code, None) when the task must not run the command."""
    from hpc_agent.config.load import load_snapshot
    from hpc_agent.config.problems import ConfigError
    from hpc_agent.core.paths import code_root
    from hpc_agent.core.exit_codes import EXIT_CONFIG, EXIT_UNAVAILABLE
    from launch import distributed, universal
    from launch.dsconfig import PrecisionUnavailable, resolve_precision

    try:
        cfg = load_snapshot(config_path)
    except ConfigError as exc:
        say(f"invalid config snapshot {config_path}:\n{exc}\nexiting {EXIT_CONFIG}")
        return EXIT_CONFIG, None
    import torch  # only for the one fact the DeepSpeed config depends on: is there a GPU here

    on_cuda = torch.cuda.is_available()
    try:
        precision, note = resolve_precision(cfg.train.precision, on_cuda)
    except PrecisionUnavailable as exc:
        say(f"{exc} Exiting {EXIT_UNAVAILABLE}.")
        return EXIT_UNAVAILABLE, None
    denv = distributed.detect()
    layout = universal.layout_of(cfg.train, denv.world_size, precision)
    resume = plan_resume(rundir.checkpoints_dir(Path(run_dir)), layout)
    argv, code_dir, workdir = command_argv(cfg, Path(run_dir), workdir)
    launch = build_launch(cfg, Path(run_dir), Path(config_path), denv, on_cuda=on_cuda, precision=precision,
                          resume=resume, workdir=workdir, environ=environ, argv=argv, code_root=code_root(),
                          code_dir=code_dir)
    print(f"[rank {denv.rank}/{denv.world_size}] host={environ.get('SLURMD_NODENAME') or os.uname().nodename} "
          f"job={environ.get('SLURM_JOB_ID', 'local')} local_rank={denv.local_rank} "
          f"master={denv.master_addr}:{denv.master_port} ({denv.source}) command mode", flush=True)
    if denv.rank == 0:
        for line in [note, *launch.notes]:
            say(line)
    if resume.refused:
        say(f"cannot resume: {resume.refused}; exiting {EXIT_CONFIG}")
        return EXIT_CONFIG, None
    atomic_write_json(launch.ds_config_path, launch.ds_config)
    return 0, launch


def become(launch: Launch, local: bool) -> int:
    """Step 4: exec the command (never returns), or under the local executor run it as a forwarded child."""
    from hpc_agent.core.exit_codes import EXIT_CONFIG, EXIT_CRASHED

    if launch.cwd:
        try:
            os.chdir(launch.cwd)
        except OSError as exc:
            say(f"cannot enter the working directory {launch.cwd} ({exc}); exiting {EXIT_CONFIG}")
            return EXIT_CONFIG
    if launch.env.get("RANK") == "0":
        say(f"running {launch.shown or redact_command(launch.argv, [], launch.env)} in {os.getcwd()}")
    sys.stdout.flush()
    sys.stderr.flush()
    if local:
        return _run_child(launch)
    for sig in (signal.SIGTERM, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)  # kept across exec (module docstring)
    try:
        os.execvpe(launch.argv[0], launch.argv, launch.env)
    except OSError as exc:
        say(f"cannot run {launch.argv[0]!r}: {exc}; exiting {EXIT_CRASHED}")
        return EXIT_CRASHED
    return EXIT_CRASHED  # not reached


def _run_child(launch: Launch) -> int:
    from hpc_agent.core.exit_codes import EXIT_CRASHED

    try:
        child = subprocess.Popen(launch.argv, env=launch.env)
    except OSError as exc:
        say(f"cannot run {launch.argv[0]!r}: {exc}; exiting {EXIT_CRASHED}")
        return EXIT_CRASHED
    for sig in FORWARDED:
        signal.signal(sig, lambda signum, frame: child.send_signal(signum))
    code = child.wait()
    return 128 - code if code < 0 else code  # killed by signal N: the shell's 128+N


def run(run_dir: str, config_path: str, workdir: Optional[str]) -> int:
    """One task of a command-mode job: prepare, then become the command. Returns only on failure (or under
    the local executor, with the command's exit code)."""
    code, launch = prepare(run_dir, config_path, workdir)
    if launch is None:
        return code
    local = bool(os.environ.get("SUBMITIT_LOCAL_JOB_ID")) and not os.environ.get("SLURM_JOB_ID")
    return become(launch, local)

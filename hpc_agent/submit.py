"""python -m hpc_agent.submit CONFIG [key=value ...] [--dry-run] [--executor auto|slurm|local] [--wait]

Validate a config, create the run directory, record the intent in the ledger, submit through
submitit, record the job id. Runs on login nodes: imports neither torch nor deepspeed.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

from hpc_agent.cli import exit_status, invocation
from hpc_agent.cli.flags import add_common_arguments, configure, passthrough
from hpc_agent.config.load import load_config, resolve_config_path, to_yaml, write_run_config
from hpc_agent.config.problems import ConfigError, Problem
from hpc_agent.core import paths, rundir
from hpc_agent.jobs import code_snapshot, place
from hpc_agent.jobs.executor import EXECUTORS, local_parameters, make_run_id, render_job_script
from hpc_agent.policy.preflight import REFUSE, WARN, MemoryVerdict, gpu_capacity, memory_verdict, render, sinfo_argv
from hpc_agent.remote import ssh
from hpc_agent.slurm.cli import SlurmCLI, SlurmError
from hpc_agent.slurm.job_match import job_name_for
from hpc_agent.slurm.sinfo import partition_gres

EXIT_CONFIG = exit_status.USAGE
EXIT_SUBMIT_FAILED = exit_status.SLURM  # sbatch refused or timed out
EXIT_JOB_FAILED = exit_status.FAILED  # --wait: the job did not complete
EXIT_WONT_FIT = exit_status.WONT_FIT  # the memory estimate exceeds the GPU's memory (submit --force to override)
EXIT_PAUSED = exit_status.PAUSED  # the runs root's kill switch is set (watch --pause): nothing was created
log = logging.getLogger("hpc_agent.submit")  # not __name__: under python -m it is __main__, outside the tree


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=invocation.prog("submit"),
        description="Validate a training config and submit it as a Slurm job (or a local job).",
        epilog="Example: python -m hpc_agent.submit configs/quickstart.yaml train.lr=1e-3 slurm.partition=low\n"
               "Exit codes: 0 submitted, 1 the job failed (--wait), 2 invalid config (or train.workload not found, or a "
               "DeepSpeed op not prepared: python -m hpc_agent.prepare), 3 sbatch refused or timed out, "
               "5 the runs root is paused (watch --pause), 6 the memory estimate does not fit the GPU (see --force); "
               "all commands: docs/cli.md.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("config", help="YAML config: a path, the name of a file in configs/ (e.g. quickstart), "
                                       "or - to read it from stdin (what submit --remote sends)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. train.max_steps=50")
    parser.add_argument("--dry-run", action="store_true", help="print the resolved config and job script; submit nothing")
    parser.add_argument("--script-only", action="store_true",
                        help="a dry run (implies --dry-run) that prints only the sbatch job script on stdout, for "
                             "`submit CONFIG --script-only > job.sh`; every other line goes to stderr. Slurm "
                             "executor only (a local job has no script); the script's paths point into a run "
                             "directory that only a real submit creates")
    parser.add_argument("--executor", choices=EXECUTORS, default="auto",
                        help="slurm (sbatch), local (a process on this machine), or auto: slurm if sbatch is on PATH")
    parser.add_argument("--force", action="store_true",
                        help="submit even if the memory estimate does not fit the partition's GPUs, or a DeepSpeed op "
                             "the job loads is not prepared (then only warn); never past a train.workload that "
                             "cannot be found")
    parser.add_argument("--wait", action="store_true",
                        help="wait for the run to end (repaired on the way by the runs root's watcher, or by one in "
                             "this process when none runs), showing its progress; print its final state")
    parser.add_argument("--wait-timeout", type=float, default=3600, help="seconds to wait with --wait (default 3600)")
    parser.add_argument("--place", choices=("auto", "off"),
                        help="auto: choose the partition with the earliest expected finish (memory estimate, GPU type, "
                             "sbatch --test-only start, cost) and print the candidates; a named slurm.partition still "
                             "wins (sets placement.mode; docs/placement.md)")
    parser.add_argument("--profile", metavar="NAME", help="a cluster profile under your config (default: "
                        "$HPC_AGENT_PROFILE); the run's snapshot records it (docs/profiles.md)")
    ssh.add_arguments(parser)  # --remote USER@LOGIN: validate here, submit there (hpc_agent.remote.ssh_submit)
    return add_common_arguments(parser, slurm=True)


def choose_executor(requested: str, sbatch_available: bool) -> tuple[str, Optional[str]]:
    """The executor to use and, for ``auto``, a line announcing the choice."""
    if requested != "auto":
        return requested, None
    if sbatch_available:
        return "slurm", "executor: slurm (sbatch found on PATH)"
    return "local", "executor: local (no sbatch on PATH; the job runs as a process on this machine)"


def new_run_dir(runs_root: Path, name: str, now: _dt.datetime,
                known: Callable[[str], bool] = lambda run_id: False) -> tuple[str, Path]:
    """A fresh ``<runs_root>/<name>-<timestamp>`` (suffixed if two submits share a second), whose id is not
    ``known`` to the ledger either (a refused submit keeps its ledger row but not its run dir)."""
    base = make_run_id(name, now)
    run_id, n = base, 1
    while (runs_root / run_id).exists() or known(run_id):
        n += 1
        run_id = f"{base}-{n}"
    return run_id, runs_root / run_id


def _warn(text: str) -> None:
    try:
        print(text, file=sys.stderr, flush=True)
    except Exception:  # noqa: BLE001 - stderr gone too: the ledger still holds what the user needs
        pass


def _ledger_knows(runs_root: Path) -> Callable[[str], bool]:
    """Whether the runs root's ledger (if there is one yet) has a row for a run id."""
    from hpc_agent.state.ledger import LEDGER_FILE, Ledger

    def known(run_id: str) -> bool:
        if not (runs_root / LEDGER_FILE).is_file():
            return False
        ledger = Ledger.in_runs_root(runs_root)
        try:
            return ledger.run(run_id) is not None
        finally:
            ledger.close()
    return known


def _discard(run_dir: Path) -> None:
    """Remove a run dir this submit made and could not finish (links inside are removed, never followed)."""
    import shutil

    try:
        shutil.rmtree(run_dir)
    except FileNotFoundError:
        pass
    except OSError as exc:
        _warn(f"(could not remove the unfinished run dir {run_dir}: {exc})")


def _audit_submit(ledger, run_id: str, job_id: str, kind: str) -> None:
    """The submit action's audit record; its failure never hides that the job is submitted."""
    from hpc_agent.state.audit import record_action
    from hpc_agent.state.journal import Journal

    try:
        record_action(Journal(ledger), run_id, "submit", job_id, f"python -m hpc_agent.submit ({kind} executor)",
                      process="submit", result="submitted")
    except Exception as exc:  # noqa: BLE001 - the ledger failed after sbatch: say so, the job runs anyway
        _warn(f"warning: job {job_id} is submitted, but its audit record was not written ({exc})")


def refused_paused(runs_root: Path, run_id: str) -> bool:
    """True (said on stderr, and audited in the runs root's ledger when it has one) when the runs root's kill
    switch is set: submit then creates nothing and runs no sbatch (exit 5, as a paused sweep)."""
    from hpc_agent.state import killswitch
    from hpc_agent.state.ledger import LEDGER_FILE

    pause_file = killswitch.pause_path(runs_root)
    if not killswitch.is_paused(pause_file):
        return False
    print(f"paused: {pause_file} exists (the kill switch, set by watch --pause): nothing was created or submitted. "
          f"To submit: python -m hpc_agent.watch --resume --runs-root {runs_root}, then run this command again.",
          file=sys.stderr)
    if (runs_root / LEDGER_FILE).is_file():  # a refusal is audited where there is a ledger; none is created
        from hpc_agent.state import audit
        from hpc_agent.state.journal import Journal
        from hpc_agent.state.ledger import Ledger

        try:
            ledger = Ledger.in_runs_root(runs_root)
            try:
                with ledger.transaction():
                    audit.record_refused(Journal(ledger), run_id, "submit", "", pause_file, process="submit")
            finally:
                ledger.close()
        except Exception as exc:  # noqa: BLE001 - the refusal stands; the audit is a record of it
            _warn(f"(could not record the refusal in the ledger: {exc})")
    return True


def check_memory(cfg, kind: str) -> MemoryVerdict:
    """The pre-flight memory verdict; asks sinfo for the partition's GPU type only when it needs to."""
    gres = ""
    if kind == "slurm" and cfg.slurm.gpus_per_node and not cfg.slurm.gpu_memory_gib and cfg.train.workload == "gpt" \
            and not cfg.train.command:
        try:
            gres = partition_gres(SlurmCLI(timeout_s=15).run(list(sinfo_argv())).stdout, cfg.slurm.partition)
        except SlurmError as exc:
            log.warning("  (sinfo failed, GPU memory unknown: %s)", exc)
    capacity, source = gpu_capacity(cfg, gres)
    return memory_verdict(cfg, capacity, source)


@dataclass
class Prechecks:
    """What submit checks before anything is created, so that a mistake ends here and not after the queue wait."""

    snapshot: Optional[code_snapshot.Plan] = None
    code: List[Problem] = field(default_factory=list)
    """Your code cannot be found or has no such callable: refused, even with --force."""
    environment: List[str] = field(default_factory=list)
    """The job's Python cannot run the job (an unprepared DeepSpeed op): refused unless --force."""
    lines: List[Tuple[int, str]] = field(default_factory=list)
    """(log level, line) of each check that passed, was skipped or was forced: progress, and the dry run's."""

    @property
    def refused(self) -> bool:
        return bool(self.code or self.environment)

    def render(self) -> str:
        parts = [ConfigError(self.code).render()] if self.code else []
        if self.environment:
            n = len(self.environment)
            parts.append(f"{n} problem{'s' if n != 1 else ''} with the job's environment:")
            parts += [f"  - {line}" for line in self.environment]
        return "\n".join(parts)


def precheck(cfg, cwd: Path, force: bool) -> Prechecks:
    """Every check of what the job will find, each problem collected (reported together, exit 2): the snapshot
    plan and the workload's module and callable (``hpc_agent.jobs.workload_lookup``: found and read, never
    imported: it may import torch or do anything at import), and the DeepSpeed ops the job loads
    (``hpc_agent.checks.envcheck.check_job_ops``, the check doctor runs, for the job's Python)."""
    from hpc_agent.checks.envcheck import FAIL, OK, SKIP, check_job_ops
    from hpc_agent.jobs import workload_lookup

    out = Prechecks()
    try:  # your code, found now; copied once the run dir exists
        out.snapshot = code_snapshot.plan_for(cfg, cwd)
    except ConfigError as exc:
        out.code += exc.problems
    for word in code_snapshot.left_out_args(out.snapshot, cfg.train.command or [], cwd):
        out.lines.append((logging.WARNING, f"Code snapshot: {word} is here but not in the snapshot (an ignore file "
                                           "leaves it out), and the command runs in the snapshot: give it as an "
                                           "absolute path, or set train.snapshot_code=false (docs/your_script.md)"))
    found = workload_lookup.check(cfg, cwd)
    out.code += found.problems
    if found.detail:
        out.lines.append((logging.INFO, f"Workload: {found.detail}"))
    level, detail = check_job_ops(cfg)
    if level == FAIL and not force:
        out.environment.append(f"DeepSpeed ops: {detail} (submit --force submits anyway; the job would exit 72)")
    elif level == FAIL:
        out.lines.append((logging.WARNING, f"DeepSpeed ops (--force: submitted anyway): {detail}"))
    else:
        out.lines.append((logging.INFO if level in (OK, SKIP) else logging.WARNING, f"DeepSpeed ops: {detail}"))
    if cfg.container.runtime != "none":  # the image's Python, where that is cheap here (checks/image_python.py)
        from hpc_agent.checks.image_python import check_locally

        level, _, detail = check_locally(cfg)
        if level == FAIL and not force:
            out.environment.append(f"image python: {detail} (submit --force submits anyway)")
        else:
            quiet = level == OK or detail.startswith("not checked")
            out.lines.append((logging.INFO if quiet else logging.WARNING, f"Image python: {detail}"))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_intermixed_args(argv)
    configure(args, chatter_on_stderr=args.script_only)
    args.dry_run = args.dry_run or args.script_only
    if args.remote:
        from hpc_agent.remote.ssh_submit import submit_remote

        return submit_remote(args, ssh.local_argv(argv))
    try:
        profile = args.profile
        if args.config == "-":  # the resolved config on stdin, sent by submit --remote from a laptop
            from hpc_agent.remote.ssh_submit import config_from_stdin

            args.config = config_from_stdin()
            profile = ""  # it is resolved: the laptop applied the profile, and the snapshot records it
        cfg = load_config(args.config, args.overrides, profile=profile)
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        print("Nothing was submitted. Fix the values above and run the command again.", file=sys.stderr)
        return EXIT_CONFIG
    checked = precheck(cfg, Path.cwd(), args.force)
    if checked.refused:
        print(checked.render(), file=sys.stderr)
        print("Nothing was submitted. Fix the problems above and run the command again.", file=sys.stderr)
        return EXIT_CONFIG
    for level, line in [] if args.dry_run else checked.lines:  # the dry run prints them with the script
        log.log(level, line)
    snapshot = checked.snapshot

    kind, announcement = choose_executor(args.executor, SlurmCLI.available())
    if announcement:
        log.info(announcement)
    if args.script_only and kind != "slurm":
        print(f"--script-only prints the sbatch job script, and the {kind} executor has none"
              + (" (no sbatch on PATH here, so --executor auto chose local)" if announcement else "")
              + ": add --executor slurm. Nothing was created or submitted.", file=sys.stderr)
        return EXIT_CONFIG
    if args.place and args.place != cfg.placement.mode:  # recorded: the watcher reads the run's config
        cfg = place.with_mode(cfg, args.place)
    if cfg.placement.mode == "auto":
        if kind != "slurm":
            log.info("placement: skipped (the %s executor has no partitions)", kind)
        else:
            placed = place.place(cfg, SlurmCLI())
            for line in placed.lines:
                log.info(line)
            if placed.error:
                print(f"{placed.error}\nNothing was submitted.", file=sys.stderr)
                return EXIT_WONT_FIT
            cfg = placed.cfg
    verdict = check_memory(cfg, kind)
    for line in render(verdict, args.force):  # a warning or refusal on stderr; an OK verdict is progress (-q)
        log.log(logging.WARNING if verdict.level in (WARN, REFUSE) else logging.INFO, line)
    if verdict.level == REFUSE and not args.force:
        print("Nothing was submitted.", file=sys.stderr)
        return EXIT_WONT_FIT
    runs_root = Path(cfg.run.runs_root).expanduser().resolve()
    run_id, run_dir = new_run_dir(runs_root, cfg.run.name, _dt.datetime.now(), _ledger_knows(runs_root))
    config_path = rundir.config_path(run_dir)

    try:  # a value the job script cannot carry is a config error (exit 2) before anything is created
        # The user's config file first: its sbatch_templates/ folder wins (hpc_agent.core.paths.template_dirs).
        source = resolve_config_path(args.config)
        script = render_job_script(cfg, run_id, run_dir, config_path, near=[source]) if kind == "slurm" else None
        if kind == "local":
            local_parameters(cfg)  # e.g. a container needs Slurm
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        print("Nothing was submitted.", file=sys.stderr)
        return EXIT_CONFIG
    from hpc_agent.core.filemodes import check_runs_root

    shared = check_runs_root(runs_root, opted_in=cfg.run.group_readable)  # who else can write it (docs/security.md)
    if shared is not None:
        print(f"{shared}\nNothing was submitted.", file=sys.stderr)
        return EXIT_CONFIG
    if args.script_only:  # stdout is the script alone (> job.sh); what a dry run says besides goes to stderr
        print(script)
        for _, line in checked.lines:  # what submit checked before the queue wait, or why it did not
            print(f"# {line}", file=sys.stderr)
        print(f"# Dry run: nothing was created or submitted. The script's paths point into {run_dir}, which only a "
              "real submit creates.", file=sys.stderr)
        return 0
    if args.dry_run:
        print("# Resolved config")
        print(to_yaml(cfg))
        snapshot_lines = code_snapshot.dry_run_lines(snapshot, cfg, run_dir, Path.cwd())
        for line in snapshot_lines[:-1] if snapshot is not None else snapshot_lines:  # the command, its folder
            print(line)
        if script is not None:
            print("# Job script (sbatch)")
            print(script)
        else:
            print(f"# Local job: {cfg.slurm.tasks_per_node} task(s) on this machine, "
                  f"timeout {local_parameters(cfg)['timeout_min']} min")
        if snapshot is not None:  # what is copied (docs/your_script.md)
            print(snapshot_lines[-1])
        for _, line in checked.lines:  # what submit checked before the queue wait, or why it did not
            print(f"# {line}")
        print("# Dry run: nothing was created or submitted.")
        return 0

    from hpc_agent.state.ledger import Ledger
    from hpc_agent.state.lifecycle import Event, EventKind
    from hpc_agent.slurm.submitit_timeout import SbatchTimedOut
    from hpc_agent.jobs.submission import SubmittedButIncomplete, log_paths, submit_attempt

    from hpc_agent.core.filemodes import make_dir  # 0700 (0750 with run.group_readable), whatever the umask

    if refused_paused(runs_root, run_id):  # the kill switch: checked before anything is created
        return EXIT_PAUSED
    # From here until sbatch accepts the job, any failure removes the run dir again (_discard): a failed
    # submit leaves no half-made run behind. The ledger keeps only a refusal by sbatch (the run stopped, with
    # sbatch's error), the one failure that reached it.
    try:
        make_dir(run_dir, group=cfg.run.group_readable, exist_ok=False)
    except OSError as exc:  # e.g. a runs root we may not write: nothing was made
        _warn(f"Creating the run directory {run_dir} failed: {exc}\nNothing was submitted.")
        return exit_status.FAILED
    try:
        make_dir(rundir.tb_dir(run_dir))
        make_dir(rundir.checkpoints_dir(run_dir))
        write_run_config(run_dir, cfg)
        if kind == "slurm":  # a project's own template goes with the run, for the watcher's resubmissions
            from hpc_agent.jobs.containers import template_name

            paths.keep_project_template(template_name(cfg), source, run_dir)
        if snapshot is not None:  # first submission only: the watcher's resubmissions reuse this copy
            log.info(code_snapshot.describe(code_snapshot.take(snapshot, run_dir)))
        ledger = Ledger.in_runs_root(runs_root)
    except Exception as exc:  # noqa: BLE001 - nothing reached Slurm or the ledger: undo, say why, no traceback
        _discard(run_dir)
        if isinstance(exc, ConfigError):
            print(exc.render(), file=sys.stderr)
            print("Nothing was submitted.", file=sys.stderr)
            return EXIT_CONFIG
        _warn(f"Preparing the run directory {run_dir} failed ({type(exc).__name__}: {exc})\nNothing was submitted.")
        return exit_status.FAILED
    watch_cmd = f"python -m hpc_agent.watch --runs-root {runs_root}"
    try:
        ledger.add_run(run_id, cfg.run.name, str(run_dir))
    except Exception as exc:  # noqa: BLE001 - no row, so nothing follows the run: undo it
        ledger.close()
        _discard(run_dir)
        _warn(f"Recording the run in the ledger failed ({type(exc).__name__}: {exc})\nNothing was submitted.")
        return exit_status.FAILED
    try:
        job = submit_attempt(ledger, run_id, run_dir, cfg, config_path, kind, reason="submit")
        _audit_submit(ledger, run_id, job.job_id, kind)
    except SubmittedButIncomplete as exc:
        # Slurm has a live job: never stop the run, or nobody would follow it. Say which job, and who follows it.
        job = exc.job
        where = ("the ledger has its job id" if exc.recorded
                 else f"the watcher finds it in Slurm by its name {job_name_for(run_id)}")
        _warn(f"warning: {exc}\n"
              f"Job {exc.job_id} is submitted and the run {run_id} stays followed ({where}): "
              f"`{watch_cmd}` will follow it.")
    except SbatchTimedOut as exc:  # the job may be queued: leave the run submitting; the watcher settles it
        _warn(f"warning: {exc}\n`{watch_cmd}` finds the job under the name {job_name_for(run_id)} if Slurm has it.")
        return EXIT_SUBMIT_FAILED
    except Exception as exc:  # sbatch refused (no job id): say why, mark the run stopped, remove its dir
        try:
            ledger.advance(run_id, Event(EventKind.SUBMIT_FAILED))
        except Exception as inner:  # noqa: BLE001 - the ledger itself failed; the refusal is still the news
            _warn(f"(could not mark the run stopped in the ledger: {inner})")
        _discard(run_dir)
        if isinstance(exc, ConfigError):  # the job script could not be made (before sbatch ran)
            print(exc.render(), file=sys.stderr)
            print("Nothing was submitted.", file=sys.stderr)
            return EXIT_CONFIG
        _warn(f"Submission failed: {exc}")
        return EXIT_SUBMIT_FAILED
    finally:
        ledger.close()
    job_id = job.job_id
    logs = log_paths(run_dir, job_id, cfg.slurm.tasks_per_node * (cfg.slurm.nodes if kind == "slurm" else 1))
    try:
        print(f"run id:       {run_id}")
        print(f"run dir:      {run_dir}")
        print(f"job id:       {job_id} ({kind})")
        print(f"logs:         {logs[0]}" + (f" (+{len(logs) - 1} more ranks)" if len(logs) > 1 else ""))
        print(f"tensorboard:  tensorboard --logdir {rundir.tb_dir(run_dir)}")
        print(f"next:         {watch_cmd}   # follow and repair this run", flush=True)
    except Exception as exc:  # noqa: BLE001 - e.g. a closed pipe: the job is submitted all the same
        _warn(f"warning: printing the summary failed ({exc!r}); job {job_id} (run {run_id}) is submitted and "
              f"followed: `{watch_cmd}` will follow it.")
        return 0

    if not args.wait:
        return 0
    print(f"waiting for job {job_id} ...", flush=True)
    # Either executor: the run's true end, as the ledger records it, repaired on the way by a watcher (our own
    # when none runs), with its progress shown (-q: none).
    from hpc_agent.watcher.submit_wait import wait_run

    state, job_id, _ = wait_run(runs_root, run_id, args.wait_timeout)
    logs = log_paths(run_dir, job_id, cfg.slurm.tasks_per_node * (cfg.slurm.nodes if kind == "slurm" else 1))
    print(f"job {job_id} finished: {state}")
    if logs[0].exists():
        try:
            tail = rundir.read_tail(logs[0], 64 << 10)[0].splitlines()[-10:]
            print("log tail:\n  " + "\n  ".join(tail))
        except OSError as exc:  # the job can make its log a FIFO or a link: not read
            print(f"log tail: not read ({exc})")
    if state == "COMPLETED":
        return 0
    # Not just an exit code: why it ended and what to do (python -m hpc_agent.diagnose). A local job by its run
    # (its id is a process id, which diagnose would take for a Slurm job's).
    from hpc_agent import diagnose

    print("diagnosis:", flush=True)
    diagnose.main([job_id if kind == "slurm" else run_id, "--runs-root", str(runs_root), *passthrough(args)])
    return EXIT_JOB_FAILED


if __name__ == "__main__":
    sys.exit(invocation.run(main))

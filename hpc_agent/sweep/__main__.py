"""python -m hpc_agent.sweep CONFIG SWEEP.yaml [key=value ...] [--trials N] [--parallel K] [--dry-run]

Adaptive hyperparameter search over ordinary runs: random start-up trials, then TPE; trials are submitted
as Slurm job arrays (at most K running) and followed through their TensorBoard logs, where a median or
Hyperband pruner stops hopeless ones (scancel; recorded as pruned). The study lives in Optuna storage:
``<runs root>/sweeps/<name>/study.db`` by default, or the sweep file's ``storage:`` URL. Running the same
command again resumes the study; trials still running are adopted, none is asked twice.

Kill switch: ``python -m hpc_agent.watch --pause`` on the runs root (or ``--pause`` here, the same switch for
the runs root the config names) stops the watcher and this driver: the driver checks it at every poll and
right before every submission, release and cancel, and exits 5 with its state kept; after ``--resume`` the
same command continues. Exit codes: 0 done (or stopped by a signal), 2 bad config or not a runs root,
3 Slurm error, 4 another driver runs this sweep, 5 paused.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
from pathlib import Path
from typing import Optional, Sequence

from hpc_agent.cli import exit_status, invocation
from hpc_agent.cli.flags import add_common_arguments, configure
from hpc_agent.config.load import load_config, to_yaml
from hpc_agent.config.problems import ConfigError, Problem
from hpc_agent.config.profile import PROFILE_ENV
from hpc_agent.core import rundir
from hpc_agent.core.extras import MissingExtra, require
from hpc_agent.slurm.cli import SlurmCLI, SlurmError
from hpc_agent.state import killswitch
from hpc_agent.sweep.spec import SweepSpec, parse_spec, trial_overrides, trial_run_id

EXIT_OK, EXIT_CONFIG, EXIT_SLURM, EXIT_LOCKED, EXIT_PAUSED = (exit_status.OK, exit_status.USAGE, exit_status.SLURM,
                                                            exit_status.BUSY, exit_status.PAUSED)
SWEEPS_DIR = "sweeps"
FEATURE = "python -m hpc_agent.sweep"


def optuna_module():
    """Optuna, from the ``sweep`` extra; MissingExtra (one line naming the extra) when it is absent."""
    return require("optuna", "sweep", FEATURE)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=invocation.prog("sweep"),
        description="Hyperparameter sweep: random start-up trials, then TPE, with pruning; trials run as "
                    "Slurm job arrays and are followed (and repaired) by the watcher like any run.",
        epilog="Example: python -m hpc_agent.sweep quickstart configs/sweep_classifier.yaml --trials 8 --parallel 2\n"
               "A watcher running on the runs root is used; without one the driver runs its own.\n"
               "Exit codes: 0 done or stopped, 2 invalid config or not a runs root, 3 Slurm error, "
               "4 another driver runs this sweep, 5 paused (the kill switch; run again after --resume).",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="training config: a path or a name in configs/ (e.g. quickstart)")
    parser.add_argument("sweep", help="sweep file (YAML): objective, params, trials, parallel, pruner")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="fixed config overrides for every trial")
    parser.add_argument("--trials", type=int, help="total trials in the study (overrides the sweep file)")
    parser.add_argument("--parallel", type=int, help="trials running at once (overrides the sweep file)")
    parser.add_argument("--storage", help="Optuna storage URL (overrides the sweep file; default sqlite in the sweep dir)")
    parser.add_argument("--poll", type=float, default=2.0, help="seconds between polls (default 2)")
    parser.add_argument("--profile", metavar="NAME", help="a cluster profile under every trial's config (default: "
                        "$HPC_AGENT_PROFILE; give it again to resume the sweep); docs/profiles.md")
    parser.add_argument("--dry-run", action="store_true", help="validate, print the space and one sample trial's "
                                                                "config; create and submit nothing")
    switch = parser.add_mutually_exclusive_group()
    switch.add_argument("--pause", action="store_true", help="kill switch for the config's runs root (the same as "
                                                             "python -m hpc_agent.watch --pause): then exit")
    switch.add_argument("--resume", action="store_true", help="lift --pause, then exit")
    return add_common_arguments(parser, slurm=True)


def load_spec(path: str, trials: Optional[int], parallel: Optional[int], storage: Optional[str]) -> SweepSpec:
    from hpc_agent.config.yaml_safe import load_file

    file = Path(path)
    if not file.is_file():
        raise ConfigError([Problem("SWEEP", path, "an existing sweep YAML file")])
    data = load_file(file)  # the configs' safe reader: bounded, no aliases/tags; errors name file:line:column
    spec = parse_spec(data, default_name=file.stem)
    problems = [Problem(f"--{n}", v, "1 or more") for n, v in (("trials", trials), ("parallel", parallel))
                if v is not None and v < 1]
    if problems:
        raise ConfigError(problems)
    return dataclasses.replace(spec, trials=trials or spec.trials, parallel=parallel or spec.parallel,
                               storage=storage or spec.storage)


def storage_url(spec: SweepSpec, sweep_dir: Path) -> str:
    return spec.storage or f"sqlite:///{sweep_dir / 'study.db'}"


def open_study(spec: SweepSpec, url: str, max_steps: int):
    optuna = optuna_module()

    from hpc_agent.sweep.spec import make_pruner, make_sampler

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=spec.name, storage=url, direction=spec.direction, load_if_exists=True,
                                sampler=make_sampler(spec), pruner=make_pruner(spec, max_steps))
    existing = len(study.get_trials(deepcopy=False))
    if existing:  # resuming: a fresh random stream, not a replay of the first run's
        study.sampler = make_sampler(spec, trials_so_far=existing)
    return study


def start_study(spec: SweepSpec, args, url: str, sweep_dir: Path, runs_root: Path, max_steps: int):
    """Open (or create) the study, then publish ``sweep.json``, which readers use to find it.

    In this order because a reader that opens an Optuna storage creates its tables: one that found
    ``sweep.json`` before the study existed raced the driver's own table creation, and the loser
    failed with "table ... already exists" (seen as a sweep driver dying at start-up while a
    review polled it).
    """
    from hpc_agent.core.fsutil import atomic_write_json
    from hpc_agent.sweep.trials_table import SWEEP_FILE

    study = open_study(spec, url, max_steps)
    atomic_write_json(sweep_dir / SWEEP_FILE, {
        "name": spec.name, "config": args.config, "overrides": args.overrides, "storage": url, "tag": spec.tag,
        "direction": spec.direction, "trials": spec.trials, "parallel": spec.parallel,
        "startup_trials": spec.startup_trials, "pruner": spec.pruner.kind, "runs_root": str(runs_root)})
    return study


def dry_run(spec: SweepSpec, args, runs_root: Path, sweep_dir: Path) -> int:
    optuna = optuna_module()

    from hpc_agent.sweep.spec import distributions

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    print(f"# Sweep {spec.name}: {spec.trials} trials, {spec.parallel} at once, {spec.startup_trials} random "
          f"start-up trials then TPE; {spec.direction} {spec.tag}; pruner {spec.pruner.kind}")
    print(f"# sweep dir {sweep_dir}; storage {storage_url(spec, sweep_dir)}")
    dists = distributions(spec)
    for key, dist in dists.items():
        print(f"  {key}: {dist}")
    study = optuna.create_study(direction=spec.direction, sampler=optuna.samplers.RandomSampler(seed=spec.seed))
    sample = study.ask(dists).params
    overrides = trial_overrides(spec, sample, trial_run_id(spec.name, 0), str(runs_root), fixed=args.overrides)
    cfg = load_config(args.config, overrides)  # every sampled key must be a valid config key and value
    print(f"# A sample trial's overrides: {' '.join(overrides)}")
    print(to_yaml(cfg))
    print("# Dry run: nothing was created or submitted.")
    return EXIT_OK


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_intermixed_args(argv)
    configure(args)
    if args.profile is not None:  # every load_config of this process (each trial's) reads it from here
        os.environ[PROFILE_ENV] = args.profile
    try:
        optuna_module()  # first: without the sweep extra no sweep can run, whatever the arguments
    except MissingExtra as exc:
        print(exc, file=sys.stderr)
        return EXIT_CONFIG
    try:
        spec = load_spec(args.sweep, args.trials, args.parallel, args.storage)
        base = load_config(args.config, args.overrides)
        runs_root = Path(base.run.runs_root).expanduser().resolve()
        sweep_dir = runs_root / SWEEPS_DIR / spec.name
        if args.pause or args.resume:
            return killswitch.switch(runs_root, pause=args.pause)
        if args.dry_run:
            return dry_run(spec, args, runs_root, sweep_dir)
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        print("Nothing was submitted. Fix the values above and run the command again.", file=sys.stderr)
        return EXIT_CONFIG
    if not SlurmCLI.available():
        print("sbatch is not on PATH: sweeps run their trials on Slurm.", file=sys.stderr)
        return EXIT_SLURM

    from hpc_agent.core.filemodes import make_dir
    from hpc_agent.core.fsutil import hold_lock
    from hpc_agent.state.ledger import Ledger
    from hpc_agent.sweep.driver import SweepDriver

    make_dir(rundir.slurm_dir(sweep_dir))  # 0700 (0750 in a group-shared runs root), whatever the umask
    lock = hold_lock(sweep_dir / "driver.lock")  # one driver per sweep: two would ask twice as many trials
    if lock is None:
        print(f"another sweep driver runs on {sweep_dir} (driver.lock is held)", file=sys.stderr)
        return EXIT_LOCKED
    url = storage_url(spec, sweep_dir)
    study = start_study(spec, args, url, sweep_dir, runs_root, base.train.max_steps)
    stop = {"now": False}

    def request_stop(signum, frame):
        stop["now"] = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    ledger = Ledger.in_runs_root(runs_root)
    driver = SweepDriver(spec, study, config=args.config, cli_overrides=args.overrides, sweep_dir=sweep_dir,
                         runs_root=runs_root, ledger=ledger, slurm=SlurmCLI())
    from hpc_agent.sweep.live import SweepLive, summary

    live = SweepLive(driver, driver.slurm, poll_s=args.poll)  # our own watcher when none holds the root
    driver.say(f"study {spec.name} in {url}: {len(study.trials)} trial(s) so far, budget {spec.trials}, "
               f"{spec.parallel} at once")
    try:
        driver.run(poll_s=args.poll, stop=lambda: stop["now"], on_poll=live)
    except killswitch.Paused as exc:
        print(f"{exc}. Trials already in Slurm keep running; nothing was half-done. To continue: "
              f"python -m hpc_agent.watch --resume --runs-root {runs_root}, then run this command again.",
              file=sys.stderr)
        return EXIT_PAUSED
    except SlurmError as exc:
        print(f"Slurm error: {exc}", file=sys.stderr)
        return EXIT_SLURM
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        return EXIT_CONFIG
    finally:
        live.close()
        counts = summary(driver)  # the study's states and the runs' phases, read before the ledger closes
        ledger.close()
    if stop["now"] and not driver.finished():
        driver.say(f"stopped; running trials keep running. Run the same command again to resume. {counts}")
        return EXIT_OK
    print(f"[sweep] done: {counts}", flush=True)  # the result: printed, so -q (which silences progress) keeps it
    try:
        best = study.best_trial
        driver.say(f"best: trial {best.number} {spec.tag} = {best.value:.4g} {best.params}")
    except ValueError:
        driver.say("no trial completed")
    print(f"review: python -m hpc_agent.review {sweep_dir}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(invocation.run(main))

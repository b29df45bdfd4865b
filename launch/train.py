"""Training entry point, one process per rank: parse, build, train, close.

    python -m launch.train CONFIG_SNAPSHOT RUN_DIR

Inside a job ``launch.job.TrainingJob`` calls :func:`main` in every task of the srun step. The
return value is the exit code (table in ``hpc_agent/core/exit_codes.py`` and ``docs/exit_codes.md``). The work
itself is in ``launch/engine.py``; this file only wires the pieces and maps failures to exit codes.
"""
from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

from hpc_agent.core.exit_codes import (EXIT_CONFIG, EXIT_DIVERGED, EXIT_ENVIRONMENT, EXIT_OK, EXIT_OUT_OF_MEMORY,
                                       EXIT_SIGNALLED_AFTER_CHECKPOINT, EXIT_UNAVAILABLE)
from launch import console, heartbeat, startup
from launch.signals import StopRequest, hand_back_to_slurm


def say(text: str) -> None:
    print(f"[hpc_agent] {text}", flush=True)


def main(config_path: str, run_dir: str) -> int:
    # Our handlers replace submitit's before anything slow happens; a signal that arrives during
    # start-up is remembered and acted on at the first micro-step.
    stop = StopRequest().install()
    heartbeat.start(Path(run_dir))  # first: a stall in the imports or the rendezvous shows as "starting"
    try:
        with console.buffered_stdout():  # the step lines go out together (launch/console.py)
            code = _main(config_path, run_dir, stop)
    finally:
        heartbeat.stop()  # the final beat; ~2 ms, never waits on a dead file system (launch/heartbeat.py)
        stop.uninstall()
    if code == EXIT_SIGNALLED_AFTER_CHECKPOINT:
        code = hand_back_to_slurm(stop.signum, say, lead_s=_signal_lead_s(config_path), reason=stop.reason)
        if os.environ.get("SLURM_JOB_ID"):
            # The checkpoint is complete and Slurm has the job back; skip the interpreter's teardown (torch,
            # DeepSpeed, gloo threads). The nodes stay COMPLETING, held from the preempting job and the resumed
            # attempt, until every task is gone: scripts/bench/recovery.py measured the step ending 2.3 s
            # after the requeue with this exit and 3.3 s without.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return code


def _main(config_path: str, run_dir: str, stop: StopRequest) -> int:
    from hpc_agent.core.extras import MissingExtra
    from launch.ops import OpNotPrepared

    try:
        return _train(config_path, run_dir, stop)
    except (OpNotPrepared, MissingExtra) as exc:
        # Raised before the first collective on every rank alike (the comm op loads before the rendezvous),
        # so exiting here cannot leave a peer waiting. One line: log diagnosis shows it as the evidence.
        say(f"environment problem: {exc}; exiting {EXIT_ENVIRONMENT}")
        return EXIT_ENVIRONMENT


def _train(config_path: str, run_dir: str, stop: StopRequest) -> int:
    from hpc_agent.config.load import load_snapshot, to_yaml
    from hpc_agent.config.problems import ConfigError

    try:
        cfg = load_snapshot(config_path)
    except ConfigError as exc:
        say(f"invalid config snapshot {config_path}:\n{exc}\nexiting {EXIT_CONFIG}")
        return EXIT_CONFIG
    heartbeat.current().set_interval(cfg.resilience.heartbeat_s)
    startup.import_heavy_modules()  # ~1 s sooner with the garbage collector paused (launch/startup.py)

    import torch

    from hpc_agent.core.code_manifest import activate
    from launch import distributed
    from launch.dsconfig import PrecisionUnavailable, resolve_precision

    denv = distributed.detect()
    try:  # before the workload is imported: every attempt runs the code taken at submit
        snap = activate(cfg, Path(run_dir))
    except (OSError, ValueError) as exc:
        say(f"code snapshot of {run_dir} unreadable ({exc}); submit again; exiting {EXIT_CONFIG}")
        return EXIT_CONFIG
    if snap is not None and denv.rank == 0:
        say(f"code snapshot {snap.get('path')} (sha256 {str(snap.get('sha256'))[:12]}, {snap.get('files')} files) "
            "first on the import path")
    on_cuda = torch.cuda.is_available()
    try:
        precision, note = resolve_precision(cfg.train.precision, on_cuda)
    except PrecisionUnavailable as exc:
        say(f"{exc} Exiting {EXIT_UNAVAILABLE}.")
        return EXIT_UNAVAILABLE
    backend = distributed.init(denv, on_cuda)
    # One line per rank in the "[rank R/W] host=H" form that log diagnosis maps ranks to nodes with.
    print(f"[rank {denv.rank}/{denv.world_size}] host={os.environ.get('SLURMD_NODENAME') or os.uname().nodename} "
          f"job={os.environ.get('SLURM_JOB_ID', 'local')} local_rank={denv.local_rank} "
          f"master={denv.master_addr}:{denv.master_port} ({denv.source}) backend={backend}", flush=True)
    if denv.rank == 0:
        say(note)

    # One live attempt per run directory (launch/lease.py): before anything is written into it.
    from launch import lease as run_lease

    device = torch.device("cuda", denv.local_rank) if on_cuda else torch.device("cpu")
    refused, lease = run_lease.take(Path(run_dir), denv.rank, distributed.Collectives(device).broadcast_object,
                                    stop, say)
    if refused is not None:
        heartbeat.stop(final_phase=None)  # the lease holder's heartbeat is the one that counts here
        distributed.shutdown()  # every rank got the same answer: a clean teardown cannot hang
        return refused
    try:
        return _run(cfg, run_dir, denv, on_cuda, precision, stop, to_yaml(cfg))
    finally:
        if lease is not None:
            lease.release()


def _run(cfg, run_dir: str, denv, on_cuda: bool, precision: str, stop: StopRequest, config_text: str) -> int:
    import torch

    from launch import distributed
    from launch.engine import Trainer

    from launch.workloads.user import WorkloadError

    trainer = Trainer(cfg, Path(run_dir), denv, on_cuda, precision, stop, config_text)
    phase = "start-up"
    try:
        code = trainer.setup()
        if code == EXIT_OK:
            phase = "training"
            code = trainer.train()
    except WorkloadError as exc:
        # train.workload names code that cannot be used: the same on every rank, and no retry can fix it.
        say(f"workload problem: {exc.line()}; exiting {EXIT_CONFIG}")
        code = EXIT_CONFIG
    except torch.OutOfMemoryError:
        traceback.print_exc()
        say(f"out of memory at step {trainer.step + 1} during {phase} (micro_batch_size "
            f"{cfg.train.micro_batch_size}, ZeRO-{cfg.train.zero_stage}); exiting {EXIT_OUT_OF_MEMORY}")
        code = EXIT_OUT_OF_MEMORY
    finally:
        trainer.close()
    if code in (EXIT_OK, EXIT_SIGNALLED_AFTER_CHECKPOINT, EXIT_DIVERGED, EXIT_CONFIG):
        # Every rank reached the same decision, so a clean teardown cannot hang. After an OOM or a
        # crash we skip it: a peer may be stuck in a collective.
        distributed.shutdown()
    return code


def _signal_lead_s(config_path: str) -> int:
    from hpc_agent.config.load import load_snapshot

    try:
        return load_snapshot(config_path).slurm.signal_lead_s
    except Exception:  # noqa: BLE001 - only used to word a log line; the default lead is fine
        return 120


def cli(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m launch.train CONFIG_SNAPSHOT RUN_DIR", file=sys.stderr)
        return EXIT_CONFIG
    return main(argv[0], argv[1])


if __name__ == "__main__":
    sys.exit(cli())

"""Helpers for your own training script in command mode (``train.command``; docs/your_script.md).

    from launch import script_api as hpc

Every helper is optional: a script that calls none still gets requeued after a preemption, resubmitted
with a smaller micro batch after an out-of-memory (through ``$HPC_AGENT_DS_CONFIG``) and diagnosed. Each one
does what the built-in training does, with the same code:

* :func:`context`: where things are (the environment ``launch.command`` sets before it execs the script);
* :func:`init_distributed`: the process group the built-in way (NCCL on GPUs, gloo on the CPU; DeepSpeed ops
  are loaded prepared, never compiled in a job: ``launch/ops.py``);
* :func:`install_signal_handler`: SIGUSR2/SIGTERM only set a flag (``launch/signals.py``); ``.requested`` is
  agreed by every rank (one all-reduce), so all ranks stop at the same step;
* :func:`report_step`: the heartbeat the watcher's hang detection and review's live view read
  (``launch/heartbeat.py``); a script that never calls it is never judged hung;
* :func:`load_checkpoint` / :func:`save_checkpoint`: the newest *complete* checkpoint and a save with the
  completion marker (``launch/checkpoint.py``, ``launch/resume.py``), so the watcher and a built-in resume
  count it; a changed ZeRO stage or rank count loads through a universal checkpoint as built-in;
* :func:`exit_for_requeue`: after the signal's checkpoint, hand the job back to Slurm the built-in way
  (``launch.signals.hand_back_to_slurm``: after SIGUSR2 rank 0 leaves the marker and the batch shell
  requeues; after SIGTERM it waits for Slurm) and exit.

No import of torch at module level: ``context()`` works anywhere.
"""
from __future__ import annotations

import atexit
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Mapping, NoReturn, Optional

from launch.command import ENV_CKPT_DIR, ENV_CONFIG, ENV_DS_CONFIG, ENV_RESUME_TAG, ENV_RUN_DIR


def say(text: str) -> None:
    print(f"[hpc_agent] {text}", flush=True)


@dataclass(frozen=True)
class Context:
    ds_config: str     # the DeepSpeed config JSON for this attempt (pass it to deepspeed.initialize)
    run_dir: str
    ckpt_dir: str
    resume_tag: str    # the newest complete checkpoint's tag, "" when starting fresh
    rank: int
    world_size: int
    local_rank: int
    config: str        # hpc_agent's config snapshot (YAML)


def context(environ: Mapping[str, str] = os.environ) -> Context:
    missing = [k for k in (ENV_DS_CONFIG, ENV_RUN_DIR, ENV_CKPT_DIR) if not environ.get(k)]
    if missing:
        raise RuntimeError(f"{', '.join(missing)} not set: run this script through hpc_agent's train.command "
                           "(docs/your_script.md)")
    return Context(environ[ENV_DS_CONFIG], environ[ENV_RUN_DIR], environ[ENV_CKPT_DIR], environ.get(ENV_RESUME_TAG, ""),
                   int(environ.get("RANK", 0)), int(environ.get("WORLD_SIZE", 1)), int(environ.get("LOCAL_RANK", 0)),
                   environ.get(ENV_CONFIG, ""))


_state: Dict[str, Any] = {}  # per process: config, collectives, heartbeat clock, stop request


def _cfg():
    if "cfg" not in _state:
        from hpc_agent.config.load import load_snapshot

        _state["cfg"] = load_snapshot(context().config)
    return _state["cfg"]


def _on_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _coll():
    """The built-in collectives (``launch.distributed.Collectives``) on this rank's device."""
    if "coll" not in _state:
        import torch

        from launch.distributed import Collectives

        ctx = context()
        device = torch.device("cuda", ctx.local_rank) if _on_cuda() else torch.device("cpu")
        _state["coll"] = Collectives(device)
    return _state["coll"]


def init_distributed(timeout_s: float = 600.0) -> str:
    """Initialise torch.distributed through DeepSpeed as the built-in training does; returns the backend."""
    from launch import distributed

    ctx = context()
    env = distributed.DistEnv(ctx.rank, ctx.world_size, ctx.local_rank, os.environ.get("MASTER_ADDR", "127.0.0.1"),
                              int(os.environ.get("MASTER_PORT", 0)) or distributed.free_port(), "command mode")
    return distributed.init(env, _on_cuda(), timeout_s)


class Signals:
    """What :func:`install_signal_handler` returns. ``requested``: a stop was asked on any rank (a collective
    when more than one rank runs: read it at the same point on every rank)."""

    def __init__(self, stop: Any):
        self.stop = stop

    @property
    def signum(self) -> int:
        return self.stop.signum

    @property
    def requested(self) -> bool:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            return bool(self.stop.agreed(_coll().max_int))
        return bool(self.stop.signum)


def install_signal_handler() -> Signals:
    from launch.signals import StopRequest

    if "stop" not in _state:
        _state["stop"] = Signals(StopRequest().install())
    return _state["stop"]


def _heartbeat():
    """This process's heartbeat, started at the first helper that reports progress (never before: a script
    that reports nothing must not leave a beat that stops, which would read as a hang)."""
    from launch import heartbeat

    if "beat_at" not in _state:
        beat = heartbeat.start(Path(context().run_dir))
        beat.set_interval(_cfg().resilience.heartbeat_s)
        atexit.register(heartbeat.stop)
        _state["beat_at"] = time.monotonic()
    return heartbeat.current()


def report_step(step: int, loss: Optional[float] = None) -> None:
    """Optimizer step ``step`` is done: the heartbeat moves on; rank 0 logs it every ``train.log_every`` steps
    in the built-in's line format (``[hpc_agent] step N loss X ...``, which log diagnosis reads)."""
    beat = _heartbeat()
    now = time.monotonic()
    seconds, _state["beat_at"] = now - _state["beat_at"], now
    beat.stepped(int(step), seconds)
    every = max(1, int(_cfg().train.log_every))
    if context().rank == 0 and step % every == 0:
        shown = f"{loss:.8f}" if loss is not None and math.isfinite(float(loss)) else str(loss)
        say(f"step {step} loss {shown} step_time {seconds:.3f}s")
        # The built-in's tags, so review's plots and ETTR and the watcher's divergence alarms read this run too.
        _tb(step).scalars({"train/loss": None if loss is None else float(loss), "perf/step_time_s": seconds}, step)


def _tb(step: int) -> Any:
    """Rank 0's TensorBoard writer for this attempt, opened at the first reported step: steps before it were
    logged by the attempt whose checkpoint this one resumed from (launch/tblog.py drops what they ran past it)."""
    if "tb" not in _state:
        from hpc_agent.config.load import to_yaml
        from launch.tblog import TBLog

        start = int(_state.get("resumed_at", step - 1))
        _state["tb"] = TBLog(Path(context().run_dir), context().rank, start, to_yaml(_cfg()))
    return _state["tb"]


def _layout() -> Dict[str, Any]:
    from launch import universal
    from launch.dsconfig import resolve_precision

    return universal.layout_of(_cfg().train, context().world_size, resolve_precision(_cfg().train.precision,
                                                                                      _on_cuda())[0])


def load_checkpoint(engine: Any) -> int:
    """Load the newest complete checkpoint (``context().resume_tag``) into the DeepSpeed engine; returns its
    step, 0 when starting fresh. Call it on every rank, right after ``deepspeed.initialize``."""
    from hpc_agent.core.checkpoint_format import read_candidate
    from launch import resume

    ctx = context()
    beat = _heartbeat()
    beat.phase("loading")
    step = 0
    if ctx.resume_tag:
        found = read_candidate(Path(ctx.ckpt_dir) / ctx.resume_tag)
        choice = {"name": ctx.resume_tag, "layout": found.marker.get("layout") if found is not None else None}
        names = [n for n, p in engine.module.named_parameters() if p.requires_grad]
        source = resume.prepare(Path(ctx.ckpt_dir), choice, _layout(), names, ctx.rank, _coll().barrier, _say0)
        if source is None:
            raise RuntimeError(f"cannot resume from {ctx.resume_tag}: the layout change cannot be honoured (above)")
        step = resume.load(engine, source, float(_cfg().train.lr), int(_cfg().train.seed), ctx.rank, ctx.world_size,
                           _on_cuda(), _coll().barrier, _say0)
    beat.resumed_at(step)
    _state["resumed_at"] = step
    beat.phase("training")
    _state["beat_at"] = time.monotonic()
    return step


def _say0(text: str) -> None:
    if context().rank == 0:
        say(text)


def save_checkpoint(engine: Any, step: int) -> str:
    """A complete checkpoint of ``step`` (every rank calls it at the same step); returns its tag. Keeps the
    newest ``train.keep_checkpoints``, as built-in."""
    from launch import checkpoint
    from launch.rng import rng_state

    ctx = context()
    beat = _heartbeat()
    beat.phase("saving")
    layout = _layout()
    global_batch = layout["micro_batch_size"] * layout["grad_accum_steps"] * layout["world_size"]
    client = {"step": int(step), "data_position": int(step) * global_batch, "layout": layout,
              "rng": _coll().gather_objects(rng_state(_on_cuda()))}
    root = Path(ctx.ckpt_dir)
    tag, seconds = checkpoint.save(engine, root, int(step), client, layout, ctx.rank, _coll().barrier,
                                   _coll().gather_objects)
    if ctx.rank == 0:
        deleted = checkpoint.apply_retention(root, int(_cfg().train.keep_checkpoints))
        say(f"checkpoint {tag} complete in {seconds:.1f}s" + (f"; deleted {', '.join(deleted)}" if deleted else ""))
    beat.phase("training")
    return tag


def exit_for_requeue(signals: Optional[Signals] = None) -> NoReturn:
    """After the signal's checkpoint: hand the job back to Slurm as the built-in job does, then exit (75, or
    0 with rank 0's hand-back marker, which the batch shell turns into 75 and a requeue)."""
    from launch.signals import hand_back_to_slurm, signal_name

    signals = signals or _state.get("stop")
    signum = signals.signum if signals is not None else 0
    from launch import heartbeat

    heartbeat.stop()
    if context().rank == 0:
        say(f"signal {signal_name(signum)}: handing the job back to Slurm")
    code = hand_back_to_slurm(signum, say, lead_s=int(_cfg().slurm.signal_lead_s))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown (torch, gloo threads): Slurm frees the nodes sooner (launch/train.py)

"""The DeepSpeed training loop: build, resume, train, checkpoint, log.

Data: rank r at micro-step m of 0-based optimizer step s trains on samples
``s*G + (m*world + r)*mbs .. +mbs-1`` of the workload's global stream (``G = mbs*accum*world``), so
the data position is the step number and a resume under another mbs/accum split sees the same
samples in each optimizer step.

We drive the micro-steps ourselves and call ``engine.backward``/``engine.step`` on each: DeepSpeed
counts micro-steps and only reduces gradients, clips, updates and steps the LR scheduler at the
accumulation boundary (``backward`` also divides the loss by the accumulation steps).
"""
from __future__ import annotations

import functools
import os
import signal
import time
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from hpc_agent.core import rundir
from hpc_agent.core.checkpoint_format import tag_for
from hpc_agent.core.exit_codes import EXIT_CONFIG, EXIT_GPU_HEALTH_CRITICAL, EXIT_OK, EXIT_SIGNALLED_AFTER_CHECKPOINT
from hpc_agent.core.handback import STRAY
from hpc_agent.metrics.tb_reader import TB_FLUSH_EVERY_S
from launch import checkpoint, heartbeat, resume, universal
from launch.adaptive_loop import AdaptiveHolder, adapt
from launch.chaos_trigger import RuntimeTrigger
from launch.distributed import Collectives, DistEnv
from launch.dsconfig import build_ds_config
from launch.faults import Faults
from launch.gpu_monitor import GpuHealthMonitor, simulated_reader
from launch.lr_schedule import lr_factor
from launch.recovery import CONTINUE, InJobRecovery, agree, repair_in_place
from launch.rng import rng_state, seed as seed_rng
from launch.signals import StopRequest, own_job_id, say_usr2_reason, signal_name, usr2_reason
from launch.snapshot import Snapshots
from launch.tblog import TBLog, attempt_number, peak_memory_bytes


def say(text: str, flush: bool = True) -> None:
    print(f"[hpc_agent] {text}", flush=flush)


def _as_float(value: Any) -> Optional[float]:
    if value is None:
        return None
    return float(value.item() if hasattr(value, "item") else value)


def _loss_scale(engine: Any) -> Optional[float]:
    """FP16's current dynamic loss scale: ZeRO keeps it in ``loss_scaler``, the ZeRO-0 FP16 optimizers
    in ``loss_scale_config`` (DeepSpeed 0.19; older versions had ``cur_scale`` on the optimizer)."""
    opt = engine.optimizer
    for holder in (opt, getattr(opt, "loss_scaler", None), getattr(opt, "loss_scale_config", None)):
        value = getattr(holder, "cur_scale", None)
        if value is not None:
            return float(value)
    return None


class Trainer:
    def __init__(self, cfg: Any, run_dir: Path, denv: DistEnv, on_cuda: bool, precision: str,
                 stop: StopRequest, config_text: str):
        import torch

        self.cfg, self.t = cfg, cfg.train
        self.run_dir, self.denv, self.on_cuda, self.precision = Path(run_dir), denv, on_cuda, precision
        self.stop, self.config_text = stop, config_text
        self.checkpoint_requested = False  # a stray SIGUSR2 (_checkpoint_request): saved at the step's end
        self.rank, self.world = denv.rank, denv.world_size
        self.device = torch.device("cuda", denv.local_rank) if on_cuda else torch.device("cpu")
        self.coll = Collectives(self.device)
        self.ckpt_root = rundir.checkpoints_dir(self.run_dir)
        self.attempt = attempt_number(rundir.tb_dir(self.run_dir))
        # In-job repairs (launch/recovery.py); a requeued attempt starts with its job's earlier repairs.
        self.recovery = InJobRecovery(cfg, self.run_dir, self.rank, self.attempt, self.coll, say)
        self._configure(cfg, self.recovery.carried)
        # The check is a collective, so its schedule must be the same on every rank: with the simulated
        # fault it runs every step everywhere, while only rank 0 reads the simulated GPU.
        simulated = cfg.faults.gpu_critical_at_step if self.faults.armed else 0
        self.health = GpuHealthMonitor(1 if simulated else self.t.gpu_health_every, denv.local_rank,
                                       simulated_reader(simulated, lambda: self.step)
                                       if simulated and self.rank == 0 else None)
        # The chaos driver's run-time faults (chaos/inject.json); a no-op unless faults.runtime_trigger.
        self.trigger = RuntimeTrigger(self.run_dir, self.rank, bool(getattr(cfg.faults, "runtime_trigger", False)))
        self.snapshots = Snapshots(cfg.resilience.snapshot_every, self.ckpt_root, self.rank, self.world, self.layout,
                                   self.t.keep_checkpoints, self.coll.max_int, say)  # launch/snapshot.py
        # The adaptive LR schedule (adaptive:); None when off: the loop is exactly as without it.
        self.adaptive = AdaptiveHolder() if getattr(getattr(cfg, "adaptive", None), "enabled", False) else None
        self._eval_loss: Optional[Tuple[int, float]] = None
        self.engine: Any = None
        self.tb: Optional[TBLog] = None
        self.step = 0  # optimizer steps completed
        self.saved_step = -1  # last step with a complete checkpoint written or loaded by this attempt

    def _configure(self, cfg: Any, patch: Dict[str, Any]) -> None:
        """Adopt ``cfg`` with an in-job repair's ``patch`` (the global batch G stays what it was)."""
        if patch:
            from hpc_agent.config.load import apply_patch

            cfg = apply_patch(cfg, patch)
            if self.rank == 0:
                say("in-job repair settings: " + ", ".join(f"{k}={v}" for k, v in patch.items()))
        self.cfg, self.t = cfg, cfg.train
        self.layout = universal.layout_of(self.t, self.world, self.precision)
        self.G = self.t.micro_batch_size * self.t.grad_accum_steps * self.world
        self.faults = Faults(cfg.faults, self.t.micro_batch_size, self.rank, self.attempt)

    def _estimate_bytes(self) -> int:
        """The per-GPU memory estimate, only when a simulated GPU capacity (a fault) needs it."""
        if not self.faults.simulated_gib or self.t.workload != "gpt":
            return 0
        from hpc_agent.policy.memory import estimate_from_config

        return estimate_from_config(self.cfg).total_bytes

    # ---- build and resume --------------------------------------------------------------------
    def setup(self) -> int:
        """Build the workload and engine, resume if a checkpoint exists; returns an exit code (0 = go)."""
        code = self._build()
        if code != EXIT_OK or self.step >= self.t.max_steps:
            return code  # train() says so; no event file for an attempt that trains nothing
        self.tb = TBLog(self.run_dir, self.rank, self.step, self.config_text, flush_every_s=TB_FLUSH_EVERY_S)
        if self.rank == 0:
            say(f"attempt {self.tb.attempt}: training steps {self.step + 1}..{self.t.max_steps}, global batch "
                f"{self.G} = {self.t.micro_batch_size} x {self.t.grad_accum_steps} x {self.world} ranks, "
                f"ZeRO-{self.t.zero_stage}, {self.precision}, device {self.device}")
        return EXIT_OK

    def _build(self) -> int:
        """The workload, the engine, and the newest usable checkpoint loaded (at start-up and after an in-job
        repair); an exit code (0 = go)."""
        import deepspeed
        import torch
        from launch.workloads.registry import build_workload

        seed_rng(self.t.seed)
        self.workload = build_workload(self.cfg, self.device)
        model = self.workload.model
        self.faults.install(model, self._estimate_bytes())
        names = [n for n, p in model.named_parameters() if p.requires_grad]

        heartbeat.current().phase("loading")
        choice = resume.choose(self.ckpt_root, self.rank, self.coll.broadcast_object, say)
        source = resume.prepare(self.ckpt_root, choice, self.layout, names, self.rank, self.coll.barrier, say)
        if source is None:  # the layout change cannot be honoured (said)
            return EXIT_CONFIG

        ds_config = build_ds_config(self.t, world_size=self.world, precision=self.precision,
                                    on_cuda=self.on_cuda, load_universal=source.converted)
        if self.adaptive is None:
            schedule = functools.partial(lr_factor, warmup_steps=self.t.warmup_steps, total_steps=self.t.max_steps,
                                         min_lr_ratio=self.t.min_lr_ratio)
        else:
            # A plain closure reading the holder's current state (LambdaLR's state_dict does not save it).
            self.adaptive.restore({})  # no checkpoint (or a rollback before the first): the plain schedule
            schedule = self.adaptive.factor_for(self.t)
        self.engine, _, _, _ = deepspeed.initialize(
            model=model, model_parameters=[p for p in model.parameters() if p.requires_grad], config=ds_config,
            lr_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, schedule), dist_init_required=False)
        # FP32 ZeRO-0 uses the bare torch optimizer, which reports no gradient norm: we compute it.
        self.manual_grad_norm = self.t.zero_stage == 0 and self.precision == "fp32"
        seed_rng(self.t.seed + 1000 * self.rank)  # distinct dropout streams per rank from here on

        self.step, self.saved_step = 0, -1  # no checkpoint left (a rollback before the first): start over
        if source.tag is not None:
            self.step = self.saved_step = resume.load(
                self.engine, source, self.t.lr, self.t.seed, self.rank, self.world, self.on_cuda, self.coll.barrier,
                say, restore=None if self.adaptive is None else self.adaptive.restore)
        heartbeat.current().resumed_at(self.step)
        return EXIT_OK

    # ---- train -------------------------------------------------------------------------------
    def train(self) -> int:
        if self.step >= self.t.max_steps:
            if self.rank == 0:
                say(f"already trained {self.step} of {self.t.max_steps} steps: nothing to do")
            return EXIT_OK
        if self._gpu_health(self.step, first=True):
            return EXIT_GPU_HEALTH_CRITICAL
        while self.step < self.t.max_steps:  # an in-job repair moves self.step back to its checkpoint
            code = self._train_step(self.step + 1)
            if code is not None:
                return code
        self._evaluate(self.t.max_steps)
        self._save()
        if self.rank == 0:
            say(f"done: {self.t.max_steps} steps")
        return EXIT_OK

    def _train_step(self, step: int) -> Optional[int]:
        """One optimizer step (1-based); None to go on (also after an in-job repair), else the exit code."""
        import torch

        t, engine = self.t, self.engine
        self.faults.before_step(step)
        lr = engine.get_lr()[0]
        self.trigger.before_step(step, t.micro_batch_size, lr)  # a no-op unless faults.runtime_trigger
        started = time.perf_counter()
        skipped = getattr(engine, "skipped_steps", 0)
        loss_total, grad_norm = 0.0, None
        for m in range(t.grad_accum_steps):
            start = (step - 1) * self.G + (m * self.world + self.rank) * t.micro_batch_size
            batch = {k: v.to(self.device) for k, v in self.workload.batch(start, t.micro_batch_size).items()}
            oom = ""
            try:
                loss = self.trigger.loss(self.faults.loss(step, self.workload.loss(engine, batch)))
            except torch.OutOfMemoryError as exc:
                import traceback

                traceback.print_exc()
                oom, loss = str(exc), None
                del exc
            # After the forward: every rank learns whether one ran out of memory (launch/recovery.py).
            failed, signum = agree(self.stop, self.coll.max_int, bool(oom))
            if failed:
                return repair_in_place(self, self.recovery.oom_fault(step, oom))
            if signum and not self._checkpoint_request(signum):
                return self._save_and_exit()
            engine.backward(loss)
            if self.manual_grad_norm and engine.is_gradient_accumulation_boundary():
                grad_norm = self._grad_norm()
            engine.step()
            loss_total += float(loss.detach().float().item())
            # The micro-step's autograd graph is released here, inside the step, as part of its work (~0.1 ms on
            # P2's model): left to the frame's end it was counted as time between steps (docs/benchmarks.md).
            del loss, batch
        elapsed = time.perf_counter() - started
        loss_mean = self.coll.mean(loss_total / t.grad_accum_steps)
        scale = _loss_scale(engine) if self.precision == "fp16" else None
        fault = self.recovery.observe(step, loss_mean, scale, t.min_loss_scale)
        if fault is not None:
            code = repair_in_place(self, fault, loss_mean)
            if code is not CONTINUE:
                return code
        self.step = step
        heartbeat.current().stepped(step, elapsed)
        if grad_norm is None:
            grad_norm = _as_float(engine.get_global_grad_norm())
        skipped = getattr(engine, "skipped_steps", 0) != skipped  # an FP16 overflow: the update was skipped
        if step % t.log_every == 0 or step == t.max_steps:
            self._log(step, loss_mean, lr, grad_norm, elapsed)
        if self._gpu_health(step):
            return EXIT_GPU_HEALTH_CRITICAL
        if t.eval_every and step % t.eval_every == 0 and step != t.max_steps:
            self._evaluate(step)
        if self.adaptive is not None:  # after the evaluation, before the checkpoint of this step
            code = adapt(self, step, loss_mean, grad_norm, skipped)
            if code is not CONTINUE:
                return code  # None: rolled back (escalated), train on from self.step; else an exit code
        if step % t.ckpt_every == 0 and step != t.max_steps:
            if self.snapshots.every:
                self._save_in_background()
            else:
                self._save()
        if self.checkpoint_requested and step != t.max_steps:
            self.checkpoint_requested = False
            started = time.perf_counter()
            self._saved_on_disk()
            self._save()
            if self.rank == 0:
                say(f"checkpoint request (SIGUSR2) at step {step}: checkpoint {tag_for(step)} complete in "
                    f"{time.perf_counter() - started:.1f}s; training on")
        saved = step in (self.saved_step, t.max_steps)
        if self.snapshots.due(step, saved):
            self.tb.flush()  # the series on disk reaches every step a resume can start from (launch/tblog.py)
        self.snapshots.after_step(engine, step, self._client_state, saved=saved)
        return None

    def _gpu_health(self, step: int, first: bool = False) -> bool:
        """Read, log and agree on the GPUs' health when due; True means CRITICAL somewhere: stop now."""
        if not self.health.due(step, first):
            return False
        level, values, reasons = self.health.read()
        if values:  # the start check is logged at the attempt's first step: TBLog drops steps it resumed past
            self.tb.scalars(values, step + 1 if first else step)
        worst = self.coll.max_int(level)
        line = self.health.conclude(worst, reasons)
        if line:
            say(line + (f"; exiting {EXIT_GPU_HEALTH_CRITICAL} without a checkpoint" if worst >= 2 else ""))
        return worst >= 2

    def _grad_norm(self) -> float:
        import torch

        grads = [p.grad.detach().float().norm() for p in self.engine.module.parameters() if p.grad is not None]
        return float(torch.stack(grads).norm()) if grads else 0.0

    def _log(self, step: int, loss: float, lr: float, grad_norm: Optional[float], elapsed: float) -> None:
        samples = self.G / elapsed if elapsed > 0 else 0.0
        values = {"train/loss": loss, "train/lr": lr, "train/grad_norm": grad_norm,
                  "perf/samples_per_s": samples, "perf/tokens_per_s": samples * self.workload.tokens_per_sample,
                  "perf/step_time_s": elapsed, "perf/peak_mem_bytes": peak_memory_bytes(self.on_cuda)}
        if self.precision == "fp16":
            values["train/loss_scale"] = _loss_scale(self.engine)
        if self.adaptive is not None:
            values["adaptive/lr_scale"] = self.adaptive.state.lr_scale
        self.tb.scalars(values, step)
        if self.rank == 0:
            norm = f"{grad_norm:.4f}" if grad_norm is not None else "n/a"
            # "step N loss X": the form log-based diagnosis parses (NaN lines name their step). Not flushed: the
            # step lines go out together, with the next say() or within a second (launch/console.py).
            say(f"step {step} loss {loss:.8f} lr {lr:.3e} grad_norm {norm} step_time {elapsed:.3f}s "
                f"({step}/{self.t.max_steps})", flush=False)

    def _evaluate(self, step: int) -> None:
        # Every rank evaluates: under ZeRO-3 the forward pass gathers parameters collectively.
        heartbeat.current().phase("evaluating")
        metrics = self.workload.evaluate(self.engine)
        heartbeat.current().phase("training")
        if "eval/loss" in metrics:
            self._eval_loss = (step, float(metrics["eval/loss"]))
        self.tb.scalars(metrics, step)
        if self.rank == 0:
            say(f"eval at step {step}: " + ", ".join(f"{k} {v:.4f}" for k, v in sorted(metrics.items())))

    # ---- checkpoints -------------------------------------------------------------------------
    def _save(self) -> float:
        if self.saved_step == self.step:
            return 0.0
        heartbeat.current().phase("saving")
        self.tb.flush()
        self.snapshots.settle(abandon=bool(self.stop.signum))  # preempted: no waiting for a snapshot
        client = self._client_state()
        tag, seconds = checkpoint.save(self.engine, self.ckpt_root, self.step, client, self.layout, self.rank,
                                       self.coll.barrier, self.coll.gather_objects,
                                       before_marker=self.trigger.before_marker)
        self.saved_step = self.step
        heartbeat.current().phase("training")
        if self.rank == 0:
            deleted = checkpoint.apply_retention(self.ckpt_root, self.t.keep_checkpoints)
            say(f"checkpoint {tag} complete in {seconds:.1f}s" + (f"; deleted {', '.join(deleted)}" if deleted else ""))
        return seconds

    def _save_in_background(self) -> None:
        """The periodic checkpoint when snapshots are on: a host copy now, the write on the snapshot writer
        (launch/snapshot.py). ``saved_step`` counts it at once; every exit path waits for it (_saved_on_disk)."""
        heartbeat.current().phase("saving")  # seen only while it waits for a write still in flight
        self.tb.flush()
        self.snapshots.after_step(self.engine, self.step, self._client_state, full=True,
                                  before_marker=self.trigger.before_marker)
        self.saved_step = self.step
        heartbeat.current().phase("training")

    def _saved_on_disk(self) -> None:
        """Wait for a checkpoint still being written; if its write failed (on any rank), forget it, so the
        caller saves this step synchronously instead."""
        self.snapshots.settle(abandon=True)  # a snapshot in flight is abandoned, a checkpoint waited for
        failed = self.snapshots.failed_full is not None and self.snapshots.failed_full[0] == self.saved_step
        if self.snapshots.every and self.coll.max_int(int(failed)):
            self.saved_step, self.snapshots.failed_full = -1, None

    def _client_state(self) -> Dict[str, Any]:
        """What a checkpoint or snapshot saves beside DeepSpeed's state (a collective: every rank calls it)."""
        client = {"step": self.step, "data_position": self.step * self.G, "layout": self.layout,
                  "rng": self.coll.gather_objects(rng_state(self.on_cuda))}
        if self.adaptive is not None:
            client.update(self.adaptive.to_client())
        return client

    def _checkpoint_request(self, signum: int) -> bool:
        """Every rank alike (one broadcast): True when the agreed signal is a SIGUSR2 that Slurm did not send,
        neither its preemption notice nor its time-limit warning (``hpc_agent/slurm/usr2.py``): a person's
        ``scancel --signal=USR2``. It is taken as a checkpoint request: saved at this step's end, training goes
        on, and the job never hands over to a successor for it. Outside Slurm a SIGUSR2 stops the job as before."""
        job_id = own_job_id(os.environ)
        if signum != signal.SIGUSR2 or not job_id:
            return False
        reason = None
        if self.rank == 0:
            reason = usr2_reason(job_id, int(self.cfg.slurm.signal_lead_s))
            say_usr2_reason(*reason, say)
        reason = tuple(self.coll.broadcast_object(reason))
        if reason[0] != STRAY:
            self.stop.reason = reason  # rank 0's marker carries it to the batch shell (launch/signals.py)
            return False
        self.stop.forget()
        self.checkpoint_requested = True
        return True

    def _save_and_exit(self) -> int:
        name = signal_name(self.stop.signum)
        started = time.perf_counter()
        self._saved_on_disk()
        if self.step == 0:
            what = "nothing trained yet: no checkpoint"
        elif self.saved_step == self.step:
            what = f"checkpoint {tag_for(self.step)} already complete"
        else:
            self._save()
            what = f"checkpoint {tag_for(self.step)} complete"
        if self.rank == 0:
            say(f"signal {name} at step {self.step}: {what} in {time.perf_counter() - started:.1f}s; "
                f"exiting {EXIT_SIGNALLED_AFTER_CHECKPOINT}")
        return EXIT_SIGNALLED_AFTER_CHECKPOINT

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()

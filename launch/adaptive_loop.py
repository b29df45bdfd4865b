"""The adaptive LR schedule (``adaptive:``) in the training loop: the decision is the pure
``hpc_agent.policy.adaptive_lr.decide``; this module holds its state between steps and carries out what it decides.

- :class:`AdaptiveHolder` is the state: the current ``ScheduleState``, which the LR lambda reads at every
  scheduler step, and the trimmed series ``decide`` judges. All of it is saved in every checkpoint and
  snapshot (``to_client``) and restored by the resume (``restore``), so a resume decides exactly as the
  uninterrupted run.
- :func:`adapt` runs after the step's evaluation and before its checkpoint: it records the step's evidence,
  lets rank 0 decide (broadcast to the others), journals an adaptation, logs it to TensorBoard and sets the
  optimizer's LR for the next update; an escalation goes to the divergence rollback the job already has.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from launch.lr_schedule import lr_factor_adaptive, lr_factor_unscaled
from launch.recovery import CONTINUE, repair_in_place


def say(text: str) -> None:
    print(f"[hpc_agent] {text}", flush=True)


class AdaptiveHolder:
    """The adaptive schedule's mutable state (``adaptive:``; ``hpc_agent.policy.adaptive_lr``): the current
    ``ScheduleState``, which the LR lambda reads at every scheduler step, and the trimmed series ``decide``
    judges. All of it is saved in every checkpoint, so a resume decides exactly as the uninterrupted run."""

    def __init__(self) -> None:
        from hpc_agent.policy.adaptive_lr import ScheduleState

        self.state = ScheduleState()
        self.losses: List[Tuple[int, float]] = []
        self.norms: List[Tuple[int, float]] = []
        self.interval: List[float] = []  # plateau_metric train: the losses of the current log interval

    def factor_for(self, train: Any) -> Callable[[int], float]:
        """The LR lambda: a plain closure reading the current state (LambdaLR's state_dict does not save it)."""
        def factor(update: int) -> float:
            return lr_factor_adaptive(update, self.state, train.warmup_steps, train.max_steps, train.min_lr_ratio)

        return factor

    def to_client(self) -> Dict[str, Any]:
        return {"adaptive": self.state.to_dict(),
                "adaptive_history": {"losses": [list(p) for p in self.losses],
                                     "norms": [list(p) for p in self.norms], "interval": list(self.interval)}}

    def restore(self, client: Dict[str, Any]) -> None:
        """From a checkpoint's client state; one from before this feature (or none) starts afresh."""
        from hpc_agent.policy.adaptive_lr import ScheduleState

        self.state = ScheduleState.from_dict(client.get("adaptive"))
        history = client.get("adaptive_history") or {}
        self.losses = [(int(s), float(v)) for s, v in history.get("losses", [])]
        self.norms = [(int(s), float(v)) for s, v in history.get("norms", [])]
        self.interval = [float(v) for v in history.get("interval", [])]

    def record(self, step: int, loss: float, grad_norm: Optional[float], skipped: bool,
               eval_loss: Optional[Tuple[int, float]], train: Any, cfg: Any) -> None:
        """Step ``step``'s evidence: its gradient norm (not an FP16 overflow's), and a loss point (the mean of
        a log interval of training losses, or this step's evaluation), trimmed to what ``decide`` needs."""
        from hpc_agent.policy.adaptive_lr import trim_history

        if grad_norm is not None and not skipped:
            self.norms.append((step, float(grad_norm)))
        if cfg.plateau_metric == "train":
            self.interval.append(float(loss))
            if step % train.log_every == 0 or step == train.max_steps:
                self.losses.append((step, sum(self.interval) / len(self.interval)))
                self.interval = []
        elif eval_loss is not None and eval_loss[0] == step:
            self.losses.append(eval_loss)
        self.losses, self.norms = trim_history(self.losses, self.norms, cfg)


def adapt(tr: Any, step: int, loss: float, grad_norm: Optional[float], skipped: bool) -> Any:
    """Record step ``step``'s evidence, decide (rank 0; broadcast) and act on the trainer ``tr``: CONTINUE, or
    what an escalation's rollback returns (None: repaired, train on from ``tr.step``; else an exit code)."""
    from hpc_agent.policy.adaptive_lr import ESCALATE_ROLLBACK, decide
    from hpc_agent.core.causes import Cause
    from hpc_agent.metrics.alarm_kinds import GRAD_EXPLOSION
    from launch.recovery import Fault

    t, a, acfg = tr.t, tr.adaptive, tr.cfg.adaptive
    a.record(step, loss, grad_norm, skipped, tr._eval_loss, t, acfg)
    decided = None
    if tr.rank == 0:
        now = lr_factor_unscaled(step, a.state, t.warmup_steps, t.max_steps, t.min_lr_ratio)
        decided = decide(a.state, step, a.losses, a.norms, t.grad_clip, acfg, warmup_steps=t.warmup_steps,
                         total_steps=t.max_steps, lr_factor_now=now)
    if tr.world > 1:  # eval losses need not agree bit for bit across ranks: rank 0's decision holds
        decided = tr.coll.broadcast_object(decided)
    a.state, adaptation = decided
    if adaptation is None:
        return CONTINUE
    if tr.rank == 0:
        say(f"adaptive schedule at step {step}: {adaptation.kind}: {adaptation.reason}")
    tr.recovery.record_adaptation(adaptation)
    tr.tb.scalars({"adaptive/lr_scale": a.state.lr_scale, f"adaptive/{adaptation.kind}": 1.0}, step)
    if adaptation.kind == ESCALATE_ROLLBACK:
        return repair_in_place(tr, Fault(Cause.DIVERGED.value, step, GRAD_EXPLOSION, adaptation.reason,
                                         divergence_step=adaptation.since_step))
    # Update `step` already uses the new schedule (a restart starts where the LR is: only a decay changes it).
    sched = tr.engine.lr_scheduler
    factor = a.factor_for(t)(sched.last_epoch)
    for group, base in zip(sched.optimizer.param_groups, sched.base_lrs):
        group["lr"] = base * factor
    sched._last_lr = [group["lr"] for group in sched.optimizer.param_groups]
    return CONTINUE

"""Per-GPU memory estimate for a training config (pure arithmetic, no torch).

Model states per parameter (AdamW, DeepSpeed):

- mixed precision (fp16/bf16; ``auto`` counts as 16-bit, as on a GPU): 16-bit parameters 2 B, 16-bit
  gradients 2 B, optimizer states 16 B = fp32 master weights 4 + Adam moments 4 + 4 + the fp32 gradient
  partition the optimizer steps on 4. ZeRO-1/2 keep that fp32 gradient for the whole partition, as
  DeepSpeed's own estimator counts it; ZeRO-3 builds it per sub-group (default 1e9 parameters) during
  the step only, so it is counted in the ZeRO-3 working set below instead.
- fp32: parameters 4 B, gradients 4 B, optimizer states 8 B (the two moments; no master copy).

ZeRO sharding across ``world_size`` ranks: stage 1 shards the optimizer states, stage 2 also the
gradients, stage 3 also the parameters. Stage 3 also needs a working set per rank: the gathered
(parameter + gradient) copy of the largest layer (one transformer block) during forward/backward, or the
fp32 gradient of one optimizer sub-group during the step, whichever is larger (never both at once).
Offload: ``optimizer`` moves the optimizer states to host memory; ``optimizer+params`` (ZeRO-3) also moves
the parameter shard. Host bytes are reported per rank, separately.

Activations per transformer layer (Korthikanti et al. 2022, no sequence parallelism), 16-bit:
``34*s*b*h`` bytes (s sequence, b micro-batch, h width), twice that for fp32. The paper's extra
``5*a*s/h`` term is the ``a x s x s`` attention-score matrix of unfused attention; the gpt workload's
``scaled_dot_product_attention`` runs fused kernels that never store it (measured on an H200: doubling
the sequence at the same tokens per batch moved the peak by 0.2 %). With activation checkpointing: each
layer's 16-bit input ``2*s*b*h`` is kept, plus one layer's full activations during its recomputation.
The output head adds fp32 logits and their gradient, ``2*4*s*b*vocab``.

DeepSpeed's gradient-reduction bucket (ZeRO 1-3): one buffer of ``train.reduce_bucket_size`` elements
(5e8 by default) in the 16-bit type (fp32 for fp32 training) on every GPU, whatever the model's size:
1 GB at the default, a large share of a small model's peak.

The peak is the larger of two phases (the model states above are never all alive with the activations):

- forward/backward: parameters, optimizer states without the step's fp32 gradient, the ZeRO-3 gathered
  layer, the bucket and the activations. The peak is where backward starts, when the activations are
  all alive and almost no gradient is yet;
- the optimizer step: every model state above (gradients and fp32 gradient included) and the bucket.

Measured against ``torch.cuda.max_memory_allocated`` of FP16 runs on an H200 (scripts/bench/gpu_memory.py,
results/gpu/): the estimate is 0.96-1.05 of the peak across 9 sizes, ZeRO 1/2/3 and checkpointing. The
CUDA context (outside that peak), temporary buffers and allocator fragmentation are not counted.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Dict, List, Mapping, Optional, Tuple

from hpc_agent.config.schema import REDUCE_BUCKET_SIZE

GPT_VOCAB = 256
ZERO3_SUB_GROUP_SIZE = 1_000_000_000  # DeepSpeed's default stage3 sub_group_size


@dataclass(frozen=True)
class Estimate:
    """Bytes per GPU (per rank), and per-rank host bytes for offloaded states."""

    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    gathered_bytes: int
    """ZeRO-3 only: the working set, the larger of the gathered parameters + gradients of the largest layer
    and one optimizer sub-group's fp32 gradient."""
    activation_bytes: int
    host_bytes: int
    assumptions: List[str] = field(default_factory=list)
    buffer_bytes: int = 0
    """DeepSpeed's gradient-reduction bucket, allocated at its full size in both phases."""
    step_only_bytes: int = 0
    """Part of the optimizer states and ZeRO-3 working set that exists only during the optimizer step
    (the fp32 gradient partition)."""

    @property
    def model_state_bytes(self) -> int:
        """GPU bytes of parameters, gradients, optimizer states and the ZeRO-3 working set."""
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes + self.gathered_bytes

    @property
    def forward_backward_bytes(self) -> int:
        """The peak as backward starts: no gradients yet, every activation alive."""
        return (self.model_state_bytes - self.grads_bytes - self.step_only_bytes + self.buffer_bytes
                + self.activation_bytes)

    @property
    def step_bytes(self) -> int:
        """The peak in the optimizer step: every model state, no activations."""
        return self.model_state_bytes + self.buffer_bytes

    @property
    def total_bytes(self) -> int:
        return max(self.forward_backward_bytes, self.step_bytes)

    def to_dict(self) -> Dict[str, Any]:
        return {"params_bytes": self.params_bytes, "grads_bytes": self.grads_bytes,
                "optimizer_bytes": self.optimizer_bytes, "gathered_bytes": self.gathered_bytes,
                "activation_bytes": self.activation_bytes, "model_state_bytes": self.model_state_bytes,
                "buffer_bytes": self.buffer_bytes, "step_only_bytes": self.step_only_bytes,
                "forward_backward_bytes": self.forward_backward_bytes, "step_bytes": self.step_bytes,
                "total_bytes": self.total_bytes, "host_bytes": self.host_bytes, "assumptions": list(self.assumptions)}


def gpt_param_count(n_layers: int, d_model: int, seq_len: int, vocab: int = GPT_VOCAB) -> int:
    """Parameters of the byte-level GPT (launch/workloads/gpt.py, untied head), computed here without torch."""
    d = d_model
    return vocab * d + seq_len * d + n_layers * (12 * d * d + 13 * d) + 2 * d + vocab * d


def _largest_layer(n_layers: int, d_model: int, params: int) -> int:
    block = 12 * d_model * d_model + 13 * d_model
    return min(params, block) if n_layers > 0 else params


def estimate(params: int, n_layers: int, d_model: int, seq_len: int, micro_batch: int, precision: str,
             zero_stage: int, world_size: int, offload: str = "none", activation_checkpointing: bool = False,
             vocab: int = GPT_VOCAB, reduce_bucket_size: int = REDUCE_BUCKET_SIZE) -> Estimate:
    """Per-GPU memory for AdamW training of a decoder-only transformer; see the module docstring."""
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage={zero_stage}: 0, 1, 2 or 3")
    if offload not in ("none", "optimizer", "optimizer+params"):
        raise ValueError(f"offload={offload!r}: none, optimizer or optimizer+params")
    n = max(1, int(world_size))
    mixed = precision != "fp32"
    pb = 2 if mixed else 4
    ob = 16 if mixed else 8
    assumptions = [
        f"precision {precision}: {'16-bit params/grads (2+2 B), optimizer 16 B/param (fp32 master 4, Adam moments 8, fp32 grad 4)' if mixed else 'fp32 params/grads (4+4 B), optimizer 8 B/param (Adam moments)'}",
        f"ZeRO-{zero_stage} over {n} rank(s)",
    ]
    p_dev = params * pb
    g_dev = params * pb
    o_dev = params * ob
    gathered = 0
    if zero_stage >= 1:
        o_dev = -(-o_dev // n)
    # Mixed precision: a quarter of the optimizer bytes is the fp32 gradient (partition), built for the step.
    step_only = o_dev // 4 if mixed else 0
    if zero_stage >= 2:
        g_dev = -(-g_dev // n)
    step_buffer = 0
    if zero_stage == 3:
        p_dev = -(-p_dev // n)
        largest = _largest_layer(n_layers, d_model, params)
        gathered = 2 * pb * largest
        if mixed:
            # Stage 3 builds the fp32 gradient one optimizer sub-group at a time, during the step, after
            # backward has released the gathered layer: the two working sets are never alive together.
            step_buffer = 4 * min(-(-params // n), ZERO3_SUB_GROUP_SIZE)
            o_dev = -(-params // n) * 12
            step_only = max(0, step_buffer - gathered)
        assumptions.append(f"ZeRO-3 working set: the larger of the gathered params+grads of the largest layer "
                           f"({largest} params, forward/backward) and one optimizer sub-group's fp32 gradient "
                           "(the step)")
    host = 0
    if offload in ("optimizer", "optimizer+params"):
        host += o_dev + step_buffer
        o_dev = step_buffer = step_only = 0
        assumptions.append("optimizer states (and fp32 grads) in host memory")
    gathered = max(gathered, step_buffer)
    if offload == "optimizer+params" and zero_stage == 3:
        host += p_dev
        p_dev = 0
        assumptions.append("parameter shard in host memory; only the gathered layer stays on the GPU")
    buffers = reduce_bucket_size * pb if zero_stage >= 1 else 0
    if buffers:
        assumptions.append(f"DeepSpeed gradient-reduction bucket: {reduce_bucket_size:.3g} elements x {pb} B")
    s, b, h = seq_len, micro_batch, d_model
    act_factor = 1 if mixed else 2
    per_layer = 34 * s * b * h * act_factor
    if activation_checkpointing:
        acts = n_layers * 2 * act_factor * s * b * h + per_layer
        assumptions.append("activation checkpointing: layer inputs kept, one layer recomputed at a time")
    else:
        acts = n_layers * per_layer
    acts += 2 * 4 * s * b * vocab
    assumptions.append("activations: 34*s*b*h B per layer (16-bit; fused attention stores no score matrix), + fp32 "
                       "logits and their gradient; peak = max(forward/backward, optimizer step); CUDA context, "
                       "temporary buffers and fragmentation not counted")
    return Estimate(int(p_dev), int(g_dev), int(o_dev), int(gathered), int(acts), int(host), assumptions,
                    int(buffers), int(step_only))


def _ranks(cfg: Any) -> int:
    return int(cfg.slurm.nodes) * int(cfg.slurm.tasks_per_node)


COMMAND_NOTE = ("train.command runs your own script, whose model the estimate cannot know: no memory estimate "
                "(the watcher's OOM ladder still repairs an out-of-memory through the DeepSpeed config)")


def estimate_from_config(cfg: Any) -> Estimate:
    """:func:`estimate` for a :class:`hpc_agent.config.schema.Config` (gpt workload sizes)."""
    m, t = cfg.model, cfg.train
    from hpc_agent.config.user_code import is_reference

    if getattr(t, "command", None):
        raise ValueError(COMMAND_NOTE)
    if getattr(t, "workload", "gpt") != "gpt":
        raise ValueError(f"train.workload={t.workload!r}: the estimate covers the gpt workload only"
                         + (" (your own model is not imported on the login node)" if is_reference(t.workload) else ""))
    params = gpt_param_count(m.n_layers, m.d_model, m.seq_len)
    return estimate(params, m.n_layers, m.d_model, m.seq_len, t.micro_batch_size, t.precision, t.zero_stage,
                    _ranks(cfg), offload=t.offload, activation_checkpointing=t.activation_checkpointing,
                    vocab=GPT_VOCAB, reduce_bucket_size=t.reduce_bucket_size)


def estimate_with_patch(cfg: Any, patch: Dict[str, Any]) -> Estimate:
    """:func:`estimate_from_config` for ``cfg`` with a dotted-key patch (micro-batch, stage, offload, act-ckpt)."""
    m, t = cfg.model, cfg.train
    get = lambda key, default: patch.get(key, default)  # noqa: E731
    params = gpt_param_count(m.n_layers, m.d_model, m.seq_len)
    return estimate(params, m.n_layers, m.d_model, m.seq_len, get("train.micro_batch_size", t.micro_batch_size),
                    t.precision, get("train.zero_stage", t.zero_stage), _ranks(cfg),
                    offload=get("train.offload", t.offload),
                    activation_checkpointing=get("train.activation_checkpointing", t.activation_checkpointing),
                    vocab=GPT_VOCAB, reduce_bucket_size=t.reduce_bucket_size)


def format_bytes(n: float) -> str:
    """``48.44 GiB``; below 1 GiB in MiB (``7.28 MiB``), so small models and simulated GPUs stay readable."""
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"


def describe_patch(train: Any, patch: Dict[str, Any]) -> str:
    """``micro_batch_size 16 -> 2, grad_accum_steps 1 -> 8, activation_checkpointing off -> on``."""
    def fmt(v: Any) -> str:
        return ("on" if v else "off") if isinstance(v, bool) else str(v)

    return ", ".join(f"{k.split('.', 1)[1]} {fmt(getattr(train, k.split('.', 1)[1]))} -> {fmt(v)}"
                     for k, v in patch.items())


# --- THE OOM ladder ---------------------------------------------------------------------------------
# One ladder for every place that trades memory: submit's preflight advice (hpc_agent.policy.preflight), the
# watcher's and diagnose's next rung after a GPU OOM (hpc_agent.policy.decide) and anything else that asks.

GPU_HEADROOM = 0.9
"""Share of a GPU's capacity an estimate may use: it leaves out the CUDA context, temporary buffers and
fragmentation (preflight warns above it; a ladder rung must fit under it)."""

Rung = Tuple[Dict[str, Any], str]


def _smallest_factor(n: int) -> int:
    return next(p for p in range(2, n + 1) if n % p == 0)


def gpu_oom_rung(train: Any, ranks: int, offload_allowed: bool = True) -> Optional[Rung]:
    """The next rung of the GPU memory ladder from ``train`` (the global batch is kept), as
    ``(dotted-key patch, description)``, or None when the ladder is exhausted. The order: micro-batch
    down by its smallest factor (accumulation up by the same), activation checkpointing, the next ZeRO
    stage (only with more than one rank: one rank has nothing to shard over), optimizer offload (ZeRO-2
    at least), parameter offload (ZeRO-3). ``offload_allowed=False`` (host memory already ran out)
    ends the ladder before the offload rungs."""
    mbs, accum = train.micro_batch_size, train.grad_accum_steps
    if mbs > 1:
        p = _smallest_factor(mbs)  # halves an even size; an odd one loses its smallest factor, exactly
        return ({"train.micro_batch_size": mbs // p, "train.grad_accum_steps": accum * p},
                f"micro_batch_size {mbs} -> {mbs // p}, grad_accum_steps {accum} -> {accum * p} (same global batch)")
    if not train.activation_checkpointing:
        return {"train.activation_checkpointing": True}, "turn on activation checkpointing (~1/3 more compute)"
    if ranks > 1 and train.zero_stage < 3:
        return ({"train.zero_stage": train.zero_stage + 1},
                f"ZeRO stage {train.zero_stage} -> {train.zero_stage + 1} (shard more state across {ranks} ranks)")
    if offload_allowed and train.offload == "none":
        stage = max(2, train.zero_stage)
        return ({"train.offload": "optimizer", "train.zero_stage": stage},
                f"offload the optimizer state to CPU memory (ZeRO-{stage})")
    if offload_allowed and train.offload == "optimizer":
        return {"train.offload": "optimizer+params", "train.zero_stage": 3}, "offload parameters too (ZeRO-3)"
    return None


def train_after(train: Any, patch: Mapping[str, Any]) -> SimpleNamespace:
    """The ladder's view of ``train`` with a dotted-key patch applied (the five fields it reads)."""
    fields = ("micro_batch_size", "grad_accum_steps", "activation_checkpointing", "zero_stage", "offload")
    state = {f: getattr(train, f) for f in fields}
    state.update({k.split(".", 1)[1]: v for k, v in patch.items() if k.startswith("train.")})
    return SimpleNamespace(**state)


def ladder_fit(cfg: Any, budget_bytes: float, ranks: Optional[int] = None, offload_allowed: bool = True,
               scale: float = 1.0) -> Optional[Tuple[Dict[str, Any], str, float, int]]:
    """Climb the ladder from ``cfg``, the rungs taken together, up to the first whose estimate (times
    ``scale``) is at most ``budget_bytes``: ``(patch, description, estimated bytes, rungs climbed)``;
    None when no rung fits (the gpt workload only: the estimate covers no other)."""
    ranks = _ranks(cfg) if ranks is None else ranks
    patch: Dict[str, Any] = {}
    whats: List[str] = []
    while (rung := gpu_oom_rung(train_after(cfg.train, patch), ranks, offload_allowed)) is not None:
        patch.update(rung[0])
        whats.append(rung[1])
        need = estimate_with_patch(cfg, patch).total_bytes * scale
        if need <= budget_bytes:
            return dict(patch), whats[0] if len(whats) == 1 else describe_patch(cfg.train, patch), need, len(whats)
    return None


def cheapest_fit(cfg: Any, budget_bytes: float, offload_allowed: bool = True) -> Optional[Rung]:
    """What submit's preflight proposes: ``({}, "fits as is")`` when the estimate is within
    ``budget_bytes``, else the first ladder patch that fits (:func:`ladder_fit`), None if none does."""
    if estimate_from_config(cfg).total_bytes <= budget_bytes:
        return {}, "fits as is"
    fit = ladder_fit(cfg, budget_bytes, offload_allowed=offload_allowed)
    return None if fit is None else (fit[0], fit[1])


def gpu_oom_fit(cfg: Any, ranks: int, offload_allowed: bool, capacity_bytes: Optional[int],
                headroom: float = GPU_HEADROOM) -> Optional[Rung]:
    """The next step after a GPU out-of-memory failure (what ``policy.decide.decide`` proposes): the ladder's
    rungs taken together up to the first whose estimate fits ``headroom`` of the GPU.

    Without a known capacity, or for a workload the estimator does not cover, this is the next rung
    alone (:func:`gpu_oom_rung`). The estimate is calibrated on the failure: the config that ran out of
    memory needed more than the GPU has, so when its estimate is lower than the capacity every estimate
    is scaled up by capacity / estimate (when it is higher, as in preflight's refusals, the scale is 1
    and the patch is preflight's). If no rung fits by the estimate, the next rung alone is tried (the
    estimate may be pessimistic) and the reason says so.
    """
    step = gpu_oom_rung(cfg.train, ranks, offload_allowed)
    if step is None or not capacity_bytes or cfg.train.workload != "gpt" or getattr(cfg.train, "command", None):
        return step
    scale = max(1.0, capacity_bytes / max(estimate_from_config(cfg).total_bytes, 1))
    fit = ladder_fit(cfg, capacity_bytes * headroom, ranks, offload_allowed, scale)
    if fit is None:
        return step[0], (f"{step[1]} (no rung fits {format_bytes(capacity_bytes)} by the memory estimate; trying "
                         "the next one)")
    patch, what, need, climbed = fit
    skipped = f"; skipped {climbed - 1} rung(s) that would not fit" if climbed > 1 else ""
    return patch, (f"{what} (estimate {format_bytes(need)} <= {headroom:.0%} of the GPU's "
                   f"{format_bytes(capacity_bytes)}{skipped})")

"""Issue 21: training throughput and MFU of the gpt workload through DeepSpeed, beside plain PyTorch AMP.

    python -m scripts.bench.mfu [--out results/gpu/bench_mfu.json] [--models 124m,350m] [--micro-batch 8]
    python -m scripts.bench.mfu --cpu-smoke --out /tmp/bench_mfu_cpu.json   # no GPU: code paths only

The project's ByteGPT at ~124M and ~350M parameters (seq 1024, vocab 50257, synthetic tokens on the device).
Per model: FP16 ZeRO-2 and ZeRO-3 through deepspeed.initialize with launch.dsconfig.build_ds_config, and a
plain loop (autocast FP16, GradScaler, fused AdamW), each with and without activation checkpointing. Per
case: median step time after warm-up, tokens/s, model TFLOPS (6 N + 12 L d T per token, recomputation not
counted), MFU against the GPU's dense FP16 peak (NVML name or --peak-tflops), peak memory; then the
checkpointing penalty, DeepSpeed / AMP tokens/s, and the targets (>= 45 % MFU at 350M, penalty <= 25 %).
No CUDA GPU: exit 2, unless --cpu-smoke (tiny models in BF16 on the CPU, MFU null, not GPU results).
Details: docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Dict, List, Optional

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from hpc_agent.core.fsutil import atomic_write_json  # noqa: E402
from hpc_agent.policy.gpu_types import peak_tflops  # noqa: E402
from hpc_agent.policy.memory import gpt_param_count  # noqa: E402

MODELS = {"124m": {"n_layers": 12, "d_model": 768, "n_heads": 12},
          "350m": {"n_layers": 24, "d_model": 1024, "n_heads": 16}}
# Two tiny models: the smoke run goes through the loop over models (a model after a ZeRO-3 engine) too.
SMOKE = [{"name": f"tiny-{n}l", "n_layers": n, "d_model": 64, "n_heads": 4, "seq_len": 64, "vocab": 512}
         for n in (2, 1)]
MODES = ("amp", "zero2", "zero3")
CASES = [(mode, ckpt) for mode in MODES for ckpt in (False, True)]
TARGETS = {"mfu_min": 0.45, "mfu_model": "350m", "ckpt_penalty_max": 0.25}
FORMULA = "6 * N_matmul + 12 * n_layers * d_model * seq_len FLOPs per token (recomputation not counted)"


# ---- pure helpers (tests/job/test_bench_mfu.py) ---------------------------------------------------------------
def matmul_params(n_layers: int, d_model: int, seq_len: int, vocab: int) -> int:
    """Parameters of ByteGPT minus its two embedding tables (token and position lookups do no matmul)."""
    return gpt_param_count(n_layers, d_model, seq_len, vocab) - vocab * d_model - seq_len * d_model


def flops_per_token(n_layers: int, d_model: int, seq_len: int, vocab: int) -> int:
    return 6 * matmul_params(n_layers, d_model, seq_len, vocab) + 12 * n_layers * d_model * seq_len


def mfu(tflops: Optional[float], peak: Optional[float]) -> Optional[float]:
    return None if tflops is None or not peak else tflops / peak


def ckpt_penalty(step_ckpt: Optional[float], step_plain: Optional[float]) -> Optional[float]:
    """Step-time cost of activation checkpointing: ckpt / no-ckpt - 1 (None when either is missing)."""
    return None if not step_ckpt or not step_plain else step_ckpt / step_plain - 1.0


def resolve_peak(gpu_name: Optional[str], override: Optional[float]) -> Optional[float]:
    """``--peak-tflops`` if given, else the table entry for the first word of the name that is known."""
    if override:
        return float(override)
    for word in (gpu_name or "").replace("NVIDIA", " ").split():
        found = peak_tflops(word)
        if found:
            return found
    return None


def summarize(rows: List[Dict], device: str) -> Dict:
    """Penalties per (model, mode), DeepSpeed / AMP tokens/s, and the target verdicts (None: not measured)."""
    by = {(r["model"], r["mode"], r["ckpt"]): r for r in rows}
    get = lambda m, mode, ck, key: (by.get((m, mode, ck)) or {}).get(key)  # noqa: E731
    models = list(dict.fromkeys(r["model"] for r in rows))
    penalties = [{"model": m, "mode": mode, "penalty": ckpt_penalty(get(m, mode, True, "step_s"),
                                                                     get(m, mode, False, "step_s"))}
                 for m in models for mode in MODES]
    ratios = [{"model": m, "mode": mode, "ckpt": ck,
               "ratio": (get(m, mode, ck, "tokens_per_s") / get(m, "amp", ck, "tokens_per_s")
                         if get(m, mode, ck, "tokens_per_s") and get(m, "amp", ck, "tokens_per_s") else None)}
              for m in models for mode in MODES[1:] for ck in (False, True)]
    gpu = device == "cuda"
    ds_mfus = [(r["mfu"], f"{r['mode']}{' ckpt' if r['ckpt'] else ''}") for r in rows
               if r["model"] == TARGETS["mfu_model"] and r["mode"] != "amp" and r.get("mfu") is not None]
    best = max(ds_mfus) if ds_mfus else (None, None)
    ds_pen = [p["penalty"] for p in penalties if p["mode"] != "amp"]
    pen_ok = None if not gpu or not ds_pen or None in ds_pen else max(ds_pen) <= TARGETS["ckpt_penalty_max"]
    verdicts = {"mfu": {"best_350m_deepspeed_mfu": best[0], "case": best[1],
                        "met": None if not gpu or best[0] is None else best[0] >= TARGETS["mfu_min"]},
                "ckpt_penalty": {"worst_deepspeed_penalty": max(ds_pen) if ds_pen and None not in ds_pen else None,
                                 "met": pen_ok}}
    return {"penalties": penalties, "ds_over_amp": ratios, "verdicts": verdicts}


def _fmt(value, spec: str, scale: float = 1.0) -> str:
    return "-" if value is None else format(value * scale, spec)


def markdown_table(result: Dict) -> str:
    lines = []
    if result["device"] != "cuda":
        lines += ["**CPU smoke run: these are NOT GPU results** (tiny models, BF16 on the CPU; MFU undefined).", ""]
    peak = f"dense FP16 peak {result['peak_tflops']} TFLOPS" if result.get("peak_tflops") else "no peak known"
    lines += [f"device: {result.get('gpu') or result['device']}, {peak}; model FLOPs: {FORMULA}", "",
              "| model | case | ckpt | micro-batch | step ms | tokens/s | TFLOPS | MFU | peak GiB | vs AMP | error |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    ratio = {(r["model"], r["mode"], r["ckpt"]): r["ratio"] for r in result["ds_over_amp"]}
    for r in result["rows"]:
        lines.append(f"| {r['model']} | {r['mode']} | {'yes' if r['ckpt'] else 'no'} | {r['micro_batch']} | "
                     f"{_fmt(r.get('step_s'), '.1f', 1e3)} | {_fmt(r.get('tokens_per_s'), ',.0f')} | "
                     f"{_fmt(r.get('tflops'), '.4g')} | {_fmt(r.get('mfu'), '.1%')} | "
                     f"{_fmt(r.get('peak_mem_bytes'), '.2f', 2**-30)} | "
                     f"{_fmt(ratio.get((r['model'], r['mode'], r['ckpt'])), '.3f')} | {r.get('error') or ''} |")
    lines.append("")
    for p in result["penalties"]:
        lines.append(f"checkpointing penalty {p['model']} {p['mode']}: {_fmt(p['penalty'], '+.1%')}")
    v = result["verdicts"]
    said = lambda met: {True: "MET", False: "NOT MET", None: "not measured"}[met]  # noqa: E731
    lines.append(f"target MFU >= {TARGETS['mfu_min']:.0%} ({TARGETS['mfu_model']}, best DeepSpeed case "
                 f"{v['mfu']['case'] or '-'}: {_fmt(v['mfu']['best_350m_deepspeed_mfu'], '.1%')}): {said(v['mfu']['met'])}")
    lines.append(f"target checkpointing penalty <= {TARGETS['ckpt_penalty_max']:.0%} (worst DeepSpeed: "
                 f"{_fmt(v['ckpt_penalty']['worst_deepspeed_penalty'], '+.1%')}): {said(v['ckpt_penalty']['met'])}")
    return "\n".join(lines)


# ---- measurement ------------------------------------------------------------------------------------------
def gpu_name() -> str:
    """GPU 0's name from NVML (``hpc_agent.diagnosis.gpu_health``, the one NVML reader), else from CUDA (the same string)."""
    from hpc_agent.diagnosis.gpu_health import read_gpus

    readings, _ = read_gpus()
    if readings:
        return readings[0].name
    import torch

    return torch.cuda.get_device_name(0)


def train_config(spec: Dict, mode: str, ckpt: bool, mbs: int, precision: str, on_cuda: bool):
    from hpc_agent.config.load import build_config

    layer = {"train": {"workload": "gpt", "precision": precision, "zero_stage": 3 if mode == "zero3" else 2,
                       "micro_batch_size": mbs, "grad_accum_steps": 1, "activation_checkpointing": ckpt},
             "model": {k: spec[k] for k in ("n_layers", "d_model", "n_heads", "seq_len")}}
    if on_cuda:
        layer["slurm"] = {"gpus_per_node": 1}  # validation refuses FP16 on a job without a GPU
    return build_config([layer]).train


def measure(spec: Dict, mode: str, ckpt: bool, mbs: int, args, device, precision: str) -> Dict:
    import torch
    import torch.nn.functional as F

    from launch.workloads.common import seeded_module
    from launch.workloads.gpt import ByteGPT

    on_cuda = device.type == "cuda"
    t = train_config(spec, mode, ckpt, mbs, precision, on_cuda)
    model = seeded_module(0, lambda: ByteGPT(spec["n_layers"], spec["d_model"], spec["n_heads"], spec["seq_len"],
                                             0.0, ckpt, vocab=spec["vocab"])).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    gen = torch.Generator(device=device).manual_seed(0)
    tokens = torch.randint(0, spec["vocab"], (mbs, spec["seq_len"] + 1), device=device, generator=gen)
    inputs, labels = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16
    engine = opt = scaler = None

    def loss_of(logits):  # FP32 cross-entropy, as the gpt workload computes it
        return F.cross_entropy(logits.float().reshape(-1, spec["vocab"]), labels.reshape(-1))

    if mode == "amp":
        try:
            opt, fused = torch.optim.AdamW(model.parameters(), lr=t.lr, weight_decay=t.weight_decay, fused=True), True
        except (RuntimeError, TypeError, ValueError):
            opt, fused = torch.optim.AdamW(model.parameters(), lr=t.lr, weight_decay=t.weight_decay), False
        scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")

        def step():
            with torch.autocast(device.type, dtype=dtype):
                logits = model(inputs)
            scaler.scale(loss_of(logits)).backward()
            scaler.unscale_(opt)
            if t.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
    else:
        import deepspeed

        from launch.dsconfig import build_ds_config

        config = build_ds_config(t, world_size=1, precision=precision, on_cuda=on_cuda)
        engine, opt, _, _ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()),
                                                 config=config, dist_init_required=False)
        fused = None

        def step():
            loss = loss_of(engine(inputs))
            engine.backward(loss)
            engine.step()

    sync = torch.cuda.synchronize if on_cuda else (lambda: None)
    if on_cuda:
        torch.cuda.reset_peak_memory_stats()
    times = []
    try:
        for i in range(args.warmup + args.steps):
            sync()
            started = time.perf_counter()
            step()
            sync()
            if i >= args.warmup:
                times.append(time.perf_counter() - started)
        peak = torch.cuda.max_memory_allocated() if on_cuda else None
    finally:
        engine = opt = scaler = model = step = None  # drop the references, so the memory can be freed
    step_s = statistics.median(times)
    tokens_per_s = mbs * spec["seq_len"] / step_s
    tflops = flops_per_token(spec["n_layers"], spec["d_model"], spec["seq_len"], spec["vocab"]) * tokens_per_s / 1e12
    return {"step_s": step_s, "step_s_all": times, "tokens_per_s": tokens_per_s, "tflops": tflops,
            "mfu": mfu(tflops, args.peak), "peak_mem_bytes": peak, "n_params": n_params,
            "n_matmul_params": matmul_params(spec["n_layers"], spec["d_model"], spec["seq_len"], spec["vocab"]),
            "precision": precision, "fused_adamw": fused}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(REPO / "results" / "gpu" / "bench_mfu.json"))
    parser.add_argument("--models", default="124m,350m", help="comma-separated, of: " + ", ".join(MODELS))
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--warmup", type=int, default=5, help="steps run before timing (excluded)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per case (the median is reported)")
    parser.add_argument("--peak-tflops", type=float, help="the GPU's dense FP16 peak (default: from its name)")
    parser.add_argument("--cpu-smoke", action="store_true", help="no GPU: tiny models on the CPU, code paths only")
    args = parser.parse_args()
    if args.cpu_smoke:  # the CPU even where a GPU exists, so the smoke run is the same everywhere
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        os.environ["DS_ACCELERATOR"] = "cpu"
    import torch

    warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.distributed")  # from DeepSpeed
    on_cuda = torch.cuda.is_available()
    if not on_cuda and not args.cpu_smoke:
        print("bench_mfu: no CUDA GPU here, nothing measured (use --cpu-smoke to test the code paths on the CPU)",
              file=sys.stderr)
        return 2
    from launch import distributed
    from launch.ops import OpNotPrepared

    if args.cpu_smoke:
        specs, mbs, precision, device, name, args.peak = SMOKE, 2, "bf16", torch.device("cpu"), None, None
        args.warmup, args.steps = min(args.warmup, 2), min(args.steps, 3)
    else:
        unknown = [m for m in args.models.split(",") if m not in MODELS]
        if unknown:
            parser.error(f"unknown model(s) {unknown}; known: {', '.join(MODELS)}")
        specs = [dict(MODELS[m], name=m, seq_len=args.seq_len, vocab=args.vocab) for m in args.models.split(",")]
        mbs, precision, device, name = args.micro_batch, "fp16", torch.device("cuda", 0), gpu_name()
        args.peak = resolve_peak(name, args.peak_tflops)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
    try:  # one rank on a free port, initialised as the training entry point does (so deepspeed.initialize works)
        distributed.init(distributed.DistEnv(0, 1, 0, "127.0.0.1", distributed.free_port(), "bench_mfu"), on_cuda)
    except OpNotPrepared as exc:
        print(f"bench_mfu: {exc} (python -m hpc_agent.prepare prepares it)", file=sys.stderr)
        return 2
    import deepspeed

    rows, failed = [], False
    for spec in specs:
        for mode, ckpt in CASES:
            row = {"model": spec["name"], "mode": mode, "ckpt": ckpt, "micro_batch": mbs,
                   **{k: spec[k] for k in ("n_layers", "d_model", "n_heads", "seq_len", "vocab")}}
            try:
                row.update(measure(spec, mode, ckpt, mbs, args, device, precision))
            except Exception as exc:  # one broken case must not lose the others
                oom = isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()
                failed |= not oom
                row["error"] = f"{'OOM' if oom else type(exc).__name__}: {(str(exc) or '-').splitlines()[0][:200]}"
            gc.collect()  # here, not in the except block: the exception's frames still hold the engine there
            if on_cuda:
                torch.cuda.empty_cache()
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "step_s_all"}), flush=True)
    result = {"device": device.type, "gpu": name, "peak_tflops": args.peak,
              "peak_source": "--peak-tflops" if args.peak_tflops and on_cuda else ("gpu name" if args.peak else None),
              "versions": {"torch": torch.__version__, "deepspeed": deepspeed.__version__, "cuda": torch.version.cuda},
              "settings": {"warmup_steps": args.warmup, "timed_steps": args.steps, "tf32": on_cuda,
                           "cudnn_benchmark": on_cuda, "data": "synthetic tokens generated on the device"},
              "flops_formula": FORMULA, "targets": TARGETS, "rows": rows, **summarize(rows, device.type)}
    if not on_cuda:
        result["note"] = "CPU smoke run: tiny models in BF16 on the CPU; not GPU results, MFU undefined"
    print(markdown_table(result))
    atomic_write_json(Path(args.out), result)
    print(f"wrote {args.out}")
    distributed.shutdown()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Issue 7, must-show 4 (GPU only): the memory estimate against the real peak of FP16 runs.

    python -m scripts.bench.gpu_memory [--out results/gpu/bench_gpu_memory.json] [--steps 12]
    python -m scripts.bench.gpu_memory --rescore results/gpu/bench_gpu_memory.json   # no GPU needed

Runs on a machine with an NVIDIA GPU: ``doctor`` (GPU health via pynvml), then short FP16 runs of the
gpt workload (sizes, micro-batches, ZeRO 1/2/3, checkpointing; see SIZES) through the local executor,
and compares
``torch.cuda.max_memory_allocated`` (TensorBoard ``perf/peak_mem_bytes``) with
``hpc_agent.policy.memory.estimate_from_config``. The peak excludes the CUDA context, which the estimate
leaves out too. Without a GPU it says so and exits 3 (nothing measured).

``--rescore FILE`` recomputes the estimates of a measured file with the current estimator (pure
arithmetic) and writes them beside the ones from the time of the run (``estimate_now_*``).
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from hpc_agent.core.fsutil import atomic_write_json  # noqa: E402
from hpc_agent.config.load import load_config  # noqa: E402
from hpc_agent.policy.memory import estimate_from_config  # noqa: E402
from hpc_agent.metrics.tb_reader import RunScalars  # noqa: E402

# (layers, width, heads, seq, micro-batch, ZeRO stage, activation checkpointing). The rows vary one
# term at a time against a neighbour: micro-batch (activations are linear in it), sequence length at
# the same tokens (a quadratic attention term would show), checkpointing, and the ZeRO stage.
SIZES = [
    (12, 768, 12, 1024, 8, 2, False),
    (12, 768, 12, 1024, 16, 2, False),
    (12, 768, 12, 2048, 4, 2, False),
    (24, 1024, 16, 1024, 4, 2, False),
    (24, 1024, 16, 1024, 8, 2, False),
    (24, 1024, 16, 1024, 8, 2, True),
    (24, 1024, 16, 1024, 8, 1, False),
    (24, 1024, 16, 1024, 8, 3, False),
    (4, 2048, 16, 1024, 8, 2, False),
]


def run(cmd, timeout=900):
    print("$", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=str(REPO))
    return proc.returncode, proc.stdout + proc.stderr


def rescore(path: Path) -> int:
    """The current estimator against peaks measured earlier; the file keeps the old estimates too."""
    data = json.loads(path.read_text())
    ratios = []
    for row in data["runs"]:
        overrides = [f"model.n_layers={row['layers']}", f"model.d_model={row['d_model']}",
                     f"model.n_heads={row.get('n_heads', 16)}", f"model.seq_len={row['seq_len']}",
                     f"train.micro_batch_size={row['micro_batch']}", "train.precision=fp16",
                     f"train.zero_stage={row.get('zero_stage', 2)}", "train.workload=gpt",
                     f"train.activation_checkpointing={row.get('activation_checkpointing', False)}",
                     "slurm.gpus_per_node=1", "slurm.tasks_per_node=1"]
        estimate = estimate_from_config(load_config("quickstart", overrides))
        row["estimate_now_bytes"] = estimate.total_bytes
        row["estimate_now"] = estimate.to_dict()
        if row.get("peak_bytes"):
            row["estimate_now_over_peak"] = round(estimate.total_bytes / row["peak_bytes"], 3)
            ratios.append(row["estimate_now_over_peak"])
        print(f"{row['layers']:>3} x {row['d_model']:<5} seq {row['seq_len']:<5} mbs {row['micro_batch']:<3} "
              f"ZeRO-{row.get('zero_stage', 2)} ckpt {str(row.get('activation_checkpointing', False)):<5} "
              f"peak {row.get('peak_bytes', 0) / 2**30:6.2f} GiB  estimate then {row['estimate_bytes'] / 2**30:6.2f} "
              f"now {estimate.total_bytes / 2**30:6.2f} GiB  now/peak {row.get('estimate_now_over_peak')}")
    if ratios:
        data["estimate_now_over_peak_range"] = [min(ratios), max(ratios)]
        print(f"estimate / measured peak: {min(ratios)} .. {max(ratios)} over {len(ratios)} runs")
    atomic_write_json(path, data)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(REPO / "results" / "gpu" / "bench_gpu_memory.json"))
    parser.add_argument("--rescore", metavar="FILE", help="recompute the estimates of a measured JSON file; no GPU")
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    if args.rescore:
        return rescore(Path(args.rescore))
    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU here: nothing measured", file=sys.stderr)
        return 3
    result = {"gpu": torch.cuda.get_device_name(0), "runs": []}
    code, text = run([sys.executable, "-m", "hpc_agent.doctor", "quickstart", "slurm.gpus_per_node=1"])
    result["doctor"] = {"exit_code": code, "output": text[-4000:]}
    print(text)
    root = Path(tempfile.mkdtemp(prefix="gpumem-"))
    for layers, width, heads, seq, mbs, stage, ckpt in SIZES:
        overrides = [f"run.runs_root={root}", f"run.name=l{layers}w{width}s{seq}b{mbs}z{stage}{'ac' if ckpt else ''}",
                     "train.workload=gpt", f"model.n_layers={layers}", f"model.d_model={width}",
                     f"model.n_heads={heads}", f"model.seq_len={seq}", f"train.micro_batch_size={mbs}",
                     "train.precision=fp16", f"train.zero_stage={stage}", f"train.activation_checkpointing={ckpt}",
                     f"train.max_steps={args.steps}", "train.log_every=1",
                     f"train.ckpt_every={args.steps}", "slurm.gpus_per_node=1", "slurm.tasks_per_node=1"]
        cfg = load_config("quickstart", overrides)
        estimate = estimate_from_config(cfg)
        started = time.monotonic()
        code, text = run([sys.executable, "-m", "hpc_agent.submit", "quickstart", *overrides, "--executor", "local",
                          "--wait", "--force"])
        # submit prints "run dir:      <path>" (the runs root also holds the ledger, so no mtime guess).
        found = re.search(r"^run dir:\s+(\S+)", text, re.M)
        if not found:
            raise SystemExit(f"submit printed no run dir:\n{text[-3000:]}")
        run_dir = Path(found.group(1))
        scalars = RunScalars(run_dir / "tb")
        scalars.update()
        peaks = [p.value for p in scalars.series("perf/peak_mem_bytes")]
        tokens = [p.value for p in scalars.series("perf/tokens_per_s")][5:]
        row = {"layers": layers, "d_model": width, "n_heads": heads, "seq_len": seq, "micro_batch": mbs,
               "zero_stage": stage, "activation_checkpointing": ckpt, "exit_code": code,
               "estimate_bytes": estimate.total_bytes, "estimate": estimate.to_dict(),
               "peak_bytes": max(peaks) if peaks else None, "wall_s": round(time.monotonic() - started, 1),
               "tokens_per_s_median": sorted(tokens)[len(tokens) // 2] if tokens else None}
        if row["peak_bytes"]:
            row["estimate_over_peak"] = round(estimate.total_bytes / row["peak_bytes"], 3)
        print(json.dumps({k: v for k, v in row.items() if k != "estimate"}), flush=True)
        if code != 0:
            row["log_tail"] = text[-2000:]
        result["runs"].append(row)
    atomic_write_json(Path(args.out), result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

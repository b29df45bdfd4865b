"""Issue 7, must-show 4 (GPU only): the memory estimate against the real peak of an FP16 ZeRO-2 run.

    python scripts/bench_gpu_memory.py [--out results/bench_gpu_memory.json] [--steps 30]

Runs on a machine with an NVIDIA GPU: ``doctor`` (GPU health via pynvml), then short FP16 ZeRO-2 runs
of the gpt workload at a few sizes through the local executor, and compares
``torch.cuda.max_memory_allocated`` (TensorBoard ``perf/peak_mem_bytes``) with
``hpc_agent.memory.estimate_from_config``. The peak excludes the CUDA context, which the estimate
leaves out too. Without a GPU it says so and exits 3 (nothing measured).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from hpc_agent.fsutil import atomic_write_json  # noqa: E402
from hpc_agent.config.load import load_config  # noqa: E402
from hpc_agent.memory import estimate_from_config  # noqa: E402
from hpc_agent.metrics.tb_reader import RunScalars  # noqa: E402

SIZES = [  # (layers, width, heads, seq, micro-batch)
    (12, 768, 12, 1024, 8),
    (24, 1024, 16, 1024, 4),
    (24, 1024, 16, 1024, 8),
]


def run(cmd, timeout=900):
    print("$", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=str(REPO))
    return proc.returncode, proc.stdout + proc.stderr


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(REPO / "results" / "bench_gpu_memory.json"))
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU here: nothing measured", file=sys.stderr)
        return 3
    result = {"gpu": torch.cuda.get_device_name(0), "runs": []}
    code, text = run([sys.executable, "-m", "hpc_agent.doctor", "quickstart", "slurm.gpus_per_node=1"])
    result["doctor"] = {"exit_code": code, "output": text[-4000:]}
    print(text)
    root = Path(tempfile.mkdtemp(prefix="gpumem-"))
    for layers, width, heads, seq, mbs in SIZES:
        overrides = [f"run.runs_root={root}", f"run.name=l{layers}w{width}b{mbs}", "train.workload=gpt",
                     f"model.n_layers={layers}", f"model.d_model={width}", f"model.n_heads={heads}",
                     f"model.seq_len={seq}", f"train.micro_batch_size={mbs}", "train.precision=fp16",
                     "train.zero_stage=2", f"train.max_steps={args.steps}", "train.log_every=1",
                     f"train.ckpt_every={args.steps}", "slurm.gpus_per_node=1", "slurm.tasks_per_node=1"]
        cfg = load_config("quickstart", overrides)
        estimate = estimate_from_config(cfg)
        started = time.monotonic()
        code, text = run([sys.executable, "-m", "hpc_agent.submit", "quickstart", *overrides, "--executor", "local",
                          "--wait", "--force"])
        run_dir = max(root.iterdir(), key=lambda p: p.stat().st_mtime)
        scalars = RunScalars(run_dir / "tb")
        scalars.update()
        peaks = [p.value for p in scalars.series("perf/peak_mem_bytes")]
        tokens = [p.value for p in scalars.series("perf/tokens_per_s")][5:]
        row = {"layers": layers, "d_model": width, "seq_len": seq, "micro_batch": mbs, "exit_code": code,
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

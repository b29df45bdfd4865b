#!/usr/bin/env bash
# The GPU checks, in one go, for a machine with an NVIDIA GPU (CI has none, so these run by hand):
#   bash scripts/gpu_check.sh            # results under $OUT (default /tmp/gpu_check)
# 1. tests/job/test_gpu.py: FP16 under ZeRO 1-3 with activation checkpointing, FP16 SIGKILL + resume, ZeRO-Offload,
#    loss-scale overflow, a real CUDA OOM and its diagnosis, doctor's pynvml health check.
# 2. scripts/bench/gpu_memory.py: the memory estimate against the measured FP16 ZeRO-2 peak.
# A machine without a package index can bring wheels in .whl/ (pure-Python deepspeed, omegaconf,
# submitit and their small dependencies): they are installed into /tmp/site and put on PYTHONPATH.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "installing the carried wheels failed" >&2; exit 1; }
    export PYTHONPATH="/tmp/site:$PYTHONPATH"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee "$OUT/nvidia_smi.txt"
python3 -c "import sys, torch, deepspeed; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'deepspeed', deepspeed.__version__)" 2>&1 | grep -v WARNING | tee "$OUT/versions.txt"
status=0
# DeepSpeed's ops are built here, not inside the tests' jobs (hpc_agent/core/ops_cache.py); on CUDA only the
# offload path needs one (cpu_adam), and a machine without the CUDA toolkit skips it with a warning.
export HPC_AGENT_OPS_DIR=${HPC_AGENT_OPS_DIR:-/tmp/ds_ops}
python3 -m hpc_agent.prepare 2>&1 | tee "$OUT/prepare.log" || status=1
timeout "${GPU_TEST_TIMEOUT:-390}" python3 -m pytest -v -rA -p no:cacheprovider tests/job/test_gpu.py 2>&1 | tee "$OUT/pytest.log" || status=1
timeout "${GPU_BENCH_TIMEOUT:-200}" python -m scripts.bench.gpu_memory --out "$OUT/bench_gpu_memory.json" --steps 12 2>&1 \
    | tee "$OUT/bench_gpu_memory.log" || status=1
echo "gpu_check: exit $status"
exit $status

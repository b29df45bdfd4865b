#!/usr/bin/env bash
# Install hpc_agent and what its tests need into the current Python (idempotent).
#
# torch is pinned and installed FIRST: this machine has a CPU build of torch 2.13.0 on local disk,
# and without the pin pip would fetch a multi-GB CUDA build. pyproject.toml stays general (torch>=2.4).
# deepspeed ships as an sdist whose setup.py imports torch, so it is built without build isolation
# (an isolated build env would download a second, CUDA torch).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_PIN=${HPC_AGENT_TORCH_PIN:-torch==2.13.0}

say() { printf '[setup] %s\n' "$*"; }

if ! "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)'; then
  echo "[setup] error: $PY is older than Python 3.10" >&2
  exit 1
fi
say "python: $("$PY" --version 2>&1) at $(command -v "$PY")"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
if "$PY" -c "import torch, sys; sys.exit(0 if torch.__version__.split('+')[0] == '${TORCH_PIN#torch==}' else 1)" 2>/dev/null; then
  say "torch ${TORCH_PIN#torch==} already installed"
else
  say "installing $TORCH_PIN (CPU build from local disk)"
  "$PY" -m pip install -q "$TORCH_PIN"
fi
"$PY" -m pip install -q "setuptools>=64" wheel
say "installing hpc_agent (editable) with test extras, deepspeed without build isolation"
"$PY" -m pip install -q --no-build-isolation -e ".[test]"
say "installed: $("$PY" -c 'import torch, deepspeed, submitit, omegaconf; print("torch", torch.__version__, "deepspeed", deepspeed.__version__, "submitit", submitit.__version__)' 2>/dev/null | tail -1)"

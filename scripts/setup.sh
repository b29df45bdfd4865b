#!/usr/bin/env bash
# Install hpc_agent into a virtualenv and prepare what its jobs need (idempotent; no root needed).
#
#   bash scripts/setup.sh            # into the active virtualenv, else ./.venv (created if missing)
#   HPC_AGENT_VENV=/path bash ...     # into that virtualenv (created if missing)
#
# 1. torch is pinned and installed first: this machine has a CPU build of torch 2.13.0 on local disk, and
#    without the pin pip would fetch a multi-GB CUDA build. pyproject.toml stays general.
# 2. Everything installs through constraints.txt: the exact versions CI tested, so a new upstream release
#    cannot change a fresh install. deepspeed ships as an sdist whose setup.py imports torch, so it is
#    built without build isolation (an isolated build env would download a second, CUDA torch).
# 3. DeepSpeed's C++ ops that jobs load are compiled here, once (python -m hpc_agent.prepare): a Slurm job
#    never compiles (docs/install.md).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/python_env.sh
source scripts/python_env.sh
TORCH_PIN=${HPC_AGENT_TORCH_PIN:-torch==2.13.0}
CONSTRAINTS=${HPC_AGENT_CONSTRAINTS:-constraints.txt}

say() { printf '[setup] %s\n' "$*"; }
started=$(date +%s)

hpc_agent_venv  # sets PY to the virtualenv's python, creating the virtualenv if needed
say "python: $("$PY" --version 2>&1) in virtualenv ${VENV}"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
PIP=("$PY" -m pip install -q)
if [ -f "$CONSTRAINTS" ]; then
  PIP+=(-c "$CONSTRAINTS")
else
  say "warning: $CONSTRAINTS not found: installing without the tested version pins"
fi
# The build tools first: hpc_agent's license field needs setuptools>=77 and packaging>=24.2 (no isolation).
"${PIP[@]}" "setuptools>=77" "packaging>=24.2" wheel
if "$PY" -c "import torch, sys; sys.exit(0 if torch.__version__.split('+')[0] == '${TORCH_PIN#torch==}' else 1)" 2>/dev/null; then
  say "torch ${TORCH_PIN#torch==} already installed"
else
  say "installing $TORCH_PIN (CPU build)"
  "${PIP[@]}" "$TORCH_PIN"
fi
say "installing hpc_agent (editable) with the test extras; deepspeed without build isolation"
"${PIP[@]}" --no-build-isolation -e ".[test]"
say "installed: $("$PY" -c 'import importlib.metadata as m; print(", ".join(d + " " + m.version(d) for d in ("torch", "deepspeed", "submitit", "omegaconf")))')"
say "preparing DeepSpeed's ops for the jobs (compiled here once, never inside a job)"
"$PY" -m hpc_agent.prepare
say "done in $(( $(date +%s) - started )) s. Use this environment with: source ${VENV}/bin/activate"

# Sourced by setup.sh, test.sh and demo.sh: which virtualenv hpc_agent lives in.
#
# The active virtualenv ($VIRTUAL_ENV) if there is one, else $HPC_AGENT_VENV, else ./.venv in the checkout.
# It is created when missing, with $PYTHON (default python3; 3.10 or newer). Never the system Python:
# Debian's refuses pip (PEP 668), and a user without root cannot write to it anyway.
# Sets VENV and PY (the virtualenv's python) and puts the virtualenv's bin/ first on PATH.

hpc_agent_venv() {
  VENV=${VIRTUAL_ENV:-${HPC_AGENT_VENV:-$PWD/.venv}}
  if [ ! -x "$VENV/bin/python" ]; then
    local base=${PYTHON:-python3}
    if ! "$base" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' 2>/dev/null; then
      echo "[setup] error: $base is missing or older than Python 3.10; set PYTHON=/path/to/python3.10+" >&2
      exit 2
    fi
    echo "[setup] creating virtualenv $VENV with $("$base" --version 2>&1)"
    if ! "$base" -m venv "$VENV"; then
      echo "[setup] error: '$base -m venv' failed; on Debian/Ubuntu: apt-get install python3-venv" >&2
      exit 2
    fi
  fi
  PY="$VENV/bin/python"
  export VIRTUAL_ENV="$VENV" PATH="$VENV/bin:$PATH"
}

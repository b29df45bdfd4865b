#!/usr/bin/env bash
# The full test suite on a fresh machine: install (scripts/setup.sh), bring up the localhost Slurm, run pytest.
#   bash scripts/test.sh [extra pytest args]
# Run as root (cluster.sh installs Debian packages and starts Slurm daemons).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
bash scripts/setup.sh
# shellcheck source=scripts/python_env.sh
source scripts/python_env.sh
hpc_agent_venv
bash scripts/cluster.sh up
# Slurm tests must run here: fail (not skip) if the cluster is not usable.
export HPC_AGENT_REQUIRE_SLURM=1
set +e
"$PY" -m pytest tests -v --durations=15 "$@"
rc=$?
set -e
echo "[test] pytest exit code $rc after $(( $(date +%s) - start )) s"
if [ "$rc" -eq 5 ]; then
  echo "[test] pytest collected no tests: that is a failure" >&2
  exit 1
fi
exit "$rc"

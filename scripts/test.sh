#!/usr/bin/env bash
# The test suite on a fresh machine: install (scripts/setup.sh), bring up the localhost Slurm, run pytest.
#
#   bash scripts/test.sh [pytest args]            every test: unit, security, job, cluster (as root:
#                                                 cluster.sh installs Debian packages and starts Slurm daemons)
#   bash scripts/test.sh --quick [pytest args]    tests/unit alone: no Slurm, no torch, no training job; no root
#   bash scripts/test.sh --help
#
# The folders: tests/unit (pure code, fake Slurm, commands in subprocesses), tests/job (the training job and its
# torch/DeepSpeed parts on the CPU), tests/cluster (the real localhost Slurm), tests/security (the attacks of
# docs/security.md's threat model, login side, as root: a second user). tests/unit/test_layers.py keeps each test
# in its folder.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
case "${1:-}" in
  --quick) quick=1; shift ;;
  -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
start=$(date +%s)
bash scripts/setup.sh
# shellcheck source=scripts/python_env.sh
source scripts/python_env.sh
hpc_agent_venv
if [ "$quick" = 1 ]; then
  paths=(tests/unit) what="--quick: tests/unit"
else
  bash scripts/cluster.sh up
  # One real container run (tests/cluster/test_container_run_slurm.py) needs podman and runc: Debian packages,
  # installed here as root, best effort (without them that test skips and says why; apptainer, enroot and pyxis
  # are not packaged for Debian bookworm, docs/containers.md).
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && ! { command -v podman && command -v runc; } >/dev/null; then
    apt_log=/tmp/hpc-podman-apt.log
    { DEBIAN_FRONTEND=noninteractive apt-get install -y -q podman runc \
        || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q podman runc; }; } >"$apt_log" 2>&1 \
      || echo "[test] podman/runc could not be installed ($apt_log): the real container run will skip" >&2
  fi
  # Slurm tests must run here: fail (not skip) if the cluster is not usable.
  export HPC_AGENT_REQUIRE_SLURM=1
  paths=(tests) what="tests/unit, tests/security, tests/job, tests/cluster"
fi
set +e
"$PY" -m pytest "${paths[@]}" -v --durations=15 "$@"
rc=$?
set -e
echo "[test] pytest exit code $rc after $(( $(date +%s) - start )) s ($what)"
if [ "$rc" -eq 5 ]; then
  echo "[test] pytest collected no tests: that is a failure" >&2
  exit 1
fi
exit "$rc"

#!/usr/bin/env bash
# The demo on a fresh machine: install (scripts/setup.sh), bring up the localhost Slurm, submit the quickstart
# job, wait for it, and show where its results are. Run as root (cluster.sh installs and starts Slurm).
# Without root or Slurm: bash scripts/setup.sh && .venv/bin/python -m hpc_agent.submit quickstart --executor local --wait
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
say() { printf '[demo] %s\n' "$*"; }

bash scripts/setup.sh
# shellcheck source=scripts/python_env.sh
source scripts/python_env.sh
hpc_agent_venv
bash scripts/cluster.sh up

runs_root=$PWD/runs
out=$(mktemp)
trap 'rm -f "$out"' EXIT
say "submitting configs/quickstart.yaml (a tiny GPT, 10 steps on 1 CPU; about 10 s once it runs)"
set +e
# --wait prints the job's final state and, when it did not complete, the diagnosis (cause, evidence, fix).
"$PY" -m hpc_agent.submit configs/quickstart.yaml --wait --wait-timeout 600 "run.runs_root=$runs_root" | tee "$out"
rc=${PIPESTATUS[0]}
set -e
run_dir=$(sed -n 's/^run dir: *//p' "$out" | head -n1)
if [ "$rc" -ne 0 ]; then
  say "the quickstart job did not complete (submit exit code $rc); the cause is above"
  exit "$rc"
fi
png="$run_dir/review.png"
"$PY" -m hpc_agent.review "$run_dir" --plot "$png" >/dev/null
say "COMPLETED in $(( $(date +%s) - started )) s (set-up included). Where things are:"
say "  run directory:  $run_dir"
say "  TensorBoard:    $run_dir/tb   (view: $PY -m hpc_agent.review $run_dir --serve)"
say "  review plot:    $png"
say "  checkpoints:    $run_dir/checkpoints"
say "  table of runs:  $PY -m hpc_agent.review $runs_root"

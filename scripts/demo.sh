#!/usr/bin/env bash
# The demo on a fresh machine: install, bring up the localhost Slurm, submit the quickstart job and
# wait for it. Run as root. Without root/Slurm, use: python -m hpc_agent.submit quickstart --executor local --wait
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/cluster.sh up
python3 -m hpc_agent.submit configs/quickstart.yaml --wait

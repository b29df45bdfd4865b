"""Where the repo's shipped files live (configs/, sbatch_templates/, launch/).

hpc_agent is installed in editable mode from its checkout, so the shipped folders sit next to the
package. ``HPC_AGENT_HOME`` points elsewhere if they were moved.
"""
from __future__ import annotations

import os
from pathlib import Path


def repo_root() -> Path:
    return Path(os.environ.get("HPC_AGENT_HOME") or Path(__file__).resolve().parent.parent)


def configs_dir() -> Path:
    return repo_root() / "configs"


def templates_dir() -> Path:
    return repo_root() / "sbatch_templates"

"""The commit and the machine a benchmark's figures were taken on (docs/benchmarks.md, rule 5): one home for
every ``scripts/bench`` script's ``machine`` block."""
from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any, Dict

REPO = Path(__file__).resolve().parents[2]


def _git(*argv: str) -> str:
    try:
        return subprocess.run(["git", *argv], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine() -> Dict[str, Any]:
    """The commit and the machine the figures were taken on, and how busy it was."""
    cpu = ""
    try:
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), "")
        mem_kb = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                      if line.startswith("MemTotal"))
    except (OSError, StopIteration, ValueError):
        mem_kb = 0
    return {"commit": _git("rev-parse", "HEAD"),
            "worktree_changes": bool(_git("status", "--porcelain", "--untracked-files=no")),
            "cpu": cpu, "cpus": os.cpu_count(), "memory_gb": round(mem_kb / 2**20, 1),
            "python": platform.python_version(), "kernel": platform.release(),
            "load_average": [round(x, 2) for x in os.getloadavg()]}

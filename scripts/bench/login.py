"""Login-node latency (P6): ``submit --dry-run`` vs ``python -c "import torch"``, alternating, same session.

    python -m scripts.bench.login [--runs 10] [--config configs/quickstart.yaml] [--out results/bench_login.json]

Each run is a fresh interpreter started the way a user starts it, timed by wall clock from the spawn to
the exit (so interpreter start-up counts on both sides). The two commands alternate, and which one goes
first flips every round, so drift in machine load hits both alike. Needs no Slurm: ``--dry-run``
submits nothing and calls no Slurm command.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

REPO = Path(__file__).resolve().parents[2]
TARGET_S = 0.5
TARGET_RATIO = 0.3


# --- pure helpers (tests/unit/test_bench_login.py) --------------------------------------------------------------
def schedule(runs: int, names: Sequence[str]) -> List[Tuple[int, str]]:
    """(round, name) pairs: every name once a round, the order reversed on odd rounds."""
    out = []
    for i in range(runs):
        order = list(names) if i % 2 == 0 else list(reversed(names))
        out.extend((i, name) for name in order)
    return out


def summarise(samples: Dict[str, List[float]], ours: str, reference: str) -> Dict[str, object]:
    stats = {name: {"median_s": round(statistics.median(v), 3), "min_s": round(min(v), 3),
                    "max_s": round(max(v), 3), "runs": len(v)} for name, v in samples.items()}
    ratio = statistics.median(samples[ours]) / statistics.median(samples[reference])
    median = statistics.median(samples[ours])
    return {**stats, "ratio_ours_over_reference": round(ratio, 3),
            "target": {"max_s": TARGET_S, "max_ratio": TARGET_RATIO},
            "met": {"seconds": median <= TARGET_S, "ratio": ratio <= TARGET_RATIO}}


# --- the measurement ----------------------------------------------------------------------------------------
def time_command(argv: Sequence[str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(list(argv), cwd=str(REPO), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="runs of each command (default 10)")
    parser.add_argument("--config", default="configs/quickstart.yaml", help="config for submit --dry-run")
    parser.add_argument("--out", default=str(REPO / "results" / "bench_login.json"))
    args = parser.parse_args()
    commands = {"submit_dry_run": [sys.executable, "-m", "hpc_agent.submit", args.config, "--dry-run"],
                "import_torch": [sys.executable, "-c", "import torch"]}
    for argv in commands.values():  # warm the page cache once each, not counted
        time_command(argv)
    samples: Dict[str, List[float]] = {name: [] for name in commands}
    for i, name in schedule(args.runs, list(commands)):
        samples[name].append(time_command(commands[name]))
        print(f"  round {i + 1}: {name:15s} {samples[name][-1]:.3f} s", flush=True)
    summary = summarise(samples, "submit_dry_run", "import_torch")
    out = {"benchmark": "login-node latency: submit --dry-run vs import torch (wall clock, fresh interpreter)",
           "commands": {k: " ".join(v[1:]) for k, v in commands.items()}, "summary": summary,
           "samples_s": {k: [round(x, 4) for x in v] for k, v in samples.items()},
           "when": time.strftime("%Y-%m-%dT%H:%M:%S")}
    from hpc_agent.core.fsutil import atomic_write_json

    atomic_write_json(Path(args.out), out)
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

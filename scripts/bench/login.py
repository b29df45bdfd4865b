"""Login-node latency (P6): ``submit --dry-run`` vs ``python -c "import torch"``, alternating, same session.

    python -m scripts.bench.login [--runs 10] [--baseline REV] [--config configs/quickstart.yaml]
                                  [--out results/bench_login.json]

Each run is a fresh interpreter started the way a user starts it, timed by wall clock from the spawn to
the exit (so interpreter start-up counts on both sides). The commands alternate, and their order flips every
round, so drift in machine load hits all alike. ``--baseline REV`` also times ``submit --dry-run`` of another
revision (a git worktree, run from its own folder so that its own ``hpc_agent`` is imported) in the same rounds.
Needs no Slurm: ``--dry-run`` submits nothing and calls no Slurm command.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # also run as a file, not only with -m
    sys.path.insert(0, str(REPO))

from scripts.bench.worktree import worktree  # noqa: E402

TARGET_S = 0.5
TARGET_RATIO = 0.2


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
def time_command(argv: Sequence[str], cwd: Path = REPO) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(list(argv), cwd=str(cwd), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="runs of each command (default 10)")
    parser.add_argument("--config", default="configs/quickstart.yaml", help="config for submit --dry-run")
    parser.add_argument("--baseline", metavar="REV", help="also time submit --dry-run of this git revision")
    parser.add_argument("--out", default=str(REPO / "results" / "bench_login.json"))
    args = parser.parse_args()
    submit = [sys.executable, "-m", "hpc_agent.submit", args.config, "--dry-run"]
    with contextlib.ExitStack() as stack:
        commands: Dict[str, Tuple[List[str], Path]] = {"submit_dry_run": (submit, REPO),
                                                        "import_torch": ([sys.executable, "-c", "import torch"], REPO)}
        if args.baseline:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-login-")))
            commands["submit_dry_run_baseline"] = (submit, stack.enter_context(worktree(args.baseline, tmp / "base")))
        for argv, cwd in commands.values():  # warm the page cache once each, not counted
            time_command(argv, cwd)
        samples: Dict[str, List[float]] = {name: [] for name in commands}
        for i, name in schedule(args.runs, list(commands)):
            samples[name].append(time_command(*commands[name]))
            print(f"  round {i + 1}: {name:24s} {samples[name][-1]:.3f} s", flush=True)
    summary = summarise(samples, "submit_dry_run", "import_torch")
    out = {"benchmark": "login-node latency: submit --dry-run vs import torch (wall clock, fresh interpreter)",
           "commands": {k: " ".join(v[0][1:]) for k, v in commands.items()}, "summary": summary,
           "samples_s": {k: [round(x, 4) for x in v] for k, v in samples.items()},
           "when": time.strftime("%Y-%m-%dT%H:%M:%S")}
    if args.baseline:  # the same rounds, the baseline's submit against the same import torch
        base = summarise(samples, "submit_dry_run_baseline", "import_torch")
        out["baseline"] = {"revision": args.baseline, "revision_sha": _sha(args.baseline),
                           "ratio_baseline_over_reference": base["ratio_ours_over_reference"], "met": base["met"],
                           "ratio_ours_over_baseline": round(statistics.median(samples["submit_dry_run"])
                                                             / statistics.median(samples["submit_dry_run_baseline"]), 3)}
    out["revision_sha"] = _sha("HEAD")
    from hpc_agent.core.fsutil import atomic_write_json

    atomic_write_json(Path(args.out), out)
    print(json.dumps({k: out[k] for k in ("summary", "baseline") if k in out}, indent=2))
    return 0


def _sha(rev: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), "rev-parse", rev], capture_output=True, text=True).stdout.strip()


if __name__ == "__main__":
    sys.exit(main())

"""``python -m hpc_agent.review <sweep dir>``: the trials table and the objective-vs-trial plot of a sweep.

A sweep directory (``<runs root>/sweeps/<name>``) holds ``sweep.json``, which names the Optuna storage.
The rows are built by pure functions from plain trial records, so they are tested without Optuna;
Optuna and matplotlib are imported only when a sweep is actually reviewed.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence

from hpc_agent.sweep.spec import best_so_far

SWEEP_FILE = "sweep.json"


def is_sweep_dir(path: Path) -> bool:
    return (Path(path) / SWEEP_FILE).is_file()


def trial_row(number: int, state: str, value: Optional[float], params: Mapping[str, Any],
              attrs: Mapping[str, Any], intermediate: Mapping[int, float]) -> Dict[str, Any]:
    """One trial as the table and the JSON show it."""
    last_step = max(intermediate) if intermediate else None
    return {"trial": number, "state": state.lower(), "objective": value, "params": dict(params),
            "run_id": attrs.get("run_id"), "job_id": attrs.get("job_id"), "last_step": last_step,
            "last_intermediate": intermediate[last_step] if last_step is not None else None,
            "pruned_at_step": attrs.get("pruned_at_step"), "fail_reason": attrs.get("fail_reason")}


def summarize(rows: Sequence[Mapping[str, Any]], direction: str, startup_trials: int) -> Dict[str, Any]:
    """Counts, the best trial, the best-so-far curve, and the median of the random start-up trials
    (what the adaptive phase has to beat)."""
    ordered = sorted(rows, key=lambda r: r["trial"])
    values = [r["objective"] if r["state"] == "complete" else None for r in ordered]
    done = [(r["trial"], v) for r, v in zip(ordered, values) if v is not None]
    best = None
    if done:
        pick = max if direction == "maximize" else min
        best = pick(done, key=lambda tv: tv[1])
    startup = [v for r, v in zip(ordered, values) if r["trial"] < startup_trials and v is not None]
    counts: Dict[str, int] = {}
    for r in ordered:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    return {"counts": counts, "best_trial": best[0] if best else None, "best_value": best[1] if best else None,
            "median_startup": statistics.median(startup) if startup else None,
            "best_so_far": best_so_far(values, direction)}


def load_rows(sweep_dir: Path) -> Dict[str, Any]:
    """The sweep's description and trial rows, read from its Optuna storage."""
    from hpc_agent.core.extras import require

    optuna = require("optuna", "sweep", "reviewing a sweep")

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    info = json.loads((Path(sweep_dir) / SWEEP_FILE).read_text())
    study = optuna.load_study(study_name=info["name"], storage=info["storage"])
    rows = [trial_row(t.number, t.state.name, t.value, t.params, t.user_attrs, t.intermediate_values)
            for t in study.get_trials(deepcopy=False)]
    return {"sweep": info, "trials": rows,
            "summary": summarize(rows, info["direction"], int(info.get("startup_trials", 0)))}


def render(report: Mapping[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    info, summary = report["sweep"], report["summary"]
    table = Table(title=f"sweep {info['name']}: {info['direction']} {info['tag']}")
    keys = sorted({k for r in report["trials"] for k in r["params"]})
    for col in ("trial", "state", "objective", *keys, "last step", "run"):
        table.add_column(col, overflow="fold")
    for r in sorted(report["trials"], key=lambda r: r["trial"]):
        # Optuna stores a pruned trial's last intermediate value as its value: shown in parentheses.
        final = r["state"] == "complete" and r["objective"] is not None
        value = r["objective"] if final else r["last_intermediate"]
        shown = "-" if value is None else (f"{value:.4g}" if final else f"({value:.4g})")
        mark = " *" if r["trial"] == summary["best_trial"] else ""
        table.add_row(f"{r['trial']}{mark}", r["state"], shown, *[_fmt(r["params"].get(k)) for k in keys],
                      "-" if r["last_step"] is None else str(r["last_step"]), r["run_id"] or "-")
    console = Console(width=160)
    console.print(table)
    counts = ", ".join(f"{n} {s}" for s, n in sorted(summary["counts"].items()))
    console.print(f"trials: {counts}; best: trial {summary['best_trial']} = {_fmt(summary['best_value'])}; "
                  f"median of the random start-up trials: {_fmt(summary['median_startup'])}  "
                  "(* best; (x) = last intermediate value of an unfinished or pruned trial)")


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def plot(report: Mapping[str, Any], out: Path) -> Path:
    """Objective per trial (pruned trials at their last intermediate value, hollow) and the best-so-far line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted(report["trials"], key=lambda r: r["trial"])
    fig, ax = plt.subplots(figsize=(8, 4.5))
    done = [(r["trial"], r["objective"]) for r in rows if r["state"] == "complete" and r["objective"] is not None]
    pruned = [(r["trial"], r["last_intermediate"]) for r in rows
              if r["state"] == "pruned" and r["last_intermediate"] is not None]
    if done:
        ax.scatter(*zip(*done), color="tab:blue", label="complete", zorder=3)
    if pruned:
        ax.scatter(*zip(*pruned), facecolors="none", edgecolors="tab:red", label="pruned (last value)", zorder=3)
    curve = [(r["trial"], b) for r, b in zip(rows, report["summary"]["best_so_far"]) if b is not None]
    if curve:
        ax.step(*zip(*curve), where="post", color="tab:green", label="best so far")
    startup = int(report["sweep"].get("startup_trials", 0))
    if startup and rows:
        ax.axvline(startup - 0.5, color="grey", linestyle=":", label="random | TPE")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("trial")
    ax.set_ylabel(report["sweep"]["tag"])
    ax.set_title(f"sweep {report['sweep']['name']} ({report['sweep']['direction']})")
    ax.legend(loc="best")
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def review_sweep(sweep_dir: Path, as_json: bool, plot_path: Optional[str]) -> int:
    report = load_rows(sweep_dir)
    out = plot(report, Path(plot_path) if plot_path else Path(sweep_dir) / "sweep.png")
    if as_json:
        print(json.dumps(dict(report, plot=str(out)), indent=2, default=str))
    else:
        render(report)
        print(f"plot: {out}")
    return 0

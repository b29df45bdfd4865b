"""Plotting and boundary labels for ``hpc_agent.review``; matplotlib is imported only inside ``build_figure``."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence

from hpc_agent.core.in_job_journal import ADAPT_ACTION
from hpc_agent.policy.adaptive_lr import adaptation_kind
from hpc_agent.policy.decide import REQUEUE, RESUBMIT

NO_BOUNDARY_CAUSES = frozenset({"completed", "running", "pending"})
# The watcher's notices about a running attempt (hpc_agent.watcher.follow_hang): it asked for the stacks of a run
# that looked hung, or the run moved on; a notification sent (hpc_agent/watcher/notifier.py); an action the kill
# switch refused (hpc_agent/state/audit.py record_refused). None ends an attempt nor
# names its cause; the decision does.
NOTICE_ACTIONS = frozenset({"hang_suspected", "hang_cleared", "notification", "refused"})
# What starts another attempt after the one a record is about: the policy's requeue and resubmit, and the
# expedite of a job Slurm requeued itself (hpc_agent/watcher/follow.py).
NEXT_ATTEMPT_ACTIONS = frozenset({REQUEUE, RESUBMIT, "expedite"})


def is_notice(record: Mapping[str, Any]) -> bool:
    return record.get("action") in NOTICE_ACTIONS


def _short_key(dotted: str) -> str:
    """``train.micro_batch_size`` -> ``micro_batch``; ``slurm.exclude`` -> ``exclude``."""
    key = dotted.rsplit(".", 1)[-1]
    return key[: -len("_size")] if key.endswith("_size") else key


def _fmt(value: Any) -> str:
    if value is None or value == "":
        return "none"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def event_label(record: Mapping[str, Any]) -> str:
    """One events.jsonl record as a marker label: ``preempted``, ``gpu_oom: micro_batch 8→4``, or for an
    adaptation of the LR schedule its kind, ``adaptive: warm_restart``."""
    cause = str(record.get("cause") or (record.get("decision") or {}).get("cause") or record.get("action") or "?")
    if is_adaptation(record):
        kind = adaptation_kind(str(record.get("reason") or ""))
        return f"{cause}: {kind}" if kind else cause
    diff = record.get("config_diff") or {}
    changes = [f"{_short_key(k)} {_fmt(v.get('from'))}→{_fmt(v.get('to'))}"
               for k, v in sorted(diff.items()) if isinstance(v, Mapping)]
    return f"{cause}: {', '.join(changes)}" if changes else cause


def boundary_labels(events: Sequence[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """``[{"attempt": N, "label": str, "time": iso|None}]``: one per attempt boundary, in order.

    ``attempt`` is the 0-based index of the attempt that starts at the boundary; the watcher writes the
    1-based number of the attempt that ended, which is the same number. Records without one are taken
    in order. Several records for the same boundary (an expedite, then a decision) are merged.
    """
    out: List[Dict[str, Any]] = []
    for record in events:
        cause = record.get("cause")
        if cause in NO_BOUNDARY_CAUSES or record.get("action") == "done" or is_in_job(record) or is_notice(record):
            continue
        attempt = record.get("attempt")
        if not isinstance(attempt, int):
            attempt = (out[-1]["attempt"] + 1) if out else 1
        label = event_label(record)
        same = [b for b in out if b["attempt"] == attempt]
        if same:
            if label not in same[0]["label"].split("; "):
                # a decision with a config diff says more than a bare cause: keep the richer label first
                merged = [label] + [p for p in same[0]["label"].split("; ") if p not in label]
                same[0]["label"] = "; ".join(sorted(set(merged), key=merged.index))
            continue
        out.append({"attempt": attempt, "label": label, "time": record.get("time")})
    return sorted(out, key=lambda b: b["attempt"])


def attempts_shown(events: Sequence[Mapping[str, Any]]) -> int:
    """How many attempts the audit trail shows: 1 for any record at all, and each record's ``attempt``, the
    run-wide 1-based number of the attempt it is about (the watcher's decisions and notices, the job's in-job
    repairs, the actions carried out). Only a requeue or resubmit (decided, or carried out) and the expedite of
    Slurm's own requeue also show the attempt after it: a stop, a park, a notice or an in-job repair does not."""
    shown = 1 if events else 0
    for record in events:
        number = record.get("attempt")
        if not isinstance(number, int) or isinstance(number, bool):
            continue
        decision = record.get("decision") if isinstance(record.get("decision"), Mapping) else {}
        actions = {decision.get("action"), record.get("action")}
        starts_next = bool(actions & NEXT_ATTEMPT_ACTIONS) and not is_in_job(record)
        shown = max(shown, number + 1 if starts_next else number)
    return shown


def is_in_job(record: Mapping[str, Any]) -> bool:
    """A decision the job made inside its allocation: no attempt boundary, a marker at its step."""
    return record.get("decided_in") == "job"


def is_adaptation(record: Mapping[str, Any]) -> bool:
    """The job adapted its LR schedule (``adaptive:``): a marker of its own colour, not a repair."""
    return is_in_job(record) and record.get("action") == ADAPT_ACTION


def in_job_markers(events: Sequence[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """``[{"step": N, "label": "(in job) gpu_oom: micro_batch 8→4", "adaptive": False}]``, one per in-job
    decision with a step; ``adaptive`` marks an adaptation of the LR schedule."""
    return [{"step": r["step"], "label": f"(in job) {event_label(r)}", "adaptive": is_adaptation(r)} for r in events
            if is_in_job(r) and isinstance(r.get("step"), int) and not isinstance(r.get("step"), bool)]


def _label(ax, x: float, y: float, text: str, color: str) -> None:
    """A boxed label beside a marker line; on the left of it when the line is in the right half."""
    lo, hi = ax.get_xlim()
    right_half = hi > lo and (x - lo) / (hi - lo) > 0.5
    ax.text(x, y, text, color=color, fontsize=8, va="top", ha="right" if right_half else "left",
            transform=ax.get_xaxis_transform(), zorder=5,
            bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": color, "lw": 0.6, "alpha": 0.9})


def _silent_gap(ax, live: Mapping[str, Any]) -> None:
    """A live run's throughput panel runs up to now, the span since its last step shaded and labelled."""
    import matplotlib.dates as mdates
    from datetime import datetime

    from hpc_agent.runs.liveness import duration

    now = datetime.fromtimestamp(live["now"])
    end = mdates.date2num(now)
    lo = ax.get_xlim()[0] if ax.has_data() else end - 1.0 / 1440  # an empty panel: the last minute
    if live.get("last_step_at") is None or live["last_step_at"] >= live["now"]:  # no step yet, or a clock ahead
        ax.set_xlim(min(lo, end - 1.0 / 1440), end)
        return
    last = datetime.fromtimestamp(live["last_step_at"])
    hung = bool(live.get("verdict"))
    color = "tab:red" if hung else "0.6"
    ax.axvspan(last, now, color=color, alpha=0.18, lw=0, label="silent")
    ax.set_xlim(min(lo, mdates.date2num(last)), end)
    text = f"silent {duration(live['silent_s'])}" + (": looks hung" if hung else "")
    ax.text(end, 0.5, text, color=color if hung else "0.3", fontsize=8, ha="right",
            va="center", rotation=90, transform=ax.get_xaxis_transform(), zorder=5)


def plot_runs(runs: Sequence[Mapping[str, Any]], out: Path) -> Path:
    """Save :func:`build_figure` as a PNG."""
    import matplotlib.pyplot as plt

    fig = build_figure(runs)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def build_figure(runs: Sequence[Mapping[str, Any]]):
    """One row per run: loss and LR against step (twin axes), samples/s against wall time; one
    vertical marker per attempt boundary in both panels, labelled with its cause/decision, and one per
    in-job decision in the loss panel. A live run's throughput panel runs up to ``run["live"]["now"]``
    with the silence since its last step shaded (nothing here reads the clock: the PNG is reproducible)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt
    from datetime import datetime

    rows = max(1, len(runs))
    fig, axes = plt.subplots(rows, 2, figsize=(13, 4.2 * rows), squeeze=False)
    colors = ["tab:red", "tab:purple", "tab:brown", "tab:olive", "tab:cyan"]
    for row, run in zip(axes, runs):
        ax_loss, ax_tp = row
        curves = run.get("_curves", {})
        loss = curves.get("train/loss", [])
        lr = curves.get("train/lr", [])
        tp = curves.get("perf/samples_per_s", [])
        ax_loss.plot([p[0] for p in loss], [p[2] for p in loss], color="tab:blue", label="train/loss")
        lost = curves.get("lost_loss", [])
        if lost:
            ax_loss.plot([p[0] for p in lost], [p[2] for p in lost], "x", ms=4, color="0.5",
                         label=f"lost: {len(lost)} steps re-run")
        ax_loss.set_xlabel("step")
        ax_loss.set_ylabel("loss", color="tab:blue")
        ax_loss.set_title(f"{run['run_id']}: loss and LR")
        ax_top = ax_loss  # labels go on the topmost axes, above every curve
        if lr:
            ax_lr = ax_top = ax_loss.twinx()
            ax_lr.plot([p[0] for p in lr], [p[2] for p in lr], color="tab:orange", label="train/lr")
            ax_lr.set_ylabel("learning rate", color="tab:orange")
            ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
            handles = ax_loss.get_legend_handles_labels()
            extra = ax_lr.get_legend_handles_labels()
            ax_loss.legend(handles[0] + extra[0], handles[1] + extra[1], loc="center right", fontsize=8)
        ax_tp.plot([datetime.fromtimestamp(p[1]) for p in tp], [p[2] for p in tp], ".", ms=3, color="tab:green")
        ax_tp.set_xlabel("wall time")
        ax_tp.set_ylabel("samples/s", color="tab:green")
        ax_tp.set_title(f"throughput (median {run.get('throughput') or 0:.1f}/s), ETTR {run.get('ettr') or 0:.2f}")
        ax_tp.xaxis.set_major_locator(mdates.AutoDateLocator(minticks=4, maxticks=8))
        ax_tp.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))
        if run.get("live"):  # before the markers: their labels are placed by where they fall on the x range
            _silent_gap(ax_tp, run["live"])
        for i, b in enumerate(run.get("boundaries", [])):
            color = colors[i % len(colors)]
            text = f"attempt {b['attempt']}: {b['label']}"
            y = 0.97 - 0.09 * i  # staggered, so boundaries at the same step stay readable
            if b.get("step") is not None:
                ax_loss.axvline(b["step"] - 0.4 * i, color=color, ls="--", lw=1.2)
                _label(ax_top, b["step"], y, text, color)
            if b.get("wall_time") is not None:
                when = datetime.fromtimestamp(b["wall_time"])
                ax_tp.axvline(when, color=color, ls="--", lw=1.2)
                _label(ax_tp, mdates.date2num(when), y, text, color)
        for i, marker in enumerate(run.get("in_job", [])):
            color = "tab:olive" if marker.get("adaptive") else "tab:gray"  # an LR adaptation, or a repair
            ax_loss.axvline(marker["step"], color=color, ls=":", lw=1.2)
            _label(ax_top, marker["step"], 0.3 + 0.09 * i, marker["label"], color)
    fig.tight_layout()
    fig.canvas.draw()
    return fig


GOODPUT_COLORS = {"productive": "tab:green", "preemption": "tab:orange", "oom": "tab:red", "hang": "tab:purple",
                  "node_failure": "tab:brown", "divergence": "tab:pink", "restart_overhead": "tab:olive",
                  "steps_redone": "tab:cyan", "checkpoint_save": "tab:blue", "in_progress": "0.75", "other": "0.45",
                  "queued": "0.9"}
"""One colour per goodput bucket (:data:`hpc_agent.runs.goodput.BUCKETS`) and for the queued time."""


def plot_goodput(rows: Sequence[Mapping[str, Any]], out: Path) -> Path:
    """A stacked bar per run (device-hours): queued while eligible, then each bucket of the allocation, ETTR above
    each bar. ``rows`` are :func:`hpc_agent.runs.goodput.summary_row`'s. matplotlib is imported here only."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hpc_agent.runs.goodput import BUCKETS

    names = [str(r["run"]) for r in rows]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.4 * len(rows) + 3.0), 5.0))
    bottoms = [0.0] * len(rows)
    for bucket in ("queued",) + BUCKETS:
        values = [float(r.get(f"{bucket}_h") or 0.0) for r in rows]
        if not any(values):
            continue
        ax.bar(names, values, bottom=bottoms, color=GOODPUT_COLORS.get(bucket, "0.5"), label=bucket.replace("_", " "),
               hatch="//" if bucket == "queued" else None, edgecolor="white", linewidth=0.5)
        bottoms = [b + v for b, v in zip(bottoms, values)]
    for x, (top, r) in enumerate(zip(bottoms, rows)):
        if r.get("ettr") is not None:
            ax.text(x, top, f"ETTR {r['ettr']:.2f}", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("device-hours (GPU-hours; CPU-only runs: 1 device)")
    ax.set_title("goodput: where the allocation went")
    handles, labels = ax.get_legend_handles_labels()  # top of the legend = top of the stack
    ax.legend(handles[::-1], labels[::-1], fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.tick_params(axis="x", labelrotation=20)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out

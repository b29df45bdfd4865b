"""The live half of ``review``: how long ago a running run last stepped, and whether that looks like a hang.

The last step is the newest of the TensorBoard step's wall time and the heartbeats' ``step_at`` (a
heartbeat is written every few seconds from a thread, TensorBoard only when a step is logged). Whether
the silence is a hang is :func:`hpc_agent.diagnosis.hang.judge`'s verdict, the watcher's own rule, called
here and never recomputed: review and the watcher cannot disagree about a run.

:func:`live_view` and :func:`describe` are pure; :func:`read_live` reads the heartbeats and the run's
``resilience:`` settings. Login-node code: no torch.
"""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple

from hpc_agent.config.load import load_run_config
from hpc_agent.core import rundir
from hpc_agent.diagnosis.hang import judge as hang_judge

# Phases where no step is expected, so silence means nothing: queued, not yet submitted, or the attempt
# has ended and the watcher is carrying out its decision.
QUIET_PHASES = frozenset({"submitting", "pending", "recovering"})


def duration(seconds: float) -> str:
    """``42 s``, ``4 min 12 s``, ``4 min``, ``2 h 5 min``: a person's reading of a span."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        minutes, rest = divmod(s, 60)
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    hours, rest = divmod(s // 60, 60)
    return f"{hours} h {rest} min" if rest else f"{hours} h"


def live_view(phase: str, now: float, tb_last: Optional[Tuple[int, float]], beats: Sequence[Any],
              attempt_started_at: Optional[float], settings: Any, judge=hang_judge) -> Dict[str, Any]:
    """What review says about a live run (pure: ``judge`` is the watcher's hang verdict, passed in).

    ``tb_last`` is ``(step, wall time)`` of the newest TensorBoard step; ``beats`` the ranks' heartbeats.
    The newest ``step_at`` of any beat wins over TensorBoard when it is newer (TensorBoard may log only
    every few steps). The verdict is asked for only where a step is expected and this attempt has written
    a heartbeat (one written after ``attempt_started_at``, the newest submission): without one the judge
    can only rule on a start-up stall, and that needs the Slurm start time, which the watcher has and review
    has not (a job that queued for an hour is no stall). A job of an older hpc_agent writes no heartbeat."""
    last_step, last_at, source = None, None, ""
    if tb_last is not None:
        (last_step, last_at), source = tb_last, "tensorboard"
    stepped = [b for b in beats if b.step_at is not None]
    if stepped:
        newest = max(stepped, key=lambda b: (b.step_at, b.step))
        if last_at is None or newest.step_at > last_at:
            last_step, last_at, source = newest.step, newest.step_at, "heartbeat"
    verdict = None
    this_attempt = [b for b in beats if attempt_started_at is None or b.written_at >= attempt_started_at]
    if this_attempt and phase not in QUIET_PHASES:
        found = judge(list(beats), now, attempt_started_at, settings)
        verdict = asdict(found) if found is not None else None
        if verdict is not None:
            verdict["ranks"] = list(verdict["ranks"])
    phases = sorted({b.phase for b in beats})
    return {"now": now, "last_step": last_step, "last_step_at": last_at, "source": source,
            "silent_s": round(now - last_at, 3) if last_at is not None else None,
            "job_phases": phases, "heartbeats": len(beats), "verdict": verdict,
            "step_expected": phase not in QUIET_PHASES}


SILENT_AS = {"step": "no step", "startup": "starting", "saving": "saving", "evaluating": "evaluating",
             "heartbeat_lost": "no heartbeat"}  # what the silence of each verdict kind is, in words


def describe(live: Optional[Dict[str, Any]]) -> str:
    """One line for the table: ``last step 4 min 12 s ago (step 37)``, and past the hang limit
    ``; no step for 4 min (limit 2 min): looks hung (kind step, <the judge's reason>)``; "" for an ended run."""
    if not live:
        return ""
    if live.get("last_step_at") is None:
        doing = f" ({', '.join(live['job_phases'])})" if live.get("job_phases") else ""
        text = f"no step yet{doing}"
    else:
        text = f"last step {duration(live['silent_s'])} ago (step {live['last_step']})"
    verdict = live.get("verdict")
    if verdict:
        what = SILENT_AS.get(verdict["kind"], verdict["kind"])
        text += (f"; {what} for {duration(verdict['silent_s'])} (limit {duration(verdict['limit_s'])}): "
                 f"looks hung (kind {verdict['kind']}, {verdict['reason']})")
    elif live.get("heartbeats") == 0 and live.get("step_expected"):
        text += "; no heartbeat, so no hang verdict"
    return text


def _settings(run_dir: Path):
    """The run's ``resilience:`` settings from its config snapshot; the defaults when it has none."""
    from hpc_agent.config.resilience import ResilienceConfig

    try:
        return load_run_config(run_dir).resilience
    except Exception:  # absent or broken snapshot: the verdict still needs numbers; the defaults are documented
        return ResilienceConfig()


def read_live(run_dir: Path, phase: str, now: float, tb_last: Optional[Tuple[int, float]],
              attempt_started_at: Optional[float]) -> Dict[str, Any]:
    """:func:`live_view` for a run directory: its heartbeats (untrusted, read by ``rundir``) and settings."""
    beats = rundir.read_heartbeats(run_dir)  # the judge keeps the newest attempt's; the newest step_at wins anyway
    return live_view(phase, now, tb_last, beats, attempt_started_at, _settings(run_dir))

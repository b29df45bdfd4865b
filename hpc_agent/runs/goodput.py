"""Goodput: where a run's allocated device-hours went, and ETTR. The one home for time accounting. Pure.

Used by ``hpc-agent review --goodput`` (through :mod:`hpc_agent.runs.history`), by ``review``'s plain ETTR column,
and by the chaos report and the benchmarks (:func:`time_lost`, :func:`ettr`).

Sources (all read by the existing bounded readers; the job can write the run's files, so they are input, not truth):

- **sacct** (``sacct -D``): one row per attempt with Submit, Eligible, Start, End and AllocTRES. An attempt's
  allocation is ``End - Start`` (``now - Start`` while it runs) times its devices: the GPUs in AllocTRES
  (``gres/gpu=N``), else the run config's ``nodes x gpus_per_node``; a CPU-only run counts one device per
  attempt and says so (``devices_note``).
- **the ledger and events.jsonl**: why each attempt ended (the watcher's decision: preempted, gpu_oom, hung, ...;
  without one, the cause sacct's state alone gives) and the job's own repairs inside its allocation (an OOM or a
  divergence repaired in the job, with the step).
- **TensorBoard**: every logged step with its wall time and step time, including the points a later attempt (or an
  in-job rollback) overwrote: those steps were trained and then thrown away.

The buckets partition each attempt's allocation exactly (so they add up to the allocation):

``productive``
    the step time of every step whose result was kept (the point that wins in TensorBoard).
``steps_redone``
    the step time of steps whose result was thrown away: trained after the checkpoint a resume or a rollback went
    back to (Google's "progress wasted by a disruption").
``restart_overhead``
    from an attempt's start to its first step: program start-up, data loader start, checkpoint restore
    (Google's "program start-up" + "checkpoint restore"; Meta's "time to start" / part of "time to recover").
    The first attempt's start-up is counted here too.
``preemption`` / ``oom`` / ``hang`` / ``node_failure`` / ``divergence``
    the time from an attempt's last step to its end, charged to why it ended (preempted; gpu_oom or host_oom;
    hung; node_fail or gpu_hw_error; diverged), and a gap between two steps (beyond ``gap_s``) that an in-job
    repair of that cause explains (an OOM repaired in the job, a rollback after a divergence).
``checkpoint_save``
    a gap between two steps right after a step that is a multiple of ``train.ckpt_every`` (the periodic save); a
    save at the end of an attempt is inside that attempt's end bucket.
``in_progress``
    a running attempt's time since its last step: not lost yet, not productive either.
``other``
    everything else: the loop's own time between steps (logging; ``<= gap_s`` each), gaps nothing explains, the
    end of an attempt that completed (the final save, exit), and ends for causes without a bucket (timeout,
    cancelled, code_error, ...: ``other_by_cause`` names them).

``queued`` (outside the allocation) is the time each attempt waited while eligible to start: ``Start -
Eligible`` (``Submit`` when there is no Eligible column), times its devices; time held or waiting for a begin
time is not eligible and is not counted.

ETTR is Meta's: productive / (queued-while-eligible + allocated), allocated = productive + unproductive.

References (definitions only; no code was taken from them):
- Kokolis et al., "Revisiting Reliability in Large-Scale Machine Learning Research Clusters" (Meta, HPCA 2025),
  ETTR: https://arxiv.org/abs/2410.21680
- Meta, "Optimizing Effective Training Time for Meta's Internal Recommendation/Ranking Workloads" (time to start,
  time to recover, failures): https://pytorch.org/blog/optimizing-effective-training-time-for-metas-internal-recommendation-ranking-workloads/
- Google, ``ml-goodput-measurement`` (badput: TPU/accelerator initialisation, training preparation, program
  start-up, data loading, checkpoint save and restore, progress wasted by a disruption):
  https://github.com/google/cloud_tpu_goodput
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from hpc_agent.diagnosis.classify import classify_attempt
from hpc_agent.slurm.sacct import Attempt, sacct_epoch

GAP_S = 1.0
"""Wall time between two steps beyond the later step's own time, above which it is a gap (a fault's recovery,
a checkpoint save) rather than the loop's own work between steps (logging, snapshots: ~1 ms)."""
END_SLACK_S = 1.0
"""sacct's End is whole seconds (truncated): a step logged up to this long after it still belongs to the attempt."""

PRODUCTIVE = "productive"
LOST = ("preemption", "oom", "hang", "node_failure", "divergence", "restart_overhead", "steps_redone",
        "checkpoint_save", "in_progress", "other")
BUCKETS = (PRODUCTIVE,) + LOST
"""Every bucket of the allocation, in the order the table, the CSV and the plot show them."""
CAUSE_BUCKET: Dict[str, str] = {
    "preempted": "preemption", "gpu_oom": "oom", "host_oom": "oom", "hung": "hang", "node_fail": "node_failure",
    "gpu_hw_error": "node_failure", "diverged": "divergence", "running": "in_progress",
}
"""An attempt's end cause (``hpc_agent.core.causes``) -> its bucket; any other cause lands in ``other``."""
GOODPUT_FIELDS = ("JobID", "JobName", "State", "ExitCode", "NodeList", "Submit", "Eligible", "Start", "End",
                  "Elapsed", "AllocTRES")
"""The sacct columns goodput reads (``hpc_agent.slurm.cli.SlurmCLI.sacct(fields=...)``)."""


# --- the one split of a window ------------------------------------------------------------------------------
def _split(start: float, end: float, points: Sequence[Tuple[int, float, float]], gap_s: float
           ) -> Tuple[float, List[Tuple[int, float]], float, float]:
    """``points`` (``(step, wall_time as the step ended, step_time)``, sorted by wall time, all ending by ``end``)
    -> ``(before the first step, [(index of the point after a gap, gap seconds)], loop time between steps,
    after the last step)``. With the step times these add up to ``end - start``."""
    if not points:
        return end - start, [], 0.0, 0.0
    before = points[0][1] - points[0][2] - start
    gaps: List[Tuple[int, float]] = []
    between = 0.0
    for i in range(1, len(points)):
        idle = points[i][1] - points[i - 1][1] - points[i][2]
        if idle > gap_s:
            gaps.append((i, idle))
        else:
            between += idle
    return before, gaps, between, end - points[-1][1]


def time_lost(start: float, end: float, points: Sequence[Tuple[int, float, float]], gap_s: float = GAP_S) -> Dict[str, Any]:
    """ETTR's productive time and where the rest of one window went, from the kept step series: ``points`` are
    ``(step, wall_time, step_time)`` of each kept step (the wall time is taken as the step ended). Only steps that
    ended by ``end`` count: a run that goes on training while its summary is read must not be credited with steps
    past its window. The parts add up to ``end - start - productive_s``: before the first step, each gap (sorted by
    size; ``at_s``: seconds from ``start`` to the step before it), the loop's time between steps, and after the
    last step. (The chaos report's view: one window from submission, no sacct; :func:`account` is the per-attempt
    view.)"""
    points = sorted(p for p in points if p[1] <= end)
    productive = sum(p[2] for p in points)
    before, split_gaps, between, after = _split(start, end, points, gap_s)
    gaps = [{"before_step": points[i][0], "at_s": round(points[i - 1][1] - start, 3), "s": round(idle, 3)}
            for i, idle in split_gaps]
    gaps_s = sum(g["s"] for g in gaps)
    return {"productive_s": round(productive, 3), "before_first_step_s": round(before, 3),
            "gaps": sorted(gaps, key=lambda g: -g["s"]),
            "gaps_s": round(gaps_s, 3), "between_steps_s": round(between, 3), "after_last_step_s": round(after, 3),
            "lost_s": round(before + gaps_s + between + after, 3)}


LOOKBACK_S = 60.0
"""How long before a gap a fault may have been injected and still be its cause: a fault can take a while to end the
attempt it hit (a leak growing to the memory limit, a hang found by the heartbeat's floor) while steps go on."""


def lost_by_cause(lost: Mapping[str, Any], faults: Sequence[Tuple[str, float]], window_s: float,
                  ckpt_every: int = 0, startup_s: Optional[float] = None,
                  lookback_s: float = LOOKBACK_S) -> Dict[str, float]:
    """:func:`time_lost`'s parts charged to causes, for a window into which ``faults`` (``(kind, seconds from the
    window's start)``) were injected. Pure.

    Each lost stretch (the time before the first kept step, each gap, the time after the last kept step) is charged
    to the faults injected before it ended, no more than ``lookback_s`` before it began, and not charged to an
    earlier stretch: each fault gets the stretch from its injection (or the stretch's start, for the first) to the
    next such fault's injection (or the stretch's end). That is the fault's detection, the restart and the steps it
    made the run train again: work that a later rollback or a resume from an older checkpoint threw away lies
    before the first kept step, and is charged to the fault that threw it away. Otherwise:

    - before the first step: ``start_up`` (with faults in it, the first ``startup_s`` seconds, when given);
    - a gap with no new fault: ``checkpoint_save`` when the step before it is a multiple of ``ckpt_every``, else
      the newest fault injected before it (a real fault recurs until its cause is gone: a resubmission that
      meets it again), else ``other``; the time after the last step likewise, without the save rule;
    - the loop's time between steps, and a last stretch no longer than ``GAP_S``: ``between_steps``.

    The parts add up to ``lost["lost_s"]``."""
    out: Dict[str, float] = {}
    injected = sorted((at, kind) for kind, at in faults)
    left = list(injected)  # those not charged yet

    def add(cause: str, seconds: float) -> None:
        if seconds > 0:
            out[cause] = round(out.get(cause, 0.0) + seconds, 3)

    def charge(begin: float, end: float, otherwise: str, head: Optional[Tuple[float, str]] = None) -> None:
        hits = [(at, kind) for at, kind in left if at <= end]
        for hit in hits:  # charged now, or too old to explain anything later
            left.remove(hit)
        hits = [hit for hit in hits if hit[0] >= begin - lookback_s]
        if not hits:
            # No new fault: a fault still acting (it recurs until its cause is gone) explains it, unless the
            # stretch is the periodic save's
            acting = [kind for at, kind in injected if at <= begin]
            add(acting[-1] if acting and otherwise != "checkpoint_save" else otherwise, end - begin)
            return
        if head is not None:
            add(head[1], min(head[0], end) - begin)
            begin = min(head[0], end)
        for i, (_, kind) in enumerate(hits):
            upto = min(max(hits[i + 1][0], begin), end) if i + 1 < len(hits) else end
            add(kind, upto - begin)
            begin = upto

    before = float(lost.get("before_first_step_s", 0.0))
    charge(0.0, before, "start_up", head=(startup_s, "start_up") if startup_s is not None else None)
    add("between_steps", float(lost.get("between_steps_s", 0.0)))
    for gap in sorted(lost.get("gaps", ()), key=lambda g: float(g["at_s"])):
        begin, seconds = float(gap["at_s"]), float(gap["s"])
        step = int(gap.get("before_step", 0)) - 1
        charge(begin, begin + seconds, "checkpoint_save" if ckpt_every and step > 0 and step % ckpt_every == 0
               else "other")
    after = float(lost.get("after_last_step_s", 0.0))
    if after > GAP_S:
        charge(window_s - after, window_s, "other")
    else:
        add("between_steps", after)
    return out


def ettr(productive_s: float, available_s: Optional[float]) -> Optional[float]:
    """Productive time over the time the run had (never above 1: clocks of different machines disagree); None
    when there was no time to have."""
    if available_s is None or available_s <= 0:
        return None
    return round(min(1.0, max(0.0, productive_s) / available_s), 4)


def wall_ettr(productive_s: float, start: Optional[float], end: Optional[float]) -> Optional[float]:
    """ETTR over one wall-clock window (submission to end): what ``review`` shows without sacct, and the chaos
    report. Every second counts, held or queued; :func:`account`'s is Meta's (queued only while eligible)."""
    if start is None or end is None:
        return None
    return ettr(productive_s, end - start)


# --- inputs --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepPoint:
    step: int
    wall: float
    """When the step ended (TensorBoard's wall time)."""
    step_s: float
    kept: bool = True
    """False: a later point of the same step replaced it (a resume or a rollback went back before it)."""


@dataclass(frozen=True)
class Window:
    """One attempt as sacct tells it (epoch seconds; None where sacct has no time)."""
    job_id: str
    index: int
    state: str
    cause: str
    """Why it ended as sacct alone says (:func:`hpc_agent.diagnosis.classify.classify_attempt`)."""
    submit: Optional[float]
    eligible: Optional[float]
    start: Optional[float]
    end: Optional[float]
    """None while it runs."""
    devices: int
    devices_from_sacct: bool = True
    """False: AllocTRES named no GPU, so the count is the run config's (or 1 for a CPU-only run)."""


@dataclass(frozen=True)
class InJob:
    """A repair the job made inside its allocation (the in-job journal, via events.jsonl)."""
    attempt: int
    """The run-wide attempt number, 1-based."""
    step: Optional[int]
    cause: str


_GPU_TRES = re.compile(r"(?:^|,)gres/gpu(?::[^=,]*)?=(\d+)")


def devices_of(alloc_tres: str) -> Optional[int]:
    """The GPUs in an AllocTRES (``cpu=8,mem=64G,node=1,gres/gpu=4``, or per type ``gres/gpu:a100=4``: the untyped
    total wins when both are there); None without a GPU entry."""
    text = str(alloc_tres or "")
    untyped = re.search(r"(?:^|,)gres/gpu=(\d+)", text)
    if untyped:
        return int(untyped.group(1))
    typed = [int(n) for n in _GPU_TRES.findall(text)]
    return sum(typed) if typed else None


def _seconds(text: str) -> Optional[float]:
    """sacct's Elapsed (``[D-]HH:MM:SS`` or ``MM:SS``) as seconds; None for anything else."""
    m = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", str(text or "").strip())
    if not m:
        return None
    days, hours, minutes, secs = (int(g) if g else 0 for g in m.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + secs)


def windows(attempts: Sequence[Attempt], default_devices: int) -> Tuple[List[Window], List[str]]:
    """The run's attempts (of all its jobs) as windows, oldest first, and what sacct did not say."""
    out: List[Window] = []
    notes: List[str] = []
    for a in attempts:
        row = a.primary
        get = row.get if row is not None else (lambda _k, _d="": _d)
        start, end = sacct_epoch(get("Start")), sacct_epoch(get("End"))
        elapsed = _seconds(get("Elapsed"))
        if start is None and end is not None and elapsed is not None:
            start = end - elapsed  # no Start column: End - Elapsed
        if end is not None and start is not None and end < start:
            notes.append(f"job {a.job_id} attempt {a.index}: End before Start in sacct; counted as no allocation")
            end = start
        devices = devices_of(get("AllocTRES"))
        columns = row.fields if row is not None else {}
        if a.index == 0 and "AllocTRES" not in columns:
            notes.append(f"job {a.job_id}: sacct has no AllocTRES column; devices from the run config")
        if a.index == 0 and "Eligible" not in columns and "Submit" not in columns:
            notes.append(f"job {a.job_id}: sacct has no Eligible or Submit column; its queued time is counted as 0")
        cause = classify_attempt(a).cause.value
        out.append(Window(a.job_id, a.index, a.state, cause, sacct_epoch(get("Submit")), sacct_epoch(get("Eligible")),
                          start, end, devices if devices else default_devices, bool(devices)))
    order = sorted(range(len(out)), key=lambda i: (out[i].start is None, out[i].start or out[i].submit or 0.0, i))
    return [out[i] for i in order], notes


# --- the accounting -----------------------------------------------------------------------------------------
def _placed(wins: Sequence[Window], points: Sequence[StepPoint], now: float) -> Tuple[List[List[StepPoint]], int]:
    """Each window's points (a point goes to the latest-started window it lies in: a successor that started while
    its predecessor was still ending trains) and the count of points in no window."""
    out: List[List[StepPoint]] = [[] for _ in wins]
    unplaced = 0
    for p in points:
        hit = None
        for i, w in enumerate(wins):
            if w.start is None:
                continue
            hi = (w.end if w.end is not None else now) + END_SLACK_S
            if w.start <= p.wall <= hi and (hit is None or w.start >= wins[hit].start):
                hit = i
        if hit is None:
            unplaced += 1
        else:
            out[hit].append(p)
    return out, unplaced


def _sanitised(lo: float, hi: float, points: Sequence[StepPoint]) -> List[StepPoint]:
    """Sorted by wall time, each point's time clipped so that no two overlap and none starts before ``lo`` or ends
    after ``hi`` (clocks of the job's node and slurmctld differ; sacct's times are whole seconds)."""
    out: List[StepPoint] = []
    floor = lo
    for p in sorted(points, key=lambda q: (q.wall, q.step)):
        wall = min(max(p.wall, floor), hi)
        out.append(StepPoint(p.step, wall, max(0.0, min(p.step_s, wall - floor)), p.kept))
        floor = wall
    return out


def _bucket_of(cause: str) -> str:
    return CAUSE_BUCKET.get(cause, "other")


def account(wins: Sequence[Window], points: Sequence[StepPoint], end_causes: Mapping[int, str],
            in_job: Sequence[InJob], now: float, ckpt_every: Optional[int] = None, gap_s: float = GAP_S
            ) -> Dict[str, Any]:
    """Device-seconds per bucket for one run. ``wins`` oldest first (:func:`windows`); ``end_causes``: the run-wide
    1-based attempt number -> why it ended, as the watcher decided (sacct's own cause stands in where it is
    missing); ``in_job``: the job's repairs. Returns ``{"attempts": [...], "device_s": {bucket: s},
    "allocated_s", "queued_s", "ettr", "other_by_cause", "steps_redone", "unplaced_points"}``."""
    placed, unplaced = _placed(wins, points, now)
    total = {b: 0.0 for b in BUCKETS}
    other_by_cause: Dict[str, float] = {}
    rows: List[Dict[str, Any]] = []
    allocated = queued = 0.0
    redone_steps = 0
    for k, (w, pts) in enumerate(zip(wins, placed), start=1):
        part = {b: 0.0 for b in BUCKETS}
        waited_from = w.eligible if w.eligible is not None else w.submit
        wait = 0.0
        if waited_from is not None:
            wait = max(0.0, (w.start if w.start is not None else now) - waited_from)
        cause = end_causes.get(k) or w.cause
        if w.end is None and w.start is not None:
            cause = "running"
        alloc = 0.0
        if w.start is not None:
            lo, hi = w.start, w.end if w.end is not None else max(now, w.start)
            alloc = hi - lo
            clipped = _sanitised(lo, hi, pts)
            before, gaps, between, after = _split(lo, hi, [(p.step, p.wall, p.step_s) for p in clipped], gap_s)
            for p in clipped:
                part[PRODUCTIVE if p.kept else "steps_redone"] += p.step_s
            redone_steps += sum(1 for p in clipped if not p.kept)
            part["restart_overhead"] += before
            part["other"] += between
            end_bucket = _bucket_of(cause)
            part[end_bucket] += after
            if end_bucket == "other" and after > 0:
                other_by_cause[cause] = other_by_cause.get(cause, 0.0) + after * w.devices
            repairs = sorted((r for r in in_job if r.attempt == k), key=lambda r: r.step or 0)
            for i, idle in gaps:
                prev_step = clipped[i - 1].step
                repair = next((r for r in repairs if r.step is None or r.step - 1 <= prev_step), None)
                if repair is not None:
                    repairs.remove(repair)
                    part[_bucket_of(repair.cause)] += idle
                elif ckpt_every and prev_step % ckpt_every == 0:
                    part["checkpoint_save"] += idle
                else:
                    part["other"] += idle
                    other_by_cause["gap"] = other_by_cause.get("gap", 0.0) + idle * w.devices
        scaled = {b: v * w.devices for b, v in part.items()}
        for b, v in scaled.items():
            total[b] += v
        allocated += alloc * w.devices
        queued += wait * w.devices
        rows.append({"job_id": w.job_id, "attempt": k, "state": w.state, "cause": cause, "devices": w.devices,
                     "allocated_s": round(alloc * w.devices, 3), "queued_s": round(wait * w.devices, 3),
                     "device_s": {b: round(v, 3) for b, v in scaled.items()}})
    return {"attempts": rows, "device_s": {b: round(v, 3) for b, v in total.items()},
            "allocated_s": round(allocated, 3), "queued_s": round(queued, 3),
            "ettr": ettr(total[PRODUCTIVE], queued + allocated),
            "other_by_cause": {c: round(v, 3) for c, v in sorted(other_by_cause.items())},
            "steps_redone": redone_steps, "unplaced_points": unplaced}


def hours(device_s: float) -> float:
    return round(device_s / 3600.0, 4)


def summary_row(run_id: str, acc: Mapping[str, Any]) -> Dict[str, Any]:
    """One flat row (hours) for the table and the CSV."""
    row: Dict[str, Any] = {"run": run_id, "allocated_h": hours(acc["allocated_s"]), "queued_h": hours(acc["queued_s"])}
    row.update({f"{b}_h": hours(acc["device_s"][b]) for b in BUCKETS})
    row["ettr"] = acc["ettr"]
    return row


def totals(accounts: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """The runs' accounts summed (device-seconds), with the ETTR of the sum."""
    device_s = {b: round(sum(a["device_s"][b] for a in accounts), 3) for b in BUCKETS}
    allocated = round(sum(a["allocated_s"] for a in accounts), 3)
    queued = round(sum(a["queued_s"] for a in accounts), 3)
    return {"device_s": device_s, "allocated_s": allocated, "queued_s": queued,
            "ettr": ettr(device_s[PRODUCTIVE], queued + allocated)}

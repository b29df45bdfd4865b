"""What a run did, read from its run directory and the ledger: attempts, causes, steps, timings, scalars.

The data half of ``review`` (the CLI prints it); the chaos driver reads it too. Login-node code: no torch.
"""
from __future__ import annotations

import datetime as _dt
import re
import statistics
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from hpc_agent.config.load import load_run_config
from hpc_agent.core import handback, rundir
from hpc_agent.core.in_job_journal import ADAPT_CAUSE
from hpc_agent.core.read_caps import DEFAULT_CAPS, ReadCaps
from hpc_agent.metrics.tb_reader import RunScalars, file_order_key
from hpc_agent.runs.goodput import InJob, StepPoint, account, summary_row, wall_ettr, windows
from hpc_agent.runs.liveness import read_live
from hpc_agent.runs.plot import attempts_shown, boundary_labels, in_job_markers, is_notice
from hpc_agent.slurm.sacct import Attempt, job_key_of
from hpc_agent.state.ledger import LEDGER_FILE
from hpc_agent.state.lifecycle import TERMINAL, Phase

LOSS, LR, STEP_TIME, SAMPLES = "train/loss", "train/lr", "perf/step_time_s", "perf/samples_per_s"
PLOT_TAGS = (LOSS, LR, SAMPLES)
LIVE_PHASES = {p.value for p in Phase if p not in TERMINAL}  # parked runs are live: not finished

_ATTEMPT = re.compile(r"\.attempt(\d+)$")


def attempt_of(file_name: str) -> Optional[int]:
    match = _ATTEMPT.search(file_name)
    return int(match.group(1)) if match else None


class Scalars:
    """The run's TensorBoard scalars through the incremental reader; an absent ``tb/`` reads as empty."""

    def __init__(self, tb_dir: Path, caps: ReadCaps = DEFAULT_CAPS):
        # a tb/ that is a link is handed to the reader too: it refuses it and says so in problems()
        self._rs = RunScalars(tb_dir, caps=caps) if tb_dir.is_dir() or tb_dir.is_symlink() else None
        if self._rs is not None:
            self._rs.update()

    def problems(self) -> List[str]:
        return self._rs.problems() if self._rs is not None else []

    def refused(self) -> List[str]:
        """What under tb/ was refused, not just unreadable: links out of the run dir, folders nested too deep."""
        return [self._rs.skipped[k] for k in sorted(self._rs.skipped)] if self._rs is not None else []

    def tags(self) -> List[str]:
        return sorted(self._rs.tags()) if self._rs is not None else []

    def raw(self, tag: str) -> List[Tuple[str, Any]]:
        return list(self._rs.raw(tag)) if self._rs is not None else []

    def series(self, tag: str) -> List[Any]:
        return list(self._rs.series(tag)) if self._rs is not None else []


# --- run discovery ----------------------------------------------------------------------------------------
def _is_run_dir(path: Path) -> bool:
    return rundir.is_run_dir(path)


_STR, _INT, _DICT = (str,), (int,), (dict,)
EVENT_TYPES: Dict[str, Tuple[type, ...]] = {
    "run_id": _STR, "job_id": _STR, "cause": _STR, "action": _STR, "reason": _STR, "time": _STR,
    "decided_in": (str, int), "attempt": _INT, "step": _INT, "seq": _INT, "in_job_seq": _INT,
    "decision": _DICT, "config_diff": _DICT, "evidence": (list, dict, str),
}
"""The keys of an events.jsonl record that review reads, and the types they may hold (the job can write the
file: a record with another type is not the watcher's, and is skipped as a problem)."""
DECISION_TYPES: Dict[str, Tuple[type, ...]] = {"action": _STR, "cause": _STR, "reason": _STR, "patch": _DICT}


def event_problem(record: Any) -> Optional[str]:
    """What makes one parsed events.jsonl line unusable (not an object, a key of the wrong type), or None. Pure."""
    if not isinstance(record, dict):
        return f"holds {type(record).__name__}, not an object"
    for types, where in ((EVENT_TYPES, record), (DECISION_TYPES, record.get("decision") or {})):
        for key, allowed in types.items():
            value = where.get(key)
            if value is not None and (not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed)):
                return f"{key} is {type(value).__name__}, not {' or '.join(t.__name__ for t in allowed)}"
    return None


def own_events(values: List[Any], run_id: str, job_ids: Any = ()) -> Tuple[List[Dict[str, Any]], List[str]]:
    """The records of ``values`` that are this run's, and problems: records of the wrong shape, and records
    naming another run or (when the run's own job ids are known: the ledger's submissions) another job are
    skipped and counted, once each kind. Pure."""
    own, problems, foreign = [], [], 0
    job_ids = {j for j in job_ids if j}
    for value in values:
        problem = event_problem(value)
        if problem:
            problems.append(f"events.jsonl: a record skipped: {problem}")
            continue
        if value.get("run_id") not in (None, run_id) or (job_ids and value.get("job_id") and
                                                        value["job_id"] not in job_ids):
            foreign += 1
            continue
        own.append(value)
    if foreign:
        problems.append(f"events.jsonl: {foreign} record(s) naming another run or job skipped (not this run's)")
    return own, problems[:5] + ([f"events.jsonl: {len(problems) - 5} more bad record(s)"] if len(problems) > 5 else [])


def read_events(run_dir: Path) -> Tuple[List[Any], List[str]]:
    """events.jsonl's JSON values (oldest first) and one problem per line that is no JSON (deep, huge, torn)
    or for a file that cannot be read (a link, a FIFO). The total reader: never raises."""
    return rundir.read_json_lines(rundir.events_path(run_dir), within=Path(run_dir), complete_only=True)


def _ledger(runs_root: Path):
    if not (runs_root / LEDGER_FILE).exists():
        return None
    from hpc_agent.state.ledger import Ledger
    return Ledger.in_runs_root(runs_root)


def find_runs(path: Path) -> Tuple[Path, List[Path]]:
    """``(runs_root, run_dirs)`` for a run directory or a runs root. A link in the runs root is not a run
    directory (it can point anywhere): skipped, as are links the ledger does not name."""
    if _is_run_dir(path) and not (path / LEDGER_FILE).exists():
        return path.parent, [path]
    dirs = {p.resolve() for p in path.iterdir() if not p.is_symlink() and p.is_dir() and _is_run_dir(p)}
    ledger = _ledger(path)
    if ledger is not None:
        try:
            dirs |= {Path(r.run_dir).resolve() for r in ledger.runs() if Path(r.run_dir).is_dir()}
        finally:
            ledger.close()
    return path, sorted(dirs)


def _iso_to_ts(text: Any) -> Optional[float]:
    try:
        return _dt.datetime.fromisoformat(str(text)).timestamp()
    except ValueError:
        return None


def decision_list(rows: List[Any], events: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The run's decisions, oldest first, from its audit trail (events.jsonl): the watcher's (one per ended
    attempt, or a hang) and the job's own repairs inside its allocation (``decided_in == "job"``,
    ``hpc_agent.core.in_job_journal``), marked ``in_job``. Both number attempts run-wide from 1. The ledger's decision
    rows (numbered within their Slurm job) stand in only where events.jsonl holds none. For the watcher's
    action records ``decided_in`` is the seq of the decision carried out, not a place: they are not listed."""
    out = []
    for e in events:
        decision = e.get("decision") if isinstance(e.get("decision"), dict) else None
        in_job = e.get("decided_in") == "job"
        if "by" in e or not (decision is not None or in_job):
            continue
        decision = decision or {}
        out.append({"job_id": e.get("job_id"), "attempt": e.get("attempt"),
                    "cause": e.get("cause") or decision.get("cause"),
                    "action": decision.get("action") or e.get("action"),
                    "reason": decision.get("reason") or e.get("reason") or "", "patch": decision.get("patch") or {},
                    "in_job": in_job, "step": e.get("step") if in_job else None})
    if out or not rows:
        return out
    return [{"job_id": d.job_id, "attempt": d.attempt + 1, "cause": d.cause, "action": d.action, "reason": d.reason,
             "patch": d.patch, "in_job": False, "step": None} for d in rows]


def step_points(scalars: Scalars) -> List[StepPoint]:
    """Every step time TensorBoard holds, each marked kept or not (a later point of the same step replaced it:
    a resume or an in-job rollback went back before it). Goodput's step input."""
    winners = {id(p) for p in scalars.series(STEP_TIME)}
    return [StepPoint(p.step, p.wall_time, max(0.0, p.value), id(p) in winners) for _, p in scalars.raw(STEP_TIME)]


def end_causes(events: List[Dict[str, Any]], rows: List[Any]) -> Dict[int, str]:
    """The run-wide, 1-based attempt number -> why it ended, from the watcher's records (a decision wins over a
    bare record such as the expedite of a preempted job); the ledger's decision rows stand in where events.jsonl
    has none. The job's in-job repairs and the watcher's notices end nothing."""
    out: Dict[int, str] = {}
    for d in decision_list(rows, events):
        if not d["in_job"] and isinstance(d.get("attempt"), int) and d.get("cause"):
            out.setdefault(d["attempt"], str(d["cause"]))
    for e in events:
        attempt, cause = e.get("attempt"), e.get("cause")
        if (isinstance(attempt, int) and cause and e.get("decided_in") != "job" and not is_notice(e)
                and cause not in ("running", "pending")):
            out.setdefault(attempt, str(cause))
    return out


def _step_tag(scalars: Scalars) -> str:
    """The tag logged once per optimizer step: the step time, or the loss in older runs."""
    return STEP_TIME if scalars.raw(STEP_TIME) else LOSS


def tb_last_step(scalars: Scalars) -> Optional[Tuple[int, float]]:
    """``(step, wall time)`` of the newest step TensorBoard has (of the attempt that wins each step)."""
    last = max(scalars.series(_step_tag(scalars)), key=lambda p: (p.wall_time, p.step), default=None)
    return (last.step, last.wall_time) if last is not None else None


def live_status(run_dir: Path, phase: str, now: float, attempt_started_at: Optional[float]) -> Dict[str, Any]:
    """What ``review`` says about a live run, for a caller without a review at hand (``diagnose``)."""
    return read_live(run_dir, phase, now, tb_last_step(Scalars(rundir.tb_dir(run_dir))), attempt_started_at)


# --- one run ----------------------------------------------------------------------------------------------
def review_run(run_dir: Path, runs_root: Optional[Path] = None, now: Optional[float] = None,
               caps: ReadCaps = DEFAULT_CAPS) -> Dict[str, Any]:
    """Everything the table, the JSON and the plot show for one run; its TensorBoard files read within ``caps``
    (what is beyond them is in ``notes``)."""
    run_dir = Path(run_dir)
    runs_root = Path(runs_root) if runs_root else run_dir.parent
    info, problem = rundir.read_json(rundir.run_json_path(run_dir), within=run_dir)
    problem = problem or rundir.run_json_problem(info)
    problems = [problem if problem.startswith(str(run_dir)) else f"run.json: {problem}"] if problem else []
    if problem:
        info = {}
    run_id = info.get("run_id") or run_dir.name
    values, read_problems = read_events(run_dir)
    problems += [p.replace(str(run_dir) + "/", "") if p.startswith(str(run_dir)) else f"{rundir.EVENTS}: {p}"
                 for p in read_problems]
    phase, created_at, submissions, decision_rows = None, None, [], []
    ledger = _ledger(runs_root)
    if ledger is not None:
        try:
            row = ledger.run(run_id) or next((r for r in ledger.runs() if Path(r.run_dir).resolve()
                                              == run_dir.resolve()), None)
            if row is not None:
                run_id, phase, created_at = row.run_id, row.phase, row.created_at
                submissions = ledger.submissions(run_id)
                decision_rows = ledger.decisions(run_id)
        finally:
            ledger.close()
    # The run's jobs across its hand-overs (hpc_agent/core/handback.py): what the ledger knows, then the successors
    # the jobs named themselves, which only a watcher copies into the ledger.
    jobs = handback.job_chain(run_dir, [s.job_id for s in submissions if s.executor != "local"]
                              or [str(j) for j in info.get("job_ids", []) or []])
    events, foreign = own_events(values, run_id, [s.job_id for s in submissions] + jobs)
    problems += foreign
    if phase is None:
        phase = "completed" if any(e.get("cause") == "completed" for e in events) else "unknown"
    max_steps = ckpt_every = None
    devices, devices_note = 1, "no run config: 1 device per attempt unless sacct's AllocTRES says"
    if rundir.config_path(run_dir).exists():
        try:
            config = load_run_config(run_dir)
            max_steps, ckpt_every = config.train.max_steps, config.train.ckpt_every
            gpus = config.slurm.nodes * config.slurm.gpus_per_node
            devices, devices_note = (gpus, "") if gpus > 0 else (1, "CPU-only: each attempt counts as 1 device")
        except Exception:  # a broken snapshot should not hide the rest of the review
            max_steps = None

    scalars = Scalars(rundir.tb_dir(run_dir), caps)
    loss = scalars.series(LOSS)
    step_tag = _step_tag(scalars)
    raw_steps = scalars.raw(step_tag)
    winning_steps = scalars.series(step_tag)
    steps_lost = len(raw_steps) - len(winning_steps)  # points a later attempt overwrote
    productive = sum(p.value for p in scalars.series(STEP_TIME))
    kept = {(p.step, p.wall_time) for p in loss}
    lost_loss = [p for _, p in scalars.raw(LOSS) if (p.step, p.wall_time) not in kept]

    # attempts as the event files show them: first step and wall time of each file
    per_file: Dict[str, List[Any]] = {}
    for tag in scalars.tags():
        for name, point in scalars.raw(tag):
            per_file.setdefault(name, []).append(point)
    files = sorted(per_file, key=file_order_key)
    starts: Dict[int, Tuple[int, float]] = {}
    for index, name in enumerate(files):
        attempt = attempt_of(name) if attempt_of(name) is not None else index
        first = min(per_file[name], key=lambda p: (p.wall_time, p.step))
        starts[attempt] = (min(p.step for p in per_file[name]), first.wall_time)

    boundaries = boundary_labels(events)
    for b in boundaries:
        step, wall = starts.get(b["attempt"], (None, None))
        b["step"] = step
        b["wall_time"] = wall if wall is not None else _iso_to_ts(b.pop("time", None))
        b.pop("time", None)

    all_walls = [p.wall_time for tag in scalars.tags() for _, p in scalars.raw(tag)]
    attempts = max([len(submissions), len(info.get("job_ids", [])), len(starts), attempts_shown(events)])
    start = (created_at or (submissions[0].intent_at if submissions else None)
             or _iso_to_ts(info.get("submitted_at")) or (min(all_walls) if all_walls else None))
    now = time.time() if now is None else now
    end = now if phase in LIVE_PHASES else (max(all_walls) if all_walls else None)
    ettr = wall_ettr(productive, start, end)
    samples = [p.value for p in scalars.series(SAMPLES)]
    causes = sorted({str(e["cause"]) for e in events if e.get("cause") and not is_notice(e)}
                    | {d.cause for d in decision_rows})
    live = None
    if phase in LIVE_PHASES:
        latest = submissions[-1] if submissions else None
        live = read_live(run_dir, phase, now, tb_last_step(scalars),
                         (latest.submitted_at or latest.intent_at) if latest else None)
    return {
        "run_id": run_id, "run_dir": str(run_dir), "phase": phase, "jobs": jobs, "attempts": attempts, "causes": causes,
        "step": loss[-1].step if loss else None, "max_steps": max_steps,
        "steps": {"first": loss[0].step if loss else None, "last": loss[-1].step if loss else None,
                  "count": len(loss), "duplicates": len(loss) - len({p.step for p in loss})},
        "last_loss": loss[-1].value if loss else None,
        "throughput": round(statistics.median(samples), 3) if samples else None,
        "productive_s": round(productive, 3), "wall_s": round(end - start, 3) if ettr is not None else None,
        "ettr": ettr, "steps_lost": steps_lost, "boundaries": boundaries, "live": live,
        "decisions": decision_list(decision_rows, events), "in_job": in_job_markers(events),
        "notes": scalars.problems(),  # event files not read: links out of the run dir, corrupt records
        "problems": problems + [f"{rundir.TB}/: {p}" for p in scalars.refused()],  # job-written files that are not what the watcher writes: run.json, events.jsonl
        "_goodput": {"points": step_points(scalars), "end_causes": end_causes(events, decision_rows),
                     "in_job": [InJob(d["attempt"], d["step"], str(d["cause"])) for d in decision_list(decision_rows, events)
                                if d["in_job"] and isinstance(d.get("attempt"), int) and d["cause"] != ADAPT_CAUSE],
                     "job_ids": [s.job_id for s in submissions if s.job_id] or
                                [str(j) for j in info.get("job_ids", []) if isinstance(j, (str, int))],
                     "devices": devices, "devices_note": devices_note, "ckpt_every": ckpt_every, "now": now},
        "_curves": {**{tag: [(p.step, p.wall_time, p.value) for p in scalars.series(tag)] for tag in PLOT_TAGS},
                    "lost_loss": [(p.step, p.wall_time, p.value) for p in lost_loss]},
    }


def review_runs(run_dirs: Sequence[Path], runs_root: Path, now: Optional[float] = None,
                caps: ReadCaps = DEFAULT_CAPS) -> Tuple[List[Dict[str, Any]], List[Dict[str, str]]]:
    """Each run's review, and ``[{"run_dir", "problem"}]`` for every run whose job-written files are not
    what the watcher writes (a run that could not be reviewed at all is only there). One run's files never
    stop the others: any exception while reviewing one becomes its problem."""
    runs: List[Dict[str, Any]] = []
    bad: List[Dict[str, str]] = []
    for run_dir in run_dirs:
        try:
            review = review_run(run_dir, runs_root, now, caps)
        except Exception as exc:  # noqa: BLE001 - one run's files must not hide the others
            bad.append({"run_dir": str(run_dir), "problem": f"not reviewed: {type(exc).__name__}: {str(exc)[:300]}"})
            continue
        runs.append(review)
        bad += [{"run_dir": str(run_dir), "problem": p} for p in review.get("problems", [])]
    return runs, bad


def problem_lines(bad: Sequence[Dict[str, str]]) -> List[str]:
    """``RUN_DIR: problem``, printable characters only (the problem quotes job-written text)."""
    return ["".join(c if c.isprintable() else "?" for c in f"{b['run_dir']}: {b['problem']}") for b in bad]


# --- goodput ------------------------------------------------------------------------------------------------
def goodput_job_ids(runs: Sequence[Dict[str, Any]]) -> List[str]:
    """Every job id of the reviewed runs, once each: the one batched sacct call asks for these."""
    seen: Dict[str, None] = {}
    for r in runs:
        for j in r.get("_goodput", {}).get("job_ids", []):
            seen.setdefault(str(j), None)
    return list(seen)


def goodput_of(review: Dict[str, Any], jobs: Dict[str, List[Attempt]]) -> Dict[str, Any]:
    """One run's goodput (:func:`hpc_agent.runs.goodput.account`) from its review and sacct's attempts by job key
    (``group_attempts`` of the one batched reply); ``account`` is None, with a ``problem``, when sacct has none."""
    g = review["_goodput"]
    keys = list(dict.fromkeys(job_key_of(j) for j in g["job_ids"]))
    attempts = [a for key in keys for a in jobs.get(key, [])]
    out: Dict[str, Any] = {"run_id": review["run_id"], "run_dir": review["run_dir"], "phase": review["phase"],
                           "job_ids": keys, "devices_note": g["devices_note"], "notes": [], "account": None}
    if not attempts:
        out["problem"] = ("sacct has no rows for " + (", ".join(keys) if keys else "this run (no job id in the ledger "
                          "or run.json)") + ": allocation unknown")
        return out
    wins, notes = windows(attempts, g["devices"])
    out["account"] = account(wins, g["points"], g["end_causes"], g["in_job"], g["now"], g["ckpt_every"])
    if out["account"]["unplaced_points"]:
        notes.append(f"{out['account']['unplaced_points']} step point(s) lie in no attempt sacct knows: not counted")
    if not g["points"]:
        notes.append("no perf/step_time_s in TensorBoard: nothing counted as productive")
    if all(w.devices_from_sacct for w in wins):
        out["devices_note"] = ""  # sacct's AllocTRES named the GPUs of every attempt
    out["notes"] = notes
    out["row"] = summary_row(review["run_id"], out["account"])
    return out

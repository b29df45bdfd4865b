"""Run training jobs under faults: submit, inject the schedule, follow the recoveries, check, report.

One or more *targets* (a run each, in its own runs root) train side by side; a target with a watcher
has ``python -m hpc_agent.watch`` following its runs root, one without relies on Slurm alone. A fault
goes to every target that is training when its time comes (a preemption hits every node at once).
"""
from __future__ import annotations

import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from hpc_agent.chaos import inject
from hpc_agent.chaos.log_segments import Progress, parse_progress, recovered_segment, steps_lost
from hpc_agent.chaos.report import (FaultRecord, TargetSummary, continuity_check, ended_after, fault_checks,
                                    final_checkpoint_check)
from hpc_agent.chaos.schedule import (CTLD_RESTART, INTERRUPTING, KILL_DURING_SAVE, NODE_FAIL, PREEMPT, RUNTIME_KINDS,
                                      WATCHER_KILL, Fault)
from hpc_agent.config.load import load_run_config
from hpc_agent.core import rundir
from hpc_agent.runs.goodput import time_lost, wall_ettr
from hpc_agent.slurm.cli import SlurmCLI, SlurmError

STALL_S = 30.0  # a target whose last logged step has not moved for this long is not training
FLUSH_MARGIN_S = 1.0  # beyond a job's TensorBoard flush interval, for a flush that lands late on a busy machine
ATTRIBUTION_WAIT_S = 20.0
"""How long a recovered fault stays open for the event that says what was done about it. A repair made inside the
job (GPU OOM, NaN) is trained past before the watcher copies the job's journal line into ``events.jsonl`` at its
next poll: closed at once, the report read "cause -, decision -" for one of the two in-job repairs of P2's runs 4
and 5, at random. The recovery time is still taken when training went on."""
_JOB_LOG = re.compile(r"^(\d+)_0_log\.out$")


@dataclass
class Target:
    name: str
    root: Path
    run_dir: Path
    watcher: Optional[inject.Watcher] = None
    done_at: Optional[float] = None
    excluded_nodes: List[str] = field(default_factory=list)

    def job_ids(self) -> List[str]:
        try:
            return list(rundir.read_run_json(self.run_dir).get("job_ids", []))
        except (OSError, ValueError):
            return []

    def progress(self) -> Progress:
        logs = [(int(m.group(1)), p) for p in rundir.slurm_dir(self.run_dir).glob("*_0_log.out")
                if (m := _JOB_LOG.match(p.name))]
        return parse_progress(p.read_text(errors="replace") for _, p in sorted(logs))

    def events(self) -> List[Dict]:
        from hpc_agent.runs.history import read_events

        return [e for e in read_events(self.run_dir)[0] if isinstance(e, dict)]

    def config(self):
        return load_run_config(self.run_dir)


def submit_run(root: Path, config: str, overrides: Sequence[str]) -> Path:
    """``python -m hpc_agent.submit`` as a user runs it, with the run-time trigger on; returns the run dir."""
    root.mkdir(parents=True, exist_ok=True)
    before = {p.name for p in root.iterdir()}
    proc = subprocess.run([sys.executable, "-m", "hpc_agent.submit", config, "--executor", "slurm",
                           f"run.runs_root={root}", "faults.runtime_trigger=true", *overrides],
                          capture_output=True, text=True, cwd=str(inject.REPO), timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"submit failed ({proc.returncode}): {proc.stdout}{proc.stderr}")
    (run_dir,) = [p for p in root.iterdir() if p.is_dir() and p.name not in before]
    return run_dir


def _attribution(event: Dict) -> tuple:
    """(cause, decision) of a watcher event: a decision's action, or an in-job journal line's action."""
    return event["cause"], (event.get("decision") or {}).get("action") or event.get("action")


@dataclass
class _Open:
    record: FaultRecord
    target: Target
    before: Progress
    injected: float
    events_seen: int
    node: Optional[str] = None


class ChaosDriver:
    def __init__(self, targets: Sequence[Target], schedule: Sequence[Fault], *, duration_s: float,
                 sequential: bool = True, recovery_timeout_s: float = 300.0, poll_s: float = 1.0,
                 out: Callable[[str], None] = print, slurm: Optional[SlurmCLI] = None,
                 on_poll: Callable[[], None] = lambda: None, persistent: bool = False,
                 preempt_hold_s: Optional[int] = None, stop_when: Callable[[], Optional[str]] = lambda: None,
                 charge_window: bool = False):
        """``persistent``: faults behave as in reality (docs/benchmarks.md, rule 2): the run-time faults recur while
        their cause is there (launch/chaos_trigger.py), ``node_fail`` is a bad node that stays bad until excluded
        (not a killed slurmd), ``hang`` recurs at the same step on the same node. ``preempt_hold_s``: a preemption
        takes the run's own node for that long (None: both nodes for 2 s). ``stop_when``: polled; a reason ends
        the window early (a run that can no longer train: the rest of the window is lost all the same).
        ``charge_window``: every target is charged the whole window (``duration_s`` from the start), ended early
        or not, finished or not."""
        self.targets, self.schedule, self.on_poll = list(targets), list(schedule), on_poll  # on_poll: progress
        self.persistent, self.preempt_hold_s, self.stop_when = persistent, preempt_hold_s, stop_when
        self.charge_window, self.stopped_early = charge_window, ""
        self.duration_s, self.sequential, self.poll_s = duration_s, sequential, poll_s
        self.recovery_timeout_s, self.out = recovery_timeout_s, out
        self.slurm = slurm or SlurmCLI(timeout_s=60)
        self.records: List[FaultRecord] = []
        self.open: List[_Open] = []
        self.t0 = 0.0
        self.started = time.time()
        self._moved: Dict[str, tuple] = {}  # target -> (last step seen, when it last changed)
        self.nonce = 0

    def say(self, text: str) -> None:
        self.out(f"[chaos {time.time() - self.started:6.0f}s] {text}")

    # --- the loop -----------------------------------------------------------------------------------
    def run(self) -> List[TargetSummary]:
        deadline = self.started + self.duration_s
        self.say("waiting for every target to train")
        while not all(t.progress().training for t in self.targets):
            if time.time() > deadline:
                break
            time.sleep(self.poll_s)
        self.t0 = time.time()
        self.say("training started; schedule: " + ", ".join(f"{f.kind}@{f.at_s:.0f}s" for f in self.schedule))
        pending = list(self.schedule)
        while time.time() < deadline:
            self.on_poll()
            reason = self.stop_when()
            if reason:
                self.stopped_early = reason
                self.say(f"ending the window early: {reason}")
                break
            self._follow_recoveries()
            for t in self.targets:
                self._note_progress(t)
                if t.done_at is None and t.progress().done:
                    t.done_at = time.time()
                    self.say(f"{t.name}: training done")
            if pending and time.time() - self.t0 >= pending[0].at_s and not (self.sequential and self.open):
                self._inject(pending.pop(0))
                continue
            if not pending and not self.open and all(t.done_at for t in self.targets):
                break
            time.sleep(self.poll_s)
        for fault in pending:
            for t in self.targets:
                self.records.append(FaultRecord(fault.kind, t.name, fault.at_s, note="not injected: time ran out"))
        for o in self.open:
            if o.record.recovered:  # still waiting for its event: what the watcher has written by now
                acted = self._acted(o)
                if acted:
                    o.record.detected_cause, o.record.decision = _attribution(acted[0])
            else:
                o.record.note = o.record.note or "no new attempt trained before the run's time was up"
            self._restore_node(o)
        return self._summaries()

    def _summaries(self) -> List[TargetSummary]:
        """Each target's summary for the window that ends now. A job still training appends its TensorBoard events
        every ``FLUSH_EVERY_S`` (launch/tblog.py), so the steps of the window's last seconds may not be on disk yet:
        wait one flush interval before reading. Only steps that ended by the window's end count (``time_lost``)."""
        stopped_at = time.time()
        if any(t.done_at is None for t in self.targets):
            from hpc_agent.metrics.tb_reader import TB_FLUSH_EVERY_S

            time.sleep(TB_FLUSH_EVERY_S + FLUSH_MARGIN_S)
        return [self._summary(t, stopped_at) for t in self.targets]

    def _note_progress(self, t: Target) -> None:
        # The newest attempt's last step, not the run's highest: after a rollback the run trains below it.
        progress = t.progress()
        key = (len(progress.segments), progress.segments[-1].last_step if progress.segments else None)
        if self._moved.get(t.name, (None,))[0] != key:
            self._moved[t.name] = (key, time.time())

    def _training_targets(self) -> List[Target]:
        """Targets whose logged step moved in the last STALL_S seconds (a FAILED job's log stays still)."""
        busy = {o.target.name for o in self.open}
        return [t for t in self.targets if t.done_at is None and t.name not in busy and t.progress().training
                and time.time() - self._moved.get(t.name, (0, 0.0))[1] < STALL_S]

    # --- injection ------------------------------------------------------------------------------------
    def _inject(self, fault: Fault) -> None:
        targets = self._training_targets()
        if not targets:
            for t in self.targets:
                self.records.append(FaultRecord(fault.kind, t.name, fault.at_s, note="not injected: not training"))
            return
        skipped = [t for t in self.targets if t not in targets]
        for t in skipped:
            self.records.append(FaultRecord(fault.kind, t.name, fault.at_s, note="not injected: not training"))
        self.nonce += 1
        nonce = f"chaos-{int(self.started)}-{self.nonce}"
        opened = [self._open(fault, t) for t in targets]
        self.say(f"injecting {fault.kind} into {', '.join(t.name for t in targets)}")
        if fault.kind == PREEMPT and self.preempt_hold_s is not None:
            for o in opened:
                o.node = None  # nothing to start again afterwards: the preemptor ends by itself
                node = inject.running_node(self.slurm, o.target.run_dir)
                if node:
                    self.say(f"  high-partition job {inject.preempt_node(self.slurm, node, self.preempt_hold_s)} "
                             f"holds {node} for {self.preempt_hold_s}s")
                else:
                    o.record.note = "no running job found to preempt"
        elif fault.kind == PREEMPT:
            self.say(f"  high-partition job {inject.preempt_all_nodes(self.slurm)}")
        elif fault.kind == KILL_DURING_SAVE:
            for o in opened:
                inject.write_trigger(o.target.run_dir, KILL_DURING_SAVE, nonce, stall_s=600)
            self._wait(lambda: all(inject.in_save(o.target.run_dir, nonce) for o in opened), 300, "a stalled save")
            saved = [inject.in_save(o.target.run_dir, nonce) for o in opened]
            self.say(f"  stalled in the save of {', '.join(str(s and s['tag']) for s in saved)}; preempting: "
                     f"Slurm's SIGKILL ends it mid-save (job {inject.preempt_all_nodes(self.slurm)})")
        elif fault.kind in RUNTIME_KINDS or (fault.kind == NODE_FAIL and self.persistent):
            for o in opened:
                extra = {"mb": self._host_oom_mb(o.target)} if fault.kind == "host_oom" else {}
                if self.persistent:
                    extra["persistent"] = True
                inject.write_trigger(o.target.run_dir, fault.kind, nonce, **extra)
        elif fault.kind == NODE_FAIL:
            for o in opened:
                jobs = o.target.job_ids()
                o.node = inject.job_node(self.slurm, jobs[-1]) if jobs else None
                if o.node:
                    self.say(f"  killing {o.node}: {inject.kill_node(o.node)}")
                else:
                    o.record.note = "no node found for the job"
        elif fault.kind == CTLD_RESTART:
            self.say(f"  {inject.restart_slurmctld()}")
        elif fault.kind == WATCHER_KILL:
            for o in opened:
                if o.target.watcher is None:
                    o.record.note = "no watcher to kill"
                    continue
                pid = o.target.watcher.sigkill()
                o.target.watcher.start()
                o.record.note = f"watcher pid {pid} SIGKILLed and restarted"
        self.open.extend(opened)

    def _open(self, fault: Fault, t: Target) -> _Open:
        rec = FaultRecord(fault.kind, t.name, fault.at_s, injected_at_s=round(time.time() - self.t0, 1))
        self.records.append(rec)
        before = t.progress()
        rec.last_step_before = before.last_step
        return _Open(rec, t, before, time.time(), len(t.events()))

    def _host_oom_mb(self, t: Target) -> int:
        from hpc_agent.policy.decide import parse_mem_mb

        return int((parse_mem_mb(t.config().slurm.mem) or 2048) * 1.5)

    def _wait(self, predicate: Callable[[], object], timeout: float, what: str) -> bool:
        end = time.time() + timeout
        while time.time() < end:
            if predicate():
                return True
            time.sleep(0.5)
        self.say(f"  gave up waiting for {what} after {timeout:.0f}s")
        return False

    # --- recoveries -----------------------------------------------------------------------------------
    def _follow_recoveries(self) -> None:
        for o in list(self.open):
            now = o.target.progress()
            rec = o.record
            if rec.kind in INTERRUPTING:
                pair = recovered_segment(o.before, now)
                if pair is None:
                    if time.time() - o.injected > self.recovery_timeout_s:
                        rec.note = rec.note or f"no new attempt trained within {self.recovery_timeout_s:.0f}s"
                        self._close(o, now)
                    continue
                hit, new = pair
                rec.resumed_from, rec.last_step_before = new.resumed_from, hit.last_step
                rec.steps_lost = steps_lost(hit, new)
                rec.recovered = True
            else:  # the job keeps running: recovered once it trains past where it was, with no new attempt
                if now.last_step <= o.before.last_step + 5 or time.time() - o.injected < 3:
                    if time.time() - o.injected > self.recovery_timeout_s:
                        rec.note += "; training did not continue"
                        self._close(o, now)
                    continue
                if rec.kind == WATCHER_KILL and o.target.watcher is not None and not o.target.watcher.alive():
                    continue
                pair = recovered_segment(o.before, now)
                rec.steps_lost = steps_lost(*pair) if pair else 0
                rec.recovered = True
            if rec.recovery_s is None:
                rec.recovery_s = round(time.time() - o.injected, 1)
            if (rec.kind not in (CTLD_RESTART, WATCHER_KILL) and not self._acted(o)
                    and time.time() - o.injected < rec.recovery_s + ATTRIBUTION_WAIT_S):
                continue
            self._close(o, now)

    def _attempt_ends(self, t: Target) -> List[float]:
        """sacct's End of every attempt of the target's jobs (epoch seconds); [] if sacct cannot say."""
        from hpc_agent.watcher.observe import attempt_end
        from hpc_agent.slurm.sacct import SacctFormatError, group_attempts, parse_sacct

        try:
            attempts = group_attempts(parse_sacct(self.slurm.sacct(t.job_ids())))
        except (SlurmError, SacctFormatError) as exc:
            self.say(f"  no attempt end times from sacct: {exc}")
            return []
        return [e for job in attempts.values() for a in job if (e := attempt_end(a)) is not None]

    @staticmethod
    def _acted(o: _Open) -> List[Dict]:
        """The events since the injection that record a cause and what was decided about it."""
        fresh = o.target.events()[o.events_seen:]
        return [e for e in fresh if e.get("cause") and ("decision" in e or "action" in e)]

    def _close(self, o: _Open, now: Progress) -> None:
        rec = o.record
        if rec.kind in INTERRUPTING:
            rec.ended_after_s = ended_after(self._attempt_ends(o.target), o.injected, time.time())
        acted = self._acted(o)
        if acted:
            rec.detected_cause, rec.decision = _attribution(acted[0])
        elif rec.kind in (CTLD_RESTART, WATCHER_KILL) and rec.recovered:
            rec.detected_cause, rec.decision = "none needed", "none"
        self._restore_node(o)
        self.open.remove(o)
        ended = f" (the attempt ended {rec.ended_after_s}s after the injection)" if rec.ended_after_s is not None else ""
        self.say(f"{o.target.name}: {rec.kind} " + (f"recovered in {rec.recovery_s}s{ended}, cause {rec.detected_cause}, "
                                                    f"decision {rec.decision}, steps lost {rec.steps_lost}"
                                                    if rec.recovered else f"NOT recovered: {rec.note}"))

    def _restore_node(self, o: _Open) -> None:
        if o.node:
            ok = inject.start_node(o.node)
            self.say(f"  {o.node} started again" if ok else f"  could not start {o.node} again")
            o.node = None

    # --- the end --------------------------------------------------------------------------------------
    def _summary(self, t: Target, stopped_at: float) -> TargetSummary:
        from hpc_agent.metrics.tb_reader import RunScalars
        from hpc_agent.runs.history import STEP_TIME
        from hpc_agent.core import checkpoint_format as checkpoint

        max_steps = t.config().train.max_steps
        start = _created_at(t)
        end = self.started + self.duration_s if self.charge_window else (t.done_at or stopped_at)
        scalars = RunScalars(rundir.tb_dir(t.run_dir), tags=("train/loss", STEP_TIME))
        scalars.update()
        kept = [(p.step, p.wall_time, p.value) for p in scalars.series(STEP_TIME)]  # as ETTR counts them
        selection = checkpoint.select(checkpoint.scan(rundir.checkpoints_dir(t.run_dir)))
        chosen = selection.chosen
        checks = [final_checkpoint_check(chosen.step if chosen else None,
                                         selection.skipped[0][1] if selection.skipped else None, max_steps),
                  continuity_check([p.step for p in scalars.series("train/loss")], max_steps),
                  *fault_checks([r for r in self.records if r.target == t.name])]
        lost = time_lost(start, end, kept) if start else None
        productive = lost["productive_s"] if lost else sum(p[2] for p in kept)  # steps that ended in the window
        return TargetSummary(t.name, t.done_at is not None, max_steps, wall_ettr(productive, start, end), productive,
                             round(end - start, 1) if start else 0.0, checks, lost)


def _created_at(t: Target) -> Optional[float]:
    from hpc_agent.state.ledger import Ledger

    ledger = Ledger.in_runs_root(t.root)
    try:
        row = ledger.run(t.run_dir.name)
        return row.created_at if row else None
    finally:
        ledger.close()

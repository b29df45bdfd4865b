"""The watcher's tick: ledger -> one batched sacct -> classify -> policy -> lifecycle -> effects.

Time, the Slurm client, the submitter and the checkpoint scanner are injected, so tests drive the loop
tick by tick. Crash safety comes from the order of writes: a decision is recorded (and the run moved to
``recovering``) before it is carried out; on start-up ``reconcile`` finishes whatever a killed watcher
left half done, asking Slurm (by the run id in the job name) instead of guessing.
"""
from __future__ import annotations

import datetime as _dt
import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from hpc_agent.checkpoints import complete_steps, set_aside_after
from hpc_agent.config.load import load_snapshot
from hpc_agent.diagnosis.causes import Cause
from hpc_agent.diagnosis.classify import Diagnosis, classify_job
from hpc_agent.diagnosis.logscan import gpu_capacity_bytes
from hpc_agent.diagnose import find_logs, tail_log
from hpc_agent.diagnosis.alarms import Alarm
from hpc_agent.metrics.divergence import LEGACY_KIND, detect
from hpc_agent.metrics.tb_reader import RunScalars
from hpc_agent.launcher import job_name_for
from hpc_agent.ledger import Ledger, Run
from hpc_agent.lifecycle import (EFFECT_NOTIFY, EFFECT_RECORD, EFFECT_REQUEUE, EFFECT_RESUBMIT, Action, Event,
                                 EventKind, InvalidTransition, Phase, transition)
from hpc_agent.policy import DONE, REQUEUE, RESUBMIT, STOP, Decision, PastAttempt, PolicyLimits, Situation, apply_patch, decide
from hpc_agent.slurm.cli import SlurmError
from hpc_agent.slurm.fallback import SQUEUE_FORMAT, as_sacct_text, parse_scontrol_jobs, parse_squeue
from hpc_agent.slurm.queries import jobs_named, queue_state
from hpc_agent.slurm.sacct import SACCT_FIELDS, Attempt, group_attempts, parse_sacct
from hpc_agent.submission import crash_point, submit_attempt, write_config

LIVE_PHASES = [p.value for p in Phase if p not in (Phase.COMPLETED, Phase.STOPPED)]
RUNNING_STATES = {"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "SIGNALING", "STAGE_OUT", "RESIZING"}
PENDING_STATES = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"}
TAIL_BYTES = 256 * 1024
ALARM_TAGS = ("train/loss", "train/loss_scale")
FATAL_ALARMS = ("nan_loss", "loss_scale_collapse")
_ACTIONS = {REQUEUE: Action.REQUEUE, RESUBMIT: Action.RESUBMIT, STOP: Action.STOP}


@dataclass
class TickReport:
    """What one tick saw and did (printed by the CLI, asserted by tests)."""

    sacct_calls: int = 0
    fallback_calls: int = 0
    runs: int = 0
    unknown: bool = False
    paused: bool = False
    lines: List[str] = field(default_factory=list)


def _now_iso(clock: Callable[[], float]) -> str:
    return _dt.datetime.fromtimestamp(clock()).isoformat(timespec="seconds")


class Watcher:
    def __init__(self, ledger: Ledger, slurm, *, runs_root: Path, clock: Callable[[], float] = time.time,
                 dry_run: bool = False, executor: str = "slurm", limits: Optional[PolicyLimits] = None,
                 submit: Callable[..., Any] = submit_attempt, out: Callable[[str], None] = print,
                 pause_file: Optional[Path] = None):
        self.ledger, self.slurm, self.runs_root, self.clock = ledger, slurm, Path(runs_root), clock
        self.dry_run, self.executor, self.submit, self.out = dry_run, executor, submit, out
        self.limits = limits or PolicyLimits()
        self.pause_file = pause_file or self.runs_root / "watch.paused"
        self._deferred: set = set()
        self._scalars: Dict[str, RunScalars] = {}  # per run, kept between ticks: each tick reads only new bytes

    # --- helpers ----------------------------------------------------------------------------------------
    def paused(self) -> bool:
        return self.pause_file.exists()

    def _say(self, report: TickReport, run: Run, text: str) -> None:
        line = f"[watch {_now_iso(self.clock)}] {run.run_id}: {text}"
        report.lines.append(line)
        self.out(line)

    def _audit(self, run: Run, record: Dict[str, Any]) -> None:
        """Append one line to the run's events.jsonl (the audit trail); one write() so lines never interleave."""
        if self.dry_run:
            return
        record = {"time": _now_iso(self.clock), "run_id": run.run_id, **record}
        with open(Path(run.run_dir) / "events.jsonl", "a") as handle:
            handle.write(json.dumps(record, sort_keys=True, default=str) + "\n")

    def _step(self, run: Run, phase: Phase, event: Event) -> Phase:
        new_phase, effects = transition(phase, event)
        if new_phase is not phase and not self.dry_run:
            self.ledger.set_phase(run.run_id, new_phase.value)
        return new_phase

    # --- start-up -----------------------------------------------------------------------------------------
    def reconcile(self, report: Optional[TickReport] = None, min_age_s: float = 0.0) -> None:
        """Finish what a killed watcher (or submit) left half done: intents without a job id."""
        report = report or TickReport()
        for run in self.ledger.runs(LIVE_PHASES):
            sub = self.ledger.latest_submission(run.run_id)
            if sub is None or sub.job_id is not None or sub.error or self.clock() - sub.intent_at < min_age_s:
                continue
            found = jobs_named(self.slurm, job_name_for(run.run_id), since=sub.intent_at)
            known = {s.job_id for s in self.ledger.submissions(run.run_id) if s.job_id}
            new = [j for j in found if j not in known]
            if found is None:
                self._say(report, run, "cannot reach Slurm to reconcile the pending intent; will retry")
                continue
            if new:
                self._say(report, run, f"reconciled: intent #{sub.id} reached Slurm as job {new[-1]}")
                if not self.dry_run:
                    self.ledger.record_submitted(sub.id, new[-1])
                    self.ledger.set_phase(run.run_id, Phase.PENDING.value)
                continue
            self._say(report, run, f"reconciled: intent #{sub.id} never reached Slurm; submitting it now")
            if not self.dry_run:
                self.ledger.record_failed(sub.id, "abandoned: the submitter died before sbatch")
                cfg = load_snapshot(sub.config_path)
                self.submit(self.ledger, run.run_id, Path(run.run_dir), cfg, Path(sub.config_path),
                            sub.executor, reason=sub.reason)

    # --- the tick ---------------------------------------------------------------------------------------
    def tick(self) -> TickReport:
        report = TickReport()
        if self.paused():
            report.paused = True
            self.out(f"[watch {_now_iso(self.clock)}] paused ({self.pause_file} exists): no actions")
            return report
        runs = self.ledger.runs(LIVE_PHASES)
        report.runs = len(runs)
        jobs = {run.run_id: sub.job_id for run in runs
                if (sub := self.ledger.latest_submission(run.run_id)) is not None and sub.job_id}
        if not jobs:
            return report
        ids = sorted(set(jobs.values()))
        try:
            report.sacct_calls += 1
            text = self.slurm.sacct(ids, fields=SACCT_FIELDS)
        except SlurmError as exc:
            text = self._without_accounting(ids, exc, report)
            if text is None:
                return report
        attempts = group_attempts(parse_sacct(text))
        if not attempts:
            report.unknown = True  # accounting answered nothing: unknown means wait, never requeue
            return report
        for run in runs:
            if run.run_id in jobs and jobs[run.run_id] in attempts:
                if self.paused():  # the kill switch is honoured between runs too
                    report.paused = True
                    break
                self._follow(run, jobs[run.run_id], attempts[jobs[run.run_id]], report)
        return report

    def _without_accounting(self, ids: List[str], error: Exception, report: TickReport) -> Optional[str]:
        """sacct failed (slurmdbd down, accounting off): ask slurmctld (one squeue + one scontrol call)."""
        try:
            report.fallback_calls += 2
            queued = self.slurm.run(["squeue", "--noheader", "--jobs", ",".join(ids), "--format", SQUEUE_FORMAT],
                                    check=False).stdout
            known = self.slurm.run(["scontrol", "--oneliner", "show", "job"], check=False).stdout
        except SlurmError as exc:
            report.unknown = True
            self.out(f"[watch {_now_iso(self.clock)}] sacct failed ({error}) and slurmctld does not answer ({exc}): "
                     "states unknown, waiting")
            return None
        text = as_sacct_text(ids, parse_squeue(queued), parse_scontrol_jobs(known))
        if len(text.splitlines()) <= 1:
            report.unknown = True
            self.out(f"[watch {_now_iso(self.clock)}] sacct failed ({error}); slurmctld knows none of our jobs: waiting")
            return None
        self.out(f"[watch {_now_iso(self.clock)}] sacct failed ({error}); using squeue/scontrol")
        return text

    def _follow(self, run: Run, job_id: str, attempts: List[Attempt], report: TickReport) -> None:
        phase = Phase(run.phase)
        latest = attempts[-1]
        index = len(attempts) - 1
        state = latest.state
        try:
            if phase is Phase.RECOVERING:
                self._retry_recovery(run, job_id, index, state, report)
                return
            if state in RUNNING_STATES:
                if phase is not Phase.RUNNING:
                    self._step(run, phase, Event(EventKind.STARTED, job_id))
                return
            if state == "REQUEUED" and not self.ledger.expedited(job_id, index + 1) and \
                    queue_state(self.slurm, job_id) == "PENDING":
                # sacct records the requeued attempt seconds after slurmctld requeued it (~4 s measured by
                # scripts/bench_recovery.py); squeue already shows it pending, so expedite it that much sooner.
                attempts = [*attempts, Attempt(job_id, index + 1, (replace(latest.primary, state="PENDING"),))]
                index += 1
            if state in PENDING_STATES:
                if index > 0 and not self.ledger.expedited(job_id, index):
                    self._maybe_expedite(run, job_id, attempts, report)
                if phase is Phase.RUNNING:
                    self._step(run, phase, Event(EventKind.QUEUED, job_id))
                return
            if self.ledger.decided(job_id, index):
                return
            self._decide(run, phase, job_id, attempts, report)
        except InvalidTransition as exc:  # a bug, but one run must not stop the watcher for all others
            self._say(report, run, f"internal: {exc}")

    def _diagnoses(self, run: Run, job_id: str, attempts: List[Attempt]) -> List[Diagnosis]:
        logs = [tail_log(p, TAIL_BYTES) for p in find_logs(Path(run.run_dir), job_id)]
        return classify_job(attempts, logs, self._alarms(run), job_id=job_id)

    def _alarms(self, run: Run) -> List[Alarm]:
        """Fatal divergence alarms from the run's TensorBoard scalars, read incrementally (only new bytes
        since the last tick). Spikes, grad explosions and stalls are shown by review, but only a non-finite
        loss or a collapsed FP16 loss scale makes an ended attempt count as diverged."""
        tb = Path(run.run_dir) / "tb"
        if not tb.is_dir():
            return []
        scalars = self._scalars.setdefault(run.run_id, RunScalars(tb, tags=ALARM_TAGS))
        scalars.update()
        cfg_min_scale = load_snapshot(Path(run.run_dir) / "config.yaml").train.min_loss_scale
        found = detect(scalars.series("train/loss"), loss_scale=scalars.series("train/loss_scale"),
                       min_loss_scale=cfg_min_scale)
        return [Alarm(LEGACY_KIND[a.kind], a.step, a.detail) for a in found if a.kind in FATAL_ALARMS]

    def _run_attempt(self, run: Run, job_id: str, index: int) -> int:
        """The 1-based attempt number within the whole run (a run spans several Slurm jobs when resubmitted):
        the attempts of its earlier jobs, each of which ended with a recorded decision, plus this one."""
        decisions = self.ledger.decisions(run.run_id)
        offset = 0
        for sub in self.ledger.submissions(run.run_id):
            if sub.job_id == job_id:
                break
            if sub.job_id:
                offset += max((d.attempt for d in decisions if d.job_id == sub.job_id), default=0) + 1
        return offset + index + 1

    def _history(self, run: Run) -> List[PastAttempt]:
        rows = self.ledger.decisions(run.run_id)
        out = []
        for i, row in enumerate(rows):
            before = rows[i - 1].ckpt_step if i else None
            progress = None if row.ckpt_step is None and before is None else (row.ckpt_step or -1) > (before or -1)
            out.append(PastAttempt(row.job_id, row.cause, row.action, row.patch, progress))
        return out

    def _maybe_expedite(self, run: Run, job_id: str, attempts: List[Attempt], report: TickReport) -> None:
        """Slurm requeued the job by itself (preemption, node failure): make its next attempt start now,
        and for a failed node also keep it off that node (``scontrol update ExcNodeList``), which is the
        resubmission the policy asks for without a second job id."""
        diagnoses = self._diagnoses(run, job_id, attempts)
        previous = diagnoses[-2]
        cfg = load_snapshot(Path(run.run_dir) / "config.yaml")
        if previous.cause in (Cause.NODE_FAIL, Cause.GPU_HW_ERROR) and not self.ledger.decided(job_id, len(attempts) - 2):
            self._exclude_on_requeued(run, job_id, previous, cfg, report)
            cfg = load_snapshot(Path(run.run_dir) / "config.yaml")
        decision = decide(Cause.PENDING, [], cfg, Situation(job_id=job_id, requeued_after=previous.cause.value),
                          self.limits)
        if not decision.expedite:
            return
        self._say(report, run, f"job {job_id} requeued by Slurm after {previous.cause.value}: expedite "
                               "(scontrol update StartTime=now; Slurm would wait 121 s)")
        if self.dry_run:
            return
        self.ledger.mark_expedited(job_id, len(attempts) - 1)
        self._expedite(run, job_id, report)
        self._audit(run, {"job_id": job_id, "attempt": self._run_attempt(run, job_id, previous.attempt_index),
                          "cause": previous.cause.value,
                          "action": "expedite", "reason": decision.reason, "evidence": list(previous.evidence)})

    def _exclude_on_requeued(self, run: Run, job_id: str, previous: Diagnosis, cfg, report: TickReport) -> None:
        decision = decide(previous.cause, self._history(run), cfg,
                          Situation(job_id=job_id, nodes=previous.nodes, bad_nodes=previous.bad_nodes), self.limits)
        exclude = decision.patch.get("slurm.exclude")
        self._say(report, run, f"job {job_id} attempt {previous.attempt_index + 1}: {previous.cause.value} -> "
                               f"{decision.action}: {decision.reason}")
        if self.dry_run or decision.action != RESUBMIT or set(decision.patch) != {"slurm.exclude"}:
            return
        self.ledger.record_decision(run.run_id, job_id, previous.attempt_index, previous.cause.value, decision.action,
                                    decision.reason, decision.patch, list(previous.evidence), None, decision.to_dict())
        try:
            self.slurm.run(["scontrol", "update", f"JobId={job_id}", f"ExcNodeList={exclude}"])
        except SlurmError as exc:
            self._say(report, run, f"could not exclude {exclude} from job {job_id}: {exc}")
            return
        new_cfg = apply_patch(cfg, decision.patch)
        write_config(Path(run.run_dir), new_cfg)
        self._say(report, run, f"requeued job {job_id} now excludes {exclude}")
        self._audit(run, {"job_id": job_id, "attempt": self._run_attempt(run, job_id, previous.attempt_index),
                          "cause": previous.cause.value,
                          "evidence": list(previous.evidence), "decision": decision.to_dict(),
                          "config_diff": {"slurm.exclude": {"from": cfg.slurm.exclude, "to": exclude}}})

    def _expedite(self, run: Run, job_id: str, report: TickReport) -> None:
        try:
            self.slurm.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"])
        except SlurmError as exc:
            self._say(report, run, f"expedite of job {job_id} failed ({exc}); it starts after Slurm's delay")

    def _decide(self, run: Run, phase: Phase, job_id: str, attempts: List[Attempt], report: TickReport) -> None:
        diagnoses = self._diagnoses(run, job_id, attempts)
        latest = diagnoses[-1]
        config_path = Path(run.run_dir) / "config.yaml"
        cfg = load_snapshot(config_path)
        steps = complete_steps(Path(run.run_dir))
        history = self._history(run)
        last_step = next((h.ckpt_step for h in reversed(self.ledger.decisions(run.run_id)) if h.ckpt_step is not None), None)
        progress = None if not steps else (steps[-1] > last_step if last_step is not None else True)
        situation = Situation(job_id=job_id, made_progress=progress, checkpoint_steps=tuple(steps),
                              nodes=latest.nodes, bad_nodes=latest.bad_nodes, divergence_step=latest.divergence_step,
                              gpu_capacity_bytes=gpu_capacity_bytes(
                                  [*latest.evidence, latest.root.line if latest.root else ""]))
        decision = decide(latest.cause, history, cfg, situation, self.limits)
        if decision.action != DONE and steps and steps[-1] >= cfg.train.max_steps:
            # The final checkpoint is complete, so the training is done whatever happened after it (a rank
            # crashing in interpreter teardown, a late signal): never requeue finished work.
            decision = Decision(DONE, "completed", f"the final checkpoint (step {steps[-1]}) is complete; the job "
                                                   f"ended {latest.state} after it ({latest.cause.value})")
        if decision.action == DONE:
            self._say(report, run, f"job {job_id} completed" + ("" if latest.cause == Cause.COMPLETED else
                                                                 f": {decision.reason}"))
            self._step(run, phase, Event(EventKind.COMPLETED, job_id))
            self._audit(run, {"job_id": job_id, "cause": "completed", "action": "done", "reason": decision.reason})
            return
        if decision.action not in _ACTIONS:
            return  # wait
        if decision.action in (REQUEUE, RESUBMIT):
            queued = queue_state(self.slurm, job_id)
            if queued is None or queued:
                # Slurm requeues preempted and node-failed jobs by itself, and sacct can show the ended attempt
                # a moment before the requeued one. Acting now would start a second job for the same run; the
                # next ticks see the requeued attempt and expedite (and exclude) it instead.
                if (job_id, latest.attempt_index) not in self._deferred:  # say it once, not every tick
                    self._deferred.add((job_id, latest.attempt_index))
                    self._say(report, run, f"job {job_id} ended ({latest.cause.value}) but is still in Slurm's queue "
                                           f"({queued or 'squeue did not answer'}): waiting for its requeued attempt")
                return
        self._say(report, run, f"job {job_id} attempt {latest.attempt_index + 1}: {latest.cause.value} -> "
                               f"{decision.action}: {decision.reason}")
        for line in latest.evidence[:4]:
            self._say(report, run, f"    evidence: {line}")
        if self.dry_run:
            return
        new_phase, effects = transition(phase, Event(EventKind.ENDED, job_id, _ACTIONS[decision.action]))
        for effect in effects:  # the lifecycle orders them: the record always comes before the action
            if effect.name == EFFECT_RECORD:
                self.ledger.record_decision(run.run_id, job_id, latest.attempt_index, latest.cause.value,
                                            decision.action, decision.reason, decision.patch, list(latest.evidence),
                                            steps[-1] if steps else None, decision.to_dict())
                self._audit(run, {"job_id": job_id, "attempt": self._run_attempt(run, job_id, latest.attempt_index),
                                  "cause": latest.cause.value,
                                  "evidence": list(latest.evidence), "decision": decision.to_dict(),
                                  "config_diff": {k: {"from": _get(cfg, k), "to": v} for k, v in decision.patch.items()}})
                self.ledger.set_phase(run.run_id, new_phase.value)
                crash_point("after_decision")
            elif effect.name in (EFFECT_REQUEUE, EFFECT_RESUBMIT):
                self._carry_out(run, job_id, decision, cfg, report)
            elif effect.name == EFFECT_NOTIFY:
                self._say(report, run, f"stopped: {decision.reason}")

    def _carry_out(self, run: Run, job_id: str, decision: Decision, cfg, report: TickReport) -> None:
        try:
            if decision.action == REQUEUE:
                # Slurm only requeues preempted/node-failed jobs itself; anything else needs an explicit requeue.
                self.slurm.run(["scontrol", "requeue", job_id])
                self._expedite(run, job_id, report)
                self._say(report, run, f"requeued job {job_id} and expedited it")
            else:
                new_cfg = apply_patch(cfg, decision.patch)
                if decision.rollback_before_step is not None or decision.rollback_to_step is not None:
                    moved = set_aside_after(Path(run.run_dir), decision.rollback_to_step, decision.rollback_before_step)
                    if moved:
                        self._say(report, run, f"rollback: set aside checkpoints {', '.join(moved)}")
                n = len(self.ledger.submissions(run.run_id))
                write_config(Path(run.run_dir), new_cfg, name=f"config.{n}.yaml")  # history of every attempt's config
                path = write_config(Path(run.run_dir), new_cfg)
                job = self.submit(self.ledger, run.run_id, Path(run.run_dir), new_cfg, path, self.executor,
                                  reason=f"{decision.cause}: {decision.reason}")
                self._say(report, run, f"resubmitted as job {getattr(job, 'job_id', job)}")
        except (SlurmError, OSError, Exception) as exc:  # noqa: BLE001 - keep watching; retried next tick
            self._say(report, run, f"action failed ({exc}); will retry next tick")
            self._step(run, Phase.RECOVERING, Event(EventKind.ACTION_FAILED, job_id))
            return
        self.ledger.set_phase(run.run_id, Phase.PENDING.value)

    def _retry_recovery(self, run: Run, job_id: str, index: int, state: str, report: TickReport) -> None:
        """A decision was recorded but its action may not have happened (action failed, or we were killed)."""
        rows = self.ledger.decisions(run.run_id)
        if not rows:
            return
        last = rows[-1]
        if last.job_id != job_id:  # a newer job exists: the resubmission went through
            self._step(run, Phase.RECOVERING, Event(EventKind.RECOVERED, job_id))
            return
        if last.action == REQUEUE and (state in PENDING_STATES | RUNNING_STATES) and index > last.attempt:
            self._step(run, Phase.RECOVERING, Event(EventKind.RECOVERED, job_id))
            return
        cfg = load_snapshot(Path(run.run_dir) / "config.yaml")
        saved = last.decision
        decision = Decision(last.action, last.cause, last.reason, dict(last.patch),
                            rollback_to_step=saved.get("rollback_to_step"),
                            rollback_before_step=saved.get("rollback_before_step"))
        self._say(report, run, f"carrying out the recorded decision again: {last.action} ({last.reason})")
        if not self.dry_run:
            self._carry_out(run, job_id, decision, cfg, report)


def _get(cfg, dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        node = getattr(node, part, None)
    return node

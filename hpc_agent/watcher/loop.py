"""The watcher: a thin interpreter around the pure core. Each tick: observe -> follow -> journal -> carry out.

Observe: one batched sacct call for every followed Slurm run, plus (only for runs whose attempt ended or was
requeued) squeue's word and bounded reads of the run's files. A run on the local executor is never sent to
sacct: its one attempt is built from its process and files (``hpc_agent.jobs.local_process.observe_local``),
and from there it is followed, decided and repaired by the same core. Follow: ``hpc_agent.watcher.follow.follow``.
Journal: the decision, its effects, its audit record and the new phase in one ledger transaction.
Carry out: ``hpc_agent.watcher.effects``, each effect idempotently, then ``events.jsonl`` from the journal.
Observing or deciding one run can fail in any way; that run goes to ``needs_attention`` with the reason
in its audit trail, and every other run is still followed on the same tick.
"""
from __future__ import annotations

import datetime as _dt
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Union

from hpc_agent.config.problems import ConfigError
from hpc_agent.config.profile import sacct_json_quirk
from hpc_agent.core.handback import handing_back, read_successor
from hpc_agent.core.read_caps import DEFAULT_CAPS, ReadCaps, cap_of
from hpc_agent.core.redact import redact
from hpc_agent.jobs import local_process
from hpc_agent.jobs.submission import crash_point, submit_attempt
from hpc_agent.policy.decide import PolicyLimits
from hpc_agent.slurm.attempt_cache import AttemptCache
from hpc_agent.slurm.job_match import Claim, own_attempts
from hpc_agent.slurm.queries import queue_state
from hpc_agent.state import killswitch, run_config
from hpc_agent.state.journal import Journal, LeaseLost, WatcherLease, commit_or_skip
from hpc_agent.state.ledger import Ledger, Run
from hpc_agent.state.lifecycle import FOLLOWED, Event, EventKind, Phase, transition
from hpc_agent.watcher import effects, observe
from hpc_agent.watcher.follow import RUNNING_STATES, follow, wants
from hpc_agent.watcher.follow_model import NOT_ASKED, Live, Observation, Outcome, RunState, Suspicion, Wants
from hpc_agent.watcher.in_job import InJobIngest
from hpc_agent.watcher.notifier import Notifier

LIVE_PHASES = [p.value for p in FOLLOWED]
_QUIET_WANTS = (Wants(), Wants(live=True))  # a run that wants at most its heartbeats read
_NOTHING = {phase: Outcome(phase) for phase in Phase}  # follow()'s answer when there is nothing to do
_PHASES = {phase.value: phase for phase in Phase}  # Phase(value) without the enum's lookup, per run per tick
LOCAL = "local"  # a submission's executor for a process on the submitting machine (submit --executor local)


@dataclass
class TickReport:
    """What one tick saw and did (printed by the CLI, asserted by tests)."""

    sacct_calls: int = 0
    fallback_calls: int = 0
    runs: int = 0
    unknown: bool = False
    paused: bool = False
    handing_back: bool = False  # a job is being requeued and not yet expedited: poll fast (hpc_agent/core/handback.py)
    parked: List[str] = field(default_factory=list)
    lines: List[str] = field(default_factory=list)


class Watcher:
    def __init__(self, ledger: Ledger, slurm, *, runs_root: Path, clock: Callable[[], float] = time.time,
                 dry_run: bool = False, limits: Optional[PolicyLimits] = None,
                 submit: Callable[..., Any] = submit_attempt, out: Callable[[str], None] = print,
                 pause_file: Optional[Path] = None, lease: Optional[WatcherLease] = None,
                 intent_grace_s: float = effects.INTENT_GRACE_S, sacct_json: Optional[bool] = None,
                 notify: Optional[Any] = None, caps: ReadCaps = DEFAULT_CAPS):
        self.ledger, self.slurm, self.runs_root, self.clock = ledger, slurm, Path(runs_root), clock
        self.out = lambda line: out(redact(line))  # the watcher's log: no secret in it (hpc_agent.core.redact)
        self.dry_run, self.limits, self.lease = dry_run, limits or PolicyLimits(), lease
        self.pause_file = pause_file or killswitch.pause_path(self.runs_root)
        self.journal = Journal(ledger, lease)
        self.ctx = effects.Context(ledger, slurm, submit, self._say, clock, intent_grace_s,
                                   pause_file=self.pause_file)
        self.carrier = effects.Carrier(self.ctx, self.journal, self._guarded, self._time)
        self._report = TickReport()
        self._said_wait: set = set()
        self._quiet: Dict[str, Any] = {}  # runs whose last follow() decided nothing, with its inputs
        self._sacct = AttemptCache()  # parses only the jobs whose sacct lines changed since the last tick
        # --json or text: decided by one probe on the first tick that reads sacct, kept for the watcher's life.
        # A profile's quirks.sacct_json=false ($HPC_AGENT_PROFILE, docs/profiles.md) skips the probe: text.
        self._source = observe.SacctSource(sacct_json if sacct_json is not None else sacct_json_quirk())
        self._own: Dict[str, Any] = {}  # job id -> (sacct's attempts, claim, the run's own): reused while unchanged
        self._said_foreign: set = set()
        self._said_parked: set = set()  # (run id, reason) said for a run already parked
        self._said_caps: set = set()  # (run id, cap) whose read-cap note was said (hpc_agent/core/read_caps.py)
        self.caps = caps  # how much of a run dir one tick reads: the watcher owner's, never the run's
        self._scalars: Dict[str, Any] = {}  # per run, kept between ticks: each tick reads only new TB bytes
        self.in_job = InJobIngest(ledger, self.journal, self._say)  # the job's own repairs (hpc_agent/core/in_job_journal.py)
        self._local: Dict[str, Any] = {}  # run id -> (local job id, its attempts, final): hpc_agent/jobs/local_process.py
        self._said_unknown: set = set()  # (run id, local job id) whose unknown state was said
        self._settings: Dict[str, Any] = {}  # job id -> its run's (resilience settings, watch.enabled, beats expected)
        self._rows: Dict[str, Run] = {}  # run id -> its ledger row as first read (:meth:`_run`)
        # Notifications from the audit trail; ``notify``: the runs-root default (watch --notify-*), a run's own wins.
        self.notifier = Notifier(ledger, self.journal, self._say, notify, self.limits)
        if not dry_run:  # from now on: what this watcher decides is announced, not the ledger's history
            self._notify(self.notifier.start)

    def paused(self) -> bool:
        return killswitch.is_paused(self.pause_file)

    def _time(self, at: Optional[float] = None) -> str:
        return _dt.datetime.fromtimestamp(self.clock() if at is None else at).isoformat(timespec="seconds")

    def _say(self, run_id: str, text: str) -> None:
        line = f"[watch {self._time()}] {run_id}: {text}"
        self._report.lines.append(line)
        self.out(line)

    # --- start-up and each tick --------------------------------------------------------------------------
    def reconcile(self, report: Optional[TickReport] = None) -> TickReport:
        """Finish what a killed watcher or submit left: journaled effects still pending, intents without job id."""
        self._report = report or TickReport()
        if not self.dry_run:
            self.carrier.settle()
            self._notify()  # what a killed watcher decided but did not announce
        return self._report

    def tick(self) -> TickReport:
        report = self._report = TickReport()
        if self.paused():
            report.paused = True
            self.out(f"[watch {self._time()}] paused ({self.pause_file} exists): no actions")
            if not self.dry_run:
                self._notify(self.notifier.paused, self.pause_file)
            return report
        if self.lease is not None and not self.dry_run:
            self.lease.renew()
        if not self.dry_run:
            self.carrier.settle()
        rows = [row for row in self.ledger.followed_submissions(LIVE_PHASES) if row[2]]
        report.runs = len(rows)
        if not rows:
            return report
        # A local job's id is a process id: never sent to sacct (it can equal a real Slurm job's id). Its attempt
        # is built from the machine's facts instead (hpc_agent/jobs/local_process.py), keyed by run id.
        ids = sorted({job_id for _, _, job_id, _, executor in rows if executor != LOCAL})
        local = {run_id: self._local_attempts(run_id, job_id) for run_id, _, job_id, _, executor in rows
                 if executor == LOCAL}
        found = observe.sacct_attempts(self.slurm, ids, report, lambda text: self.out(f"[watch {self._time()}] {text}"),
                                       self._sacct, self._source) if ids else {}
        if found is None and not local:
            return report
        now = self.clock()
        decided, expedited = self.ledger.attempt_marks(LIVE_PHASES)
        suspicions = self.ledger.suspicions(LIVE_PHASES)
        busy = self.journal.pending_runs()
        for run_id, phase, job_id, intent_at, executor in rows:
            attempts = local.get(run_id) if executor == LOCAL else (found or {}).get(job_id)
            if attempts is None or run_id in busy:
                continue
            if report.paused:  # the kill switch, honoured between runs too (checked before every action)
                break
            # Everything about one run, from sorting out its sacct records to carrying out its effects, is that
            # run's own: any exception parks it (needs_attention, audited) and the tick goes on with the others.
            self._guarded(run_id, job_id, lambda: self._tick_run(run_id, phase, job_id, intent_at, attempts, now,
                                                                 decided, expedited, suspicions, executor))
        if not self.dry_run:
            self._notify()
            self.carrier.flush_events()
        return report

    def _tick_run(self, run_id: str, phase: str, job_id: str, intent_at, attempts, now: float,
                  decided, expedited, suspicions, executor: str = "slurm") -> None:
        """One followed run on one tick: its own attempts among sacct's, the quiet-run shortcut, the job's own
        repairs, then observe -> follow -> journal -> carry out (:meth:`_follow`). Runs under :meth:`_guarded`."""
        known = self._own.get(job_id)  # inline: this runs for every followed run, every tick
        if executor == LOCAL:
            pass  # the run's own process, judged from its own files: no other job's record to sort out
        elif known is not None and known[0] is attempts and known[1] == run_id and known[2] == intent_at:
            attempts = known[3]
        else:
            attempts = self._own_attempts(Claim(job_id, run_id, intent_at), attempts)
        if not attempts:
            return  # only other jobs' records under this id: the run's job is not in sacct yet (unknown)
        hang = suspicions.get(job_id)
        marks = (phase, job_id, decided.get(job_id), expedited.get(job_id), hang and hang[:2])
        self._report.handing_back |= handing_back(attempts[-1].state, len(attempts), marks[3] or ())
        quiet = self._quiet.get(run_id)
        if quiet is not None and quiet[1] is attempts and quiet[0] == marks and (quiet[2] is None or now < quiet[2]):
            return  # the same inputs as a tick that decided nothing: follow() is pure, so nothing again
            # (a running attempt's heartbeats are judged again once quiet[2] passes: every heartbeat_s)
        if not self.dry_run:
            # The job's own repairs, audited before any decision on the attempt's end. Past the quiet-run
            # shortcut: a running run is looked at again every heartbeat_s / 2 and an ended one as soon as
            # sacct's answer changes, so 10,000 followed runs do not cost 10,000 lstat calls a tick.
            self.in_job.tick(run_id)
        state = RunState(run_id, _PHASES.get(phase) or Phase(phase), job_id, decided=frozenset(marks[2] or ()),
                         expedited=frozenset(marks[3] or ()),
                         suspicion=Suspicion(job_id, *hang) if hang else None, executor=executor)
        self._follow(self._run(run_id, phase), state, attempts, marks)

    def _run(self, run_id: str, phase: str) -> Optional[Run]:
        """The run's ledger row with this tick's phase, without a query per run per tick: a run's name, run dir
        and creation time never change once it is in the ledger (kept from its first ``ledger.run``); its phase
        is the one this tick read. Code that needs the phase as it is now reads the ledger itself (effects)."""
        known = self._rows.get(run_id)
        if known is None:
            row = self.ledger.run(run_id)
            if row is None:
                return None
            known = self._rows[run_id] = row
        if known.phase != phase:
            known = self._rows[run_id] = replace(known, phase=phase)
        return known

    def _local_attempts(self, run_id: str, job_id: str) -> Optional[List[Any]]:
        """The one attempt of a run's local job, from the machine's facts (``local_process.observe_local``); None
        while its state is unknown (it ran on another host and left no end: wait, never decide on a guess). The
        same list object while it is unchanged (the quiet-run shortcut compares by identity); a gone process's
        attempt is final and kept, its files not read again."""
        known = self._local.get(run_id)
        if known is not None and known[0] == job_id and known[2]:
            return known[1]
        run = self.ledger.run(run_id)
        sub = next((s for s in reversed(self.ledger.submissions(run_id)) if s.job_id == job_id), None)
        if run is None or sub is None:
            return None
        seen = local_process.observe_local(Path(run.run_dir), job_id, sub.submitted_at or sub.intent_at, self.caps)
        if seen.attempt is None:
            if (run_id, job_id) not in self._said_unknown:
                self._said_unknown.add((run_id, job_id))
                self._say(run_id, f"local job {job_id}: state unknown, waiting ({'; '.join(seen.basis[1:])})")
            return None
        attempts = known[1] if known is not None and known[0] == job_id and known[1] == [seen.attempt] \
            else [seen.attempt]
        self._local[run_id] = (job_id, attempts, seen.final)
        return attempts

    def _queue(self, state: RunState) -> Optional[str]:
        """squeue's word on the job; a local job has no queue: \"\" (its attempt ended: its process is gone)."""
        return "" if state.executor == LOCAL else queue_state(self.slurm, state.job_id)

    def _notify(self, step: Optional[Callable[..., Any]] = None, *args: Any) -> None:
        """Notifications (hpc_agent/watcher/notifier.py): a failing notifier, or a bug in one, is said and never stops a tick."""
        try:
            (step or self.notifier.tick)(*args)
        except LeaseLost:
            raise
        except Exception as exc:  # noqa: BLE001 - the watcher's work matters more than its announcements
            self.out(f"[watch {self._time()}] notifications failed ({type(exc).__name__}: {exc}); the watcher goes on")

    def _own_attempts(self, claim: Claim, attempts: List[Any]) -> Any:
        """The run's own attempts among what sacct lists under its job id (hpc_agent/slurm/job_match.py), kept in
        ``self._own`` so that the next tick gets the same object while sacct's answer is the same (the
        quiet-run shortcut relies on it). Another job's record is said, and audited, once per watcher."""
        run_id = claim.run_id
        own, foreign = own_attempts(attempts, claim)
        own_list = list(own) if foreign or any(a is not b for a, b in zip(own, attempts)) else attempts
        self._own[claim.job_id] = (attempts, run_id, claim.intent_at, own_list)
        for other in foreign:
            key = (claim.job_id, other.position, other.job_name, other.submit)
            if key in self._said_foreign:
                continue
            self._said_foreign.add(key)
            self._say(run_id, other.describe())
            if not self.dry_run:
                record = {"job_id": claim.job_id, "action": "ignored_foreign_record", "reason": other.reason,
                          "evidence": {"job_name": other.job_name, "submit": other.submit,
                                       "position": other.position}}
                phase = self.ledger.run(run_id).phase
                commit_or_skip(self.journal, run_id, phase, Outcome(Phase(phase), audit=(record,)))
        return own_list

    def _guarded(self, run: Union[Run, str], job_id: str, step: Callable[[], None]) -> None:
        """One run's trouble is that run's: any ``Exception`` (a parse error, a bad file, a bug in the core, a
        failed effect) parks it with the reason, and the tick goes on with the others. ``run``: a Run or its id."""
        try:
            step()
        except LeaseLost:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever it is, it parks this run only
            run_id = run if isinstance(run, str) else run.run_id
            self._park(run_id, job_id, " ".join(f"{type(exc).__name__}: {exc}".split())[:500])

    def _park(self, run_id: str, job_id: str, reason: str) -> None:
        """``needs_attention`` through the lifecycle, with the reason audited; said once for a run that is
        already not followed (its events.jsonl can still fail to be written every tick)."""
        row = self.ledger.run(run_id)
        current = Phase(row.phase) if row is not None else None
        if current not in FOLLOWED:
            if (run_id, reason) not in self._said_parked:
                self._said_parked.add((run_id, reason))
                self._say(run_id, f"needs attention: {reason}")
            return
        self._report.parked.append(run_id)
        self._say(run_id, f"needs attention: {reason}")
        phase = transition(current, Event(EventKind.UNFOLLOWABLE, job_id))
        if not self.dry_run:
            commit_or_skip(self.journal, run_id, current.value, Outcome(
                phase, audit=({"job_id": job_id, "action": "needs_attention", "reason": reason},)))

    def _say_caps(self, run_id: str, notes) -> None:
        """A run over a read cap is said once per cap (its decision's audit record carries the notes too)."""
        for note in notes:
            cap = cap_of(note)
            if cap and (run_id, cap) not in self._said_caps:
                self._said_caps.add((run_id, cap))
                self._say(run_id, note)

    def _placement_facts(self, run_id: str, cfg, patch) -> tuple:
        """One sinfo and bounded ``sbatch --test-only`` calls for the run's config (``patch`` applied: e.g. the failed
        node excluded). ``()`` on any failure: the facts only improve a decision, the repair in place stands."""
        from hpc_agent.slurm.partition_facts import collect
        from hpc_agent.config.load import apply_patch

        try:
            cfg = apply_patch(cfg, patch) if patch else cfg
            p = cfg.placement
            return tuple(collect(self.slurm, cfg, only=p.partitions, timeout_s=p.test_only_timeout_s,
                                 max_tests=p.max_candidates))
        except Exception as exc:  # noqa: BLE001 - see the docstring
            self._say(run_id, f"placement: the partitions' facts were not gathered ({exc}); repairing in place")
            return ()

    def _live(self, run: Run, state: RunState, attempt, with_stacks: bool) -> Optional[Live]:
        """The running attempt's heartbeats judged with the run's own ``resilience:`` settings (its config
        snapshot, read once per job id); None when the config cannot be read (the job's end will say why)."""
        known = self._settings.get(state.job_id)
        if known is None:
            try:
                cfg = run_config.current(self.ledger, run.run_id, run.run_dir)
            except (OSError, ConfigError):
                return None
            known = self._settings[state.job_id] = (cfg.resilience, cfg.watch.enabled, not cfg.train.command)
        return observe.read_live(run.run_dir, attempt, known[0], self.clock(), with_stacks, known[1],
                                 beats_expected=known[2])

    def _follow(self, run: Run, state: RunState, attempts, marks) -> None:
        want = wants(state, attempts)
        if want.files or state.phase is Phase.RECOVERING:
            state = observe.run_state(self.ledger, run, state)
        queue = self._queue(state) if want.queue else NOT_ASKED
        files = None
        if want.files:
            scalars = self._scalars.get(run.run_id) or observe.scalars_for(Path(run.run_dir), self.caps)
            self._scalars[run.run_id] = scalars
            files = observe.read_files(Path(run.run_dir), state.job_id, scalars,
                                       lambda: run_config.current(self.ledger, run.run_id, run.run_dir), self.caps)
            self._say_caps(run.run_id, files.notes)
        live = self._live(run, state, attempts[-1], want.stacks) if want.live else None
        # Did the job hand over to a successor (hpc_agent/core/handback.py)? One lstat, only once it stopped running.
        successor = None if attempts[-1].state in RUNNING_STATES else read_successor(run.run_dir, state.job_id)
        outcome = follow(state, Observation(tuple(attempts), queue, files, live, successor=successor), self.limits)
        if want in _QUIET_WANTS and not outcome.ask_queue and outcome == _NOTHING[state.phase]:
            # A running attempt's verdict can change only as its heartbeats do: look again after half a heartbeat
            # (half: a tick period equal to heartbeat_s must not skip every other look), a minute when its
            # settings could not be read; not on every tick of every running run.
            known = self._settings.get(state.job_id)
            again = self.clock() + (float(known[0].heartbeat_s) / 2 if known is not None else 60.0) \
                if want.live else None
            self._quiet[run.run_id] = (marks, attempts, again)
            return
        self._quiet.pop(run.run_id, None)
        if outcome.ask_queue:
            queue = self._queue(state)
            outcome = follow(state, Observation(tuple(attempts), queue, files, live, successor=successor), self.limits)
        if outcome.ask_placement is not None and files is not None:
            facts = self._placement_facts(run.run_id, files.config, outcome.ask_placement)
            outcome = follow(state, Observation(tuple(attempts), queue, files, live, successor=successor,
                                                placement=facts), self.limits)
        if outcome.wait_note is not None and (state.job_id, outcome.wait_note) in self._said_wait:
            return  # say it once, not every tick
        if outcome.wait_note is not None:
            self._said_wait.add((state.job_id, outcome.wait_note))
        for line in outcome.lines:
            self._say(run.run_id, line)
        if self.dry_run or (outcome.phase is state.phase and not (outcome.effects or outcome.audit or outcome.decision)):
            return
        if self.paused():  # the kill switch is honoured between runs: checked before anything is journaled
            self._report.paused = True
            return
        if commit_or_skip(self.journal, run.run_id, state.phase.value, outcome):
            if outcome.phase is Phase.NEEDS_ATTENTION:
                self._report.parked.append(run.run_id)
            crash_point("after_journal")
            self.carrier.run_effects(run)

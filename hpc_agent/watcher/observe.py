"""What the watcher observes each tick (I/O): one batched sacct call, and bounded reads of a run's files.

Reading a run's files never raises: every problem (an invalid ``config.yaml``, a log that is a FIFO or
a link to ``/dev/zero``) becomes a line in :attr:`RunFiles.problems`, and the pure core parks such a run
in ``needs_attention``; a corrupt TensorBoard tail is skipped and reported in :attr:`RunFiles.notes`.
"""
from __future__ import annotations

import datetime as _dt
import functools
import json
import os
import stat
from dataclasses import replace
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from hpc_agent.config.problems import ConfigError
from hpc_agent.config.schema import Config
from hpc_agent.core import rundir
from hpc_agent.core.checkpoint_format import complete_steps
from hpc_agent.core.filemodes import run_dir_problem
from hpc_agent.core.read_caps import DEFAULT_CAPS, ReadCaps, cap_of
from hpc_agent.diagnosis.alarms import run_alarms
from hpc_agent.diagnosis.hang import judge
from hpc_agent.metrics.tb_reader import RunScalars
from hpc_agent.slurm.attempt_cache import AttemptCache
from hpc_agent.slurm.cli import SlurmError
from hpc_agent.slurm.fallback import SQUEUE_FORMAT, as_sacct_text, parse_scontrol_jobs, parse_squeue
from hpc_agent.slurm.sacct import WATCH_FIELDS, Attempt, SacctFormatError, group_attempts
from hpc_agent.slurm.sacct_json import exit_codes_reliable, parse_sacct_json
from hpc_agent.watcher.follow import history_from
from hpc_agent.watcher.follow_model import Live, RunFiles, RunState

TAIL_BYTES = 256 * 1024
ALARM_TAGS = ("train/loss", "train/loss_scale")


JSON_MAX_JOBS = 200
"""Above this many jobs a tick reads text even where ``--json`` is faithful. Measured on the localhost cluster
(22.05): ``sacct --json`` is ~20 KB per job with its steps against ~0.3 KB of text (0.85 s against 0.22 s
of sacct for 521 jobs), and parsing it costs ~0.4 ms of CPU per job (4.4 s for 10k jobs, 204 MB) where the
text path re-parses only changed jobs (~16 ms a tick for 1000 running jobs): at 200 jobs, ~80 ms."""


def json_verdict(returncode: int, stdout: str) -> Tuple[bool, str]:
    """Pure: from one ``sacct --json`` probe, whether the watcher may read ``--json`` here, and why."""
    if returncode != 0:
        return False, "sacct --json is not supported here (it failed)"
    try:
        doc = json.loads(stdout)
        version = doc["meta"]["Slurm"]["version"]
        found = (int(version["major"]), int(version["minor"]))
    except (ValueError, KeyError, TypeError):
        return False, "sacct --json answered something that is not Slurm's JSON"
    if not exit_codes_reliable(doc):  # 22.05 reads SUCCESS/0 for a job that exited 3: the exit code table's
        # causes would be lost (measured on the localhost cluster, tests/cluster/test_slurm_contract.py)
        return False, (f"Slurm {found[0]}.{found[1]:02d}'s sacct --json drops exit codes: reading text "
                       "(job names are checked against the run's, see hpc_agent/slurm/job_match.py)")
    return True, f"Slurm {found[0]}.{found[1]:02d}: reading sacct --json"


class SacctSource:
    """How this watcher reads sacct: ``--json`` where the cluster has it and it is faithful and not too big,
    else ``--parsable2`` text. ``use_json`` None: decided by ONE probe, on the first tick, kept after."""

    def __init__(self, use_json: Optional[bool] = None):
        self.use_json, self.why = use_json, "" if use_json is None else "set by the caller"

    def json_for(self, slurm, n_jobs: int, say: Callable[[str], None]) -> bool:
        if self.use_json is None:
            probe = getattr(slurm, "sacct_probe", None)
            try:
                self.use_json, self.why = (json_verdict(*_rc_out(probe())) if probe is not None
                                           else (False, "this Slurm client cannot probe sacct --json"))
            except SlurmError as exc:
                self.use_json, self.why = False, f"sacct --json probe failed ({exc})"
            say(f"sacct: {self.why}")
        return bool(self.use_json) and n_jobs <= JSON_MAX_JOBS


def _rc_out(result) -> Tuple[int, str]:
    return result.returncode, result.stdout


def sacct_attempts(slurm, ids: Sequence[str], report, say: Callable[[str], None],
                   cache: AttemptCache, source: Optional[SacctSource] = None) -> Optional[Dict[str, List[Attempt]]]:
    """Every attempt of these jobs from ONE ``sacct -D`` call (text, or ``--json`` where ``source`` says);
    when accounting fails, from slurmctld (one squeue + one scontrol call). None: states unknown, which
    means wait (never requeue on a guess)."""
    as_json = source is not None and source.json_for(slurm, len(ids), say)
    try:
        report.sacct_calls += 1
        text = slurm.sacct(list(ids), fields=WATCH_FIELDS, as_json=True) if as_json else \
            slurm.sacct(list(ids), fields=WATCH_FIELDS)
    except SlurmError as exc:
        text = _without_accounting(slurm, list(ids), exc, report, say)
        if text is None:
            return None
        as_json = False
    if as_json:
        try:
            attempts = group_attempts(parse_sacct_json(text))
        except SacctFormatError as exc:
            report.unknown = True
            say(f"sacct --json: {exc}: states unknown, waiting")
            return None
    else:
        attempts = cache.attempts(text)
    if not attempts:
        report.unknown = True  # accounting answered nothing: unknown means wait, never requeue
        return None
    return attempts


def _without_accounting(slurm, ids: List[str], error: Exception, report, say) -> Optional[str]:
    try:
        report.fallback_calls += 2
        queued = slurm.run(["squeue", "--noheader", "--jobs", ",".join(ids), "--format", SQUEUE_FORMAT],
                           check=False).stdout
        known = slurm.run(["scontrol", "--oneliner", "show", "job"], check=False).stdout
    except SlurmError as exc:
        report.unknown = True
        say(f"sacct failed ({error}) and slurmctld does not answer ({exc}): states unknown, waiting")
        return None
    text = as_sacct_text(ids, parse_squeue(queued), parse_scontrol_jobs(known))
    if len(text.splitlines()) <= 1:
        report.unknown = True
        say(f"sacct failed ({error}); slurmctld knows none of our jobs: waiting")
        return None
    say(f"sacct failed ({error}); using squeue/scontrol")
    return text


def read_files(run_dir: Path, job_id: str, scalars: Optional[RunScalars], config_of: Callable[[], Config],
               caps: ReadCaps = DEFAULT_CAPS) -> RunFiles:
    """The run's config, the job's log tails, fatal TensorBoard alarms and complete checkpoints, each read
    bounded and regular-file-only. ``scalars`` is the run's incremental TensorBoard reader (kept between
    ticks by the watcher, so each tick reads only new bytes). ``config_of`` gives the config the watcher acts
    on (the ledger's: hpc_agent/state/run_config.py), never the run directory's; it may raise ConfigError or
    OSError, which become a problem of the run. Within ``caps`` (the newest rank logs, the run's log bytes): a
    run over a cap gets a note naming it (``read_caps.over_cap``), not a problem."""
    foreign = run_dir_problem(run_dir)  # renamed away and replaced, or writable by others: read nothing in it
    if foreign is not None:
        return RunFiles(None, (), (), (), (foreign,), ())
    problems: List[str] = []
    notes: List[str] = []
    config = None
    try:
        config = config_of()
    except ConfigError as exc:
        text = "; ".join(p.expected if p.value == "<file>" else str(p) for p in exc.problems)
        problems.append(f"{rundir.CONFIG} is not a valid config: " + " ".join(text.split())[:500])
    except OSError as exc:
        problems.append(f"{rundir.CONFIG}: {exc.strerror or exc}" if not isinstance(exc, rundir.UnsafeFile) else str(exc))
    logs = []
    choice = rundir.find_logs(run_dir, job_id, caps=caps)
    notes.extend(choice.notes)
    for path, got in rundir.tail_logs(choice.paths, TAIL_BYTES, caps, within=run_dir):
        if isinstance(got, rundir.LogText):
            logs.append(got)
        elif isinstance(got, str):
            notes.append(got)
        else:
            problems.append(str(got) if isinstance(got, rundir.UnsafeFile) else f"{path.name}: {got.strerror or got}")
    alarms = []
    if scalars is not None:
        try:
            scalars.update()
            min_scale = config.train.min_loss_scale if config is not None else 1.0
            alarms = run_alarms(scalars, min_scale)
        except Exception as exc:  # noqa: BLE001 - TensorBoard is evidence, not a reason to stop following
            notes.append(f"TensorBoard events not read ({type(exc).__name__}: {exc})")
        notes.extend(p if cap_of(p) else f"TensorBoard: {p}" for p in scalars.problems())
    try:
        steps = tuple(complete_steps(run_dir))
    except OSError as exc:
        problems.append(f"{rundir.CHECKPOINTS}/: {exc.strerror or exc}")
        steps = ()
    return RunFiles(config, tuple(logs), tuple(alarms), steps, tuple(problems), tuple(notes))


def attempt_start(attempt: Attempt) -> Optional[float]:
    """When sacct says this attempt started (epoch seconds; sacct prints local time), None while unknown."""
    return sacct_epoch(attempt.start)


def attempt_end(attempt: Attempt) -> Optional[float]:
    """When sacct says this attempt ended (epoch seconds), None while it runs (``Unknown``) or is unknown."""
    return sacct_epoch(attempt.end)


@functools.lru_cache(maxsize=65536)
def sacct_epoch(text: str) -> Optional[float]:
    """sacct's ``2026-12-03T19:17:53`` (local time, whole seconds) as epoch seconds; None for anything else.
    Cached: every running run's start time is asked for every tick, and strptime is the slow part of a look."""
    try:
        return _dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return None


def stack_marks(run_dir: Path, ranks) -> Dict[int, Tuple[int, int]]:
    """rank -> (size, mtime_ns) of its stack file: one ``lstat`` each, no read; a change is a new dump."""
    marks: Dict[int, Tuple[int, int]] = {}
    for rank in sorted(set(ranks)):
        try:
            info = os.lstat(rundir.stack_path(run_dir, rank))
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode):
            marks[rank] = (info.st_size, info.st_mtime_ns)
    return marks


def read_live(run_dir: Path, attempt: Attempt, settings, now: float, with_stacks: bool, acting: bool = True,
              beats_expected: bool = True) -> Live:
    """A running attempt's heartbeats judged (``diagnosis.hang.judge``, with the run's ``resilience:``
    settings); the stack files' marks when the verdict says hung or stacks were asked, their text only
    when asked. Bounded: one small file per rank (``rundir.read_heartbeats``).

    ``beats_expected=False`` (``train.command``: a user's script beats only if it calls the helper API's
    ``report_step``): an attempt without a beat of its own is not judged, so silence is never a start-up
    stall; once it beats, every rule applies."""
    beats = tuple(rundir.read_heartbeats(run_dir))
    started = attempt_start(attempt)
    if beats_expected or any(started is not None and b.written_at >= started for b in beats):
        verdict = judge(beats, now, started, settings)
    else:
        verdict = None
    marks = stack_marks(run_dir, (b.rank for b in beats)) if verdict is not None or with_stacks else {}
    stacks = rundir.read_stacks(run_dir) if with_stacks else None
    return Live(now, verdict, beats, marks, stacks, float(settings.stack_wait_s), acting)


def run_state(ledger, run, state: RunState) -> RunState:
    """``state`` completed from the ledger: the policy's history, the last checkpoint step, the attempts
    of the run's earlier jobs, the newest decision. Read only for runs whose attempt ended or was requeued."""
    rows = ledger.decisions(run.run_id)
    offset = 0
    for sub in ledger.submissions(run.run_id):
        if sub.job_id == state.job_id:
            break
        if sub.job_id:
            offset += max((d.attempt for d in rows if d.job_id == sub.job_id), default=0) + 1
    last = rows[-1] if rows else None
    return replace(state, history=history_from(rows), attempt_offset=offset,
                   last_ckpt_step=next((r.ckpt_step for r in reversed(rows) if r.ckpt_step is not None), None),
                   last_decision=last and {"job_id": last.job_id, "attempt": last.attempt, "action": last.action,
                                           "cause": last.cause, "reason": last.reason, "patch": last.patch,
                                           "decision": last.decision})


def scalars_for(run_dir: Path, caps: ReadCaps = DEFAULT_CAPS) -> Optional[RunScalars]:
    tb = rundir.tb_dir(run_dir)
    return RunScalars(tb, tags=ALARM_TAGS, caps=caps) if tb.is_dir() and not tb.is_symlink() else None

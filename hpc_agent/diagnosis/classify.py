"""Why did an attempt end? sacct records + log tails + training alarms -> cause + evidence. Pure.

How the evidence is weighed:

1. The state decides while the job is queued or running, and for COMPLETED, unless the training
   process announced a non-zero exit in the log (``[hpc_agent] ... exiting 65``: a wrapper such as
   submitit turned it into 0).
2. CANCELLED without a Slurm reason in the log (no "DUE TO TIME LIMIT/PREEMPTION/NODE FAILURE") is a
   person's scancel: ``cancelled``, whatever the log showed before (their intent wins; it is reported).
3. Otherwise every finding competes: log lines, TensorBoard alarms and the Slurm state (PREEMPTED,
   TIMEOUT, NODE_FAIL, OUT_OF_MEMORY on any row). The root cause is the *earliest* finding where an
   order is known (timestamps, or line order within one log); among findings that cannot be ordered
   against each other, a primary fault (GPU hardware, host OOM, GPU OOM, divergence) beats a Slurm kill,
   which beats a code error, which beats an NCCL error. NCCL errors and tracebacks are so often the
   echo of another rank's death or of SIGTERM that they never win against a preemption or node failure.
4. With no finding at all, the exit code table (``exit_codes.py``) and then the state decide; a FAILED
   job with nothing recognisable is a ``code_error``: not requeued, reported.
"""
from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from hpc_agent.core.causes import SECONDARY_FAULTS, Cause
from hpc_agent.core.exit_codes import EXIT_CODES, ExitCodeMeaning, announced_exit_code, cause_for_exit
from hpc_agent.core.rundir import LogText
from hpc_agent.diagnosis.logscan import (FAILED_EXIT, FAULT, HINT, KILL, MAX_LINE_CHARS, NORMAL_EXIT, Finding,
                                         cancel_reason, hint_reason, parse_timestamp, scan_logs, since_last_repair, split_attempts,
                                         split_by_time)
from hpc_agent.metrics.alarm_kinds import Alarm
from hpc_agent.slurm.sacct import Attempt, job_key_of

PENDING_STATES = {"PENDING", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"}
RUNNING_STATES = {"RUNNING", "CONFIGURING", "COMPLETING", "SIGNALING", "STAGE_OUT", "RESIZING", "SUSPENDED",
                  "STOPPED"}
_STATE_CAUSE = {"PREEMPTED": Cause.PREEMPTED, "TIMEOUT": Cause.TIMEOUT, "DEADLINE": Cause.TIMEOUT,
                "NODE_FAIL": Cause.NODE_FAIL, "BOOT_FAIL": Cause.NODE_FAIL, "OUT_OF_MEMORY": Cause.HOST_OOM}
# Among findings that cannot be ordered, the most likely root cause first.
_PRIORITY = (Cause.GPU_HW_ERROR, Cause.ENV_ERROR, Cause.HOST_OOM, Cause.GPU_OOM, Cause.DIVERGED, Cause.NODE_FAIL,
             Cause.PREEMPTED, Cause.TIMEOUT, Cause.CODE_ERROR, Cause.NCCL_ERROR, Cause.CANCELLED)
MAX_EVIDENCE_LINES = 8


@dataclass(frozen=True)
class Diagnosis:
    job_id: str
    cause: Cause
    evidence: Tuple[str, ...]
    attempt_index: int = 0
    state: str = ""
    exit_code: str = ""
    nodes: Tuple[str, ...] = ()
    """Every node of the attempt."""
    bad_nodes: Tuple[str, ...] = ()
    """Nodes the evidence blames (the failed node, the GPU's node, the nodes of the NCCL errors)."""
    divergence_step: Optional[int] = None
    ended: bool = False
    """The attempt is over (a final Slurm state): an ``unknown`` cause then means "no positive evidence for any
    cause", which the policy treats apart from an unknown *state* (wait)."""
    hypotheses: Tuple[str, ...] = ()
    """For an ``unknown`` cause: the best guesses, each ``"cause: why"``, most likely first."""
    root: Optional[Finding] = field(default=None, compare=False)

    def to_dict(self) -> Dict[str, Any]:
        return {"job_id": self.job_id, "attempt": self.attempt_index, "state": self.state,
                "exit_code": self.exit_code, "cause": self.cause.value, "evidence": list(self.evidence),
                "nodes": list(self.nodes), "bad_nodes": list(self.bad_nodes),
                "divergence_step": self.divergence_step, "ended": self.ended, "hypotheses": list(self.hypotheses)}


def _year(attempt: Attempt) -> Optional[int]:
    start = attempt.start or ""
    return int(start[:4]) if start[:4].isdigit() else None


def _sacct_line(attempt: Attempt) -> str:
    nodes = ",".join(attempt.nodes) or "no node"
    by = f" by {attempt.cancelled_by}" if attempt.cancelled_by else ""
    line = (f"sacct: job {attempt.job_id} attempt {attempt.index + 1}: {attempt.state}{by}, "
            f"exit {attempt.exit_code or '?'}, on {nodes}")
    if attempt.start and attempt.start != "Unknown":
        line += f", {attempt.start} to {attempt.end}"
    odd_steps = [f"{s.job_id} {s.state} {s.exit_code}" for s in attempt.steps
                 if s.state and s.state not in (attempt.state, "COMPLETED", "RUNNING")]
    if odd_steps:
        line += "; steps: " + ", ".join(odd_steps)
    return line


def _precedes(a: Finding, b: Finding) -> Optional[bool]:
    """Is ``a`` known to have happened before ``b``? None when they cannot be ordered."""
    if a.timestamp is not None and b.timestamp is not None and a.timestamp != b.timestamp:
        return a.timestamp < b.timestamp
    if a.source_index is not None and a.source_index == b.source_index and a.line_no != b.line_no:
        return (a.line_no or 0) < (b.line_no or 0)
    return None


def choose_root(candidates: Sequence[Finding]) -> Optional[Finding]:
    """The earliest finding where an order is known; ties among unordered ones go by :data:`_PRIORITY`."""
    earliest = [c for c in candidates if not any(o is not c and _precedes(o, c) for o in candidates)]
    if not earliest:
        return None
    far = _dt.datetime.max
    return min(earliest, key=lambda f: (_PRIORITY.index(f.cause) if f.cause in _PRIORITY else len(_PRIORITY),
                                        f.timestamp or far, f.source_index if f.source_index is not None else 1 << 30,
                                        f.line_no or 0))


def choose_cause(candidates: Sequence[Finding]) -> Optional[Finding]:
    """:func:`choose_root`, with the code-error rule: a code error needs an exception from the code and no
    infrastructure signal in the same attempt (an OOM, a GPU fault, a kill next to it is the likelier story: the
    exception is often their echo). One known to come after the exception is its consequence (a rank died, the
    rest hung to the time limit)."""
    root = choose_root(candidates)
    if root is not None and root.cause == Cause.CODE_ERROR:
        infra = [f for f in candidates if f.cause not in SECONDARY_FAULTS and _precedes(root, f) is not True]
        root = choose_root(infra) or root
    return root


def _divergence_step(root: Finding, candidates: Sequence[Finding]) -> Optional[int]:
    """The step a divergence began at: the root's own, else the earliest any divergence finding names."""
    if root.cause != Cause.DIVERGED:
        return None
    if root.step is not None:
        return root.step
    return min((f.step for f in candidates if f.cause == Cause.DIVERGED and f.step is not None), default=None)


def _alarm_findings(alarms: Sequence[Alarm]) -> List[Finding]:
    return [Finding(Cause.DIVERGED, FAULT, "tensorboard", None, None, a.detail, step=a.step) for a in alarms]


def _state_findings(attempt: Attempt) -> List[Finding]:
    """The Slurm state as a finding; an OUT_OF_MEMORY step counts even when the allocation says FAILED."""
    out = []
    cause = _STATE_CAUSE.get(attempt.state)
    if cause is not None:
        out.append(Finding(cause, KILL if cause != Cause.HOST_OOM else FAULT, "sacct", None, None,
                           f"state {attempt.state} (exit {attempt.exit_code})"))
    oom_step = attempt.oom_step
    if oom_step is not None and cause != Cause.HOST_OOM:
        out.append(Finding(Cause.HOST_OOM, FAULT, "sacct", None, None,
                           f"step {oom_step.job_id} OUT_OF_MEMORY (exit {oom_step.exit_code})"))
    return out


def _exit_code_meaning(attempt: Attempt, table: Mapping[int, ExitCodeMeaning]) -> Optional[Tuple[str, ExitCodeMeaning]]:
    """The first row (srun step, then batch, then allocation) whose exit code the table explains."""
    order = sorted(attempt.rows, key=lambda r: (r.step is None, r.step == "batch", r.step == "extern"))
    for row in order:
        meaning = cause_for_exit(row.exit_status, row.signal, table)
        if meaning is not None:
            return row.job_id, meaning
    return None


def _bad_nodes(root: Finding, findings: Sequence[Finding], attempt: Attempt) -> Tuple[str, ...]:
    if root.cause == Cause.NCCL_ERROR:
        named = [f.node for f in findings if f.cause == Cause.NCCL_ERROR and f.node]
    else:
        named = [f.node for f in findings if f.cause == root.cause and f.node and f.kind == FAULT] or \
                ([root.node] if root.node and root.kind == FAULT else [])
        if root.cause == Cause.NODE_FAIL:
            # "Node failure on X" and "STEPD TERMINATED ON X" name the bad node; the node in "JOB 1 ON X
            # CANCELLED ... DUE TO NODE FAILURE" is the batch host that lived to write it.
            named = [f.node for f in findings if f.cause == Cause.NODE_FAIL and f.node
                     and ("Node failure on" in f.line or "STEPD TERMINATED" in f.line)]
    if attempt.nodes:
        # What a process prints as its hostname (an FQDN, or the machine's name where slurmd runs under
        # another NodeName) is not always a Slurm node name; only Slurm's names may reach --exclude.
        names = set(attempt.nodes)
        named = [n if n in names else n.split(".")[0] for n in named]
        named = [n for n in named if n in names]
    if not named and root.cause in (Cause.NODE_FAIL, Cause.GPU_HW_ERROR) and len(attempt.nodes) == 1:
        named = list(attempt.nodes)  # a one-node job: that node is the one
    return tuple(dict.fromkeys(n for n in named if n))


def _evidence(head: str, root: Optional[Finding], findings: Sequence[Finding],
              extra: Sequence[str] = ()) -> Tuple[str, ...]:
    lines = [head]
    if root is not None and root.source != "sacct":
        lines.append(f"{root.where()}: {root.line}")
    seen_causes = {root.cause} if root else set()
    same = [f for f in findings if root is not None and f.cause == root.cause and f is not root and f.source != "sacct"]
    others = []
    for f in findings:  # the first line of every other cause: what happened around the root cause
        # Slurm signals the steps with a plain "CANCELLED AT" line before a preemption or time limit
        # too; as a side note it would only confuse.
        if f.cause not in seen_causes and f.source != "sacct" and f.cause != Cause.CANCELLED:
            seen_causes.add(f.cause)
            others.append(f)
    lines.extend(extra)
    for f in (same[:2] + others):
        if len(lines) >= MAX_EVIDENCE_LINES:
            break
        if any(f.line in e for e in extra):
            continue
        lines.append(f"also {f.cause.value}: {f.where()}: {f.line}")
    return tuple(dict.fromkeys(lines))


_SIGKILLED = "exit {code} (SIGKILL) with no reason from Slurm: most often the kernel's OOM killer"


def _sigkill_findings(attempt: Attempt) -> List[Finding]:
    """A FAILED row killed by signal 9 (``0:9``, or a shell's ``137:0``): a hint of host memory, since a scancel, a time
    limit or a preemption shows as CANCELLED/TIMEOUT/PREEMPTED. Only a hint: srun also SIGKILLs the other tasks of
    a step when one of them fails, so the step's code may be the SIGKILLed task's neighbour's exception."""
    for row in attempt.rows:
        if row.state == "FAILED" and (row.signal == 9 or row.exit_status == 137):
            return [Finding(Cause.HOST_OOM, HINT, "sacct", None, None,
                            _SIGKILLED.format(code=row.get("ExitCode") or "137") + f" ({row.job_id})")]
    return []


def _hypotheses(hints: Sequence[Finding], extra: Sequence[str]) -> Tuple[str, ...]:
    """The best guesses for an ``unknown``: the first hint of each cause (in log order), then ``extra``."""
    out, seen = [], set()
    for f in hints:
        if f.cause not in seen:
            seen.add(f.cause)
            out.append(f"{f.cause.value}: {hint_reason(f)} ({f.where()}: {f.line[:160]})")
    return tuple(out) + tuple(extra)


def classify_attempt(attempt: Optional[Attempt], logs: Sequence[LogText] = (), alarms: Sequence[Alarm] = (),
                     exit_codes: Mapping[int, ExitCodeMeaning] = EXIT_CODES, job_id: str = "") -> Diagnosis:
    """The cause of one attempt's end (or its current state), with the lines that show it."""
    if attempt is None:
        return Diagnosis(job_id, Cause.UNKNOWN, ("sacct has no record of this job (yet): waiting, not requeueing",))
    state = attempt.state
    ended = bool(state) and state not in PENDING_STATES and state not in RUNNING_STATES
    base = dict(job_id=attempt.job_id, attempt_index=attempt.index, state=state,
                exit_code=attempt.exit_code, nodes=tuple(attempt.nodes), ended=ended)
    head = _sacct_line(attempt)
    everything = scan_logs(logs, attempt.nodes, _year(attempt)) + _alarm_findings(alarms)
    findings = [f for f in everything if f.kind != HINT]
    hints = [f for f in everything if f.kind == HINT]

    def result(cause: Cause, root: Optional[Finding] = None, extra: Sequence[str] = (), **kw: Any) -> Diagnosis:
        return Diagnosis(cause=cause, evidence=_evidence(head, root, findings, extra), root=root, **base, **kw)

    if state in PENDING_STATES:
        return result(Cause.PENDING)
    if state in RUNNING_STATES:
        warnings = [f"warning: {f.where()}: {f.line}" for f in findings if f.cause == Cause.DIVERGED][:2]
        return result(Cause.RUNNING, extra=warnings)
    announced = announced_exit_code(line for log in logs for line in log.text.splitlines())
    task_failure = [line for log in logs for line in log.text.splitlines() if cancel_reason(line) == "TASK FAILURE"]
    step_ended = [r for r in attempt.steps if r.state in ("FAILED", "CANCELLED", "OUT_OF_MEMORY", "NODE_FAIL")
                  and r.step not in ("batch", "extern")]
    if state == "COMPLETED" and not (announced and announced[0] != 0) and not task_failure and not step_ended:
        return result(Cause.COMPLETED)
    if state == "COMPLETED" and (task_failure or step_ended) and not (announced and announced[0] == 0):
        # The batch script exited 0 after one of its steps failed or was cancelled (Slurm's "CANCELLED ... DUE TO
        # TASK FAILURE", a step row that did not complete): the step's end is what to explain, judged by its state.
        state = "FAILED" if task_failure or any(r.state != "CANCELLED" for r in step_ended) else "CANCELLED"
        base["state"] = state
        which = f"step {step_ended[0].job_id} ended {step_ended[0].state}" if step_ended else \
            "Slurm cancelled a step DUE TO TASK FAILURE"
        head += f" (the job exited 0, but {which}: judged as {state})"
    # (COMPLETED with "[hpc_agent] ... exiting 65" in the log: a wrapper lost the exit status; go on.)
    if not state:
        return result(Cause.UNKNOWN, extra=["sacct row without a state"])

    kills = [f for f in findings if f.kind == KILL and f.cause != Cause.CANCELLED]
    cancel_note: List[str] = []
    if state == "CANCELLED" and not kills:
        plain = [f for f in findings if f.cause == Cause.CANCELLED]
        faults = [f for f in findings if f.kind == FAULT and f.cause not in SECONDARY_FAULTS]
        failed_steps = [r for r in attempt.steps if r.state in ("FAILED", "OUT_OF_MEMORY", "NODE_FAIL")]
        if not (faults and failed_steps):
            before = [f for f in findings if f.kind == FAULT][:1]
            extra = [f"before the cancel: {f.where()}: {f.line}" for f in before]
            return result(Cause.CANCELLED, plain[0] if plain else None, extra)
        # Step <id> had already FAILED with a fault in the log when a person cancelled what was left of the job
        # (a batch script still waiting on a dead step): the fault ended the training, the cancel only the remains.
        cancel_note = [f"then cancelled{' by ' + attempt.cancelled_by if attempt.cancelled_by else ''}, after step "
                       f"{failed_steps[0].job_id} had {failed_steps[0].state}: the cancel ended what was left"]

    # The state is one more finding, unless a log line reports the same event with a position.
    candidates = [f for f in findings if f.cause != Cause.CANCELLED]
    logged = {f.cause for f in kills}
    candidates += [f for f in _state_findings(attempt) if f.cause not in logged]
    hints += _sigkill_findings(attempt)
    if state in ("PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "REQUEUED"):
        candidates = [f for f in candidates if f.cause not in SECONDARY_FAULTS]
    root = choose_cause(candidates)
    if root is not None:
        step = _divergence_step(root, candidates)
        extra = [f"slurm: {f.line}" for f in candidates if f.source == "sacct" and f is not root][:1] + cancel_note
        return result(root.cause, root, extra, bad_nodes=_bad_nodes(root, findings, attempt), divergence_step=step)

    # The training process's own "exiting N" line beats sacct's ExitCode, which may be another rank's
    # or a wrapper's (submitit exits 0 whatever the function returned).
    explained = _exit_code_meaning(attempt, exit_codes)
    if announced is not None and announced[0] in exit_codes:
        explained = f"log line '{announced[1]}'", exit_codes[announced[0]]
    why = "no recognised error in the log" if logs else "no log to read"
    guesses: List[str] = []
    if explained is not None:
        where, meaning = explained
        note = " (placeholder code: see hpc_agent/core/exit_codes.py)" if meaning.placeholder else ""
        line = f"exit code {meaning.code} of {where}: {meaning.meaning}{note}"
        if meaning.cause != Cause.CODE_ERROR or announced is not None:
            bad = tuple(attempt.nodes) if meaning.cause == Cause.GPU_HW_ERROR and len(attempt.nodes) == 1 else ()
            extra = [line] + ([f"{why}: not requeued"] if meaning.cause in (Cause.CODE_ERROR, Cause.ENV_ERROR) else [])
            return result(meaning.cause, extra=extra, bad_nodes=bad)
        # Exit 1 from sacct alone is any program that failed, not proof of a bug in the code.
        guesses.append(f"code_error: {line}, but {why} shows an exception")
    if state == "REQUEUED":
        return result(Cause.PREEMPTED, extra=["Slurm (or an admin) requeued this attempt; no other reason in the log"])
    if state == "CANCELLED":
        return result(Cause.CANCELLED)
    if task_failure:
        guesses.append(f"a step failed ({task_failure[0].strip()[:160]}) though the job exited 0")
    if state not in ("FAILED", "SPECIAL_EXIT", "OUT_OF_MEMORY", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL",
                     "DEADLINE", "REVOKED"):
        return result(Cause.UNKNOWN, extra=[f"state {state} is not one this classifier knows"])
    if not hints and not guesses:
        guesses.append(f"code_error or a fault that left no trace: exit {attempt.exit_code or '?'} and {why}")
    hypotheses = _hypotheses(hints, guesses)
    return result(Cause.UNKNOWN, extra=[f"{state} with no positive evidence of a cause: requeued once unchanged, "
                                        "then needs attention"] + [f"hypothesis: {h}" for h in hypotheses],
                  hypotheses=hypotheses)


def _started(attempt: Attempt) -> bool:
    """Did the attempt run? Pending ones did not; neither did one whose Start sacct printed as Unknown/None
    (cancelled while queued). A missing Start column says nothing: the attempt counts as started."""
    return attempt.state not in PENDING_STATES and attempt.start not in ("Unknown", "None")


_JOB_IN_LOG_NAME = re.compile(r"^(?:(\d+)(?:_\d+)?_\d+_log\.(?:out|err)|slurm-(\d+)(?:_\d+)?\.(?:out|err))$")
"""A job id in a log's name, in the two forms whose number is surely one: submitit's ``1234_0_log.out``
(``1234_5_0_log.out`` for an array task) and Slurm's default ``slurm-1234.out`` (``slurm-1234_5.out``)."""


def job_in_log_name(name: str) -> Optional[str]:
    m = _JOB_IN_LOG_NAME.match(name.rsplit("/", 1)[-1])
    return (m.group(1) or m.group(2)) if m else None


def _boundaries(attempts: Sequence[Attempt]) -> Optional[List[_dt.datetime]]:
    """When each started attempt began, from what sacct printed: Start, or else the End of the attempt before
    (the first attempt begins at the dawn of time). None when neither column tells."""
    starts = [parse_timestamp(a.start) for a in attempts]
    if all(starts):
        return starts  # type: ignore[return-value]
    ends = [parse_timestamp(a.end) for a in attempts[:-1]]
    if all(ends):
        return [_dt.datetime(1970, 1, 1)] + ends  # type: ignore[list-item]
    return None


def logs_per_attempt(attempts: Sequence[Attempt], logs: Sequence[LogText]) -> List[List[LogText]]:
    """Each attempt's share of the (appended) logs, by what is available, never dropping a log:

    1. a log whose name carries another job's id (``999_0_log.out`` for job 123) is not this job's;
    2. a log with attempt-start markers is cut at them, and the pieces go to the attempts that ran, newest
       piece to newest attempt (a log tail may have lost its oldest attempts);
    3. a log without markers is split by time when sacct gives the attempts' Start (or End) columns;
    4. failing all of these, the whole log goes to the newest attempt that ran."""
    shares: List[List[LogText]] = [[] for _ in attempts]
    started = [i for i, a in enumerate(attempts) if _started(a)] or \
        [i for i, a in enumerate(attempts) if a.state not in PENDING_STATES][-1:]
    if not started:
        return shares
    keys = {job_key_of(a.job_id).split("_")[0].split("+")[0] for a in attempts}
    bounds = _boundaries([attempts[i] for i in started]) if len(started) > 1 else None
    for log in logs:
        named = job_in_log_name(log.name)
        if named is not None and named not in keys:
            continue
        pieces = split_attempts(log)
        if len(pieces) == 1 and bounds is not None:
            # No start markers (not a submitit job): Slurm's own lines carry timestamps, use them.
            pieces = split_by_time(log, bounds)
        for offset, piece in enumerate(reversed(pieces)):
            if offset < len(started):
                shares[started[-1 - offset]].append(since_last_repair(piece))
    return shares


def classify_job(attempts: Sequence[Attempt], logs: Sequence[LogText] = (), alarms: Sequence[Alarm] = (),
                 exit_codes: Mapping[int, ExitCodeMeaning] = EXIT_CODES, job_id: str = "") -> List[Diagnosis]:
    """A diagnosis per attempt (oldest first); the TensorBoard alarms are applied to the newest only.
    ``[]`` attempts gives one ``unknown`` diagnosis."""
    if not attempts:
        return [classify_attempt(None, job_id=job_id)]
    shares = logs_per_attempt(attempts, logs)
    last = len(attempts) - 1
    return [classify_attempt(a, shares[i], alarms if i == last else (), exit_codes) for i, a in enumerate(attempts)]


LOGS_ONLY_HEAD = "no sacct record: the state is unknown; the cause is read from the logs alone"


def classify_logs(logs: Sequence[LogText], alarms: Sequence[Alarm] = (), job_id: str = "") -> Diagnosis:
    """The cause from log text alone (``diagnose --log FILE`` with no job id or sacct text): the state is
    unknown (``state`` empty, ``ended`` False); the cause is what the lines show positively, weighed as for an
    attempt that ended, else ``unknown`` with the hypotheses the lines suggest."""
    everything = scan_logs(logs) + _alarm_findings(alarms)
    findings = [f for f in everything if f.kind != HINT]
    hints = [f for f in everything if f.kind == HINT]
    kills = [f for f in findings if f.kind == KILL and f.cause != Cause.CANCELLED]
    plain_cancel = [f for f in findings if f.cause == Cause.CANCELLED]
    candidates = [f for f in findings if f.cause != Cause.CANCELLED]
    root = choose_cause(candidates)
    if plain_cancel and not kills and (root is None or root.cause in SECONDARY_FAULTS):
        root = plain_cancel[0]  # Slurm's "CANCELLED AT" with no reason: a person's scancel
    if root is None:
        done = [(i, n, line) for i, log in enumerate(logs) for n, line in log.numbered_lines()
                if NORMAL_EXIT.search(line[:MAX_LINE_CHARS])]
        failed = any(FAILED_EXIT.search(f.line) for f in hints)  # a non-zero exit: not completed
        if done and not failed:  # nothing went wrong and the process said it finished (a warning at exit is no failure)
            i, n, line = done[-1]
            return Diagnosis(job_id, Cause.COMPLETED, _evidence(LOGS_ONLY_HEAD, None, findings,
                                                                [f"{logs[i].name}:{n}: {line.strip()[:200]}"]))
        hypotheses = _hypotheses(hints, ["code_error or a fault that left no trace: no recognised line in the logs"]
                                 if not hints else [])
        evidence = _evidence(LOGS_ONLY_HEAD, None, findings, [f"hypothesis: {h}" for h in hypotheses])
        return Diagnosis(job_id, Cause.UNKNOWN, evidence, hypotheses=hypotheses)
    step = _divergence_step(root, candidates)
    named = tuple(dict.fromkeys(f.node for f in findings if f.cause == root.cause and f.node and f.kind != HINT))
    return Diagnosis(job_id, root.cause, _evidence(LOGS_ONLY_HEAD, root, findings), bad_nodes=named[:4],
                     divergence_step=step, root=root)

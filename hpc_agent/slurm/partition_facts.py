"""The facts behind ``submit --place auto``: what each partition offers and when Slurm would start the job there.

This is the thin I/O side of placement (:mod:`hpc_agent.policy.partitions` decides, :func:`hpc_agent.policy.partitions.candidates`
turns these facts into candidates). It asks Slurm twice over, and no more:

1. ONE ``sinfo`` call (:func:`hpc_agent.slurm.sinfo.partitions_argv`) lists every partition with its nodes,
   GPUs (gres) and state. A partition that is not up, or whose nodes have too few GPUs for the job, is
   blocked here without asking Slurm anything else.
2. For each remaining partition, at most ``max_tests`` of them, ONE ``sbatch --test-only`` with the job's real
   resources (:func:`hpc_agent.slurm.cli.sbatch_test_argv`, doctor's, its partition swapped in), each with its
   own timeout, so a slow slurmctld costs at most ``(1 + max_tests) * timeout_s``. It submits nothing.

What a start time means: ``--test-only`` answers with Slurm's own backfill estimate, computed from the time
limits of the jobs running and queued ahead. Jobs usually end before their limit, so the real start is
mostly earlier; a job submitted meanwhile with a higher priority can make it later. It is the best
estimate there is without a model of the queue, and it is the one the scheduler itself acts on.

A refusal by ``--test-only`` (the user may not use the partition, no node can hold the job) blocks the
partition with a reason naming the fix. A ``--test-only`` that does not answer in time does not: its start
is unknown, and the chooser ranks an unknown start last rather than ruling a usable partition out.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from hpc_agent.slurm.cli import SlurmError, sbatch_test_argv
from hpc_agent.slurm.sinfo import gpu_gib_from_gres, gpu_types_in_gres, gpus_in_gres, parse_partitions, partitions_argv

NOTE_CHARS = 300
"""A note is shown in a table cell and kept in the audit trail: one line, bounded."""
UNLISTED = "not listed by sinfo (no such partition, or hidden from you)"
SLURM_TIME = "%Y-%m-%dT%H:%M:%S"
"""How sbatch prints times by default (``SLURM_TIME_FORMAT`` unset): the controller's local time, no zone."""

# "Job 3 to start at 2026-12-02T03:30:00 using 2 processors on nodes node3 in partition gpu_small"; a
# heterogeneous job's line says "on node3" without "nodes". Found anywhere, so wording around it may change.
_START = re.compile(r"to start at\s+(\S+)(?:.*?\bon\s+(?:nodes\s+)?(\S+))?")
_ERROR = re.compile(r"^(?:\w+:\s+)?error:\s*", re.IGNORECASE)


@dataclass(frozen=True)
class PartitionFacts:
    """What one partition offers the job, and when Slurm would start it there."""

    name: str
    """The partition's name (without sinfo's ``*`` default marker)."""
    gres: str = ""
    """The gres of its node configurations joined by ``,`` (``gpu:a10:2,gpu:h100:8``); "" when it has none."""
    gpu_type: Optional[str] = None
    """The first typed GPU of its gres (``h100``); None for a CPU partition or an untyped gres (``gpu:2``)."""
    gpu_gib: Optional[float] = None
    """GiB of one GPU, the smallest GPU's when its nodes differ (a fit there fits on every one of them);
    None when unknown."""
    gpus_per_node: int = 0
    """The most GPUs one of its node configurations has: Slurm places a GPU job on the nodes that have the
    GPUs it asks for, so a partition that mixes CPU and GPU nodes can still run it. Whether enough such
    nodes exist is for ``--test-only`` to say."""
    nodes: int = 0
    """Nodes in it, over all its node configurations."""
    state: str = ""
    """sinfo's ``%a``: ``up``, ``down``, ``drain`` or ``inact``."""
    blocked: str = ""
    """Why the job cannot run there; "" when it can."""
    start_s: Optional[float] = None
    """Seconds from now until the earliest start ``--test-only`` reported (never negative); None: unknown."""
    start_note: str = ""
    """What ``--test-only`` answered (or why it did not), one line of at most NOTE_CHARS characters."""
    default: bool = False
    """sinfo marks it as the cluster's default partition (the one used when none is named)."""


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= NOTE_CHARS else line[:NOTE_CHARS - 3] + "..."


def partitions_from_sinfo(text: str) -> List[PartitionFacts]:
    """The partitions of one ``sinfo --noheader --format PARTITION_FORMAT`` answer, first seen first. sinfo
    prints a row per partition and node configuration; the rows of a partition are merged here."""
    rows: Dict[str, list] = {}
    for row in parse_partitions(text):
        rows.setdefault(row.name, []).append(row)
    facts = []
    for name, group in rows.items():
        gres = ",".join(r.gres for r in group if r.gres and r.gres != "(null)")
        types = gpu_types_in_gres(gres)
        state = group[0].avail  # %a is the partition's, the same on each of its rows
        facts.append(PartitionFacts(
            name=name, gres=gres, gpu_type=types[0] if types else None, gpu_gib=gpu_gib_from_gres(gres),
            gpus_per_node=max(gpus_in_gres(r.gres) for r in group), nodes=sum(r.nodes for r in group),
            state=state, default=any(r.default for r in group),
            blocked="" if state == "up" else f"partition state is {state or 'unknown'}"))
    return facts


def parse_test_only(text: str, now: float) -> Tuple[Optional[float], str]:
    """``(seconds from now until the start, note)`` from what ``sbatch --test-only`` printed (stdout and
    stderr: sbatch writes its answer to stderr). Without a start line: ``(None, the first error line without
    its ``sbatch: error:`` prefix, else the first non-empty line)``; ``(None, "")`` for no output."""
    match = _START.search(text or "")
    if match:
        when, nodes = match.group(1), match.group(2)
        on = f" on {nodes}" if nodes else ""
        try:
            # mktime: the controller prints its local time; login node and controller share a time zone.
            start = time.mktime(time.strptime(when, SLURM_TIME))
        except ValueError:  # "Unknown", or a SLURM_TIME_FORMAT we cannot read: accepted, start unknown
            return None, _one_line(f"accepted; start time {when!r} not understood{on}")
        return max(0.0, start - now), _one_line(f"starts at {when}{on}")
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    errors = [_ERROR.sub("", line, count=1) for line in lines if _ERROR.match(line)]
    return None, _one_line(errors[0] if errors else (lines[0] if lines else ""))


def accepted(text: str) -> bool:
    """``--test-only`` said when the job would start: sbatch accepts the job there (whatever it exits with)."""
    return bool(_START.search(text or ""))


# sbatch's words (slurm_strerror texts) -> what they mean to the user and the fix. First match wins, so the
# policy entry precedes "time limit": "Job violates accounting/QOS policy (... time limits)" is a policy.
_REFUSALS: Tuple[Tuple[Tuple[str, ...], str], ...] = (
    (("account/partition combination", "invalid account", "not permitted to use this partition",
      "access denied", "permission denied"), "you may not use this partition (sbatch: {note})"),
    (("requested node configuration is not available",),
     "no node of it can run the job (sbatch: {note}; too few GPUs/CPUs/memory per node, or every node excluded)"),
    (("invalid generic resource",), "its nodes lack the GPUs the job asks for (sbatch: {note}; check the "
                                    "profile's gpu_request/gpu_type against this partition's gres)"),
    (("accounting/qos policy", "association"), "an account or QOS limit forbids it (sbatch: {note})"),
    (("node count specification invalid",), "it has too few nodes for slurm.nodes (sbatch: {note})"),
    (("memory required by task is not available", "memory specification"),
     "its nodes have too little memory for slurm.mem (sbatch: {note})"),
    (("time limit",), "the job's time limit exceeds the partition's (sbatch: {note}; lower slurm.time)"),
    (("invalid qos",), "the QOS does not allow it here (sbatch: {note}; check slurm.qos)"),
    (("partition not available", "invalid partition"), "the partition does not take jobs (sbatch: {note})"),
)


def refusal_reason(note: str) -> str:
    """A short, user-facing reason for an ``sbatch --test-only`` refusal, naming the fix where sbatch's words
    settle it."""
    lowered = note.lower()
    for needles, reason in _REFUSALS:
        if any(n in lowered for n in needles):
            return reason.format(note=note)
    return f"sbatch --test-only refused: {note}" if note else "sbatch --test-only refused the job without a word"


def _gpu_block(part: PartitionFacts, wanted: int) -> str:
    """Why too few GPUs rule ``part`` out ("" when they do not); settled by sinfo, so sbatch is not asked."""
    if wanted > 0 and part.gpus_per_node < wanted:
        return f"{part.gpus_per_node} GPU(s) per node; the job asks for {wanted}"
    return ""


def _test_one(slurm: Any, cfg: Any, part: PartitionFacts, timeout_s: float, now: Callable[[], float]) -> PartitionFacts:
    argv = sbatch_test_argv(replace(cfg.slurm, partition=part.name), getattr(cfg, "profile", None))
    try:
        res = slurm.run(argv, check=False, timeout_s=timeout_s)
    except SlurmError as exc:
        # Unknown, not refused: a slow controller says nothing about whether the partition can run the job.
        what = f"timed out after {timeout_s:g}s" if "timed out" in str(exc) else f"did not answer: {exc}"
        return replace(part, start_s=None, start_note=_one_line(f"sbatch --test-only {what}"))
    text = f"{res.stdout}\n{res.stderr}"
    start_s, note = parse_test_only(text, now())
    if accepted(text):
        return replace(part, start_s=start_s, start_note=note)
    if res.returncode == 0:  # exit 0 without a start line: not a refusal (sbatch exits 1 on those)
        return replace(part, start_note=_one_line(note or "sbatch --test-only accepted the job, no start time"))
    return replace(part, blocked=refusal_reason(note), start_note=note)


def collect(slurm: Any, cfg: Any, *, only: Sequence[str] = (), timeout_s: float = 10.0, max_tests: int = 8,
            clock: Callable[[], float] = time.time) -> List[PartitionFacts]:
    """The facts of every partition the job could use (those in ``only`` when it names any), in sinfo's
    order; names in ``only`` that sinfo does not list come last, blocked. ``slurm`` is a
    :class:`hpc_agent.slurm.cli.SlurmCLI` (or a fake with its ``run``). A failing sinfo raises SlurmError:
    without the partition list there is nothing to place on."""
    listed = partitions_from_sinfo(slurm.run(partitions_argv(), timeout_s=timeout_s).stdout)
    if only:
        wanted = list(dict.fromkeys(only))  # each once: a name given twice must not be tested twice
        names = {p.name for p in listed}
        listed = [p for p in listed if p.name in wanted] + \
                 [PartitionFacts(name, blocked=UNLISTED) for name in wanted if name not in names]
    gpus = int(cfg.slurm.gpus_per_node or 0)
    facts, tested = [], 0
    for part in listed:
        if not part.blocked:
            part = replace(part, blocked=_gpu_block(part, gpus))
        if part.blocked:
            facts.append(part)
        elif tested >= max_tests:
            facts.append(replace(part, blocked=f"not tried: more than {max_tests} candidates "
                                               "(placement.max_candidates)"))
        else:
            tested += 1
            facts.append(_test_one(slurm, cfg, part, timeout_s, clock))
    return facts

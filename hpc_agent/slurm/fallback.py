"""Job states without accounting: ``squeue`` and ``scontrol show job`` text -> sacct-shaped text. Pure.

Where slurmdbd is down or accounting is off, sacct has nothing to say, but slurmctld still knows the
jobs it holds (queued, running, and ended ones for ``MinJobAge`` seconds). The watcher turns what it
knows into the ``sacct --parsable2`` shape so the rest of the pipeline stays the same. Earlier attempts
of a requeued job are not listed by slurmctld; ``Restarts=N`` says how many there were, so N
placeholder rows (state ``REQUEUED``) keep the attempt numbering the same as sacct's.
"""
from __future__ import annotations

import re
from typing import Dict, Iterable, List

from hpc_agent.slurm.sacct import SACCT_FIELDS

FIELDS = SACCT_FIELDS
SQUEUE_FORMAT = "%i|%j|%T|%N|%S"
# The last column is never left empty: a parsable line ending in '|' reads as sacct's --parsable format.
_NO_ELAPSED = "00:00:00"
_PAIR = re.compile(r"(\w+)=(\S*)")


def parse_scontrol_jobs(text: str) -> Dict[str, Dict[str, str]]:
    """``scontrol show job --oneliner`` -> ``{job id: {key: value}}``. An array task is keyed as squeue and
    sacct name it, ``<ArrayJobId>_<ArrayTaskId>`` (its ``JobId`` is the task's own raw id)."""
    jobs = {}
    for line in text.splitlines():
        pairs = dict(_PAIR.findall(line))
        if "JobId" in pairs:
            task = pairs.get("ArrayTaskId", "")
            key = f"{pairs['ArrayJobId']}_{task}" if pairs.get("ArrayJobId") and task.isdigit() else pairs["JobId"]
            jobs[key] = pairs
    return jobs


def parse_squeue(text: str) -> Dict[str, Dict[str, str]]:
    """``squeue --noheader --format '%i|%j|%T|%N|%S'`` -> ``{job id: {...}}``."""
    jobs = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) >= 3 and parts[0]:
            jobs[parts[0]] = {"JobId": parts[0], "JobName": parts[1], "JobState": parts[2],
                              "NodeList": parts[3] if len(parts) > 3 else "",
                              "StartTime": parts[4] if len(parts) > 4 else ""}
    return jobs


def as_sacct_text(job_ids: Iterable[str], squeue: Dict[str, Dict[str, str]],
                  scontrol: Dict[str, Dict[str, str]]) -> str:
    """The jobs slurmctld knows, as ``sacct -D --parsable2`` would list them (unknown jobs are left out)."""
    lines: List[str] = ["|".join(FIELDS)]
    for job_id in job_ids:
        info = {**scontrol.get(job_id, {}), **squeue.get(job_id, {})}
        if not info:
            continue
        restarts = int(info.get("Restarts", "0") or 0)
        name = info.get("JobName", "")
        for _ in range(restarts):
            lines.append("|".join([job_id, name, "REQUEUED", "0:0", "", "Unknown", "Unknown", _NO_ELAPSED]))
        nodes = info.get("NodeList", "")
        lines.append("|".join([job_id, name, info.get("JobState", ""), info.get("ExitCode", "0:0"),
                               "" if nodes == "(null)" else nodes, info.get("StartTime") or "Unknown",
                               info.get("EndTime") or "Unknown", info.get("RunTime") or _NO_ELAPSED]))
    return "\n".join(lines) + "\n"

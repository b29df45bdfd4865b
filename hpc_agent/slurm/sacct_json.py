"""``sacct --json`` -> the same :class:`SacctRow` rows as text mode. Pure: text in, rows out.

Each job becomes the row text mode prints for it (JobID ``12``, ``12_3``, ``12_[1-4]``, ``12+1``; State;
ExitCode ``status:signal``; NodeList; Start/End/Submit as local ``YYYY-MM-DDTHH:MM:SS`` or ``Unknown``),
followed by one row per step (``12.batch``, ``12_3.0``), so everything downstream reads either format
the same way. A job name holding ``|`` or a newline is one string here: it cannot forge a row.

Shapes it reads (Slurm's JSON changed with every data_parser version):

- 22.05 (openapi dbv0.0.38, this cluster): ``"state": {"current": "FAILED", "reason": ...}``; numbers as
  plain ints or null; ``exit_code: {"status": "SIGNALED", "return_code": null, "signal": {"signal_id": 15}}``;
  a step's ``"step": {"job_id": 12, "id": "batch"}`` (or ``"id": 0``); a pending array's tasks as a hex
  bitmap (``"task": "0x1e"``). 22.05 loses exit statuses: a row text mode shows as ``FAILED 65:0`` reads
  ``{"status": "SUCCESS", "return_code": 0}`` (signals survive: ``0:125``, ``0:15``). Such a row's
  ExitCode is left empty (unknown), never a false ``0:0``; a caller that needs the status (the exit code
  table: diverged, run_dir_busy, gpu health) must read text mode on 22.05 (:func:`exit_codes_reliable`).
- 23.02+ / 24.x: ``"current": ["FAILED"]`` (a list: base state, then flags); numbers as
  ``{"set": true, "infinite": false, "number": N}``; ``"signal": {"id": {...}, "name": ...}``; a step's
  ``"id": "12.batch"`` or ``{"job_id": 12, "step_id": "batch"}``.
"""
from __future__ import annotations

import json
import math
import re
import time
from typing import Any, Dict, List, Mapping, Optional

from hpc_agent.slurm.sacct import STATES, SacctFormatError, SacctRow, row_from_fields

UNKNOWN_TIME = "Unknown"
# Slurm's reserved step ids, as older versions print them in a step_id number.
_SPECIAL_STEPS = {4294967290: "interactive", 4294967291: "batch", 4294967292: "extern", 4294967293: "TBD"}
_MAX_BITMAP_HEX = 4096  # a pending array's task bitmap: 16k tasks is plenty; longer is not sacct's


def parse_sacct_json(text: str) -> List[SacctRow]:
    """Rows of ``sacct --json`` output: each job's allocation row, then its steps, oldest submission first
    (every attempt of a requeued job is its own job record, as with ``-D``).

    Raises :class:`SacctFormatError` for text that is not sacct's JSON. ``{"jobs": []}`` is no rows.
    """
    try:
        doc = json.loads(text)
    except RecursionError:
        raise SacctFormatError("JSON nested too deeply to be sacct --json output") from None
    except ValueError as exc:  # JSONDecodeError, or an integer with thousands of digits
        raise SacctFormatError(f"not valid JSON ({exc}): save the whole output of `sacct --json`") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("jobs"), list):
        raise SacctFormatError("JSON without a top-level \"jobs\" list: not `sacct --json` output")
    jobs = doc["jobs"]
    errors = doc.get("errors")
    if not jobs and isinstance(errors, list) and errors:
        raise SacctFormatError(f"sacct --json reported an error: {_error_text(errors[0])}")
    for i, job in enumerate(jobs):
        if not isinstance(job, dict):
            raise SacctFormatError(f"jobs[{i}] is not an object: not `sacct --json` output")
    # Oldest submission first, as text mode's -D prints attempts (a requeued attempt is submitted anew);
    # the sort is stable, so records without a time keep their place relative to each other.
    ordered = sorted(jobs, key=lambda job: number(_dict(job.get("time")).get("submission")) or 0)
    lossy = not exit_codes_reliable(doc)
    return [row for job in ordered for row in _job_rows(job, lossy)]


def exit_codes_reliable(doc: Mapping[str, Any]) -> bool:
    """Does this ``sacct --json`` document carry real exit statuses? Not 22.05's (openapi dbv0.0.38 and
    older), which reports ``SUCCESS``/0 for a job that exited 65."""
    plugin = _text(_dict(_dict(doc.get("meta")).get("plugin")).get("type"))
    major = number(_dict(_dict(_dict(doc.get("meta")).get("Slurm")).get("version")).get("major"))
    if "dbv0.0.3" in plugin:
        return False
    return major is None or major >= 23


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        return _text(error.get("description") or error.get("error") or error)[:300]
    return _text(error)[:300]


# --- values in any data_parser version's shape -----------------------------------------------------
def number(value: Any) -> Optional[int]:
    """``5``, ``"5"``, ``{"set": true, "infinite": false, "number": 5}`` -> 5; unset/infinite/other -> None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if math.isfinite(value) else None
    if isinstance(value, dict):
        if value.get("infinite") is True or value.get("set") is False:
            return None
        return number(value.get("number"))
    if isinstance(value, str):
        digits = value.strip()
        if 0 < len(digits) <= 20 and (digits.isdigit() or (digits[:1] == "-" and digits[1:].isdigit())):
            return int(digits)
    return None


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return ",".join(_text(v) for v in value)
    if isinstance(value, dict) and "number" in value:
        n = number(value)
        return "" if n is None else str(n)
    return str(value)


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _state(value: Any) -> str:
    """``"FAILED"`` or ``["FAILED"]`` (23.02+: base state first, then flags such as REQUEUED)."""
    if isinstance(value, dict):
        value = value.get("current")
    if isinstance(value, list):
        names = [v for v in value if isinstance(v, str)]
        known = [v for v in names if v in STATES]
        return (known or names or [""])[0]
    return _text(value)


def local_time(value: Any) -> str:
    """Epoch seconds -> ``YYYY-MM-DDTHH:MM:SS`` in local time (as text mode prints); 0/unset -> Unknown."""
    seconds = number(value)
    if not seconds or seconds < 0:
        return UNKNOWN_TIME
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(seconds))
    except (OverflowError, OSError, ValueError):
        return UNKNOWN_TIME


def _tres(value: Any) -> str:
    """``[{"type": "gres", "name": "gpu", "count": 4}, ...]`` -> ``gres/gpu=4,...`` (text mode's AllocTRES)."""
    parts = []
    for item in value if isinstance(value, list) else []:
        if not isinstance(item, dict):
            continue
        kind, name, count = _text(item.get("type")), _text(item.get("name")), number(item.get("count"))
        if kind and count is not None:
            parts.append(f"{kind}/{name}={count}" if name else f"{kind}={count}")
    return ",".join(parts)


def _elapsed(value: Any) -> str:
    seconds = number(value)
    if seconds is None or seconds < 0:
        return ""
    days, rest = divmod(seconds, 86400)
    clock = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{clock}" if days else clock


def exit_code(value: Any) -> str:
    """``{"status": "SIGNALED", "return_code": null, "signal": {"signal_id": 15}}`` -> ``"0:15"``; a step
    that never ran (status PENDING, nothing set) -> ``""``, as text mode prints it."""
    if isinstance(value, str):
        return value
    obj = _dict(value)
    if not obj:
        return ""
    status = obj.get("status")
    statuses = {s for s in (status if isinstance(status, list) else [status]) if isinstance(s, str)}
    code = number(obj.get("return_code"))
    signal_obj = _dict(obj.get("signal"))
    signal = number(signal_obj.get("id", signal_obj.get("signal_id")))
    if code is None and signal is None and (not statuses or statuses <= {"PENDING", "INVALID"}):
        return ""
    return f"{code or 0}:{signal or 0}"


def _bitmap_tasks(task: str) -> str:
    """A pending array's ``"0x1e"`` task bitmap -> ``"1-4"`` (what text mode prints in ``12_[1-4]``)."""
    if not task.lower().startswith("0x") or len(task) > _MAX_BITMAP_HEX + 2:
        return task
    try:
        bits = bin(int(task[2:], 16))[:1:-1]  # bit i is character i
    except ValueError:
        return task
    ranges = []
    for run in re.finditer("1+", bits):
        lo, hi = run.start(), run.end() - 1
        ranges.append(str(lo) if lo == hi else f"{lo}-{hi}")
    return ",".join(ranges)


def _job_id(job: Mapping[str, Any]) -> str:
    array, het = _dict(job.get("array")), _dict(job.get("het"))
    array_job, task_id = number(array.get("job_id")), number(array.get("task_id"))
    if array_job and task_id is not None:
        return f"{array_job}_{task_id}"
    task = _text(array.get("task"))
    if array_job and task:
        return f"{array_job}_[{_bitmap_tasks(task)}]"
    het_job, offset = number(het.get("job_id")), number(het.get("job_offset"))
    if het_job and offset is not None:
        return f"{het_job}+{offset}"
    job_id = number(job.get("job_id"))
    return "" if job_id is None else str(job_id)


def _step_suffix(step: Mapping[str, Any]) -> str:
    """``"batch"``, ``"12.batch"``, ``0``, ``{"job_id": 12, "step_id": "batch"}`` -> ``"batch"`` / ``"0"``."""
    sid = step.get("id")
    if isinstance(sid, dict):
        sid = sid.get("step_id")
    if sid is None:
        sid = step.get("step_id")
    if isinstance(sid, str):
        return sid.split(".", 1)[1] if "." in sid else sid
    n = number(sid)
    return "" if n is None else _SPECIAL_STEPS.get(n, str(n))


def _nodes(value: Any) -> str:
    if isinstance(value, dict):  # a step's {"list": [...], "count": N, "range": "node[1-2]"}
        value = value.get("range") or value.get("list")
    return _text(value) or "None assigned"


_ENDED_BADLY = frozenset(STATES) - {"COMPLETED", "PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
                                      "RESV_DEL_HOLD", "CONFIGURING", "COMPLETING", "SUSPENDED", "RESIZING"}


def _checked_exit(value: Any, state: str, lossy: bool) -> str:
    """The exit code, or "" where a lossy (22.05) document contradicts the state (FAILED with ``0:0``)."""
    code = exit_code(value)
    return "" if lossy and code == "0:0" and state in _ENDED_BADLY else code


def _job_rows(job: Mapping[str, Any], lossy: bool = False) -> List[SacctRow]:
    job_id = _job_id(job)
    times, state = _dict(job.get("time")), _state(job.get("state"))
    comment = job.get("comment")
    comments = _dict(comment) if isinstance(comment, dict) else {"job": comment}
    killer = _text(job.get("kill_request_user"))
    fields: Dict[str, str] = {
        "JobID": job_id, "JobIDRaw": _text(job.get("job_id")), "JobName": _text(job.get("name")),
        "State": f"{state} by {killer}" if state == "CANCELLED" and killer else state,
        "ExitCode": _checked_exit(job.get("exit_code"), state, lossy),
        "DerivedExitCode": "" if lossy else exit_code(job.get("derived_exit_code")),
        "NodeList": _nodes(job.get("nodes")), "Start": local_time(times.get("start")),
        "End": local_time(times.get("end")), "Submit": local_time(times.get("submission")),
        "Eligible": local_time(times.get("eligible")), "AllocTRES": _tres(_dict(job.get("tres")).get("allocated")),
        "Elapsed": _elapsed(times.get("elapsed")), "Comment": _text(comments.get("job")),
        "AdminComment": _text(comments.get("administrator")), "SystemComment": _text(comments.get("system")),
        "Partition": _text(job.get("partition")), "Account": _text(job.get("account")),
        "User": _text(job.get("user")), "QOS": _text(job.get("qos")), "Cluster": _text(job.get("cluster")),
        "Reason": _text(_dict(job.get("state")).get("reason")), "WorkDir": _text(job.get("working_directory")),
    }
    rows = [row_from_fields(fields)]
    steps = job.get("steps")
    for step in steps if isinstance(steps, list) else []:
        if not isinstance(step, dict):
            continue
        ident, step_times = _dict(step.get("step")), _dict(step.get("time"))
        suffix = _step_suffix(ident)
        if not suffix:
            continue
        step_state = _state(step.get("state"))
        rows.append(row_from_fields({
            "JobID": f"{job_id}.{suffix}", "JobName": _text(ident.get("name")), "State": step_state,
            "ExitCode": _checked_exit(step.get("exit_code"), step_state, lossy), "NodeList": _nodes(step.get("nodes")),
            "Start": local_time(step_times.get("start")), "End": local_time(step_times.get("end")),
            "Submit": local_time(step_times.get("start")), "Elapsed": _elapsed(step_times.get("elapsed")),
            "Comment": "", "Partition": fields["Partition"],
        }))
    return [r for r in rows if r is not None]

"""Read sacct output in whatever format people paste, or say clearly that it is none. Pure: text in, rows out.

Formats, told apart by the text itself (never by a data row):

- ``sacct --json``: the text starts with ``{`` (:mod:`hpc_agent.slurm.sacct_json`).
- ``-P`` / ``--parsable2``: a ``|``-separated header naming JobID and State.
- ``-p`` / ``--parsable``: the same, but every line, the header too, ends with ``|``. Only the header can
  say so: a ``-P`` row whose last column (Comment, usually) is empty also ends with ``|``.
- no header at all (``sacct -n``, a paste that lost it): read from what the values look like (JobID first,
  a state name, ``N:M``, ISO times), a reading said in the report; other columns stay unread.
- the default fixed-width table: a header line naming JobID and State, then a line of dashes whose runs
  give the column widths. Values too wide for their column end in ``+`` (``OUT_OF_ME+``, ``12345.bat+``),
  completed downstream where unambiguous. Widths count bytes, as sacct's printf does: a UTF-8 job name
  does not shift the columns after it.

Any column order, extra columns, ``-X`` or not, steps, arrays, heterogeneous jobs, ``-D`` attempts and CRLF
line ends are all the same rows to the caller. Concatenated outputs (a header repeated) are read section
by section, each with its own format.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from hpc_agent.slurm.sacct import (STATES, SacctFormatError, SacctRow, header_fields, is_header, normalize_state,
                                   pipe_row, row_from_fields, text_lines)
from hpc_agent.slurm.sacct_json import parse_sacct_json

__all__ = ["SacctFormatError", "SacctReading", "read_sacct", "read_sacct_text", "JSON", "PARSABLE", "PARSABLE2",
           "FIXED_WIDTH", "INFERRED"]

JSON, PARSABLE2, PARSABLE, FIXED_WIDTH = "json", "parsable2 (-P)", "parsable (-p)", "fixed-width"
INFERRED = "no header (columns inferred from the values)"
HOW_TO_SAVE = ("save the output of `sacct -j JOBID -D -P --format=JobID,JobName,State,ExitCode,NodeList,Start,End` "
               "(or `sacct --json`), header line included")

# Field names as sacct prints them, so that a truncated fixed-width header (``DerivedE+``) is completed.
KNOWN_FIELDS = (
    "Account", "AdminComment", "AllocCPUS", "AllocNodes", "AllocTRES", "AveCPU", "AveRSS", "AveVMSize", "Cluster",
    "Comment", "Constraints", "CPUTime", "CPUTimeRAW", "DerivedExitCode", "Elapsed", "ElapsedRaw", "Eligible", "End",
    "ExitCode", "Flags", "Group", "JobID", "JobIDRaw", "JobName", "MaxRSS", "MaxRSSNode", "MaxVMSize", "NCPUS",
    "NNodes", "NodeList", "NTasks", "Partition", "Priority", "QOS", "Reason", "ReqCPUS", "ReqMem", "ReqNodes",
    "ReqTRES", "Reservation", "Start", "State", "Submit", "SubmitLine", "Suspended", "SystemComment", "Timelimit",
    "TotalCPU", "UID", "User", "WCKey", "WorkDir")
_CANONICAL = {name.lower(): name for name in KNOWN_FIELDS}
_DASHES_RE = re.compile(r"^[- ]*-[- ]*$")
_JOBID = re.compile(r"^\d+(?:_(?:\d+|\[[^\]]*\]))?(?:\+\d+)?(?:\.[\w+]+)?$")
_MAX_SKIPPED_SHOWN = 3


@dataclass(frozen=True)
class SacctReading:
    rows: Tuple[SacctRow, ...]
    formats: Tuple[str, ...]
    """The format of each section read, in order (one entry unless outputs were concatenated)."""
    skipped: Tuple[str, ...] = ()
    """The first few lines after a header that are no row (a wrapped name, a shell prompt, noise)."""
    skipped_count: int = 0


def read_sacct_text(text: str) -> List[SacctRow]:
    """The rows of sacct output in any format :func:`read_sacct` reads; raises :class:`SacctFormatError`."""
    return list(read_sacct(text).rows)


def read_sacct(text: str) -> SacctReading:
    """Rows, the formats seen and the lines skipped. A header with no rows under it is *no rows* (sacct knows
    no such job yet), not an error. Raises :class:`SacctFormatError`, naming what to change, for text with
    no header (an error message, ``sacct -n`` output, a binary file) or whose lines under a header are
    none of them rows."""
    text = text.lstrip("\ufeff")
    if "\x00" in text:
        raise SacctFormatError(f"binary data (NUL bytes), not sacct output: {HOW_TO_SAVE}")
    stripped = text.strip()
    if not stripped:
        raise SacctFormatError(f"empty: no sacct output in it; {HOW_TO_SAVE}")
    if stripped[0] == "{":  # sacct's JSON is an object; a '[' opens a pasted prompt ("[alice@login1 ~]$") as often
        return SacctReading(tuple(parse_sacct_json(stripped)), (JSON,))
    return _read_tables(text_lines(text))


def _read_tables(lines: Sequence[str]) -> SacctReading:
    rows: List[SacctRow] = []
    formats: List[str] = []
    skipped: List[str] = []
    skipped_count = 0
    first_line: Optional[str] = None
    header: List[str] = []
    trailing_bar = False
    spans: List[Tuple[int, Optional[int]]] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.strip():
            continue
        first_line = first_line if first_line is not None else line
        values = line.split("|")
        if is_header(values):
            header, trailing_bar = header_fields(values)
            formats.append(PARSABLE if trailing_bar else PARSABLE2)
            continue
        fixed = _fixed_header(line, lines[i] if i < len(lines) else "")
        if fixed is not None:
            header, spans = fixed
            formats.append(FIXED_WIDTH)
            i += 1  # the line of dashes
            continue
        if not formats:
            continue  # before any header: a shell prompt, the command line, a banner
        if formats[-1] == FIXED_WIDTH:
            row = _fixed_row(header, spans, line)
        else:
            row = pipe_row(header, trailing_bar, line)
        if row is not None:
            rows.append(row)
        else:
            skipped_count += 1
            if len(skipped) < _MAX_SKIPPED_SHOWN:
                skipped.append(line[:200])
    if not formats:
        inferred = [row for row in (_inferred_row(line) for line in lines if line.strip()) if row is not None]
        if inferred:  # `sacct -n`, or a header lost in the paste: the values say which column they are
            return SacctReading(tuple(inferred), (INFERRED,))
        shown = (first_line or "").strip()[:120]
        raise SacctFormatError(
            f"no sacct header line (a line naming JobID and State: '|'-separated as -P/-p print it, or "
            f"fixed-width above a line of dashes); the text starts {shown!r}. If this is `sacct -n`/"
            f"`--noheader` output, run it again without -n; otherwise {HOW_TO_SAVE}")
    if not rows and skipped_count:
        raise SacctFormatError(
            f"a sacct header, but none of the {skipped_count} line(s) under it is a row of it (first: "
            f"{skipped[0][:120]!r}): the columns do not match the header; {HOW_TO_SAVE}")
    return SacctReading(tuple(rows), tuple(formats), tuple(skipped), skipped_count)


_ISO = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}$")
_EXIT = re.compile(r"^\d+:\d+$")


def _inferred_row(line: str) -> Optional[SacctRow]:
    """A row of sacct output printed without its header (``-n``/``--noheader``, or a paste that lost it), read
    from what each value looks like: the first value is the JobID (a line that starts otherwise is no row),
    the first state name (``CANCELLED by 1234``, a ``+``-truncated one) the State, the first ``N:M`` the
    ExitCode, ISO times Start and End (Submit, Start, End when there are three). Other columns stay unread:
    a NodeList cannot be told from a job name."""
    values = [v.strip() for v in line.split("|")] if "|" in line else line.split()
    if not values or not _JOBID.match(values[0]):
        return None
    cols = {"JobID": values[0]}
    rest = values[1:]
    for i, value in enumerate(rest):
        state, _ = normalize_state(value)
        if state in STATES:
            by = rest[i + 2] if i + 2 < len(rest) and rest[i + 1] == "by" else None
            cols["State"] = f"{value} by {by}" if by else value
            break
    if "State" not in cols:
        return None
    exits = [v for v in rest if _EXIT.match(v)]
    if exits:
        cols["ExitCode"] = exits[0]
    times = [v for v in rest if _ISO.match(v) or v in ("Unknown", "None")]
    if len(times) >= 2:
        cols.update(zip(("Submit", "Start", "End") if len(times) >= 3 else ("Start", "End"), times[-3:] if len(times) >= 3 else times[:2]))
    return row_from_fields(cols)


def canonical_field(name: str) -> str:
    """``jobid`` -> ``JobID``; a header cut to its column's width (``NodeLi`` for ``NodeList%6``, ``ExitC``,
    ``DerivedE+``) -> the one known field it starts; ambiguous (``Sta``: Start or State) stays as written."""
    known = _CANONICAL.get(name.lower())
    if known:
        return known
    stem = name[:-1] if name.endswith("+") else name
    fits = [f for f in KNOWN_FIELDS if f.lower().startswith(stem.lower())] if len(stem) >= 2 else []
    return fits[0] if len(fits) == 1 else name


def _fixed_header(line: str, next_line: str) -> Optional[Tuple[List[str], List[Tuple[int, Optional[int]]]]]:
    """(field names, byte spans) when ``line`` is a fixed-width header over a line of dashes, else None."""
    if "|" in line or not _DASHES_RE.match(next_line.rstrip()):
        return None
    names = [canonical_field(token) for token in line.split()]
    if "JobID" not in names or "State" not in names:
        return None
    runs = [(m.start(), m.end()) for m in re.finditer(r"-+", next_line)]
    if len(runs) != len(names):
        return None
    spans: List[Tuple[int, Optional[int]]] = list(runs[:-1]) + [(runs[-1][0], None)]  # the last: to the line end
    return names, spans


def _fixed_row(header: Sequence[str], spans: Sequence[Tuple[int, Optional[int]]], line: str) -> Optional[SacctRow]:
    raw = line.encode("utf-8", "surrogatepass")
    if len(raw) <= spans[0][0]:
        return None
    values = [raw[start:end].decode("utf-8", "replace").strip() for start, end in spans]
    return row_from_fields(dict(zip(header, values)))

"""Total JSON parsing for text a job or another user wrote: a value or a named problem, never an exception.

Python's ``json`` recurses once per nesting level, so ``[`` * 100000 raises ``RecursionError`` (not the
``ValueError`` its callers catch), and a huge line costs memory in proportion. Every reader of a JSON file
in a run directory (``events.jsonl``, ``run.json``, heartbeats, the in-job journal, markers, manifests)
parses through this module, which checks the depth *before* ``json.loads`` runs (a scan that does not
recurse), caps each line and the whole text, and turns anything else that goes wrong (``ValueError``,
``RecursionError``, ``MemoryError``, ``TypeError``) into a problem string.

Pure: no I/O. The bounded, link-refusing reads that feed it are :mod:`hpc_agent.core.rundir`'s.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

MAX_DEPTH = 32
"""Nesting levels a JSON value here may have: our own files nest 4 deep at most."""
MAX_LINE_BYTES = 256 << 10
"""Bytes one JSON line may have: an audit record is a few KiB (its evidence is capped)."""
MAX_TOTAL_BYTES = 16 << 20
"""Bytes of one JSON file, or of the part of a JSON-lines file that is read."""
MAX_LINES = 200_000
"""Lines of a JSON-lines text that are parsed; the rest are one problem."""
MAX_PROBLEMS = 20
"""Problems listed one by one; past these, one line counts the rest."""

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_INNERMOST = re.compile(r"\[\]|\{\}|\[\}|\{\]")


@dataclass(frozen=True)
class Limits:
    """The caps one reader applies (its own file's sizes; the defaults suit the run directory's JSON)."""

    max_depth: int = MAX_DEPTH
    """Nesting levels allowed."""
    max_line_bytes: int = MAX_LINE_BYTES
    """Bytes per line (JSON lines) or per document (:func:`loads`)."""
    max_total_bytes: int = MAX_TOTAL_BYTES
    """Bytes of the whole text."""
    max_lines: int = MAX_LINES
    """Lines parsed, at most."""
    constants: bool = True
    """Whether ``NaN``, ``Infinity`` and ``-Infinity`` are accepted (a heartbeat or a journal line rejects them)."""


DEFAULT = Limits()


def depth_over(text: str, max_depth: int) -> bool:
    """Whether ``text`` nests deeper than ``max_depth`` (brackets inside strings do not count). Does not
    recurse, and costs at most ``max_depth`` passes over the brackets left once the strings are gone."""
    if text.count("[") + text.count("{") <= max_depth:
        return False
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    if re.search("[\\[{]{%d}" % (max_depth + 1), brackets):  # that many opened in a row: no need to count
        return True
    for _ in range(max_depth):
        if not brackets:
            return False
        shorter = _INNERMOST.sub("", brackets)
        if len(shorter) == len(brackets):  # unbalanced: what is left can only be opened or closed
            return brackets.count("[") + brackets.count("{") > max_depth
        brackets = shorter
    return bool(brackets)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_STRICT = json.JSONDecoder(parse_constant=_no_constant)


def loads(text: Any, limits: Limits = DEFAULT) -> Tuple[Any, Optional[str]]:
    """``(value, None)``, or ``(None, problem)`` when ``text`` is not JSON within ``limits``. Never raises."""
    try:
        if isinstance(text, (bytes, bytearray, memoryview)):
            if len(text) > limits.max_line_bytes:
                return None, f"{len(text)} bytes, more than the {limits.max_line_bytes} allowed"
            text = bytes(text).decode("utf-8", errors="replace")
        if not isinstance(text, str):
            return None, f"{type(text).__name__} is not text"
        if len(text) > limits.max_line_bytes:  # characters: at least as many bytes
            return None, f"{len(text)} characters, more than the {limits.max_line_bytes} bytes allowed"
        if depth_over(text, limits.max_depth):
            return None, f"nested deeper than {limits.max_depth} levels"
        if limits.constants:
            return json.loads(text), None
        if text.startswith("\ufeff"):  # what json.loads says before decoding; the decoder below is its
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
        return _STRICT.decode(text), None  # json.loads(text, parse_constant=...) without a new decoder per call
    except (ValueError, RecursionError, MemoryError, TypeError, OverflowError) as exc:
        return None, f"not JSON: {type(exc).__name__}: {str(exc)[:160]}"


def parse_lines(text: Any, limits: Limits = DEFAULT, complete_only: bool = False
                ) -> Tuple[List[Tuple[int, Any]], List[str]]:
    """``([(line number, value), ...], problems)`` of JSON-lines text: one problem per bad line (the first
    :data:`MAX_PROBLEMS` named, the rest counted). ``complete_only``: a last line without its newline is a
    write in progress, left for the next read and not a problem. Blank lines are skipped. Never raises."""
    values: List[Tuple[int, Any]] = []
    problems: List[str] = []
    try:
        if isinstance(text, (bytes, bytearray, memoryview)):
            text = bytes(text).decode("utf-8", errors="replace")
        if not isinstance(text, str):
            return [], [f"{type(text).__name__} is not text"]
        if len(text) > limits.max_total_bytes:
            problems.append(f"{len(text)} characters, more than the {limits.max_total_bytes} read: the start was not read")
            text = text[-limits.max_total_bytes:]
            text = text.split("\n", 1)[1] if "\n" in text else ""
        lines = text.split("\n")
        if complete_only or not lines[-1].strip():
            lines = lines[:-1]
        hidden = 0
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            if number > limits.max_lines:
                problems.append(f"{len(lines) - limits.max_lines} line(s) past the first {limits.max_lines} not read")
                break
            value, problem = loads(line, limits)
            if problem is None:
                values.append((number, value))
            elif len(problems) < MAX_PROBLEMS:
                problems.append(f"line {number}: {problem}")
            else:
                hidden += 1
        if hidden:
            problems.append(f"{hidden} more bad line(s)")
    except (MemoryError, RecursionError, TypeError, ValueError) as exc:
        problems.append(f"not read: {type(exc).__name__}")
    return values, problems


def loads_object(text: Any, limits: Limits = DEFAULT) -> Tuple[dict, Optional[str]]:
    """A JSON object (``({}, problem)`` for anything else). Never raises."""
    value, problem = loads(text, limits)
    if problem is None and not isinstance(value, dict):
        return {}, f"holds {type(value).__name__}, not an object"
    return (value if problem is None else {}), problem

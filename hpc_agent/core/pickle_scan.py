"""What a job-writable pickle says, read without unpickling it: its opcodes, never its objects.

Unpickling runs whatever ``__reduce__`` the file names, and a job can write any file in the folders
submitit uses (``<id>_result.pkl``, the sweep's temporary task pickles). ``pickletools.genops`` only
disassembles: it reads opcodes and their literal arguments and executes nothing, so the strings in the
file (module and class names, attribute names and values) can be looked at safely. The read itself is
bounded and refuses links, FIFOs and devices (``rundir.read_bounded``).
"""
from __future__ import annotations

import pickletools
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple

from hpc_agent.core.rundir import read_bounded

MAX_BYTES = 4 << 20  # a submitit task or result pickle of ours is a few KiB


@dataclass(frozen=True)
class PickleText:
    """What a pickle's opcodes say: its string literals in file order, and the globals it would import
    (``("?", "?")`` for one whose name is not a plain literal right before it: never guessed)."""

    strings: Tuple[str, ...]
    globals: Tuple[Tuple[str, str], ...]


_NO_VALUE = {"MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT", "FRAME", "PROTO"}  # leave the stack's top as it was


def scan(path: Path, max_bytes: int = MAX_BYTES, within: Optional[Path] = None) -> PickleText:
    """Disassemble the pickle at ``path``. OSError (``UnsafeFile``) for a link, a FIFO or an over-long file
    (with ``within``, the run dir: a link at any component below it); ValueError for anything that is not a
    whole pickle."""
    data = read_bounded(Path(path), max_bytes, within)
    strings: List[str] = []
    found: List[Tuple[str, str]] = []
    recent: List[Optional[str]] = []  # the values the last opcodes pushed: a string, or None for anything else
    try:
        for opcode, arg, _pos in pickletools.genops(data):
            if isinstance(arg, str):
                strings.append(arg)
            if opcode.name in _NO_VALUE:
                continue
            if opcode.name in ("GLOBAL", "INST"):
                module, _, name = str(arg).partition(" ")
                found.append((module, name))
            elif opcode.name == "STACK_GLOBAL":
                pair = recent[-2:]
                found.append((pair[0], pair[1]) if len(pair) == 2 and None not in pair else ("?", "?"))
            recent.append(arg if isinstance(arg, str) else None)
            del recent[:-2]
    except Exception as exc:  # noqa: BLE001 - torn or garbage bytes: the disassembler's errors vary by opcode
        raise ValueError(f"{path} is not a whole pickle ({type(exc).__name__}: {exc})") from None
    return PickleText(tuple(strings), tuple(found))


def pickle_strings(path: Path, max_bytes: int = MAX_BYTES, within: Optional[Path] = None) -> List[str]:
    """Every string literal in the pickle, in file order (see :func:`scan` for the errors)."""
    return list(scan(path, max_bytes, within).strings)


def result_tag(path: Path, within: Optional[Path] = None) -> Optional[str]:
    """submitit's result pickle is ``("success", value)`` or ``("error", traceback)``: its first string.
    None when the file is absent, unsafe (a link anywhere below ``within``) or not a pickle."""
    try:
        strings = pickle_strings(path, within=within)
    except (OSError, ValueError):
        return None
    return strings[0] if strings else None

"""What each value that reaches the job script may contain: an allow-list per field, and bounded lengths.

Where values land (see tests/golden/quickstart.sbatch):

- ``#SBATCH --key=value`` lines are read by sbatch, not by bash. submitit writes every value through
  ``shlex.quote``; sbatch's own parser (``_get_argument`` in Slurm's src/sbatch/opt.c) strips single and
  double quotes as bash does and ends a value at unquoted whitespace or ``#``, but reads a backslash as an
  escape even inside single quotes (bash does not) and expands nothing (no ``$``, globs or ``~``). Slurm
  then reads ``%`` in --output as a file-name pattern (``%j``, ``%A``..), and so does submitit.
- The setup lines are bash; the renderer (``jobs.executor.render_lines``) shell-quotes each value once.

So Slurm names, times, sizes and node lists get the characters of their Slurm syntax only: none of these is
special to sbatch's parser (``& | [ ] * , ( )`` included), so sbatch reads back exactly what was written, and
bash never sees them. An sbatch option we do not know gets the characters that need no quoting at all.
Paths may hold anything both readers see the same once quoted: everything but control characters, a
backslash and ``%``. Every value is bounded, so a huge one is a config error here, never E2BIG at sbatch.
"""
from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from hpc_agent.config.problems import Problem

PATH_MAX = 4096  # bytes, Linux PATH_MAX (with the NUL)
NAME_MAX = 255  # bytes of one path component
# Bytes kept free below PATH_MAX for what is appended to runs_root: "/<name>-<timestamp>/slurm/<log>".
RUN_DIR_RESERVE = 256

# Slurm's --time forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S; UNLIMITED/INFINITE mean no limit.
TIME_RE = re.compile(r"^((\d+-)?\d+(:\d{1,2}){0,2}|UNLIMITED|INFINITE)$", re.IGNORECASE)
# --mem: a number with an optional K/M/G/T suffix.
MEM_RE = re.compile(r"^\d+[KMGT]?$", re.IGNORECASE)
# Names end up in directory names and job names: keep them boring.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")

_WORD = r"[A-Za-z0-9_.-]+"
_RANGES = r"\[\d+(-\d+)?(,\d+(-\d+)?)*\]"
_HOST = rf"(?=[A-Za-z0-9_.\[-])[A-Za-z0-9_.-]*({_RANGES}[A-Za-z0-9_.-]*)*"


@dataclass(frozen=True)
class Rule:
    """A field's allow-list: the characters it may hold, the syntax they must form, and its longest length."""

    what: str  # what is accepted, in words: the fix the user reads
    chars: str  # a regex character class of every allowed character
    valid: Callable[[str], bool]  # the syntax those characters must form
    max_len: int

    def problem(self, value: str) -> Optional[str]:
        """None when ``value`` is acceptable, else the expected-text naming the offending character or pattern."""
        bad = re.search(f"[^{self.chars[1:-1]}]", value)  # the class, negated
        if len(value) > self.max_len:
            why = f"it has {len(value)} characters, at most {self.max_len} fit"
        elif bad:
            why = f"{char_name(bad.group())} at position {bad.start()} is not allowed"
        elif not self.valid(value):
            why = "the characters are allowed but do not form that syntax"
        else:
            return None
        return f"{self.what} ({why}; the value is written into the job script)"


def _rule(what: str, chars: str, syntax: "str | Callable[[str], bool]", max_len: int) -> Rule:
    return Rule(what, chars, re.compile(syntax).match if isinstance(syntax, str) else syntax, max_len)


_FEATURES = re.compile(rf"^{_WORD}(\*\d+)?([&|,]{_WORD}(\*\d+)?)*$")


def _constraint_ok(value: str) -> bool:
    """Features joined by & | , with *counts; [..] and (..) group them and must balance."""
    depth = {"[": 0, "(": 0}
    for ch in value:
        if ch in "[(":
            depth[ch] += 1
        elif ch in "])":
            opener = "[" if ch == "]" else "("
            depth[opener] -= 1
            if depth[opener] < 0:
                return False
    flat = re.sub(r"[\[\]()]", "", value)
    return not any(depth.values()) and bool(_FEATURES.match(flat))


NAME = _rule("a Slurm name: letters, digits, '_', '.' or '-'", r"[A-Za-z0-9_.-]", rf"^{_WORD}$", 128)
NAMES = _rule("Slurm names (letters, digits, '_', '.' or '-'), several separated by ','", r"[A-Za-z0-9_.,-]",
              rf"^{_WORD}(,{_WORD})*$", 512)
CONSTRAINT = _rule("node features (letters, digits, '_', '.', '-') joined by '&', '|' or ',', with counts '*N' "
                   "and grouping '[..]' or '(..)', e.g. 'intel&gpu' or '[rack1*2&rack2*4]'",
                   r"[A-Za-z0-9_.,&|*()\[\]-]", _constraint_ok, 1024)
HOSTLIST = _rule("host names or hostlist ranges separated by ',', e.g. 'node[1-3,5],gpu01'",
                 r"[A-Za-z0-9_.,\[\]-]", rf"^{_HOST}(,{_HOST})*$", 8192)
TIME = _rule("a Slurm time: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or UNLIMITED",
             r"[A-Za-z0-9:-]", TIME_RE.pattern, 32)
MEM = _rule("a memory size: digits with an optional K, M, G or T suffix, e.g. 4G", r"[0-9KMGTkmgt]",
            MEM_RE.pattern, 32)
TEMPLATE = _rule("a template file name from sbatch_templates/ without .yaml: letters, digits, '_' or '-'",
                 r"[A-Za-z0-9_-]", r"^[A-Za-z0-9_-]+$", 64)
MAIL_TYPE = _rule("mail types such as END or FAIL,TIME_LIMIT_80, separated by ','", r"[A-Za-z0-9_,]",
                  r"^[A-Za-z0-9_]+(,[A-Za-z0-9_]+)*$", 256)
MAIL_USER = _rule("a user name or e-mail address", r"[A-Za-z0-9_.+@-]", r"^[A-Za-z0-9_.+-]+(@[A-Za-z0-9.-]+)?$", 256)
DEPENDENCY = _rule("a dependency list such as afterok:123:456,singleton", r"[A-Za-z0-9_:,+?]",
                   r"^[a-z]+(:[0-9_+]+)*([,?][a-z]+(:[0-9_+]+)*)*$", 1024)
# Any other sbatch option: only characters that need no quoting at all, so no reader can see them differently.
PLAIN = _rule("letters, digits and '_', '.', ',', ':', '=', '@', '+', '/' or '-' (an sbatch option value "
              "hpc_agent has no specific rule for)", r"[A-Za-z0-9_.,:=@+/-]", r"^.*$", 1024)
OPTION_KEY = _rule("an sbatch long option name such as mail-type", r"[a-z0-9-]", r"^[a-z][a-z0-9-]*$", 64)

FIELD_RULES: Dict[str, Rule] = {
    "slurm.partition": NAMES, "slurm.account": NAME, "slurm.qos": NAME, "slurm.constraint": CONSTRAINT,
    "slurm.exclude": HOSTLIST, "slurm.mem": MEM, "slurm.time": TIME, "slurm.template": TEMPLATE,
}
# extra_sbatch options with a known syntax; every other option gets PLAIN.
OPTION_RULES: Dict[str, Rule] = {
    "reservation": NAME, "wckey": NAME, "clusters": NAMES,
    "cluster-constraint": CONSTRAINT, "prefer": CONSTRAINT,
    "nodelist": HOSTLIST, "mem-per-cpu": MEM, "mem-per-gpu": MEM, "tmp": MEM,
    "time-min": TIME, "mail-type": MAIL_TYPE, "mail-user": MAIL_USER, "dependency": DEPENDENCY,
}
EXTRA_PREFIX = "slurm.extra_sbatch."

_LOG = "set run.runs_root (the log is <run dir>/slurm/%j_0_log.out, which the watcher, diagnose and review read)"
_GPUS = "set slurm.gpus_per_node, written as profile.gpu_request says"
OWNED_OPTIONS: Dict[str, str] = {
    "output": _LOG, "error": _LOG,
    "open-mode": "there is no setting: it is always append, so a requeued attempt never truncates the log before it",
    "signal": "set slurm.signal_lead_s (USR2 that many seconds before the limit is how the job checkpoints in time)",
    "requeue": "set slurm.requeue", "no-requeue": "set slurm.requeue",
    "array": ("there is no setting: a run is one job (its log paths and requeue name the job id); sweeps make "
              "arrays themselves"),
    "job-name": "set run.name (the job name carries the run id, by which the watcher finds the job)",
    "comment": "set run.name (the comment carries the run id, by which the watcher finds the job)",
    "parsable": "there is no setting: submit reads the job id from sbatch itself",
    "wrap": "there is no setting: hpc_agent writes the job script",
    "chdir": "set container.workdir in a container; otherwise submit from the directory the job should run in",
    "workdir": "set container.workdir in a container; otherwise submit from the directory the job should run in",
    "wait": "use submit --wait (sbatch itself must return the job id at once)",
    "test-only": "use submit --place auto (it runs sbatch --test-only itself)",
    "nodes": "set slurm.nodes (the ranks, their log files and the memory check follow from it)",
    "ntasks": "set slurm.nodes and slurm.tasks_per_node (one rank per task)",
    "ntasks-per-node": "set slurm.tasks_per_node (one rank per task)",
    "cpus-per-task": "set slurm.cpus_per_task",
    "gpus-per-node": _GPUS, "gpus": _GPUS, "gres": _GPUS,
    "partition": "set slurm.partition (placement and the memory check read it)",
    "account": "set slurm.account", "qos": "set slurm.qos", "constraint": "set slurm.constraint",
    "exclude": "set slurm.exclude (the watcher adds failed nodes to it)",
    "mem": "set slurm.mem (the memory repair raises it)",
    "time": "set slurm.time (the job's time limit and the signal lead are computed from it)",
}
"""The sbatch options hpc_agent sets itself or depends on: ``option -> the setting to use instead``. An
``extra_sbatch`` key that is one of them, or that sbatch would read as one (getopt_long takes any unambiguous
abbreviation: ``outp`` is ``--output``), is refused (docs/config.md lists them)."""


def owned_option_problem(option: str) -> Optional[str]:
    """None when ``slurm.extra_sbatch.<option>`` may be set, else the expected-text naming the setting to use."""
    owned = [name for name in OWNED_OPTIONS if name.startswith(option)]
    if not owned:
        return None
    name = option if option in OWNED_OPTIONS else owned[0]
    alias = "" if name == option else f" (sbatch reads --{option} as an abbreviation of --{name})"
    return (f"an sbatch option hpc_agent does not set itself: --{name}{alias} is hpc_agent's, remove it from "
            f"slurm.extra_sbatch; {OWNED_OPTIONS[name]}")


def char_name(ch: str) -> str:
    names = {" ": "a space", "\n": "a newline", "\r": "a carriage return", "\t": "a tab", "\0": "a NUL byte",
             "\\": "a backslash", "'": "a single quote", '"': "a double quote", "`": "a backtick"}
    return names.get(ch, repr(ch) if ch.isprintable() else f"the character {ascii(ch)}")


def field_problem(key: str, value: str) -> Optional[str]:
    """The expected-text for config field ``key`` holding ``value``, or None when it is acceptable."""
    if key == "run.runs_root":
        return path_problem(value, sbatch=True, reserve=RUN_DIR_RESERVE)
    if key.startswith(EXTRA_PREFIX):
        option = key[len(EXTRA_PREFIX):]
        return (OPTION_KEY.problem(option) or owned_option_problem(option)
                or OPTION_RULES.get(option, PLAIN).problem(value))
    return FIELD_RULES.get(key, PLAIN).problem(value)


def path_problem(value: str, *, sbatch: bool, reserve: int = 0) -> Optional[str]:
    """None for a path both bash (quoted) and, with ``sbatch``, an ``#SBATCH`` line read back exactly."""
    fix = "a directory path"
    if not value.strip():
        return f"{fix} (it is empty)"
    for i, ch in enumerate(value):
        if unicodedata.category(ch) in ("Cc", "Cs", "Zl", "Zp"):
            return f"{fix} without control characters ({char_name(ch)} at position {i})"
        if sbatch and ch == "\\":
            return (f"{fix} without a backslash (position {i}): sbatch reads it as an escape even inside "
                    "quotes, so the #SBATCH --output line would name another file")
        if sbatch and ch == "%":
            return (f"{fix} without '%' (position {i}): Slurm and submitit read it as a log-file name pattern "
                    "such as %j")
    size, limit = len(value.encode("utf-8")), PATH_MAX - 1 - reserve
    if size > limit:
        return f"{fix} of at most {limit} bytes (it has {size})"
    longest = max(value.split("/"), key=lambda part: len(part.encode("utf-8")))
    if len(longest.encode("utf-8")) > NAME_MAX:
        return f"{fix} whose every component is at most {NAME_MAX} bytes ({longest[:20]!r}... is longer)"
    return None


# Every value of every section, whatever its field: one walk (:func:`value_problems`, run by the loader on the
# merged config) instead of a check per field that the next new field forgets.
INT_LIMIT = 2 ** 53
"""No integer in a config is larger: beyond 2**53 JSON readers, SQLite's REAL and TensorBoard's floats round it,
and no count, size or step here needs more. A string of digits is coerced to an integer by the loader, so this
is also what stops ``max_steps: "123...29 digits"``."""
INT_RANGES: Dict[str, Tuple[int, int, str]] = {
    "train.seed": (0, 2 ** 32 - 1, "NumPy and scikit-learn take seeds from 0 to 2**32-1"),
    "slurm.signal_lead_s": (1, 65535, "sbatch --signal=USR2@N takes N up to 65535 s"),
    "slurm.nodes": (1, 2 ** 31 - 1, "Slurm counts nodes in 32 bits"),
    "slurm.tasks_per_node": (1, 2 ** 31 - 1, "Slurm counts tasks in 32 bits"),
    "slurm.cpus_per_task": (1, 2 ** 31 - 1, "Slurm counts CPUs in 32 bits"),
    "slurm.gpus_per_node": (0, 2 ** 31 - 1, "Slurm counts GPUs in 32 bits"),
}
"""Integer fields with a narrower range than :data:`INT_LIMIT`: ``key -> (lowest, highest, why)``."""
_SURROGATE = re.compile("[\ud800-\udfff]")


def _walk(node: Any, path: str) -> Iterator[Tuple[str, Any]]:
    """``(key path, value)`` of every leaf, keys included (as ``<path> (key)``), lists as ``path[i]``."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield f"{path} (key)", key
            yield from _walk(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, (list, tuple)):
        for i, item in enumerate(node):
            yield from _walk(item, f"{path}[{i}]")
    else:
        yield path, node


def value_problem(key: str, value: Any) -> Optional[str]:
    """The expected-text for one leaf of any field, or None: text without lone surrogates, finite floats,
    integers in range. Pure; the field's own checks (sections' ``problems``) come on top."""
    if isinstance(value, str):
        bad = _SURROGATE.search(value)
        if bad:
            return (f"text without a lone surrogate (the escape \\u{ord(bad.group()):04x} at position {bad.start()} "
                    "is half of a UTF-16 pair, no character, and cannot be written as UTF-8): write the character "
                    "itself, or its \\U0001XXXX escape")
    elif isinstance(value, float):
        if not math.isfinite(value):
            return "a finite number (nan and inf are no setting: write a number such as 3e-4)"
    elif isinstance(value, int) and not isinstance(value, bool):
        lo, hi, why = INT_RANGES.get(key, (-INT_LIMIT, INT_LIMIT, "larger integers lose precision in JSON, "
                                            "the ledger and TensorBoard, and no setting needs them"))
        if not lo <= value <= hi:
            return f"an integer from {lo} to {hi} ({why})"
    return None


def value_problems(data: Any, section: str) -> List[Problem]:
    """Every leaf of ``data`` (a section as plain values) checked by :func:`value_problem`."""
    problems: List[Problem] = []
    for key, value in _walk(data, section):
        if why := value_problem(key, value):
            big = isinstance(value, int) and value.bit_length() > 256  # str() of a huge int can itself raise
            shown = f"an integer of {value.bit_length()} bits" if big else value
            problems.append(Problem(key, shown, why))
    return problems

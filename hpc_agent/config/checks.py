"""Small validation helpers shared by the config sections: each appends :class:`Problem` records."""
from __future__ import annotations

import re
from typing import List, Optional

from hpc_agent.config.problems import ConfigError, Problem, shell_unsafe_reason

# Slurm accepts these --time forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S.
TIME_RE = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$")
# --mem: a number with an optional K/M/G/T suffix.
MEM_RE = re.compile(r"^\d+[KMGT]?$", re.IGNORECASE)
# Names end up in directory names and job names: keep them boring.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def check_positive(section: str, obj: object, names: List[str], problems: List[Problem]) -> None:
    for name in names:
        value = getattr(obj, name)
        if value is None or value <= 0:
            problems.append(Problem(f"{section}.{name}", value, "a number greater than 0"))


def check_choice(key: str, value: object, choices: tuple, problems: List[Problem]) -> None:
    if value not in choices:
        problems.append(Problem(key, value, "one of " + ", ".join(choices)))


def check_shell_safe(key: str, value: Optional[str], problems: List[Problem]) -> None:
    """Values that reach an ``#SBATCH`` line or a shell line must not be able to inject code."""
    if value is None:
        return
    reason = shell_unsafe_reason(str(value))
    if reason:
        problems.append(Problem(key, value, f"a value without {reason} (it would be written into the job script)"))


def raise_if(problems: List[Problem]) -> None:
    if problems:
        raise ConfigError(problems)

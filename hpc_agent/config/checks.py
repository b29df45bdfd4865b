"""Small validation helpers shared by the config sections: each appends :class:`Problem` records."""
from __future__ import annotations

from typing import List, Optional

from hpc_agent.config.fields import MEM_RE, NAME_RE, TIME_RE, field_problem
from hpc_agent.config.problems import ConfigError, Problem

__all__ = ["MEM_RE", "NAME_RE", "TIME_RE", "check_positive", "check_choice", "check_shell_safe", "raise_if"]


def check_positive(section: str, obj: object, names: List[str], problems: List[Problem]) -> None:
    for name in names:
        value = getattr(obj, name)
        if value is None or value <= 0:
            problems.append(Problem(f"{section}.{name}", value, "a number greater than 0"))


def check_choice(key: str, value: object, choices: tuple, problems: List[Problem]) -> None:
    if value not in choices:
        problems.append(Problem(key, value, "one of " + ", ".join(choices)))


def check_shell_safe(key: str, value: Optional[str], problems: List[Problem]) -> None:
    """A value that reaches an ``#SBATCH`` line or a shell line must pass its field's allow-list
    (``hpc_agent.config.fields``): a blacklist always misses one more metacharacter."""
    if value is None:
        return
    expected = field_problem(key, str(value))
    if expected:
        problems.append(Problem(key, value, expected))


def raise_if(problems: List[Problem]) -> None:
    """Raise every problem, each (key, value) once: a value that fails its field's allow-list usually
    fails the section's format check too, and the allow-list's message (first) names the character."""
    seen, unique = set(), []
    for problem in problems:
        mark = (problem.key, repr(problem.value))
        if mark not in seen:
            seen.add(mark)
            unique.append(problem)
    if unique:
        raise ConfigError(unique)

"""Config problems: collected, then reported all at once."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, List, Optional

# Characters that would let a config value break out of an ``#SBATCH`` line or a shell line.
# A newline starts a new script line, ``#`` starts a comment (and ends option parsing in #SBATCH
# lines), ``;`` chains commands, and backticks / ``$(`` run commands.
_UNSAFE = (("\n", "a newline"), ("\r", "a carriage return"), ("#", "'#'"), (";", "';'"),
           ("`", "a backtick"), ("$(", "'$('"))


def shell_unsafe_reason(value: str) -> Optional[str]:
    """Name the first unsafe token in ``value``, or None if it is safe to put into the job script."""
    found = [name for token, name in _UNSAFE if token in value]
    return ", ".join(found) if found else None


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a config: where, what was given, what would be accepted."""

    key: str
    value: object
    expected: str

    def __str__(self) -> str:
        return f"{self.key}: got {self.value!r}; expected {self.expected}"


class ConfigError(ValueError):
    """Raised with every problem found, so the user can fix them in one go."""

    def __init__(self, problems: Iterable[Problem]):
        self.problems: List[Problem] = list(problems)
        super().__init__(self.render())

    def render(self) -> str:
        n = len(self.problems)
        lines = [f"{n} problem{'s' if n != 1 else ''} in the config:"]
        lines += [f"  - {p}" for p in self.problems]
        return "\n".join(lines)

"""Config problems: collected, then reported all at once."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, List

from hpc_agent.core.redact import MASK, is_secret_name, redact

# A value is shown cut to this many characters: a 100 MB value must not become a 100 MB error message.
SHOWN_CHARS = 200


def shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}... ({len(text)} characters in all)"


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a config: where, what was given, what would be accepted."""

    key: str
    value: object
    expected: str

    def __str__(self) -> str:
        """Printed for people (and maybe pasted into an issue): the value and the text are redacted
        (``hpc_agent.core.redact``), since a value next to the problem may carry a token or a password."""
        value = MASK if is_secret_name(self.key) else redact(shown(self.value))
        return f"{self.key}: got {value}; expected {redact(self.expected)}"


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

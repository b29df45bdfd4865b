"""The example of docs/your_model.md, read from the page itself so that the doc and the tests cannot drift."""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
DOC = REPO / "docs" / "your_model.md"
MARKER = "<!-- example: my_model/model.py -->"
VERSION_LINE = '[my_model] version 1'


def example_code() -> str:
    """The first ```python block after the marker."""
    text = DOC.read_text(encoding="utf-8")
    assert MARKER in text, f"{DOC} lost its example marker {MARKER!r}"
    match = re.search(r"^```python\n(.*?)^```", text[text.index(MARKER):], re.M | re.S)
    assert match, f"no ```python block after {MARKER!r} in {DOC}"
    return match.group(1)


def write_package(parent: Path, name: str = "my_model", version: int = 1) -> Path:
    """``parent/name/{__init__,model}.py`` holding the doc's example (its version line set to ``version``)."""
    code = example_code()
    assert VERSION_LINE in code, "the example must print its version line"
    pkg = Path(parent) / name
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "model.py").write_text(code.replace(VERSION_LINE, f"[my_model] version {version}"))
    return pkg

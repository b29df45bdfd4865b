"""The config reference, generated from the schema's field docstrings.

``hpc-agent config`` (``python -m hpc_agent.config``) prints it as Markdown; the reference section of
``docs/config.md`` is this output (a test keeps the two in sync; ``hpc-agent config --update-docs`` rewrites it).
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
from pathlib import Path
from typing import Dict, List

from hpc_agent.config.schema import SECTIONS


def field_docs(cls: type) -> Dict[str, str]:
    """Attribute docstrings: the string literal right after each annotated field in the class body."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: Dict[str, str] = {}
    for node, following in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)):
            docs[node.target.id] = " ".join(following.value.value.split())
    return docs


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return "null" if f.default is None else repr(f.default).replace("'", "")
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return repr(f.default_factory())  # type: ignore[misc]
    return ""


def reference_markdown() -> str:
    lines: List[str] = []
    for section, cls in SECTIONS.items():
        lines += [f"#### `{section}`", "", " ".join((cls.__doc__ or "").split()).replace("``", "`"), "",
                  "| key | default | meaning |", "| --- | --- | --- |"]
        docs = field_docs(cls)
        for f in dataclasses.fields(cls):
            lines.append(f"| `{section}.{f.name}` | `{_default(f)}` | {docs.get(f.name, '').replace('|', '/').replace('``', '`')} |")
        lines.append("")
    return "\n".join(lines)


def update_readme(readme: Path) -> bool:
    """Replace the reference in ``readme`` (from "#### `run`" up to the next "## " heading); True if it changed."""
    text = readme.read_text()
    start = text.index("#### `run`")
    end = text.index("\n## ", start) + 1
    new = text[:start] + reference_markdown().rstrip("\n") + "\n\n" + text[end:]
    if new != text:
        readme.write_text(new)
    return new != text

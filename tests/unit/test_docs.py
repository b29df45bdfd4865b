"""The README is a short front door; everything else lives under docs/, and every link resolves.

The README's two set-up commands are read from the files that run them (``.ci/run`` runs the test command;
the scripts that describe themselves as running "on a fresh machine" are the two commands), so the README
and CI cannot drift apart without this failing.
"""
from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path
from typing import Iterator, List, Set, Tuple

import pytest

from tests.conftest import REPO

README = REPO / "README.md"
DOCS = REPO / "docs"
MAX_README_LINES = 150
REQUIRED_PAGES = ("install", "exit_codes", "watcher", "config", "chaos", "sweeps", "benchmarks", "cluster")
WATCHER_DESIGN_HEADING = "## Design: pure core and effect journal"

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def markdown_files() -> List[Path]:
    return [README] + sorted(DOCS.glob("*.md"))


def prose(text: str) -> str:
    """The text without fenced code blocks and inline code, where a bracket is not a link."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def links(path: Path) -> Iterator[str]:
    yield from LINK.findall(prose(path.read_text(encoding="utf-8")))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|__", "", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> Set[str]:
    seen: dict = {}
    found = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text(encoding="utf-8"))):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def relative_links() -> List[Tuple[Path, str]]:
    return [(path, target) for path in markdown_files() for target in links(path)
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I)]  # http:, https:, mailto: ...


def setup_commands() -> List[str]:
    """The README's two commands, as the repository runs them."""
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    test_commands = re.findall(r"^(bash scripts/[\w.-]+\.sh)\s*$", ci, re.M)
    assert len(test_commands) == 1, f".ci/run should run exactly one scripts/*.sh, found {test_commands}"
    fresh = sorted(f"bash scripts/{script.name}" for script in (REPO / "scripts").glob("*.sh")
                   if "on a fresh machine" in script.read_text(encoding="utf-8").splitlines()[1])
    assert test_commands[0] in fresh, f"{test_commands[0]} (from .ci/run) should say it runs 'on a fresh machine'"
    assert len(fresh) == 2, f"expected two scripts that run 'on a fresh machine' (demo, tests), found {fresh}"
    return fresh


def test_readme_is_a_short_front_door():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md has {len(lines)} lines (at most {MAX_README_LINES}): move the detail into docs/")


@pytest.mark.parametrize("command", setup_commands())
def test_readme_carries_the_setup_commands(command):
    readme = README.read_text(encoding="utf-8")
    assert re.search(rf"^{re.escape(command)}(\s|$)", readme, re.M), f"README.md lacks the line {command!r}"
    assert (REPO / command.split()[1]).is_file()


def test_every_relative_link_resolves():
    found = relative_links()
    assert found, "no relative links found: the link pattern is broken"
    broken = []
    for source, target in found:
        file_part, _, anchor = target.partition("#")
        resolved = (source.parent / file_part).resolve() if file_part else source
        if not resolved.exists():
            broken.append(f"{source.relative_to(REPO)}: {target} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{source.relative_to(REPO)}: {target} (no heading with that anchor)")
    assert broken == []


@pytest.mark.parametrize("page", REQUIRED_PAGES)
def test_required_docs_page_exists_and_the_readme_links_it(page):
    path = DOCS / f"{page}.md"
    assert path.is_file(), f"docs/{page}.md is missing"
    assert f"docs/{page}.md" in {target.partition("#")[0] for target in links(README)}, (
        f"README.md does not link docs/{page}.md")


def test_readme_commands_exist():
    readme = README.read_text(encoding="utf-8")
    modules = set(re.findall(r"python -m (hpc_agent(?:\.\w+)*)", readme))
    assert modules, "the README names no hpc_agent command"
    assert [m for m in sorted(modules) if importlib.util.find_spec(m) is None] == []
    scripts = set(re.findall(r"bash (scripts/[\w.-]+\.sh)", readme))
    assert [s for s in sorted(scripts) if not (REPO / s).is_file()] == []


def test_config_reference_page_is_current(tmp_path):
    from hpc_agent.config.docs import reference_markdown, update_readme

    page = DOCS / "config.md"
    assert reference_markdown().strip() in page.read_text(encoding="utf-8"), (
        "docs/config.md's reference is stale: run python -m hpc_agent.config --update-docs")
    # The generator's in-place updater finds the section in the page (a "## " heading follows it).
    copy = tmp_path / "config.md"
    shutil.copy(page, copy)
    assert update_readme(copy) is False


def test_watcher_page_describes_the_design():
    text = (DOCS / "watcher.md").read_text(encoding="utf-8")
    assert WATCHER_DESIGN_HEADING in text
    for term in ("hpc_agent/watcher/follow.py", "needs_attention", "--rebuild-events", "--resume-run", "train.lease",
                 "O_NOFOLLOW", "S_ISREG"):
        assert term in text, f"docs/watcher.md's design section does not mention {term}"

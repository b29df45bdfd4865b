"""docs/cli.md shows the exit-code table the code uses, and the watcher's service examples (docs/watcher.md)
follow the runs root that submit writes to by default."""
from __future__ import annotations

import posixpath
import re

from hpc_agent.cli import exit_status
from hpc_agent.config.schema import RunConfig as Run
from tests.conftest import REPO

DOCS = REPO / "docs"


def test_cli_page_shows_the_exit_code_tables():
    page = (DOCS / "cli.md").read_text(encoding="utf-8")
    assert exit_status.markdown_table() in page, "docs/cli.md: paste hpc_agent.cli.exit_status.markdown_table()"
    assert exit_status.commands_markdown() in page, "docs/cli.md: paste hpc_agent.cli.exit_status.commands_markdown()"
    assert "exit_codes.md" in page  # the job's exit codes: another table, linked, not merged


def test_cli_page_is_linked_from_the_readme_and_the_overview():
    assert "(docs/cli.md)" in (REPO / "README.md").read_text(encoding="utf-8")
    assert "(cli.md)" in (DOCS / "index.md").read_text(encoding="utf-8")
    assert "cli.md" in (DOCS / "exit_codes.md").read_text(encoding="utf-8")


def _default_runs_root(cwd: str) -> str:
    """Where submit puts runs when neither the config nor HPC_AGENT_RUNS says: run.runs_root against its cwd."""
    return posixpath.normpath(posixpath.join(cwd, Run().runs_root))


def _block(text: str, marker: str) -> str:
    (block,) = [b for b in re.findall(r"```[a-z]*\n(.*?)```", text, re.S) if marker in b]
    return block


def test_systemd_unit_follows_the_default_runs_root(monkeypatch):
    text = (DOCS / "watcher.md").read_text(encoding="utf-8")
    unit = _block(text, "[Service]")
    workdir = re.search(r"^WorkingDirectory=(\S+)$", unit, re.M).group(1)
    runs_root = re.search(r"^ExecStart=.* -m hpc_agent\.watch .*--runs-root (\S+)", unit, re.M).group(1)
    assert runs_root == _default_runs_root(workdir), (workdir, runs_root)


def test_scrontab_entry_follows_the_default_runs_root():
    text = (DOCS / "watcher.md").read_text(encoding="utf-8")
    entry = _block(text, "#SCRON")
    found = re.search(r"cd (\S+) && .* -m hpc_agent\.watch .*--runs-root (\S+)", entry)
    assert found, entry
    workdir, runs_root = found.groups()
    assert runs_root == _default_runs_root(workdir), (workdir, runs_root)


def test_watch_and_submit_share_the_default(monkeypatch):
    """Both resolve ./runs against their own cwd (and HPC_AGENT_RUNS beats it for both): the reason the
    service examples pass --runs-root instead of relying on the service's cwd."""
    from hpc_agent import watch

    monkeypatch.delenv("HPC_AGENT_RUNS", raising=False)
    assert watch.build_parser().get_default("runs_root") == Run().runs_root == "./runs"
    monkeypatch.setenv("HPC_AGENT_RUNS", "/shared/runs")
    assert watch.build_parser().get_default("runs_root") == "/shared/runs"

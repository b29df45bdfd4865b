"""The hpc-agent console script mirrors the python -m hpc_agent.<command> modules."""
from __future__ import annotations

from hpc_agent.__main__ import main
from hpc_agent.config.docs import field_docs, reference_markdown
from hpc_agent.config.schema import SECTIONS
from tests.conftest import REPO, run_cli


def test_help_lists_submit(capsys):
    assert main(["--help"]) == 0
    assert "submit" in capsys.readouterr().out


def test_unknown_command_exits_2(capsys):
    assert main(["frobnicate"]) == 2
    assert "unknown command" in capsys.readouterr().err


def test_dispatches_to_submit_module(tmp_path):
    proc = run_cli("-m", "hpc_agent", "submit", "quickstart", "--dry-run", "--executor", "local",
                   f"run.runs_root={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    assert "# Resolved config" in proc.stdout


def test_every_config_field_has_a_docstring():
    for name, cls in SECTIONS.items():
        docs = field_docs(cls)
        missing = [f for f in cls.__dataclass_fields__ if not docs.get(f)]
        assert missing == [], f"{name}: fields without docstring: {missing}"


def test_config_reference_page_is_current():
    page = (REPO / "docs" / "config.md").read_text()
    assert reference_markdown().strip() in page, "regenerate with: python -m hpc_agent.config --update-docs"

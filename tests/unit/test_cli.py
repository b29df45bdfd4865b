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


def _documented_commands() -> set:
    """Every command the README and docs/ name as ``python -m hpc_agent.X`` or ``hpc-agent X``, and every one in
    the exit-code table: each of them must also be ``hpc-agent X`` (issue 44: ``hpc-agent chaos`` was unknown)."""
    import re

    from hpc_agent.cli.exit_status import BY_COMMAND

    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    text = "\n".join(p.read_text() for p in pages)
    named = set(re.findall(r"python -m hpc_agent\.([a-z_]+)", text))
    named |= {w for w in re.findall(r"hpc-agent ([a-z_]+)", text)}
    return named | set(BY_COMMAND)


def test_every_documented_command_runs_through_hpc_agent(capsys):
    from hpc_agent.__main__ import _available

    commands = _documented_commands()
    assert {"submit", "watch", "chaos", "sweep", "config", "init", "status"} <= commands
    missing = sorted(commands - set(_available()))
    assert missing == [], f"documented but 'hpc-agent <command>' does not know them: {missing}"
    main(["--help"])
    listed = capsys.readouterr().out
    for command in commands:
        assert f"  {command} " in listed, command
        try:
            code = main([command, "--help"])
        except SystemExit as exc:  # some commands let argparse's --help exit
            code = exc.code
        assert code in (0, None), command
        assert "usage:" in capsys.readouterr().out, command


def test_every_command_module_is_a_front_door_command():
    """A command module at the top of hpc_agent/ or a package with a __main__ is reachable as hpc-agent X."""
    from hpc_agent.__main__ import COMMANDS

    top = {p.stem for p in (REPO / "hpc_agent").glob("*.py") if p.stem not in ("__init__", "__main__")}
    packages = {p.parent.name for p in (REPO / "hpc_agent").glob("*/__main__.py")}
    assert sorted((top | packages) - set(COMMANDS)) == []

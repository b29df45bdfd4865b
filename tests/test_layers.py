"""The layers of hpc_agent: the CLIs are the top, and nothing below them imports one.

The CLIs (argparse + printing) may import services, the pure core and adapters; a service, the core or
an adapter that imported a CLI module would drag argparse front ends (and their import cost) into the
watcher and the job, and make the CLI the place where a fact lives.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CLI_MODULES = {"hpc_agent.submit", "hpc_agent.watch", "hpc_agent.diagnose", "hpc_agent.review", "hpc_agent.doctor",
               "hpc_agent.prepare", "hpc_agent.__main__", "hpc_agent.sweep.__main__", "hpc_agent.chaos.__main__",
               "hpc_agent.config.__main__"}
PURE_CORE = {"hpc_agent.watcher.follow", "hpc_agent.watcher.follow_model", "hpc_agent.state.lifecycle", "hpc_agent.policy.decide", "hpc_agent.policy.memory",
             "hpc_agent.slurm.job_match", "hpc_agent.slurm.sacct", "hpc_agent.slurm.sacct_read", "hpc_agent.slurm.sacct_json",
             "hpc_agent.slurm.hostlist", "hpc_agent.slurm.attempt_cache", "hpc_agent.core.heartbeat_format",
             "hpc_agent.diagnosis.hang", "hpc_agent.watcher.notify_events", "hpc_agent.policy.adaptive_lr"}
IO_MODULES = {"subprocess", "sqlite3", "socket", "shutil"}


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts)


def _imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            for alias in node.names:
                yield f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


SOURCES = sorted((REPO / "hpc_agent").rglob("*.py")) + sorted((REPO / "launch").rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_nothing_below_the_clis_imports_a_cli(path):
    name = _module_name(path)
    if name in CLI_MODULES:
        return
    bad = sorted({m for m in _imports(path) if m in CLI_MODULES})
    assert bad == [], f"{name} imports CLI module(s) {bad}: move what it needs below the CLI layer"


@pytest.mark.parametrize("name", sorted(PURE_CORE))
def test_the_pure_core_does_no_io(name):
    path = REPO / (name.replace(".", "/") + ".py")
    imported = set(_imports(path))
    assert not (imported & IO_MODULES), f"{name} imports {sorted(imported & IO_MODULES)}"
    assert not any(m.startswith(("hpc_agent.slurm.cli", "hpc_agent.state.ledger", "hpc_agent.watcher.loop", "hpc_agent.watcher.effects",
                                 "hpc_agent.watcher.observe", "hpc_agent.state.journal")) for m in imported), name

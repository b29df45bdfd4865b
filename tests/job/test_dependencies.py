"""Declared dependencies: every third-party import is declared in pyproject.toml, optional features stay
optional (their extra missing gives one line, not a traceback), and constraints.txt agrees with pyproject."""
from __future__ import annotations

import ast
import importlib.metadata
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Set

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
SOURCE_ROOTS = ("hpc_agent", "launch")
FIRST_PARTY = {"hpc_agent", "launch"}
# Imported, but by design provided by no distribution: each needs its reason.
NOT_DISTRIBUTIONS = {
    # launch/ops.py: DeepSpeed's op builders also exist as a top-level ``op_builder`` when DeepSpeed runs
    # from its source tree; the import is guarded and optional.
    "op_builder",
}
# Modules that only an extra installs: the core CLIs and the job must not import them at module level.
EXTRA_MODULES = {"optuna": "sweep", "sklearn": "tabular", "imblearn": "tabular"}
CORE_CLI_MODULES = ["hpc_agent.submit", "hpc_agent.watch", "hpc_agent.diagnose", "hpc_agent.review",
                    "hpc_agent.doctor", "hpc_agent.__main__", "hpc_agent.sweep.__main__",
                    "launch.train", "launch.workloads.classifier"]
# Calls that import the module named by their first (string) argument.
IMPORTING_CALLS = {"require", "import_module"}


@dataclass(frozen=True)
class Import:
    path: Path
    line: int
    module: str  # the top-level name
    module_level: bool  # executed when the file is imported (not inside a function)

    def where(self) -> str:
        return f"{self.path}:{self.line}"


def _call_name(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def imports_in(source: str, path: Path) -> List[Import]:
    """Every absolute import in ``source``: import statements anywhere (functions, try blocks, ...) and
    ``require("mod", ...)`` / ``importlib.import_module("mod")`` calls with a literal module name."""
    found: List[Import] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        names: List[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif (isinstance(node, ast.Call) and _call_name(node) in IMPORTING_CALLS and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            names = [node.args[0].value]
        for name in names:
            found.append(Import(path, node.lineno, name.partition(".")[0], not in_function))
        inside = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inside)

    visit(ast.parse(source, filename=str(path)), False)
    return found


def imports_under(root: Path, folders: Iterable[str]) -> List[Import]:
    out: List[Import] = []
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            out += imports_in(path.read_text(encoding="utf-8"), path.relative_to(root))
    return out


def declared_distributions(pyproject: Path) -> Set[str]:
    """Normalised names of the core dependencies and of every extra's (self-references left out)."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    requirements = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        requirements += extra
    names = {canonicalize_name(Requirement(r).name) for r in requirements}
    return names - {canonicalize_name(project["name"])}


def undeclared(imports: Iterable[Import], declared: Set[str], providers: Mapping[str, List[str]]) -> List[str]:
    """One line per import of a third-party module whose distribution is not declared."""
    problems = []
    for imp in imports:
        if imp.module in sys.stdlib_module_names or imp.module in FIRST_PARTY or imp.module in NOT_DISTRIBUTIONS:
            continue
        dists = providers.get(imp.module, [])
        if not any(canonicalize_name(d) in declared for d in dists):
            provided = ", ".join(sorted(set(dists))) or "no installed distribution"
            problems.append(f"{imp.where()}: imports {imp.module} (provided by {provided}), "
                            "which pyproject.toml does not declare")
    return problems


@pytest.fixture(scope="module")
def providers() -> Mapping[str, List[str]]:
    return importlib.metadata.packages_distributions()


# --- every import is declared ----------------------------------------------------------------------------
def test_every_third_party_import_is_declared(providers):
    imports = imports_under(REPO, SOURCE_ROOTS)
    assert len({i.path for i in imports}) > 50, "the walk found too few files: is REPO right?"
    problems = undeclared(imports, declared_distributions(REPO / "pyproject.toml"), providers)
    assert not problems, "undeclared dependencies:\n" + "\n".join(problems)


def test_checker_reports_an_undeclared_import(tmp_path, providers):
    """The checker catches imports at module level, inside functions and try blocks, and require() calls."""
    if "sklearn" not in providers:
        pytest.skip("scikit-learn is not installed (pip install -e '.[test]')")
    pkg = tmp_path / "hpc_agent"
    pkg.mkdir()
    (pkg / "a.py").write_text("import json\nimport sklearn\n")
    (pkg / "b.py").write_text("def f():\n    try:\n        from sklearn.metrics import f1_score\n"
                              "    except ImportError:\n        pass\n")
    (pkg / "c.py").write_text("from hpc_agent.core.extras import require\nm = require('sklearn.datasets', 'tabular', 'x')\n")
    declared = declared_distributions(REPO / "pyproject.toml") - {"scikit-learn"}
    problems = undeclared(imports_under(tmp_path, ["hpc_agent"]), declared, providers)
    assert [p.split(": ")[0] for p in problems] == ["hpc_agent/a.py:2", "hpc_agent/b.py:3", "hpc_agent/c.py:2"]
    assert all("imports sklearn (provided by scikit-learn)" in p for p in problems)
    # Declared again, nothing is reported; an unknown module is reported as provided by nothing.
    assert undeclared(imports_under(tmp_path, ["hpc_agent"]), declared | {"scikit-learn"}, providers) == []
    (pkg / "d.py").write_text("import surely_no_such_module_here\n")
    assert undeclared(imports_in((pkg / "d.py").read_text(), Path("d.py")), declared, providers) == [
        "d.py:1: imports surely_no_such_module_here (provided by no installed distribution), "
        "which pyproject.toml does not declare"]


# --- extras stay optional --------------------------------------------------------------------------------
def test_extras_are_never_imported_at_module_level():
    offenders = [f"{i.where()}: {i.module}" for i in imports_under(REPO, SOURCE_ROOTS)
                 if i.module in EXTRA_MODULES and i.module_level]
    assert not offenders, "import these inside the functions that need them (through hpc_agent.core.extras.require):\n" \
        + "\n".join(offenders)


def run_without_extras(code: str, blocked: Iterable[str] = tuple(EXTRA_MODULES)) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter in which importing any of ``blocked`` fails as if not installed."""
    prelude = f"import sys\nfor _name in {sorted(blocked)!r}:\n    sys.modules[_name] = None\n"
    return subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=300,
                          cwd=str(REPO))


def test_core_clis_import_without_the_extras():
    result = run_without_extras("\n".join(f"import {m}" for m in CORE_CLI_MODULES) + "\nprint('imported')")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "imported"


@pytest.mark.parametrize("method, blocked, distribution", [
    ("none", ["sklearn"], "scikit-learn"),
    ("smote", ["imblearn"], "imbalanced-learn"),
])
def test_classifier_without_tabular_extra_names_the_extra(method, blocked, distribution):
    code = f"""
from hpc_agent.config.load import build_config
from hpc_agent.core.extras import MissingExtra
from launch.workloads.registry import build_workload
cfg = build_config([{{"train": {{"workload": "classifier"}}, "data": {{"num_samples": 200, "imbalance_method": "{method}"}}}}])
try:
    build_workload(cfg)
except MissingExtra as exc:
    print(exc)
    sys.exit(2)
"""
    result = run_without_extras(code, blocked)
    assert result.returncode == 2, result.stdout + result.stderr
    message = result.stdout.strip()
    assert "\n" not in message
    assert message.startswith("the classifier workload")
    assert f"needs {distribution}, which is not installed: pip install 'hpc_agent[tabular]'" in message


def test_gpt_workload_needs_no_extra():
    result = run_without_extras("from hpc_agent.config.load import build_config\n"
                                "from launch.workloads.registry import build_workload\n"
                                "cfg = build_config([{'train': {'workload': 'gpt'}, 'model': {'n_layers': 1, "
                                "'d_model': 32, 'n_heads': 2, 'seq_len': 16}}])\n"
                                "print(type(build_workload(cfg)).__name__)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "GPTWorkload"


@pytest.mark.parametrize("entry", ["hpc_agent.sweep", "hpc_agent"])
def test_sweep_cli_without_sweep_extra_exits_2_with_one_line(entry):
    args = ["quickstart", str(REPO / "configs" / "sweep_classifier.yaml"), "--dry-run"]
    if entry == "hpc_agent":
        args = ["sweep"] + args
    code = f"import runpy\nsys.argv = ['x'] + {args!r}\nrunpy.run_module({entry!r}, run_name='__main__')"
    result = run_without_extras(code, ["optuna"])
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip() == ("python -m hpc_agent.sweep needs optuna, which is not installed: "
                                     "pip install 'hpc_agent[sweep]'")


def test_require_lets_other_import_errors_through(monkeypatch):
    """Only a missing top-level package is a missing extra; an installed package's own failure is not."""
    from hpc_agent.core.extras import MissingExtra, require

    monkeypatch.setitem(sys.modules, "json.no_such_submodule", None)
    with pytest.raises(ModuleNotFoundError) as caught:
        require("json.no_such_submodule", "sweep", "x")
    assert not isinstance(caught.value, MissingExtra)
    assert require("json", "sweep", "x") is sys.modules["json"]


# --- constraints.txt ------------------------------------------------------------------------------------
def constraint_pins(path: Path) -> Dict[str, Version]:
    pins = {}
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        assert sep, f"constraints.txt: {raw!r} is not an exact name==version pin"
        pins[canonicalize_name(name)] = Version(version.strip())
    return pins


def pyproject_requirements() -> List[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        reqs += [Requirement(r) for r in extra]
    return [r for r in reqs if canonicalize_name(r.name) != canonicalize_name(project["name"])]


def test_constraints_pin_every_declared_dependency_within_its_bounds():
    pins = constraint_pins(REPO / "constraints.txt")
    for req in pyproject_requirements():
        name = canonicalize_name(req.name)
        assert name in pins, f"constraints.txt does not pin {req.name} (scripts/freeze_constraints.sh)"
        assert req.specifier.contains(pins[name], prereleases=True), \
            f"constraints.txt pins {req.name}=={pins[name]}, outside pyproject's {req}"
    assert "hpc-agent" not in pins  # the project itself is installed from the checkout, never pinned


def test_constraints_pin_the_torch_that_setup_installs():
    pins = constraint_pins(REPO / "constraints.txt")
    setup = (REPO / "scripts" / "setup.sh").read_text(encoding="utf-8")
    match = re.search(r"torch==([0-9.]+)", setup)
    assert match, "scripts/setup.sh names no torch==X pin"
    assert pins["torch"] == Version(match.group(1))

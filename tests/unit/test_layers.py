"""The house rules, as checks over the source of hpc_agent/ and launch/ (docs/install.md, "The checkout's layout").

1. No import cycles, between modules or between packages.
2. launch/ (the job) imports only the shared packages: core, config, slurm, diagnosis, metrics, policy.
3. The login side imports launch/ only at its bridges (:data:`BRIDGES`, each with its reason).
4. The top of hpc_agent/ holds only commands: the modules ``hpc-agent`` dispatches to.
5. Nothing below a command imports a command.
6. Login-side commands import no torch, numpy or deepspeed at module level, through any chain of imports.
7. One name per thing: no re-export shims (a first-party name imported and never used), no two modules with
   one file name, and package ``__init__`` files import nothing.
8. The pure core does no I/O.

Every rule is a function of a source tree, so each is also run on a planted violation in a small tree under
tmp_path and must report it. Imports inside functions count (they run too), except for rule 6, which is about
what importing a command costs.
"""
from __future__ import annotations

import ast
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("hpc_agent", "launch")
SHARED = ("core", "config", "slurm", "diagnosis", "metrics", "policy")
"""The torch-free packages both sides use: the only ones launch/ may import."""
BRIDGES = {
    "hpc_agent.jobs.submission": "hands launch.job's callable to submitit (job_for, training_job), inside functions",
    "hpc_agent.prepare": "builds, with the job's own loader (launch.ops), the DeepSpeed ops jobs load; it runs where "
                         "the jobs run (srun --gpus=1 hpc-agent prepare) and imports torch on purpose",
}
"""The only login-side modules that import launch/, and why."""
HEAVY = ("torch", "numpy", "deepspeed")
PURE_CORE = {"hpc_agent.watcher.follow", "hpc_agent.watcher.follow_hang", "hpc_agent.watcher.follow_model",
             "hpc_agent.state.lifecycle", "hpc_agent.policy.decide", "hpc_agent.policy.memory",
             "hpc_agent.policy.partitions", "hpc_agent.policy.adaptive_lr", "hpc_agent.slurm.job_match",
             "hpc_agent.slurm.sacct", "hpc_agent.slurm.sacct_read", "hpc_agent.slurm.sacct_json",
             "hpc_agent.slurm.hostlist", "hpc_agent.slurm.attempt_cache", "hpc_agent.slurm.timelimit", "hpc_agent.slurm.usr2",
             "hpc_agent.core.heartbeat_format", "hpc_agent.core.causes", "hpc_agent.core.exit_codes",
             "hpc_agent.diagnosis.hang", "hpc_agent.diagnosis.classify", "hpc_agent.diagnosis.logscan",
             "hpc_agent.diagnosis.local_job",
             "hpc_agent.metrics.alarm_kinds", "hpc_agent.metrics.divergence", "hpc_agent.watcher.notify_events",
             "hpc_agent.runs.goodput"}
IO_MODULES = {"subprocess", "sqlite3", "socket", "shutil"}
IO_PREFIXES = ("hpc_agent.slurm.cli", "hpc_agent.state.ledger", "hpc_agent.state.journal", "hpc_agent.state.killswitch",
               "hpc_agent.watcher.loop", "hpc_agent.watcher.effects", "hpc_agent.watcher.observe", "hpc_agent.jobs")


# --- the source tree as data ---------------------------------------------------------------------------------
@dataclass
class Module:
    name: str
    path: Path
    tree: ast.Module
    imports: List[Tuple[str, int, bool]] = field(default_factory=list)
    """(first-party module imported, line, at module level) for every import statement, functions included."""
    external: List[Tuple[str, int, bool]] = field(default_factory=list)
    """(top-level name of a third-party or stdlib module, line, at module level)."""


class Tree:
    """The first-party modules under ``root`` and who imports whom (``from P import m`` where ``P.m`` is a module
    imports ``P`` and ``P.m``; ``import a.b.c`` imports the longest module prefix)."""

    def __init__(self, root: Path):
        self.root = root
        self.modules: Dict[str, Module] = {}
        for top in ROOTS:
            for path in sorted((root / top).rglob("*.py")):
                parts = list(path.relative_to(root).with_suffix("").parts)
                name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
                self.modules[name] = Module(name, path, ast.parse(path.read_text(encoding="utf-8"), str(path)))
        for mod in self.modules.values():
            self._read_imports(mod)

    def _resolve(self, dotted: str) -> Optional[str]:
        while dotted and dotted not in self.modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    def _read_imports(self, mod: Module) -> None:
        is_pkg = mod.path.name == "__init__.py"

        def visit(node: ast.AST, top: bool) -> None:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    self._add(mod, alias.name, node.lineno, top, exact=False)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = mod.name.split(".")[: len(mod.name.split(".")) - (0 if is_pkg else 1)]
                    parts = parts[: len(parts) - (node.level - 1)]
                    base = ".".join(parts + ([node.module] if node.module else []))
                self._add(mod, base, node.lineno, top, exact=False)
                for alias in node.names:
                    if f"{base}.{alias.name}" in self.modules:
                        self._add(mod, f"{base}.{alias.name}", node.lineno, top, exact=True)
            inside = not top or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) or (
                isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
            for child in ast.iter_child_nodes(node):
                visit(child, not inside)

        visit(mod.tree, True)

    def _add(self, mod: Module, dotted: str, line: int, top: bool, exact: bool) -> None:
        first = dotted.split(".")[0]
        if first not in ROOTS:
            mod.external.append((first, line, top))
            return
        target = dotted if exact else self._resolve(dotted)
        if target and target != mod.name:
            mod.imports.append((target, line, top))

    def edges(self, module_level_only: bool = False) -> Dict[str, Set[str]]:
        return {m.name: {t for t, _, top in m.imports if top or not module_level_only} for m in self.modules.values()}

    # --- what the rules need to know -------------------------------------------------------------------------
    def commands(self) -> Set[str]:
        """The modules ``hpc-agent`` dispatches to (``COMMANDS`` in hpc_agent/__main__.py: a module at the top, or
        a package's ``__main__``), every other package ``__main__`` (``python -m hpc_agent.chaos``) and the front
        door itself."""
        found = {"hpc_agent.__main__"} | {m for m in self.modules if m.endswith(".__main__")}
        for name in front_door_commands(self.modules["hpc_agent.__main__"].tree):
            found.add(f"hpc_agent.{name}" if f"hpc_agent.{name}" in self.modules
                      and not self.modules[f"hpc_agent.{name}"].path.name == "__init__.py"
                      else f"hpc_agent.{name}.__main__")
        return found & set(self.modules)

    def package_of(self, name: str) -> str:
        """Packages are the nodes of the package graph; a command is a node of its own."""
        if name in self.commands():
            return name
        parts = name.split(".")
        if parts[0] == "launch":
            return "launch"
        return ".".join(parts[:2]) if len(parts) > 1 else parts[0]


def front_door_commands(tree: ast.Module) -> List[str]:
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "COMMANDS" for t in targets) and isinstance(node.value, ast.Dict):
                return [k.value for k in node.value.keys if isinstance(k, ast.Constant)]
    raise AssertionError("hpc_agent/__main__.py has no COMMANDS dict")


def strongly_connected(edges: Dict[str, Set[str]]) -> List[List[str]]:
    """The cycles: strongly connected components of more than one node (iterative Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    on_stack: Set[str] = set()
    stack: List[str] = []
    found: List[List[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work: List[Tuple[str, Iterator[str]]] = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


# --- the rules: each returns its violations, one line each -------------------------------------------------------
def module_cycles(tree: Tree) -> List[str]:
    return [" <-> ".join(c) for c in strongly_connected(tree.edges())]


def package_cycles(tree: Tree) -> List[str]:
    graph: Dict[str, Set[str]] = {}
    for src, targets in tree.edges().items():
        a = tree.package_of(src)
        graph.setdefault(a, set()).update(b for b in map(tree.package_of, targets) if b != a)
    out = []
    for cycle in strongly_connected(graph):
        why = [f"{s} -> {t}" for s, ts in sorted(tree.edges().items()) for t in sorted(ts)
               if tree.package_of(s) in cycle and tree.package_of(t) in cycle and tree.package_of(s) != tree.package_of(t)]
        out.append(f"{' <-> '.join(cycle)} ({'; '.join(why[:6])})")
    return out


def _modules(tree: Tree, only: Optional[str]) -> List[Module]:
    return [m for m in tree.modules.values() if only is None or m.name == only]


def launch_imports_only_shared(tree: Tree, only: Optional[str] = None) -> List[str]:
    allowed = ("hpc_agent",) + tuple(f"hpc_agent.{p}" for p in SHARED)
    return [f"{m.path.relative_to(tree.root)}:{line}: imports {target}" for m in _modules(tree, only)
            if m.name.split(".")[0] == "launch" for target, line, _ in m.imports
            if target.startswith("hpc_agent") and not (target in allowed or target.startswith(tuple(a + "." for a in allowed[1:])))]


def login_side_imports_launch_only_at_bridges(tree: Tree, only: Optional[str] = None) -> List[str]:
    return [f"{m.path.relative_to(tree.root)}:{line}: imports {target} (bridges: {sorted(BRIDGES)})"
            for m in _modules(tree, only) if m.name.split(".")[0] == "hpc_agent" and m.name not in BRIDGES
            for target, line, _ in m.imports if target.split(".")[0] == "launch"]


def top_holds_only_commands(tree: Tree) -> List[str]:
    commands = tree.commands()
    return [f"hpc_agent/{m.path.name} is not a command (hpc_agent/__main__.py's COMMANDS): move it into a package"
            for m in tree.modules.values() if m.path.parent == tree.root / "hpc_agent"
            and m.path.name != "__init__.py" and m.name not in commands]


def nothing_below_a_command_imports_one(tree: Tree, only: Optional[str] = None) -> List[str]:
    commands = tree.commands()
    return [f"{m.path.relative_to(tree.root)}:{line}: imports the command {target}" for m in _modules(tree, only)
            if m.name not in commands for target, line, _ in m.imports if target in commands]


def commands_import_nothing_heavy(tree: Tree, heavy: Tuple[str, ...] = HEAVY) -> List[str]:
    edges = tree.edges(module_level_only=True)
    out = []
    for command in sorted(tree.commands()):
        parent: Dict[str, str] = {}
        seen, todo = {command}, [command]
        while todo:
            node = todo.pop()
            for nxt in sorted(edges[node]):
                if nxt not in seen:
                    seen.add(nxt)
                    parent[nxt] = node
                    todo.append(nxt)
        for name in sorted(seen):
            for lib, line, top in tree.modules[name].external:
                if top and lib in heavy:
                    chain = [name]
                    while chain[-1] in parent:
                        chain.append(parent[chain[-1]])
                    out.append(f"{command} imports {lib} at module level: {' <- '.join(chain)} "
                               f"({tree.modules[name].path.relative_to(tree.root)}:{line})")
    return out


def _used_names(module: ast.Module) -> Set[str]:
    used: Set[str] = set()
    for node in ast.walk(module):
        if isinstance(node, ast.Name):
            used.add(node.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.replace(".", "").isidentifier():
            used.add(node.value.split(".")[0])  # a string annotation ("ssh.Remote") or an __all__ entry
    return used


def no_reexport_shims(tree: Tree, only: Optional[str] = None) -> List[str]:
    out = []
    for m in _modules(tree, only):
        if m.path.name == "__init__.py":
            out += [f"{m.path.relative_to(tree.root)}:{node.lineno}: a package __init__ imports (re-exports) "
                    f"{ast.unparse(node)!r}: import from the module itself" for node in m.tree.body
                    if isinstance(node, (ast.Import, ast.ImportFrom)) and not (
                        isinstance(node, ast.ImportFrom) and node.module == "__future__")]
            continue
        used = _used_names(m.tree)
        for node in ast.walk(m.tree):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] in ROOTS):
                for alias in node.names:
                    local = alias.asname or alias.name
                    if local not in used:
                        out.append(f"{m.path.relative_to(tree.root)}:{node.lineno}: imports {local} from "
                                   f"{node.module} and never uses it (an alias kept for others?): import it from "
                                   "its home where it is needed")
    return out


def no_two_modules_share_a_name(tree: Tree) -> List[str]:
    names = Counter(m.path.name for m in tree.modules.values() if m.path.name not in ("__init__.py", "__main__.py"))
    return [f"{n}: {', '.join(sorted(str(m.path.relative_to(tree.root)) for m in tree.modules.values() if m.path.name == n))}"
            for n, count in sorted(names.items()) if count > 1]


def pure_core_does_no_io(tree: Tree, pure: Set[str] = PURE_CORE, only: Optional[str] = None) -> List[str]:
    out = []
    for name in sorted(n for n in pure if only is None or n == only):
        m = tree.modules.get(name)
        if m is None:
            out.append(f"{name}: listed as pure core but not found")
            continue
        out += [f"{name}:{line}: imports {lib}" for lib, line, _ in m.external if lib in IO_MODULES]
        out += [f"{name}:{line}: imports {target}" for target, line, _ in m.imports if target.startswith(IO_PREFIXES)]
    return out


WHOLE_TREE_RULES = [module_cycles, package_cycles, top_holds_only_commands, commands_import_nothing_heavy,
                    no_two_modules_share_a_name]
MODULE_RULES = [launch_imports_only_shared, login_side_imports_launch_only_at_bridges,
                nothing_below_a_command_imports_one, no_reexport_shims, pure_core_does_no_io]
"""Rules about one module's own imports: checked module by module, so a failure names the module."""
RULES = WHOLE_TREE_RULES + MODULE_RULES
REPO_TREE = Tree(REPO)


@pytest.mark.parametrize("rule", WHOLE_TREE_RULES, ids=lambda r: r.__name__)
def test_the_checkout_keeps_the_rule(rule):
    problems = rule(REPO_TREE)
    assert problems == [], f"{rule.__name__}:\n" + "\n".join(problems)


@pytest.mark.parametrize("module", sorted(REPO_TREE.modules))
def test_each_module_keeps_the_rules_about_its_imports(module):
    problems = [p for rule in MODULE_RULES for p in rule(REPO_TREE, only=module)]
    assert problems == [], "\n".join(problems)


def test_the_tree_is_read_whole():
    """A rule that sees nothing passes for the wrong reason: the walk must find the packages and the commands."""
    repo_tree = REPO_TREE
    assert len(repo_tree.modules) > 150
    packages = {repo_tree.package_of(m) for m in repo_tree.modules}
    assert {f"hpc_agent.{p}" for p in SHARED} | {"launch", "hpc_agent.state", "hpc_agent.watcher"} <= packages
    assert {"hpc_agent.submit", "hpc_agent.watch", "hpc_agent.sweep.__main__", "hpc_agent.config.__main__",
            "hpc_agent.chaos.__main__"} <= repo_tree.commands()
    assert any(t == "hpc_agent.core.rundir" for t, _, _ in repo_tree.modules["launch.engine"].imports)
    assert set(BRIDGES) | PURE_CORE <= set(repo_tree.modules), "a bridge or a pure-core module was renamed: update the lists"


# --- each rule on a planted violation ----------------------------------------------------------------------------
def plant(root: Path, files: Dict[str, str]) -> Tree:
    """A small clean tree plus ``files`` (path -> source; "" deletes nothing, it writes an empty module)."""
    base = {
        "hpc_agent/__init__.py": '"""pkg"""\n',
        "hpc_agent/__main__.py": 'COMMANDS = {"submit": "submit", "sweep": "sweeps"}\n',
        "hpc_agent/submit.py": "from hpc_agent.core import a\n\n\ndef main():\n    return a.VALUE\n",
        "hpc_agent/sweep/__init__.py": '"""sweeps"""\n',
        "hpc_agent/sweep/__main__.py": "from hpc_agent.core.b import helper\n\nhelper()\n",
        "hpc_agent/core/__init__.py": '"""core"""\n',
        "hpc_agent/core/a.py": "VALUE = 1\n",
        "hpc_agent/core/b.py": "from hpc_agent.core.a import VALUE\n\n\ndef helper():\n    return VALUE\n",
        "hpc_agent/state/__init__.py": '"""state"""\n',
        "hpc_agent/state/ledger.py": "import sqlite3\n\nfrom hpc_agent.core.a import VALUE\n\nDB = (sqlite3, VALUE)\n",
        "hpc_agent/jobs/__init__.py": '"""jobs"""\n',
        "hpc_agent/jobs/submission.py": "def job_for():\n    from launch.train import main\n\n    return main\n",
        "launch/__init__.py": '"""job"""\n',
        "launch/train.py": "import torch\n\nfrom hpc_agent.core.b import helper\n\n\ndef main():\n    return torch, helper\n",
    }
    base.update(files)
    for rel, text in base.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return Tree(root)


PLANTED = {
    "module_cycles": ({"hpc_agent/core/a.py": "VALUE = 1\n\n\ndef late():\n    from hpc_agent.core import b\n\n"
                                              "    return b\n"}, "hpc_agent.core.a <-> hpc_agent.core.b"),
    "package_cycles": ({"hpc_agent/core/a.py": "VALUE = 1\n\n\ndef later():\n    from hpc_agent.state.ledger import DB\n\n"
                                               "    return DB\n"}, "hpc_agent.core <-> hpc_agent.state"),
    "launch_imports_only_shared": ({"launch/train.py": "def main():\n    from hpc_agent.state.ledger import DB\n\n"
                                                      "    return DB\n"}, "imports hpc_agent.state.ledger"),
    "login_side_imports_launch_only_at_bridges": ({"hpc_agent/core/a.py": "VALUE = 1\n\n\ndef run():\n"
                                                                          "    from launch import train\n\n"
                                                                          "    return train\n"},
                                                  "hpc_agent/core/a.py:5: imports launch.train"),
    "top_holds_only_commands": ({"hpc_agent/helpers.py": "X = 1\n"}, "hpc_agent/helpers.py is not a command"),
    "nothing_below_a_command_imports_one": ({"hpc_agent/core/a.py": "VALUE = 1\n\n\ndef f():\n"
                                                                    "    from hpc_agent import submit\n\n"
                                                                    "    return submit\n"},
                                            "imports the command hpc_agent.submit"),
    "commands_import_nothing_heavy": ({"hpc_agent/core/a.py": "import numpy\n\nVALUE = numpy.float64(1)\n"},
                                      "hpc_agent.submit imports numpy at module level: hpc_agent.core.a <- "
                                      "hpc_agent.submit"),
    "no_reexport_shims": ({"hpc_agent/core/b.py": "from hpc_agent.core.a import VALUE\n"},
                          "imports VALUE from hpc_agent.core.a and never uses it"),
    "no_two_modules_share_a_name": ({"launch/a.py": "X = 1\n"}, "a.py: hpc_agent/core/a.py, launch/a.py"),
    "pure_core_does_no_io": ({"hpc_agent/core/a.py": "import subprocess\n\nVALUE = subprocess.PIPE\n"},
                             "hpc_agent.core.a:1: imports subprocess"),
}


def test_every_rule_has_a_planted_violation():
    assert sorted(PLANTED) == sorted(r.__name__ for r in RULES)


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.__name__)
def test_the_rule_passes_a_clean_tree_and_reports_a_planted_violation(rule, tmp_path):
    kwargs = {"pure": {"hpc_agent.core.a", "hpc_agent.core.b"}} if rule is pure_core_does_no_io else {}
    assert rule(plant(tmp_path / "clean", {}), **kwargs) == []
    files, expected = PLANTED[rule.__name__]
    problems = rule(plant(tmp_path / "planted", files), **kwargs)
    assert any(expected in p for p in problems), problems


def test_an_import_at_module_level_of_a_heavy_library_counts_only_there(tmp_path):
    """Rule 6 is about import time: torch inside a function of a login-side module is fine, at its top it is not."""
    lazy = {"hpc_agent/core/a.py": "VALUE = 1\n\n\ndef gpu():\n    import torch\n\n    return torch\n"}
    assert commands_import_nothing_heavy(plant(tmp_path / "lazy", lazy)) == []
    eager = {"hpc_agent/core/b.py": "import torch\n\nfrom hpc_agent.core.a import VALUE\n\n\ndef helper():\n"
                                    "    return VALUE, torch\n"}
    assert commands_import_nothing_heavy(plant(tmp_path / "eager", eager)) == [
        "hpc_agent.sweep.__main__ imports torch at module level: hpc_agent.core.b <- hpc_agent.sweep.__main__ "
        "(hpc_agent/core/b.py:1)"]


# --- the tests follow the same map -------------------------------------------------------------------------------
TEST_DIRS = ("unit", "job", "cluster", "security")
JOB_HELPERS = ("helpers.common", "tests.helpers.common", "helpers.runner", "tests.helpers.runner")
"""Test helpers that start the training job."""


def _heavy_at_import(tree: Tree) -> Set[str]:
    """First-party modules that import torch or deepspeed when imported (at their top, through any chain)."""
    edges = tree.edges(module_level_only=True)
    heavy = {m.name for m in tree.modules.values() if any(lib in ("torch", "deepspeed") and top for lib, _, top in m.external)}
    grew = True
    while grew:
        grew = False
        for name, targets in edges.items():
            if name not in heavy and targets & heavy:
                heavy.add(name)
                grew = True
    return heavy


def misplaced_tests(tests_root: Path, tree: Tree) -> List[str]:
    """tests/unit and tests/security: no Slurm, no torch or DeepSpeed (imported or reached), no job started;
    tests/job: no Slurm; tests/cluster: every file needs the real cluster; no test file outside the four."""
    out = [f"{p.relative_to(tests_root.parent)}: a test outside tests/{{{','.join(TEST_DIRS)}}}"
           for p in sorted(tests_root.glob("test_*.py"))]
    heavy = _heavy_at_import(tree)
    for kind in TEST_DIRS:
        for path in sorted((tests_root / kind).glob("test_*.py")):
            rel = path.relative_to(tests_root.parent)
            source = path.read_text(encoding="utf-8")
            parsed = ast.parse(source, str(path))
            slurm = any(isinstance(n, ast.Attribute) and n.attr == "slurm" and isinstance(n.value, ast.Attribute)
                        and n.value.attr == "mark" for n in ast.walk(parsed))
            if kind == "cluster" and not slurm:
                out.append(f"{rel}: nothing in it needs the cluster (no pytest.mark.slurm): tests/unit or tests/job")
            if kind != "cluster" and slurm:
                out.append(f"{rel}: a slurm test outside tests/cluster")
            if kind not in ("unit", "security"):
                continue
            for node in ast.walk(parsed):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                         if isinstance(node, ast.ImportFrom) and node.module else [])
                for name in names:
                    if name.split(".")[0] in ("torch", "deepspeed") or name in heavy or name in JOB_HELPERS:
                        out.append(f"{rel}:{node.lineno}: imports {name} (torch, DeepSpeed or the job): tests/job")
                        break
    return out


def test_the_misplaced_tests():
    problems = misplaced_tests(REPO / "tests", REPO_TREE)
    assert problems == [], "\n".join(problems)
    assert all(any((REPO / "tests" / kind).glob("test_*.py")) for kind in TEST_DIRS)


def test_test_file_names_are_unique_across_the_folders():
    """The test folders are not packages: pytest imports each test file by its base name, so two files of one
    name (tests/unit/test_x.py and tests/job/test_x.py) stop the whole run at collection ("import file
    mismatch"), and only the run that collects both folders (CI's) sees it."""
    seen: dict = {}
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        seen.setdefault(path.name, []).append(str(path.relative_to(REPO)))
    assert {name: where for name, where in seen.items() if len(where) > 1} == {}


@pytest.mark.parametrize("where, source, expected", [
    ("test_loose.py", "def test_x():\n    pass\n", "tests/test_loose.py: a test outside"),
    ("unit/test_t.py", "def test_x():\n    import torch\n", "tests/unit/test_t.py:2: imports torch"),
    ("unit/test_t.py", "from launch.train import main\n", "tests/unit/test_t.py:1: imports launch.train"),
    ("unit/test_t.py", "from helpers.common import run\n", "tests/unit/test_t.py:1: imports helpers.common"),
    ("security/test_t.py", "import deepspeed\n", "tests/security/test_t.py:1: imports deepspeed"),
    ("security/test_t.py", "import pytest\n\npytestmark = pytest.mark.slurm\n", "a slurm test outside"),
    ("unit/test_t.py", "import pytest\n\n\n@pytest.mark.slurm\ndef test_x():\n    pass\n", "a slurm test outside"),
    ("job/test_t.py", "import pytest\n\npytestmark = pytest.mark.slurm\n", "a slurm test outside"),
    ("cluster/test_t.py", "def test_x():\n    pass\n", "nothing in it needs the cluster"),
])
def test_the_tests_map_reports_a_planted_misplaced_test(tmp_path, where, source, expected):
    tree = plant(tmp_path / "src", {})
    tests = tmp_path / "tests"
    for kind in TEST_DIRS:
        (tests / kind).mkdir(parents=True)
    (tests / "cluster" / "test_ok.py").write_text("import pytest\n\npytestmark = pytest.mark.slurm\n")
    (tests / "unit" / "test_ok.py").write_text("from hpc_agent.core.b import helper\n")
    assert misplaced_tests(tests, tree) == []
    (tests / where).write_text(source)
    problems = misplaced_tests(tests, tree)
    assert any(expected in p for p in problems), problems

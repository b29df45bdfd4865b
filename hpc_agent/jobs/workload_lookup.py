"""Where ``train.workload: pkg.mod:build`` leads, found at submit without running a line of your code.

The job imports ``pkg.mod`` and looks up ``build`` (``launch/workloads/user.py``); a typo there used to show
only after the wait in the queue. Submit follows the same path on the file system instead:

* ``pkg`` is found as the snapshot finds it (``code_snapshot.find_top_level``: the submit's folder, then
  sys.path; nothing imported);
* each further part through its parent package's ``__path__`` (``PathFinder.find_spec`` on those folders:
  a file looked up, no ``__init__`` executed), so ``pkg.modle`` is refused naming ``pkg.model``;
* ``build`` in the module's source, parsed (``ast``), never executed: a top-level ``def``, ``class``,
  assignment or import of that name. Where the source decides its names at run time (``import *``, a module
  ``__getattr__``, ``globals()``), or a package rewrites its ``__path__`` or ``sys.modules``, the check says it
  cannot tell and refuses nothing.

It applies where it looks at what the job will import: the snapshot (``train.snapshot_code``, the default:
the job imports the copy of the folder found here), or, imported live, the same folders with the same Python
and no container. Elsewhere it says why it did not look. Problems use the job's own words
(``hpc_agent.config.user_code``).
"""
from __future__ import annotations

import ast
import os
import pkgutil
import sys
from dataclasses import dataclass, field
from importlib.machinery import ModuleSpec, PathFinder
from pathlib import Path
from typing import Any, List, Mapping, Optional, Sequence, Set, Tuple

from hpc_agent.config.problems import Problem
from hpc_agent.config.user_code import (is_reference, missing_callable, missing_package,
                                        missing_submodule)
from hpc_agent.jobs.code_snapshot import find_top_level

KEY = "train.workload"
MAX_SOURCE_BYTES = 4 << 20
# Source that sets a package's path or module table at run time: its submodules cannot be told from its folders.
_DYNAMIC_PATH = ("__path__", "sys.modules", "meta_path", "path_hooks")
_DYNAMIC_CALLS = ("globals", "setattr", "exec", "vars", "locals")


@dataclass
class Lookup:
    """What submit found: ``problems`` (each refuses the submit), and one line for the dry-run."""

    problems: List[Problem] = field(default_factory=list)
    detail: str = ""


# ---- reading a module's source (never running it) -----------------------------------------------------------
def _source(path: Optional[str]) -> Optional[str]:
    """A ``.py`` file's text (None: not a readable source file, e.g. an extension module)."""
    if not path or not str(path).endswith(".py"):
        return None
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_SOURCE_BYTES + 1)
    except OSError:
        return None
    return None if len(data) > MAX_SOURCE_BYTES else data.decode("utf-8", errors="replace")


def _targets(node: ast.AST) -> List[str]:
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, (ast.Tuple, ast.List)):
        return [name for elt in node.elts for name in _targets(elt)]
    if isinstance(node, ast.Starred):
        return _targets(node.value)
    return []


def top_level_names(tree: ast.Module) -> Optional[Set[str]]:
    """The names a module defines when its body runs, read from its syntax tree (None: it decides some at run
    time, through ``from x import *``, a module-level ``__getattr__`` or ``globals()``/``setattr``)."""
    names: Set[str] = set()

    def visit(body: Sequence[ast.stmt]) -> bool:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if node.name == "__getattr__":
                    return False
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                names.update(n for target in node.targets for n in _targets(target))
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                names.update(_targets(node.target))
            elif isinstance(node, (ast.For, ast.AsyncFor)):
                names.update(_targets(node.target))
                if not visit(node.body) or not visit(node.orelse):
                    return False
            elif isinstance(node, ast.Import):
                names.update(a.asname or a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if any(a.name == "*" for a in node.names):
                    return False
                names.update(a.asname or a.name for a in node.names)
            elif isinstance(node, (ast.If, ast.While)):
                if not visit(node.body) or not visit(node.orelse):
                    return False
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                names.update(n for item in node.items if item.optional_vars for n in _targets(item.optional_vars))
                if not visit(node.body):
                    return False
            elif type(node).__name__ == "Match":  # names bound by patterns: not worth telling apart
                return False
            elif isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
                handlers = [h.body for h in getattr(node, "handlers", [])]
                names.update(h.name for h in getattr(node, "handlers", []) if h.name)
                for part in [node.body, node.orelse, node.finalbody, *handlers]:  # type: ignore[attr-defined]
                    if not visit(part):
                        return False
        return True

    if not visit(tree.body):
        return None
    for node in _module_level(tree):  # names made by calls: globals()[...] = ..., setattr(sys.modules[...], ...)
        if isinstance(node, ast.NamedExpr):
            names.update(_targets(node.target))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _DYNAMIC_CALLS:
            return None
    return names


def _module_level(tree: ast.Module):
    """Every node that runs when the module body runs: function, class and lambda bodies left out
    (a ``setattr(self, ...)`` in a method makes no module name)."""
    todo: List[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            todo.extend(getattr(node, "decorator_list", []))
            continue
        if isinstance(node, ast.ClassDef):
            todo.extend(node.decorator_list + node.bases)
            continue
        todo.extend(ast.iter_child_nodes(node))


# ---- following the reference --------------------------------------------------------------------------------
def _where(spec: ModuleSpec) -> str:
    locations = list(spec.submodule_search_locations or [])
    return ", ".join(map(str, locations)) if locations else str(spec.origin or "?")


def _rewrites_path(spec: ModuleSpec) -> bool:
    """A package whose ``__init__`` changes its ``__path__`` or the module table: its folders are not the whole story."""
    text = _source(spec.origin)
    return text is not None and any(word in text for word in _DYNAMIC_PATH)


def _follow(ref: str, spec: ModuleSpec) -> Tuple[Optional[ModuleSpec], List[Problem], str]:
    """From the top-level package's spec to the reference's module, part by part through each ``__path__``:
    its spec, or the problem, or (None, [], why it cannot be told)."""
    parts = ref.partition(":")[0].split(".")
    for i in range(1, len(parts)):
        parent, name = ".".join(parts[:i]), parts[i]
        locations = spec.submodule_search_locations
        if locations is None:
            return None, [Problem(KEY, ref, missing_submodule(ref, parent, _where(spec), name, None))], ""
        if _rewrites_path(spec):
            return None, [], f"not checked past {parent}: its __init__.py sets its path at run time"
        found = PathFinder.find_spec(f"{parent}.{name}", [str(p) for p in locations])
        if found is None:
            siblings = [m.name for m in pkgutil.iter_modules([str(p) for p in locations])]
            return None, [Problem(KEY, ref, missing_submodule(ref, parent, _where(spec), name, siblings))], ""
        spec = found
    return spec, [], ""


def lookup(ref: str, cwd: Path, top_missing: bool = True, search: Optional[Sequence[str]] = None,
           same_python: bool = True) -> Lookup:
    """Follow ``pkg.mod:build`` as the job will import it (module docstring). ``pkg`` is looked up in ``cwd``
    then sys.path (``search``: in those folders alone); ``top_missing``: report a package found nowhere
    (False where another check reports it, or where the job may find it elsewhere); ``same_python``: the job
    runs this interpreter, so a syntax error here is one there."""
    module_name, _, attr_path = ref.partition(":")
    top_name = module_name.split(".")[0]
    top = find_top_level(top_name, Path(cwd)) if search is None else PathFinder.find_spec(top_name, list(search))
    if top is None:
        return Lookup([Problem(KEY, ref, missing_package(ref, top_name))] if top_missing else [], "")
    spec, problems, why = _follow(ref, top)
    if spec is None:
        return Lookup(problems, why)
    first = attr_path.split(".")[0]
    origin = str(spec.origin) if spec.origin and spec.has_location else None
    text = _source(origin)
    if text is None:
        return Lookup([], f"{module_name} found ({_where(spec)}); {first!r} not checked (no Python source to read)")
    try:
        tree = ast.parse(text, filename=str(origin))
    except SyntaxError as exc:
        if not same_python:  # another Python may accept syntax this one does not
            return Lookup([], f"{module_name} found ({origin}); {first!r} not checked (this Python cannot parse it)")
        return Lookup([Problem(KEY, ref, f"a module that imports: {exc.filename}:{exc.lineno}: SyntaxError: "
                                         f"{exc.msg}; fix that line")], "")
    names = top_level_names(tree)
    if names is None:
        return Lookup([], f"{module_name} found ({origin}); {first!r} not checked (the module makes names at run time)")
    if spec.submodule_search_locations is not None:  # a package: its modules are attributes once imported
        names |= {m.name for m in pkgutil.iter_modules([str(p) for p in spec.submodule_search_locations])}
    if first not in names:
        return Lookup([Problem(KEY, ref, missing_callable(ref, str(origin), first, names))], "")
    return Lookup([], f"{module_name}:{first} found in {origin} (read, not run)")


def _job_python_is_this_one(cfg: Any) -> bool:
    python = cfg.slurm.python
    return not python or os.path.abspath(os.path.expanduser(str(python))) == os.path.abspath(sys.executable)


def check(cfg: Any, cwd: Path, environ: Mapping[str, str] = os.environ) -> Lookup:
    """Submit's check of ``train.workload`` (nothing to say for a built-in workload or a command). With the
    snapshot, a package found nowhere is the snapshot plan's problem (``code_snapshot.plan_for``)."""
    t = cfg.train
    if getattr(t, "command", None) or not is_reference(t.workload):
        return Lookup()
    ref = str(t.workload)
    same = cfg.container.runtime == "none" and _job_python_is_this_one(cfg)
    if t.snapshot_code:  # the job imports the copy of what is found here
        return lookup(ref, cwd, top_missing=False, same_python=same)
    if cfg.container.runtime != "none":
        return Lookup([], f"not checked: train.snapshot_code=false, and the job imports {ref} inside the "
                          f"{cfg.container.runtime} image, where submit cannot look")
    if same:  # the job's path: its working directory (this one), PYTHONPATH, this Python's packages
        return lookup(ref, cwd)
    # Another interpreter: only the folders both share (the working directory and PYTHONPATH) tell.
    search = [str(cwd)] + [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    found = lookup(ref, cwd, top_missing=False, search=search, same_python=False)
    if found.problems or found.detail:
        return found
    return Lookup([], f"not checked: {ref.partition(':')[0].split('.')[0]} is not in {cwd} or on PYTHONPATH; the "
                      f"job's slurm.python {cfg.slurm.python} may have it installed")

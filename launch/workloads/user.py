"""Your own workload: ``train.workload: package.module:build`` (docs/your_model.md).

Inside the job the reference is resolved here: import ``package.module``, look up the (possibly dotted)
callable, call it with ``(cfg, device)`` and check that what it returns follows the :class:`Workload`
protocol. Every failure becomes a :class:`WorkloadError` (a ``ConfigError`` on ``train.workload``) that
``launch/train.py`` reports as one ``[hpc_agent]`` line and exit code CONFIG: the fix is in the user's code
or PYTHONPATH, so the watcher must not retry it.
"""
from __future__ import annotations

import importlib
import pkgutil
import sys
import traceback
from typing import Any

from hpc_agent.config.problems import ConfigError, Problem
from hpc_agent.config.user_code import WORKLOAD_DOC as DOC
from hpc_agent.config.user_code import missing_callable, missing_package, missing_submodule


class WorkloadError(ConfigError):
    """``train.workload`` names code that cannot be imported, called, or does not return a Workload."""

    def __init__(self, ref: str, expected: str):
        super().__init__([Problem("train.workload", ref, expected)])

    def line(self) -> str:
        """The one log line: the problem and its fix."""
        return str(self.problems[0])


def _where(exc: BaseException) -> str:
    """``file:line`` of the innermost frame, so a failing build() points at the user's line."""
    frames = traceback.extract_tb(exc.__traceback__)
    return f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""


def _import(ref: str, module_name: str):
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # Only a missing module *of the reference* is a path problem; a dependency missing inside the
        # user's module is their environment, and its name says which package to install.
        parts = module_name.split(".")
        if exc.name == parts[0]:  # the package itself: where the job imports from
            raise WorkloadError(ref, missing_package(ref, parts[0])) from exc
        if exc.name in {".".join(parts[:i]) for i in range(2, len(parts) + 1)}:  # a module of a package found
            parent, _, name = exc.name.rpartition(".")
            found = sys.modules.get(parent)
            path = getattr(found, "__path__", None)
            where = ", ".join(map(str, path)) if path is not None else str(getattr(found, "__file__", "?"))
            siblings = [m.name for m in pkgutil.iter_modules(list(path))] if path is not None else None
            raise WorkloadError(ref, missing_submodule(ref, parent, where, name, siblings)) from exc
        raise WorkloadError(ref, f"a module that imports: importing {module_name!r} failed with "
                                 f"ModuleNotFoundError: {exc}{_where(exc)}; install that package in the job's "
                                 "environment") from exc
    except Exception as exc:  # noqa: BLE001 - any error in the user's module body
        raise WorkloadError(ref, f"a module that imports: importing {module_name!r} raised "
                                 f"{type(exc).__name__}: {exc}{_where(exc)}; fix that line") from exc


def check_workload(ref: str, workload: Any) -> None:
    """Raise WorkloadError unless ``workload`` follows the protocol (names every missing member)."""
    import torch

    from launch.workloads.common import Workload

    missing = [name for name in ("model", "tokens_per_sample", "batch", "loss", "evaluate")
               if not hasattr(workload, name)]
    not_callable = [name for name in ("batch", "loss", "evaluate")
                    if name not in missing and not callable(getattr(workload, name))]
    model_ok = isinstance(getattr(workload, "model", None), torch.nn.Module)
    if missing or not_callable or not model_ok or not isinstance(workload, Workload):
        what = []
        if missing:
            what.append("missing " + ", ".join(missing))
        if not_callable:
            what.append("not callable: " + ", ".join(not_callable))
        if "model" not in missing and not model_ok:
            what.append(f"model is a {type(getattr(workload, 'model')).__name__}, not a torch.nn.Module")
        raise WorkloadError(ref, f"a callable returning a Workload (model: nn.Module, tokens_per_sample: int, "
                                 f"batch(start, count), loss(model, batch), evaluate(model)); it returned a "
                                 f"{type(workload).__name__} ({'; '.join(what)}); see {DOC}")


def build_user_workload(ref: str, cfg: Any, device: Any):
    """Import ``module:callable``, call it with ``(cfg, device)`` and return its checked Workload."""
    module_name, _, attr_path = ref.partition(":")
    if not module_name or not attr_path:
        raise WorkloadError(ref, f"'package.module:callable', e.g. my_model.model:build; see {DOC}")
    module = _import(ref, module_name)
    target: Any = module
    for part in attr_path.split("."):
        if not hasattr(target, part):
            where = getattr(module, "__file__", None) or "?"
            raise WorkloadError(ref, missing_callable(ref, where, part, dir(target)))
        target = getattr(target, part)
    if not callable(target):
        raise WorkloadError(ref, f"a callable: {attr_path!r} in {module_name} is a {type(target).__name__}")
    try:
        workload = target(cfg, device)
    except Exception as exc:  # noqa: BLE001 - the user's build failed; say where, the job cannot train
        raise WorkloadError(ref, f"a build that succeeds: {attr_path}(cfg, device) raised {type(exc).__name__}: "
                                 f"{exc}{_where(exc)}") from exc
    check_workload(ref, workload)
    return workload

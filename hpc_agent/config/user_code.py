"""Config for running the user's own code: a workload named by ``module:callable``, a command, containers.

``train.workload`` and ``train.command`` live in ``TrainConfig``; this module holds their syntax checks and
the ``container:`` section. Every value here reaches the job script, so each has an allow-list
(``hpc_agent.config.fields``), and the renderer quotes it once (``hpc_agent.jobs.executor``).
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Iterable, List, Optional

from hpc_agent.config.checks import check_choice, raise_if
from hpc_agent.config.fields import char_name, path_problem
from hpc_agent.config.problems import Problem

BUILTIN_WORKLOADS = ("gpt", "classifier")
WORKLOAD_DOC = "docs/your_model.md"
# ``pkg.mod:build``: dotted Python identifiers, a colon, then the callable's (possibly dotted) name.
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
WORKLOAD_REF_RE = re.compile(rf"^{_IDENT}(\.{_IDENT})*:{_IDENT}(\.{_IDENT})*$")
RUNTIMES = ("none", "pyxis", "apptainer")
# Image references: registry hosts, paths, tags, digests and pyxis' ``registry#image`` form.
_IMAGE_CHARS = re.compile(r"[^A-Za-z0-9_.:/#@+=~-]")
COMMAND_MAX_ARGS = 256
ARG_MAX_LEN = 4096


def is_reference(workload: object) -> bool:
    """True for ``pkg.mod:callable`` (the user's code), False for the built-in workloads."""
    return str(workload) not in BUILTIN_WORKLOADS and ":" in str(workload)


def workload_problem(value: object) -> Optional[str]:
    """None when ``train.workload`` names a built-in workload or a ``module:callable`` reference."""
    text = str(value)
    if text in BUILTIN_WORKLOADS or WORKLOAD_REF_RE.match(text):
        return None
    return ("gpt, classifier, or your own as 'package.module:build' (an importable module and the callable "
            f"in it that returns a Workload; see {WORKLOAD_DOC})")


# ---- what is wrong with a reference, said the same way by submit (hpc_agent.jobs.workload_lookup) and the job
# (launch/workloads/user.py): which part is missing, and the reference that was probably meant ----------------
def close_name(name: str, candidates: Iterable[str]) -> Optional[str]:
    """The candidate closest to a mistyped ``name`` (None: none is close)."""
    close = difflib.get_close_matches(name, sorted(set(candidates) - {name}), n=1, cutoff=0.6)
    return close[0] if close else None


def missing_package(ref: str, top: str) -> str:
    """``pkg`` of ``pkg.mod:build`` is on no path the job imports from."""
    return (f"an importable module: {ref.partition(':')[0]!r} was not found (No module named {top!r}); submit from "
            "the folder that holds the package, or add its parent folder to PYTHONPATH (with "
            f"train.snapshot_code=false it must be on the job's PYTHONPATH too); see {WORKLOAD_DOC}")


def missing_submodule(ref: str, parent: str, where: str, name: str, siblings: Optional[Iterable[str]]) -> str:
    """``parent`` exists (at ``where``) but has no module ``name``; ``siblings`` are the modules it has
    (None: ``parent`` is a module, not a package)."""
    module_name, _, attr = ref.partition(":")
    if siblings is None:
        return (f"an importable module: {module_name!r} was not found: {parent!r} ({where}) is a module, not a "
                f"package, so it has no module {name!r}; fix the module path before ':'; see {WORKLOAD_DOC}")
    siblings = sorted(set(siblings))
    close = close_name(name, siblings)
    if close:
        rest = module_name[len(parent) + 1 + len(name):]  # the parts after the mistyped one, as given
        hint = f" (did you mean {parent}.{close}{rest}:{attr}?)"
    else:
        listed = ", ".join(siblings[:12]) + (", ..." if len(siblings) > 12 else "")
        hint = f" (its modules: {listed})" if siblings else " (it has no modules)"
    return (f"an importable module: {module_name!r} was not found: package {parent!r} ({where}) has no module "
            f"{name!r}; fix the module path before ':'{hint}")


def missing_callable(ref: str, where: str, part: str, names: Iterable[str]) -> str:
    """The module imports (or would), but has no ``part`` (the first missing name of the callable's path)."""
    module_name, _, attr_path = ref.partition(":")
    close = close_name(part, [n for n in names if not n.startswith("__")])
    hint = ""
    if close:
        fixed = ".".join(close if p == part else p for p in attr_path.split("."))
        hint = f" (did you mean {module_name}:{fixed}?)"
    return (f"a callable that exists: {module_name} ({where}) has no {attr_path!r} (no attribute {part!r}); "
            f"fix the name after ':'{hint}")


def command_problems(command: Optional[List[str]]) -> List[Problem]:
    """``train.command`` is an argv list: each word is passed as one argument, never through a shell."""
    if command is None:
        return []
    if not isinstance(command, (list, tuple)) or not command:
        return [Problem("train.command", command, "a non-empty list of words, e.g. [python, train.py, --lr, '3e-4']")]
    problems: List[Problem] = []
    if len(command) > COMMAND_MAX_ARGS:
        problems.append(Problem("train.command", f"{len(command)} words", f"at most {COMMAND_MAX_ARGS} words"))
    for i, word in enumerate(command):
        text = str(word)
        bad = next((ch for ch in text if ch == "\0" or (ord(ch) < 32 and ch != "\t")), None)
        if bad is not None:
            problems.append(Problem(f"train.command[{i}]", text, f"a word without control characters ({char_name(bad)})"))
        elif len(text) > ARG_MAX_LEN:
            problems.append(Problem(f"train.command[{i}]", text[:40] + "...", f"at most {ARG_MAX_LEN} characters"))
    if not str(command[0]).strip():
        problems.append(Problem("train.command[0]", command[0], "the program to run, e.g. python"))
    return problems


def image_problem(value: str) -> Optional[str]:
    fix = ("an image reference such as nvcr.io#nvidia/pytorch:24.05-py3, docker://ghcr.io/org/img:tag or "
           "/shared/images/pt.sif")
    if not value.strip():
        return f"{fix} (it is empty)"
    if value.startswith("-"):
        return f"{fix} (it starts with '-', which srun and apptainer would read as an option)"
    bad = _IMAGE_CHARS.search(value)
    if bad:
        return f"{fix} ({char_name(bad.group())} at position {bad.start()} is not allowed)"
    if len(value) > 1024:
        return f"{fix} (at most 1024 characters)"
    return None


def mount_problem(value: str) -> Optional[str]:
    """``SRC[:DST[:FLAGS]]``: paths without ',' or ':' (the separators of both runtimes' mount lists)."""
    fix = "a mount SRC[:DST[:FLAGS]], e.g. /scratch/me:/data:ro (paths without ',' or ':')"
    parts = value.split(":")
    if "," in value or not 1 <= len(parts) <= 3 or not all(p.startswith("/") for p in parts[:2]):
        return fix + " (SRC and DST are absolute paths)"
    for part in parts[:2]:
        why = path_problem(part, sbatch=False)
        if why:
            return f"{fix}: {why}"
    if len(parts) == 3 and not re.match(r"^[a-z,+-]*$", parts[2]):
        return f"{fix} (flags are letters such as ro, rw)"
    return None


@dataclass
class ContainerConfig:
    """Run the training tasks inside a container image (pyxis/enroot or Apptainer)."""

    runtime: str = "none"
    """``none`` (the job runs on the node's own environment), ``pyxis`` (``srun --container-image``; needs
    the pyxis plugin on the cluster) or ``apptainer`` (``apptainer exec --nv IMAGE python ...``). pyxis and
    apptainer use ``sbatch_templates/pyxis.yaml`` or ``apptainer.yaml`` unless ``slurm.template`` names
    another template than ``default``. Needs the slurm executor."""

    image: Optional[str] = None
    """The image. pyxis: ``registry.example.com#team/train:py3.11`` (registry ``#`` image) or a squashfs path;
    Apptainer: a ``.sif`` path or ``docker://...``. The image must have torch, DeepSpeed and hpc_agent's other
    dependencies installed for a Python of the login node's minor version; hpc_agent's own code comes from
    the run directory (see docs/containers.md)."""

    mounts: List[str] = field(default_factory=list)
    """Host paths to mount, each ``SRC[:DST[:FLAGS]]`` (absolute paths). The run directory (holding hpc_agent's
    code, ``lib/``, and your code snapshot, ``code/``) and, for pyxis without ``workdir``, the directory you
    submit from are always mounted at the same path, so the job finds them where the login node put them."""

    workdir: Optional[str] = None
    """Working directory inside the container (an absolute path); None: the directory you submitted from."""

    python: str = "python"
    """The container's Python interpreter (the job runs it, never the login node's ``sys.executable``)."""

    def problems(self) -> List[Problem]:
        problems: List[Problem] = []
        check_choice("container.runtime", self.runtime, RUNTIMES, problems)
        if self.runtime != "none" and not self.image:
            problems.append(Problem("container.image", self.image, f"an image for container.runtime={self.runtime} "
                                    "(or set container.runtime=none)"))
        if self.image is not None and (why := image_problem(str(self.image))):
            problems.append(Problem("container.image", self.image, why))
        for i, mount in enumerate(self.mounts or []):
            if why := mount_problem(str(mount)):
                problems.append(Problem(f"container.mounts[{i}]", mount, why))
        if self.workdir is not None and (why := path_problem(str(self.workdir), sbatch=False) or
                                         (None if str(self.workdir).startswith("/") else "an absolute path")):
            problems.append(Problem("container.workdir", self.workdir, why))
        if not re.match(r"^[A-Za-z0-9_./+-]+$", str(self.python)) or str(self.python).startswith("-"):
            problems.append(Problem("container.python", self.python, "an interpreter name or absolute path, e.g. python or /usr/bin/python3"))
        return problems

    def __post_init__(self) -> None:
        raise_if(self.problems())

"""What an ``env_error`` calls for: the evidence lines -> the fix, in words. Pure.

An environment problem stops the run (every retry in the same environment fails the same way), so the most
useful thing the decision can carry is the fix the evidence points at (``decide`` puts it in its reason,
which ``diagnose`` prints and the notification sends). :func:`env_fix` reads the lines in order (the
classifier puts the root cause's line first) and returns the fix for the first line it recognises, or ""
when none is recognised (the generic advice, ``core.causes.ADVICE["env_error"]``, then stands):

- a DeepSpeed op that was not prepared or failed to build in the job (``[hpc_agent] environment problem:``,
  ``ninja: build stopped``, ``Error building extension 'fused_adam'``): prepare the ops on the login node;
- an optional package hpc_agent names (``environment problem: ... pip install 'hpc_agent[x]'``): that command;
- a missing executable (``execve(): torchrun: No such file or directory``, ``torchrun: command not found``,
  ``No such file or directory: 'deepspeed'``): the binary, ``slurm.python`` and ``profile.activate``;
- a missing Python package (``ModuleNotFoundError: No module named 'x'``): ``pip install`` it in the job's
  environment (the distribution's name where it differs from the module's: ``sklearn`` -> ``scikit-learn``);
- an NVIDIA driver older than the job's CUDA (``NVIDIA driver on your system is too old``, ``CUDA driver
  version is insufficient``): a CUDA module matching the driver, or a torch build for it;
- a missing shared library (``libcudnn.so.8: cannot open shared object file``): the library.
"""
from __future__ import annotations

import re
from typing import Callable, Iterable, List, Match, Tuple

from hpc_agent.core.extras import DISTRIBUTIONS

PREPARE = "python -m hpc_agent.prepare"
_ACTIVATION = ("`slurm.python` (the interpreter of the environment that has it, as the compute nodes see it) or "
               "an activation line in `profile.activate` (e.g. `source /shared/venv/bin/activate`; or the `setup` "
               "lines of the `slurm.template` file)")


def _prepare(m: Match[str]) -> str:
    line = m.string
    pip = re.search(r"pip install '?([^'\s]+)'?", line)
    if "environment problem" in line and pip and "DeepSpeed op" not in line:
        return f"`pip install '{pip.group(1)}'` in the job's environment (the Python the job runs), then resubmit"
    given = re.search(r"Fix: `([^`]+)`", line)
    command = given.group(1) if given else PREPARE
    op = re.search(r"(?:DeepSpeed op|Error building extension) '?([A-Za-z0-9_]+)'?", line)
    what = f"the DeepSpeed op {op.group(1)}" if op else "a DeepSpeed op"
    return (f"{what} is not prepared for the job's environment, and a job never compiles one: run `{command}` on "
            "the login node (prebuilds the ops) with the jobs' Python, then resubmit")


def _executable(m: Match[str]) -> str:
    binary = next(name for name in m.groupdict().values() if name).rsplit("/", 1)[-1]
    return (f"`{binary}` is not found in the job's environment: make it reachable through {_ACTIVATION}; in a "
            f"container, `container.python` and the image; then resubmit")


def _package(m: Match[str]) -> str:
    module = m.group("mod").split(".")[0]
    dist = DISTRIBUTIONS.get(module, module)
    named = f"`pip install {dist}`" + (f" (it provides the module {module})" if dist != module else "")
    return (f"{named} in the job's environment (the Python `slurm.python` names, or the one `profile.activate` "
            "activates), then resubmit")


def _driver(m: Match[str]) -> str:
    found = re.search(r"found version (\d+)", m.string)
    cuda = ""
    if found:
        v = int(found.group(1))
        cuda = f" (the driver supports CUDA {v // 1000}.{(v % 1000) // 10})"
    return (f"the node's NVIDIA driver is older than the CUDA the job's torch was built for{cuda}: load a CUDA "
            "module matching the driver in `profile.activate`, or install a torch build for the driver's CUDA "
            "(`nvidia-smi` shows it) in the job's environment, then resubmit")


def _library(m: Match[str]) -> str:
    lib = m.group("lib")
    return (f"the shared library `{lib}` is missing on the node: load the module that provides it in "
            f"`profile.activate` (or add its folder to LD_LIBRARY_PATH there), or install it in the job's "
            "environment, then resubmit")


_RULES: List[Tuple["re.Pattern[str]", Callable[[Match[str]], str]]] = [
    (re.compile(r"\[hpc_agent\] environment problem:|ninja: build stopped|Error building extension"), _prepare),
    (re.compile(r"(?P<lib>lib[\w.+-]*\.so[\w.]*): cannot open shared object file"), _library),
    (re.compile(r"NVIDIA driver on your system is too old|CUDA driver version is insufficient", re.I), _driver),
    # Not any missing file: only a bare name or one in a bin/ folder (a missing data file is no environment fix).
    (re.compile(r"execve\(\): (?P<exec>[^\s:]+): No such file or directory|"
                r"(?P<shell>[^\s:]+): command not found|"
                r"No such file or directory: '(?P<popen>(?:[^'\s]*/bin/)?[^'/\s]+)'"), _executable),
    (re.compile(r"ModuleNotFoundError: No module named '(?P<mod>[^']+)'"), _package),
]


def env_fix(evidence: Iterable[str]) -> str:
    """The fix for the first evidence line that names one (module docstring); "" when no line does."""
    for line in evidence:
        for pattern, fix in _RULES:
            m = pattern.search(line)
            if m:
                return fix(m)
    return ""

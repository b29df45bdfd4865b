"""What a container image's Python must have for a job, and the probe that asks it (doctor's and submit's).

A container job runs the image's ``container.python`` with only the run's ``lib/`` (hpc_agent, launch,
submitit, cloudpickle: ``hpc_agent.jobs.container_lib``) and the code snapshot on its path. So the image
itself must bring torch and DeepSpeed (and hpc_agent's other dependencies: omegaconf, numpy, ...), and a
Python that can run hpc_agent's code and load the job submitit pickled on the login node:

* its version must be within ``requires-python`` of hpc_agent's package metadata (pyproject.toml): FAIL
  outside it;
* its minor version should be the login node's. The job's pickle names its classes
  (``launch.job.TrainingJob``, ``submitit``'s ``DelayedSubmission``) by module and name, with protocol 5
  (Python 3.8+) and no code objects (``tests/unit/test_image_python.py`` reads its opcodes), so another
  minor version within ``requires-python`` loads it; but cloudpickle promises nothing across Python
  versions, and the tested combination is the same minor on both sides: WARN, not FAIL.

The probe is one ``python -c`` (:func:`probe_code`) that imports each of :data:`MODULES` separately and
prints a marker line with the host, version and interpreter, then one line per module that failed: so one
run names every missing piece. Its text is plain Python 3 (no f-strings), so even a too-old interpreter
reports its version instead of a SyntaxError. :func:`read_probe` and :func:`verdict` are pure (tables in
the tests); :func:`check_locally` runs the probe on this machine at submit when that is cheap (an
Apptainer image file or folder here, ``apptainer`` on PATH), else says why it was skipped.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional, Sequence, Tuple

MARKER = "HPC_AGENT_PROBE"
MISSING = "HPC_AGENT_PROBE_MISSING"
MODULES = ("hpc_agent", "launch.job", "submitit", "torch", "deepspeed")  # what a container job imports first
NAME = "image python"
LOCAL_TIMEOUT_S = 120.0
_CLAUSE = re.compile(r"^\s*(>=|<=|==|!=|>|<|~=)\s*(\d+)(?:\.(\d+))?(?:\.\d+)*\s*$")


@dataclass(frozen=True)
class Probe:
    host: str
    version: str                   # "3.11"
    exe: str
    missing: Tuple[str, ...]       # "torch: ModuleNotFoundError: No module named 'torch'"


def probe_code(lib: Optional[str], modules: Sequence[str]) -> str:
    """The probe's Python (module docstring); ``lib`` goes first on sys.path when given."""
    path = "sys.path.insert(0, %r); " % lib if lib else ""
    return ("import sys; " + path + "import os, socket\n"
            "print(%r, os.environ.get('SLURMD_NODENAME') or socket.gethostname(), '%%d.%%d' %% sys.version_info[:2], "
            "sys.executable)\n" % MARKER +
            "for m in %r:\n"
            "    try:\n"
            "        __import__(m)\n"
            "    except BaseException as e:\n"
            "        print(%r, m + ':', type(e).__name__ + ':', str(e).splitlines()[0][:200] if str(e) else '')\n"
            % (tuple(modules), MISSING))


def read_probe(out: str) -> Optional[Probe]:
    """The probe's answer from its stdout (None: no marker line, so it never ran to its first print)."""
    lines = out.splitlines()
    head = next((line.split() for line in lines if line.startswith(MARKER + " ")), None)
    if not head or len(head) < 4:
        return None
    missing = tuple(line[len(MISSING):].strip() for line in lines if line.startswith(MISSING + " "))
    return Probe(head[1], head[2], head[3], missing)


def requires_python() -> str:
    """hpc_agent's ``requires-python`` (e.g. ``>=3.10``): from the installed metadata, else the checkout's
    pyproject.toml; "" when neither says."""
    from importlib import metadata

    try:
        spec = metadata.metadata("hpc_agent").get("Requires-Python")
        if spec:
            return str(spec)
    except metadata.PackageNotFoundError:
        pass
    from hpc_agent.core.paths import code_root

    try:
        text = (code_root() / "pyproject.toml").read_text()[:20000]
    except OSError:
        return ""
    found = re.search(r'^requires-python\s*=\s*"([^"]*)"', text, re.MULTILINE)
    return found.group(1) if found else ""


def _key(version: str) -> Tuple[int, int]:
    major, _, minor = version.partition(".")
    return int(major), int(minor or 0)


def within(version: str, spec: str) -> Optional[bool]:
    """Whether ``X.Y`` satisfies a ``requires-python`` spec of comma-separated clauses (compared on major
    and minor); None when a clause is not of that simple form (then nothing is claimed)."""
    try:
        have = _key(version)
    except ValueError:
        return None
    for clause in filter(str.strip, spec.split(",")):
        m = _CLAUSE.match(clause)
        if not m:
            return None
        op, want = m.group(1), (int(m.group(2)), int(m.group(3) or 0))
        ok = {">=": have >= want, "<=": have <= want, "==": have == want, "!=": have != want, ">": have > want,
              "<": have < want, "~=": have >= want and have[0] == want[0]}[op]
        if not ok:
            return False
    return True


def verdict(subject: str, probe: Probe, spec: str, here: str) -> Tuple[str, str]:
    """(level, detail) for a probe that ran: FAIL naming every missing module or a Python outside ``spec``;
    WARN for another minor version than ``here``; else OK."""
    where = f"{subject} runs on {probe.host} (Python {probe.version}, {probe.exe})"
    if within(probe.version, spec) is False:
        return "FAIL", (f"{where}, but hpc_agent needs Python {spec}: use an image whose Python is {here} "
                        f"(this login node's) (docs/containers.md)")
    if probe.missing:
        names = [m.split(":")[0] for m in probe.missing]
        fix = []
        if any(n in ("torch", "deepspeed") for n in names):
            fix.append("use an image with torch and DeepSpeed installed for its Python (docs/containers.md)")
        if any(n not in ("torch", "deepspeed") for n in names):
            fix.append("install hpc_agent's dependencies (omegaconf, numpy, PyYAML, typing_extensions, "
                       "nvidia-ml-py, tensorboard: pyproject.toml) into the image")
        return "FAIL", f"{where} but cannot import {'; '.join(probe.missing)[:600]}: {'; '.join(fix)}"
    imported = ", ".join(m.split(".")[0] for m in MODULES)
    if probe.version != here:
        return "WARN", (f"{where} and imports {imported}, but this login node runs Python {here}: the job is "
                        f"pickled here and loaded there; use an image with Python {here} (the tested "
                        "combination; docs/containers.md)")
    return "OK", f"{where} and imports {imported}"


# ---- at submit: the cheap local probe -----------------------------------------------------------------
def local_skip_reason(cfg: Any, which=shutil.which) -> Optional[str]:
    """Why submit does not probe the image here (None: it can, cheaply)."""
    c = cfg.container
    if c.runtime == "pyxis":
        return "pyxis images run only through srun on a compute node (doctor checks it there)"
    if c.runtime != "apptainer":
        return "no container"
    if "://" in str(c.image) or not Path(str(c.image)).exists():
        return f"the image {c.image} is no file or folder here (a pull can take minutes; doctor checks it)"
    if which("apptainer") is None:
        return "apptainer is not on this machine's PATH (doctor checks the image on a compute node)"
    return None


def local_argv(cfg: Any, lib: str) -> List[str]:
    """``apptainer exec --bind LIB IMAGE PYTHON -c PROBE``: as the job runs it, without --nv (no GPU here)."""
    c = cfg.container
    return ["apptainer", "exec", "--bind", f"{lib}:{lib}", str(c.image), str(c.python), "-c",
            probe_code(lib, MODULES)]


def check_locally(cfg: Any, timeout_s: float = LOCAL_TIMEOUT_S, run=subprocess.run) -> Tuple[str, str, str]:
    """(level, name, detail) for submit: the probe in the image on this machine, or WARN saying it was
    skipped and why. FAIL only for a definite answer from the image (:func:`verdict`)."""
    from hpc_agent.jobs import container_lib

    why = local_skip_reason(cfg)
    if why:
        return "WARN", NAME, f"not checked at submit: {why}"
    subject = f"container.python {cfg.container.python} in apptainer image {cfg.container.image}"
    with tempfile.TemporaryDirectory(prefix="hpc-agent-lib-") as tmp:
        try:
            lib = str(Path(container_lib.stage(Path(tmp))["path"]))
            proc = run(local_argv(cfg, lib), capture_output=True, text=True, timeout=timeout_s,
                       stdin=subprocess.DEVNULL, env=dict(os.environ, PYTHONPATH=lib))
        except subprocess.TimeoutExpired:
            return "WARN", NAME, f"not checked at submit: apptainer did not answer within {timeout_s:.0f} s"
        except (OSError, container_lib.LibError) as exc:
            return "WARN", NAME, f"not checked at submit: {exc}"
    probe = read_probe(proc.stdout)
    if probe is None:
        said = " / ".join(l.strip() for l in proc.stderr.splitlines() if l.strip())[-400:] or f"exit code {proc.returncode}"
        if re.search(r"not found|No such file|executable file not found", said):
            return "FAIL", NAME, (f"{subject} does not exist in the image: set container.python to its interpreter "
                                  f"({said})")
        return "WARN", NAME, f"not checked at submit: apptainer could not run the probe ({said})"
    level, detail = verdict(subject, probe, requires_python(), "%d.%d" % sys.version_info[:2])
    return level, NAME, detail

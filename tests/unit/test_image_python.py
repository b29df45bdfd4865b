"""The image's Python (hpc_agent/checks/image_python.py): the version rule, the probe's answer, the local
check at submit with a stand-in ``apptainer`` first on PATH (a script in a temp dir that runs what it is
asked to, without a container), and what the job's pickle holds (why another minor version can load it)."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_agent.checks import image_python, job_python
from hpc_agent.config.load import load_config
from tests.conftest import run_cli

HERE = "%d.%d" % sys.version_info[:2]

# `apptainer exec --bind LIST IMAGE CMD...`: records the call, then runs CMD as it is (no container)
APPTAINER = """#!/bin/bash
printf '%s\\0' "$@" > "$(dirname "$0")/calls"
[ "$1" = exec ] && shift
while [[ "$1" == -* ]]; do case "$1" in --nv) shift;; *) shift 2;; esac; done
shift  # the image
exec "$@"
"""


@pytest.mark.parametrize("version, spec, ok", [
    ("3.11", ">=3.10", True), ("3.10", ">=3.10", True), ("3.9", ">=3.10", False), ("3.13", ">=3.10,<3.13", False),
    ("3.12", ">=3.10, <3.13", True), ("3.11", "==3.11.*", None), ("3.11", "~=3.10", True), ("4.0", "~=3.10", False),
    ("3.11", "", True), ("x", ">=3.10", None)])
def test_requires_python_table(version, spec, ok):
    assert image_python.within(version, spec) is ok


def test_requires_python_is_pyprojects():
    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert f'requires-python = "{image_python.requires_python()}"' in text


def _probe(version=HERE, missing=()):
    return image_python.Probe("node1", version, "/usr/bin/python3", tuple(missing))


@pytest.mark.parametrize("probe, level, words", [
    (_probe(), "OK", ["node1", f"Python {HERE}", "torch", "deepspeed"]),
    (_probe("3.9"), "FAIL", ["needs Python >=3.10", f"Python is {HERE}"]),
    (_probe("3.12" if HERE != "3.12" else "3.11"), "WARN", [f"login node runs Python {HERE}", "tested"]),
    (_probe(missing=["torch: ModuleNotFoundError: No module named 'torch'"]), "FAIL",
     ["cannot import torch", "image with torch and DeepSpeed"]),
    (_probe(missing=["submitit: ModuleNotFoundError: No module named 'typing_extensions'"]), "FAIL",
     ["typing_extensions", "install hpc_agent's dependencies"]),
])
def test_verdict_table(probe, level, words):
    got, detail = image_python.verdict("container.python python in apptainer image i.sif", probe, ">=3.10", HERE)
    assert got == level and all(w in detail for w in words), detail


def test_the_probe_reports_every_missing_module_and_its_version():
    """Run for real: this interpreter without its site-packages (-S) plays an image without torch."""
    code = image_python.probe_code("/nonexistent", ("json", "torch", "no_such_mod_x"))
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60).stdout
    probe = image_python.read_probe(out)
    assert probe.version == HERE and probe.exe == sys.executable
    assert [m.split(":")[0] for m in probe.missing] == ["torch", "no_such_mod_x"]


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apptainer").write_text(APPTAINER)
    (bin_dir / "apptainer").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    image = tmp_path / "image"  # a sandbox folder: local, so submit may probe it
    image.mkdir()
    return bin_dir, image


def _python(tmp_path: Path, *flags: str) -> Path:
    """The image's interpreter: this Python (with its site-packages playing the image's), or without them."""
    path = tmp_path / "image_python"
    path.write_text(f"#!/bin/sh\nexec {sys.executable} {' '.join(flags)} \"$@\"\n")
    path.chmod(0o755)
    return path


def _apptainer_cfg(image, python, *more):
    return load_config("quickstart", ["container.runtime=apptainer", f"container.image={image}",
                                      f"container.python={python}", *more], env={})


def test_submits_local_check_passes_with_torch_and_deepspeed_in_the_image(stand_in, tmp_path):
    bin_dir, image = stand_in
    level, name, detail = image_python.check_locally(_apptainer_cfg(image, _python(tmp_path)))
    assert (level, name) == ("OK", "image python"), detail
    words = (bin_dir / "calls").read_bytes().decode().split("\0")[:-1]
    assert words[:2] == ["exec", "--bind"] and words[3:5] == [str(image), str(tmp_path / "image_python")]
    lib = words[2].split(":")[0]
    assert lib.endswith("/lib") and f"sys.path.insert(0, {lib!r})" in words[-1]
    assert not Path(lib).exists()  # the temporary copy is gone


def test_submits_local_check_fails_naming_what_the_image_lacks(stand_in, tmp_path):
    _, image = stand_in
    level, _, detail = image_python.check_locally(_apptainer_cfg(image, _python(tmp_path, "-S")))
    assert level == "FAIL" and "cannot import" in detail and "torch:" in detail and "deepspeed:" in detail
    assert "hpc_agent:" not in detail and "launch.job:" not in detail  # those came from the copied lib/


def test_submit_exits_2_when_the_image_lacks_torch(stand_in, tmp_path):
    _, image = stand_in
    proc = run_cli("-m", "hpc_agent.submit", "quickstart", "--dry-run", "--executor", "slurm",
                   f"run.runs_root={tmp_path / 'runs'}", "container.runtime=apptainer", f"container.image={image}",
                   f"container.python={_python(tmp_path, '-S')}", env={"PATH": os.environ["PATH"]}, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "image python:" in proc.stderr and "torch: ModuleNotFoundError" in proc.stderr and "--force" in proc.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("runtime, image, which, why", [
    ("pyxis", "nvcr.io#team/train:py3.11", "/usr/bin/apptainer", "only through srun"),
    ("apptainer", "docker://ghcr.io/org/img:tag", "/usr/bin/apptainer", "no file or folder here"),
    ("apptainer", "HERE", None, "apptainer is not on this machine's PATH"),
])
def test_submit_skips_the_image_check_saying_why(runtime, image, which, why, tmp_path):
    cfg = load_config("quickstart", [f"container.runtime={runtime}",
                                     f"container.image={tmp_path if image == 'HERE' else image}"], env={})
    assert why in image_python.local_skip_reason(cfg, which=lambda _: which)


def test_doctors_container_probe_copies_lib_under_the_runs_root(tmp_path):
    """The srun probe mounts a lib/ copied under run.runs_root (what the compute nodes see), sets it alone as
    PYTHONPATH, imports torch and DeepSpeed, and removes the copy afterwards."""
    from tests.unit.test_doctor_job import FakeCLI

    root = tmp_path / "runs"
    cfg = load_config("quickstart", ["container.runtime=pyxis", "container.image=nvcr.io#team/train:py3.11",
                                     f"run.runs_root={root}"], env={})
    seen = {}

    class Recording(FakeCLI):
        def run(self, argv, check=True, timeout_s=None):
            lib = next(a for a in argv if a.startswith("--export=ALL,PYTHONPATH="))[len("--export=ALL,PYTHONPATH="):]
            seen.update(lib=lib, files=sorted(p.name for p in Path(lib).iterdir()), argv=argv)
            return super().run(argv, check, timeout_s)

    cli = Recording(out=f"HPC_AGENT_PROBE node1 {HERE} /usr/bin/python\n")
    level, _, detail = job_python.check_job_python(cli, cfg)
    assert level == "OK" and "torch" in detail, detail
    assert seen["lib"].startswith(str(root) + "/") and "submitit" in seen["files"] and "torch" not in seen["files"]
    assert f"--container-mounts={seen['lib']}:{seen['lib']}" in seen["argv"] and "--mem=1G" in seen["argv"]
    assert "'torch', 'deepspeed'" in seen["argv"][-1]
    assert list(root.iterdir()) == []  # the probe's copy is removed


@pytest.mark.parametrize("command", [None, ["python", "train.py"]])
def test_the_jobs_pickle_names_classes_only(tmp_path, command):
    """What submitit writes for the job (cloudpickle, as submitit dumps it) references its classes by module
    and name, protocol <= 5, with no code object: any Python that can import them (3.8+) loads it."""
    from submitit.core.utils import DelayedSubmission

    from hpc_agent.jobs.submission import job_for

    overrides = [f"train.command={command}".replace("'", "")] if command else []
    cfg = load_config("quickstart", overrides, env={})
    path = tmp_path / "submitted.pkl"
    DelayedSubmission(job_for(tmp_path, cfg, tmp_path / "config.yaml")).dump(path)
    data = path.read_bytes()
    assert data[0] == 0x80 and data[1] <= 5
    names = []

    class Names(pickle.Unpickler):
        def find_class(self, module, name):
            names.append(f"{module}.{name}")
            return super().find_class(module, name)

    Names(open(path, "rb")).load()
    assert names and not any(n.startswith(("cloudpickle", "types.", "builtins.code")) for n in names), names
    assert {n.split(".")[0] for n in names} <= {"launch", "submitit", "pathlib", "builtins", "copyreg"}, names

"""Issue 44 (4): a container job gets the image's Python stack, never the host venv's.

With a wheel install (``pip install ./hpc_agent`` into the user's venv) hpc_agent's code folder is that venv's
site-packages, which also holds the user's own torch and DeepSpeed. The job script must put only hpc_agent's
own packages (the run's ``lib/``, hpc_agent/jobs/container_lib.py) and the code snapshot on the container's
PYTHONPATH, and mount nothing of the venv. Rendered with a real (``python -m venv``) venv whose site-packages
holds stand-in torch/deepspeed packages, then run by bash with the recording ``srun``/``apptainer``/``python``
of test_containers.py.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_agent.core import rundir
from hpc_agent.jobs import container_lib, executor
from hpc_agent.jobs.executor import render_job_script
from tests.unit.test_containers import _cfg, _env, fake_bin, run_script  # noqa: F401 - fake_bin: a fixture

IMAGE = "nvcr.io#team/train:py3.11"


@pytest.fixture
def wheel_venv(tmp_path, monkeypatch):
    """A venv as ``pip install ./hpc_agent`` leaves it: hpc_agent, launch, torch, deepspeed in site-packages,
    which is then hpc_agent's code folder (``code_root``)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    site = next(venv.glob("lib/python*/site-packages"))
    for name in ("hpc_agent", "launch", "torch", "deepspeed"):
        (site / name).mkdir()
        (site / name / "__init__.py").write_text(f"# {name} of the user's venv\n")
    monkeypatch.setattr(executor, "code_root", lambda: site)
    return venv, site


def _mounts(words):
    return [m for m in words.split(",") if m]


@pytest.mark.parametrize("runtime", ["pyxis", "apptainer"])
def test_the_host_venv_is_neither_on_the_containers_path_nor_mounted(runtime, wheel_venv, fake_bin, tmp_path,
                                                                      monkeypatch):
    venv, site = wheel_venv
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    run_dir = tmp_path / "runs" / "r-20260101-000000"
    cfg = _cfg(runtime, IMAGE, "train.workload=my_pkg.model:build", "slurm.gpus_per_node=1")
    script = render_job_script(cfg, run_dir.name, run_dir, run_dir / "config.yaml")
    assert str(site) not in script and str(venv) not in script

    # the batch shell inherits the login shell's environment (sbatch --export=ALL): the venv activated there
    login_env = {"PYTHONPATH": str(site), "VIRTUAL_ENV": str(venv)}
    seen = run_script(tmp_path, fake_bin, script, env=login_env)
    lib, code = rundir.lib_dir(run_dir), rundir.code_dir(run_dir)
    if runtime == "pyxis":
        srun = seen["srun.argv"]
        mounts = _mounts(next(w for w in srun if w.startswith("--container-mounts="))[len("--container-mounts="):])
        env = _env(seen["python.env"])  # what the container's python gets (pyxis passes the environment on)
    else:
        words = seen["apptainer.argv"]
        mounts = _mounts(words[words.index("--bind") + 1])
        env = _env(seen["apptainer.env"])
    assert env["PYTHONPATH"].split(":") == [str(code), str(lib)]  # the snapshot, then hpc_agent's code: no more
    sources = [m.split(":")[0] for m in mounts]
    assert not any(s == str(venv) or s.startswith(str(venv) + "/") for s in sources), mounts
    assert str(run_dir) in sources  # the run directory's mount carries lib/ and code/ into the container
    assert all(str(p).startswith(str(run_dir) + "/") for p in (lib, code))


def _fake_install(root: Path) -> Path:
    """A site-packages with hpc_agent and launch (with bytecode and a link to leave out) beside torch."""
    site = root / "site-packages"
    for name in ("hpc_agent", "launch", "torch"):
        (site / name / "sub").mkdir(parents=True)
        (site / name / "__init__.py").write_text(f"NAME = {name!r}\n")
        (site / name / "sub" / "mod.py").write_text("X = 1\n")
        (site / name / "__pycache__").mkdir()
        (site / name / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    (site / "hpc_agent" / "data.txt").write_text("kept: package data\n")
    (site / "hpc_agent" / "linked.py").symlink_to(site / "torch" / "__init__.py")
    return site


def test_stage_copies_only_hpc_agents_packages_and_submitits(tmp_path, monkeypatch):
    site = _fake_install(tmp_path)
    monkeypatch.setattr(container_lib, "code_root", lambda: site)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    manifest = container_lib.stage(run_dir)
    lib = rundir.lib_dir(run_dir)
    assert sorted(p.name for p in lib.iterdir()) == sorted([*container_lib.PACKAGES, container_lib.MANIFEST])
    assert not (lib / "torch").exists()
    assert sorted(str(p.relative_to(lib / "hpc_agent")) for p in (lib / "hpc_agent").rglob("*")) == \
        ["__init__.py", "data.txt", "sub", "sub/mod.py"]  # no bytecode, no link
    import submitit
    assert (lib / "submitit" / "core" / "_submit.py").read_bytes() == \
        (Path(submitit.__file__).parent / "core" / "_submit.py").read_bytes()
    assert manifest["path"] == str(lib) and manifest["packages"]["hpc_agent"] == str(site / "hpc_agent")

    before = (lib / "hpc_agent" / "__init__.py").stat().st_ino
    assert container_lib.stage(run_dir)["sha256"] == manifest["sha256"]  # identical: left as it is
    assert (lib / "hpc_agent" / "__init__.py").stat().st_ino == before
    (site / "hpc_agent" / "__init__.py").write_text("NAME = 'v2'\n")  # the watcher's hpc_agent was upgraded
    again = container_lib.stage(run_dir)
    assert again["sha256"] != manifest["sha256"] and (lib / "hpc_agent" / "__init__.py").read_text() == "NAME = 'v2'\n"
    assert sorted(p.name for p in run_dir.iterdir()) == [rundir.LIB]  # nothing left aside


def test_the_staged_lib_alone_runs_the_jobs_entry_point(tmp_path):
    """The container's view: only lib/ on PYTHONPATH (-s: no user site; the interpreter's own site-packages
    play the image's). submitit's entry module and hpc_agent's job side import from lib/, not elsewhere."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lib = container_lib.stage(run_dir)["path"]
    code = ("import launch.job, hpc_agent, submitit.core._submit, cloudpickle\n"
            "print(launch.job.__file__, hpc_agent.__file__, submitit.__file__, cloudpickle.__file__)")
    out = subprocess.run([sys.executable, "-s", "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                         env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": lib})
    assert out.returncode == 0, out.stderr
    assert all(path.startswith(lib + "/") for path in out.stdout.split()), out.stdout


def test_every_submission_of_a_container_job_stages_lib_before_sbatch(tmp_path, monkeypatch):
    """submit (and the watcher, through the same submit_attempt) copies lib/ into the run dir before the
    executor is made; a job without a container gets none."""
    from hpc_agent import submit
    from hpc_agent.jobs import submission
    from tests.unit.test_submit_orphans import FakeExecutor

    seen = []

    def make(kind, folder, cfg, run_id, run_dir, config_path):
        seen.append(sorted(p.name for p in rundir.lib_dir(run_dir).iterdir()) if rundir.lib_dir(run_dir).exists()
                    else None)
        return FakeExecutor()

    monkeypatch.setattr(submission, "make_executor", make)
    monkeypatch.chdir(tmp_path)
    assert submit.main(["quickstart", "--executor", "slurm", f"run.runs_root={tmp_path / 'a'}",
                        "container.runtime=apptainer", "container.image=docker://ghcr.io/org/img:tag"]) == 0
    assert seen == [sorted([*container_lib.PACKAGES, container_lib.MANIFEST])]
    assert submit.main(["quickstart", "--executor", "local", f"run.runs_root={tmp_path / 'b'}"]) == 0
    assert seen[1] is None

"""Containers (pyxis, Apptainer) and the job's interpreter (``slurm.python``): issue 18.

The rendered job scripts are golden files (``UPDATE_GOLDEN=1`` regenerates them) and are run by bash with
fake ``srun``, ``apptainer`` and ``python`` first on PATH: each records its argv (NUL-separated), srun then
runs the command after its options, the others exit 0. So the test sees exactly which words reached
which program, and that nothing else ran (a ``touch`` stub records any call; the folder stays empty).
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

from hpc_agent.config.fields import char_name
from hpc_agent.config.load import build_config, load_config
from hpc_agent.config.problems import ConfigError
from hpc_agent.core import rundir
from hpc_agent.jobs import containers, executor
from hpc_agent.jobs.executor import render_job_script
from tests.unit.test_job_script_hostile import hostile_path

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
RUN_DIR = Path("/runs/quickstart-20260101-000000")
REPO = Path("/opt/hpc_agent")
DIGEST = "sha256:" + "0123456789abcdef" * 4
IMAGES = ["nvcr.io#nvidia/pytorch:24.05-py3", f"registry.example.com:5000/team/pt@{DIGEST}",
          f"nvcr.io#nvidia/pytorch:24.05-py3@{DIGEST}", "docker://ghcr.io/org/img:tag", "/shared/images/pt~1+x=y.sif"]

RECORD = """#!/bin/bash
printf '%s\\0' "$@" > "$DUMP/{name}.argv"
env -0 > "$DUMP/{name}.env"
"""
# srun: record, then run the command after srun's own options (--output takes a value), as srun would.
SRUN = RECORD.format(name="srun") + """while [ $# -gt 0 ]; do case "$1" in --output) shift 2;; -*) shift;; *) break;; esac; done
exec "$@"
"""
TOUCH = """#!/bin/bash
echo "touch $*" >> "$EXECUTED"
"""


def _stub(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


@pytest.fixture
def fake_bin(tmp_path):
    bin_dir = tmp_path / "bin"
    _stub(bin_dir / "srun", SRUN)
    _stub(bin_dir / "touch", TOUCH)
    for name in ("apptainer", "python"):
        _stub(bin_dir / name, RECORD.format(name=name))
    return bin_dir


def run_script(tmp_path: Path, bin_dir: Path, script: str, env: Dict[str, str] | None = None) -> Dict[str, List[str]]:
    """Run ``script`` with bash -u in an empty folder (``env``: more of the batch shell's environment);
    returns each stub's argv (and env, as 'NAME.env')."""
    work, dump = tmp_path / "work", tmp_path / "dump"
    work.mkdir()
    dump.mkdir()
    path = tmp_path / "job.sh"
    path.write_text(script)
    proc = subprocess.run(["bash", "-u", str(path)], cwd=work, capture_output=True, text=True, timeout=30,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin", "DUMP": str(dump), "HOME": str(tmp_path / "nohome"),
                               "EXECUTED": str(tmp_path / "executed"), "SLURM_JOB_ID": "123",
                               "SLURM_CPUS_PER_TASK": "2", **(env or {})})
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")
    assert not (tmp_path / "executed").exists(), "a value executed a command"
    assert list(work.iterdir()) == [], "the script created files where it ran"
    return {f.name: f.read_bytes().decode().split("\0")[:-1] for f in dump.iterdir()}


def _env(items: List[str]) -> Dict[str, str]:
    return dict(item.split("=", 1) for item in items)


@pytest.fixture
def fixed_repo(monkeypatch):
    monkeypatch.setattr(executor, "code_root", lambda: REPO)


def _cfg(runtime: str, image: str, *more: str):
    return load_config("quickstart", [f"container.runtime={runtime}", f"container.image={image}", *more], env={})


# --- rendering: golden files -----------------------------------------------------------------------

@pytest.mark.parametrize("runtime", ["pyxis", "apptainer"])
def test_container_scripts_match_golden_files(runtime, fixed_repo):
    cfg = _cfg(runtime, f"nvcr.io#nvidia/pytorch:24.05-py3@{DIGEST}", "container.workdir=/work/project",
               "container.mounts=[/scratch/data:/data:ro]", "slurm.gpus_per_node=2", "slurm.tasks_per_node=2",
               "slurm.partition=low")
    text = render_job_script(cfg, RUN_DIR.name, RUN_DIR, RUN_DIR / "config.yaml")
    golden = GOLDEN / f"{runtime}.sbatch"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.write_text(text)
    assert text == golden.read_text(), "job script changed; review and rerun with UPDATE_GOLDEN=1"


def test_the_template_rule():
    assert containers.template_name(load_config("quickstart", [], env={})) == "default"
    assert containers.template_name(_cfg("pyxis", "img")) == "pyxis"
    assert containers.template_name(_cfg("apptainer", "i.sif")) == "apptainer"
    assert containers.template_name(_cfg("apptainer", "i.sif", "slurm.template=mine")) == "mine"


# --- run by bash: the must-show ----------------------------------------------------------------------

@pytest.mark.parametrize("image", IMAGES)
def test_pyxis_script_with_hash_in_the_image_executes_nothing_unintended(image, fake_bin, tmp_path, monkeypatch):
    """Accepted values with shell-meaningful characters everywhere: '#', '@', '~' in the image; $(..),
    backticks, quotes, ';' and spaces in the run dir, the code folder, a mount and the submit directory."""
    submit_dir = tmp_path / "sub $(touch CANARY-cwd) #x"
    submit_dir.mkdir()
    monkeypatch.chdir(submit_dir)
    mount = f"{tmp_path}/data `touch CANARY-m`:/data/in 'x':ro"
    cfg = _cfg("pyxis", image, f"container.mounts=[\"{mount}\"]")
    run_dir = hostile_path(tmp_path / "runs", "CANARY", "run")
    script = render_job_script(cfg, "q-20260101-000000", run_dir, run_dir / "config.yaml")

    seen = run_script(tmp_path, fake_bin, script)
    folder = rundir.slurm_dir(run_dir)
    mounts = [f"{run_dir}:{run_dir}", f"{submit_dir}:{submit_dir}", mount]
    assert seen["srun.argv"] == ["--unbuffered", "--output", f"{folder}/%j_%t_log.out", "--kill-on-bad-exit=1",
                                 f"--container-image={image}", f"--container-mounts={','.join(mounts)}",
                                 f"--container-workdir={submit_dir}",
                                 "python", "-u", "-m", "submitit.core._submit", str(folder)]
    assert seen["python.argv"] == ["-u", "-m", "submitit.core._submit", str(folder)]
    env = _env(seen["python.env"])
    assert env["PYTHONPATH"] == str(rundir.lib_dir(run_dir)) and env["HPC_AGENT_RUN_DIR"] == str(run_dir)
    assert "apptainer.argv" not in seen


@pytest.mark.parametrize("image", IMAGES)
def test_apptainer_script_with_hash_in_the_image_executes_nothing_unintended(image, fake_bin, tmp_path, monkeypatch):
    workdir = f"{tmp_path}/w $(touch CANARY-w) #1"
    cfg = _cfg("apptainer", image, f'container.workdir="{workdir}"', "slurm.gpus_per_node=1")  # quoted: YAML
    run_dir = hostile_path(tmp_path / "runs", "CANARY", "run")
    script = render_job_script(cfg, "q-20260101-000000", run_dir, run_dir / "config.yaml")

    seen = run_script(tmp_path, fake_bin, script)
    folder = rundir.slurm_dir(run_dir)
    command = ["apptainer", "exec", "--nv", "--bind", f"{run_dir}:{run_dir}", "--pwd", workdir,
               image, "python", "-u", "-m", "submitit.core._submit", str(folder)]
    assert seen["srun.argv"] == ["--unbuffered", "--output", f"{folder}/%j_%t_log.out", "--kill-on-bad-exit=1",
                                 *command]
    assert seen["apptainer.argv"] == command[1:]
    assert seen["apptainer.argv"].count(image) == 1  # the image: exactly one word, as configured
    assert _env(seen["apptainer.env"])["PYTHONPATH"] == str(rundir.lib_dir(run_dir))
    assert "python.argv" not in seen  # the fake apptainer ran nothing: only it was called


def test_slurm_python_is_what_the_job_runs(fake_bin, tmp_path, monkeypatch):
    venv_python = tmp_path / "my venv $(touch CANARY)" / "bin" / "python"
    _stub(venv_python, RECORD.format(name="venv"))
    cfg = load_config("quickstart", [f"slurm.python={venv_python}"], env={})
    script = render_job_script(cfg, RUN_DIR.name, tmp_path / "r", tmp_path / "r" / "config.yaml")
    seen = run_script(tmp_path, fake_bin, script)
    assert seen["srun.argv"][-5:] == [str(venv_python), "-u", "-m", "submitit.core._submit",
                                      str(rundir.slurm_dir(tmp_path / "r"))]
    assert seen["venv.argv"] == ["-u", "-m", "submitit.core._submit", str(rundir.slurm_dir(tmp_path / "r"))]
    assert "PYTHONPATH" not in _env(seen["venv.env"])  # outside a container the interpreter's own packages


def test_default_python_is_this_one():
    cfg = load_config("quickstart", [], env={})
    assert f"{shlex.quote(sys.executable)} -u -m submitit.core._submit" in render_job_script(
        cfg, RUN_DIR.name, RUN_DIR, RUN_DIR / "config.yaml")
    assert executor.job_python(cfg, RUN_DIR.name, RUN_DIR, RUN_DIR / "c.yaml") == shlex.quote(sys.executable)
    assert executor.job_python(_cfg("pyxis", "i", "slurm.python=/venv/bin/python"), RUN_DIR.name, RUN_DIR,
                               RUN_DIR / "c.yaml") == "python"  # ignored in a container
    assert executor.job_python(_cfg("pyxis", "i", "container.python=/usr/bin/python3.11"), RUN_DIR.name, RUN_DIR,
                               RUN_DIR / "c.yaml") == "/usr/bin/python3.11"


# --- validation ----------------------------------------------------------------------------------

HOSTILE_IMAGE_CHARS = [";", "$", "(", "`", " ", "\n", "\t", "|", "&", "'", '"', "\\", "*", "?", "{", "<", ">", "!",
                       "%", ",", "\0", "é"]


@pytest.mark.parametrize("bad", HOSTILE_IMAGE_CHARS)
def test_hostile_images_are_refused_naming_the_character(bad):
    image = f"nvcr.io#img{bad}x"
    with pytest.raises(ConfigError) as info:
        build_config([{"container": {"runtime": "pyxis", "image": image}}])
    problem = next(p for p in info.value.problems if p.key == "container.image")
    assert char_name(bad) in problem.expected


@pytest.mark.parametrize("image, why", [("-v", "starts with '-'"), ("--container-mounts=/:/x", "starts with '-'"),
                                        ("$(touch x)", "'$'"), ("a`id`", "a backtick"), ("a;b", "';'"),
                                        ("a\nb", "a newline"), ("", "an image for"), ("x" * 1100, "1024")])
def test_image_table(image, why):
    with pytest.raises(ConfigError) as info:
        build_config([{"container": {"runtime": "apptainer", "image": image}}])
    assert why in str(info.value)


@pytest.mark.parametrize("image", IMAGES)
def test_real_image_references_are_accepted(image):
    assert build_config([{"container": {"runtime": "pyxis", "image": image}}]).container.image == image


@pytest.mark.parametrize("key, value", [("python", "python; rm -rf /"), ("python", "-c"), ("python", "py thon"),
                                        ("mounts", ["rel/path"]), ("mounts", ["/a,/b"]), ("mounts", ["/a:rel"]),
                                        ("mounts", ["/a:/b:ro:x"]), ("mounts", ["/a:/b:r;o"]), ("workdir", "rel"),
                                        ("workdir", "/a\nb"), ("runtime", "docker")])
def test_other_container_fields_are_checked(key, value):
    with pytest.raises(ConfigError) as info:
        build_config([{"container": {"runtime": "pyxis", "image": "img", key: value}}])
    assert any(p.key.startswith(f"container.{key}") for p in info.value.problems)


def test_a_container_needs_an_image():
    with pytest.raises(ConfigError, match="container.image"):
        build_config([{"container": {"runtime": "pyxis"}}])


def test_mounted_paths_with_a_comma_or_colon_are_refused(tmp_path, fixed_repo):
    run_dir = tmp_path / "a:b,c" / "r-1"
    with pytest.raises(ConfigError) as info:
        render_job_script(_cfg("pyxis", "img", "container.workdir=/w"), "r-1", run_dir, run_dir / "config.yaml")
    assert "run.runs_root" in {p.key for p in info.value.problems} and "','" in str(info.value)


def test_a_container_needs_the_slurm_executor():
    with pytest.raises(ConfigError, match="local executor"):
        executor.local_parameters(_cfg("apptainer", "i.sif"))


def test_a_custom_pyxis_template_must_pass_the_image(tmp_path, monkeypatch, fixed_repo):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sbatch_templates").mkdir()
    (tmp_path / "sbatch_templates" / "mine.yaml").write_text("setup: []\nsrun_args: [--kill-on-bad-exit=1]\n")
    cfg = _cfg("pyxis", "img", "slurm.template=mine")
    with pytest.raises(ConfigError, match=r"--container-image=\{image\}"):
        render_job_script(cfg, RUN_DIR.name, RUN_DIR, RUN_DIR / "config.yaml")


def test_container_placeholders_without_a_container_are_an_error(tmp_path, monkeypatch, fixed_repo):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sbatch_templates").mkdir()
    (tmp_path / "sbatch_templates" / "mine.yaml").write_text("setup: []\nsrun_args: ['--container-image={image}']\n")
    cfg = load_config("quickstart", ["slurm.template=mine"], env={})
    with pytest.raises(ConfigError, match=r"\{image\} cannot be filled"):
        render_job_script(cfg, RUN_DIR.name, RUN_DIR, RUN_DIR / "config.yaml")


def test_a_sweep_refuses_a_container_and_runs_slurm_python(tmp_path):
    from hpc_agent.sweep.batch import TrialJob, array_parameters

    job = TrialJob(0, "s-t000", tmp_path / "r", tmp_path / "r" / "config.yaml", _cfg("pyxis", "img"))
    with pytest.raises(ConfigError, match="container.runtime"):
        array_parameters([job], "sw", "b0", 1)
    cfg = load_config("quickstart", ["slurm.python=/venv/bin/python"], env={})
    assert containers.job_python(cfg, {}) == "/venv/bin/python"


def test_a_resubmission_keeps_the_first_submits_workdir(tmp_path, monkeypatch, fixed_repo):
    """The watcher resubmits from wherever it runs: pyxis' workdir and mount are the directory recorded in
    run.json by the first submit, not the resubmitting process's."""
    from hpc_agent.core.fsutil import atomic_write_json
    from hpc_agent.core.rundir import WORKDIR

    run_dir = tmp_path / "runs" / "q-20260101-000000"
    run_dir.mkdir(parents=True)
    first = tmp_path / "project"
    first.mkdir()
    atomic_write_json(rundir.run_json_path(run_dir), {WORKDIR: str(first)})
    elsewhere = tmp_path / "watcher_cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    script = render_job_script(_cfg("pyxis", "nvcr.io#nvidia/pytorch:24.05-py3"), run_dir.name, run_dir,
                               run_dir / "config.yaml")
    assert f"--container-workdir={first}" in script
    assert str(elsewhere) not in script

"""A non-editable install works: the wheel carries the shipped configs and sbatch templates, and submit
and doctor run from it outside the checkout. Plus the quick checks behind that: pyproject lists every
package, and hpc_agent.core.paths finds the shipped files in a checkout and under HPC_AGENT_HOME."""
from __future__ import annotations

import json
import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

import hpc_agent
from hpc_agent.core import paths

REPO = Path(__file__).resolve().parents[2]
SHIPPED_IN_WHEEL = ["hpc_agent/shipped/configs/base.yaml", "hpc_agent/shipped/configs/quickstart.yaml",
                    "hpc_agent/shipped/configs/profiles/localhost.yaml",
                    "hpc_agent/shipped/sbatch_templates/default.yaml", "launch/data/corpus.txt"]
# Junk that a copy of the checkout leaves out when git cannot say what is tracked.
NOT_SOURCE = shutil.ignore_patterns(".git", "__pycache__", "*.pyc", "*.egg-info", "build", "dist", "runs",
                                    ".venv", ".pytest_cache")


# --- quick checks -----------------------------------------------------------------------------------------
def test_pyproject_lists_every_package():
    """The package list is explicit (to map the shipped folders into the wheel): a new subpackage must be
    added to it, or the wheel silently lacks it."""
    setuptools_cfg = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    on_disk = {".".join(d.relative_to(REPO).parts) for root in ("hpc_agent", "launch")
               for d in [REPO / root, *(REPO / root).rglob("*")]
               if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py"))}
    mapped = set(setuptools_cfg["package-dir"])
    assert set(setuptools_cfg["packages"]) == on_disk | mapped
    assert {setuptools_cfg["package-dir"][p] for p in mapped} == set(paths.FOLDERS)


def test_checkout_reads_the_top_level_folders(monkeypatch):
    monkeypatch.delenv(paths.HOME_ENV, raising=False)
    if Path(hpc_agent.__file__).resolve().parent.parent != REPO:
        pytest.skip(f"hpc_agent is imported from {hpc_agent.__file__}, not from this checkout")
    assert paths.configs_dir() == REPO / "configs"
    assert paths.templates_dir() == REPO / "sbatch_templates"
    assert paths.code_root() == REPO


def test_hpc_agent_home_wins(monkeypatch, tmp_path):
    monkeypatch.setenv(paths.HOME_ENV, str(tmp_path))
    assert paths.configs_dir() == tmp_path / "configs"
    assert paths.templates_dir() == tmp_path / "sbatch_templates"
    assert paths.code_root() == Path(hpc_agent.__file__).resolve().parent.parent  # {repo} is the code, always


# --- the wheel --------------------------------------------------------------------------------------------
def copy_source(dest: Path) -> None:
    """The files a fresh clone has (tracked, plus new files git does not ignore), so the build writes its
    build/ and *.egg-info into the copy, never into the checkout."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True)
    if listed.returncode != 0:
        shutil.copytree(REPO, dest, ignore=NOT_SOURCE)
        return
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = REPO / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)


def run(args, cwd: Path, env=None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], cwd=str(cwd), env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    copy_source(work / "src")
    built = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                 work / "src", "-w", work / "dist"], cwd=work)
    assert built.returncode == 0, built.stdout + built.stderr
    (found,) = (work / "dist").glob("hpc_agent-*.whl")
    return found


@pytest.fixture(scope="module")
def wheel_venv(wheel, tmp_path_factory) -> Path:
    """A new venv with the wheel installed (no dependencies); this interpreter's site-packages are added
    through a .pth file, so torch and the rest are not installed again. A .pth line only appends a folder
    to sys.path (the .pth files in it are not run), so the parent's editable hpc_agent stays invisible."""
    home = tmp_path_factory.mktemp("venv") / "venv"
    venv.EnvBuilder(with_pip=False).create(home)
    python = home / "bin" / "python"
    installed = run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index",
                     wheel], cwd=home)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    purelib = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=home).stdout.strip()
    parents = [p for p in site.getsitepackages() + [site.getusersitepackages(), sysconfig.get_paths()["purelib"]]
               if os.path.isdir(p)]
    Path(purelib, "_parent_site_packages.pth").write_text("".join(f"{p}\n" for p in dict.fromkeys(parents)))
    return home


@pytest.fixture
def outside(tmp_path):
    """A cwd outside the checkout and an environment that points nowhere near it."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", paths.HOME_ENV, "HPC_AGENT_RUNS")}
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    return cwd, env


@pytest.mark.slow
def test_wheel_carries_the_shipped_files(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [n for n in SHIPPED_IN_WHEEL if n not in names]
    assert not missing, f"{wheel.name} lacks {missing}"
    assert not [n for n in names if n.startswith(("configs/", "sbatch_templates/"))]  # no top-level folders


@pytest.mark.slow
def test_wheel_install_finds_its_packaged_configs(wheel_venv, outside):
    cwd, env = outside
    shown = run([wheel_venv / "bin" / "python", "-c",
                 "import hpc_agent, launch.workloads\n"
                 "from hpc_agent.config.load import resolve_config_path\n"
                 "from hpc_agent.jobs.executor import load_template\n"
                 "print(hpc_agent.__file__); print(resolve_config_path('quickstart')); print(load_template('default'))"],
                cwd=cwd, env=env)
    assert shown.returncode == 0, shown.stderr
    module_file, quickstart, template = shown.stdout.splitlines()[:3]
    assert Path(module_file).resolve().is_relative_to(wheel_venv.resolve()), "hpc_agent is not the wheel's"
    assert Path(quickstart).resolve() == Path(module_file).resolve().parent / "shipped" / "configs" / "quickstart.yaml"
    assert "--kill-on-bad-exit=1" in template
    listed = run([wheel_venv / "bin" / "hpc-agent", "config", "--list"], cwd=cwd, env=env)
    assert listed.returncode == 0, listed.stderr
    assert "shipped/configs:" in listed.stdout and "  quickstart" in listed.stdout


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["local", "slurm"])
def test_wheel_install_submit_dry_run(wheel_venv, outside, executor):
    cwd, env = outside
    python = wheel_venv / "bin" / "python"
    # --force: a new venv has no DeepSpeed ops prepared, which submit otherwise refuses (exit 2) before prepare
    result = run([python, "-m", "hpc_agent.submit", "quickstart", "--dry-run", "--force", "--executor", executor],
                 cwd=cwd, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert re.search(r"^  name: quickstart$", result.stdout, re.M), result.stdout  # the packaged quickstart.yaml
    if executor == "slurm":
        assert "#SBATCH --requeue" in result.stdout
        assert "#SBATCH --open-mode=append" in result.stdout
        assert str(python) in result.stdout  # the job runs the wheel's interpreter
    assert not (cwd / "runs").exists()  # a dry run creates nothing


@pytest.mark.slow
def test_wheel_install_doctor_reports(wheel_venv, outside):
    cwd, env = outside
    result = run([wheel_venv / "bin" / "python", "-m", "hpc_agent.doctor"], cwd=cwd, env=env)
    # 1 is a FAIL among the checks (no Slurm here, ops not prepared in the new venv): still a report.
    assert result.returncode in (0, 1), result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert re.search(r"^(OK|WARN|FAIL) +slurm", result.stdout, re.M), result.stdout
    assert re.search(r"^(READY|FAILED): ", result.stdout, re.M), result.stdout


def test_config_copy_gives_an_editable_copy_that_hpc_agent_home_selects(tmp_path, monkeypatch, capsys):
    from hpc_agent.__main__ import main
    from hpc_agent.config.load import resolve_config_path

    monkeypatch.delenv(paths.HOME_ENV, raising=False)
    dest = tmp_path / "mine"
    assert main(["config", "--copy", str(dest)]) == 0
    assert (dest / "configs" / "quickstart.yaml").read_text() == (paths.configs_dir() / "quickstart.yaml").read_text()
    assert (dest / "sbatch_templates" / "default.yaml").is_file()
    assert f"export {paths.HOME_ENV}={dest}" in capsys.readouterr().out
    assert main(["config", "--copy", str(dest)]) == 2  # never overwrites
    assert "not copying" in capsys.readouterr().err
    monkeypatch.setenv(paths.HOME_ENV, str(dest))
    assert resolve_config_path("quickstart") == dest / "configs" / "quickstart.yaml"


# --- issue 18: a cluster user's path, from the wheel in a new venv ---------------------------------------
MARK = "export MY_PROJECT_TEMPLATE=1"


@pytest.fixture
def project(tmp_path):
    """An empty project folder, and a newcomer's environment: an empty HOME and caches, no ops directory
    named (so the venv's own is used, as for a user), nothing pointing at the checkout."""
    from hpc_agent.core.ops_cache import OPS_DIR_ENV

    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", paths.HOME_ENV, "HPC_AGENT_RUNS", OPS_DIR_ENV)}
    env.update(HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"), MPLCONFIGDIR=str(home / ".mpl"),
               TORCH_EXTENSIONS_DIR=str(tmp_path / "torch_extensions"))
    cwd = tmp_path / "myproject"
    cwd.mkdir()
    return cwd, env


def add_setup_line(template: Path, line: str) -> None:
    text = template.read_text()
    assert "\nsetup:\n" in text
    template.write_text(text.replace("\nsetup:\n", f"\nsetup:\n  - {line}\n", 1))


@pytest.mark.slow
def test_wheel_init_then_dry_run_uses_the_copied_template(wheel_venv, project):
    cwd, env = project
    agent = wheel_venv / "bin" / "hpc-agent"
    first = run([agent, "init"], cwd=cwd, env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert (cwd / "hpc_agent.yaml").is_file() and (cwd / "sbatch_templates" / "default.yaml").is_file()
    assert "hpc-agent submit hpc_agent.yaml" in first.stdout  # the next commands
    again = run([agent, "init"], cwd=cwd, env=env)  # nothing changed: harmless
    assert again.returncode == 0 and "unchanged" in again.stdout, again.stdout + again.stderr

    add_setup_line(cwd / "sbatch_templates" / "default.yaml", MARK)
    # --force: until prepare runs, the new venv's DeepSpeed ops are not prepared, which submit otherwise refuses
    dry = run([agent, "submit", "hpc_agent.yaml", "--dry-run", "--force", "--executor", "slurm"], cwd=cwd, env=env)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "Traceback" not in dry.stderr
    assert f"\n{MARK}\n" in dry.stdout  # the project's template, not the shipped one
    assert str(wheel_venv / "bin" / "python") in dry.stdout  # the job runs the venv's interpreter
    assert not (cwd / "runs").exists()

    refused = run([agent, "init"], cwd=cwd, env=env)  # never overwrites an edited file
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "sbatch_templates/default.yaml" in refused.stderr and "--force" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert MARK in (cwd / "sbatch_templates" / "default.yaml").read_text()
    forced = run([agent, "init", "--force"], cwd=cwd, env=env)
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert MARK not in (cwd / "sbatch_templates" / "default.yaml").read_text()
    help_ = run([agent, "init", "--help"], cwd=cwd, env=env)
    assert help_.returncode == 0 and "--force" in help_.stdout


@pytest.mark.slow
@pytest.mark.slurm
def test_wheel_init_prepare_submit_completes_on_the_cluster(wheel_venv, project):
    """The README's path without root: init, prepare (the venv's own ops directory: a new venv has none
    prepared, and a job never compiles), submit; the job runs the venv's python on the nodes."""
    from tests.slurm_helpers import cleanup_jobs, log_text, states, wait_for

    cwd, env = project
    agent = wheel_venv / "bin" / "hpc-agent"
    assert run([agent, "init"], cwd=cwd, env=env).returncode == 0
    add_setup_line(cwd / "sbatch_templates" / "default.yaml", MARK)
    prepared = run([agent, "prepare"], cwd=cwd, env=env, timeout=900)
    assert prepared.returncode == 0, prepared.stdout + prepared.stderr
    assert str(wheel_venv / "share" / "hpc_agent" / "deepspeed_ops") in prepared.stdout
    try:
        submitted = run([agent, "submit", "hpc_agent.yaml", "--executor", "slurm", "--wait", "--wait-timeout", "240",
                         "train.max_steps=6", "train.ckpt_every=3", "train.precision=fp32"],
                        cwd=cwd, env=env, timeout=300)
        (run_dir,) = [p for p in (cwd / "runs").iterdir() if p.is_dir()]
        job = json.loads((run_dir / "run.json").read_text())["job_ids"][-1]
        log = log_text(run_dir, job)
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr + log
        assert wait_for(lambda: states(job)[-1:] == ["COMPLETED"], 60, what=f"job {job} COMPLETED in sacct")
    finally:
        cleanup_jobs(cwd / "runs")
    assert MARK in (run_dir / "slurm" / f"{job}_submission.sh").read_text()
    assert (run_dir / "sbatch_templates" / "default.yaml").is_file()  # kept for the watcher's resubmissions
    assert "DeepSpeed op deepspeed_shm_comm: loaded the prepared build" in log
    assert [p for p in (run_dir / "checkpoints").iterdir() if p.is_dir()], "no checkpoint"
    assert list((run_dir / "tb").rglob("events.out.tfevents.*")), "no TensorBoard events"
    assert not (cwd.parent / "torch_extensions").exists()  # nothing was compiled in the job

"""launch/ops.py with the real torch and DeepSpeed: a process loads the ops ``scripts/setup.sh`` prepared and
compiles nothing; an unprepared op or a missing extra ends training with exit 72 and the fix, in seconds;
``python -m hpc_agent.prepare`` is idempotent and clears a lock left by a killed build."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.common import expect, run, snapshot
from hpc_agent.core.exit_codes import EXIT_ENVIRONMENT
from hpc_agent.core.ops_cache import MANIFEST, OPS_DIR_ENV, ops_dir, runtime_dir
from tests.conftest import REPO, run_cli

SHM_OP = "deepspeed_shm_comm"  # what every DeepSpeed job on the CPU accelerator loads at init_distributed
LOAD = ("import sys\nfrom launch.ops import install_guard, resolve_builders\ninstall_guard()\n"
        "module = resolve_builders([sys.argv[1]])[0].load()\nprint('LOADED', module.__file__)\n")


def clean_env(tmp_path: Path, **extra: str) -> dict:
    """An empty HOME and caches: only what the set-up step prepared (in the virtualenv) can be found."""
    env = {k: v for k, v in os.environ.items() if k not in (OPS_DIR_ENV, "TORCH_EXTENSIONS_DIR", "XDG_CACHE_HOME")}
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env.update({"HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"), "PYTHONPATH": str(REPO),
                "TORCH_EXTENSIONS_DIR": str(tmp_path / "torch_extensions")})
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def prepared_root() -> Path:
    root = ops_dir()
    if not any(root.glob(f"*/{MANIFEST}")):
        pytest.fail(f"no DeepSpeed ops prepared in {root}: run `{sys.executable} -m hpc_agent.prepare` "
                    "(scripts/setup.sh does)")
    return root


def test_the_prepared_op_loads_without_building_anything(tmp_path, prepared_root):
    env = clean_env(tmp_path)
    proc = subprocess.run([sys.executable, "-c", LOAD, SHM_OP], capture_output=True, text=True, env=env,
                          timeout=180, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    loaded = Path(proc.stdout.split("LOADED ")[1].split()[0])
    assert prepared_root in loaded.parents and loaded.name.startswith(SHM_OP)
    assert f"DeepSpeed op {SHM_OP}: loaded the prepared build" in proc.stdout
    # Nothing was built or cached for this user: no torch extension dir, an empty HOME.
    assert not (tmp_path / "torch_extensions").exists()
    assert list((tmp_path / "home").iterdir()) == []


def test_an_unprepared_op_is_refused_at_once_with_the_fix(tmp_path, prepared_root):
    env = clean_env(tmp_path, **{OPS_DIR_ENV: str(tmp_path / "empty_ops")})
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", LOAD, SHM_OP], capture_output=True, text=True, env=env,
                          timeout=180, cwd=str(tmp_path))
    assert time.monotonic() - started < 60
    assert proc.returncode != 0 and "OpNotPrepared" in proc.stderr
    assert f"DeepSpeed op {SHM_OP} is not prepared" in proc.stderr
    assert f"{OPS_DIR_ENV}={tmp_path / 'empty_ops'} {sys.executable} -m hpc_agent.prepare" in proc.stderr
    assert not (tmp_path / "torch_extensions").exists()  # it did not start a build either


def test_training_exits_72_when_an_op_is_not_prepared(tmp_path, monkeypatch, prepared_root):
    monkeypatch.setenv(OPS_DIR_ENV, str(tmp_path / "empty_ops"))
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "torch_extensions"))
    cfg = snapshot(tmp_path / "cfg.yaml", train={"max_steps": 2})
    started = time.monotonic()
    result = run(cfg, tmp_path / "run", timeout=120)
    expect(result, EXIT_ENVIRONMENT, "[hpc_agent] environment problem: DeepSpeed op", "-m hpc_agent.prepare",
           f"exiting {EXIT_ENVIRONMENT}")
    assert time.monotonic() - started < 60
    assert "Traceback" not in result.stdout
    assert not (tmp_path / "torch_extensions").exists()


def test_training_exits_72_when_an_extra_is_missing(tmp_path, monkeypatch, prepared_root):
    # A stand-in 'sklearn' that is not installed, as a user without the tabular extra would have it.
    fake = tmp_path / "site" / "sklearn"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'sklearn'\", name='sklearn')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    cfg = snapshot(tmp_path / "cfg.yaml", train={"workload": "classifier", "max_steps": 2})
    result = run(cfg, tmp_path / "run", timeout=120)
    expect(result, EXIT_ENVIRONMENT, "[hpc_agent] environment problem:", "pip install 'hpc_agent[tabular]'")
    assert "Traceback" not in result.stdout


def test_prepare_keeps_what_is_prepared_and_clears_a_killed_builds_lock(tmp_path, prepared_root):
    from launch.ops import current_runtime

    source = runtime_dir(prepared_root, current_runtime())
    root = tmp_path / "ops"
    shutil.copytree(source, root / source.name, ignore=shutil.ignore_patterns("build", ".prepare.lock"))
    lock = root / source.name / "build" / SHM_OP / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    env = clean_env(tmp_path)
    res = run_cli("-m", "hpc_agent.prepare", "--ops-dir", str(root), env=env, timeout=300, cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"removed a build lock left by an interrupted build: {lock}" in res.stdout
    assert f"{SHM_OP}: already prepared" in res.stdout and "compiling" not in res.stdout
    assert not lock.exists()
    assert run_cli("-m", "hpc_agent.prepare", "--check", "--ops-dir", str(root), env=env, cwd=tmp_path).returncode == 0
    missing = run_cli("-m", "hpc_agent.prepare", "--check", "--ops-dir", str(tmp_path / "none"), env=env,
                      cwd=tmp_path)
    assert missing.returncode == 1 and f"{SHM_OP}: not prepared" in missing.stdout


def test_prepare_names_an_unknown_op(tmp_path, prepared_root):
    res = run_cli("-m", "hpc_agent.prepare", "--op", "no_such_op", "--ops-dir", str(tmp_path / "ops"),
                  env=clean_env(tmp_path), cwd=tmp_path)
    assert res.returncode == 2 and "unknown DeepSpeed op(s)" in res.stderr and "Traceback" not in res.stderr


def test_the_guard_probes_only_the_op_init_distributed_asks_about_and_runs_no_compiler(tmp_path, prepared_root):
    """DeepSpeed's compatibility table used to probe every op at the first init_distributed, compiling a
    test program for async_io inside the job; with the guard only the shm comm op is probed, no subprocess."""
    code = ("import subprocess, deepspeed.ops\nfrom launch.ops import install_guard\n"
            "def refuse(*a, **k):\n    raise AssertionError(f'subprocess in a job: {a[:1]}')\n"
            "install_guard(log=lambda s: None)\n"
            "subprocess.Popen = refuse\n"
            "from deepspeed.comm.torch import build_shm_op\n"
            "assert build_shm_op() is not None\n"
            "print('PROBED', sorted(deepspeed.ops.__compatible_ops__.items()))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(tmp_path),
                          timeout=180, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"PROBED [('{SHM_OP}', True)]" in proc.stdout, proc.stdout

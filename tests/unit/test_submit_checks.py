"""submit catches at submit what would otherwise fail after the queue wait (issue 44, item 5): a train.workload
whose module or callable does not exist (found on the file system, never imported), and a DeepSpeed op the
job loads that is not prepared for the job's Python (the check doctor runs). Each is exit 2 with the fix."""
from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

from hpc_agent import submit
from hpc_agent.checks import envcheck
from hpc_agent.config.load import load_config
from hpc_agent.config.user_code import missing_callable, missing_submodule
from hpc_agent.core.fsutil import atomic_write_json
from hpc_agent.core.ops_cache import (MANIFEST, OPS_DIR_ENV, PreparedOp, Runtime, job_ops, manifest_data,
                                      python_tag, runtime_dir, sha256_of)
from hpc_agent.jobs import workload_lookup

VERSIONS = {"torch": "2.13.0+cpu", "deepspeed": "0.19.8"}
SIDE_EFFECT = "IMPORTED_AT_SUBMIT"
MODEL = (f"open({SIDE_EFFECT!r}, 'w').write('model.py ran')  # a side effect: submit must never run this\n"
         "import os\n\n\ndef build(cfg, device):\n    raise NotImplementedError\n")


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A user's folder holding ``my_pkg/model.py`` (``build``, and a file written at import); submit runs there.
    The job's ops are looked for in an empty ops dir, with stand-in torch/DeepSpeed versions."""
    pkg = tmp_path / "my_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(f"open({SIDE_EFFECT!r}, 'w').write('__init__ ran')\n")
    (pkg / "model.py").write_text(MODEL)
    (pkg / "data.py").write_text("def load():\n    return []\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(OPS_DIR_ENV, str(tmp_path / "ops"))
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    real = envcheck.metadata.version
    monkeypatch.setattr(envcheck.metadata, "version", lambda dist: VERSIONS.get(dist) or real(dist))
    monkeypatch.setattr(envcheck, "precompiled_ops", lambda: ("", frozenset()))
    return tmp_path


def prepare_ops(root: Path, name: str = "deepspeed_shm_comm", accelerator: str = "cpu") -> None:
    """What ``python -m hpc_agent.prepare`` leaves behind, for the stand-in versions."""
    where = runtime_dir(root, Runtime(accelerator, python_tag(), VERSIONS["torch"], VERSIONS["deepspeed"]))
    where.mkdir(parents=True, exist_ok=True)
    lib = where / f"{name}-abc.so"
    lib.write_bytes(b"\x7fELF stand-in op")
    op = PreparedOp(name, lib.name, sha256_of(lib), lib.stat().st_size, ("avx512f",), "gpu-node", 1.0)
    atomic_write_json(where / MANIFEST, manifest_data(Runtime(accelerator, python_tag(), VERSIONS["torch"],
                                                              VERSIONS["deepspeed"]), [op]))


def dry_run(root: Path, capsys, *overrides: str, executor: str = "local"):
    code = submit.main(["quickstart", "--dry-run", "--executor", executor, f"run.runs_root={root / 'runs'}",
                        *overrides])
    out = capsys.readouterr()
    return code, out.out, out.err


def not_imported(root: Path) -> None:
    assert not (root / SIDE_EFFECT).exists(), "submit ran the user's module"
    assert not any(name == "my_pkg" or name.startswith("my_pkg.") for name in sys.modules)
    assert not (root / "runs").exists()


# ---- the workload: found, never imported ----------------------------------------------------------------
def test_a_mistyped_submodule_is_refused_with_the_module_meant(project, capsys):
    prepare_ops(project / "ops")
    code, _, err = dry_run(project, capsys, "train.workload=my_pkg.modle:build")
    assert code == 2, err
    assert "train.workload" in err and "has no module 'modle'" in err and "did you mean my_pkg.model:build?" in err
    assert "submit from the folder" not in err  # the package was found: the folder is not the mistake
    not_imported(project)


def test_a_mistyped_callable_is_refused_naming_it(project, capsys):
    prepare_ops(project / "ops")
    code, _, err = dry_run(project, capsys, "train.workload=my_pkg.model:buidl")
    assert code == 2, err
    assert "has no 'buidl'" in err and "did you mean my_pkg.model:build?" in err and "fix the name after ':'" in err
    not_imported(project)


def test_a_correct_reference_proceeds_without_running_the_module(project, capsys):
    prepare_ops(project / "ops")
    code, out, err = dry_run(project, capsys, "train.workload=my_pkg.model:build")
    assert code == 0, err
    assert f"# Workload: my_pkg.model:build found in {project / 'my_pkg' / 'model.py'} (read, not run)" in out
    assert "# Code snapshot: 3 files" in out
    not_imported(project)


def test_force_does_not_pass_a_workload_that_does_not_exist(project, capsys):
    code, _, err = dry_run(project, capsys, "train.workload=my_pkg.modle:build", "--force")
    assert code == 2 and "did you mean my_pkg.model:build?" in err
    not_imported(project)


def test_every_problem_is_reported_at_once(project, capsys):
    """A mistyped callable and unprepared ops: both in one report, one exit 2."""
    code, _, err = dry_run(project, capsys, "train.workload=my_pkg.model:buidl")
    assert code == 2
    assert "1 problem in the config:" in err and "has no 'buidl'" in err
    assert "1 problem with the job's environment:" in err and "deepspeed_shm_comm is not prepared" in err
    assert err.count("Nothing was submitted.") == 1


def test_without_the_snapshot_the_job_python_path_is_followed(project, capsys):
    prepare_ops(project / "ops")
    code, _, err = dry_run(project, capsys, "train.workload=my_pkg.modle:build", "train.snapshot_code=false")
    assert code == 2 and "did you mean my_pkg.model:build?" in err
    code, _, err = dry_run(project, capsys, "train.workload=nowhere_pkg_q.model:build", "train.snapshot_code=false")
    assert code == 2 and "No module named 'nowhere_pkg_q'" in err and "submit from the folder" in err
    not_imported(project)


# ---- the ops the job loads, for its Python ------------------------------------------------------------------
def test_unprepared_ops_are_refused_with_the_prepare_command(project, capsys):
    code, out, err = dry_run(project, capsys)
    assert code == 2, err
    assert "DeepSpeed op deepspeed_shm_comm is not prepared" in err
    assert f"{OPS_DIR_ENV}={project / 'ops'} {sys.executable} -m hpc_agent.prepare" in err
    assert "--force" in err and out == ""


def test_prepared_ops_proceed(project, capsys):
    prepare_ops(project / "ops")
    code, out, err = dry_run(project, capsys)
    assert code == 0, err
    assert "# DeepSpeed ops: deepspeed_shm_comm prepared in" in out and "# Dry run" in out


def test_force_submits_past_unprepared_ops_with_a_warning(project, capsys):
    code, out, err = dry_run(project, capsys, "--force")
    assert code == 0, err
    assert "# DeepSpeed ops (--force: submitted anyway): DeepSpeed op deepspeed_shm_comm is not prepared" in out


@pytest.mark.parametrize("overrides,says", [
    (("container.runtime=pyxis", "container.image=nvcr.io#nvidia/pytorch:24.05-py3"), "not checked: the job runs"),
    (("slurm.gpus_per_node=1",), "none needed (accelerator cuda, train.offload=none)"),
    (("slurm.python=/nonexistent/venv/bin/python",), "not checked: slurm.python /nonexistent/venv/bin/python is "
                                                     "not on this machine"),
])
def test_where_the_ops_check_does_not_apply_the_dry_run_says_why(project, capsys, overrides, says):
    code, out, err = dry_run(project, capsys, *overrides, executor="slurm")
    assert code == 0, err
    assert f"# DeepSpeed ops: {says}" in out


def test_a_gpu_job_with_offload_needs_cpu_adam_prepared_where_cuda_is(project, capsys):
    prepare_ops(project / "ops")  # the CPU set does not count for a cuda job
    code, _, err = dry_run(project, capsys, "slurm.gpus_per_node=1", "train.offload=optimizer", "train.zero_stage=2",
                           executor="slurm")
    assert code == 2 and "DeepSpeed op cpu_adam is not prepared" in err and "srun --gpus=1" in err
    prepare_ops(project / "ops", "cpu_adam", accelerator="cuda")
    code, out, err = dry_run(project, capsys, "slurm.gpus_per_node=1", "train.offload=optimizer", "train.zero_stage=2",
                           executor="slurm")
    assert code == 0, err
    assert "# DeepSpeed ops: cpu_adam prepared in" in out


def test_command_mode_only_warns(project, capsys):
    (project / "train.py").write_text("print('hi')\n")
    code, out, err = dry_run(project, capsys, "train.command=[python,train.py]")
    assert code == 0, err
    assert "deepspeed_shm_comm is not prepared" in out and "train.command: this matters if your script" in out


def test_ops_compiled_into_deepspeed_need_no_prepare(project):
    cfg = load_config("quickstart", [], env={})
    assert envcheck.check_job_ops(cfg)[0] == envcheck.FAIL
    assert envcheck.check_deepspeed_ops(ops=["deepspeed_shm_comm"], accelerator="cpu",
                                        precompiled=lambda: ("cpu", frozenset({"deepspeed_shm_comm"})))[0] == "OK"
    assert envcheck.check_deepspeed_ops(ops=["deepspeed_shm_comm"], accelerator="cpu",
                                        precompiled=lambda: ("cuda", frozenset({"deepspeed_shm_comm"})))[0] == "FAIL"


def test_precompiled_ops_are_read_without_importing_deepspeed():
    before = {name for name in ("deepspeed", "torch") if name in sys.modules}
    accelerator, ops = envcheck.precompiled_ops()
    assert isinstance(accelerator, str) and isinstance(ops, frozenset)
    assert {name for name in ("deepspeed", "torch") if name in sys.modules} == before


def test_another_job_python_runs_the_same_check_in_a_subprocess(project, tmp_path):
    calls = []

    def run(argv, **kw):
        calls.append((argv, kw))
        return type("P", (), {"returncode": 0, "stderr": "", "stdout": "noise\n" + json.dumps(
            ["FAIL", "deepspeed ops", "DeepSpeed op deepspeed_shm_comm is not prepared ... Fix: x"])})()

    other = tmp_path / "venv" / "bin" / "python"
    other.parent.mkdir(parents=True)
    other.write_text("#!/bin/sh\n")
    other.chmod(0o755)
    cfg = load_config("quickstart", [f"slurm.python={other}"], env={})
    level, detail = envcheck.check_job_ops(cfg, run=run)
    assert level == "FAIL" and "not prepared" in detail
    (argv, kw), = calls
    assert argv[0] == str(other) and json.loads(argv[3]) == ["deepspeed_shm_comm"] and argv[4] == "cpu"
    assert kw["timeout"] == envcheck.JOB_OPS_TIMEOUT_S and kw["cwd"] != str(project)  # not the user's folder
    ast.parse(argv[2])  # the probe is Python

    def broken(argv, **kw):
        return type("P", (), {"returncode": 1, "stdout": "", "stderr": "SyntaxError: invalid syntax"})()

    level, detail = envcheck.check_job_ops(cfg, run=broken)
    assert level == envcheck.SKIP and "could not run the check" in detail and "SyntaxError" in detail


def test_the_probe_runs_in_a_real_interpreter(tmp_path):
    """The subprocess end for real: another path to this interpreter (a link outside its venv) answers."""
    link = tmp_path / "python3"
    link.symlink_to(sys.executable)
    cfg = load_config("quickstart", [f"slurm.python={link}"], env={})
    level, detail = envcheck.check_job_ops(cfg)
    assert level in ("OK", "FAIL", "WARN"), detail  # answered, whatever its environment holds


def test_job_ops_follow_the_optimizer_choice():
    assert job_ops("cpu", "none") == job_ops("cpu", "optimizer") == ["deepspeed_shm_comm"]
    assert job_ops("cuda", "none") == [] and job_ops("cuda", "optimizer") == ["cpu_adam"]


# ---- the lookup itself ----------------------------------------------------------------------------------------
def _write(root: Path, files: dict) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.mark.parametrize("source,names", [
    ("def build(c, d): pass\nclass W: pass\nx, (y, *z) = 1, (2, 3)\nn: int = 1\n",
     {"build", "W", "x", "y", "z", "n"}),
    ("import os.path\nimport numpy as np\nfrom a.b import c, d as e\n", {"os", "np", "c", "e"}),
    ("try:\n    from fast import build\nexcept ImportError:\n    def build(c, d): pass\n", {"build"}),
    ("if True:\n    build = 1\nelse:\n    other = 2\nwith open('f') as fh:\n    pass\n", {"build", "other", "fh"}),
    ("class M:\n    def __init__(self):\n        setattr(self, 'x', 1)\n", {"M"}),  # a method's setattr
    ("from torch import *\n", None),
    ("def __getattr__(name):\n    return 1\n", None),
    ("globals()['build'] = lambda c, d: None\n", None),
])
def test_top_level_names(source, names):
    assert workload_lookup.top_level_names(ast.parse(source)) == names


@pytest.mark.parametrize("files,ref,problem", [
    ({"p/__init__.py": "", "p/m.py": "def build(c, d): pass\n"}, "p.m:build", None),
    ({"p/__init__.py": "", "p/sub/__init__.py": "", "p/sub/m.py": "def build(c, d): pass\n"}, "p.sbu.m:build",
     "did you mean p.sub.m:build?"),
    ({"p/__init__.py": "", "p/m.py": ""}, "p.m.x:build", "'p.m' (" ),
    ({"p/__init__.py": "", "p/m.py": "x = 1\n"}, "p.zzz:build", "its modules: m"),
    ({"p/__init__.py": "", "p/m.py": "def build(c, d):\n  return (\n"}, "p.m:build", "SyntaxError"),
    ({"p/__init__.py": "from .m import build\n", "p/m.py": "def build(c, d): pass\n"}, "p:build", None),
    ({"p/__init__.py": "", "p/m.py": "x = 1\n"}, "p:m", None),  # a submodule named after ':'
    ({"p/__init__.py": "__path__.append('/elsewhere')\n"}, "p.anything:build", None),  # cannot tell: no refusal
    ({"p/__init__.py": "", "p/m.py": "from x import *\n"}, "p.m:build", None),
    ({"p.py": "def build(c, d): pass\n"}, "p:build", None),
    ({"p/m.py": "def build(c, d): pass\n"}, "p.m:build", None),  # a namespace package
])
def test_lookup(tmp_path, files, ref, problem):
    _write(tmp_path, files)
    found = workload_lookup.lookup(ref, tmp_path)
    if problem is None:
        assert found.problems == [], found.problems
    else:
        (p,) = found.problems
        assert p.key == "train.workload" and problem in p.expected, p.expected


def test_the_job_and_submit_say_it_the_same_way():
    """One home for the words: the job (launch/workloads/user.py) calls these too."""
    text = missing_submodule("my_pkg.modle.sub:build", "my_pkg", "/x/my_pkg", "modle", ["model", "data"])
    assert "did you mean my_pkg.model.sub:build?" in text and "fix the module path before ':'" in text
    assert "its modules: data, model" in missing_submodule("p.q:b", "p", "/x/p", "zzz", ["data", "model"])
    assert "is a module, not a package" in missing_submodule("p.m.x:b", "p.m", "/x/p/m.py", "x", None)
    text = missing_callable("p.m:Factory.mkae", "/x/p/m.py", "Factory", ["Factroy"])
    assert "did you mean p.m:Factroy.mkae?" in text
    assert "did you mean" not in missing_callable("p.m:build", "/x", "build", ["os", "torch"])


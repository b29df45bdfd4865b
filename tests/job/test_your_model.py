"""Your own model (docs/your_model.md): ``train.workload: package.module:build``.

The example trained here is read from the doc page itself (tests/helpers/doc_example.py)."""
from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

import pytest
import torch

from helpers.common import expect, run, snapshot
from hpc_agent.config.load import build_config
from hpc_agent.core.exit_codes import EXIT_CONFIG
from hpc_agent.policy.preflight import SKIP, memory_verdict
from launch.workloads.common import Workload
from launch.workloads.registry import build_workload
from launch.workloads.user import WorkloadError
from tests.conftest import run_cli
from tests.helpers.doc_example import example_code, write_package

NO_SLURM_PATH = os.path.dirname(sys.executable)


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A fresh package name per test (imports are cached), importable through sys.path."""
    counter = iter(range(1000))

    def make(files: dict) -> str:
        name = f"userpkg_{tmp_path.name.replace('-', '_')}_{next(counter)}"
        for rel, text in files.items():
            path = tmp_path / name / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        return name

    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    return make


def _cfg(ref: str, **train):
    return build_config([{"train": {"workload": ref, "seed": 7, **train}}])


def test_doc_example_builds_a_deterministic_workload(package):
    name = package({"__init__.py": "", "model.py": example_code()})
    workload = build_workload(_cfg(f"{name}.model:build"), "cpu")
    assert isinstance(workload, Workload) and isinstance(workload.model, torch.nn.Module)
    whole, part = workload.batch(0, 8), workload.batch(3, 2)
    assert torch.equal(whole["x"][3:5], part["x"]) and torch.equal(whole["y"][3:5], part["y"])
    again = build_workload(_cfg(f"{name}.model:build"), "cpu")
    assert all(torch.equal(a, b) for a, b in zip(workload.model.parameters(), again.model.parameters()))
    loss = workload.loss(workload.model, whole)
    assert loss.dim() == 0 and loss.dtype == torch.float32
    workload.model.train()
    metrics = workload.evaluate(workload.model)
    assert set(metrics) == {"eval/loss"} and workload.model.training


def test_dotted_callable(package):
    code = example_code() + "\n\nclass Factory:\n    make = staticmethod(build)\n"
    name = package({"__init__.py": "", "model.py": code})
    assert isinstance(build_workload(_cfg(f"{name}.model:Factory.make"), "cpu"), Workload)


BAD = {
    "missing module": ({}, "{name}.nope:build", ["was not found", "has no module 'nope'", "fix the module path"]),
    "mistyped module": ({"model.py": "def build(cfg, device):\n    pass\n"}, "{name}.modle:build",
                        ["has no module 'modle'", "did you mean ", ".model:build?"]),
    "not a package": ({"m.py": "x = 1\n"}, "{name}.m.sub:build", ["is a module, not a package"]),
    "missing callable": ({"m.py": "x = 1\n"}, "{name}.m:build", ["has no 'build'", "fix the name after ':'"]),
    "mistyped callable": ({"m.py": "def build(cfg, device):\n    pass\n"}, "{name}.m:biuld",
                          ["has no 'biuld'", "did you mean ", ".m:build?"]),
    "not callable": ({"m.py": "build = 3\n"}, "{name}.m:build", ["is a int"]),
    "missing dependency": ({"m.py": "import not_installed_dep_xyz\n"}, "{name}.m:build",
                           ["not_installed_dep_xyz", "install that package"]),
    "module raises": ({"m.py": "raise RuntimeError('boom at import')\n"}, "{name}.m:build",
                      ["RuntimeError: boom at import", "m.py:1"]),
    "build raises": ({"m.py": "def build(cfg, device):\n    raise ValueError('bad size')\n"}, "{name}.m:build",
                     ["ValueError: bad size", "m.py:2"]),
    "wrong type": ({"m.py": "def build(cfg, device):\n    return 42\n"}, "{name}.m:build",
                   ["returned a int", "missing model, tokens_per_sample, batch, loss, evaluate"]),
    "model not a module": ({"m.py": "class W:\n    model = 'x'\n    tokens_per_sample = 1\n"
                                    "    def batch(self, s, c): pass\n    def loss(self, m, b): pass\n"
                                    "    def evaluate(self, m): pass\n"
                                    "def build(cfg, device):\n    return W()\n"}, "{name}.m:build",
                           ["model is a str, not a torch.nn.Module"]),
    "loss not callable": ({"m.py": "import torch\nclass W:\n    model = torch.nn.Linear(1, 1)\n"
                                   "    tokens_per_sample = 1\n    loss = None\n"
                                   "    def batch(self, s, c): pass\n    def evaluate(self, m): pass\n"
                                   "def build(cfg, device):\n    return W()\n"}, "{name}.m:build",
                          ["not callable: loss"]),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_references_are_clear_config_errors(package, case):
    files, ref, words = BAD[case]
    name = package({"__init__.py": "", **files})
    with pytest.raises(WorkloadError) as err:
        build_workload(_cfg(ref.format(name=name)), "cpu")
    (problem,) = err.value.problems
    assert problem.key == "train.workload"
    for word in words:
        assert word in err.value.line(), err.value.line()


def test_login_node_memory_check_skips_your_own_model():
    cfg = build_config([{"train": {"workload": "my_model.model:build"}, "slurm": {"gpus_per_node": 1}}])
    verdict = memory_verdict(cfg, 80 << 30, "test")
    assert verdict.level == SKIP and "your own workload my_model.model:build" in verdict.message
    assert "my_model" not in sys.modules  # never imported on the login node


def test_job_exits_78_with_one_line_for_a_bad_workload(tmp_path):
    cfg = snapshot(tmp_path / "cfg.yaml", train={"workload": "absent_pkg_xyz.model:build", "max_steps": 2})
    result = run(cfg, tmp_path / "run")
    expect(result, EXIT_CONFIG, "[hpc_agent] workload problem: train.workload: got 'absent_pkg_xyz.model:build'",
           f"exiting {EXIT_CONFIG}")
    assert "Traceback" not in result.stdout


@pytest.mark.slow
def test_doc_example_trains_locally_from_its_snapshot_and_resumes(tmp_path):
    """submit (local executor) from the package's parent: the run trains from <run dir>/code; a second
    attempt (from the repo, where my_model does not exist) imports the snapshot and resumes."""
    write_package(tmp_path)
    root = tmp_path / "runs"
    proc = run_cli("-m", "hpc_agent.submit", "quickstart", "--executor", "local", "--wait", f"run.runs_root={root}",
                   "train.workload=my_model.model:build", "train.max_steps=4", "train.ckpt_every=2",
                   "train.eval_every=2", env={"PATH": NO_SLURM_PATH}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "code:         " in proc.stdout and "finished: COMPLETED" in proc.stdout
    (run_dir,) = [p for p in root.iterdir() if p.is_dir()]
    info = json.loads((run_dir / "run.json").read_text())
    manifest = json.loads((run_dir / "code" / "MANIFEST.json").read_text())
    assert info["code_snapshot"] == {k: manifest[k] for k in ("source", "sha256", "files", "bytes", "path")}
    log = Path(info["logs"][0]).read_text()
    assert "[my_model] version 1" in log and "first on the import path" in log and "done: 4 steps" in log

    from hpc_agent.config.load import load_snapshot, to_yaml

    cfg = load_snapshot(str(run_dir / "config.yaml"))
    cfg.train.max_steps = 6
    longer = tmp_path / "longer.yaml"
    longer.write_text(to_yaml(cfg))
    result = run(longer, run_dir)  # cwd: the repo; my_model is only in the snapshot
    expect(result, 0, "[my_model] version 1", "resumed at step 4", "done: 6 steps")


@pytest.mark.slow
@pytest.mark.parametrize("faults,repaired", [({"oom_above_micro_batch": 2}, "gpu_oom at step 1"),
                                             ({"nan_at_step": 4}, "nan_loss at step 4")])
def test_in_job_repairs_work_for_your_own_model(tmp_path, faults, repaired):
    """The OOM ladder and the divergence rollback do not care whose model it is."""
    from hpc_agent.jobs.code_snapshot import take, workload_plan

    write_package(tmp_path / "src")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    take(workload_plan("my_model.model:build", tmp_path / "src"), run_dir)  # importable only from there
    cfg = snapshot(tmp_path / "cfg.yaml", train={"workload": "my_model.model:build", "max_steps": 6,
                                                 "ckpt_every": 2}, faults=faults)
    result = run(cfg, run_dir)
    expect(result, 0, "in-job repair 1 of ", repaired, "done: 6 steps", "[my_model] version 1")

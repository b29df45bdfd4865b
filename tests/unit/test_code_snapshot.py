"""hpc_agent.jobs.code_snapshot: what submit copies of your code, its hash, its bounds, and how the job uses it."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_agent.config.load import build_config, load_config
from hpc_agent.config.problems import ConfigError
from hpc_agent.core.code_manifest import activate, digest, hash_tree, snapshot_argv
from hpc_agent.jobs import code_snapshot as cs
from hpc_agent.jobs.executor import render_job_script
from tests.conftest import run_cli
from tests.helpers.doc_example import write_package


def _tree(root: Path, files: dict) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


# ---- pure rules ----------------------------------------------------------------------------------------
def test_digest_depends_on_paths_and_contents_not_on_order():
    a = [("p/a.py", b"x = 1\n"), ("p/b.py", b"y = 2\n")]
    assert digest(a) == digest(list(reversed(a)))
    assert digest(a) != digest([("p/a.py", b"x = 2\n"), ("p/b.py", b"y = 2\n")])
    assert digest(a) != digest([("p/c.py", b"x = 1\n"), ("p/b.py", b"y = 2\n")])
    # the path/content boundary is unambiguous: moving bytes from one to the other changes the hash
    assert digest([("ab", b"c")]) != digest([("a", b"bc")])
    assert digest([]) == hashlib.sha256(b"").hexdigest()


@pytest.mark.parametrize("rel,is_dir,why", [
    (".git", True, "hidden"), (".env", False, "hidden"), ("__pycache__", True, "cache"),
    ("m.pyc", False, "bytecode"), ("venv", True, "virtualenv"), ("runs", True, "runs root"),
    ("model.py", False, None), ("data.yaml", False, None), ("sub", True, None),
])
def test_skip_rules(tmp_path, rel, is_dir, why):
    _tree(tmp_path, {"venv/pyvenv.cfg": "home = /usr\n", "runs/x": "", "sub/a.py": ""})
    assert cs.skip_reason(tmp_path / rel, is_dir, [tmp_path / "runs"]) == why


@pytest.mark.parametrize("workload,command,snapshot,wanted", [
    ("gpt", None, True, False), ("classifier", None, True, False), ("my.mod:build", None, True, True),
    ("my.mod:build", None, False, False), ("gpt", ["python", "train.py"], True, True),
])
def test_wanted(workload, command, snapshot, wanted):
    cfg = build_config([{"train": {"workload": workload, "command": command, "snapshot_code": snapshot}}])
    assert cs.wanted(cfg) is wanted
    assert bool(cs.setup_lines(cfg)) is wanted


@pytest.mark.parametrize("argv,manifest,expected", [
    (["python", "train.py", "--lr", "1"], {"argv_index": 1, "script": "train.py"},
     ["python", "/run/code/train.py", "--lr", "1"]),
    (["python", "-u", "src/t.py"], {"argv_index": 2, "script": "t.py"}, ["python", "-u", "/run/code/t.py"]),
    (["torchrun", "x"], {"argv_index": None, "script": None}, ["torchrun", "x"]),
    (["python", "a.py"], {"argv_index": 7, "script": "a.py"}, ["python", "a.py"]),  # out of range: unchanged
])
def test_snapshot_argv(argv, manifest, expected):
    assert snapshot_argv(argv, manifest, Path("/run/code")) == expected


def test_script_index_takes_the_first_existing_py_under_cwd(tmp_path):
    _tree(tmp_path, {"proj/src/train.py": "", "outside.py": ""})
    cwd = tmp_path / "proj"
    assert cs.script_index(["python", "missing.py", "src/train.py", "other.py"], cwd) == 2
    assert cs.script_index(["python", "-m", "pkg.train"], cwd) is None
    assert cs.script_index(["python", "../outside.py"], cwd) is None  # not under the submit's folder
    assert cs.script_index(["python", str(cwd / "src/train.py")], cwd) == 1


# ---- planning ------------------------------------------------------------------------------------------
def test_workload_package_found_in_cwd_without_importing_it(tmp_path):
    pkg = _tree(tmp_path, {"mypkg_cs1/__init__.py": "raise SystemExit('imported!')\n",
                           "mypkg_cs1/model.py": "x = 1\n", "mypkg_cs1/conf/a.yaml": "a: 1\n",
                           "mypkg_cs1/__pycache__/model.cpython-311.pyc": "", "mypkg_cs1/.secret": "",
                           "mypkg_cs1/.hidden/x.py": ""}) / "mypkg_cs1"
    (pkg / "link.py").symlink_to(tmp_path / "elsewhere.py")
    (pkg / "linkdir").symlink_to(tmp_path)
    plan = cs.workload_plan("mypkg_cs1.model:build", tmp_path)
    assert plan.kind == "package" and plan.source == pkg.resolve()
    assert [rel for _, rel in plan.files] == ["mypkg_cs1/__init__.py", "mypkg_cs1/conf/a.yaml", "mypkg_cs1/model.py"]
    assert "mypkg_cs1" not in sys.modules


def test_workload_single_module_is_copied_as_a_file(tmp_path):
    _tree(tmp_path, {"solo_cs2.py": "def build(cfg, device): pass\n"})
    plan = cs.workload_plan("solo_cs2:build", tmp_path)
    assert plan.kind == "module" and [rel for _, rel in plan.files] == ["solo_cs2.py"]


def test_workload_not_found_names_the_fix(tmp_path):
    with pytest.raises(ConfigError) as err:
        cs.workload_plan("nowhere_cs3.model:build", tmp_path)
    (problem,) = err.value.problems
    assert problem.key == "train.workload"
    assert "run submit from the folder that holds it" in problem.expected and "PYTHONPATH" in problem.expected


def test_workload_from_an_extension_or_builtin_module_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="snapshot_code=false"):
        cs.workload_plan("sys:exit", tmp_path)


@pytest.mark.parametrize("limits", [cs.Limits(files=2), cs.Limits(bytes=10)])
def test_bounds(tmp_path, limits):
    _tree(tmp_path, {"big_cs4/__init__.py": "", "big_cs4/a.py": "a = 1\n", "big_cs4/b.py": "b = 2\n"})
    with pytest.raises(ConfigError) as err:
        cs.workload_plan("big_cs4.a:f", tmp_path, limits=limits)
    assert "train.snapshot_code=false" in str(err.value) and ".hpcignore" in str(err.value)


def test_plan_for_config(tmp_path):
    write_package(tmp_path, "doc_cs5")
    cfg = build_config([{"train": {"workload": "doc_cs5.model:build"}, "run": {"runs_root": str(tmp_path / "runs")}}])
    assert cs.plan_for(cfg, tmp_path).kind == "package"
    off = build_config([{"train": {"workload": "doc_cs5.model:build", "snapshot_code": False}}])
    assert cs.plan_for(off, tmp_path) is None
    assert cs.plan_for(build_config([{}]), tmp_path) is None  # gpt: nothing to copy


# ---- taking it and using it ----------------------------------------------------------------------------
def test_take_writes_code_and_manifest_and_the_hash_matches(tmp_path):
    write_package(tmp_path / "src", "doc_cs6")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    manifest = cs.take(cs.workload_plan("doc_cs6.model:build", tmp_path / "src"), run_dir)
    code = run_dir / "code"
    assert (code / "doc_cs6" / "model.py").read_text() == (tmp_path / "src/doc_cs6/model.py").read_text()
    on_disk = json.loads((code / "MANIFEST.json").read_text())
    assert on_disk == manifest and manifest["files"] == 2 and manifest["path"] == str(code)
    assert hash_tree(code) == (manifest["sha256"], manifest["files"], manifest["bytes"])
    assert cs.run_json_entry(run_dir) == {k: manifest[k] for k in ("source", "sha256", "files", "bytes", "path")}
    assert not [p for p in run_dir.iterdir() if p.name.startswith(".code")]  # built aside, renamed into place
    with pytest.raises(OSError):  # never over an existing snapshot
        cs.take(cs.workload_plan("doc_cs6.model:build", tmp_path / "src"), run_dir)


def test_activate_puts_the_snapshot_first(tmp_path, monkeypatch):
    write_package(tmp_path / "src", "doc_cs7")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cs.take(cs.workload_plan("doc_cs7.model:build", tmp_path / "src"), run_dir)
    monkeypatch.setattr(sys, "path", ["", *sys.path])
    cfg = build_config([{"train": {"workload": "doc_cs7.model:build"}}])
    assert activate(cfg, run_dir)["files"] == 2
    assert sys.path[0] == str(run_dir / "code")
    off = build_config([{"train": {"workload": "doc_cs7.model:build", "snapshot_code": False}}])
    assert activate(off, run_dir) is None
    assert activate(cfg, tmp_path / "no-run") is None


def test_job_script_exports_the_snapshot_quoted_once(tmp_path):
    run_dir = tmp_path / "a b $(touch pwned)" / "r-1"
    cfg = load_config("quickstart", ["train.workload=doc_x.model:build"], env={})
    script = render_job_script(cfg, "r-1", run_dir, run_dir / "config.yaml")
    (line,) = [l for l in script.splitlines() if "PYTHONPATH" in l]
    out = subprocess.run(["bash", "-c", f"PYTHONPATH=/old; {line}; echo \"$PYTHONPATH\""], capture_output=True,
                         text=True, cwd=tmp_path).stdout.strip()
    assert out == f"{run_dir}/code:/old"
    assert not (tmp_path / "pwned").exists()
    gpt = load_config("quickstart", [], env={})
    assert "PYTHONPATH" not in render_job_script(gpt, "r-1", run_dir, run_dir / "config.yaml")


def test_dry_run_finds_the_package_from_cwd_and_refuses_when_absent(tmp_path):
    write_package(tmp_path, "doc_cs8")
    args = ("-m", "hpc_agent.submit", "quickstart", "--dry-run", "--executor", "slurm",
            f"run.runs_root={tmp_path / 'runs'}", "train.workload=doc_cs8.model:build")
    ok = run_cli(*args, cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "# Code snapshot: 2 files" in ok.stdout and "PYTHONPATH=" in ok.stdout
    assert not (tmp_path / "runs").exists()
    missing = run_cli(*args, cwd=Path(os.sep))  # no doc_cs8 there
    assert missing.returncode == 2
    assert "train.workload" in missing.stderr and "run submit from the folder that holds it" in missing.stderr
    assert "Traceback" not in missing.stderr

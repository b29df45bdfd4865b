"""The code snapshot's project rule (hpc_agent.jobs.code_snapshot.select): a git work tree's tracked and
untracked-not-ignored files, else the folder less .gitignore/.hpcignore; links; the size cap's message; where
the command runs; and what submit --dry-run says of it."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from hpc_agent.config.load import load_config
from hpc_agent.config.problems import ConfigError
from hpc_agent.core.code_manifest import hash_tree, snapshot_argv, snapshot_workdir
from hpc_agent.jobs import code_snapshot as cs
from tests.conftest import run_cli

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main",
       "-c", "commit.gpgsign=false"]


@pytest.fixture(autouse=True)
def no_outer_repo(tmp_path, monkeypatch):
    """Whatever holds the temp folder, git finds no work tree above it (only the ones a test makes)."""
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    for name in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        monkeypatch.delenv(name, raising=False)


def _tree(root: Path, files: dict) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return root


def _git(repo: Path, *args: str) -> str:
    return subprocess.run([*GIT, "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def _rels(plan) -> list:
    return [rel for _, rel in plan.files]


needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="no git on this machine: the git rule needs it")


# ---- pure rules ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("rel,target,inside", [
    ("cfg.json", "conf/params.json", True), ("a/b.json", "../conf/x.json", True), ("a/b", "../../x", False),
    ("data", "/scratch/data", False), ("data", "..", False), ("a/d", ".", True), ("x", "", False),
    ("a/b/c", "../../d/../e", True), ("a", "b/../../c", False),
])
def test_link_inside_is_judged_on_the_text(rel, target, inside):
    assert cs.link_inside(rel, target) is inside


def test_biggest_names_top_folders_then_files_biggest_first():
    entries = [("data/a.bin", 3000), ("data/b.bin", 3000), ("model.ckpt", 5000), ("src/x.py", 10), ("t.py", 20)]
    assert cs.biggest(entries, 2) == ["data/ 5.9 KiB (2 files)", "src/ 10 B (1 files)",
                                      "model.ckpt 4.9 KiB", "data/a.bin 2.9 KiB"]


def test_cap_problem_names_the_biggest_and_the_fixes(tmp_path):
    entries = [("data/a.bin", 3 << 20), ("data/b.bin", 2 << 20), ("train.py", 100)]
    assert cs.cap_problem("train.command", tmp_path, entries, cs.Limits(files=10, bytes=10 << 20)) is None
    problem = cs.cap_problem("train.command", tmp_path, entries, cs.Limits(files=10, bytes=4 << 20))
    text = problem.expected
    assert problem.key == "train.command" and "it has 3 files, 5.0 MiB" in text
    assert text.index("data/ 5.0 MiB (2 files)") < text.index("data/a.bin 3.0 MiB") < text.index("data/b.bin")
    assert str(tmp_path / ".hpcignore") in text and "train.snapshot_max_mib" in text
    assert "train.snapshot_code=false" in text
    assert "it has 3 files" in cs.cap_problem("k", tmp_path, entries, cs.Limits(files=2)).expected


@pytest.mark.parametrize("manifest,expected", [
    ({"workdir": "."}, "/r/code"), ({"workdir": "exp/a"}, "/r/code/exp/a"), ({"workdir": None}, None),
    ({"workdir": "../../etc"}, None), ({"workdir": "/etc"}, None), ({}, None), ({"workdir": 3}, None),
])
def test_snapshot_workdir(manifest, expected):
    assert snapshot_workdir(manifest, Path("/r/code")) == expected


def test_snapshot_argv_refuses_a_script_path_out_of_the_copy():
    assert snapshot_argv(["python", "t.py"], {"argv_index": 1, "script": "../../t.py"}, Path("/c")) == ["python", "t.py"]
    assert snapshot_argv(["python", "t.py"], {"argv_index": 1, "script": "exp/t.py"}, Path("/c")) == \
        ["python", "/c/exp/t.py"]


# ---- a plain folder --------------------------------------------------------------------------------------
def test_folder_rule_gitignore_hpcignore_and_default_excludes(tmp_path):
    proj = _tree(tmp_path / "proj", {
        "train.py": "", "params.json": "{}", "vocab.txt": "a b", "data/train.txt": "x", "data/big.bin": "y",
        "pkg/m.py": "", "pkg/__pycache__/m.cpython-311.pyc": "", "out.log": "", "keep.log": "",
        "notes/n.md": "", ".env": "SECRET=1", ".git-like/x": "", "venv/pyvenv.cfg": "", "venv/lib/y.py": "",
        "runs/r/x": "", ".gitignore": "*.log\ndata/*.bin\n", ".hpcignore": "notes/\n!keep.log\n"})
    plan = cs.command_plan(["python", "train.py"], proj, [proj / "runs"])
    assert plan.selection == "folder" and plan.git is None and plan.source == proj.resolve()
    assert _rels(plan) == ["data/train.txt", "keep.log", "params.json", "pkg/m.py", "train.py", "vocab.txt"]
    assert (plan.script, plan.workdir) == ("train.py", ".")


def test_folder_rule_is_the_scripts_folder_and_the_workdir_is_none_above_it(tmp_path):
    _tree(tmp_path, {"proj/src/train.py": "", "proj/src/conf.yaml": "", "proj/data/x.txt": ""})
    plan = cs.command_plan(["python", "src/train.py"], tmp_path / "proj")
    assert plan.source == (tmp_path / "proj/src").resolve() and _rels(plan) == ["conf.yaml", "train.py"]
    assert plan.workdir is None  # the submit's folder is not in the copy: the command runs there, live


def test_the_script_is_copied_even_when_ignored(tmp_path):
    proj = _tree(tmp_path / "p", {"train.py": "", "util.py": "", ".hpcignore": "*.py\n"})
    assert _rels(cs.command_plan(["python", "train.py"], proj)) == ["train.py"]


def test_links_inside_are_kept_as_links_outside_ones_are_left_out(tmp_path):
    proj = _tree(tmp_path / "p", {"train.py": "", "conf/params.json": '{"a": 1}'})
    _tree(tmp_path, {"secret.txt": "no"})
    (proj / "params.json").symlink_to("conf/params.json")
    (proj / "cfgdir").symlink_to("conf")
    (proj / "abs").symlink_to(tmp_path / "secret.txt")
    (proj / "up").symlink_to("../secret.txt")
    plan = cs.command_plan(["python", "train.py"], proj)
    assert _rels(plan) == ["conf/params.json", "train.py"]
    assert plan.links == (("cfgdir", "conf"), ("params.json", "conf/params.json"))
    assert plan.outside_links == (("abs", str(tmp_path / "secret.txt")), ("up", "../secret.txt"))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    manifest = cs.take(plan, run_dir)
    code = run_dir / "code"
    assert os.readlink(code / "params.json") == "conf/params.json"
    assert json.loads((code / "params.json").read_text()) == {"a": 1}  # the copy's own file, through the link
    assert not (code / "abs").exists() and not (code / "up").is_symlink()
    assert hash_tree(code) == (manifest["sha256"], 2, manifest["bytes"])
    assert manifest["links"] == 2 and manifest["outside_links"] == [f"abs -> {tmp_path / 'secret.txt'}",
                                                                    "up -> ../secret.txt"]
    assert "left out 2 link(s) pointing outside the project: abs -> " in cs.summary(manifest)
    os.symlink("x", code / "conf" / "new")  # a link added later changes the hash
    assert hash_tree(code)[0] != manifest["sha256"]


def test_a_folder_past_the_cap_is_refused_naming_the_biggest(tmp_path):
    proj = _tree(tmp_path / "p", {"train.py": "", "data/a.bin": b"0" * 3000, "data/b.bin": b"0" * 2000,
                                  "model.ckpt": b"0" * 4000})
    with pytest.raises(ConfigError) as err:
        cs.command_plan(["python", "train.py"], proj, limits=cs.Limits(bytes=8000))
    text = str(err.value)
    assert "data/ 4.9 KiB (2 files)" in text and "model.ckpt 3.9 KiB" in text and ".hpcignore" in text
    (proj / ".hpcignore").write_text("data/\n")
    assert _rels(cs.command_plan(["python", "train.py"], proj, limits=cs.Limits(bytes=8000))) == \
        ["model.ckpt", "train.py"]
    with pytest.raises(ConfigError, match="at most 1 files"):
        cs.command_plan(["python", "train.py"], proj, limits=cs.Limits(files=1))


# ---- a git work tree -------------------------------------------------------------------------------------
@needs_git
def test_git_rule_tracked_untracked_ignored_hpcignore_and_state(tmp_path):
    repo = _tree(tmp_path / "repo", {
        "exp/train.py": "print(1)\n", "exp/params.json": '{"lr": 1}\n', "lib/util.py": "", "README.md": "",
        ".gitignore": "data/\n*.log\n", ".hpcignore": "docs/\n", "docs/big.pdf": "",
        "data/train.txt": "ignored data", "exp/run.log": "", "tracked_then_ignored.log": ""})
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "add", "-f", "tracked_then_ignored.log")
    _git(repo, "commit", "-qm", "first")
    head = _git(repo, "rev-parse", "HEAD").strip()
    (repo / "exp/params.json").write_text('{"lr": 2}\n')  # a change to a tracked file
    _tree(repo, {"exp/new_util.py": "", ".env": "SECRET=1", "lib/__pycache__/u.pyc": "",  # untracked
                 "docs/draft.md": "", "exp/data/x.log": ""})
    (repo / "lib/util.py").unlink()  # tracked, deleted since: not copied
    plan = cs.command_plan(["python", "train.py", "--data", "../data/train.txt"], repo / "exp")
    assert plan.selection == "git" and plan.source == repo.resolve()
    assert _rels(plan) == ["README.md", "exp/new_util.py", "exp/params.json",
                           "exp/train.py", "tracked_then_ignored.log"]
    assert (plan.script, plan.workdir, plan.argv_index) == ("exp/train.py", "exp", 1)
    git = plan.git
    assert git["commit"] == head and git["changed"] == 2 and git["untracked"] == 1 and git["dirty"] is True
    assert '-{"lr": 1}' in git["diff"] and '+{"lr": 2}' in git["diff"] and not git["diff_truncated"]
    assert cs.describe_source(cs.plan_manifest(plan, tmp_path / "run")) == \
        f"git {head[:12]}, dirty: 2 changed tracked files, 1 untracked file"

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    manifest = cs.take(plan, run_dir)
    code = run_dir / "code"
    assert manifest["git"]["commit"] == head and manifest["workdir"] == "exp"
    argv = snapshot_argv(["python", "train.py"], manifest, code)
    assert argv == ["python", str(code / "exp/train.py")] and Path(argv[1]).is_file()
    workdir = snapshot_workdir(manifest, code)
    assert workdir == str(code / "exp") and (Path(workdir) / "params.json").read_text() == '{"lr": 2}\n'
    assert cs.run_json_entry(run_dir)["git"] == {"commit": head, "dirty": True}


@needs_git
def test_git_without_commits_and_a_clean_tree(tmp_path):
    repo = _tree(tmp_path / "r", {"train.py": "", "conf.yaml": ""})
    _git(repo, "init", "-q")
    plan = cs.command_plan(["python", "train.py"], repo)
    assert _rels(plan) == ["conf.yaml", "train.py"] and plan.git["commit"] is None and plan.git["untracked"] == 2
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "c")
    clean = cs.command_plan(["python", "train.py"], repo)
    assert clean.git["dirty"] is False and clean.git["diff"] == ""
    assert cs.describe_source(cs.plan_manifest(clean, tmp_path)).endswith(", clean")


@needs_git
def test_git_diff_is_bounded(tmp_path, monkeypatch):
    repo = _tree(tmp_path / "r", {"train.py": "x = 0\n"})
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "c")
    (repo / "train.py").write_text("".join(f"x = {i}\n" for i in range(2000)))
    monkeypatch.setattr(cs, "DIFF_MAX_BYTES", 1000)
    git = cs.command_plan(["python", "train.py"], repo).git
    assert git["diff_truncated"] is True and 0 < len(git["diff"]) <= 1000 and git["diff"].endswith("\n")


@needs_git
def test_workload_package_in_a_git_tree_follows_the_same_rule(tmp_path):
    repo = _tree(tmp_path / "r", {"mypkg_gp1/__init__.py": "", "mypkg_gp1/model.py": "",
                                  "mypkg_gp1/cache/blob.bin": "", "mypkg_gp1/conf.yaml": "",
                                  ".gitignore": "cache/\n", "other/x.py": ""})
    _git(repo, "init", "-q")
    plan = cs.workload_plan("mypkg_gp1.model:build", repo)
    assert _rels(plan) == ["mypkg_gp1/__init__.py", "mypkg_gp1/conf.yaml", "mypkg_gp1/model.py"]
    assert plan.selection == "git"


# ---- what submit says ------------------------------------------------------------------------------------
@needs_git
def test_dry_run_prints_the_path_that_runs_its_folder_and_the_snapshot(tmp_path):
    repo = _tree(tmp_path / "proj", {"train.py": "", "params.json": "{}"})
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "c")
    head = _git(repo, "rev-parse", "HEAD").strip()
    runs = tmp_path / "runs"
    proc = run_cli("-m", "hpc_agent.submit", "quickstart", "train.command=[python,train.py,--data,data.txt]",
                   f"run.runs_root={runs}", "--dry-run", "--executor", "local", cwd=repo,
                   env={"GIT_CEILING_DIRECTORIES": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    (command,) = [line for line in proc.stdout.splitlines() if line.startswith("# Command")]
    (snap,) = [line for line in proc.stdout.splitlines() if line.startswith("# Code snapshot")]
    code = command.split("in ", 1)[1].split("):")[0]
    assert code.startswith(str(runs.resolve())) and code.endswith("/code")
    assert command.endswith(f"): python {code}/train.py --data data.txt")
    assert snap == f"# Code snapshot: 2 files, 0.0 KiB, git {head[:12]}, clean; from {repo.resolve()} -> {code}"
    assert not runs.exists()


def test_submit_past_the_cap_exits_2_naming_the_biggest_file(tmp_path):
    proj = _tree(tmp_path / "proj", {"train.py": "", "weights.bin": b"0" * (2 << 20)})
    proc = run_cli("-m", "hpc_agent.submit", "quickstart", "train.command=[python,train.py]",
                   f"run.runs_root={tmp_path / 'runs'}", "train.snapshot_max_mib=1", "--dry-run",
                   "--executor", "local", cwd=proj, env={"GIT_CEILING_DIRECTORIES": str(tmp_path)})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "weights.bin 2.0 MiB" in proc.stderr and ".hpcignore" in proc.stderr


def test_cap_fields_are_validated():
    with pytest.raises(ConfigError, match="train.snapshot_max_mib"):
        load_config("quickstart", ["train.snapshot_max_mib=0"])


def test_relative_args_the_snapshot_leaves_out_are_named(tmp_path):
    proj = _tree(tmp_path / "p", {"train.py": "", "params.json": "", "data/train.txt": "", "ok/x.txt": "",
                                  ".hpcignore": "data/\n"})
    plan = cs.command_plan(["python", "train.py"], proj)
    argv = ["python", "train.py", "--data", "data/train.txt", "--cfg=params.json", "--d2=./data", "--ok",
            "ok/x.txt", "--ok2", "ok", "--out", "new_dir", "--abs", str(proj / "data/train.txt"), "3", ".",
            "../p/train.py"]
    assert cs.left_out_args(plan, argv, proj) == ["data/train.txt", "./data"]
    assert cs.left_out_args(None, argv, proj) == []
    (proj / "src").mkdir()
    (proj / "src/t.py").write_text("")
    above = cs.command_plan(["python", "src/t.py"], proj)  # the project is src/: the command runs live in p/
    assert above.workdir is None and cs.left_out_args(above, ["python", "src/t.py", "data/train.txt"], proj) == []

"""`hpc-agent init` and the template lookup order it relies on (hpc_agent.core.paths.template_dirs): a project's
sbatch_templates/ next to the config file, then in the current directory, then the shipped folder
(HPC_AGENT_HOME, the wheel, the checkout). The wheel's end-to-end path: tests/cluster/test_wheel_install.py."""
from __future__ import annotations

from pathlib import Path

from hpc_agent import init
from hpc_agent.__main__ import main as agent
from hpc_agent.core import paths
from hpc_agent.jobs.executor import load_template


def write_template(folder: Path, line: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "default.yaml").write_text(f"setup:\n  - {line}\nsrun_args: []\n")


def test_lookup_order_config_dir_then_cwd_then_shipped(tmp_path, monkeypatch):
    monkeypatch.delenv(paths.HOME_ENV, raising=False)
    cwd, other = tmp_path / "cwd", tmp_path / "other"
    monkeypatch.chdir(tmp_path)
    assert load_template("default").srun_args == ["--kill-on-bad-exit=1"]  # nothing local: the shipped one
    write_template(cwd / "sbatch_templates", "export FROM=cwd")
    write_template(other / "sbatch_templates", "export FROM=config_dir")
    monkeypatch.chdir(cwd)
    assert load_template("default").setup == ["export FROM=cwd"]
    assert load_template("default", [other / "hpc_agent.yaml"]).setup == ["export FROM=config_dir"]
    assert paths.template_dirs([other / "x.yaml"])[:2] == [other / "sbatch_templates", cwd / "sbatch_templates"]


def test_hpc_agent_home_still_wins_over_the_checkouts_own_folder(tmp_path, monkeypatch):
    """Run from the checkout, ./sbatch_templates is the shipped folder itself, not a project's."""
    write_template(tmp_path / "sbatch_templates", "export FROM=home")
    monkeypatch.setenv(paths.HOME_ENV, str(tmp_path))
    monkeypatch.chdir(paths.code_root())
    assert load_template("default").setup == ["export FROM=home"]


def test_keep_project_template_copies_only_a_projects_own(tmp_path, monkeypatch):
    monkeypatch.delenv(paths.HOME_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    assert paths.keep_project_template("default", tmp_path / "c.yaml", run_dir) is None  # shipped: read in place
    write_template(tmp_path / "sbatch_templates", "export FROM=project")
    kept = paths.keep_project_template("default", tmp_path / "c.yaml", run_dir)
    assert kept == run_dir / "sbatch_templates" / "default.yaml"
    monkeypatch.chdir(tmp_path.parent)  # the watcher may run anywhere: the run dir's copy is found first
    assert load_template("default", [run_dir / "config.yaml"]).setup == ["export FROM=project"]


def test_init_into_a_new_dir_is_idempotent_and_refuses_edited_files(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert agent(["init", "proj"]) == 0
    out = capsys.readouterr().out
    assert "wrote proj/hpc_agent.yaml" in out and "hpc-agent submit proj/hpc_agent.yaml" in out
    shipped = sorted(p.name for p in paths.templates_dir().glob("*.yaml"))
    assert sorted(p.name for p in (tmp_path / "proj" / "sbatch_templates").iterdir()) == shipped
    assert agent(["init", "proj"]) == 0 and "unchanged" in capsys.readouterr().out
    (tmp_path / "proj" / "hpc_agent.yaml").write_text("run: {name: mine}\n")
    assert agent(["init", "proj"]) == 2
    err = capsys.readouterr().err
    assert "proj/hpc_agent.yaml" in err and "hpc-agent init --force proj" in err
    assert (tmp_path / "proj" / "hpc_agent.yaml").read_text() == "run: {name: mine}\n"
    assert init.main(["proj", "--force"]) == 0
    assert "workload: gpt" in (tmp_path / "proj" / "hpc_agent.yaml").read_text()


def test_init_reports_an_unwritable_dir_without_a_traceback(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert init.main([str(blocker / "sub")]) == 2
    assert "cannot write" in capsys.readouterr().err


def test_init_with_a_profile_names_it_in_the_next_steps(tmp_path, monkeypatch, capsys):
    """Issue 44: init --profile's "next:" block did not mention the profile, so doctor and submit as suggested
    ran without it. Each suggested doctor/submit line now carries --profile NAME, which finds the file written."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HPC_AGENT_PROFILE", raising=False)
    assert agent(["init", "proj", "--profile", "mycluster"]) == 0
    out = capsys.readouterr().out
    steps = out.split("next:\n", 1)[1].splitlines()
    assert any("edit proj/profiles/mycluster.yaml" in line for line in steps)
    commands = [line.split("#")[0].strip() for line in steps if line.strip().startswith(("hpc-agent doctor",
                                                                                         "hpc-agent submit"))]
    assert commands == ["hpc-agent doctor --profile mycluster proj/hpc_agent.yaml",
                        "hpc-agent submit --profile mycluster proj/hpc_agent.yaml --dry-run",
                        "hpc-agent submit --profile mycluster proj/hpc_agent.yaml"]
    from hpc_agent.config.load import load_config

    cfg = load_config("proj/hpc_agent.yaml", [], profile="mycluster", env={})  # as those commands load it
    assert cfg.profile.name == "mycluster"
    assert init.next_commands(tmp_path / "proj" / "hpc_agent.yaml") == \
        init.next_commands(tmp_path / "proj" / "hpc_agent.yaml", None)  # no profile: no --profile
    assert "--profile" not in "\n".join(init.next_commands(tmp_path / "proj" / "hpc_agent.yaml"))

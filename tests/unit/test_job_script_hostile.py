"""Hostile values in the job script (issue 16, must-show 4).

The real job script (``render_job_script``, and the sweep's array script from ``array_parameters``) is
rendered with placeholders and shell metacharacters in every path, then run by bash with ``srun`` replaced
by a stub that records its argv and environment. Nothing may execute (no canary file appears) and the
exported ``HPC_AGENT_*`` values, the srun arguments and the ``#SBATCH`` values (read the way sbatch reads
them) must be exactly the intended ones. Fields on an allow-list (Slurm names, times, sizes, node lists,
run names, sbatch options) take no metacharacters at all: for those the rejection is asserted.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Dict, List

import pytest

from hpc_agent.config.load import build_config, load_config
from hpc_agent.config.problems import ConfigError
from hpc_agent.core import paths, rundir
from hpc_agent.jobs import executor
from hpc_agent.jobs.executor import render_job_script
from hpc_agent.slurm.job_match import job_name_for
from hpc_agent.sweep.batch import TrialJob, array_parameters
from tests.helpers.sbatch_parse import sbatch_options

# {c} becomes a canary file name, relative to the folder the script runs in (which must stay empty), and
# ``touch`` is a stub that records any call: if any of these ever executes, the test sees it.
PAYLOADS = ["$(touch {c}1)", "`touch {c}2`", "; touch {c}3", " && touch {c}4", "| touch {c}5 |", "> {c}6",
            "${IFS}touch${IFS}{c}7", "'; touch {c}8; '", '"; touch {c}9; "', "a b  c", "*?[ab]~!", "ü€😀",
            "{config}{run_dir}{repo}{run_id}", "$HOME ${HOME} $$ $1", "{c}10 #comment", "(x)&<y"]
# Only bash ever reads these paths (never an #SBATCH line), so a backslash and '%' are fine there too.
BASH_ONLY = ["back\\slash", "100%j", "$'\\n'"]

STUB_SRUN = """#!/bin/bash
printf '%s\\0' "$@" > "$DUMP/argv"
env -0 > "$DUMP/env"
"""
STUB_TOUCH = """#!/bin/bash
echo "touch $*" >> "$EXECUTED"
"""


def hostile_path(base: Path, canary: str, tag: str, extra: List[str] = ()) -> Path:
    """A path under ``base`` with one payload per component."""
    parts = [p.replace("{c}", f"{canary}-{tag}") for p in PAYLOADS + list(extra)]
    return base.joinpath(*parts)


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """A stub srun on PATH, a hostile install folder ({repo}) and a template that uses every placeholder."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(STUB_SRUN)
    (bin_dir / "srun").chmod(0o755)
    (bin_dir / "touch").write_text(STUB_TOUCH)
    (bin_dir / "touch").chmod(0o755)
    canary = "CANARY"
    home = tmp_path / "home"  # HPC_AGENT_HOME: the shipped configs, plus templates that use every placeholder
    templates = home / "sbatch_templates"
    templates.mkdir(parents=True)
    (home / "configs").symlink_to(paths.configs_dir())
    (templates / "default.yaml").write_text(paths.templates_dir().joinpath("default.yaml").read_text())
    (templates / "every.yaml").write_text(
        "setup:\n"
        "  - export HPC_AGENT_RUN_DIR={run_dir}\n  - export HPC_AGENT_RUN_ID={run_id}\n"
        "  - export HPC_AGENT_CONFIG={config}\n  - export HPC_AGENT_REPO={repo}\n"
        "  - export HPC_AGENT_JOINED={run_dir}:{config}/{run_id}\n"
        "  - export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}\n"
        "srun_args:\n  - --kill-on-bad-exit=1\n  - --export=ALL,R={repo}\n")
    monkeypatch.setenv(paths.HOME_ENV, str(home))
    repo = hostile_path(tmp_path / "repo", canary, "repo", BASH_ONLY)  # {repo}: the install folder
    monkeypatch.setattr(executor, "code_root", lambda: repo)
    monkeypatch.setattr(paths, "code_root", lambda: repo)
    return {"templates": templates, "tmp": tmp_path, "bin": bin_dir, "canary": canary, "repo": repo}


def run_script(sandbox, script: str, env: Dict[str, str] = None, name: str = "job.sh"):
    """Run ``script`` with bash -u in an empty folder; returns (srun's argv, srun's environment)."""
    tmp = sandbox["tmp"]
    work, dump = tmp / f"work-{name}", tmp / f"dump-{name}"
    work.mkdir()
    dump.mkdir()
    path = tmp / name
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True, timeout=30).returncode == 0
    proc = subprocess.run(["bash", "-u", str(path)], cwd=work, capture_output=True, text=True, timeout=30,
                          env=dict(env or {}, PATH=f"{sandbox['bin']}:/usr/bin:/bin", DUMP=str(dump),
                                   HOME=str(tmp / "nohome"), EXECUTED=str(tmp / "executed")))
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")
    assert not (tmp / "executed").exists(), "a hostile value executed a command"
    assert list(work.iterdir()) == [], "the script created files where it ran"
    argv = (dump / "argv").read_bytes().decode().split("\0")[:-1]
    environ = dict(item.split("=", 1) for item in (dump / "env").read_bytes().decode().split("\0")[:-1])
    return argv, environ


def test_job_script_with_hostile_paths_executes_nothing_and_exports_exact_values(sandbox):
    tmp, repo = sandbox["tmp"], sandbox["repo"]
    run_dir = hostile_path(tmp / "runs", sandbox["canary"], "run")
    config = hostile_path(tmp / "cfg", sandbox["canary"], "cfg", BASH_ONLY) / "config.yaml"
    run_id = "hostile-20260101-000000"
    python = str(tmp / "bin" / "python-not-run")
    cfg = load_config("quickstart", ["slurm.template=every", "slurm.partition=low", f"slurm.python={python}"], env={})
    script = render_job_script(cfg, run_id, run_dir, config)

    argv, env = run_script(sandbox, script)
    assert env["HPC_AGENT_RUN_DIR"] == str(run_dir)
    assert env["HPC_AGENT_RUN_ID"] == run_id
    assert env["HPC_AGENT_CONFIG"] == str(config)
    assert env["HPC_AGENT_REPO"] == str(repo)
    assert env["HPC_AGENT_JOINED"] == f"{run_dir}:{config}/{run_id}"
    assert env["OMP_NUM_THREADS"] == "1"
    folder = rundir.slurm_dir(run_dir)
    assert argv == ["--unbuffered", "--output", f"{folder}/%j_%t_log.out", "--kill-on-bad-exit=1",
                    f"--export=ALL,R={repo}", python, "-u", "-m", "submitit.core._submit", str(folder)]
    options = sbatch_options(script)  # what sbatch itself reads from the #SBATCH lines
    assert options["output"] == f"{folder}/%j_0_log.out"
    assert options["job-name"] == job_name_for(run_id) and options["comment"] == f"hpc_agent run_id={run_id}"
    assert options["partition"] == "low" and options["requeue"] is True


def test_sweep_array_script_with_hostile_paths_gives_each_task_exactly_its_own_values(sandbox):
    tmp = sandbox["tmp"]
    from submitit.slurm.slurm import _make_sbatch_string

    cfg = load_config("quickstart", ["slurm.template=every"], env={})
    jobs = [TrialJob(n, f"s-t00{n}", hostile_path(tmp / "sweep" / f"t{n}", sandbox["canary"], f"t{n}"),
                     hostile_path(tmp / "sweep" / f"c{n}", sandbox["canary"], f"c{n}", BASH_ONLY) / "config.yaml", cfg)
            for n in range(3)]
    folder = hostile_path(tmp / "sweepdir", sandbox["canary"], "sweep") / "slurm"
    params = array_parameters(jobs, "sw", "b0", 2)
    script = _make_sbatch_string(command="python-not-run -m submitit.core._submit x", folder=folder, map_count=3,
                                 **params)
    assert sbatch_options(script)["output"] == f"{folder}/%A_%a_0_log.out"
    for job in jobs:
        _, env = run_script(sandbox, script, {"SLURM_ARRAY_TASK_ID": str(job.number)}, name=f"task{job.number}.sh")
        assert (env["HPC_AGENT_RUN_DIR"], env["HPC_AGENT_RUN_ID"], env["HPC_AGENT_CONFIG"]) == (
            str(job.run_dir), job.run_id, str(job.config_path))
        assert env["HPC_AGENT_REPO"] == str(sandbox["repo"])
        assert env["HPC_AGENT_JOINED"] == f"{job.run_dir}:{job.config_path}/{job.run_id}"


def test_a_sweep_template_cannot_put_a_per_task_value_into_an_srun_option(sandbox):
    """submitit quotes each srun option as one word, so a per-task shell variable there would stay literal."""
    (sandbox["templates"] / "chdir.yaml").write_text("setup: []\nsrun_args:\n  - --chdir={run_dir}\n")
    cfg = load_config("quickstart", ["slurm.template=chdir"], env={})
    with pytest.raises(ConfigError, match=r"\{run_dir\} cannot be filled"):
        array_parameters([TrialJob(0, "s-t000", sandbox["tmp"] / "r", sandbox["tmp"] / "r/config.yaml", cfg)],
                         "sw", "b0", 1)


@pytest.mark.parametrize("line", ['export X="{run_dir}"', "export X='{config}'", "export X=${repo}",
                                  "export X=\\{run_id}"])
def test_a_template_placeholder_inside_quotes_is_rejected(sandbox, line):
    """Inside "..." the value's own quotes are literal and a $(..) in it would run: the template is refused."""
    (sandbox["templates"] / "quoted.yaml").write_text(f"setup:\n  - {json.dumps(line)}\n")
    with pytest.raises(ConfigError, match="outside any quotes"):
        executor.load_template("quoted")


# Every allow-listed field, with every payload (and the canary path filled in): each is a config error
# naming that field, never a script.
ALLOW_LISTED = ["run.name", "slurm.partition", "slurm.account", "slurm.qos", "slurm.constraint", "slurm.exclude",
                "slurm.mem", "slurm.time", "slurm.template", "slurm.extra_sbatch.mail-user",
                "slurm.extra_sbatch.reservation", "slurm.extra_sbatch.begin"]


@pytest.mark.parametrize("key", ALLOW_LISTED)
def test_allow_listed_fields_reject_every_payload_naming_the_field(key, tmp_path):
    for payload in PAYLOADS + BASH_ONLY + ["ok\nsrun evil", "x" * 100_000]:
        value = "ok" + payload.replace("{c}", "CANARY")
        layer: dict = {}
        node = layer
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
        with pytest.raises(ConfigError) as info:
            build_config([layer])
        assert key in {p.key for p in info.value.problems}, (key, value, str(info.value))
        assert len(str(info.value)) < 2000, "a huge value is cut in the message"


@pytest.mark.parametrize("option", ["bad key", "Mail-type", "x;y", "a" * 65])
def test_extra_sbatch_option_names_are_allow_listed(option):
    with pytest.raises(ConfigError) as info:
        build_config([{"slurm": {"extra_sbatch": {option: "END"}}}])
    assert f"slurm.extra_sbatch.{option}" in {p.key for p in info.value.problems}


@pytest.mark.parametrize("run_dir, why", [("/r/a\\b", "backslash"), ("/r/100%j", "'%'"), ("/r/a\nb", "newline"),
                                          ("/r/" + "x" * 256, "component"), ("/r" + "/x" * 2100, "bytes")])
def test_a_run_dir_sbatch_would_misread_or_that_is_too_long_is_rejected(sandbox, run_dir, why):
    cfg = load_config("quickstart", [], env={})
    with pytest.raises(ConfigError) as info:
        render_job_script(cfg, "r-1", Path(run_dir), Path(run_dir) / "config.yaml")
    assert "run.runs_root" in {p.key for p in info.value.problems} and why in str(info.value)


@pytest.mark.parametrize("run_id", ["x$(touch /tmp/pwned)", "a b", "a;b", "{config}", "x" * 200])
def test_a_hostile_run_id_is_rejected(sandbox, run_id):
    cfg = load_config("quickstart", [], env={})
    with pytest.raises(ConfigError) as info:
        render_job_script(cfg, run_id, sandbox["tmp"] / "r", sandbox["tmp"] / "r/config.yaml")
    assert "run.name" in {p.key for p in info.value.problems}


def test_a_placeholder_in_runs_root_is_not_substituted_again(sandbox, tmp_path):
    """The issue's reproduction: runs_root '/tmp/r{config} && touch /tmp/x' used to run touch."""
    root = tmp_path / "r{config} && touch CANARY"
    cfg = load_config("quickstart", [f"run.runs_root={root}"], env={})
    assert cfg.run.runs_root == str(root)
    run_dir = Path(cfg.run.runs_root) / "q-20260101-000000"
    _, env = run_script(sandbox, render_job_script(cfg, run_dir.name, run_dir, run_dir / "config.yaml"))
    assert env["HPC_AGENT_RUN_DIR"] == str(run_dir) and env["HPC_AGENT_CONFIG"] == str(run_dir / "config.yaml")

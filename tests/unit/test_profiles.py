"""Cluster profiles (docs/profiles.md): parsing and checks, lookup order, layering, the GPU request style and
activation lines in the job script, the snapshot's record, and doctor's profile checks against fakes. Pure:
no Slurm (the real-cluster half is tests/cluster/test_profiles_slurm.py)."""
from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from hpc_agent.checks import profile_fit
from hpc_agent.config.load import load_config, load_snapshot_text, to_yaml
from hpc_agent.config.problems import ConfigError
from hpc_agent.config.profile import PROFILE_ENV, Profile, gpu_request, selected
from hpc_agent.core import paths
from hpc_agent.jobs.executor import render_job_script
from hpc_agent.slurm.sinfo import parse_partitions, parse_version

RUN_DIR = Path("/runs/quickstart-20260101-000000")


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A clean place: no profiles/ in the cwd, an empty user config dir, no $HPC_AGENT_PROFILE."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv(PROFILE_ENV, raising=False)
    return tmp_path


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def problems_of(exc: ConfigError) -> dict:
    return {p.key: p.expected for p in exc.problems}


def script(cfg) -> str:
    return render_job_script(cfg, RUN_DIR.name, RUN_DIR, RUN_DIR / "config.yaml")


# --- the Profile section: a table of bad values, each named with its fix, all at once ---------------------

BAD = [
    ({"gpu_request": "gpus"}, "profile.gpu_request", "one of gpus-per-node, gres, gres-typed"),
    ({"gpu_request": "gres-typed"}, "profile.gpu_type", "gpu_request=gres-typed"),
    ({"gpu_type": "h100"}, "profile.gpu_type", "set profile.gpu_request=gres-typed"),
    ({"gpu_request": "gres-typed", "gpu_type": "h100;rm"}, "profile.gpu_type", "a gres GPU type"),
    ({"quirks": {"sacct_jsn": True}}, "profile.quirks.sacct_jsn", "did you mean 'sacct_json'"),
    ({"quirks": {"gpus_per_node_option": False}}, "profile.gpu_request", "gres or gres-typed"),
    ({"activate": ["module load a\nmodule load b"]}, "profile.activate[0]", "without control characters"),
    ({"activate": ["echo \x1b[31m"]}, "profile.activate[0]", "\\x1b"),
    ({"activate": ["ok", "module load x \\"]}, "profile.activate[1]", "backslash"),
    ({"activate": ["#SBATCH --qos=high"]}, "profile.activate[0]", "slurm.extra_sbatch"),
    ({"activate": ["cat <<EOF"]}, "profile.activate[0]", "here-document"),
    ({"activate": ["cd {run_dir}"]}, "profile.activate[0]", "$HPC_AGENT_RUN_DIR"),
    ({"activate": ["  "]}, "profile.activate[0]", "empty"),
]


@pytest.mark.parametrize("values,key,fix", BAD, ids=[b[1] + ":" + str(b[0])[:30] for b in BAD])
def test_bad_profile_values_name_the_key_and_fix(values, key, fix):
    with pytest.raises(ConfigError) as err:
        Profile(**values)
    found = problems_of(err.value)
    assert key in found and fix in found[key], found


def test_every_problem_of_a_profile_file_is_reported_at_once(home):
    write(home / "work" / "profiles" / "bad.yaml", (
        "profile:\n  gpu_request: gpus\n  activate: [\"a\\u0007b\"]\n  quirks: {nope: true}\n"
        "slurm:\n  partiton: gpu\n  qos: 'a b'\ntrain:\n  lr: 1\n"))
    with pytest.raises(ConfigError) as err:
        load_config("quickstart", profile="bad", env={})
    keys = set(problems_of(err.value))
    assert {"profile.gpu_request", "profile.activate[0]", "profile.quirks.nope", "slurm.partiton", "slurm.qos"} <= keys
    train = [p for p in err.value.problems if p.key.endswith(": train")]
    assert train and "belong in your config file" in train[0].expected
    assert "\\x07" in err.value.render()


def test_a_profile_may_not_write_the_record(home):
    write(home / "work" / "profiles" / "p.yaml", "profile:\n  name: other\n")
    with pytest.raises(ConfigError) as err:
        load_config("quickstart", profile="p", env={})
    assert any(p.key.endswith("profile.name") and "loader writes" in p.expected for p in err.value.problems)


def test_unknown_profile_lists_where_and_what(home):
    with pytest.raises(ConfigError) as err:
        load_config("quickstart", profile="nosuch", env={})
    (problem,) = err.value.problems
    assert problem.key == "--profile" and "localhost" in problem.expected and "example" in problem.expected
    with pytest.raises(ConfigError) as err:
        load_config("quickstart", profile="../etc/passwd", env={})
    assert "no path" in err.value.problems[0].expected


# --- lookup order -----------------------------------------------------------------------------------------

def test_lookup_order_config_dir_then_cwd_then_user_then_shipped(home):
    shipped = paths.configs_dir() / "profiles" / "localhost.yaml"
    assert paths.find_profile("localhost") == shipped.absolute()
    user = write(home / "xdg" / "hpc_agent" / "profiles" / "localhost.yaml", "slurm: {partition: high}\n")
    assert paths.find_profile("localhost") == user
    cwd = write(home / "work" / "profiles" / "localhost.yaml", "slurm: {partition: lowcancel}\n")
    assert paths.find_profile("localhost") == cwd
    project = home / "project"
    config = write(project / "my.yaml", "run: {name: mine}\n")
    near = write(project / "profiles" / "localhost.yaml", "slurm: {partition: low}\n")
    assert paths.find_profile("localhost", [config]) == near
    dirs = paths.profile_dirs([config])
    assert dirs == [project / "profiles", home / "work" / "profiles", home / "xdg" / "hpc_agent" / "profiles",
                    shipped.parent.absolute()]
    assert load_config(str(config), profile="localhost", env={}).slurm.partition == "low"


def test_default_user_dir_is_dot_config(home, monkeypatch):
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(home))
    assert paths.user_config_dir() == home / ".config" / "hpc_agent"


def test_flag_beats_environment_and_empty_flag_means_none():
    env = {PROFILE_ENV: "envprof"}
    assert selected("flag", env) == "flag"
    assert selected(None, env) == "envprof"
    assert selected("", env) is None
    assert selected(None, {}) is None


# --- layering ---------------------------------------------------------------------------------------------

def test_user_file_beats_profile_beats_base(home):
    write(home / "work" / "profiles" / "site.yaml", (
        "slurm: {partition: gpu, account: proj, qos: normal, signal_lead_s: 300}\n"
        "container: {runtime: pyxis, image: 'nvcr.io#nvidia/pytorch:24.05-py3'}\n"))
    config = write(home / "work" / "my.yaml", "slurm: {qos: high}\n")
    cfg = load_config(str(config), ["slurm.account=other"], profile="site", env={})
    assert cfg.slurm.partition == "gpu"        # the profile over the schema default
    assert cfg.slurm.signal_lead_s == 300      # the profile over base.yaml (which sets 120)
    assert cfg.slurm.qos == "high"             # your file over the profile
    assert cfg.slurm.account == "other"        # the command line over both
    assert cfg.container.runtime == "pyxis" and cfg.container.image.startswith("nvcr.io")
    assert load_config(str(config), env={}).slurm.partition is None  # no profile: nothing of it


def test_environment_variable_selects_a_profile(home):
    cfg = load_config("quickstart", env={PROFILE_ENV: "localhost"})
    assert cfg.profile.name == "localhost" and cfg.slurm.partition == "low"


# --- the job script ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("style,gpu_type,line", [
    ("gpus-per-node", None, "#SBATCH --gpus-per-node=2"),
    ("gres", None, "#SBATCH --gres=gpu:2"),
    ("gres-typed", "h100", "#SBATCH --gres=gpu:h100:2"),
])
def test_gpu_request_style_in_the_job_script(home, style, gpu_type, line):
    overrides = ["slurm.gpus_per_node=2", "slurm.tasks_per_node=2", f"profile.gpu_request={style}"]
    overrides += [f"profile.gpu_type={gpu_type}"] if gpu_type else []
    lines = script(load_config("quickstart", overrides, env={})).splitlines()
    assert line in lines
    others = [l for l in lines if ("--gres" in l or "--gpus-per-node" in l) and l != line]
    assert not others, others
    assert gpu_request(Profile(gpu_request=style, gpu_type=gpu_type), 2) == tuple(line[len("#SBATCH --"):].split("=", 1))


def test_cpu_job_asks_for_no_gpus(home):
    text = script(load_config("quickstart", ["profile.gpu_request=gres"], env={}))
    assert "--gres" not in text and "--gpus-per-node" not in text


def test_activation_lines_go_in_as_written_between_the_exports_and_srun(home):
    write(home / "work" / "profiles" / "site.yaml", (
        "profile:\n  activate:\n    - module load cuda/12.4\n"
        "    - source \"/shared/my venv/bin/activate\"\n    - export X=\\${SLURM_JOB_ID:-none}\n"))
    lines = script(load_config("quickstart", profile="site", env={})).splitlines()
    start = lines.index("# activation lines of profile site")
    assert lines[start + 1:start + 4] == ["module load cuda/12.4", 'source "/shared/my venv/bin/activate"',
                                         "export X=${SLURM_JOB_ID:-none}"]
    assert max(i for i, l in enumerate(lines) if l.startswith("export HPC_AGENT_CONFIG=")) < start
    assert start < next(i for i, l in enumerate(lines) if l.startswith("srun "))
    assert not subprocess.run(["bash", "-n"], input="\n".join(lines), text=True).returncode


def test_activation_line_with_a_control_character_is_refused_before_rendering(home):
    with pytest.raises(ConfigError) as err:
        load_config("quickstart", ['profile.activate=["module load a\\rrm -rf ~"]'], env={})
    assert "profile.activate[0]" in problems_of(err.value)


# --- the snapshot -----------------------------------------------------------------------------------------

def test_snapshot_records_the_profile_and_needs_no_file(home):
    prof = write(home / "work" / "profiles" / "site.yaml", (
        "# my cluster\nprofile:\n  gpu_request: gres\n  activate: [module load cuda/12.4]\n"
        "slurm: {partition: gpu, account: proj}\n"))
    cfg = load_config("quickstart", ["slurm.gpus_per_node=1"], profile="site", env={})
    text, written = to_yaml(cfg), prof.read_text()
    prof.unlink()  # the watcher reads only the snapshot
    again = load_snapshot_text(text)
    assert again.profile.name == "site" and again.profile.source == str(prof)
    assert again.profile.content == written and "# my cluster" in again.profile.content
    assert again.profile.gpu_request == "gres" and again.profile.activate == ["module load cuda/12.4"]
    assert again.slurm.partition == "gpu" and again.slurm.account == "proj"
    assert script(again) == script(cfg)  # a resubmission renders the same script


def test_record_names_the_profile_read_even_if_the_config_says_otherwise(home):
    config = write(home / "work" / "my.yaml", "profile: {name: fake}\n")
    assert load_config(str(config), profile="localhost", env={}).profile.name == "localhost"


def test_profile_content_with_interpolation_syntax_stays_literal(home):
    write(home / "work" / "profiles" / "site.yaml", "# uses \\${HOME}\nprofile:\n  activate: ['source \\${HOME}/v/bin/activate']\n")
    cfg = load_config("quickstart", profile="site", env={})
    again = load_snapshot_text(to_yaml(cfg))
    assert again.profile.activate == ["source ${HOME}/v/bin/activate"]
    assert "\\${HOME}" in again.profile.content


def test_shipped_profiles_are_valid(home):
    for name in ("localhost", "example"):
        cfg = load_config("base", profile=name, env={})
        assert cfg.profile.name == name


# --- doctor's profile checks, against fakes ---------------------------------------------------------------

class FakeCLI:
    def __init__(self, version="slurm 22.05.8", rc=0):
        self.version, self.rc, self.calls = version, rc, []

    def run(self, argv, check=True, timeout_s=None):
        self.calls.append(argv)
        out = self.version if argv[:2] == ["sinfo", "--version"] else ""
        return SimpleNamespace(returncode=0 if argv[0] == "sinfo" else self.rc, stdout=out,
                               stderr="" if not self.rc else "sbatch: error: Invalid generic resource (gres) specification")


PARTS = parse_partitions("low*|2|2|3000|(null)|up\ngpu|1|8|64000|gpu:a100:4|up\n")


def test_doctor_partition_check_names_the_missing_partition(home):
    cfg = load_config("quickstart", ["slurm.partition=nosuch"], env={})
    level, _, detail = profile_fit.check_partition(cfg, PARTS)
    assert level == "FAIL" and "nosuch" in detail and "gpu, low" in detail
    assert profile_fit.check_partition(load_config("quickstart", ["slurm.partition=gpu"], env={}), PARTS)[0] == "OK"


@pytest.mark.parametrize("listed,rc,level", [("root\nproj\n", 0, "OK"), ("root\n", 0, "FAIL"), ("", 1, "WARN")])
def test_doctor_checks_the_account_is_known_to_accounting(home, listed, rc, level):
    cfg = load_config("quickstart", ["slurm.account=Proj"], env={})
    cli = SimpleNamespace(run=lambda argv, check=True, timeout_s=None: SimpleNamespace(
        returncode=rc, stdout=listed, stderr="sacctmgr: error" if rc else ""))
    got, name, detail = profile_fit.check_accounting_name(cli, cfg, "account")
    assert (got, name) == (level, "profile account")
    if level == "FAIL":
        assert "Proj" in detail and "slurm.account" in detail and "root" in detail
    assert profile_fit.check_accounting_name(cli, cfg, "qos")[0] == "OK"  # none set


def test_doctor_tries_the_gpu_style_on_a_gpu_partition(home):
    cfg = load_config("quickstart", ["profile.gpu_request=gres"], env={})
    cli = FakeCLI(rc=1)
    level, _, detail = profile_fit.check_gpu_style(cli, cfg, PARTS)
    assert level == "FAIL" and "--gres=gpu:1" in detail and "profile.gpu_request" in detail
    assert "--gres" in cli.calls[0] and "gpu" in cli.calls[0]
    assert profile_fit.check_gpu_style(FakeCLI(), cfg, PARTS)[0] == "OK"
    assert profile_fit.check_gpu_style(FakeCLI(rc=1), cfg, PARTS[:1])[0] == "OK"  # no GPUs anywhere


@pytest.mark.parametrize("version,quirks,level,words", [
    ("slurm 22.05.8", {}, "OK", "match"),
    ("slurm-wlm 18.08.5", {}, "FAIL", "gpus_per_node_option: false"),
    ("slurm 20.11.9", {"sacct_json": False}, "OK", "match"),
    ("slurm 22.05.8", {"sacct_json": False}, "WARN", "may be true"),
])
def test_doctor_compares_quirks_with_the_version(home, version, quirks, level, words):
    overrides = [f"profile.quirks.{k}={str(v).lower()}" for k, v in quirks.items()]
    cfg = load_config("quickstart", overrides, env={})
    got, _, detail = profile_fit.check_quirks(FakeCLI(version), cfg)
    assert got == level and words in detail, detail


def test_version_parser():
    assert parse_version("slurm 22.05.8\n") == (22, 5)
    assert parse_version("slurm-wlm 19.05.5") == (19, 5)
    assert parse_version("nothing") is None


def test_doctor_parses_activation_lines_with_bash():
    assert profile_fit.check_activation([])[0] == "OK"
    assert profile_fit.check_activation(["module load x", "if true; then echo ok; fi"])[0] == "OK"
    level, _, detail = profile_fit.check_activation(["module load x", "if [ -f x ]; then echo"])
    assert level == "FAIL" and "bash -n" in detail and "profile.activate[1]" in detail
    # each line must parse alone (as submit checks): an `if` split over lines would take srun's line into it
    level, _, detail = profile_fit.check_activation(["if true; then", "echo ok", "fi"])
    assert level == "FAIL" and "profile.activate[0]" in detail
    level, _, detail = profile_fit.check_activation(["echo 'unclosed"])
    assert level == "FAIL" and "profile.activate[0]" in detail


# --- init --profile ----------------------------------------------------------------------------------------

def test_init_profile_writes_a_skeleton_that_submit_finds(home, capsys):
    from hpc_agent import init

    dest = home / "proj"
    assert init.main([str(dest), "--profile", "mycluster"]) == 0
    skeleton = dest / "profiles" / "mycluster.yaml"
    assert skeleton.read_text() == (paths.configs_dir() / "profiles" / "example.yaml").read_text()
    cfg = load_config(str(dest / "hpc_agent.yaml"), profile="mycluster", env={})
    assert cfg.profile.source == str(skeleton) and cfg.slurm.account == "my_project"
    assert init.main([str(home / "p2"), "--profile", "localhost"]) == 0  # a shipped name: that profile
    assert "partition: low" in (home / "p2" / "profiles" / "localhost.yaml").read_text()
    assert init.main([str(home / "p3"), "--profile", "../x"]) == 2


def test_watcher_reads_the_sacct_json_quirk_from_the_environment_profile(home):
    from hpc_agent.config.profile import sacct_json_quirk

    write(home / "work" / "profiles" / "old.yaml", "profile:\n  quirks: {sacct_json: false}\n")
    assert sacct_json_quirk({PROFILE_ENV: "old"}) is False      # text, no --json probe
    assert sacct_json_quirk({PROFILE_ENV: "localhost"}) is None  # the watcher's probe decides
    assert sacct_json_quirk({}) is None and sacct_json_quirk({PROFILE_ENV: "nosuch"}) is None


def test_the_requested_gpu_type_sizes_the_memory_check(home):
    from hpc_agent.policy.preflight import gpu_capacity

    cfg = load_config("quickstart", ["slurm.gpus_per_node=1", "profile.gpu_request=gres-typed",
                                     "profile.gpu_type=h100"], env={})
    capacity, source = gpu_capacity(cfg, "gpu:t4:4,gpu:h100:4")
    assert capacity == 80 * 2**30 and "profile.gpu_type h100" in source


def test_a_sweep_array_script_carries_the_profile(home, tmp_path):
    from hpc_agent.sweep.batch import TrialJob, array_parameters

    overrides = ["slurm.gpus_per_node=1", "profile.gpu_request=gres", "profile.activate=[module load cuda/12.4]"]
    cfg = load_config("quickstart", overrides, env={})
    jobs = [TrialJob(n, f"s-t00{n}", tmp_path / f"t{n}", tmp_path / f"t{n}" / "config.yaml", cfg) for n in (0, 1)]
    params = array_parameters(jobs, "sw", "b0", 2)
    assert params["gres"] == "gpu:1" and "gpus_per_node" not in params
    setup = params["setup"]
    assert setup[-2:] == ["# activation lines of profile (config)", "module load cuda/12.4"]


def test_sacctmgr_is_allowed_and_gets_no_clusters_flag():
    from hpc_agent.slurm.cli import ALLOWED, with_clusters

    assert "sacctmgr" in ALLOWED
    argv = profile_fit.ACCOUNTING_LISTS["account"]
    assert with_clusters(argv, "a,b") == argv  # sacctmgr rejects --clusters
    assert with_clusters(["sinfo", "--version"], "a") == ["sinfo", "--clusters=a", "--version"]

"""Config loading and validation: every problem reported at once, with key, value and what is accepted."""
from __future__ import annotations

import pytest

from hpc_agent.config.fields import field_problem
from hpc_agent.config.load import build_config, load_config, load_snapshot, load_snapshot_text, to_yaml
from hpc_agent.config.problems import ConfigError


def problems_of(*overrides: str, config: str = "quickstart") -> dict:
    with pytest.raises(ConfigError) as info:
        load_config(config, list(overrides), env={})
    return {p.key: p for p in info.value.problems}


def test_quickstart_loads_with_base_and_overrides():
    cfg = load_config("quickstart", ["train.lr=0.01", "slurm.partition=low"], env={})
    assert cfg.run.name == "quickstart"
    assert cfg.train.lr == 0.01
    assert cfg.slurm.partition == "low"
    assert cfg.slurm.requeue is True  # from base.yaml


@pytest.mark.parametrize("override, key, expected_fragment", [
    ("train.zero_stage=4", "train.zero_stage", "0, 1, 2 or 3"),
    ("train.zero_stage=-1", "train.zero_stage", "0, 1, 2 or 3"),
    ("train.max_steps=0", "train.max_steps", "greater than 0"),
    ("train.micro_batch_size=-2", "train.micro_batch_size", "greater than 0"),
    ("train.grad_accum_steps=0", "train.grad_accum_steps", "greater than 0"),
    ("train.loader_workers=-1", "train.loader_workers", "0 (load in the training process)"),
    ("train.lr=0", "train.lr", "greater than 0"),
    ("slurm.nodes=0", "slurm.nodes", "greater than 0"),
    ("slurm.cpus_per_task=0", "slurm.cpus_per_task", "greater than 0"),
    ("slurm.gpus_per_node=-1", "slurm.gpus_per_node", "0 (CPU only)"),
    ("train.precision=fp8", "train.precision", "one of auto, fp16, bf16, fp32"),
    ("train.workload=resnet", "train.workload", "gpt, classifier"),
    ("train.offload=optimizer", "train.offload", "zero_stage=2 or 3"),
    ("train.precision=fp16", "train.precision", "FP16 needs a CUDA GPU"),
    ("slurm.mem=lots", "slurm.mem", "4G"),
    ("slurm.time=tomorrow", "slurm.time", "Slurm time"),
    ("train.max_steps=abc", "train.max_steps", "an integer"),
    ("train.lr=fast", "train.lr", "a number"),
    ("slurm.requeue=maybe", "slurm.requeue", "true or false"),
    ("train.max_stepz=3", "train.max_stepz", "did you mean 'max_steps'"),
    ("trian.lr=3", "trian.lr", "did you mean 'train'"),
    ("model.n_heads=3", "model.n_heads", "divisor of model.d_model"),
    ("data.imbalance_method=oversample", "data.imbalance_method", "smote"),
    ("run.name=has space", "run.name", "letters, digits"),
    ("noequals", "override", "key=value"),
])
def test_each_mistake_names_key_value_and_what_is_accepted(override, key, expected_fragment):
    found = problems_of(override)
    assert key in found, found
    assert expected_fragment in found[key].expected
    assert str(found[key]).startswith(f"{key}: got ")


def test_offload_allowed_from_stage_2_and_param_offload_needs_stage_3():
    assert load_config("quickstart", ["train.zero_stage=2", "train.offload=optimizer"], env={}).train.offload == "optimizer"
    assert "train.offload" in problems_of("train.zero_stage=2", "train.offload=optimizer+params")


def test_fp16_is_fine_with_gpus():
    cfg = load_config("quickstart", ["train.precision=fp16", "slurm.gpus_per_node=1"], env={})
    assert cfg.train.precision == "fp16"


def test_three_mistakes_reported_together():
    found = problems_of("train.zero_stage=9", "slurm.nodes=0", "train.max_stepz=1")
    assert {"train.zero_stage", "slurm.nodes", "train.max_stepz"} <= set(found)


@pytest.mark.parametrize("key", ["run.name", "slurm.partition", "slurm.account", "slurm.qos", "slurm.constraint",
                                 "slurm.exclude", "slurm.extra_sbatch.mail-user"])
@pytest.mark.parametrize("payload", ["x;touch /tmp/pwned", "x`id`", "x$(id)", "x#comment", "x\nsrun evil",
                                     "x && touch /tmp/pwned", "x | id", "x>/tmp/pwned"])
def test_injection_is_rejected(key, payload):
    with pytest.raises(ConfigError) as info:
        build_config([{"run": {"name": "ok"}}, _nested(key, payload)])
    assert key in {p.key for p in info.value.problems}


@pytest.mark.parametrize("payload", ["x;touch /tmp/pwned", "x`id`", "x$(id)", "x#comment", "x && touch /tmp/pwned"])
def test_runs_root_is_a_path_quoted_not_a_blacklist(payload):
    """A directory may be called that: the renderer quotes it once (tests/unit/test_job_script_hostile.py runs it)."""
    assert build_config([{"run": {"name": "ok", "runs_root": payload}}]).run.runs_root == payload


@pytest.mark.parametrize("payload, why", [("x\nsrun evil", "a newline"), ("a\\b", "backslash"), ("r%j", "'%'"),
                                          ("/" + "x" * 4000, "at most"), ("/" + "y" * 256, "component")])
def test_runs_root_that_sbatch_would_misread_is_rejected(payload, why):
    with pytest.raises(ConfigError) as info:
        build_config([{"run": {"name": "ok", "runs_root": payload}}])
    assert [p.key for p in info.value.problems] == ["run.runs_root"] and why in str(info.value)


def _nested(dotted: str, value):
    out: dict = {}
    node = out
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out


@pytest.mark.parametrize("key, value, offending", [
    ("slurm.partition", "low,high", None), ("slurm.partition", "a;b", "';' at position 1"),
    ("slurm.account", "${SAFE}", "'$' at position 0"), ("slurm.qos", "a&&b", "'&' at position 1"),
    ("slurm.constraint", "[rack1*2&rack2*4]", None), ("slurm.constraint", "a>b", "'>' at position 1"),
    ("slurm.exclude", "node[1-3,5],gpu01", None), ("slurm.exclude", "a|b", "'|' at position 1"),
    ("slurm.time", "UNLIMITED", None), ("slurm.mem", "4G#x", "'#' at position 2"),
    ("slurm.extra_sbatch.mail-type", "a\nb", "a newline at position 1"),
    ("run.runs_root", "/tmp/r {config} $x 'q'", None), ("run.runs_root", "/tmp/a\\b", "backslash"),
])
def test_field_allow_lists_name_the_offending_character(key, value, offending):
    """An allow-list per field: what a blacklist let through (&&, |, >, ${) is rejected, naming the character."""
    problem = field_problem(key, value)
    assert problem is None if offending is None else offending in problem


def test_sexagesimal_time_override_stays_a_string():
    assert load_config("quickstart", ["slurm.time=1:30:00"], env={}).slurm.time == "1:30:00"


def test_env_overrides_runs_root_and_cli_beats_env(tmp_path):
    env = {"HPC_AGENT_RUNS": str(tmp_path / "from-env")}
    assert load_config("quickstart", [], env=env).run.runs_root == str(tmp_path / "from-env")
    assert load_config("quickstart", ["run.runs_root=/x"], env=env).run.runs_root == "/x"


def test_unknown_config_file_lists_shipped_configs():
    found = problems_of(config="no-such-config")
    assert "quickstart" in found["CONFIG"].expected


def test_yaml_file_problems_are_collected_with_override_problems(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("train:\n  zero_stage: 5\n  lr: -1\nslurm:\n  partition: 'gpu;rm -rf /'\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(path), ["slurm.nodes=0"], env={})
    keys = {p.key for p in info.value.problems}
    assert {"train.zero_stage", "train.lr", "slurm.partition", "slurm.nodes"} <= keys


def test_snapshot_round_trips(tmp_path):
    cfg = load_config("quickstart", ["slurm.time=10:00:00", "slurm.extra_sbatch.mail-type=END"], env={})
    path = tmp_path / "config.yaml"
    path.write_text(to_yaml(cfg))
    assert load_snapshot(path) == cfg


def test_empty_sections_are_fine():
    cfg = build_config([{"model": {}, "slurm": {"extra_sbatch": {}}}])
    assert cfg.model.n_layers >= 1


# --- values from the environment (${oc.env:...}) and Slurm's metadata ------------------------------------
SECRET = "tok-3f9a1c"


@pytest.mark.parametrize("key", ["slurm.account", "slurm.partition", "slurm.qos", "slurm.constraint",
                                 "slurm.exclude", "slurm.extra_sbatch.reservation", "run.name", "run.runs_root"])
def test_environment_value_in_slurm_metadata_is_refused_naming_field_variable_and_fix(key, monkeypatch):
    monkeypatch.setenv("HPC_AGENT_TEST_SECRET", SECRET)
    with pytest.raises(ConfigError) as info:
        build_config([_nested(key, "${oc.env:HPC_AGENT_TEST_SECRET}")])
    found = {p.key: p for p in info.value.problems}
    assert key in found, found
    text = info.value.render()
    assert "HPC_AGENT_TEST_SECRET" in found[key].expected and "slurm.env_in_metadata" in found[key].expected
    assert SECRET not in text  # the refusal never prints the value


def test_allowed_environment_value_is_resolved_and_recorded_by_name_in_the_snapshot(monkeypatch):
    monkeypatch.setenv("HPC_AGENT_TEST_ACCOUNT", "proj42")
    monkeypatch.setenv("HPC_AGENT_TEST_DATA", "/data/corpus.txt")
    cfg = build_config([{"slurm": {"account": "${oc.env:HPC_AGENT_TEST_ACCOUNT}", "env_in_metadata": ["account"]},
                         "data": {"path": "${oc.env:HPC_AGENT_TEST_DATA}"}}])
    assert cfg.slurm.account == "proj42" and cfg.data.path == "/data/corpus.txt"
    assert cfg.env_origin == {"slurm.account": ["HPC_AGENT_TEST_ACCOUNT"], "data.path": ["HPC_AGENT_TEST_DATA"]}
    snapshot = to_yaml(cfg)
    assert "env_origin:" in snapshot and "HPC_AGENT_TEST_ACCOUNT" in snapshot
    # Read back (a resubmission): same values and record, and the environment is not consulted again.
    monkeypatch.delenv("HPC_AGENT_TEST_ACCOUNT")
    again = load_snapshot_text(snapshot)
    assert again == cfg


def test_a_later_literal_value_clears_the_environment_origin(monkeypatch):
    monkeypatch.setenv("HPC_AGENT_TEST_ACCOUNT", "proj42")
    cfg = build_config([{"slurm": {"account": "${oc.env:HPC_AGENT_TEST_ACCOUNT}"}}, {"slurm": {"account": "lit"}}])
    assert cfg.slurm.account == "lit" and cfg.env_origin == {}


def test_default_of_an_unset_variable_counts_as_from_the_environment(monkeypatch):
    monkeypatch.delenv("HPC_AGENT_TEST_UNSET", raising=False)
    with pytest.raises(ConfigError) as info:
        build_config([{"slurm": {"qos": "${oc.env:HPC_AGENT_TEST_UNSET,normal}"}}])
    assert "slurm.qos" in {p.key for p in info.value.problems}
    cfg = build_config([{"data": {"path": "${oc.env:HPC_AGENT_TEST_UNSET,/tmp/x}"}}])
    assert cfg.data.path == "/tmp/x" and cfg.env_origin == {"data.path": ["HPC_AGENT_TEST_UNSET"]}


def test_env_in_metadata_names_only_metadata_keys():
    with pytest.raises(ConfigError) as info:
        build_config([{"slurm": {"env_in_metadata": ["train.lr", "nonsense"]}}])
    assert [p.value for p in info.value.problems if p.key == "slurm.env_in_metadata"] == ["train.lr", "nonsense"]


def test_escaped_interpolation_stays_literal_through_the_snapshot(monkeypatch):
    monkeypatch.setenv("HPC_AGENT_TEST_SECRET", SECRET)
    cfg = build_config([{"data": {"path": "/d/\\${oc.env:HPC_AGENT_TEST_SECRET}"}}])
    assert cfg.data.path == "/d/${oc.env:HPC_AGENT_TEST_SECRET}" and cfg.env_origin == {}
    again = load_snapshot_text(to_yaml(cfg))
    assert again.data.path == cfg.data.path  # not resolved on the way back


def test_snapshot_written_by_submit_records_env_origin(tmp_path, monkeypatch):
    from hpc_agent.config.load import write_run_config

    monkeypatch.setenv("HPC_AGENT_TEST_DATA", "/data/x.txt")
    cfg = load_config("quickstart", ["data.path=${oc.env:HPC_AGENT_TEST_DATA}"], env={})
    text = write_run_config(tmp_path, cfg).read_text()
    assert "env_origin:\n  data.path:\n  - HPC_AGENT_TEST_DATA" in text


@pytest.mark.parametrize("override, key, expected", [
    # issue 44: "expected typing.List[str]"; now the list form, on the command line, for the key given
    ("train.command=python", "train.command",
     "a list of strings or null; write a list as [a, b] in YAML, and on the command line as "
     "train.command='[python]'"),
    ("train.command=python train.py", "train.command", "train.command='[python,train.py]'"),
    ("train.command=python train.py --steps 40 --fp16 true", "train.command",  # words YAML reads as other types
     "train.command='[python,train.py,--steps,\"40\",--fp16,\"true\"]'"),
    ("train.command=a,b", "train.command", "train.command='[a,b]'"),  # not a plain word list: placeholders
    ("train.command=7", "train.command", "a list of strings or null; write a list as [a, b] in YAML"),
    ("slurm.env_in_metadata=HOME", "slurm.env_in_metadata",
     "a list of strings; write a list as [a, b] in YAML, and on the command line as slurm.env_in_metadata='[HOME]'"),
    ("placement.partitions=gpu", "placement.partitions", "placement.partitions='[gpu]'"),
    ("train.max_steps=[1,2]", "train.max_steps", "an integer"),  # not a list key: no list hint
])
def test_type_problem_says_how_to_write_the_value(override, key, expected):
    problem = problems_of(override)[key]
    assert expected in problem.expected, problem.expected
    assert "typing." not in problem.expected
    if key == "train.max_steps":
        assert "list" not in problem.expected


def test_a_list_hint_suggested_on_the_command_line_loads():
    """The suggested form, given back as an override, is accepted and gives the words as the list."""
    problem = problems_of("train.command=python train.py --steps 40")["train.command"]
    suggested = problem.expected.split("on the command line as ", 1)[1].split(" (quoted")[0]
    key, _, value = suggested.partition("=")
    cfg = load_config("quickstart", [f"{key}={value.strip(chr(39))}"], env={})
    assert cfg.train.command == ["python", "train.py", "--steps", "40"]

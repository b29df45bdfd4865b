"""Config loading and validation: every problem reported at once, with key, value and what is accepted."""
from __future__ import annotations

import pytest

from hpc_agent.config import ConfigError
from hpc_agent.config.load import build_config, load_config, load_snapshot, to_yaml
from hpc_agent.config.problems import shell_unsafe_reason


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
                                 "slurm.exclude", "run.runs_root", "slurm.extra_sbatch.mail-user"])
@pytest.mark.parametrize("payload", ["x;touch /tmp/pwned", "x`id`", "x$(id)", "x#comment", "x\nsrun evil"])
def test_injection_is_rejected(key, payload):
    with pytest.raises(ConfigError) as info:
        build_config([{"run": {"name": "ok"}}, _nested(key, payload)])
    assert key in {p.key for p in info.value.problems}


def _nested(dotted: str, value):
    out: dict = {}
    node = out
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out


@pytest.mark.parametrize("value, reason", [
    ("plain-value_1.2", None), ("a;b", "';'"), ("a#b", "'#'"), ("a`b", "a backtick"), ("a$(b)", "'$('"),
    ("a\nb", "a newline"), ("${SAFE}", None),
])
def test_shell_unsafe_reason(value, reason):
    assert shell_unsafe_reason(value) == reason


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

"""One rank per GPU: slurm.tasks_per_node must equal slurm.gpus_per_node (unless opted out). Without
the check, 8 GPUs with 1 task trains on one GPU and bills eight. Plus: every shipped config, and the
starter config `hpc-agent init` writes, obey the rule."""
from __future__ import annotations

from pathlib import Path

import pytest

from hpc_agent.config.load import load_config
from hpc_agent.config.problems import ConfigError
from hpc_agent.core import paths

CONFIGS = sorted(paths.configs_dir().glob("*.yaml"))
NOT_TRAINING = {"chaos_ci_schedule": "a chaos schedule", "sweep_classifier": "a sweep spec (tests/unit/test_sweep*.py)"}


def mismatch_problems(gpus: int, tasks: int, *extra: str) -> list:
    overrides = [f"slurm.gpus_per_node={gpus}", f"slurm.tasks_per_node={tasks}", "train.precision=bf16", *extra]
    try:
        load_config("quickstart", overrides, env={})
    except ConfigError as exc:
        return [p for p in exc.problems if p.key in ("slurm.tasks_per_node", "slurm.gpus_per_node")]
    return []


@pytest.mark.parametrize("gpus, tasks, extra, problems", [
    (8, 1, (), 1),      # the mistake: 7 GPUs idle
    (1, 8, (), 1),      # the other way round: 8 ranks fight over one GPU
    (2, 4, (), 1),
    (8, 8, (), 0),
    (1, 1, (), 0),
    (0, 1, (), 0),      # CPU jobs: any number of tasks
    (0, 8, (), 0),
    (8, 1, ("slurm.allow_gpu_task_mismatch=true",), 0),  # the user's command starts a process per GPU itself
    (1, 4, ("slurm.allow_gpu_task_mismatch=true",), 0),
])
def test_tasks_must_match_gpus(gpus, tasks, extra, problems):
    assert len(mismatch_problems(gpus, tasks, *extra)) == problems


def test_the_mismatch_problem_names_the_three_fixes():
    (problem,) = mismatch_problems(8, 1)
    text = str(problem)
    assert problem.key == "slurm.tasks_per_node" and problem.value == 1
    assert problem.expected.startswith("8 (one rank per GPU")  # fix 1: tasks_per_node=8
    assert "slurm.gpus_per_node=1" in text            # fix 2: ask for as many GPUs as tasks
    assert "slurm.allow_gpu_task_mismatch=true" in text  # fix 3: opt out
    assert "1 of the 8 GPUs" in text                  # and why it matters


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_shipped_configs_validate(config: Path):
    if config.stem in NOT_TRAINING:
        pytest.skip(NOT_TRAINING[config.stem])
    cfg = load_config(str(config), env={})
    if cfg.slurm.gpus_per_node:
        assert cfg.slurm.tasks_per_node == cfg.slurm.gpus_per_node


def test_init_starter_config_validates_and_its_gpu_hint_obeys_the_rule(tmp_path, monkeypatch):
    from hpc_agent import init

    monkeypatch.chdir(tmp_path)
    assert init.main([]) == 0
    cfg = load_config(str(tmp_path / init.CONFIG_NAME), env={})
    assert (cfg.slurm.gpus_per_node, cfg.slurm.tasks_per_node) == (0, 1)
    # What the comments tell a GPU user to set passes the check.
    gpu = load_config(str(tmp_path / init.CONFIG_NAME), ["slurm.gpus_per_node=4", "slurm.tasks_per_node=4",
                                                       "train.precision=bf16"], env={})
    assert gpu.slurm.gpus_per_node == gpu.slurm.tasks_per_node == 4

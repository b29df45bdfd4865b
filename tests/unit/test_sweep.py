"""Sweeps without Slurm: the sweep file, overrides, objective extraction, pruning, array ids, resume adoption.

Where a driver talks to Slurm, Slurm is the canonical FakeSlurm (tests/helpers/fake_slurm.py, held to the real
cluster by tests/cluster/test_slurm_contract.py) and arrays go out through its sbatch (``array_submitter``)."""
from __future__ import annotations

import json
import math
from typing import Optional

import optuna
import pytest

from hpc_agent.config.load import load_config
from hpc_agent.config.problems import ConfigError
from hpc_agent.metrics.tb_reader import Point
from hpc_agent.state.ledger import LEDGER_FILE, Ledger
from hpc_agent.sweep.batch import TrialJob, array_name, array_setup, task_job_id
from hpc_agent.sweep.driver import (A_BATCH, A_JOB, A_PRUNED, SweepDriver, new_reports, objective_value, still_training,
                                    trial_outcome)
from hpc_agent.sweep.spec import best_so_far, distribution, format_value, make_pruner, parse_spec, trial_overrides
from hpc_agent.sweep.trials_table import summarize, trial_row
from tests.conftest import REPO, run_cli
from tests.helpers.fake_slurm import FakeSlurm

optuna.logging.set_verbosity(optuna.logging.WARNING)
D = optuna.distributions

BASE = {"objective": {"tag": "eval/macro_f1", "direction": "maximize"}, "params": {"train.lr": {"low": 0.1, "high": 1}}}


# --- the sweep file -----------------------------------------------------------------------------------
@pytest.mark.parametrize("raw, expected", [
    ({"type": "float", "low": 0.1, "high": 0.9}, D.FloatDistribution(0.1, 0.9)),
    ({"type": "float", "low": 1e-5, "high": 1e-1, "log": True}, D.FloatDistribution(1e-5, 1e-1, log=True)),
    ({"type": "logfloat", "low": "1e-5", "high": 0.1}, D.FloatDistribution(1e-5, 0.1, log=True)),
    ({"type": "float", "low": 0, "high": 1, "step": 0.25}, D.FloatDistribution(0, 1, step=0.25)),
    ({"type": "int", "low": 16, "high": 128, "step": 16}, D.IntDistribution(16, 128, step=16)),
    ({"type": "logint", "low": 1, "high": 64}, D.IntDistribution(1, 64, log=True)),
    ({"type": "int", "low": 1, "high": 64, "log": True}, D.IntDistribution(1, 64, log=True)),
    ({"type": "categorical", "choices": ["none", "smote"]}, D.CategoricalDistribution(["none", "smote"])),
    (["none", "smote"], D.CategoricalDistribution(["none", "smote"])),
])
def test_params_parse_into_optuna_distributions(raw, expected):
    spec = parse_spec(dict(BASE, params={"train.x": raw}))
    assert distribution(spec.params[0]) == expected


@pytest.mark.parametrize("params, where", [
    ({"train.lr": {"type": "float", "low": 1, "high": 0.5}}, "params.train.lr.high"),
    ({"train.lr": {"type": "logfloat", "low": 0, "high": 1}}, "params.train.lr.low"),
    ({"train.lr": {"type": "gaussian", "low": 0, "high": 1}}, "params.train.lr.type"),
    ({"train.lr": {"type": "float", "low": "abc", "high": 1}}, "params.train.lr.low"),
    ({"model.n_layers": {"type": "int", "low": 1.5, "high": 4}}, "params.model.n_layers"),
    ({"data.imbalance_method": {"type": "categorical", "choices": []}}, "params.data.imbalance_method.choices"),
    ({"slurm.mem": ["1G", "2G"]}, "params.slurm.mem"),
    ({"lr": {"low": 0, "high": 1}}, "params.lr"),
    ({}, "params"),
])
def test_bad_params_are_reported_by_key(params, where):
    with pytest.raises(ConfigError) as err:
        parse_spec(dict(BASE, params=params))
    assert where in [p.key for p in err.value.problems]


@pytest.mark.parametrize("changes, where", [
    ({"objective": {"tag": "eval/loss", "direction": "up"}}, "objective.direction"),
    ({"objective": {"direction": "minimize"}}, "objective.tag"),
    ({"trials": 0}, "trials"),
    ({"parallel": "two"}, "parallel"),
    ({"pruner": {"kind": "asha"}}, "pruner.kind"),
    ({"overrides": ["train.max_steps"]}, "overrides"),
    ({"name": "a b"}, "name"),
    ({"trails": 8}, "trails"),
])
def test_bad_sweep_keys_are_reported(changes, where):
    with pytest.raises(ConfigError) as err:
        parse_spec(dict(BASE, **changes))
    assert where in [p.key for p in err.value.problems]


def test_defaults_and_the_shipped_example():
    spec = parse_spec(BASE, default_name="mysweep")
    assert (spec.name, spec.trials, spec.parallel, spec.startup_trials, spec.pruner.kind) == ("mysweep", 8, 2, 4, "median")
    from omegaconf import OmegaConf

    shipped = parse_spec(OmegaConf.to_container(OmegaConf.load(REPO / "configs" / "sweep_classifier.yaml")))
    assert shipped.tag == "eval/macro_f1" and shipped.direction == "maximize"
    assert {p.key for p in shipped.params} == {"train.lr", "train.micro_batch_size", "data.imbalance_method"}


# --- overrides ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value, text", [
    (1e-05, "1e-05"), (0.003, "0.003"), (64, "64"), (True, "true"), (None, "null"), ("class_weight", "class_weight"),
])
def test_sampled_values_render_as_overrides(value, text):
    assert format_value(value) == text


def test_trial_overrides_order_and_that_they_load(tmp_path):
    spec = parse_spec(dict(BASE, overrides=["train.workload=classifier", "train.lr=0.5"]))
    out = trial_overrides(spec, {"train.lr": 1e-05, "train.micro_batch_size": 32}, "s-t007", str(tmp_path),
                          fixed=["train.max_steps=50"])
    assert out == ["train.workload=classifier", "train.lr=0.5", "train.max_steps=50", "run.name=s-t007",
                   f"run.runs_root={tmp_path}", "train.lr=1e-05", "train.micro_batch_size=32"]
    cfg = load_config("quickstart", out)
    assert (cfg.train.lr, cfg.train.micro_batch_size, cfg.train.max_steps, cfg.run.name) == (1e-05, 32, 50, "s-t007")
    assert cfg.train.workload == "classifier"


# --- objective and reports -------------------------------------------------------------------------------
def pts(*pairs):
    return [Point(step, 0.0, value) for step, value in pairs]


@pytest.mark.parametrize("points, expected", [
    (pts(), None),
    (pts((100, 0.3)), 0.3),
    (pts((100, 0.3), (200, 0.5), (300, 0.4)), 0.4),
    (pts((300, 0.4), (100, 0.3)), 0.4),  # order of points does not matter: the last step wins
])
def test_objective_is_the_value_at_the_last_step(points, expected):
    assert objective_value(points) == expected


@pytest.mark.parametrize("points, reported, steps", [
    (pts((100, 0.1), (200, 0.2)), set(), [100, 200]),
    (pts((100, 0.1), (200, 0.2)), {100}, [200]),
    (pts((100, 0.1), (100, 0.15), (200, 0.2)), set(), [100, 200]),  # a re-logged step counts once
    (pts((100, 0.1)), {100}, []),
])
def test_only_new_steps_are_reported(points, reported, steps):
    assert [p.step for p in new_reports(points, reported)] == steps


@pytest.mark.parametrize("phase, state, pruned, outcome", [
    ("running", "RUNNING", False, None),
    ("pending", "PENDING", False, None),
    ("recovering", "PREEMPTED", False, None),    # the watcher requeues it: keep following
    ("running", "OUT_OF_MEMORY", False, None),   # the watcher resubmits it with more memory
    ("completed", "COMPLETED", False, "complete"),
    ("running", "COMPLETED", False, "complete"),  # no watcher running: Slurm's word suffices
    ("stopped", "FAILED", False, "fail"),
    ("stopped", "CANCELLED", True, "pruned"),
    ("running", "RUNNING", True, "pruned"),        # pruned by a driver that died before telling Optuna
])
def test_trial_outcome(phase, state, pruned, outcome):
    assert trial_outcome(phase, state, pruned) == outcome


@pytest.mark.parametrize("reported, max_steps, expected", [
    (set(), 1500, True),                 # nothing reported yet
    ({100, 200, 1400}, 1500, True),      # still training: pruning stops work
    ({100, 1500}, 1500, False),          # reported its last step: it trained to the end, told as complete
    ({100, 1600}, 1500, False),
    ({100, 1500}, 0, True),              # max_steps not known: never held back
])
def test_a_trial_that_reported_its_last_step_is_not_pruned(reported, max_steps, expected):
    """The CI sweep saw a trial pruned at its final report (step 1500 of 1500): its complete result was discarded
    and no work was saved."""
    assert still_training(reported, max_steps) is expected


# --- pruning decisions (Optuna's pruners, configured from the sweep file) ---------------------------------
def decide(kind, finished, current, warmup=0, startup=2):
    spec = parse_spec(dict(BASE, pruner={"kind": kind, "warmup_steps": warmup, "startup_trials": startup}))
    study = optuna.create_study(direction="maximize", pruner=make_pruner(spec, max_steps=500))
    for curve in finished:
        t = study.ask()
        for step, value in curve:
            t.report(value, step)
            t.should_prune()  # as the driver does while a trial runs (Hyperband records its rungs here)
        study.tell(t, curve[-1][1])
    t = study.ask()
    for step, value in current:
        t.report(value, step)
    return bool(t.should_prune())


GOOD = [(100, 0.5), (200, 0.6), (300, 0.7)]
@pytest.mark.parametrize("kind, finished, current, warmup, startup, prune", [
    ("median", [GOOD, GOOD], [(100, 0.1)], 0, 2, True),       # far below the median at step 100
    ("median", [GOOD, GOOD], [(100, 0.9)], 0, 2, False),      # above it
    ("median", [GOOD], [(100, 0.1)], 0, 2, False),            # too few finished trials yet
    ("median", [GOOD, GOOD], [(100, 0.1)], 150, 2, False),    # still in its warm-up
    ("median", [GOOD, GOOD], [(200, 0.1)], 150, 2, True),     # past the warm-up
    ("none", [GOOD, GOOD], [(100, 0.0)], 0, 2, False),
])
def test_pruning_decision(kind, finished, current, warmup, startup, prune):
    assert decide(kind, finished, current, warmup, startup) is prune


@pytest.mark.parametrize("pruner, max_steps, kind, attrs", [
    ({"kind": "median", "startup_trials": 3, "warmup_steps": 50}, 500, "MedianPruner",
     {"_n_startup_trials": 3, "_n_warmup_steps": 50}),
    ({"kind": "hyperband", "min_resource": 100}, 1500, "HyperbandPruner",
     {"_min_resource": 100, "_max_resource": 1500, "_reduction_factor": 3}),
    ({"kind": "hyperband", "max_resource": 900, "reduction_factor": 2}, 1500, "HyperbandPruner",
     {"_max_resource": 900, "_reduction_factor": 2}),
    ("none", 500, "NopPruner", {}),
])
def test_pruner_from_the_sweep_file(pruner, max_steps, kind, attrs):
    made = make_pruner(parse_spec(dict(BASE, pruner=pruner)), max_steps=max_steps)
    assert type(made).__name__ == kind
    assert {k: getattr(made, k) for k in attrs} == attrs


# --- array ids and the job script ----------------------------------------------------------------------
@pytest.mark.parametrize("listed, index, size, expected", [
    (["200_0", "200_1"], 1, 2, "200_1"),
    (["200_0", "200_[1-3%2]"], 2, 4, "200_2"),
    (["200_[0-1]"], 0, 2, "200_0"),
    (["200_0"], 1, 2, None),                      # that task never reached Slurm
    (["201"], 0, 1, "201"),                       # a batch of one is a plain job
    ([], 0, 1, None),
])
def test_task_job_id(listed, index, size, expected):
    assert task_job_id(listed, index, size) == expected


def test_array_setup_sets_the_run_per_task(tmp_path):
    jobs = [TrialJob(n, f"s-t00{n}", tmp_path / f"s-t00{n}", tmp_path / f"s-t00{n}/config.yaml", None) for n in (0, 1)]
    lines = array_setup(["export HPC_AGENT_RUN_DIR={run_dir}", "export X=${SLURM_CPUS_PER_TASK:-1}"], jobs)
    assert lines[0].startswith('case "${SLURM_ARRAY_TASK_ID:-0}" in 0) HPC_AGENT_TRIAL_RUN_DIR=')
    assert f"1) HPC_AGENT_TRIAL_RUN_DIR={tmp_path}/s-t001;" in lines[0]
    assert lines[1:] == ['export HPC_AGENT_RUN_DIR="${HPC_AGENT_TRIAL_RUN_DIR}"', "export X=${SLURM_CPUS_PER_TASK:-1}"]
    import subprocess

    script = "\n".join(lines + ['echo "$HPC_AGENT_RUN_DIR"'])
    out = subprocess.run(["bash", "-c", script], env={"SLURM_ARRAY_TASK_ID": "1"}, capture_output=True, text=True)
    assert out.stdout.strip() == str(tmp_path / "s-t001")


# --- resume: adopting what a killed driver left -------------------------------------------------------
def array_submitter(slurm: FakeSlurm, submitted: list, partition: Optional[str] = None):
    """submit_array through the canonical FakeSlurm: one held sbatch per batch, named for the sweep's batch
    (an array of the batch's size; a batch of one is a plain job, as submitit submits it)."""
    def submit(jobs, sweep, batch, parallel, folder):
        argv = ["sbatch", "--parsable", "--hold", "--job-name", array_name(sweep, batch)]
        if len(jobs) > 1:
            argv += ["--array", f"0-{len(jobs) - 1}%{parallel}"]
        if partition:
            argv += ["--partition", partition]
        base = slurm.run(argv + ["--wrap", "x"]).stdout.strip()
        ids = [f"{base}_{i}" for i in range(len(jobs))] if len(jobs) > 1 else [base]
        submitted.append((batch, [j.number for j in jobs], ids))
        return ids
    return submit


def make_driver(tmp_path, study, slurm: FakeSlurm, submitted, partition: Optional[str] = None):
    """A driver over ``tmp_path/runs`` with Slurm, its ledger and its own clock all on the fake's clock."""
    spec = parse_spec(dict(BASE, name="s", trials=3, parallel=2,
                           overrides=["train.workload=classifier", "train.max_steps=20"]))
    runs_root = tmp_path / "runs"
    sweep_dir = runs_root / "sweeps" / "s"
    (sweep_dir / "slurm").mkdir(parents=True, exist_ok=True)
    clock = lambda: slurm.now  # noqa: E731
    return SweepDriver(spec, study, config="quickstart", cli_overrides=[], sweep_dir=sweep_dir, runs_root=runs_root,
                       ledger=Ledger(runs_root / LEDGER_FILE, clock=clock), slurm=slurm, out=lambda s: None,
                       clock=clock, submit=array_submitter(slurm, submitted, partition))


def test_resume_adopts_submitted_finds_reached_and_resubmits_lost(tmp_path):
    study = optuna.create_study(direction="maximize")
    submitted = []
    slurm = FakeSlurm(first_job_id=900)
    first = make_driver(tmp_path, study, slurm, submitted)
    first.fill()  # two trials in one array: 900_0, 900_1 (submitted held, then released)
    assert submitted[0][1:] == ([0, 1], ["900_0", "900_1"])
    assert slurm.releases == ["900"] and not any(slurm.job(t).held for t in slurm.tasks("900"))
    # A third trial asked by a driver that died between recording its intent and sbatch, and a fourth one
    # whose array reached Slurm (held, as submitted) but whose job id was never recorded.
    lost, reached = study.ask(), study.ask()
    for t, batch in ((lost, "b-lost"), (reached, "b-reached")):
        for key, value in (("run_id", f"s-t00{t.number}"), ("run_dir", str(tmp_path / "runs" / f"s-t00{t.number}")),
                           (A_BATCH, batch), ("batch_index", 0), ("batch_size", 1), ("intent_at", slurm.now)):
            t.set_user_attr(key, value)
    reached_job = slurm.submit(array_name("s", "b-reached"), hold=True)
    slurm.advance(30)
    second = make_driver(tmp_path, study, slurm, submitted)
    second.adopt()
    assert sorted(second.followed) == [0, 1, 3]
    assert [t.number for t in second.unsubmitted] == [2]
    frozen = study.trials
    assert [frozen[n].user_attrs[A_JOB] for n in (0, 1, 3)] == ["900_0", "900_1", reached_job]
    assert slurm.releases == ["900", reached_job] and not slurm.job(reached_job).held
    ledger = Ledger.in_runs_root(tmp_path / "runs")
    assert [s.job_id for s in ledger.submissions("s-t003")] == [reached_job]
    assert (tmp_path / "runs" / "s-t003" / "slurm" / f"{reached_job}_0_log.out").exists()
    second.followed.clear()  # pretend the two adopted trials finished
    second.fill()  # the lost trial goes out again; no new trial is asked beyond the budget
    assert submitted[-1][1] == [2] and len(slurm.submissions) == 2  # the first array, and this one
    assert len(study.trials) == 4  # 3 budgeted + the one whose ask raced; none was asked twice


def test_a_pruned_trial_is_stopped_in_the_ledger_before_scancel(tmp_path):
    study = optuna.create_study(direction="maximize")
    slurm = FakeSlurm(first_job_id=900)
    driver = make_driver(tmp_path, study, slurm, [])
    driver.fill()
    slurm.schedule()
    f = driver.followed[0]
    driver._prune(f, 300)
    assert driver.ledger.run("s-t000").phase == "stopped"
    assert ["scancel", "900_0"] in slurm.calls and slurm.cancels == ["900_0"]
    assert slurm.job("900_0").state == "CANCELLED" and slurm.job("900_1").state == "RUNNING"
    assert study.trials[0].user_attrs[A_PRUNED] == 300
    driver._tell(f, "pruned")
    assert study.trials[0].state == optuna.trial.TrialState.PRUNED
    trail = [json.loads(line) for line in (tmp_path / "runs" / "s-t000" / "events.jsonl").read_text().splitlines()]
    # the submit, the pruning decision, then the cancel it caused: each action says who, what and why
    assert [r["action"] for r in trail] == ["submit", "pruned", "cancel"]
    cancel = trail[-1]
    assert cancel["job_id"] == "900_0" and cancel["result"] == "cancelled" and "step 300" in cancel["reason"]
    assert cancel["by"]["process"] == "sweep" and cancel["config_diff"] == {}


# --- review -------------------------------------------------------------------------------------------
def test_summary_best_and_median_of_startup():
    rows = [trial_row(0, "COMPLETE", 0.2, {}, {}, {}), trial_row(1, "COMPLETE", 0.4, {}, {}, {}),
            trial_row(2, "PRUNED", 0.1, {}, {}, {100: 0.1}), trial_row(3, "COMPLETE", 0.5, {}, {}, {}),
            trial_row(4, "FAIL", None, {}, {}, {})]
    s = summarize(rows, "maximize", startup_trials=3)
    assert (s["best_trial"], s["best_value"]) == (3, 0.5)
    assert math.isclose(s["median_startup"], 0.3)  # trials 0 and 1 (the pruned one has no objective)
    assert s["best_so_far"] == [0.2, 0.4, 0.4, 0.5, 0.5]
    assert s["counts"] == {"complete": 3, "pruned": 1, "fail": 1}


@pytest.mark.parametrize("values, direction, expected", [
    ([0.3, None, 0.1, 0.5], "maximize", [0.3, 0.3, 0.3, 0.5]),
    ([0.3, None, 0.1, 0.5], "minimize", [0.3, 0.3, 0.1, 0.1]),
    ([None, 2.0], "minimize", [None, 2.0]),
])
def test_best_so_far(values, direction, expected):
    assert best_so_far(values, direction) == expected


def test_cli_help_dry_run_and_errors(tmp_path):
    assert run_cli("-m", "hpc_agent.sweep", "--help").returncode == 0
    ok = run_cli("-m", "hpc_agent.sweep", "quickstart", "configs/sweep_classifier.yaml", "--dry-run",
                 f"run.runs_root={tmp_path}")
    assert ok.returncode == 0, ok.stderr
    assert "train.lr: FloatDistribution" in ok.stdout and "workload: classifier" in ok.stdout
    assert not (tmp_path / "sweeps").exists()
    bad = tmp_path / "bad.yaml"
    bad.write_text("objective: {tag: eval/loss, direction: sideways}\nparams: {train.lr: {low: 1, high: 0}}\n")
    out = run_cli("-m", "hpc_agent.sweep", "quickstart", str(bad), "--dry-run")
    assert out.returncode == 2 and "objective.direction" in out.stderr and "Traceback" not in out.stderr
    typo = tmp_path / "typo.yaml"
    typo.write_text("objective: {tag: eval/loss, direction: minimize}\nparams: {train.lrr: {low: 0.1, high: 1}}\n")
    out = run_cli("-m", "hpc_agent.sweep", "quickstart", str(typo), "--dry-run")
    assert out.returncode == 2 and "train.lrr" in out.stderr and "Traceback" not in out.stderr


def test_sweep_cli_imports_no_torch_and_review_of_runs_no_optuna(tmp_path):
    """The sweep CLI runs on a login node (no torch/deepspeed); optuna stays out of every other CLI."""
    proc = run_cli("-X", "importtime", "-m", "hpc_agent.sweep", "quickstart", "configs/sweep_classifier.yaml",
                   "--dry-run", f"run.runs_root={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    modules = [line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")]
    assert "optuna" in modules and not [m for m in modules if m.split(".")[0] in ("torch", "deepspeed")]
    Ledger.in_runs_root(tmp_path)
    proc = run_cli("-X", "importtime", "-m", "hpc_agent.review", str(tmp_path))
    modules = [line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")]
    assert "hpc_agent.sweep.trials_table" in modules and not [m for m in modules if m.startswith("optuna")]


def test_diagnose_finds_a_trial_run_through_the_ledger(tmp_path):
    """An array task's job name names its array, not its run: diagnose finds the run dir by job id."""
    root = tmp_path / "runs"
    run_dir = root / "s-t001"
    (run_dir / "slurm").mkdir(parents=True)
    cfg = load_config("quickstart", [f"run.runs_root={root}", "run.name=s-t001"])
    from hpc_agent.config.load import write_run_config

    write_run_config(run_dir, cfg)
    (run_dir / "slurm" / "900_1_0_log.out").write_text("[hpc_agent] done: 10 steps\n")
    ledger = Ledger.in_runs_root(root)
    ledger.add_run("s-t001", "s-t001", str(run_dir))
    ledger.record_submitted(ledger.record_intent("s-t001", "slurm", str(run_dir / "config.yaml"), "sweep"), "900_1")
    sacct = tmp_path / "sacct.txt"
    sacct.write_text("JobID|JobName|State|ExitCode|NodeList|Start|End|Elapsed\n"
                     "900_1|hpc_agent:sweep:s:b000-1|COMPLETED|0:0|node1|2026-11-30T10:00:05|2026-11-30T10:01:12|00:01:07\n"
                     "900_1.batch|batch|COMPLETED|0:0|node1|2026-11-30T10:00:05|2026-11-30T10:01:12|00:01:07\n")
    out = run_cli("-m", "hpc_agent.diagnose", "900_1", "--json", "--sacct-file", str(sacct), "--runs-root", str(root))
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    assert found["run_dir"] == str(run_dir) and found["config"] == str(run_dir / "config.yaml")
    assert found["logs"] == ["900_1_0_log.out"] or found["logs"][0].endswith("900_1_0_log.out")


def test_an_array_sbatch_refuses_is_submitted_again_by_the_next_driver(tmp_path):
    from hpc_agent.slurm.cli import SlurmError

    study = optuna.create_study(direction="maximize")
    slurm = FakeSlurm()
    driver = make_driver(tmp_path, study, slurm, [], partition="gpu-typo")  # sbatch refuses the partition
    with pytest.raises(SlurmError, match="Invalid partition"):
        driver.fill()
    assert len(slurm.submissions) == 1 and slurm.jobs == {}
    again = make_driver(tmp_path, study, slurm, [])
    again.adopt()
    assert [t.number for t in again.unsubmitted] == [0, 1] and not again.followed
    again.fill()
    assert len(slurm.jobs) == 2 and sorted(again.followed) == [0, 1]


@pytest.mark.parametrize("environ, expected", [
    ({"SLURM_JOB_ID": "178", "SLURM_ARRAY_JOB_ID": "177", "SLURM_ARRAY_TASK_ID": "0"}, "177_0"),
    # the last task's raw id is the array's id: "scontrol requeue 177" would requeue every task
    ({"SLURM_JOB_ID": "177", "SLURM_ARRAY_JOB_ID": "177", "SLURM_ARRAY_TASK_ID": "2"}, "177_2"),
    ({"SLURM_JOB_ID": "180"}, "180"),
    ({}, None),
])
def test_an_array_task_requeues_only_itself(environ, expected):
    from launch.signals import own_job_id

    assert own_job_id(environ) == expected


def test_a_resumed_study_does_not_replay_the_random_startup_params(tmp_path):
    from hpc_agent.sweep.__main__ import open_study

    spec = parse_spec(dict(BASE, name="s", seed=0, startup_trials=10))
    url = f"sqlite:///{tmp_path / 'study.db'}"
    first = open_study(spec, url, max_steps=100)
    asked = [first.ask(distribution_map(spec)).params for _ in range(2)]
    resumed = open_study(spec, url, max_steps=100)  # a restarted driver: same seed in the sweep file
    again = [resumed.ask(distribution_map(spec)).params for _ in range(2)]
    assert not set(map(str, asked)) & set(map(str, again))
    fresh = open_study(parse_spec(dict(BASE, name="t", seed=0, startup_trials=10)), url, max_steps=100)
    assert fresh.ask(distribution_map(spec)).params == asked[0]  # a new study with the same seed: reproducible


def distribution_map(spec):
    from hpc_agent.sweep.spec import distributions

    return distributions(spec)


def test_sweep_json_is_published_only_once_its_study_exists(tmp_path, monkeypatch):
    """A reader finds the study through sweep.json, and opening an Optuna storage creates its tables:
    a reader that came before the driver's own creation raced it ("table ... already exists", which
    killed a driver at start-up in CI while the test polled the study)."""
    import argparse

    import hpc_agent.sweep.__main__ as sweep_main
    from hpc_agent.sweep.trials_table import SWEEP_FILE, load_rows

    spec = parse_spec(dict(BASE, name="s", seed=0))
    args = argparse.Namespace(config="quickstart", overrides=["train.max_steps=100"])
    seen = {}
    real_open = sweep_main.open_study

    def open_and_look(*a, **kw):
        seen["published before the study"] = (tmp_path / SWEEP_FILE).exists()
        return real_open(*a, **kw)

    monkeypatch.setattr(sweep_main, "open_study", open_and_look)
    study = sweep_main.start_study(spec, args, sweep_main.storage_url(spec, tmp_path), tmp_path, tmp_path.parent,
                                   max_steps=100)
    assert seen == {"published before the study": False}
    study.ask(distribution_map(spec))
    report = load_rows(tmp_path)  # what a reader gets once sweep.json is there: the study, with its trial
    assert report["sweep"]["storage"] == f"sqlite:///{tmp_path / 'study.db'}"
    assert [r["state"] for r in report["trials"]] == ["running"]

    broken = tmp_path / "broken"
    broken.mkdir()

    def refuse(*a, **kw):
        raise RuntimeError("storage refused")

    monkeypatch.setattr(sweep_main, "open_study", refuse)
    with pytest.raises(RuntimeError):
        sweep_main.start_study(spec, args, sweep_main.storage_url(spec, broken), broken, tmp_path, max_steps=100)
    assert not (broken / SWEEP_FILE).exists()  # nothing points readers at a study that was never made

"""A sweep driver killed at any point of a submission: what it leaves, and what the next driver makes of it.

Without Slurm (fakes from test_sweep.py); tests/test_sweep_slurm.py kills real drivers on the real cluster.
"""
from __future__ import annotations

import signal
import subprocess
import sys
from types import SimpleNamespace

import optuna
import pytest
from submitit.core.utils import DelayedSubmission, JobPaths

from hpc_agent.job import TrainingJob
from hpc_agent.ledger import Ledger
from hpc_agent.slurm.cli import SlurmError
from hpc_agent.sweep.batch import array_parameters, release_array, restore_pickles
from hpc_agent.sweep.driver import A_BATCH, A_JOB, complete_params
from hpc_agent.sweep.spec import distributions
from tests.conftest import REPO
from tests.test_sweep import FakeSlurm, make_driver

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _intent(trial, tmp_path, batch, *, complete=True):
    """The attributes _submit writes before sbatch; without the last one (intent_at) when cut short."""
    run_id = f"s-t00{trial.number}"
    attrs = [("run_id", run_id), ("run_dir", str(tmp_path / "runs" / run_id)), (A_BATCH, batch), ("batch_index", 0),
             ("batch_size", 1)] + ([("intent_at", 0.0)] if complete else [])
    for key, value in attrs:
        trial.set_user_attr(key, value)


def _temp_pickle(folder, run_dir, name="0123456789abcdef0123456789abcdef.pkl"):
    """What submitit leaves when its process dies between sbatch and renaming the task's pickle."""
    folder.mkdir(parents=True, exist_ok=True)
    DelayedSubmission(TrainingJob(run_dir, run_dir / "config.yaml")).dump(folder / name)
    return folder / name


def test_an_intent_cut_short_before_sbatch_is_submitted_again(tmp_path):
    # Killed between the trial's attribute writes: no intent_at means sbatch never ran for it.
    study = optuna.create_study(direction="maximize")
    _intent(study.ask(), tmp_path, "b-cut", complete=False)
    slurm = FakeSlurm({"hpc_agent:sweep:s:b-cut": ["555"]})  # even a same-named array is not looked for
    driver = make_driver(tmp_path, study, slurm, [])
    driver.adopt()
    assert [t.number for t in driver.unsubmitted] == [0] and not driver.followed
    assert not [c for c in slurm.calls if c[0] in ("squeue", "sacct")]


def test_a_trial_cut_short_inside_ask_gets_the_params_it_lacks(tmp_path):
    submitted = []
    study = optuna.create_study(direction="maximize")
    driver = make_driver(tmp_path, study, FakeSlurm(), submitted)
    dists = dict(distributions(driver.spec), **{"train.micro_batch_size": optuna.distributions.IntDistribution(
        16, 64, step=16), "data.imbalance_method": optuna.distributions.CategoricalDistribution(["none", "x"])})
    trial = study.ask({"train.lr": dists["train.lr"]})  # stored with one param of three, then killed
    assert complete_params(trial, dists) == ["train.micro_batch_size", "data.imbalance_method"]
    assert set(study.trials[0].params) == set(dists)
    assert complete_params(trial, dists) == []  # idempotent: nothing is sampled twice
    again = make_driver(tmp_path, study, FakeSlurm(), submitted)
    lost = study.ask()  # no param at all: the spec's whole space is sampled on adoption
    again.adopt()
    assert set(study.trials[lost.number].params) == set(distributions(again.spec))


def test_a_reached_array_gets_its_pickles_then_is_released_then_registered(tmp_path):
    study = optuna.create_study(direction="maximize")
    trial = study.ask()
    _intent(trial, tmp_path, "b-held")
    run_dir = tmp_path / "runs" / "s-t000"
    folder = tmp_path / "runs" / "sweeps" / "s" / "slurm"
    temp = _temp_pickle(folder, run_dir)
    slurm = FakeSlurm({"hpc_agent:sweep:s:b-held": ["777"]})
    driver = make_driver(tmp_path, study, slurm, [])
    driver.adopt()
    assert not temp.exists()
    restored = DelayedSubmission.load(JobPaths(folder, job_id="777").submitted_pickle)
    assert restored.function.run_dir == str(run_dir)
    assert ["scontrol", "release", "777"] in slurm.calls
    assert study.trials[0].user_attrs[A_JOB] == "777" and sorted(driver.followed) == [0]
    assert [s.job_id for s in Ledger.in_runs_root(tmp_path / "runs").submissions("s-t000")] == ["777"]


def test_restore_pickles_matches_by_run_dir_and_leaves_present_ones(tmp_path):
    folder = tmp_path / "slurm"
    a, b, c = (tmp_path / n for n in "abc")
    _temp_pickle(folder, a, "a" * 32 + ".pkl")
    _temp_pickle(folder, b, "b" * 32 + ".pkl")
    (folder / ("c" * 32 + ".pkl")).write_bytes(b"torn")  # a half-written pickle is skipped, not fatal
    _temp_pickle(folder, c, "80_submitted.pkl")
    assert sorted(restore_pickles(folder, {"79_1": b, "79_0": a, "80": c, "81": tmp_path / "none"})) == ["79_0", "79_1"]
    assert DelayedSubmission.load(folder / "79_1_submitted.pkl").function.run_dir == str(b)
    assert restore_pickles(folder, {"79_0": a}) == []


def test_arrays_are_submitted_held_and_released_after_submitit_returns(tmp_path):
    from hpc_agent.config.load import load_config
    from hpc_agent.sweep.batch import TrialJob

    cfg = load_config("quickstart", [f"run.runs_root={tmp_path}"])
    params = array_parameters([TrialJob(0, "s-t000", tmp_path / "r", tmp_path / "r/config.yaml", cfg)], "s", "b", 2)
    assert params["additional_parameters"]["hold"] is True
    slurm = FakeSlurm()
    driver = make_driver(tmp_path, optuna.create_study(direction="maximize"), slurm, [])
    driver.fill()
    assert slurm.calls == [["scontrol", "release", "900"]]


def test_release_is_idempotent_but_a_refusal_is_an_error():
    class Answers(FakeSlurm):
        def __init__(self, rc, stderr):
            super().__init__()
            self.rc, self.stderr = rc, stderr

        def run(self, argv, check=True):
            self.calls.append(argv)
            return SimpleNamespace(stdout="", stderr=self.stderr, returncode=self.rc)

    finished = Answers(1, "731_0-1: Job has already finished")
    release_array(finished, ["731_0", "731_1", "732"])
    assert finished.calls == [["scontrol", "release", "731"], ["scontrol", "release", "732"]]
    with pytest.raises(SlurmError, match="stays held"):
        release_array(Answers(1, "slurm_update error: Access/permission denied"), ["733"])


def test_a_ledger_transaction_killed_half_way_leaves_nothing(tmp_path):
    path = tmp_path / "ledger.sqlite"
    Ledger(path).add_run("r1", "r", "d")
    code = (f"import os, signal\nfrom hpc_agent.ledger import Ledger\nledger = Ledger({str(path)!r})\n"
            "with ledger.transaction():\n    ledger.record_intent('r1', 'slurm', 'c.yaml', reason='x')\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=str(REPO))
    assert proc.returncode == -signal.SIGKILL
    assert Ledger(path).submissions("r1") == []
    ledger = Ledger(path)
    with pytest.raises(RuntimeError):
        with ledger.transaction():
            ledger.record_intent("r1", "slurm", "c.yaml", reason="x")
            raise RuntimeError("sbatch failed")
    assert ledger.submissions("r1") == []

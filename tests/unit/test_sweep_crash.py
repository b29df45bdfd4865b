"""A sweep driver killed at any point of a submission: what it leaves, and what the next driver makes of it.

Without Slurm: the canonical FakeSlurm (tests/helpers/fake_slurm.py, held to the real cluster by
tests/cluster/test_slurm_contract.py) holds the arrays a killed driver left, submitted through its sbatch by
test_sweep.py's ``make_driver``; tests/cluster/test_sweep_slurm.py kills real drivers on the real cluster.
"""
from __future__ import annotations

import signal
import subprocess
import sys

import optuna
import pytest
from submitit.core.utils import DelayedSubmission, JobPaths

from hpc_agent.slurm.cli import SlurmError
from hpc_agent.state.ledger import Ledger
from hpc_agent.sweep.adopt import complete_params
from hpc_agent.sweep.batch import array_name, array_parameters, release_array, restore_pickles
from hpc_agent.sweep.driver import A_BATCH, A_JOB
from hpc_agent.sweep.spec import distributions
from launch.job import TrainingJob
from tests.conftest import REPO
from tests.helpers.fake_slurm import FakeSlurm
from tests.unit.test_sweep import make_driver

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _intent(trial, tmp_path, batch, *, complete=True, at=0.0):
    """The attributes _submit writes before sbatch; without the last one (intent_at) when cut short."""
    run_id = f"s-t00{trial.number}"
    attrs = [("run_id", run_id), ("run_dir", str(tmp_path / "runs" / run_id)), (A_BATCH, batch), ("batch_index", 0),
             ("batch_size", 1)] + ([("intent_at", at)] if complete else [])
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
    slurm = FakeSlurm()
    _intent(study.ask(), tmp_path, "b-cut", complete=False, at=slurm.now)
    same = slurm.submit(array_name("s", "b-cut"))  # even a same-named job in Slurm is not looked for
    driver = make_driver(tmp_path, study, slurm, [])
    driver.adopt()
    assert [t.number for t in driver.unsubmitted] == [0] and not driver.followed
    assert not [c for c in slurm.calls if "--name" in c]  # only the sweep-wide look for held arrays
    assert [c[0] for c in slurm.calls] == ["squeue"] and slurm.job(same).state == "PENDING"


def test_a_trial_cut_short_inside_ask_gets_the_params_it_lacks(tmp_path):
    submitted = []
    study = optuna.create_study(direction="maximize")
    slurm = FakeSlurm()
    driver = make_driver(tmp_path, study, slurm, submitted)
    dists = dict(distributions(driver.spec), **{"train.micro_batch_size": optuna.distributions.IntDistribution(
        16, 64, step=16), "data.imbalance_method": optuna.distributions.CategoricalDistribution(["none", "x"])})
    trial = study.ask({"train.lr": dists["train.lr"]})  # stored with one param of three, then killed
    assert complete_params(trial, dists) == ["train.micro_batch_size", "data.imbalance_method"]
    assert set(study.trials[0].params) == set(dists)
    assert complete_params(trial, dists) == []  # idempotent: nothing is sampled twice
    again = make_driver(tmp_path, study, slurm, submitted)
    lost = study.ask()  # no param at all: the spec's whole space is sampled on adoption
    again.adopt()
    assert set(study.trials[lost.number].params) == set(distributions(again.spec))


def test_a_reached_array_gets_its_pickles_then_is_released_then_registered(tmp_path):
    study = optuna.create_study(direction="maximize")
    slurm = FakeSlurm(first_job_id=777)
    trial = study.ask()
    _intent(trial, tmp_path, "b-held", at=slurm.now)
    run_dir = tmp_path / "runs" / "s-t000"
    folder = tmp_path / "runs" / "sweeps" / "s" / "slurm"
    temp = _temp_pickle(folder, run_dir)
    job = slurm.submit(array_name("s", "b-held"), hold=True)  # sbatch answered; the driver died before release
    slurm.advance(5)
    driver = make_driver(tmp_path, study, slurm, [])
    driver.adopt()
    assert not temp.exists()
    restored = DelayedSubmission.load(JobPaths(folder, job_id=job).submitted_pickle)
    assert restored.function.run_dir == str(run_dir)
    assert ["scontrol", "release", job] in slurm.calls and slurm.releases == [job] == ["777"]
    assert not slurm.job(job).held and slurm.schedule() == [job]
    assert study.trials[0].user_attrs[A_JOB] == job and sorted(driver.followed) == [0]
    assert [s.job_id for s in Ledger.in_runs_root(tmp_path / "runs").submissions("s-t000")] == [job]


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
    slurm = FakeSlurm(first_job_id=900)
    driver = make_driver(tmp_path, optuna.create_study(direction="maximize"), slurm, [])
    driver.fill()
    (sbatch, release) = slurm.calls
    assert sbatch[0] == "sbatch" and "--hold" in sbatch and release == ["scontrol", "release", "900"]
    assert slurm.tasks("900") == ["900_0", "900_1"] and not any(slurm.job(t).held for t in slurm.tasks("900"))


def test_release_is_idempotent_but_a_refusal_is_an_error():
    slurm = FakeSlurm(first_job_id=731)
    array = slurm.submit("hpc_agent:sweep:s:b1", array=[0, 1], hold=True)  # 731_0, 731_1
    plain = slurm.submit("hpc_agent:sweep:s:b2", hold=True)
    release_array(slurm, [f"{array}_0", f"{array}_1", plain])  # held: released
    release_array(slurm, [f"{array}_0", f"{array}_1", plain])  # again (adoption repeats it): rc 0
    for job in slurm.schedule():
        slurm.complete(job)
    release_array(slurm, [f"{array}_0", f"{array}_1", plain])  # every task ran: "Job has already finished"
    assert slurm.run(["scontrol", "release", plain], check=False).stderr.startswith("Job has already finished")
    assert slurm.releases == [array, plain] * 3 + [plain] and array == "731" and plain == "733"
    with pytest.raises(SlurmError, match="stays held"):  # an id Slurm does not know: "Invalid job id"
        release_array(slurm, ["999"])
    slurm.break_command("scontrol", "slurm_update error: Access/permission denied")
    with pytest.raises(SlurmError, match="stays held"):
        release_array(slurm, [plain])


def test_a_ledger_transaction_killed_half_way_leaves_nothing(tmp_path):
    path = tmp_path / "ledger.sqlite"
    Ledger(path).add_run("r1", "r", "d")
    code = (f"import os, signal\nfrom hpc_agent.state.ledger import Ledger\nledger = Ledger({str(path)!r})\n"
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


def test_held_tasks_a_trial_records_are_released_and_the_others_cancelled(tmp_path):
    # A driver killed between sbatch and the release leaves a held array; so does an intent the study has
    # since given up on. At start-up: a held task a running trial records -> released; one adopt maps a
    # trial's intent to -> released by adopt after its pickle; any other task of this sweep -> cancelled.
    study = optuna.create_study(direction="maximize")
    submitted = []
    slurm = FakeSlurm(first_job_id=900)
    make_driver(tmp_path, study, slurm, submitted).fill()  # trials 0, 1 as 900_0, 900_1 (released)
    first_batch = study.trials[1].user_attrs[A_BATCH]
    reached = study.ask()
    _intent(reached, tmp_path, "b-reached", at=slurm.now)
    slurm.run(["scontrol", "hold", "900_1"])                                      # recorded by trial 1, held again
    reached_job = slurm.submit(array_name("s", "b-reached"), hold=True)         # trial 2's intent: adopt releases it
    gone = slurm.submit(array_name("s", "b-gone"), hold=True, array=[0, 1])     # no trial records it: cancel
    queued = slurm.submit(array_name("s", "b-queued"))                          # not held: not ours to touch
    other = slurm.submit(array_name("s2", "b1"), hold=True)                     # another sweep
    run = slurm.submit("hpc_agent:run-1", hold=True)                            # a plain run
    assert (reached_job, gone) == ("902", "903")
    slurm.reset_calls()
    said = []
    driver = make_driver(tmp_path, study, slurm, submitted)
    driver.out = said.append
    driver.adopt()
    acts = [c for c in slurm.calls if c[0] in ("scancel", "scontrol")]
    assert acts == [["scontrol", "release", "900_1"], ["scancel", f"{gone}_0"], ["scancel", f"{gone}_1"],
                    ["scontrol", "release", reached_job]]
    lines = [line.split("] ", 1)[1] for line in said if "held job" in line]
    assert lines == [f"held job 900_1 (batch {first_batch}): released; it runs trial 1 of the study",
                     f"held job {gone}_0 (batch b-gone): cancelled; no running trial of the study records it",
                     f"held job {gone}_1 (batch b-gone): cancelled; no running trial of the study records it"]
    assert sorted(driver.followed) == [0, 1, 2]
    assert [slurm.job(j).held for j in ("900_1", reached_job, other, run)] == [False, False, True, True]
    assert [slurm.job(t).state for t in slurm.tasks(gone)] == ["CANCELLED", "CANCELLED"]
    assert slurm.job(queued).state == "PENDING"


def test_held_tasks_of_a_trial_told_since_are_cancelled_even_inside_an_adopted_array(tmp_path):
    # Trials 0 and 1 went out as one held array (size 2); the driver died before the release; trial 1
    # was then told FAIL. Adoption releases 700_0 for trial 0 but must cancel 700_1 first.
    study = optuna.create_study(direction="maximize")
    slurm = FakeSlurm(first_job_id=700)
    for trial in (study.ask(), study.ask()):
        for key, value in (("run_id", f"s-t00{trial.number}"), ("run_dir", str(tmp_path / "runs" / f"s-t00{trial.number}")),
                           (A_BATCH, "b-pair"), ("batch_index", trial.number), ("batch_size", 2),
                           ("intent_at", slurm.now)):
            trial.set_user_attr(key, value)
    array = slurm.submit(array_name("s", "b-pair"), hold=True, array=[0, 1])  # 700_0, 700_1, held
    study.tell(1, state=optuna.trial.TrialState.FAIL)
    driver = make_driver(tmp_path, study, slurm, [])
    driver.adopt()
    acts = [c for c in slurm.calls if c[0] in ("scancel", "scontrol")]
    assert acts == [["scancel", "700_1"], ["scontrol", "release", "700"]] and array == "700"
    assert sorted(driver.followed) == [0]
    assert slurm.job("700_1").state == "CANCELLED" and not slurm.job("700_0").held
    assert slurm.schedule() == ["700_0"]


def test_squeue_failing_leaves_held_arrays_alone_and_says_so(tmp_path):
    slurm = FakeSlurm()
    held = slurm.submit(array_name("s", "b-gone"), hold=True)  # would be cancelled if squeue answered
    for command in ("squeue", "scontrol", "scancel"):  # slurmctld down
        slurm.break_command(command, "squeue: error: slurm_load_jobs error: Unable to contact slurm controller")
    said = []
    driver = make_driver(tmp_path, optuna.create_study(direction="maximize"), slurm, [])
    driver.out = said.append
    driver.adopt()
    assert any("cannot look for held arrays" in line for line in said)
    assert slurm.ran("squeue") and not [c for c in slurm.calls if c[0] in ("scancel", "scontrol")]
    assert slurm.job(held).held and slurm.job(held).state == "PENDING"


def test_a_prune_cut_short_by_a_kill_is_finished_by_the_next_driver(tmp_path):
    # Killed right after recording the pruning decision: the run is still live in the ledger, its job not
    # cancelled. The next driver stops it (lifecycle CANCELLED edge), scancels, then tells PRUNED.
    study = optuna.create_study(direction="maximize")
    slurm = FakeSlurm(first_job_id=900)
    first = make_driver(tmp_path, study, slurm, [])
    first.fill()
    assert slurm.schedule() == ["900_0", "900_1"]
    first.followed[0].trial.set_user_attr("pruned_at_step", 200)
    assert first.ledger.run("s-t000").phase == "pending"
    again = make_driver(tmp_path, study, slurm, [])
    again.adopt()
    again.poll()
    assert again.ledger.run("s-t000").phase == "stopped"
    assert ["scancel", "900_0"] in slurm.calls and slurm.job("900_0").state == "CANCELLED"
    assert slurm.job("900_1").state == "RUNNING"  # the other trial's task runs on
    assert study.trials[0].state == optuna.trial.TrialState.PRUNED
    again.poll()  # nothing left to do for it
    assert slurm.calls.count(["scancel", "900_0"]) == 1 and slurm.cancels == ["900_0"]


class _Canary:
    """A pickle that, once unpickled, creates a file: the proof that something executed it."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_restore_pickles_never_executes_a_planted_pickle_and_still_restores(tmp_path):
    import os
    import pickle

    folder, canary = tmp_path / "slurm", tmp_path / "canary"
    run_dir = tmp_path / "runs" / "s-t000"
    genuine = _temp_pickle(folder, run_dir, "a" * 32 + ".pkl")
    # Newer than the genuine one, named like submitit's temporary pickles, and naming the run dir (and
    # even our classes): what a job that can write the folder could plant. Never executed, never chosen.
    planted = {
        "b" * 32 + ".pkl": pickle.dumps((_Canary(canary), str(run_dir), "launch.job", "TrainingJob")),
        "c" * 32 + ".pkl": pickle.dumps((DelayedSubmission(TrainingJob(run_dir, run_dir / "config.yaml")),
                                         _Canary(canary))),
        "d" * 32 + ".pkl": pickle.dumps(_Canary(canary))[:-3],  # torn
    }
    for name, data in planted.items():
        (folder / name).write_bytes(data)
        os.utime(folder / name, (genuine.stat().st_mtime + 10, genuine.stat().st_mtime + 10))
    (folder / ("e" * 32 + ".pkl")).symlink_to(folder / ("c" * 32 + ".pkl"))  # a link is never followed
    assert restore_pickles(folder, {"91_0": run_dir}) == ["91_0"]
    assert not canary.exists()
    assert not genuine.exists() and all((folder / name).exists() for name in planted)
    assert (folder / "91_0_submitted.pkl").read_bytes() != planted["c" * 32 + ".pkl"]
    assert DelayedSubmission.load(folder / "91_0_submitted.pkl").function.run_dir == str(run_dir)  # the genuine one
    assert not canary.exists()

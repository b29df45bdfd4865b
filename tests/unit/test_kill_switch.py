"""The kill switch (hpc_agent/state/killswitch.py): ``watch --pause`` stops the watcher and every sweep driver on the
runs root before their next action, keeps their state for a later run, and refuses a path that is no runs root.

The sweep driver runs against the canonical FakeSlurm (tests/helpers/fake_slurm.py) through test_sweep.py's
``make_driver``; nothing here needs a cluster."""
from __future__ import annotations

import optuna
import pytest

from hpc_agent.state import killswitch
from hpc_agent.state.ledger import Ledger
from hpc_agent.sweep import __main__ as sweep_cli
from hpc_agent.sweep.batch import array_name
from hpc_agent.sweep.driver import A_JOB, A_PRUNED
from hpc_agent.watch import main as watch_main
from tests.helpers.fake_slurm import FakeSlurm
from tests.unit.test_sweep import make_driver

optuna.logging.set_verbosity(optuna.logging.WARNING)
ACTING = ("sbatch", "scancel", "scontrol")


def acting(slurm: FakeSlurm):
    return [c for c in slurm.calls if c[0] in ACTING]


# --- pausing: only a runs root -------------------------------------------------------------------------
@pytest.mark.parametrize("make, why", [
    (lambda p: None, "does not exist"),
    (lambda p: p.mkdir(), "holds no ledger.sqlite"),
    (lambda p: p.write_text("x"), "is not a directory"),
])
@pytest.mark.parametrize("flag", ["--pause", "--resume"])
def test_pausing_an_unknown_root_exits_2_naming_it_and_creates_nothing(tmp_path, capsys, make, why, flag):
    root = tmp_path / "runs-typo"
    make(root)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    assert watch_main(["--runs-root", str(root), flag]) == 2
    err = capsys.readouterr().err
    assert str(root) in err and why in err and "runs root" in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # no directory, no pause file


def test_pause_and_resume_a_runs_root(tmp_path, capsys):
    root = tmp_path / "runs"
    Ledger.in_runs_root(root).close()
    assert watch_main(["--runs-root", str(root), "--pause"]) == 0
    assert killswitch.is_paused(root / killswitch.PAUSE_FILE) and "sweep driver" in capsys.readouterr().out
    with pytest.raises(killswitch.Paused, match="stopped before submitting"):
        killswitch.check(root, "submitting")
    assert watch_main(["--runs-root", str(root), "--resume"]) == 0
    killswitch.check(root, "submitting")  # no longer paused: nothing raised
    (root / killswitch.PAUSE_FILE).symlink_to(tmp_path / "nowhere")  # a dangling link still pauses
    with pytest.raises(killswitch.Paused):
        killswitch.check(root, "x")


# --- the sweep driver stops on --pause ---------------------------------------------------------------------
def _paused_driver(tmp_path, study, slurm, submitted):
    driver = make_driver(tmp_path, study, slurm, submitted)
    driver.ledger.db.execute("SELECT 1")  # the ledger exists: the folder is a runs root
    return driver


def test_a_paused_sweep_asks_and_submits_nothing_then_continues_after_resume(tmp_path):
    study, slurm, submitted = optuna.create_study(direction="maximize"), FakeSlurm(first_job_id=500), []
    driver = _paused_driver(tmp_path, study, slurm, submitted)
    root = tmp_path / "runs"
    assert killswitch.switch(root, pause=True) == 0
    with pytest.raises(killswitch.Paused, match="asking and submitting new trials"):
        driver.fill()
    with pytest.raises(killswitch.Paused, match="adopting"):
        driver.run(poll_s=0)
    assert study.trials == [] and submitted == [] and slurm.calls == []
    assert killswitch.switch(root, pause=False) == 0
    driver.fill()
    assert [n for _, n, _ in submitted] == [[0, 1]] and len(study.trials) == 2


def test_pause_mid_sweep_stops_within_one_poll_and_keeps_the_trials_for_the_next_run(tmp_path):
    study, slurm, submitted = optuna.create_study(direction="maximize"), FakeSlurm(first_job_id=600), []
    driver = make_driver(tmp_path, study, slurm, submitted)
    driver.fill()  # two trials out as one array: 600_0, 600_1
    slurm.schedule()
    slurm.reset_calls()
    killswitch.switch(tmp_path / "runs", pause=True)
    ticks = []
    with pytest.raises(killswitch.Paused):
        driver.run(poll_s=0, stop=lambda: ticks.append(1) and False)
    assert len(ticks) <= 1  # stopped at the first turn of the loop, before any poll or submission
    assert acting(slurm) == [] and len(submitted) == 1 and len(study.trials) == 2
    assert [t.user_attrs[A_JOB] for t in study.trials] == ["600_0", "600_1"]
    assert all(t.state == optuna.trial.TrialState.RUNNING for t in study.trials)
    # A pruning decision while paused: neither recorded nor acted on.
    with pytest.raises(killswitch.Paused, match="pruning trial 0"):
        driver._prune(driver.followed[0], 100)
    assert A_PRUNED not in study.trials[0].user_attrs and acting(slurm) == []
    assert driver.ledger.run("s-t000").phase != "stopped"
    # After --resume the same command continues: the next driver adopts both trials, asks none twice.
    killswitch.switch(tmp_path / "runs", pause=False)
    again = make_driver(tmp_path, study, slurm, submitted)
    again.adopt()
    assert sorted(again.followed) == [0, 1] and len(study.trials) == 2


def test_a_paused_driver_leaves_held_arrays_alone(tmp_path):
    study, slurm, submitted = optuna.create_study(direction="maximize"), FakeSlurm(first_job_id=700), []
    orphan = slurm.submit(array_name("s", "b-orphan"), hold=True)  # a held array no trial records
    driver = make_driver(tmp_path, study, slurm, submitted)
    killswitch.switch(tmp_path / "runs", pause=True)
    with pytest.raises(killswitch.Paused, match=f"cancelling held job {orphan}"):
        driver.settle_held()
    assert slurm.job(orphan).held and slurm.cancels == []
    killswitch.switch(tmp_path / "runs", pause=False)
    driver.settle_held()
    assert slurm.cancels == [orphan]


def test_sweep_cli_exits_5_on_a_paused_root_and_2_pausing_an_unknown_one(tmp_path, monkeypatch, capsys):
    root = tmp_path / "runs"
    sweep_file = tmp_path / "s.yaml"
    sweep_file.write_text("objective: {tag: eval/macro_f1, direction: maximize}\n"
                          "params: {train.lr: {low: 0.1, high: 1}}\ntrials: 2\nparallel: 1\n")
    args = ["quickstart", str(sweep_file), f"run.runs_root={root}", "--poll", "0"]
    assert sweep_cli.main(args + ["--pause"]) == 2  # no ledger yet: not a runs root
    assert "does not exist. Expected a runs root" in capsys.readouterr().err and not root.exists()
    Ledger.in_runs_root(root).close()
    assert sweep_cli.main(args + ["--pause"]) == 0
    monkeypatch.setattr(sweep_cli.SlurmCLI, "available", staticmethod(lambda: True))
    monkeypatch.setattr(sweep_cli, "SlurmCLI", type("NoSlurm", (sweep_cli.SlurmCLI,), {
        "run": lambda self, *a, **k: pytest.fail(f"a paused sweep called Slurm: {a}")}))
    assert sweep_cli.main(args) == sweep_cli.EXIT_PAUSED == 5
    err = capsys.readouterr().err
    assert "paused" in err and "--resume" in err and "Traceback" not in err

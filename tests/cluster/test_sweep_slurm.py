"""Sweeps on the real localhost Slurm: a pruned, improving sweep; a killed driver resuming its study; a
preempted trial resumed by the watcher whose result still reaches the study. Trials are the classifier
workload for a few hundred to a few thousand steps (~10-20 s each, mostly Python/DeepSpeed start-up)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from hpc_agent.metrics.tb_reader import RunScalars
from hpc_agent.state.ledger import Ledger
from hpc_agent.sweep.driver import objective_value
from tests.conftest import REPO, run_cli
from tests.slurm_helpers import SLURM, WatcherProcess, attempts, log_text, preempt_all_nodes, queue_and_nodes, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
optuna.logging.set_verbosity(optuna.logging.WARNING)

EXAMPLE = REPO / "configs" / "sweep_classifier.yaml"


def sweep_file(tmp_path: Path, name: str, **changes) -> Path:
    """The shipped example with a unique name (so Slurm job names never collide between tests) and changes."""
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(OmegaConf.load(EXAMPLE))
    data.update(name=f"{name}-{os.getpid()}-{time.time_ns() % 10**6}", **changes)
    path = tmp_path / f"{name}.yaml"
    path.write_text(OmegaConf.to_yaml(OmegaConf.create(data)))
    return path


def sweep_cmd(path: Path, root: Path, *extra: str):
    return [sys.executable, "-m", "hpc_agent.sweep", "quickstart", str(path), f"run.runs_root={root}", "--poll", "1",
            *extra]


def study_of(root: Path, path: Path):
    name = json.loads((next((root / "sweeps").iterdir()) / "sweep.json").read_text())["name"]
    return optuna.load_study(study_name=name, storage=f"sqlite:///{root / 'sweeps' / name / 'study.db'}")


def sweep_jobs(name: str, since: float):
    """Every Slurm job (array task) named for this sweep: to prove that nothing was submitted twice."""
    start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since - 60))
    text = SLURM.run(["sacct", "--parsable2", "--noheader", "--allocations", "--starttime", start,
                      "--format", "JobID,JobName"]).stdout
    return sorted(line.split("|")[0] for line in text.splitlines()
                  if line.split("|")[-1].startswith(f"hpc_agent:sweep:{name}:"))


def test_sweep_prunes_and_the_best_beats_the_median_startup_trial(root, tmp_path):
    path = sweep_file(tmp_path, "ci")
    root.mkdir(parents=True)
    watcher = WatcherProcess(root)
    watcher.wait_until_following()  # the sweep then uses it, not an embedded watcher of its own
    try:
        proc = subprocess.run(sweep_cmd(path, root, "--trials", "8", "--parallel", "2"), capture_output=True,
                              text=True, timeout=240, cwd=str(REPO))
    finally:
        watcher.stop()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    study = study_of(root, path)
    trials = study.trials
    states = [t.state.name for t in trials]
    assert len(trials) == 8 and set(states) <= {"COMPLETE", "PRUNED"}, states
    pruned = [t for t in trials if t.state.name == "PRUNED"]
    assert pruned, f"no trial was pruned: {proc.stdout}"
    ended = []
    for t in pruned:  # stopped early and cleanly: scancel-ed before its last step, stopped in the ledger
        assert max(t.intermediate_values) < 1500
        assert Ledger.in_runs_root(root).run(t.user_attrs["run_id"]).phase == "stopped"
        ended.append([a.state for a in attempts(t.user_attrs["job_id"])][-1])
    # A job can finish in the second between the pruning decision and scancel; most are cancelled.
    assert "CANCELLED" in ended and set(ended) <= {"CANCELLED", "COMPLETED"}, ended
    startup = sorted(t.value for t in trials[:4] if t.state.name == "COMPLETE")
    median = (startup[(len(startup) - 1) // 2] + startup[len(startup) // 2]) / 2
    assert study.best_value > median, (study.best_value, startup)
    # Every trial is an ordinary run: its own run dir, log, config; the objective is its TensorBoard value.
    best = study.best_trial
    run_dir = Path(best.user_attrs["run_dir"])
    assert "done: 1500 steps" in log_text(run_dir, best.user_attrs["job_id"])
    assert objective_value(_read(run_dir)) == best.value
    review = run_cli("-m", "hpc_agent.review", str(root / "sweeps" / study.study_name), "--json")
    assert review.returncode == 0, review.stderr
    report = json.loads(review.stdout)
    assert [r["state"] for r in report["trials"]] == [s.lower() for s in states]
    assert report["summary"]["best_trial"] == best.number and Path(report["plot"]).stat().st_size > 10_000
    print(f"\nsweep: {len(trials)} trials, {len(pruned)} pruned, best {study.best_value:.4f} vs median of the "
          f"random start-up trials {median:.4f}")


def _read(run_dir: Path):
    scalars = RunScalars(run_dir / "tb")
    scalars.update()
    return scalars.series("eval/macro_f1")


def test_killed_driver_resumes_the_same_study_without_duplicates(root, tmp_path):
    path = sweep_file(tmp_path, "resume", pruner="none")
    from omegaconf import OmegaConf

    name = OmegaConf.load(path).name
    cmd = sweep_cmd(path, root, "--trials", "4", "--parallel", "2", "train.max_steps=300")
    t0 = time.time()
    # 1. killed after recording two trials' intents, before sbatch: nothing reached Slurm.
    crashed = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=str(REPO),
                             env=dict(os.environ, HPC_AGENT_CRASH_AT="sweep_after_intent"))
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout + crashed.stderr
    assert [t.state.name for t in study_of(root, path).trials] == ["RUNNING", "RUNNING"]
    assert sweep_jobs(name, t0) == []
    # 2. restarted: resubmits those two, killed right after sbatch, before any job id was recorded.
    crashed = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=str(REPO),
                             env=dict(os.environ, HPC_AGENT_CRASH_AT="sweep_after_submit"))
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout + crashed.stderr
    assert "never reached Slurm; submitting it now" in crashed.stdout
    wait_for(lambda: len(sweep_jobs(name, t0)) == 2, 30, what="sacct to list the two array tasks")
    # 3. restarted: finds that array by name and adopts it; killed (SIGKILL) once it follows a later trial.
    driver = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=str(REPO))
    try:
        wait_for(lambda: any("job_id" in t.user_attrs for t in study_of(root, path).trials[2:]), 120,
                 what="a third trial to be submitted")
    finally:
        driver.kill()
    first_output = driver.communicate()[0]
    assert first_output.count("its array reached Slurm as job") == 2, first_output
    # 4. restarted once more: finishes the study.
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=str(REPO))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "adopted run" in done.stdout
    trials = study_of(root, path).trials
    assert [t.number for t in trials] == [0, 1, 2, 3]
    assert [t.state.name for t in trials] == ["COMPLETE"] * 4, done.stdout
    ledger = Ledger.in_runs_root(root)
    jobs = [[s.job_id for s in ledger.submissions(t.user_attrs["run_id"])] for t in trials]
    assert all(len(j) == 1 for j in jobs), jobs  # one job per trial in the ledger ...
    assert sorted(j[0] for j in jobs) == sweep_jobs(name, t0)  # ... and in Slurm: nothing ran twice
    assert len({t.user_attrs["run_id"] for t in trials}) == 4
    # Each restart continued the random stream instead of replaying it: four different points.
    assert len({json.dumps(t.params, sort_keys=True) for t in trials}) == 4, [t.params for t in trials]


def test_preempted_trial_is_resumed_by_the_watcher_and_reaches_the_study(root, tmp_path):
    path = sweep_file(tmp_path, "preempt", pruner="none", params={"train.lr": {"type": "logfloat", "low": 1e-3,
                                                                                "high": 1e-2}})
    root.mkdir(parents=True)
    watcher = WatcherProcess(root)
    watcher.wait_until_following()  # its output must show the expedite below: the sweep only observes it
    driver_log = tmp_path / "driver.log"
    with open(driver_log, "w") as sink:  # a file, not a pipe: readable while it runs, for the failure message
        driver = subprocess.Popen(sweep_cmd(path, root, "--trials", "2", "--parallel", "2", "train.max_steps=10000",
                                            "train.ckpt_every=500", "train.eval_every=1000", "train.log_every=100"),
                                  stdout=sink, stderr=subprocess.STDOUT, text=True, cwd=str(REPO))

    def explain() -> str:
        logs = "".join(f"--- {p}\n{p.read_text(errors='replace')[-1500:]}\n" for p in sorted(root.rglob("*_log.*")) if p.parent.name == "slurm")
        return (f"{queue_and_nodes()}--- driver:\n{driver_log.read_text()[-3000:]}\n--- watcher:\n"
                f"{watcher.output()[-2000:]}\n{logs}")
    try:
        def running_step():
            try:
                trials = study_of(root, path).trials
            except Exception:  # noqa: BLE001 - the driver has not created the study yet
                return False
            dirs = [Path(t.user_attrs["run_dir"]) for t in trials if "job_id" in t.user_attrs]
            return dirs and all("step 1000 " in log_text(d) for d in dirs) and dirs
        # 240 s, not the 82 s this takes alone: two cores also serve the rest of the suite. A failure says why.
        wait_for(running_step, 240, what="both trials to pass step 1000", explain=explain)
        preempt_all_nodes(seconds=2)
        driver.wait(timeout=240)
        output = driver_log.read_text()
    finally:
        if driver.poll() is None:
            driver.kill()
        watcher.stop()
    assert driver.returncode == 0, output
    watch_out = watcher.output()
    study = study_of(root, path)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"], output
    resumed = [t for t in study.trials if "resumed at step" in log_text(Path(t.user_attrs["run_dir"]))]
    assert resumed, watch_out
    ledger = Ledger.in_runs_root(root)
    for t in resumed:
        job_id = t.user_attrs["job_id"]
        assert f"job {job_id} requeued by Slurm after preempted: expedite" in watch_out
        assert [s.job_id for s in ledger.submissions(t.user_attrs["run_id"])] == [job_id]  # requeued in place
        assert [a.state for a in attempts(job_id)][-1] == "COMPLETED" and len(attempts(job_id)) >= 2
        assert t.value == objective_value(_read(Path(t.user_attrs["run_dir"])))
        assert max(p.step for p in _read(Path(t.user_attrs["run_dir"]))) == 10000


def _held(name: str):
    """This sweep's tasks that squeue lists as held (by us: --hold), task id -> job name."""
    text = SLURM.run(["squeue", "--noheader", "--array", "--user", str(os.getuid()), "--states", "PENDING",
                      "--format", "%i|%r|%j"]).stdout
    rows = [line.split("|", 2) for line in text.splitlines() if line.count("|") >= 2]
    return {r[0]: r[2] for r in rows if r[1] == "JobHeldUser" and r[2].startswith(f"hpc_agent:sweep:{name}:")}


def test_a_driver_killed_before_the_release_leaves_no_held_array(root, tmp_path):
    """Killed between sbatch and the release: a held array of two tasks. Meanwhile the study gave up on one
    trial. The next driver releases the task its running trial records (it completes) and cancels the
    other, saying which, so nothing stays held in the queue."""
    from omegaconf import OmegaConf

    path = sweep_file(tmp_path, "held", pruner="none")
    name = OmegaConf.load(path).name
    cmd = sweep_cmd(path, root, "--trials", "2", "--parallel", "2", "train.max_steps=300")
    try:
        crashed = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=str(REPO),
                                 env=dict(os.environ, HPC_AGENT_CRASH_AT="sweep_before_release"))
        assert crashed.returncode == -signal.SIGKILL, crashed.stdout + crashed.stderr
        held = _held(name)
        assert len(held) == 2, held
        base = sorted(held)[0].split("_")[0]
        study_of(root, path).tell(1, state=optuna.trial.TrialState.FAIL)
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=str(REPO))
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"held job {base}_1 (batch " in done.stdout and "): cancelled; no running trial" in done.stdout
        assert f"trial 0: its array reached Slurm as job {base}_0; adopted" in done.stdout
        assert _held(name) == {}
        trials = study_of(root, path).trials
        assert [t.state.name for t in trials] == ["COMPLETE", "FAIL"], done.stdout
        assert [a.state for a in attempts(f"{base}_0")][-1] == "COMPLETED"
        # A task cancelled while still pending never ran; sacct does not even list it on its own.
        assert [a.state for a in attempts(f"{base}_1")] in ([], ["CANCELLED"])
        assert SLURM.run(["squeue", "--noheader", "--array", "--jobs", base, "--format", "%i"],
                         check=False).stdout.split() == []
    finally:
        leftover = sorted(_held(name))
        if leftover:
            SLURM.run(["scancel", *leftover], check=False)

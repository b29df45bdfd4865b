"""``--clusters`` (Slurm's -M) reaches every Slurm command of every code path (docs/cli.md).

A recording runner replaces ``SlurmCLI._execute`` (the one subprocess call): it records each argv, then
answers from the in-memory Slurm (tests/helpers/fake_slurm.py) without the flag. Any Slurm command started
some other way (submitit's own sbatch/sacct/scancel, a stray subprocess) fails the test.
"""
from __future__ import annotations

import os
import subprocess
import time
from typing import List

import pytest

from hpc_agent.slurm.cli import ALLOWED, CLUSTERS_ENV, SlurmCLI, strip_cluster_headers, with_clusters
from tests.helpers.fake_slurm import FakeSlurm

CLUSTER = "gpu-b"
FLAG = f"--clusters={CLUSTER}"


class Recorder:
    def __init__(self) -> None:
        self.fake = FakeSlurm(clock=time.time)  # real time: the watcher checks a job's submit time against the run's
        self.calls: List[List[str]] = []

    def execute(self, argv, timeout_s):
        argv = [str(a) for a in argv]
        self.calls.append(argv)
        plain = [a for a in argv if a != FLAG]
        if plain[0] == "srun":  # doctor's probe of the job's Python: the fake has no srun
            return subprocess.CompletedProcess(argv, 1, "", "srun: error: stand-in")
        try:
            result = self.fake.run(plain, check=False)
        except Exception as exc:  # noqa: BLE001 - an option the fake does not know (doctor's now-1minutes)
            return subprocess.CompletedProcess(argv, 1, "", f"stand-in: {exc}")
        return subprocess.CompletedProcess(argv, result.returncode, result.stdout, result.stderr)

    def take(self) -> List[List[str]]:
        calls, self.calls = self.calls, []
        return calls


@pytest.fixture
def slurm(monkeypatch, tmp_path):
    recorder = Recorder()
    monkeypatch.setattr(SlurmCLI, "_execute", staticmethod(recorder.execute))
    monkeypatch.setattr(SlurmCLI, "available", staticmethod(lambda: True))
    monkeypatch.setenv(CLUSTERS_ENV, "")  # restored after the test: the flag below sets it
    monkeypatch.delenv("HPC_AGENT_RUNS", raising=False)
    monkeypatch.chdir(tmp_path)
    real_popen = subprocess.Popen

    class NoSlurmOutsideCLI(real_popen):  # type: ignore[misc, valid-type]
        def __init__(self, args, *a, **k):
            first = args[0] if isinstance(args, (list, tuple)) else str(args).split()[0]
            assert os.path.basename(str(first)) not in ALLOWED, f"{args} ran outside SlurmCLI"
            super().__init__(args, *a, **k)

    monkeypatch.setattr(subprocess, "Popen", NoSlurmOutsideCLI)
    return recorder


def assert_all_carry_clusters(calls: List[List[str]], *expected_commands: str) -> None:
    assert calls, "no Slurm command ran"
    assert [c for c in calls if c[1:2] != [FLAG]] == [], "Slurm commands without --clusters"
    assert set(expected_commands) <= {c[0] for c in calls}, [c[0] for c in calls]


def test_every_code_path_passes_clusters(slurm, tmp_path):
    from hpc_agent import diagnose, doctor, submit, watch
    from hpc_agent.state.ledger import Ledger

    root = tmp_path / "runs"
    # submit: submitit's sbatch (TimedSlurmExecutor -> SlurmCLI)
    assert submit.main(["quickstart", "--executor", "slurm", f"run.runs_root={root}", "--clusters", CLUSTER, "-q"]) == 0
    assert_all_carry_clusters(slurm.take(), "sbatch")
    assert os.environ[CLUSTERS_ENV] == CLUSTER  # the run-wide setting, for the processes it starts
    ledger = Ledger.in_runs_root(root)
    (run,) = ledger.runs()
    (job_id,) = [s.job_id for s in ledger.submissions(run.run_id)]
    ledger.close()

    # the watcher: sacct, then the repair of a host OOM (sinfo for node memory, squeue, submitit's sbatch)
    os.environ[CLUSTERS_ENV] = ""  # the flag alone must carry it
    slurm.fake.start(job_id)
    slurm.fake.oom(job_id)
    assert watch.main(["--runs-root", str(root), "--once", "--clusters", CLUSTER, "-q"]) == 0
    calls = slurm.take()
    assert_all_carry_clusters(calls, "sacct", "sinfo", "sbatch")

    # diagnose: sacct and, for the log path, scontrol
    assert diagnose.main([job_id, "--runs-root", str(tmp_path / "elsewhere"), "--clusters", CLUSTER, "-q"]) == 0
    assert_all_carry_clusters(slurm.take(), "sacct", "scontrol")

    # doctor: sinfo, sacct, sbatch --test-only, srun probe
    doctor.main(["quickstart", "--clusters", CLUSTER, "-q"])
    assert_all_carry_clusters(slurm.take(), "sinfo", "sacct", "sbatch", "srun")


def test_sweep_batch_submit_passes_clusters(slurm, tmp_path, monkeypatch):
    pytest.importorskip("optuna")
    from hpc_agent.sweep import __main__ as sweep_cli
    from hpc_agent.sweep.driver import SweepDriver

    sweep_file = tmp_path / "s.yaml"
    sweep_file.write_text("objective: {tag: eval/macro_f1, direction: maximize}\n"
                          "params: {train.lr: {low: 0.1, high: 1}}\ntrials: 2\nparallel: 2\n")
    monkeypatch.setattr(SweepDriver, "finished", lambda self: True)  # one turn: adopt, poll, fill
    assert sweep_cli.main(["quickstart", str(sweep_file), f"run.runs_root={tmp_path / 'runs'}", "--poll", "0",
                           "--clusters", CLUSTER, "-q"]) == 0
    calls = slurm.take()
    assert_all_carry_clusters(calls, "sbatch", "scontrol")
    assert any("release" in c for c in calls)  # the held array, released


def test_the_environment_alone_sets_it(slurm, monkeypatch):
    monkeypatch.setenv(CLUSTERS_ENV, CLUSTER)
    SlurmCLI().run(["squeue", "--noheader", "--jobs", "1", "--format", "%T"], check=False)
    assert slurm.take() == [["squeue", FLAG, "--noheader", "--jobs", "1", "--format", "%T"]]


def test_without_clusters_argv_is_unchanged(slurm):
    SlurmCLI().run(["sinfo", "--noheader"], check=False)
    assert slurm.take() == [["sinfo", "--noheader"]]


def test_with_clusters_goes_right_after_the_command_and_respects_one_given():
    assert with_clusters(["scontrol", "requeue", "5"], "a") == ["scontrol", "--clusters=a", "requeue", "5"]
    assert with_clusters(["sacct", "-M", "b", "--jobs", "5"], "a") == ["sacct", "-M", "b", "--jobs", "5"]
    assert with_clusters(["sacct", "--clusters=b"], "a") == ["sacct", "--clusters=b"]
    assert with_clusters(["sacct"], None) == ["sacct"]


def test_cluster_header_lines_are_dropped():
    text = "CLUSTER: gpu-b\nRUNNING\n"
    assert strip_cluster_headers(text) == "RUNNING\n"
    assert strip_cluster_headers("PENDING\n") == "PENDING\n"


@pytest.mark.parametrize("value", ["-x", "a b", "a;b", "a,", "$(id)", ""])
def test_a_clusters_value_that_is_not_names_is_a_usage_error(value, capsys):
    from hpc_agent import watch

    with pytest.raises(SystemExit) as exc:
        watch.main(["--clusters", value, "--once"])
    assert exc.value.code == 2 and "--clusters" in capsys.readouterr().err


def test_submit_wait_passes_clusters(slurm, tmp_path):
    """--wait follows the run (an embedded watcher when none runs) and diagnoses an unfinished job: all of it
    through SlurmCLI, with the flag."""
    from hpc_agent import submit

    slurm.fake.auto_schedule = True
    rc = submit.main(["quickstart", "--executor", "slurm", "--wait", "--wait-timeout", "2",
                      f"run.runs_root={tmp_path / 'runs'}", "--clusters", CLUSTER, "-q"])
    assert rc == 1  # still running when the wait ended: not completed
    assert_all_carry_clusters(slurm.take(), "sbatch", "sacct")

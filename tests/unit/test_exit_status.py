"""One exit-code table for every command (hpc_agent/cli/exit_status.py, docs/cli.md): each code each command can
return, produced in-process by inputs that lead to it, plus --version, -v and -q on every command.

Slurm is never called: a case that needs an answer from it replaces ``SlurmCLI._execute`` (the one
subprocess call). prepare's torch/DeepSpeed module is a stand-in, so no case imports torch.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional

import pytest

from hpc_agent.cli import exit_status
from hpc_agent.slurm.cli import CLUSTERS_ENV, SlurmCLI
from tests.conftest import REPO

SACCT = REPO / "tests" / "data" / "sacct"
SWEEP_FILE = ("objective: {tag: eval/macro_f1, direction: maximize}\n"
              "params: {train.lr: {low: 0.1, high: 1}}\ntrials: 2\nparallel: 1\n")
BIG = ["model.n_layers=24", "model.d_model=1024", "model.seq_len=4096", "model.n_heads=16",  # tests/unit/test_preflight.py
       "train.micro_batch_size=16", "train.precision=bf16", "train.zero_stage=1", "slurm.gpus_per_node=1",
       "slurm.gpu_memory_gib=8"]


@dataclass
class Env:
    tmp: Path
    mp: pytest.MonkeyPatch

    @property
    def root(self) -> Path:
        return self.tmp / "runs"

    def slurm(self, answer: Callable[[List[str]], tuple]) -> None:
        """Every Slurm call answers ``answer(argv) -> (returncode, stdout, stderr)``."""
        import subprocess

        def execute(argv, timeout_s):
            rc, out, err = answer(list(argv))
            return subprocess.CompletedProcess(argv, rc, out, err)

        self.mp.setattr(SlurmCLI, "_execute", staticmethod(execute))
        self.mp.setattr(SlurmCLI, "available", staticmethod(lambda: True))

    def no_slurm(self) -> None:
        self.mp.setattr(SlurmCLI, "available", staticmethod(lambda: False))

    def ledger(self) -> Path:
        from hpc_agent.state.ledger import Ledger

        Ledger.in_runs_root(self.root).close()
        return self.root


def main_of(command: str) -> Callable:
    import importlib

    module = importlib.import_module(f"hpc_agent.{command}")
    return module.main if hasattr(module, "main") else importlib.import_module(f"hpc_agent.{command}.__main__").main


def invoke(command: str, argv: List[str]) -> int:
    try:
        return int(main_of(command)(argv) or 0)
    except SystemExit as exc:  # argparse's --version, --help and usage errors
        return int(exc.code or 0)


# --- the inputs behind each (command, code) ----------------------------------------------------------------

def submit_ok(e: Env) -> List[str]:
    e.no_slurm()
    return ["quickstart", "--dry-run", f"run.runs_root={e.root}"]  # --executor auto: announces "executor: local"


def submit_failed(e: Env) -> List[str]:
    """--wait, and the job ends FAILED (the local job and its wait are stand-ins: no process starts)."""
    import hpc_agent.jobs.submission as submission
    from hpc_agent.watcher import submit_wait

    e.mp.setattr(submission, "submit_attempt", lambda *a, **k: types.SimpleNamespace(job_id="41"))
    e.mp.setattr(submit_wait, "wait_run", lambda *a, **k: ("FAILED", "41", "stopped"))
    return ["quickstart", "--executor", "local", "--wait", f"run.runs_root={e.root}"]


def submit_slurm(e: Env) -> List[str]:
    e.slurm(lambda argv: (1, "", "sbatch: error: Batch job submission failed: Invalid account")
            if argv[0] == "sbatch" else (0, "", ""))
    return ["quickstart", "--executor", "slurm", f"run.runs_root={e.root}"]


def submit_paused(e: Env) -> List[str]:
    """The runs root's kill switch is set: refused before anything is created, no sbatch (issue 42, finding 6)."""
    from hpc_agent.state import killswitch

    e.slurm(lambda argv: pytest.fail(f"a paused submit ran {argv}") if argv[0] == "sbatch" else (0, "", ""))
    killswitch.switch(e.ledger(), pause=True, out=lambda text: None)
    return ["quickstart", "--executor", "slurm", f"run.runs_root={e.root}"]


def sweep_busy(e: Env) -> List[str]:
    from hpc_agent.core.fsutil import hold_lock

    e.slurm(lambda argv: (0, "", ""))
    lock_dir = e.root / "sweeps" / "s"
    lock_dir.mkdir(parents=True)
    e.held = hold_lock(lock_dir / "driver.lock")  # another driver (kept open until the test ends)
    assert e.held is not None
    return ["quickstart", str(sweep_file(e)), f"run.runs_root={e.root}"]


def sweep_paused(e: Env) -> List[str]:
    from hpc_agent.state import killswitch

    killswitch.switch(e.ledger(), pause=True)
    e.slurm(lambda argv: pytest.fail(f"a paused sweep called Slurm: {argv}"))
    return ["quickstart", str(sweep_file(e)), f"run.runs_root={e.root}", "--poll", "0"]


def export_ok(e: Env) -> List[str]:
    """A run with two complete checkpoints; the torch half (the consolidation) is a stand-in."""
    from hpc_agent import export
    from tests.helpers.export_run import make_run, stand_in_weights

    e.mp.setattr(export, "export_weights", stand_in_weights)
    return [str(make_run(e.root)), "--out", str(e.tmp / "export-out")]


def sweep_file(e: Env) -> Path:
    path = e.tmp / "s.yaml"
    path.write_text(SWEEP_FILE)
    return path


def watch_busy(e: Env) -> List[str]:
    from hpc_agent.state.journal import WatcherLease
    from hpc_agent.state.ledger import Ledger

    ledger = Ledger.in_runs_root(e.root)
    assert WatcherLease(ledger, ttl_s=600).acquire() is None  # another watcher (a live pid: ours) holds it
    ledger.close()
    return ["--runs-root", str(e.root), "--once"]


def fake_ops(e: Env, prepare=None, missing: bool = False) -> None:
    """launch.ops without torch: the few names prepare uses."""
    ops = types.ModuleType("launch.ops")
    ops.current_runtime = lambda: types.SimpleNamespace(accelerator="cpu", describe=lambda: "cpu (stand-in)")
    ops.resolve_builders = lambda names: [types.SimpleNamespace(name=n) for n in names]
    ops.prepare = prepare or (lambda names, root, force, log: set(names))
    ops.verify = lambda names, root: []
    use_ops(e, ops)
    import hpc_agent.prepare as prepare_cli

    e.mp.setattr(prepare_cli, "find_prepared", lambda *a: (None, "not built") if missing else ("/x", ""))


def use_ops(e: Env, ops: Optional[types.ModuleType]) -> None:
    """``from launch import ops`` finds ``ops`` (None: an ImportError, as without torch), even after another
    test imported the real one (then the package's attribute answers before sys.modules)."""
    import launch

    e.mp.setitem(sys.modules, "launch.ops", ops)
    if ops is None:
        e.mp.delattr(launch, "ops", raising=False)
    else:
        e.mp.setattr(launch, "ops", ops, raising=False)


def raising(exc: Exception):
    def prepare(*a, **k):
        raise exc
    return prepare


def chaos_failed(e: Env) -> List[str]:
    """The run and its driver are stand-ins: a chaos run whose checks did not pass (nothing completed)."""
    from hpc_agent.chaos import campaign, inject

    run_dir = e.root / "r"
    run_dir.mkdir(parents=True)
    e.mp.setattr(campaign, "submit_run", lambda root, config, overrides: run_dir)
    e.mp.setattr(inject, "Watcher", lambda root: types.SimpleNamespace(start=lambda: None, stop=lambda: None,
                                                                       log="watch.log"))
    from hpc_agent.chaos.report import Check, TargetSummary

    lost = [TargetSummary("watched", False, 10, None, 0.0, 1.0, [Check("completed", False, "not completed")])]
    e.mp.setattr(campaign, "ChaosDriver", lambda *a, **k: types.SimpleNamespace(records=[], run=lambda: lost))
    e.slurm(lambda argv: (0, "", ""))
    return ["--schedule", str(schedule(e)), "--runs-root", str(e.root), "--duration", "1"]


def schedule(e: Env) -> Path:
    path = e.tmp / "schedule.yaml"
    path.write_text("- {kind: preempt, at_s: 5}\n")
    return path


def data_file(e: Env) -> Path:
    path = e.tmp / "train.csv"
    path.write_text("text,label\n" + "".join(f"row {i},{i % 2}\n" for i in range(40)))
    return path


def review_run(e: Env) -> List[str]:
    run = e.root / "r1"
    run.mkdir(parents=True)
    (run / "events.jsonl").write_text("")
    return [str(run)]


def poisoned_run(e: Env) -> Path:
    """A run whose job wrote an events.jsonl line nested 100000 deep (review/status/diagnose: exit 1, no traceback)."""
    run = e.root / "r1"
    run.mkdir(parents=True, exist_ok=True)
    (run / "events.jsonl").write_text("[" * 100000 + "]" * 100000 + "\n")
    (run / "run.json").write_text(json.dumps({"run_id": {"not": "a string"}}))
    return run


def diagnose_poisoned(e: Env) -> List[str]:
    """sacct names run r1's job RUNNING; its only log is a FIFO the job planted."""
    run = poisoned_run(e)
    (run / "slurm").mkdir()
    os.mkfifo(run / "slurm" / "42_0_log.out")
    sacct = e.tmp / "sacct.txt"
    sacct.write_text("JobID|JobName|State|ExitCode|NodeList|Start|End|Elapsed\n"
                     "42|hpc_agent:r1|RUNNING|0:0|node1|2026-11-30T10:00:05|Unknown|00:01:07\n")
    return ["--sacct-file", str(sacct), "--runs-root", str(e.root)]


def status_poisoned(e: Env) -> List[str]:
    e.slurm(lambda argv: (0, "", ""))
    root = e.ledger()
    poisoned_run(e)
    return ["--runs-root", str(root)]


def init_conflict(e: Env) -> List[str]:
    (e.tmp / "hpc_agent.yaml").write_text("mine: true\n")
    return [str(e.tmp)]


def config_conflict(e: Env) -> List[str]:
    from hpc_agent.config.__main__ import main

    assert main(["--copy", str(e.tmp / "copy")]) == 0
    return ["--copy", str(e.tmp / "copy")]


OK, FAILED, USAGE, SLURM, BUSY, PAUSED, WONT_FIT = (exit_status.OK, exit_status.FAILED, exit_status.USAGE,
                                                    exit_status.SLURM, exit_status.BUSY, exit_status.PAUSED,
                                                    exit_status.WONT_FIT)
REMOTE = exit_status.REMOTE


def unreachable(e: Env, *words: str) -> List[str]:
    """``--remote`` through an ``ssh`` that fails as an unreachable host does (exit 255, a message on stderr):
    a stand-in first on PATH, so no network or sshd is involved."""
    import os

    bin_dir = e.tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "ssh").write_text("#!/bin/sh\necho 'ssh: connect to host login port 22: Connection refused' >&2\n"
                                 "exit 255\n")
    (bin_dir / "ssh").chmod(0o755)
    e.mp.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    e.mp.setenv("XDG_RUNTIME_DIR", str(e.tmp / "xdg"))
    return [*words, "--remote", "me@login"]


def cancel_run(e: Env) -> str:
    """A run in the ledger whose job 41 runs."""
    from hpc_agent.state.ledger import Ledger

    ledger = Ledger.in_runs_root(e.root)
    try:
        (e.root / "r1").mkdir()
        ledger.add_run("r1", "t", str(e.root / "r1"))
        ledger.record_submitted(ledger.record_intent("r1", "slurm", str(e.root / "r1" / "config.yaml"), "submit"), "41")
    finally:
        ledger.close()
    return "r1"


def cancel_ok(e: Env) -> List[str]:
    e.slurm(lambda argv: (0, "41|RUNNING\n", "") if argv[0] == "squeue" else (0, "", ""))
    return [cancel_run(e), "--runs-root", str(e.root)]


def cancel_slurm(e: Env) -> List[str]:
    e.slurm(lambda argv: (1, "", "squeue: error: Unable to contact slurm controller (connect failure)"))
    return [cancel_run(e), "--runs-root", str(e.root)]


def status_ok(e: Env) -> List[str]:
    e.slurm(lambda argv: (0, "", ""))
    return ["--runs-root", str(e.ledger())]
CASES = {
    ("submit", OK): submit_ok,
    ("submit", FAILED): submit_failed,
    ("submit", USAGE): lambda e: ["quickstart", "train.max_steps=-1", f"run.runs_root={e.root}"],
    ("submit", SLURM): submit_slurm,
    ("submit", PAUSED): submit_paused,
    ("submit", WONT_FIT): lambda e: ["quickstart", *BIG, f"run.runs_root={e.root}", "--executor", "local"],
    ("watch", OK): lambda e: (e.slurm(lambda argv: (0, "", "")),
                              ["--runs-root", str(e.ledger()), "--once", "--dry-run"])[1],
    ("watch", USAGE): lambda e: ["--runs-root", str(e.root), "--interval", "0"],
    ("watch", BUSY): watch_busy,
    ("diagnose", OK): lambda e: ["--sacct-file", str(SACCT / "completed.txt"), "--runs-root", str(e.root)],
    ("diagnose", USAGE): lambda e: [],
    ("review", OK): review_run,
    ("review", FAILED): lambda e: [str(poisoned_run(e))],
    ("status", FAILED): status_poisoned,
    ("diagnose", FAILED): diagnose_poisoned,
    ("review", USAGE): lambda e: [str(e.tmp / "nope")],
    ("submit", REMOTE): lambda e: unreachable(e, "quickstart", f"run.runs_root={e.root}"),
    ("diagnose", REMOTE): lambda e: unreachable(e, "1234"),
    ("review", REMOTE): lambda e: unreachable(e, "runs"),
    ("status", OK): status_ok,
    ("cancel", OK): cancel_ok,
    ("cancel", USAGE): lambda e: (e.ledger(), ["nosuch-run", "--runs-root", str(e.root)])[1],
    ("cancel", SLURM): cancel_slurm,
    ("status", USAGE): lambda e: ["--runs-root", str(e.tmp / "nope")],
    ("status", REMOTE): lambda e: unreachable(e),
    ("doctor", OK): lambda e: ["--data", str(data_file(e)), "--out", str(e.tmp / "data.yaml")],
    ("doctor", FAILED): lambda e: ["--data", str(e.tmp / "missing.csv")],
    ("doctor", USAGE): lambda e: ["--out", "x.yaml"],
    ("sweep", OK): lambda e: ["quickstart", str(sweep_file(e)), f"run.runs_root={e.root}", "--dry-run"],
    ("sweep", USAGE): lambda e: ["quickstart", str(e.tmp / "missing.yaml"), f"run.runs_root={e.root}"],
    ("sweep", SLURM): lambda e: (e.no_slurm(), ["quickstart", str(sweep_file(e)), f"run.runs_root={e.root}"])[1],
    ("sweep", BUSY): sweep_busy,
    ("sweep", PAUSED): sweep_paused,
    ("chaos", OK): lambda e: ["--seed", "1", "--faults", "2", "--print-schedule"],
    ("chaos", FAILED): chaos_failed,
    ("chaos", USAGE): lambda e: ["--schedule", str(e.tmp / "missing.yaml")],
    ("prepare", OK): lambda e: (fake_ops(e), ["--ops-dir", str(e.tmp / "ops")])[1],
    ("prepare", FAILED): lambda e: (fake_ops(e, missing=True), ["--check", "--ops-dir", str(e.tmp / "ops")])[1],
    ("prepare", USAGE): lambda e: (use_ops(e, None), [])[1],  # no torch/DeepSpeed
    ("prepare", BUSY): lambda e: (fake_ops(e, prepare=raising(TimeoutError("another prepare holds the lock"))),
                                  ["--ops-dir", str(e.tmp / "ops")])[1],
    ("export", OK): export_ok,
    ("export", USAGE): lambda e: [str(e.tmp / "nope"), "--out", str(e.tmp / "export-out")],
    ("init", OK): lambda e: [str(e.tmp / "project")],
    ("init", USAGE): init_conflict,
    ("config", OK): lambda e: ["--list"],
    ("config", USAGE): config_conflict,
}


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HPC_AGENT_RUNS", raising=False)
    monkeypatch.setenv(CLUSTERS_ENV, "")  # restored after the test, whatever a --clusters flag sets
    yield Env(tmp_path, monkeypatch)
    logging.getLogger("hpc_agent").setLevel(logging.NOTSET)


def test_every_code_of_every_command_has_a_case():
    assert sorted(CASES) == sorted((cmd, code) for cmd, codes in exit_status.BY_COMMAND.items() for code in codes)


def test_the_table_names_each_code_once():
    names = [name for name, _ in exit_status.TABLE.values()]
    local = sorted(c for c in exit_status.TABLE if c != exit_status.REMOTE)  # 255 is ssh's, kept as ssh says it
    assert len(set(names)) == len(names) and local == list(range(len(local)))


@pytest.mark.parametrize("command, code", sorted(CASES), ids=[f"{c}-{exit_status.TABLE[k][0]}" for c, k in sorted(CASES)])
def test_command_returns_the_code(command, code, env, capsys):
    if command == "sweep":
        pytest.importorskip("optuna")
    argv = CASES[(command, code)](env)
    assert invoke(command, argv) == code, capsys.readouterr()
    assert "Traceback" not in capsys.readouterr().err


def test_dispatcher_codes(capsys):
    from hpc_agent.__main__ import main

    assert main(["frobnicate"]) == exit_status.USAGE
    assert main(["--version"]) == exit_status.OK and capsys.readouterr().out.strip().startswith("hpc_agent ")


# --- --version, -v and -q on every command ------------------------------------------------------------------

@pytest.mark.parametrize("command", list(exit_status.BY_COMMAND))
def test_version(command, capsys):
    from hpc_agent import __version__

    assert invoke(command, ["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"hpc_agent {__version__}"


CHATTER = {"submit": "executor: local", "prepare": "[prepare] ready", "watch": "[watch] following"}
CHATTER_ON_STDERR = {"export"}  # its stdout is the result line alone
RESULTS = {"cancel": "cancelled job 41 (running, current)", "export": "exported run run1 step 4", "submit": "# Dry run: nothing was created", "diagnose": "evidence:", "sweep": "# Dry run",
           "chaos": '"faults"', "config": "configs", "init": "next:"}


@pytest.mark.parametrize("command", list(exit_status.BY_COMMAND))
def test_verbose_adds_debug_lines(command, env, capsys):
    if command == "sweep":
        pytest.importorskip("optuna")
    argv = CASES[(command, OK)](env)
    assert invoke(command, argv + ["-v"]) == OK
    captured = capsys.readouterr()
    out = captured.out + (captured.err if command in CHATTER_ON_STDERR else "")
    assert "[debug hpc_agent] hpc_agent " in out, out
    assert logging.getLogger("hpc_agent").level == logging.DEBUG


@pytest.mark.parametrize("command", list(exit_status.BY_COMMAND))
def test_quiet_keeps_results_and_drops_chatter(command, env, capsys):
    if command == "sweep":
        pytest.importorskip("optuna")
    argv = CASES[(command, OK)](env)
    assert invoke(command, argv) == OK
    loud = capsys.readouterr().out
    if command in CHATTER:
        assert CHATTER[command] in loud
    for path in [env.root / "sweeps", env.tmp / "project", env.tmp / "ops", env.tmp / "data.yaml",
                 env.tmp / "export-out"]:
        _remove(path)  # the same command again, from the same state
    assert invoke(command, argv + ["-q"]) == OK
    quiet = capsys.readouterr().out
    assert logging.getLogger("hpc_agent").level == logging.WARNING
    assert "[debug" not in quiet and (command not in CHATTER or CHATTER[command] not in quiet), quiet
    if command in RESULTS:
        assert RESULTS[command] in loud and RESULTS[command] in quiet, (loud, quiet)
    if command in ("diagnose", "review", "config", "chaos"):  # nothing but results: -q prints the same
        assert quiet == loud


def test_quiet_and_verbose_exclude_each_other(capsys):
    assert invoke("review", ["-q", "-v", "."]) == USAGE
    assert "not allowed with argument" in capsys.readouterr().err


def _remove(path: Optional[Path]) -> None:
    import shutil

    if path is not None and path.is_dir():
        shutil.rmtree(path)
    elif path is not None and path.exists():
        path.unlink()


def test_quiet_and_verbose_under_python_m(tmp_path):
    """As users run it: under ``python -m`` the command module is ``__main__``, and its chatter still goes
    through the hpc_agent logger (the memory line and the executor line)."""
    from tests.conftest import run_cli

    argv = ["-m", "hpc_agent.submit", "quickstart", "--dry-run", "--executor", "slurm", f"run.runs_root={tmp_path}"]
    loud, quiet, verbose = run_cli(*argv), run_cli(*argv, "-q"), run_cli(*argv, "-v")
    assert loud.returncode == quiet.returncode == verbose.returncode == 0, loud.stderr + quiet.stderr
    assert "memory: CPU job" in loud.stdout and "memory: CPU job" not in quiet.stdout
    assert "# Dry run: nothing was created" in quiet.stdout
    assert "[debug hpc_agent] hpc_agent " in verbose.stdout and "memory: CPU job" in verbose.stdout

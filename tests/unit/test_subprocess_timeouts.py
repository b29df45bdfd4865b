"""Every subprocess has a timeout (issue 16, item 7), submitit's sbatch included.

1. A scan of hpc_agent/ and launch/: every ``subprocess.run/call/check_call/check_output`` passes
   ``timeout=``, nothing uses ``shell=True``, ``os.system`` or ``os.popen``, and every ``Popen`` (which has
   no timeout of its own) is a long-lived process listed below with who terminates it. A new call without
   a timeout fails here.
2. submitit runs sbatch with no timeout; ``TimedSlurmExecutor`` bounds it, on the single-job and the
   job-array path, and a timed-out sbatch leaves the ledger intent open (the job may exist).
"""
from __future__ import annotations

import ast
import inspect
import os
import time
from pathlib import Path
from typing import List, Tuple

import pytest

REPO = Path(__file__).resolve().parents[2]
BOUNDED = {"run", "call", "check_call", "check_output"}
POPEN_OWNED = {
    ("hpc_agent/review.py", "start_tensorboard"):
        "TensorBoard for review --serve: serve() terminates it in a finally (kill after 10 s)",
    ("hpc_agent/chaos/inject.py", "start"):
        "the chaos driver's watcher: killed (sigkill/stop) by the driver, which waits with a timeout",
    ("hpc_agent/watcher/notifier.py", "send_command"):
        "a notify command: communicate() with the notification's deadline, then its whole session is killed",
    ("hpc_agent/jobs/code_snapshot.py", "_run_bounded"):
        "git ls-files/rev-parse/diff for the code snapshot: a timer kills it after GIT_TIMEOUT_S, and it is "
        "killed as soon as its output passes the bound (so a huge diff is never read whole)",
    ("launch/command.py", "_run_child"):
        "the user's command under the local executor: it is the task itself, bounded by submitit's timeout, "
        "which signals the task, and the task forwards the signal to it",
}


def _calls() -> List[Tuple[str, str, int, ast.Call]]:
    """(file, enclosing function, line, call) for every call of a subprocess/os process function."""
    found = []
    for top in ("hpc_agent", "launch"):
        for path in sorted((REPO / top).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            tree = ast.parse(path.read_text(), filename=rel)
            imported = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                        and node.module == "subprocess" for a in node.names}
            for func in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))] + [tree]:
                for node in ast.walk(func):
                    if not isinstance(node, ast.Call):
                        continue
                    f = node.func
                    name = (f"{f.value.id}.{f.attr}" if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)
                            else f"subprocess.{f.id}" if isinstance(f, ast.Name) and f.id in imported else "")
                    if name.startswith(("subprocess.", "os.system", "os.popen", "asyncio.create_subprocess")):
                        found.append((rel, getattr(func, "name", "<module>"), node.lineno, node, name))
    # a call inside a function was also seen at module level (ast.walk of the tree): keep the innermost
    best = {}
    for rel, func, line, node, name in found:
        if (rel, line, name) not in best or best[(rel, line, name)][0] == "<module>":
            best[(rel, line, name)] = (func, node)
    return [(rel, func, line, node, name) for (rel, line, name), (func, node) in sorted(best.items())]


def test_the_scan_sees_the_known_calls():
    names = {(rel, name) for rel, _, _, _, name in _calls()}
    assert ("hpc_agent/slurm/cli.py", "subprocess.run") in names
    assert ("hpc_agent/review.py", "subprocess.Popen") in names
    print(f"scanned {len(names)} subprocess call sites")


def test_every_subprocess_call_has_a_timeout_and_no_shell():
    problems = []
    for rel, func, line, node, name in _calls():
        keywords = {k.arg: k.value for k in node.keywords}
        shell = keywords.get("shell")
        if isinstance(shell, ast.Constant) and shell.value is True or shell is not None and not isinstance(shell, ast.Constant):
            problems.append(f"{rel}:{line} {name} with shell=")
        kind = name.split(".", 1)[1]
        if name.startswith("os.") or name.startswith("asyncio."):
            problems.append(f"{rel}:{line} {name}: use subprocess with an argv list and a timeout")
        elif kind in BOUNDED and "timeout" not in keywords:
            problems.append(f"{rel}:{line} {name} without timeout=")
        elif kind == "Popen" and (rel, func) not in POPEN_OWNED:
            problems.append(f"{rel}:{line} Popen in {func}: no timeout; list it in POPEN_OWNED with who "
                            "terminates it, or use subprocess.run(..., timeout=)")
    assert problems == []


def test_the_popen_allowlist_has_no_stale_entries():
    owners = {(rel, func) for rel, func, _, _, name in _calls() if name == "subprocess.Popen"}
    assert set(POPEN_OWNED) == owners


# --- submitit's sbatch, bounded -----------------------------------------------------------------------------
@pytest.fixture
def fake_slurm_bin(tmp_path, monkeypatch):
    """``srun`` (submitit checks for it) and an ``sbatch`` whose behaviour the test writes."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    def sbatch(body: str) -> None:
        (bin_dir / "sbatch").write_text("#!/bin/sh\n" + body + "\n")
        for tool in ("srun", "sbatch"):
            os.chmod(bin_dir / tool, 0o755)
    return sbatch


def _executor(folder: Path, timeout_s: float):
    from hpc_agent.slurm.submitit_timeout import TimedSlurmExecutor

    ex = TimedSlurmExecutor(folder=folder)
    ex.sbatch_timeout_s = timeout_s
    ex.update_parameters(time=5)
    return ex


@pytest.mark.parametrize("jobs", [1, 3], ids=["single job", "job array"])
def test_a_hung_sbatch_times_out(tmp_path, fake_slurm_bin, jobs):
    from hpc_agent.slurm.submitit_timeout import SbatchTimedOut

    fake_slurm_bin("exec sleep 60")
    ex = _executor(tmp_path / "slurm", timeout_s=1.0)
    began = time.monotonic()
    with pytest.raises(SbatchTimedOut, match="did not answer within 1 s"):
        if jobs == 1:
            ex.submit(print, "x")
        else:
            with ex.batch():
                for i in range(jobs):
                    ex.submit(print, i)
    assert time.monotonic() - began < 20


def test_a_prompt_sbatch_still_submits_and_a_refusal_is_submitits_error(tmp_path, fake_slurm_bin):
    from submitit.core.utils import FailedJobError

    fake_slurm_bin('echo "Submitted batch job 4242"')
    job = _executor(tmp_path / "a", 5.0).submit(print, "x")
    assert job.job_id == "4242"
    fake_slurm_bin('echo "sbatch: error: invalid partition specified: nope" >&2; exit 1')
    with pytest.raises(FailedJobError, match="invalid partition"):
        _executor(tmp_path / "b", 5.0).submit(print, "x")


def test_the_timeout_leaves_the_watcher_time_to_settle_the_intent():
    from hpc_agent.slurm.cli import SBATCH_IN_FLIGHT_S
    from hpc_agent.slurm.submitit_timeout import SBATCH_TIMEOUT_S

    assert 0 < SBATCH_TIMEOUT_S < SBATCH_IN_FLIGHT_S


def test_a_timed_out_sbatch_leaves_the_intent_open(tmp_path, monkeypatch):
    from hpc_agent.jobs import submission
    from hpc_agent.config.load import build_config
    from hpc_agent.state.ledger import Ledger
    from hpc_agent.slurm.submitit_timeout import SbatchTimedOut

    class Hung:
        def submit(self, *_):
            raise SbatchTimedOut("sbatch did not answer within 60 s")

    monkeypatch.setattr(submission, "make_executor", lambda *a, **k: Hung())
    ledger = Ledger(tmp_path / "ledger.sqlite")
    run_dir = tmp_path / "r"
    ledger.add_run("r", "r", str(run_dir))
    cfg = build_config([{"run": {"name": "r"}}])
    with pytest.raises(SbatchTimedOut):
        submission.submit_attempt(ledger, "r", run_dir, cfg, run_dir / "config.yaml", "slurm", reason="submit")
    (sub,) = ledger.submissions("r")
    assert sub.job_id is None and sub.error is None, "a timed-out sbatch is not a refusal: the job may exist"


def test_the_copied_submitit_methods_still_match_submitit():
    """TimedSlurmExecutor copies two submitit 1.5 methods; if submitit changes them, look again."""
    from submitit.core import core
    from submitit.slurm import slurm

    assert "output = utils.CommandFunction(command_list, verbose=False)()" in inspect.getsource(
        core.PicklingExecutor._submit_command)
    assert "array_ex = SlurmExecutor(self.folder, self.max_num_timeout)" in inspect.getsource(
        slurm.SlurmExecutor._internal_process_submissions)


def test_launcher_and_sweep_use_the_bounded_executor():
    for rel in ("hpc_agent/jobs/executor.py", "hpc_agent/sweep/batch.py"):
        text = (REPO / rel).read_text()
        assert "TimedSlurmExecutor(" in text and "submitit.SlurmExecutor(" not in text, rel

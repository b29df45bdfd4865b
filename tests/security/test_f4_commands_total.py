"""Finding 4 of issue 42: tracebacks from job-written files in ``review``, ``status`` and ``diagnose``.

A job (or a group member) writes its run directory: a 100000-deep JSON line in events.jsonl or run.json
(``RecursionError``), a run.json whose ``run_id`` is an object (``sqlite3.ProgrammingError`` when it reached the
ledger query), events.jsonl records whose fields have the wrong types (``TypeError`` in the review's tables),
a ``tb/`` tree nested 1500 folders deep (``RecursionError`` in the event-file walk). Each command is run as a
user runs it (``python -m hpc_agent.<command>`` in a subprocess) over a runs root with two good runs and the
poisoned one: it exits 1, prints no traceback, names the poisoned run on stderr, and still lists the good runs.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_agent.config.load import build_config, write_run_config
from hpc_agent.state.ledger import Ledger
from tests.conftest import REPO

GOOD = ("good-a", "good-c")
BAD = "bad-b"
DEEP = 100_000
TB_DEPTH = 1500  # past Python's recursion limit (1000), short of PATH_MAX/2 (2048): the walk's own limit


def _nest(top: Path, depth: int) -> None:
    """``top/d/d/.../d`` ``depth`` deep, made with relative paths (the full path is longer than PATH_MAX allows)."""
    here = os.open(".", os.O_RDONLY)
    try:
        os.chdir(top)
        for _ in range(depth):
            os.mkdir("d")
            os.chdir("d")
    finally:
        os.fchdir(here)
        os.close(here)


def _unnest(top: Path) -> None:
    """Remove what :func:`_nest` made without recursing (shutil.rmtree recurses once per level)."""
    here = os.open(".", os.O_RDONLY)
    try:
        os.chdir(top)
        depth = 0
        while os.path.isdir("d"):
            os.chdir("d")
            depth += 1
        for _ in range(depth):
            os.chdir("..")
            os.rmdir("d")
    finally:
        os.fchdir(here)
        os.close(here)


def _poison(run_dir: Path, kind: str) -> None:
    if kind == "deep_events":
        (run_dir / "events.jsonl").write_text("[" * DEEP + "]" * DEEP + "\n")
    elif kind == "deep_run_json":
        (run_dir / "run.json").write_text("{\"a\":" * DEEP + "1" + "}" * DEEP)
    elif kind == "run_json_types":  # run_id reached the ledger's query: sqlite3.ProgrammingError
        (run_dir / "run.json").write_text(json.dumps({"run_id": {"x": 1}, "job_ids": 7, "submitted_at": [1]}))
    elif kind == "event_types":  # cause a dict: unhashable in the boundary labels (TypeError)
        (run_dir / "events.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (
            {"run_id": BAD, "job_id": {"x": 1}, "cause": {"a": 1}, "attempt": [1], "decision": {"action": [2]}},
            {"run_id": BAD, "cause": {"a": 1}, "attempt": 1},
            [1, 2, 3], "just a string", None)))
    elif kind == "deep_tb":
        _nest(run_dir / "tb", TB_DEPTH)
    else:
        raise AssertionError(kind)


POISONS = ("deep_events", "deep_run_json", "run_json_types", "event_types")
"""Each makes its run *bad* (exit 1). A ``tb/`` tree deeper than the read cap is not bad: it is walked down to
``tb_depth`` and the rest is named as a cap note (hpc_agent/core/read_caps.py), like 20k event files."""


@pytest.fixture
def root(tmp_path):
    root = tmp_path / "runs"
    ledger = Ledger.in_runs_root(root)
    for i, name in enumerate(sorted((*GOOD, BAD))):
        run_dir = root / name
        (run_dir / "tb").mkdir(parents=True)
        write_run_config(run_dir, build_config([{"train": {"max_steps": 100}}]))
        job = str(1000 + i)
        ledger.add_run(name, name, str(run_dir))
        ledger.record_submitted(ledger.record_intent(name, "slurm", str(run_dir / "config.yaml"), "submit"), job)
        ledger.set_phase(name, "running")
        (run_dir / "run.json").write_text(json.dumps({"run_id": name, "job_ids": [job]}))
        (run_dir / "events.jsonl").write_text(json.dumps(
            {"run_id": name, "seq": 1, "job_id": job, "attempt": 1, "cause": "preempted", "action": "expedite"}) + "\n")
    ledger.close()
    yield root
    _unnest(root / BAD / "tb")


def _command(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    env.pop("HPC_AGENT_RUNS", None)
    return subprocess.run([sys.executable, "-m", *argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("kind", POISONS)
def test_review_and_status_name_the_poisoned_run_and_list_the_others(root, kind):
    _poison(root / BAD, kind)
    review = _command("hpc_agent.review", str(root), "--json", cwd=root.parent)
    status = _command("hpc_agent.status", "--runs-root", str(root), "--json", cwd=root.parent)
    for proc in (review, status):
        assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-3000:]
        assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
        problem_lines = [line for line in proc.stderr.splitlines() if BAD in line]
        assert problem_lines, proc.stderr
        assert not any(name in proc.stderr for name in GOOD), proc.stderr  # the good runs have no problem
        shown = json.loads(proc.stdout)
        assert {r["run_id"] for r in shown["runs"]} >= set(GOOD)
        assert {Path(p["run_dir"]).name for p in shown["problems"]} == {BAD}
    good = {r["run_id"]: r for r in json.loads(review.stdout)["runs"]}
    assert all(good[name]["causes"] == ["preempted"] and good[name]["problems"] == [] for name in GOOD)


def test_a_clean_root_still_exits_0(root):
    for argv in (("hpc_agent.review", str(root)), ("hpc_agent.status", "--runs-root", str(root))):
        proc = _command(*argv, cwd=root.parent)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        assert all(name in proc.stdout for name in (*GOOD, BAD))


def test_a_tb_tree_past_the_depth_cap_is_named_as_a_cap_and_never_a_traceback(root):
    _poison(root / BAD, "deep_tb")
    review = _command("hpc_agent.review", str(root), "--json", cwd=root.parent)
    assert review.returncode == 0 and "Traceback" not in review.stderr + review.stdout, review.stderr[-3000:]
    shown = {r["run_id"]: r for r in json.loads(review.stdout)["runs"]}
    assert set(shown) == {*GOOD, BAD}
    assert any("tb_depth" in note for note in shown[BAD]["notes"]), shown[BAD]
    assert not any(shown[name]["notes"] for name in GOOD)
    table = _command("hpc_agent.review", str(root), cwd=root.parent)
    assert table.returncode == 0 and f"review: {BAD}: over the read cap tb_depth" in table.stderr, table.stderr


@pytest.mark.parametrize("kind", ("deep_tb", "fifo_log"))
def test_diagnose_names_the_poisoned_file_and_still_diagnoses(root, kind):
    """A FIFO log and a 100000-deep heartbeat are problems (exit 1); a tb/ tree past the depth cap is a note."""
    if kind == "deep_tb":
        _poison(root / BAD, kind)
    else:
        (root / BAD / "slurm").mkdir()
        os.mkfifo(root / BAD / "slurm" / "1001_0_log.out")  # a FIFO: a blocking read would hang diagnose forever
    (root / BAD / "slurm").mkdir(exist_ok=True)
    (root / BAD / "slurm" / "1001_1_log.out").write_text("[hpc_agent] step 3 loss 2.0\n")
    (root / BAD / "heartbeat").mkdir()
    (root / BAD / "heartbeat" / "rank-00000.json").write_text("[" * DEEP + "]" * DEEP)
    sacct = root.parent / "sacct.txt"
    sacct.write_text("JobID|JobName|State|ExitCode|NodeList|Start|End|Elapsed\n"
                     f"1001|hpc_agent:{BAD}|RUNNING|0:0|node1|2026-11-30T10:00:05|Unknown|00:01:07\n")
    proc = _command("hpc_agent.diagnose", "--sacct-file", str(sacct), "--runs-root", str(root), "--json",
                    cwd=root.parent)
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-3000:]
    assert proc.returncode == (1 if kind == "fifo_log" else 0), (proc.returncode, proc.stderr[-2000:])
    report = json.loads(proc.stdout)
    assert report["job_id"] == "1001" and report["cause"] == "running"
    if kind == "fifo_log":
        assert report["problems"] and all(line.startswith("diagnose: ") for line in proc.stderr.splitlines() if line)
    else:
        assert "over the read cap tb_depth" in proc.stdout and not report["problems"]
    assert "1001_1_log.out" in report["logs"]  # the readable log was read all the same

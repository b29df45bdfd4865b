"""Finding 2 of issue 42: one deeply nested JSON line in one run's events.jsonl killed `watch` for every run.

The journal's sequence scan (which lines of events.jsonl are already written) called ``json.loads`` on every
line and caught only ``ValueError``; ``[`` * 100000 raises ``RecursionError``, so the tick died with a
traceback, and every restart died the same way. Now every reader of a job-written JSON file goes through
``hpc_agent.core.json_safe`` (depth checked before ``json.loads`` runs): the line is skipped and said, the
run's audit is still written, and the other runs are followed, on this tick and after a restart.
"""
from __future__ import annotations

import json
import time

from hpc_agent.core import rundir
from hpc_agent.state.ledger import Ledger
from hpc_agent.watcher.loop import Watcher
from tests.helpers.running_runs import fake_world, running_run

DEEP = 100_000
POISON = "[" * DEEP + "]" * DEEP + "\n"


def _events(run_dir):
    lines = rundir.events_path(run_dir).read_text().splitlines()
    return [json.loads(line) for line in lines if not line.startswith("[[")]


def test_a_100000_deep_events_line_neither_stops_the_tick_nor_a_restart(tmp_path):
    root, ledger, slurm, watcher, out = fake_world(tmp_path)
    runs = {name: running_run(root, ledger, slurm, name) for name in ("a-good", "b-poisoned", "c-good")}
    poisoned_dir, _ = runs["b-poisoned"]
    rundir.events_path(poisoned_dir).write_text(POISON)  # the job (or a group member) planted it
    for _, job in runs.values():
        slurm.preempt(job)  # every run gets an expedite: an audit record, appended after the seq scan

    started = time.monotonic()
    report = watcher.tick()  # raised RecursionError before the fix
    took = time.monotonic() - started

    assert report.parked == []
    assert sorted(slurm.expedites) == sorted(job for _, job in runs.values())  # every run was followed
    for name, (run_dir, job) in runs.items():
        assert ledger.run(name).phase == "pending"
        assert [e["action"] for e in _events(run_dir) if e.get("job_id") == job][-1] == "expedite"
    said = [line for line in out if "b-poisoned" in line and "events.jsonl" in line]
    assert said and "nested deeper than" in said[0]  # the poisoned run is reported, by name
    assert not any("a-good" in line and "events.jsonl" in line for line in out)
    assert rundir.events_path(poisoned_dir).read_text().startswith(POISON)  # the file is not "repaired" by us
    assert took < 10, f"one tick over a 100000-deep line took {took:.1f}s"

    # a restart: a new watcher over the same ledger and the same poisoned file starts and ticks
    ledger.close()
    ledger = Ledger(root / "ledger.sqlite", clock=lambda: slurm.now)
    for _, job in runs.values():
        slurm.start(job)
        slurm.preempt(job)
    again = Watcher(ledger, slurm, runs_root=root, clock=lambda: slurm.now, out=out.append)
    report = again.tick()
    assert report.parked == []
    assert all(ledger.run(name).phase == "pending" for name in runs)
    ledger.close()


def test_the_journal_scan_reads_seqs_around_a_poisoned_line(tmp_path):
    """The scan itself: good lines on either side of deep ones still count (no line is written twice). The
    scan reads the file's last 256 KiB: 20000-deep lines keep both good lines inside it."""
    from hpc_agent.state.journal import _seqs_in

    run_dir = tmp_path / "r"
    run_dir.mkdir()
    good = [json.dumps({"run_id": "r", "seq": n}) + "\n" for n in (1, 2)]
    deep = 20_000
    rundir.events_path(run_dir).write_text(good[0] + "[" * deep + "]" * deep + "\n" + "{" * deep + "\n" + good[1])
    seqs, problems = _seqs_in(run_dir)
    assert seqs == {1, 2}
    assert len(problems) == 2 and all("nested deeper than" in p for p in problems)

"""Issue 19 part 2: the progress renderer (pure: a RunView in, lines out) and the plain printer's rule
(one line per change, a running job's step line throttled, never ANSI)."""
from __future__ import annotations

import pytest

from hpc_agent.runs.progress import parse_queue, positions
from hpc_agent.runs.progress_view import PlainPrinter, RunView, decision_line, eta_s, lines, make_printer, status_line

R = "run qs-1"


@pytest.mark.parametrize("view, expected", [
    (RunView(R, job_id="12", state="PENDING", reason="Resources", position=2, queued=3, partition="low"),
     "run qs-1: job 12 PENDING, reason Resources, position 2 of 3 in low"),
    (RunView(R, job_id="12", state="PENDING", reason="Priority"), "run qs-1: job 12 PENDING, reason Priority"),
    (RunView(R, phase="submitting"), "run qs-1: PENDING"),
    (RunView(R, job_id="12", state="PENDING", reason="None", position=1, queued=1, partition="low"),
     "run qs-1: job 12 PENDING, position 1 of 1 in low"),
    (RunView(R, job_id="12", state="RUNNING", job_phase="loading"), "run qs-1: job 12 RUNNING, loading"),
    (RunView(R, job_id="12", state="RUNNING"), "run qs-1: job 12 RUNNING, no step yet"),
    (RunView(R, job_id="12", state="RUNNING", step=120, max_steps=500, rate=20.0, job_phase="training"),
     "run qs-1: job 12 RUNNING, step 120 of 500 (24%), 20 steps/s, ETA 19 s"),
    (RunView(R, job_id="12", state="RUNNING", step=100, max_steps=10000, rate=2.5, job_phase="saving"),
     "run qs-1: job 12 RUNNING, step 100 of 10000 (1%), 2.5 steps/s, ETA 1 h 6 min (saving)"),
    (RunView(R, job_id="12", state="RUNNING", step=7), "run qs-1: job 12 RUNNING, step 7"),
    (RunView(R, job_id="12", state="FAILED", step=2, max_steps=1500, rate=150.0, job_phase="done"),
     "run qs-1: job 12 FAILED, step 2 of 1500 (0%)"),
    (RunView(R, job_id="12", state="RUNNING", step=1500, max_steps=1500, rate=40.0, job_phase="done"),
     "run qs-1: job 12 RUNNING, step 1500 of 1500 (100%)"),
    (RunView(R, job_id="13", state="FAILED", phase="stopped", final="FAILED"),
     "run qs-1: job 13 finished FAILED (run stopped)"),
    (RunView(R, job_id="12", state="COMPLETED", phase="completed", final="COMPLETED"),
     "run qs-1: job 12 finished COMPLETED (run completed)"),
])
def test_status_line(view, expected):
    assert status_line(view) == expected


def test_cause_and_decision_line():
    view = RunView(R, job_id="12", state="RUNNING", step=3, cause="preempted", decision="expedite")
    assert decision_line(view) == "run qs-1: last cause preempted, decision expedite"
    assert lines(view) == [status_line(view), decision_line(view)]
    assert decision_line(RunView(R)) == "" and lines(RunView(R, state="RUNNING")) == ["run qs-1: RUNNING, no step yet"]


def test_eta_needs_a_rate_and_a_total():
    assert eta_s(RunView(R, step=10, max_steps=110, rate=4.0)) == 25.0
    assert eta_s(RunView(R, step=10, max_steps=110)) is None and eta_s(RunView(R, step=10, rate=1.0)) is None
    assert eta_s(RunView(R, step=200, max_steps=100, rate=1.0)) == 0


def test_plain_printer_prints_changes_not_polls():
    said = []
    printer = PlainPrinter(said.append, every_s=10)
    pending = RunView(R, job_id="12", state="PENDING", reason="Resources", position=1, queued=1, partition="low")
    printer.update([pending], 0)
    printer.update([pending], 1)  # the same: nothing
    printer.update([RunView(R, job_id="12", state="PENDING", reason="Resources", position=1, queued=1,
                            partition="low", phase="pending")], 1.5)  # a change that does not show: nothing
    running = RunView(R, job_id="12", state="RUNNING", step=5, max_steps=100, rate=10.0)
    printer.update([running], 2)
    printer.update([RunView(R, job_id="12", state="RUNNING", step=50, max_steps=100, rate=10.0)], 5)  # < 10 s
    printer.update([RunView(R, job_id="12", state="RUNNING", step=90, max_steps=100, rate=10.0)], 13)
    printer.update([RunView(R, job_id="12", state="REQUEUED", step=90, max_steps=100, cause="preempted",
                            decision="expedite")], 14)
    printer.update([RunView(R, job_id="12", state="COMPLETED", phase="completed", final="COMPLETED",
                            cause="preempted", decision="expedite")], 15)
    assert said == [
        "run qs-1: job 12 PENDING, reason Resources, position 1 of 1 in low",
        "run qs-1: job 12 RUNNING, step 5 of 100 (5%), 10 steps/s, ETA 10 s",
        "run qs-1: job 12 RUNNING, step 90 of 100 (90%), 10 steps/s, ETA 1 s",
        "run qs-1: job 12 REQUEUED",
        "run qs-1: last cause preempted, decision expedite",
        "run qs-1: job 12 finished COMPLETED (run completed)",
    ]
    assert not any("\x1b" in line for line in said)


def test_not_a_tty_is_plain(capsys):
    import io

    stream = io.StringIO()
    printer = make_printer(stream)
    assert isinstance(printer, PlainPrinter)
    printer.update([RunView(R, job_id="1", state="PENDING", reason="Resources")], 0)
    text = stream.getvalue()
    assert text.endswith("run qs-1: job 1 PENDING, reason Resources\n") and "\x1b" not in text


def test_queue_position_by_priority_then_age():
    text = "\n".join(["30|PENDING|Priority|low|100", "31|PENDING|Resources|low|200", "29|PENDING|Priority|low|100",
                      "40|PENDING|Resources|high|5", "50_[0-3%2]|PENDING|JobArrayTaskLimit|low|100", "junk"])
    places = positions(parse_queue(text))
    assert places["31"] == (1, 4) and places["29"] == (2, 4) and places["30"] == (3, 4)
    assert places["50_[0-3%2]"] == (4, 4) and places["40"] == (1, 1)


class FakeSlurm:
    """squeue answers from a table; sacct for jobs that left the queue."""

    def __init__(self, queue: str, sacct: str = ""):
        self.queue, self.sacct_text, self.calls = queue, sacct, []

    def run(self, argv, check=True):
        from types import SimpleNamespace

        self.calls.append(argv)
        if "--states" in argv:  # the partition's pending jobs
            return SimpleNamespace(returncode=0, stdout=self.queue, stderr="")
        jobs = argv[argv.index("--jobs") + 1].split(",")
        rows = [line for line in self.queue.splitlines() if line.split("|")[0] in jobs]
        return SimpleNamespace(returncode=0, stdout="\n".join(rows), stderr="")

    def sacct(self, ids, **kw):
        self.calls.append(["sacct", *ids])
        return self.sacct_text


def _run(tmp_path, ledger, run_id, job_id):
    from hpc_agent.config.load import load_config, to_yaml

    run_dir = tmp_path / run_id
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(to_yaml(load_config("quickstart", ["train.max_steps=200"])))
    ledger.add_run(run_id, "qs", str(run_dir))
    ledger.record_submitted(ledger.record_intent(run_id, "slurm", str(run_dir / "config.yaml"), "submit"), job_id)
    return run_dir


def test_tracker_reads_queue_heartbeats_and_the_last_decision(tmp_path):
    import time as _time

    from hpc_agent.core import heartbeat_format, rundir
    from hpc_agent.state.ledger import Ledger
    from hpc_agent.runs.progress import Tracker

    ledger = Ledger.in_runs_root(tmp_path)
    _run(tmp_path, ledger, "a", "30")
    run_b = _run(tmp_path, ledger, "b", "31")
    now = _time.time()
    rundir.heartbeat_dir(run_b).mkdir()
    rundir.heartbeat_path(run_b, 0).write_bytes(heartbeat_format.encode(heartbeat_format.Beat(
        "31", 0, 0, 1, "n1", 9, "training", now - 5, 50, now - 0.1, 0, (0.1,) * 10, now - 20, now, 2.0)))
    from hpc_agent.state.journal import Journal

    Journal(ledger).add_audit("b", {"job_id": "31", "cause": "preempted", "action": "expedite", "reason": "r"})
    Journal(ledger).add_audit("b", {"job_id": "31", "action": "submit"})  # an action without a cause: skipped
    slurm = FakeSlurm("29|PENDING|Priority|low|200\n30|PENDING|Resources|low|100\n31|RUNNING|None|low|100")
    said = []
    views = Tracker(ledger, slurm, PlainPrinter(said.append)).show([("run a", "a"), ("run b", "b")])
    assert said == ["run a: job 30 PENDING, reason Resources, position 2 of 2 in low",
                    "run b: job 31 RUNNING, step 50 of 200 (25%), 10 steps/s, ETA 15 s",
                    "run b: last cause preempted, decision expedite"]
    assert views[1].rate == pytest.approx(10.0)
    assert not any(c[0] == "sacct" for c in slurm.calls)  # both jobs are queued: no accounting call


def test_tracker_asks_accounting_only_for_ended_jobs(tmp_path):
    from hpc_agent.state.ledger import Ledger
    from hpc_agent.runs.progress import Tracker

    ledger = Ledger.in_runs_root(tmp_path)
    _run(tmp_path, ledger, "a", "40")
    sacct = "JobID|JobName|State|ExitCode\n40|hpc_agent:a|FAILED|1:0\n"
    slurm = FakeSlurm("", sacct)
    (view,) = Tracker(ledger, slurm, PlainPrinter(lambda s: None)).views([("run a", "a")])
    assert view.state == "FAILED" and ["sacct", "40"] in slurm.calls


def test_final_state_is_the_runs_not_the_first_jobs():
    from hpc_agent.watcher.submit_wait import final_state

    assert final_state("completed", "COMPLETED") == "COMPLETED"
    assert final_state("stopped", "FAILED") == "FAILED"
    assert final_state("stopped", "COMPLETED") == "COMPLETED (run not completed)"
    assert final_state("needs_attention", "FAILED") == "FAILED (needs attention)"

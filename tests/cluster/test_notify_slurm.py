"""Issue 19 part 6, must-show: a webhook notification is received by a local HTTP server when a run gives
up, and a failing notifier is logged and survived.

One run fails with a code error (the watcher gives up on it: tests/cluster/test_watch_slurm.py) with a webhook to a
local server and a command notifier that exits 3. The server must get exactly one ``gave_up`` event naming
the run and the cause, the watcher log and the run's audit trail must show the command's failure, and the
watcher must go on: a second run, submitted afterwards, is followed to completion and announced.
"""
from __future__ import annotations

import time

import pytest

from tests.helpers.webhook import Receiver
from tests.slurm_helpers import LONG_RUN, WatcherProcess, events, run_phase, submit, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def _of(server: Receiver, run_id: str, event: str):
    return [b for b in server.received if b.get("run_id") == run_id and b.get("event") == event]


def test_webhook_gets_the_gave_up_event_and_a_failing_notifier_is_survived(root):
    with Receiver() as server:
        run_dir, job = submit(root, *LONG_RUN, "run.name=notify-bug", "train.max_steps=50", "faults.error_at_step=5",
                              f"notify.webhook_url={server.url}", "notify.command=[sh,-c,'exit 3']")
        watcher = WatcherProcess(root)
        try:
            wait_for(lambda: _of(server, run_dir.name, "gave_up"), 90, what="the gave_up webhook")
            assert run_phase(root, run_dir.name) == "stopped"
            # The watcher is still there, and still acts: a second run is followed to its end and announced.
            second, _ = submit(root, *LONG_RUN, "run.name=notify-ok", "train.max_steps=5",
                               f"notify.webhook_url={server.url}", "notify.events=[completed]")
            wait_for(lambda: _of(server, second.name, "completed"), 90, what="the second run's completed webhook")
            assert watcher.proc.poll() is None
            time.sleep(2)  # a few more ticks: nothing is sent twice
            (body,) = _of(server, run_dir.name, "gave_up")
            assert body["cause"] == "code_error" and body["job_id"] == job and run_dir.name in body["text"]
            assert [b["event"] for b in server.received if b["run_id"] == run_dir.name] == ["gave_up"]
            out = watcher.output()
            assert "notification gave_up (gave_up) FAILED" in out and "sh exited with status 3" in out, out
            assert "SECRET-TOKEN" not in out
            (note,) = [e for e in events(run_dir) if e.get("action") == "notification"]
            assert note["status"] == "failed" and note["results"]["webhook"].startswith("sent")
            assert note["results"]["command"].startswith("failed: sh exited with status 3")
        finally:
            watcher.stop()

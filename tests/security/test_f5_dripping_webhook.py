"""Issue 42, finding 5: the webhook timeout was per socket read, not per request. An endpoint that answers one
byte every 0.2 s never lets a read time out, so `timeout_s=1` held a tick for 18.5 s (and a dripping
endpoint that never ends held it forever).

Each notification now has one deadline on a monotonic clock for the whole exchange (connect, send, answer,
body); at the deadline the socket is shut down and the watcher goes on. The same for a notify command whose
grandchild keeps the output pipe open: the command's whole session is killed at the deadline."""
from __future__ import annotations

import itertools
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, List

import pytest

from hpc_agent.config.notify import NotifyConfig
from hpc_agent.watcher.notifier import NotifyFailed, deliver, send_command, send_webhook
from hpc_agent.watcher.notify_events import notifications_for
from tests.helpers.webhook import Receiver
from tests.unit.test_watcher import CODE_LOG, add_run, world  # noqa: F401 - the fake-Slurm watcher fixture

MARGIN_S = 1.0  # thread start-up and shutdown on a loaded 2-core CI machine
DRIP_S = 0.2


class Dripper:
    """An HTTP endpoint on 127.0.0.1 that drips one byte every 0.2 s forever: first the status line and
    headers of an answer that never ends (``dripping="head"``), or a 200 head and then an endless body
    (``dripping="body"``), or it reads the request body one byte at a time (``dripping="read"``)."""

    def __init__(self, dripping: str):
        self.dripping, self.stop, self.bytes_sent, self.requests = dripping, threading.Event(), 0, 0
        dripper = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                dripper.requests += 1
                if dripper.dripping == "read":
                    while not dripper.stop.is_set() and self.rfile.read(1):
                        time.sleep(DRIP_S)
                    return
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if dripper.dripping == "head":  # a header line that never ends
                    drips = itertools.chain(iter(b"HTTP/1.1 200 OK\r\nX-Drip: "), itertools.repeat(ord("x")))
                else:  # a sound head, then a body that never ends
                    self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000\r\n\r\n")
                    drips = itertools.repeat(ord("x"))
                for byte in drips:
                    if dripper.stop.is_set():
                        return
                    try:
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                    except OSError:  # the client hung up: what it should do at its deadline
                        return
                    dripper.bytes_sent += 1
                    time.sleep(DRIP_S)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/T0/SECRET-TOKEN"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "Dripper":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("dripping", ["head", "body", "read"])
def test_a_dripping_endpoint_fails_within_the_total_deadline(dripping):
    payload = {"text": "hpc_agent: gave up", "event": "gave_up"}
    if dripping == "read":  # a send longer than the socket buffers, read by the endpoint a byte at a time
        payload["pad"] = "p" * 2_000_000
    with Dripper(dripping) as drip:
        started = time.monotonic()
        with pytest.raises(NotifyFailed, match="within 1 s") as failed:
            send_webhook(drip.url, payload, 1.0)
        took = time.monotonic() - started
        assert drip.requests == 1
        if dripping != "read":  # the attack was live: bytes kept coming, each well within a read timeout
            assert drip.bytes_sent >= 3
    print(f"dripping {dripping}: send_webhook returned after {took:.2f} s (timeout_s=1)")
    assert took < 1.0 + MARGIN_S
    assert "SECRET" not in str(failed.value)


def test_a_sound_endpoint_still_gets_the_notification():
    with Receiver() as server:
        assert send_webhook(server.url, {"text": "t", "event": "completed"}, 2.0) == "sent (HTTP 200)"
    assert server.received == [{"text": "t", "event": "completed"}]


def test_a_command_whose_grandchild_holds_the_pipe_is_killed_at_the_deadline(tmp_path):
    marker = tmp_path / "grandchild.pid"
    script = ("import os, subprocess, sys, time\n"
              f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
              f"open({str(marker)!r}, 'w').write(str(p.pid))\n"
              "sys.exit(0)\n")  # the child exits at once; the grandchild keeps stdout/stderr open for 60 s
    started = time.monotonic()
    with pytest.raises(NotifyFailed, match="did not finish within 1 s"):
        send_command([sys.executable, "-c", script], {"event": "gave_up"}, 1.0)
    took = time.monotonic() - started
    print(f"notify command with a lingering grandchild: returned after {took:.2f} s (timeout_s=1)")
    assert took < 1.0 + MARGIN_S
    pid = int(marker.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # killed with its session (a zombie until init reaps it is gone too)
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().split(")")[-1].split()[0] == "Z":
                    break
        except FileNotFoundError:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the notify command's grandchild {pid} still runs")


def test_deliver_bounds_every_channel_and_never_raises():
    with Dripper("head") as drip:
        started = time.monotonic()
        note = notifications_for(1, "r", {"job_id": "7", "action": "needs_attention", "reason": "x"})[0]
        results = deliver(note, NotifyConfig(webhook_url=drip.url, timeout_s=1.0))
        took = time.monotonic() - started
    assert results["webhook"].startswith("failed") and "SECRET" not in results["webhook"]
    assert took < 1.0 + MARGIN_S


def test_a_watcher_tick_with_a_dripping_notify_target_finishes_in_bounded_time(world):  # noqa: F811
    """Two runs; one gives up (a code error), which notifies the dripping endpoint. The tick ends within the
    notification's deadline, the notification is recorded as failed, and the other run goes on."""
    _, bad = add_run(world, "bad", log=CODE_LOG)
    _, good = add_run(world, "good")
    watcher = world["watcher"]
    with Dripper("head") as drip:
        watcher.notifier.default = NotifyConfig(webhook_url=drip.url, timeout_s=1.0)
        world["slurm"].fail(bad, 1)
        took: List[float] = []
        for _ in range(3):  # decide, carry out, notify (whatever the order inside a tick)
            started = time.monotonic()
            watcher.tick()
            took.append(time.monotonic() - started)
        assert drip.requests >= 1
    print("ticks with a dripping notify target: " + ", ".join(f"{t:.2f} s" for t in took))
    assert max(took) < 1.0 + 2 * MARGIN_S
    assert world["ledger"].run("bad").phase == "stopped"
    assert world["ledger"].run("good").phase == "running"
    notes = [r for _, _, r in watcher.journal.audit_records("bad") if r.get("action") == "notification"]
    assert notes and notes[0]["status"] == "failed" and "SECRET" not in repr(notes)
    assert not any("SECRET" in line for line in world["out"])


def test_the_endpoint_port_is_really_dripping():
    """The fixture itself: a raw client sees bytes trickle in, so the tests above test a live attack."""
    with Dripper("head") as drip:
        port = int(drip.url.split(":")[2].split("/")[0])
        with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
            sock.sendall(b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n")
            got = b""
            started = time.monotonic()
            while time.monotonic() - started < 0.9:
                got += sock.recv(1)
        assert b"HTTP/1.1 200".startswith(got) and 3 <= len(got) <= 8  # a byte per 0.2 s

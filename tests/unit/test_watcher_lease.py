"""One watcher per runs root: a lease in the ledger with a heartbeat, taken over only when it expired.

The unit tests drive the lease with an injected clock; the last test runs two real ``python -m
hpc_agent.watch`` processes on one runs root (no Slurm job needed: the lease is taken before any tick).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpc_agent.state.journal import LeaseLost, WatcherLease
from hpc_agent.state.ledger import Ledger

REPO = Path(__file__).resolve().parents[2]


def _ledger(tmp_path, now):
    return Ledger(tmp_path / "ledger.sqlite", clock=lambda: now[0])


def test_second_holder_is_refused_while_the_first_renews_and_takes_over_once_it_expired(tmp_path):
    now = [1000.0]
    first = WatcherLease(_ledger(tmp_path, now), ttl_s=30, holder="a")
    second = WatcherLease(_ledger(tmp_path, now), ttl_s=30, holder="b")
    second.pid = first.pid = os.getpid()  # same live process: only expiry frees it
    assert first.acquire() is None
    now[0] += 20
    first.renew()
    now[0] += 20
    assert second.acquire()["holder"] == "a"  # renewed 20 s ago, TTL 30 s: still live
    now[0] += 11
    assert second.acquire() is None  # 31 s without a heartbeat: expired, taken over
    with pytest.raises(LeaseLost, match="taken over"):
        first.renew()  # the old holder finds out before it acts again
    with pytest.raises(LeaseLost):
        first.check()


def test_a_killed_holder_on_this_host_does_not_lock_the_root_for_a_ttl(tmp_path):
    now = [1000.0]
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    first = WatcherLease(_ledger(tmp_path, now), ttl_s=3600, holder="a")
    first.pid = dead.pid
    assert first.acquire() is None
    assert WatcherLease(_ledger(tmp_path, now), ttl_s=3600, holder="b").acquire() is None


def test_release_frees_it_at_once(tmp_path):
    now = [1000.0]
    first = WatcherLease(_ledger(tmp_path, now), ttl_s=3600, holder="a")
    assert first.acquire() is None
    first.release()
    assert WatcherLease(_ledger(tmp_path, now), ttl_s=3600, holder="b").acquire() is None


def _watch(root: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "hpc_agent.watch", "--runs-root", str(root), "--interval", "0.3",
                             "--lease-ttl", "3", *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)


def _wait_for_line(proc: subprocess.Popen, text: str, timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        seen.append(line)
        if text in line:
            return line
    raise AssertionError(f"{text!r} not seen; output: {''.join(seen)}")


def test_two_real_watchers_on_one_root(tmp_path):
    root = tmp_path / "runs"
    Ledger.in_runs_root(root).close()
    first = _watch(root)
    second = None
    try:
        _wait_for_line(first, "[watch] following")
        refused = subprocess.run([sys.executable, "-m", "hpc_agent.watch", "--runs-root", str(root), "--once"],
                                 capture_output=True, text=True, timeout=120,
                                 env={**os.environ, "PYTHONPATH": str(REPO)})
        assert refused.returncode == 4  # exit_status.BUSY
        assert "another watcher follows this runs root" in refused.stderr and f"pid {first.pid}" in refused.stderr
        assert "Traceback" not in refused.stderr
        os.kill(first.pid, signal.SIGSTOP)  # alive but silent: its heartbeat stops
        second = _watch(root, "--wait-for-lease")
        _wait_for_line(second, "waiting")
        started = time.monotonic()
        took = _wait_for_line(second, "[watch] took the lease over from")
        # the 3 s TTL ran out, then it took over (before it asks sinfo anything: slow while slurmctld is down)
        assert time.monotonic() - started <= 10 and f"pid {first.pid}" in took
        _wait_for_line(second, "[watch] following")
        os.kill(first.pid, signal.SIGCONT)
        out, _ = first.communicate(timeout=60)
        assert first.returncode == 4 and "taken over" in out  # the old one stops instead of acting twice
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=60) == 0
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
                proc.wait()

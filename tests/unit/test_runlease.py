"""The run-directory lease (hpc_agent/core/runlease.py): the rules as a table, the NFS-safe file handling,
concurrent takers, and the exit code / cause / policy wiring of a refusal."""
from __future__ import annotations

import errno
import json
import multiprocessing
import os
from pathlib import Path

import pytest

from hpc_agent.core.lease_rules import (REFUSE, TAKE, TAKEOVER, WAIT, Holder, LeaseWaitCancelled, RunDirBusy,
                                        job_identity, judge, me_from_env, settings_from_env, stale_after_s)
from hpc_agent.core.nfs_files import publish_exclusive
from hpc_agent.core.runlease import RunLease, move_aside_if, read_holder

NOW = 1_000_000.0


def holder(job="100", attempt=0, host="node1", pid=4242, age=0.0, token="t-other") -> Holder:
    return Holder(job_id=job, attempt=attempt, host=host, pid=pid, heartbeat=NOW - age, started=NOW - age - 50,
                  token=token)


ME = holder(job="200", attempt=0, host="node2", pid=777, token="t-me")

# (name, current lease, judge keyword arguments, expected action, words in the reason)
CASES = [
    ("no lease", None, {}, TAKE, "no lease"),
    ("our own lease", holder(job="200", token="t-me"), {}, TAKE, "ours"),
    ("same job, fresh: requeued attempt takes over", holder(job="200", attempt=0, age=1), {}, TAKEOVER,
     "earlier attempt of this job"),
    ("same job even while renewing", holder(job="200", age=0), {"renewal_seen": True}, TAKEOVER, "Slurm ended it"),
    ("other job, stale heartbeat", holder(age=61), {}, TAKEOVER, "stale: heartbeat 61 s old"),
    ("other job, stale even if renewal seen", holder(age=120), {"renewal_seen": True}, TAKEOVER, "stale"),
    ("other job, fresh, first look: watch", holder(age=5), {}, WAIT, "watching for a renewal"),
    ("other job, fresh, renewed while watched: refuse", holder(age=5), {"renewal_seen": True}, REFUSE,
     "held by live job 100"),
    ("other job, holder pid gone on this host", holder(age=5, host="node2"), {"holder_alive": False}, TAKEOVER,
     "no longer exists"),
    ("other job, holder alive on this host, renewed", holder(age=5, host="node2"),
     {"holder_alive": True, "renewal_seen": True}, REFUSE, "live"),
    ("other job, never renewed for a staleness period (clock skew)", holder(age=-30), {"watched_s": 60}, TAKEOVER,
     "no renewal in 60 s"),
    ("other job, watched a while, not yet long enough", holder(age=10), {"watched_s": 30}, WAIT, "watching"),
    ("unreadable lease file, fresh mtime: watch", holder(job="?", host="?", pid=0, age=2, token="unreadable:1"), {},
     WAIT, "watching"),
    ("unreadable lease file, old mtime", holder(job="?", host="?", pid=0, age=600, token="unreadable:1"), {},
     TAKEOVER, "stale"),
]


@pytest.mark.parametrize("name,current,kwargs,action,words", CASES, ids=[c[0] for c in CASES])
def test_judge_table(name, current, kwargs, action, words):
    verdict = judge(current, ME, NOW, 60.0, **kwargs)
    assert verdict.action == action, verdict
    assert words in verdict.reason


@pytest.mark.parametrize("heartbeat,override,expected", [(15, None, 60), (30, None, 90), (1, None, 60),
                                                         (15, 5, 5), (15, 0, 60)])
def test_staleness(heartbeat, override, expected):
    assert stale_after_s(heartbeat, override) == expected


def test_settings_from_env():
    assert settings_from_env({}) == (15.0, 60.0)
    assert settings_from_env({"HPC_AGENT_LEASE_HEARTBEAT_S": "40"}) == (40.0, 120.0)
    assert settings_from_env({"HPC_AGENT_LEASE_HEARTBEAT_S": "1", "HPC_AGENT_LEASE_STALE_S": "4"}) == (1.0, 4.0)
    assert settings_from_env({"HPC_AGENT_LEASE_HEARTBEAT_S": "x", "HPC_AGENT_LEASE_STALE_S": "-1"}) == (15.0, 60.0)


@pytest.mark.parametrize("env,expected", [
    ({}, (None, 0)),
    ({"SLURM_JOB_ID": "123"}, ("123", 0)),
    ({"SLURM_JOB_ID": "123", "SLURM_RESTART_COUNT": "2"}, ("123", 2)),
    ({"SLURM_JOB_ID": "180", "SLURM_ARRAY_JOB_ID": "177", "SLURM_ARRAY_TASK_ID": "3"}, ("177_3", 0)),
    ({"SLURM_JOB_ID": "9", "SLURM_RESTART_COUNT": "junk"}, ("9", 0)),
])
def test_job_identity(env, expected):
    assert job_identity(env) == expected


def test_me_from_env_outside_slurm_is_unique_per_process():
    me = me_from_env({}, now=5.0, host="h", pid=12)
    assert me.job_id == "local-h-12" and me.heartbeat == me.started == 5.0 and me.token
    assert me_from_env({"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "node9"}, pid=1).host == "node9"


def test_holder_json_round_trip_and_garbage():
    h = holder()
    assert Holder.from_json(h.to_json()) == h
    for bad in ("", "{", "[]", '{"job_id": 1}', '{"job_id": "1", "host": "h", "pid": "x", "heartbeat": 1, "token": "t"}'):
        assert Holder.from_json(bad) is None


# --- the file operations ------------------------------------------------------------------------------------
class Clock:
    def __init__(self, t=NOW):
        self.t = t

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


def lease_for(path, job, clock=None, **kw) -> RunLease:
    clock = clock or Clock()
    me = Holder(job_id=job, attempt=kw.pop("attempt", 0), host=kw.pop("host", "node-" + job), pid=kw.pop("pid", 1),
                heartbeat=clock(), started=clock(), token=f"tok-{job}-{os.urandom(4).hex()}")
    return RunLease(path, me, heartbeat_s=kw.pop("heartbeat_s", 15.0), stale_s=kw.pop("stale_s", None), clock=clock,
                    monotonic=clock, sleep=clock.sleep, **kw)


def test_fresh_take_renew_release(tmp_path):
    path = tmp_path / "run" / "train.lease"
    clock = Clock()
    lease = lease_for(path, "100", clock)
    assert lease.acquire().action == TAKE
    on_disk = json.loads(path.read_text())
    assert on_disk["job_id"] == "100" and on_disk["heartbeat"] == NOW and on_disk["token"] == lease.me.token
    assert set(on_disk) == {"job_id", "attempt", "host", "pid", "heartbeat", "started", "token"}
    clock.t += 15
    assert lease.renew() and read_holder(path).heartbeat == NOW + 15
    assert lease.release() and not path.exists()
    assert sorted(p.name for p in path.parent.iterdir()) == []  # no temp or aside files left
    assert not lease.renew() and not lease.release()


def test_stale_lease_of_another_job_is_taken_over(tmp_path):
    path = tmp_path / "train.lease"
    path.write_text(holder(job="100", age=300).to_json())
    lease = lease_for(path, "200")
    verdict = lease.acquire()
    assert verdict.action == TAKEOVER and "stale" in verdict.reason
    assert read_holder(path).token == lease.me.token
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.lease"]


def test_requeued_attempt_of_the_same_job_takes_over_a_fresh_lease(tmp_path):
    path = tmp_path / "train.lease"
    path.write_text(holder(job="200", attempt=0, age=1).to_json())
    lease = lease_for(path, "200", attempt=1)
    assert lease.acquire().action == TAKEOVER
    assert read_holder(path).attempt == 1


def test_different_live_job_is_refused_after_a_renewal(tmp_path):
    """The holder renews while we watch: refuse with a line naming it; the lease stays untouched."""
    path = tmp_path / "train.lease"
    other = holder(job="100", age=2, host="node1", pid=4242)
    path.write_text(other.to_json())
    clock = Clock()

    def renewing_sleep(s):  # the holder's heartbeat thread runs while we sleep
        clock.sleep(s)
        path.write_text(Holder(**{**other.__dict__, "heartbeat": clock()}).to_json())

    lease = lease_for(path, "200", clock, heartbeat_s=3.0)
    lease.sleep = renewing_sleep
    with pytest.raises(RunDirBusy) as info:
        lease.acquire()
    line = info.value.line
    for words in ("run directory busy:", str(path), "job 100", "node1", "pid 4242", "heartbeat", "scancel"):
        assert words in line, (words, line)
    assert clock() - NOW <= 3.0  # decided within one poll
    assert read_holder(path).job_id == "100"


def test_dead_holder_without_renewal_is_taken_over_after_one_staleness(tmp_path):
    """A fresh-looking lease that is never renewed (the holder died, or its clock runs ahead)."""
    path = tmp_path / "train.lease"
    path.write_text(holder(job="100", age=-3600).to_json())  # stamped an hour in the future
    clock = Clock()
    lease = lease_for(path, "200", clock, heartbeat_s=15.0)
    verdict = lease.acquire()
    assert verdict.action == TAKEOVER and "no renewal in 60 s" in verdict.reason
    assert 60 <= clock() - NOW <= 66


def test_local_holder_pid_gone_on_this_host_is_taken_over_at_once(tmp_path):
    path = tmp_path / "train.lease"
    path.write_text(holder(job="local-node-200-1", host="node-200", pid=999999, age=1).to_json())
    lease = lease_for(path, "200", pid_alive=lambda pid: False)
    verdict = lease.acquire()
    assert verdict.action == TAKEOVER and "no longer exists" in verdict.reason


def test_slurm_holder_pid_is_not_trusted(tmp_path):
    """A job's pid may be in a container's namespace: only its heartbeat says whether it lives."""
    path = tmp_path / "train.lease"
    path.write_text(holder(job="100", host="node-200", pid=999999, age=1).to_json())
    checked = []
    lease = lease_for(path, "200", pid_alive=lambda pid: checked.append(pid) or False)
    verdict = lease.acquire()
    assert verdict.action == TAKEOVER and "no longer exists" not in verdict.reason and checked == []


def test_wait_is_cancelled_by_a_signal(tmp_path):
    path = tmp_path / "train.lease"
    path.write_text(holder(job="100", age=1).to_json())
    lease = lease_for(path, "200")
    with pytest.raises(LeaseWaitCancelled):
        lease.acquire(cancelled=lambda: True)
    assert read_holder(path).job_id == "100"


def test_renew_notices_a_lost_lease(tmp_path):
    path = tmp_path / "train.lease"
    lease = lease_for(path, "100")
    lease.acquire()
    path.write_text(holder(job="300", token="thief").to_json())
    assert not lease.renew() and lease.lost_to.job_id == "300"
    assert not lease.release() and read_holder(path).job_id == "300"  # never removes someone else's lease


def test_heartbeat_thread_renews_and_release_stops_it(tmp_path):
    path = tmp_path / "train.lease"
    lease = RunLease(path, me_from_env({"SLURM_JOB_ID": "5"}), heartbeat_s=0.05, stale_s=60)
    lease.acquire()
    first = read_holder(path).heartbeat
    lease.start_heartbeat()
    import time

    deadline = time.time() + 5
    while read_holder(path).heartbeat == first and time.time() < deadline:
        time.sleep(0.02)
    assert read_holder(path).heartbeat > first
    assert lease.release() and not path.exists()
    assert not lease._thread.is_alive()


def test_unreadable_lease_file_is_judged_by_its_mtime(tmp_path):
    path = tmp_path / "train.lease"
    path.write_text("{half a lea")
    old = NOW - 1000
    os.utime(path, (old, old))
    seen = read_holder(path)
    assert seen.job_id == "?" and seen.heartbeat == old
    assert lease_for(path, "200").acquire().action == TAKEOVER


def test_symlinked_lease_is_not_followed(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text(holder(job="100").to_json())
    (tmp_path / "train.lease").symlink_to(target)
    assert read_holder(tmp_path / "train.lease").job_id == "?"


def test_publish_exclusive_is_exclusive_and_falls_back_without_hard_links(tmp_path):
    path = tmp_path / "train.lease"
    assert publish_exclusive(path, "a", "t1")
    assert not publish_exclusive(path, "b", "t2") and path.read_text() == "a"

    def no_links(src, dst):
        raise OSError(errno.EPERM, "hard links not supported")

    other = tmp_path / "x.lease"
    assert publish_exclusive(other, "c", "t3", link=no_links) and other.read_text() == "c"
    assert not publish_exclusive(other, "d", "t4", link=no_links) and other.read_text() == "c"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.lease", "x.lease"]


def test_publish_exclusive_trusts_the_link_count_when_nfs_loses_the_reply(tmp_path):
    path = tmp_path / "train.lease"

    def link_then_fail(src, dst):
        os.link(src, dst)
        raise OSError(errno.EIO, "reply lost (NFS retransmit)")

    assert publish_exclusive(path, "mine", "t1", link=link_then_fail) and path.read_text() == "mine"


def test_move_aside_only_moves_what_was_judged(tmp_path):
    path = tmp_path / "train.lease"
    judged = holder(job="100", age=300)
    path.write_text(holder(job="100", age=0).to_json())  # renewed since we judged it
    assert not move_aside_if(path, judged.observed(), "t") and read_holder(path).heartbeat == NOW
    path.write_text(judged.to_json())
    assert move_aside_if(path, judged.observed(), "t") and not path.exists()
    assert not move_aside_if(path, judged.observed(), "t")  # already gone: someone else won
    assert list(tmp_path.iterdir()) == []


def test_enolck_on_the_directory_lock_is_only_noted(tmp_path):
    """NFS without a lock daemon: flock raises ENOLCK; link/rename still decide, and the log says so."""
    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    logged = []
    path = tmp_path / "train.lease"
    lease = lease_for(path, "100", flock=no_locks, log=logged.append)
    assert lease.acquire().action == TAKE
    assert "ENOLCK" in lease.lock_note and any("ENOLCK" in line for line in logged)
    second = lease_for(path, "100", flock=no_locks, attempt=1)
    assert second.acquire().action == TAKEOVER  # the requeued attempt, still without flock


def test_other_flock_errors_are_not_swallowed(tmp_path):
    def broken(fd, op):
        raise OSError(errno.EIO, "I/O error")

    with pytest.raises(OSError):
        lease_for(tmp_path / "train.lease", "100", flock=broken).acquire()


# --- concurrent takers: exactly one wins ---------------------------------------------------------------------
def _contend(path: str, job: str, no_flock: bool, start, results) -> None:
    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")  # NFS without a lock daemon

    extra = {"flock": no_locks} if no_flock else {}  # then every taker relies on link/rename alone
    lease = RunLease(Path(path), me_from_env({"SLURM_JOB_ID": job}), heartbeat_s=0.2, stale_s=30, **extra)
    start.wait()
    try:
        lease.acquire()
        results.put((job, "won"))
        import time

        lease.start_heartbeat()
        time.sleep(3.0)  # hold it (renewing) while the others decide
        lease.release()
    except RunDirBusy as exc:
        results.put((job, "refused:" + exc.holder.job_id))


@pytest.mark.parametrize("no_flock", [False, True], ids=["flock", "ENOLCK-no-flock"])
def test_concurrent_takers_only_one_wins(tmp_path, no_flock):
    ctx = multiprocessing.get_context("fork")
    path = tmp_path / "train.lease"
    start, results = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_contend, args=(str(path), str(1000 + i), no_flock, start, results))
             for i in range(6)]
    for p in procs:
        p.start()
    start.set()
    outcomes = dict(results.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    winners = [job for job, what in outcomes.items() if what == "won"]
    assert len(winners) == 1, outcomes
    assert all(what == f"refused:{winners[0]}" for job, what in outcomes.items() if job != winners[0]), outcomes
    assert not path.exists()  # the winner released it


# --- exit code, cause, policy --------------------------------------------------------------------------------
def test_refusal_is_exit_73_cause_run_dir_busy_and_the_watcher_stops():
    from hpc_agent.config.schema import Config
    from hpc_agent.core.causes import ADVICE, SUMMARY, Cause
    from hpc_agent.core.exit_codes import EXIT_CODES, EXIT_RUN_DIR_BUSY, NAMES, announced_exit_code
    from hpc_agent.diagnosis.logscan import scan_logs
    from hpc_agent.policy.decide import STOP, decide
    from hpc_agent.core.rundir import LogText

    assert EXIT_RUN_DIR_BUSY == 73
    assert NAMES[73] == "run_dir_busy"
    assert EXIT_CODES[73].cause == Cause.RUN_DIR_BUSY == "run_dir_busy" and not EXIT_CODES[73].placeholder
    assert "run_dir_busy" in SUMMARY and "run_dir_busy" in ADVICE
    decision = decide("run_dir_busy", [], Config())
    assert decision.action == STOP and "run directory busy" in decision.reason
    line = ("[hpc_agent] run directory busy: /r/train.lease is held by job 100 (attempt 0) on node1 pid 4, "
            "heartbeat 2 s ago (renewed while this attempt watched for 3 s), ...; exiting 73")
    assert announced_exit_code([line]) == (73, line)
    findings = scan_logs([LogText("9_0_log.out", "[rank 0/1] host=node2 job=9\n" + line + "\n")])
    assert [f.cause for f in findings if f.cause == Cause.RUN_DIR_BUSY]

"""Issue 19 part 5: the embedded watcher's lease logic with a fake lease, clock and watcher: it takes a
free lease and ticks, observes a live holder, takes over when the holder dies, steps back when its lease
is taken over, and gives the lease back at the end."""
from __future__ import annotations

from hpc_agent.state.journal import LeaseLost
from hpc_agent.watcher.embedded import OBSERVE, OWN, EmbeddedWatch


class FakeLedger:
    def __init__(self, clock):
        self.clock = clock
        self.closed = False

    def close(self):
        self.closed = True


class FakeLease:
    """The lease row: ``holder`` None means free (no row, expired, or a dead holder's)."""

    def __init__(self, ledger):
        self.ledger, self.holder, self.released = ledger, None, 0

    def acquire(self):
        if self.holder is None or self.holder["holder"] == "me":
            self.holder = {"holder": "me", "host": "here", "pid": 1, "heartbeat": self.ledger.clock(), "ttl": 60}
            return None
        return self.holder

    def release(self):
        if self.holder and self.holder["holder"] == "me":
            self.holder = None
            self.released += 1


class FakeWatcher:
    def __init__(self, lease):
        self.lease, self.ticks, self.reconciled = lease, 0, 0

    def paused(self):
        return False

    def reconcile(self):
        self.reconciled += 1

    def tick(self):
        if self.lease.holder is None or self.lease.holder["holder"] != "me":
            raise LeaseLost("taken over")
        self.ticks += 1


def make(other=None):
    now = [0.0]
    clock = lambda: now[0]  # noqa: E731
    ledger = FakeLedger(clock)
    lease = FakeLease(ledger)
    lease.holder = other
    said, made = [], []

    def make_watcher(ledger, slurm, lease):
        made.append(FakeWatcher(lease))
        return made[-1]

    ew = EmbeddedWatch("/runs", slurm=object(), interval_s=2.0, clock=clock, out=said.append, ledger=ledger,
                       make_lease=lambda ledger: lease, make_watcher=make_watcher)
    return ew, lease, now, said, made


def test_no_watcher_takes_the_lease_ticks_and_releases_it():
    ew, lease, now, said, made = make()
    assert ew.step() == OWN and made[0].reconciled == 1 and made[0].ticks == 1
    assert "no watcher holds /runs" in said[0]
    now[0] = 1.0
    ew.step()  # not due yet: nothing
    assert made[0].ticks == 1
    now[0] = 2.0
    ew.step()
    assert made[0].ticks == 2 and len(made) == 1 and len(said) == 1
    ew.close()
    assert lease.released == 1 and lease.holder is None and ew.role == ""


def test_a_live_watcher_is_observed_then_taken_over_when_it_dies():
    other = {"holder": "them", "host": "login1", "pid": 42, "heartbeat": 0.0, "ttl": 60}
    ew, lease, now, said, made = make(other)
    assert ew.step() == OBSERVE and not made
    assert "login1 pid 42" in said[0] and "using its decisions" in said[0]
    now[0] = 2.0
    assert ew.step() == OBSERVE and len(said) == 1  # said once, not every poll
    lease.holder = None  # its lease expired, or its pid is gone
    now[0] = 4.0
    assert ew.step() == OWN and made[0].ticks == 1 and made[0].reconciled == 1
    assert "the watcher is gone" in said[-1]
    ew.close()
    assert lease.released == 1


def test_a_lost_lease_steps_back_to_observing():
    ew, lease, now, said, made = make()
    ew.step()
    lease.holder = {"holder": "them", "host": "login2", "pid": 7, "heartbeat": 0.0, "ttl": 60}
    now[0] = 2.0
    assert ew.step() == OBSERVE  # the tick raised LeaseLost: no crash, no second actor
    assert any("observing the new holder" in line for line in said)
    now[0] = 4.0
    assert ew.step() == OBSERVE and "login2 pid 7" in said[-1]
    ew.close()
    assert lease.released == 0 and lease.holder["holder"] == "them"  # never releases someone else's lease


def test_real_lease_two_embedded_watchers_one_acts(tmp_path):
    """The real WatcherLease on a real ledger: the second command observes the first, then takes over."""
    from hpc_agent.state.ledger import Ledger

    class W:
        def __init__(self):
            self.ticks = 0

        def paused(self):
            return False

        def reconcile(self):
            pass

        def tick(self):
            self.ticks += 1

    first = EmbeddedWatch(tmp_path, slurm=object(), out=lambda s: None, make_watcher=lambda *a: W())
    second = EmbeddedWatch(tmp_path, slurm=object(), out=lambda s: None, make_watcher=lambda *a: W())
    Ledger.in_runs_root(tmp_path).close()
    assert first.step(force=True) == OWN
    assert second.step(force=True) == OBSERVE
    first.close()
    assert second.step(force=True) == OWN
    second.close()


def test_submit_wait_ends_on_the_watchers_verdict_not_on_the_first_job(tmp_path, monkeypatch):
    """wait_run follows the run to the watcher's verdict: the failed first job was resubmitted, the wait
    follows the new job, and the final state is the run's (its newest job's), with the progress lines."""
    import io

    from hpc_agent.watcher import submit_wait
    from hpc_agent.state.ledger import Ledger
    from tests.unit.test_progress_view import FakeSlurm, _run

    ledger = Ledger.in_runs_root(tmp_path)
    _run(tmp_path, ledger, "r", "50")
    steps = []

    class Embedded:  # stands in for the watcher: decides on its 2nd and 3rd turns
        def __init__(self, *a, **kw):
            pass

        def step(self):
            steps.append(1)
            if len(steps) == 2:
                from hpc_agent.state.journal import Journal

                Journal(ledger).add_audit("r", {"job_id": "50", "cause": "host_oom", "decision": {"action": "resubmit"}})
                ledger.record_submitted(ledger.record_intent("r", "slurm", "c", "resubmit"), "51")
            if len(steps) == 3:
                ledger.set_phase("r", "stopped")

        def close(self):
            pass

    monkeypatch.setattr(submit_wait, "EmbeddedWatch", Embedded)
    sacct = "JobID|JobName|State|ExitCode\n50|x|OUT_OF_MEMORY|0:125\n51|x|FAILED|1:0\n"
    stream = io.StringIO()
    state, job, phase = submit_wait.wait_run(tmp_path, "r", 60, slurm=FakeSlurm("", sacct), poll_s=0.01,
                                             stream=stream)
    assert (state, job, phase) == ("FAILED", "51", "stopped")
    text = stream.getvalue()
    assert "run r: job 50 OUT_OF_MEMORY" in text and "last cause host_oom, decision resubmit" in text
    assert text.rstrip().endswith("run r: job 51 finished FAILED (run stopped)")


def test_lease_holder_names_a_live_watcher_only(tmp_path):
    """chaos's rule: use the watcher that holds the runs root, else start one."""
    from hpc_agent.watcher.embedded import lease_holder
    from hpc_agent.state.journal import WatcherLease
    from hpc_agent.state.ledger import Ledger

    assert lease_holder(tmp_path) is None  # no ledger yet
    ledger = Ledger.in_runs_root(tmp_path)
    assert lease_holder(tmp_path) is None  # no lease
    lease = WatcherLease(ledger, ttl_s=60)
    assert lease.acquire() is None
    held = lease_holder(tmp_path)
    assert held is not None and held["holder"] == lease.holder
    lease.release()
    assert lease_holder(tmp_path) is None
    ledger.close()

"""A watcher inside a command that waits on runs: ``submit --wait``, ``sweep`` (and ``chaos``'s rule).

Such a command must never wait on a watcher that is not there (issue 19: a sweep whose trials failed
in 4 s waited 10 min on "the watcher's decision" and then reported them RUNNING). So it calls
:meth:`EmbeddedWatch.step` from its own wait loop:

* no watcher holds the runs root's lease (``journal.WatcherLease``): take it and run watcher ticks right
  there, the same :class:`hpc_agent.watcher.loop.Watcher` as ``python -m hpc_agent.watch``, same ledger, same
  lease; released when the command ends (:meth:`close`);
* a live watcher holds it (``hpc_agent.watch`` in another shell, a systemd unit, another ``--wait``): only
  observe; its decisions reach the ledger, where the command reads them;
* the holder dies (its lease expires, or its pid is gone on this host): the next step takes over.

Interleaved in the caller's loop rather than a thread: one SQLite connection used by one thread, a crash
of the command is a crash of the watcher (its pid is gone, so the lease frees at once), and nothing runs
after the command returns. The lease is renewed on every tick, so the caller must step at least every
third of ``lease_ttl_s``; the callers poll every few seconds.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

from hpc_agent.state.journal import LeaseLost

OWN, OBSERVE = "own", "observe"


def describe_holder(holder: dict, now: float) -> str:
    return f"{holder.get('host')} pid {holder.get('pid')} (heartbeat {max(0.0, now - holder['heartbeat']):.0f} s ago)"


class EmbeddedWatch:
    """Take the lease and tick, or observe the holder; see the module docstring. ``make_lease(ledger)`` and
    ``make_watcher(ledger, slurm, lease)`` are injectable (tests: a fake lease and clock)."""

    def __init__(self, runs_root: Path, *, slurm=None, interval_s: float = 2.0, lease_ttl_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic, out: Callable[[str], None] = print,
                 ledger=None, make_lease: Optional[Callable[[Any], Any]] = None,
                 make_watcher: Optional[Callable[[Any, Any, Any], Any]] = None, node_memory: bool = True):
        self.runs_root, self.interval_s, self.clock, self.out = Path(runs_root), interval_s, clock, out
        self.node_memory = node_memory  # ask sinfo for the largest node's memory (False: a wait on a local run)
        self.lease_ttl_s = lease_ttl_s
        self._ledger, self._own_ledger = ledger, ledger is None
        self.slurm = slurm
        self._make_lease = make_lease or self._default_lease
        self._make_watcher = make_watcher or self._default_watcher
        self.role = ""            # "", OWN or OBSERVE
        self.lease = None
        self.watcher = None
        self.paused = False       # the last tick found the kill switch on: nobody acts
        self.ticks = 0
        self._next = float("-inf")
        self._holder = None       # the holder last announced, to say each change once

    # --- the defaults: the real lease and watcher -----------------------------------------------------------
    def _default_lease(self, ledger):
        from hpc_agent.state.journal import WatcherLease

        return WatcherLease(ledger, ttl_s=self.lease_ttl_s)

    def _default_watcher(self, ledger, slurm, lease):
        from hpc_agent.state import killswitch
        from hpc_agent.policy.decide import PolicyLimits
        from hpc_agent.slurm.cli import SlurmError
        from hpc_agent.slurm.sinfo import max_node_memory_mb, node_memory_argv
        from hpc_agent.watcher.loop import Watcher

        max_mem = None
        try:  # as `watch` does: a memory repair never asks for more than the largest node has
            if self.node_memory:  # (not for a wait on a local run: it runs no Slurm command)
                max_mem = max_node_memory_mb(slurm.run(node_memory_argv(), check=False).stdout)
        except SlurmError:
            pass
        from hpc_agent.watcher import notifier
        from hpc_agent.config.problems import ConfigError

        try:  # the runs-root notifier default, as `watch` takes it without flags; each run's notify: wins
            default = notifier.default_from_env()
        except ConfigError as exc:
            print(f"[embedded watch] notifier variables ignored: {exc}", file=sys.stderr, flush=True)
            default = None
        return Watcher(ledger, slurm, runs_root=self.runs_root, out=self.out,
                       pause_file=killswitch.pause_path(self.runs_root), lease=lease,
                       limits=PolicyLimits(max_mem_mb=max_mem), notify=default)

    @property
    def ledger(self):
        if self._ledger is None:
            from hpc_agent.state.ledger import Ledger

            self._ledger = Ledger.in_runs_root(self.runs_root)
        return self._ledger

    # --- the loop -------------------------------------------------------------------------------------------
    def step(self, force: bool = False) -> str:
        """One turn, at most every ``interval_s`` (else nothing): take the lease or observe, and tick when it
        is ours. Returns the role. Never raises for a lost lease: it observes again."""
        now = self.clock()
        if not force and now < self._next:
            return self.role
        self._next = now + self.interval_s
        if self.lease is None:
            self.lease = self._make_lease(self.ledger)
        if self.role != OWN and not self._take():
            return self.role
        try:
            report = self.watcher.tick()
            self.ticks += 1
            self.paused = bool(getattr(report, "paused", False))
        except LeaseLost as exc:  # stopped longer than the TTL and taken over: the new holder acts, we observe
            self.out(f"[embedded watch] {exc}; observing the new holder")
            self.role, self.watcher = OBSERVE, None
        return self.role

    def _take(self) -> bool:
        holder = self.lease.acquire()
        if holder is None:
            if self.watcher is None:
                if self.slurm is None:
                    from hpc_agent.slurm.cli import SlurmCLI

                    self.slurm = SlurmCLI(timeout_s=60)
                self.watcher = self._make_watcher(self.ledger, self.slurm, self.lease)
            was = self.role
            self.role = OWN
            self.out(f"[embedded watch] {'the watcher is gone; ' if was == OBSERVE else ''}no watcher holds "
                     f"{self.runs_root}: this process follows and repairs its runs until it ends")
            if not self.watcher.paused():
                self.watcher.reconcile()  # what a killed holder left half-done, as `watch` does at start-up
            return True
        if self.role != OBSERVE or (self._holder or {}).get("holder") != holder.get("holder"):
            self.out(f"[embedded watch] the watcher {describe_holder(holder, self.lease.ledger.clock())} follows "
                     f"{self.runs_root}: using its decisions")
        self.role, self._holder = OBSERVE, holder
        return False

    def close(self) -> None:
        """Give the lease back (a running ``watch --wait-for-lease`` takes over at once) and close the ledger."""
        try:
            if self.role == OWN and self.lease is not None:
                try:
                    self.lease.release()
                except Exception:  # noqa: BLE001 - closing must not hide the command's result; the TTL frees it
                    pass
        finally:
            self.role = ""
            if self._own_ledger and self._ledger is not None:
                self._ledger.close()
                self._ledger = None

    def __enter__(self) -> "EmbeddedWatch":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def lease_holder(runs_root: Path) -> Optional[dict]:
    """The live watcher holding the runs root's lease, or None (no ledger yet, no lease, or an expired or
    dead holder's). Reads only."""
    from hpc_agent.state.journal import WatcherLease
    from hpc_agent.state.ledger import LEDGER_FILE, Ledger

    if not (Path(runs_root) / LEDGER_FILE).exists():
        return None
    ledger = Ledger.in_runs_root(Path(runs_root))
    try:
        probe = WatcherLease(ledger, holder="probe")
        current = probe.current()
        return None if probe._free(current, ledger.clock()) else current
    finally:
        ledger.close()

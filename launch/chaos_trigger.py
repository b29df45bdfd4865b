"""Faults injected into a *running* job by a file: the chaos driver's hook (``faults.runtime_trigger``).

Off by default. When ``faults.runtime_trigger`` is true every rank ``stat``s
``<run_dir>/chaos/inject.json`` before an optimizer step, at most every ``POLL_S`` (one syscall; the file
is read only when its mtime or size changed). Once a step, that ``stat`` cost ~40 us of the loop's time
between steps on the P2 model, time the injector took from the run it measures; a fault now fires up to
``POLL_S`` later, which no chaos schedule (a fault every few minutes) notices. The file holds one fault::

    {"kind": "nan" | "gpu_oom" | "host_oom" | "kill_during_save", "nonce": "<unique>", "mb": 1500, "stall_s": 600}

Each nonce fires once per rank, ever: before acting, the rank writes ``chaos/fired/<nonce>.rank<R>``,
so a resumed attempt that finds the same file does not fire it again (unlike ``cfg.faults``, which are
tied to a step and replay when a resume goes back before it).

- ``nan``: the loss of the next micro-step is NaN: an in-job rollback, or with no in-job retries left the job
  exits 65 (``EXIT_DIVERGED``).
- ``gpu_oom``: a CUDA-style ``torch.OutOfMemoryError`` from the next forward: an in-job repair takes the OOM
  ladder's next rung, or, with no in-job retries left (``resilience.in_job_retries``), the job exits 3
  (``EXIT_OUT_OF_MEMORY``).
- ``host_oom``: rank 0 allocates and touches ``mb`` MB of host memory on a thread of its own, like a leak beside
  the training loop (a data worker, a cache): training goes on until the cgroup's OOM killer ends the process.
- ``kill_during_save``: at the next checkpoint save, rank 0 stops after every rank's shards are on
  disk and *before* ``COMPLETE.json`` is written, writes ``chaos/in_save.json`` and sleeps
  ``stall_s`` seconds. The driver then preempts the job: Slurm's SIGKILL at the end of the grace time
  lands inside the save, leaving a torn checkpoint that the resume must skip.

With several ranks each rank acts when it first sees the file, which can be a step apart; the
chaos runs use one rank per job.

**Persistent faults** (``"persistent": true``; the benchmarks' rule that faults behave as in reality,
docs/benchmarks.md). When such a fault first fires, rank 0 records what caused it in
``chaos/conditions/<nonce>.json`` (:func:`condition_for`), and every later step of every attempt of the run checks
the recorded conditions (:func:`recurs`, pure), so the fault comes back whenever its cause is still there:

- ``gpu_oom``: at any micro-batch at or above the one it happened at;
- ``nan``: at the same step with a learning rate at or above the one it had (the data order is a function of the
  step, so the same checkpoint, LR and data order give the same divergence);
- ``host_oom``: ``mb`` more than the job's memory: at an attempt's first step, whenever the job's ``--mem``
  (``SLURM_MEM_PER_NODE``) is at most the one it happened at;
- ``hang``: at the same step on the same node (``SLURMD_NODENAME``): a hang that nothing changed recurs;
- ``node_fail``: a bad node (its GPU fell off the bus, Xid 79) stays bad: every attempt on it ends at its next step
  with the Xid line and exit 1, until the node is excluded.

Two more kinds exist for these: ``hang`` (the rank stops making progress: signals are recorded, never acted on)
and ``node_fail``; without ``persistent`` they fire once, like the others.
"""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from hpc_agent.core.fsutil import atomic_write_json

KINDS = ("nan", "gpu_oom", "host_oom", "kill_during_save", "hang", "node_fail")
PERSISTENT_KINDS = ("nan", "gpu_oom", "host_oom", "hang", "node_fail")
CONDITIONS_DIR = "conditions"
RECURRED_FILE = "recurred.jsonl"
MAX_CONDITIONS = 64  # conditions read per attempt (the run's own chaos folder; a chaos run records a handful)
XID_LINE = ("NVRM: Xid (PCI:0000:3b:00): 79, pid={pid}, name=python, GPU has fallen off the bus. "
            "(injected: node {node} is bad)")
POLL_S = 0.25  # the trigger file is looked at, at most, this often
TRIGGER_FILE = "inject.json"
IN_SAVE_FILE = "in_save.json"
_HELD: List[Any] = []  # keeps the injected host allocation alive until the process dies


def _leak(mb: int) -> None:
    """Allocate and touch ``mb`` MB and keep it. torch's fill releases the GIL, so the training thread is not held
    while the kernel hands out the pages: near the cgroup's limit this VM hands them out at ~100 MB/s, and the
    earlier ``bytearray`` on the training thread (whose zeroing holds the GIL) stalled training 1.4-9.4 s before
    the kill, a stall a leak beside the loop does not cause."""
    import torch

    block = torch.empty(mb * 2**20, dtype=torch.uint8)
    block.fill_(1)  # every page written, so it is really resident
    _HELD.append(block)


def chaos_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "chaos"


def _safe_name(nonce: str) -> str:
    return "".join(ch for ch in nonce if ch.isalnum() or ch in "-_.")[:80] or "empty"


def node_name() -> str:
    """The Slurm node this process runs on (every node of the localhost cluster shares one hostname)."""
    import socket

    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def mem_limit_mb() -> Optional[int]:
    """The job's ``--mem`` in MB as Slurm exports it, or None outside a job (or with --mem-per-cpu)."""
    try:
        return int(os.environ["SLURM_MEM_PER_NODE"])
    except (KeyError, ValueError):
        return None


def condition_for(kind: str, nonce: str, step: int, micro_batch: int, lr: float, node: str,
                  mem_mb: Optional[int], mb: int = 0) -> Dict[str, Any]:
    """What a persistent fault records when it first fires: the cause :func:`recurs` looks for. Pure."""
    cond: Dict[str, Any] = {"kind": kind, "nonce": nonce, "first_step": step}
    if kind == "gpu_oom":
        cond["micro_batch_at_least"] = micro_batch
    elif kind == "nan":
        cond.update(step=step, lr_at_least=lr)
    elif kind == "host_oom":
        cond.update(mem_at_most_mb=mem_mb, mb=mb)
    elif kind == "hang":
        cond.update(step=step, node=node)
    elif kind == "node_fail":
        cond["node"] = node
    return cond


def recurs(cond: Dict[str, Any], step: int, micro_batch: int, lr: float, node: str, mem_mb: Optional[int],
           first_step: bool) -> bool:
    """Whether a recorded condition fires at this step of this attempt. Pure; a malformed condition never fires.

    ``first_step``: the first step this process trains (a host OOM's leak starts there, once per process)."""
    try:
        kind = cond.get("kind")
        if kind == "gpu_oom":
            return micro_batch >= int(cond["micro_batch_at_least"])
        if kind == "nan":  # the LR as the step had it; a lowered LR (a repair) no longer diverges there
            return step == int(cond["step"]) and lr >= float(cond["lr_at_least"]) * (1 - 1e-6)
        if kind == "host_oom":
            limit = cond.get("mem_at_most_mb")
            return first_step and (limit is None or mem_mb is None or mem_mb <= int(limit))
        if kind == "hang":
            return step == int(cond["step"]) and node == cond.get("node")
        if kind == "node_fail":
            return node == cond.get("node")
    except (KeyError, TypeError, ValueError):
        return False
    return False


def read_conditions(folder: Path) -> List[Dict[str, Any]]:
    """The run's recorded conditions (``rundir.read_bounded``: regular files only, no link followed, 4 KiB each), at
    most ``MAX_CONDITIONS``, the malformed skipped."""
    from hpc_agent.core.rundir import read_bounded

    found: List[Dict[str, Any]] = []
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".json"))[:MAX_CONDITIONS]
    except OSError:
        return found
    for name in names:
        try:
            cond = json.loads(read_bounded(Path(folder) / name, 4096))
        except (OSError, ValueError, RecursionError):
            continue
        if isinstance(cond, dict) and cond.get("kind") in PERSISTENT_KINDS:
            found.append(cond)
    return found


class RuntimeTrigger:
    """Polls the trigger file; a no-op object when disabled (``enabled=False``)."""

    def __init__(self, run_dir: Path, rank: int, enabled: bool, poll_s: float = POLL_S,
                 clock: Callable[[], float] = time.monotonic):
        self.enabled = enabled
        self.poll_s, self.clock = poll_s, clock
        self._next_look = float("-inf")  # the first step looks at once
        self.rank = rank
        self.dir = chaos_dir(run_dir)
        self.path = self.dir / TRIGGER_FILE
        self._seen: Optional[Tuple[int, int]] = None  # (mtime_ns, size) of the last read
        self._nan = False
        self._oom = ""  # the nonce of a GPU OOM to raise from the next forward
        self._stall_s: Optional[float] = None
        self._stall_nonce = ""
        self.leak: Optional[threading.Thread] = None  # a host_oom's allocating thread
        # Persistent faults recorded by earlier attempts (or earlier in this one): checked at every step.
        self.conditions: List[Dict[str, Any]] = read_conditions(self.dir / CONDITIONS_DIR) if enabled else []
        self._node = node_name() if enabled else ""
        self._mem_mb = mem_limit_mb() if enabled else None
        self._first_step = True

    def _say(self, text: str) -> None:
        print(f"[hpc_agent] fault: {text} (rank {self.rank}, runtime trigger)", flush=True)

    def _fired_path(self, nonce: str) -> Path:
        return self.dir / "fired" / f"{_safe_name(nonce)}.rank{self.rank}"

    def _mark_fired(self, nonce: str, step: int, kind: str) -> None:
        atomic_write_json(self._fired_path(nonce), {"nonce": nonce, "kind": kind, "step": step, "time": time.time()})

    def _read(self) -> Optional[Dict[str, Any]]:
        """The trigger when the file changed since the last look and its nonce has not fired here."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._seen = None
            return None
        key = (st.st_mtime_ns, st.st_size)
        if key == self._seen:
            return None
        try:
            spec = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None  # mid-write by a non-atomic writer: look again next step
        self._seen = key
        if not isinstance(spec, dict) or spec.get("kind") not in KINDS:
            self._say(f"ignoring {self.path}: kind must be one of {', '.join(KINDS)}")
            return None
        nonce = str(spec.get("nonce", ""))
        if self._fired_path(nonce).exists():
            return None
        return spec

    def before_step(self, step: int, micro_batch: int = 0, lr: float = 0.0) -> None:
        if not self.enabled:
            return
        first, self._first_step = self._first_step, False
        fresh = self._look(step, micro_batch, lr)
        for cond in self.conditions:
            # A persistent fault fires here, from this one line, the first time and every time it recurs: a hang
            # that recurs then has the same stack, as a real one would (the watcher's "same hang twice" rule).
            if cond is fresh or recurs(cond, step, micro_batch, lr, self._node, self._mem_mb, first):
                if cond is not fresh:
                    self._recurred(cond, step)
                nonce = str(cond.get("nonce", ""))
                self._fire(str(cond["kind"]), nonce if cond is fresh else f"{nonce} again", step, cond.get("mb", 0))

    def _look(self, step: int, micro_batch: int, lr: float) -> Optional[Dict[str, Any]]:
        """The trigger file, at most every ``poll_s``: a one-shot fault fires (or is armed) here; a persistent one is
        recorded (``chaos/conditions/``) and returned, to fire with the others."""
        now = self.clock()
        if now < self._next_look:
            return None
        self._next_look = now + self.poll_s
        spec = self._read()
        if spec is None:
            return None
        kind, nonce = spec["kind"], str(spec.get("nonce", ""))
        if kind == "kill_during_save":  # fires (and is marked) when the next save reaches the hook
            self._stall_s, self._stall_nonce = float(spec.get("stall_s", 600)), nonce
            self._say(f"armed: the next checkpoint save stalls before {'COMPLETE.json'} (nonce {nonce})")
            return None
        self._mark_fired(nonce, step, kind)
        if spec.get("persistent") and kind in PERSISTENT_KINDS:
            cond = condition_for(kind, nonce, step, micro_batch, lr, self._node, self._mem_mb, int(spec.get("mb", 0)))
            self.conditions.append(cond)
            if self.rank == 0:
                atomic_write_json(self.dir / CONDITIONS_DIR / f"{_safe_name(nonce)}.json", cond)
            return cond
        self._fire(kind, nonce, step, int(spec.get("mb", 0)))
        return None

    def _recurred(self, cond: Dict[str, Any], step: int) -> None:
        """Rank 0 appends one line per recurrence to ``chaos/recurred.jsonl`` (kind, nonce, step, node, time): the
        benchmarks charge the time it costs to its cause (``hpc_agent.runs.goodput.lost_by_cause``)."""
        if self.rank != 0:
            return
        line = json.dumps({"kind": cond.get("kind"), "nonce": cond.get("nonce"), "step": step, "node": self._node,
                           "time": time.time()}) + "\n"
        try:
            fd = os.open(self.dir / RECURRED_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
        except OSError:
            pass  # a record for the benchmark's accounting, never a reason to stop the fault

    def _fire(self, kind: str, nonce: str, step: int, mb: int) -> None:
        if kind == "nan":
            self._say(f"making the loss NaN at step {step} (nonce {nonce})")
            self._nan = True
        elif kind == "gpu_oom":  # raised from the forward (``loss``), where a real one happens
            self._say(f"out of memory at step {step} (nonce {nonce})")
            self._oom = nonce
        elif kind == "host_oom" and self.rank == 0 and self.leak is None:
            self._say(f"allocating and touching {mb} MB of host memory beside training from step {step} (nonce {nonce})")
            self.leak = threading.Thread(target=_leak, args=(mb,), name="hpc_agent-chaos-host-oom", daemon=True)
            self.leak.start()
        elif kind == "hang":
            self._say(f"hanging at step {step} on {self._node}: no further progress (nonce {nonce})")
            while True:  # like a stuck collective: signals are recorded, never acted on; Slurm's SIGKILL ends it
                time.sleep(1)
        elif kind == "node_fail":
            self._say(f"node {self._node} is bad (nonce {nonce})")
            print(XID_LINE.format(pid=os.getpid(), node=self._node), flush=True)
            print("RuntimeError: CUDA error: GPU is lost", flush=True)
            os._exit(1)  # the process dies with its GPU: no cleanup, no checkpoint

    def loss(self, loss: Any) -> Any:
        if self._oom:
            import torch

            nonce, self._oom = self._oom, ""
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected by the chaos "
                                         f"runtime trigger, nonce {nonce})")
        if self._nan:
            self._nan = False
            return loss * float("nan")
        return loss

    def before_marker(self, step: int, tag_dir: Path) -> None:
        """Called by rank 0 inside ``checkpoint.save`` after the shards and before the marker."""
        if self._stall_s is None:
            return
        stall, nonce = self._stall_s, self._stall_nonce
        self._stall_s = None
        self._mark_fired(nonce, step, "kill_during_save")
        atomic_write_json(self.dir / IN_SAVE_FILE, {"nonce": nonce, "step": step, "tag": tag_dir.name,
                                                    "pid": os.getpid(), "time": time.time()})
        self._say(f"stalling in the save of {tag_dir.name} before COMPLETE.json for {stall:.0f}s (nonce {nonce})")
        deadline = time.monotonic() + stall
        while time.monotonic() < deadline:  # signals are only recorded meanwhile; Slurm's SIGKILL ends it
            time.sleep(0.5)

"""The one in-memory Slurm for tests: a drop-in for ``hpc_agent.slurm.cli.SlurmCLI`` (``run`` + ``sacct``).

It keeps jobs and their attempts the way slurmctld + slurmdbd do, and answers the commands hpc_agent sends
(sbatch, sacct, squeue, scontrol requeue/update/release/hold/show job, scancel, sinfo) in the text shapes
Slurm 22.05 prints. Those shapes were captured on the localhost cluster (scripts/cluster.sh) and are kept in
tests/data/contract/; tests/cluster/test_slurm_contract.py runs one contract suite against this fake and the real
cluster, so a drift of the fake from Slurm fails there.

The test drives what the job itself does (or what happens to it)::

    slurm = FakeSlurm()                      # job ids from 100, nodes node1,node2, partitions low,high
    job = slurm.submit("hpc_agent:r1")       # or slurm.run(["sbatch", "--parsable", "--job-name", ..., "--wrap", "x"])
    slurm.start(job)                         # or slurm.schedule(): starts every eligible pending job
    slurm.preempt(job)                       # PREEMPTED attempt + a new PENDING one, eligible in 121 s
    slurm.run(["scontrol", "update", f"JobId={job}", "StartTime=now"])   # what the watcher does
    slurm.schedule()                         # -> RUNNING again (attempt 2)
    slurm.oom(job) / fail(job, 3) / complete(job) / timeout(job) / node_fail(job) / cancel(job)

and reads back what the code under test did: ``calls`` (every argv), ``counts`` (calls by command name),
``sacct_calls`` (the id list of each batched ``sacct()``), and ``requeues``/``expedites``/``excludes``/
``cancels``/``releases``/``submissions`` (argv filtered by kind). ``break_command("sacct", ...)`` makes a
command fail like a down slurmdbd/slurmctld; ``sacct_lag_s`` delays when accounting shows a new attempt
(measured ~4 s on the real cluster); ``completing_s`` keeps a job that just ended (or was requeued) COMPLETING
in slurmctld's answers (squeue, scontrol) for that long, as the real cluster does while it cleans up the
nodes; accounting already has the ended attempt's state then.
"""
from __future__ import annotations

import datetime as _dt
import os
import re
import shlex
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from hpc_agent.slurm.cli import ALLOWED, JSON_PROBE, Result, SlurmError, sacct_argv
from hpc_agent.slurm.sacct import SACCT_FIELDS

REQUEUE_DELAY_S = 121.0  # a requeued job's BeginTime is now + cred_expire + 1 (22.05, not configurable)
START = _dt.datetime(2026, 12, 1, 10, 0, 0).timestamp()
ACTIVE = ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "REQUEUED", "RESIZING", "SIGNALING",
          "STAGE_OUT", "REQUEUE_HOLD", "REQUEUE_FED", "SPECIAL_EXIT", "STOPPED")
# The sacct fields this fake knows; anything else is refused the way sacct refuses it.
SACCT_KNOWN = ("JobID", "JobIDRaw", "JobName", "State", "ExitCode", "DerivedExitCode", "NodeList", "Start", "End",
               "Elapsed", "Submit", "Eligible", "Partition", "NNodes", "Comment", "MaxRSS", "ReqMem", "Timelimit",
               "User", "AllocCPUS", "Reason")
_SQUEUE_HEADERS = {"i": "JOBID", "j": "NAME", "T": "STATE", "t": "ST", "N": "NODELIST", "S": "START_TIME",
                   "r": "REASON", "P": "PARTITION", "k": "COMMENT", "u": "USER", "A": "JOBID", "D": "NODES",
                   "M": "TIME", "R": "NODELIST(REASON)", "F": "ARRAY_JOB_ID", "K": "ARRAY_TASK_ID"}
_SHORT = {"PENDING": "PD", "RUNNING": "R", "COMPLETING": "CG", "COMPLETED": "CD", "CANCELLED": "CA", "FAILED": "F",
          "TIMEOUT": "TO", "PREEMPTED": "PR", "NODE_FAIL": "NF", "OUT_OF_MEMORY": "OOM", "REQUEUED": "RQ",
          "SUSPENDED": "S", "CONFIGURING": "CF", "BOOT_FAIL": "BF", "DEADLINE": "DL"}


def _ts(t: Optional[float]) -> str:
    return _dt.datetime.fromtimestamp(t).strftime("%Y-%m-%dT%H:%M:%S") if t is not None else "Unknown"


def _elapsed(seconds: float) -> str:
    s = max(0, int(seconds))
    days, s = divmod(s, 86400)
    text = f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"
    return f"{days}-{text}" if days else text


def compress_hostlist(nodes: Sequence[str]) -> str:
    """``["node1", "node2", "node3", "gpu-a"]`` -> ``"gpu-a,node[1-3]"`` (Slurm's sorted, ranged form)."""
    groups: Dict[str, List[Tuple[int, str]]] = {}
    plain: List[str] = []
    for node in sorted(set(nodes)):
        m = re.match(r"^(.*?)(\d+)$", node)
        if m:
            groups.setdefault(m.group(1), []).append((int(m.group(2)), m.group(2)))
        else:
            plain.append(node)
    out = list(plain)
    for prefix in sorted(groups):
        nums = sorted(groups[prefix])
        if len(nums) == 1:
            out.append(prefix + nums[0][1])
            continue
        ranges, lo, hi = [], nums[0], nums[0]
        for n in nums[1:]:
            if n[0] == hi[0] + 1:
                hi = n
            else:
                ranges.append(lo[1] if lo == hi else f"{lo[1]}-{hi[1]}")
                lo = hi = n
        ranges.append(lo[1] if lo == hi else f"{lo[1]}-{hi[1]}")
        out.append(f"{prefix}[{','.join(ranges)}]")
    return ",".join(sorted(out))


def _expand(text: str) -> List[str]:
    from hpc_agent.slurm.hostlist import expand_hostlist

    return expand_hostlist(text)


@dataclass
class FakeStep:
    suffix: str          # "batch", "extern", "0", "1"...
    name: str            # JobName column: "batch", "extern", the srun command ("python")
    nodes: List[str]
    start: float
    state: str = "RUNNING"
    exit_code: str = "0:0"
    end: Optional[float] = None


@dataclass
class FakeAttempt:
    seq: int                      # accounting order (sacct -D lists records in this order)
    created: float                # when accounting got the record (see FakeSlurm.sacct_lag_s)
    state: str = "PENDING"
    exit_code: str = "0:0"
    nodes: List[str] = field(default_factory=list)
    start: Optional[float] = None
    end: Optional[float] = None
    cancelled_by: Optional[str] = None
    never_started: bool = False   # cancelled while pending: Start prints "None"
    steps: List[FakeStep] = field(default_factory=list)


@dataclass
class FakeJob:
    job_id: str                   # "123", or "900_1" for an array task
    raw_id: str                   # JobIDRaw / scontrol's JobId
    name: str
    submit_time: float
    comment: str = ""
    partition: str = "low"
    num_nodes: int = 1
    held: bool = False
    begin: Optional[float] = None  # EligibleTime; None: at submit
    exclude: List[str] = field(default_factory=list)
    nodelist: List[str] = field(default_factory=list)
    time_limit: str = "UNLIMITED"
    stdout: str = ""
    stderr: str = ""
    workdir: str = "/tmp"
    array_base: Optional[str] = None
    array_task: Optional[int] = None
    restarts: int = 0
    last_exit: str = "0:0"
    purged: bool = False           # left slurmctld's memory (MinJobAge): only sacct knows it
    reason: str = "None"
    completing_until: Optional[float] = None  # slurmctld still cleans up the ended attempt (see completing_s)
    owner: Optional[Tuple[str, str]] = None  # (user name, uid) of another user's job; None: the fake's own user
    attempts: List[FakeAttempt] = field(default_factory=list)

    @property
    def attempt(self) -> FakeAttempt:
        return self.attempts[-1]

    @property
    def state(self) -> str:
        return self.attempt.state


class FakeSlurm:
    """An in-memory Slurm 22.05 behind the ``SlurmCLI`` interface. See the module docstring."""

    def __init__(self, first_job_id: int = 100, nodes: Sequence[str] = ("node1", "node2"),
                 partitions: Sequence[str] = ("low", "high"), uid: Optional[str] = None,
                 clock: Optional[Callable[[], float]] = None, start: float = START, sacct_lag_s: float = 0.0,
                 extern_step: bool = False, requeue_delay_s: float = REQUEUE_DELAY_S, auto_schedule: bool = False,
                 user: str = "root", mem_mb: int = 6000, cpus: int = 2, completing_s: float = 0.0):
        self.next_id = first_job_id
        self.nodes = list(nodes)
        self.partitions = list(partitions)
        self.uid = str(os.getuid()) if uid is None else str(uid)
        self.user = user
        self._clock = clock
        self._now = start
        self.sacct_lag_s = sacct_lag_s
        self.completing_s = completing_s
        self.extern_step = extern_step
        self.requeue_delay_s = requeue_delay_s
        self.auto_schedule = auto_schedule
        self.mem_mb, self.cpus = mem_mb, cpus
        self.jobs: Dict[str, FakeJob] = {}
        self.archived: List[FakeJob] = []  # jobs from before reuse_job_ids(): only accounting still lists them
        self._seq = 0
        self.broken: Dict[str, Union[Tuple[int, str], Exception]] = {}
        self.calls: List[List[str]] = []
        self.commands: List[List[str]] = []   # run() calls only (not the sacct() method)
        self.sacct_calls: List[List[str]] = []
        self.counts: Counter = Counter()

    # --- time -------------------------------------------------------------------------------------------
    @property
    def now(self) -> float:
        return self._clock() if self._clock is not None else self._now

    def advance(self, seconds: float) -> float:
        """Move the fake's own clock (ignored when a ``clock`` was given: move that one)."""
        self._now += seconds
        return self.now

    # --- whose job ----------------------------------------------------------------------------------------
    def owner_of(self, job: "FakeJob") -> Tuple[str, str]:
        """(user name, uid) of the job's owner."""
        return job.owner if job.owner is not None else (self.user, self.uid)

    def _users_filter(self, jobs: List["FakeJob"], opts: Dict[str, str], listing_all: bool) -> List["FakeJob"]:
        """``--me`` / ``--user=LIST`` (names or uids, as Slurm takes them); without either, everyone's jobs
        when ``listing_all`` (squeue; sacct for root or with --allusers), else the caller's own (sacct)."""
        if "me" in opts:
            wanted = {self.user, self.uid}
        elif "user" in opts:
            wanted = {u.strip() for u in opts["user"].split(",")}
        elif listing_all:
            return jobs
        else:
            wanted = {self.user, self.uid}
        return [j for j in jobs if wanted & set(self.owner_of(j))]

    # --- recorded calls -----------------------------------------------------------------------------------
    def ran(self, *prefix: str) -> List[List[str]]:
        """Every recorded argv that starts with ``prefix`` (``ran("scontrol", "requeue")``)."""
        return [argv for argv in self.calls if argv[:len(prefix)] == list(prefix)]

    @property
    def requeues(self) -> List[str]:
        return [j for argv in self.ran("scontrol", "requeue") for j in argv[2].split(",")]

    @property
    def expedites(self) -> List[str]:
        return [argv[2].split("=", 1)[1] for argv in self.ran("scontrol", "update")
                if any(a.lower() == "starttime=now" for a in argv[3:])]

    @property
    def excludes(self) -> List[Tuple[str, str]]:
        return [(argv[2].split("=", 1)[1], a.split("=", 1)[1]) for argv in self.ran("scontrol", "update")
                for a in argv[3:] if a.lower().startswith("excnodelist=")]

    @property
    def cancels(self) -> List[str]:
        return [a for argv in self.ran("scancel") if not any(a.startswith("--signal") for a in argv)
                for a in argv[1:] if not a.startswith("-")]

    @property
    def signals(self) -> List[Tuple[str, str]]:
        """(job id, signal name) of every ``scancel --signal=NAME`` (it signals; the job goes on)."""
        return [(a, sig.split("=", 1)[1]) for argv in self.ran("scancel") for sig in argv[1:]
                if sig.startswith("--signal=") for a in argv[1:] if not a.startswith("-")]

    def signal_job(self, job_id: str, signal_name: str) -> Result:
        """``SlurmCLI.signal_job``: through :meth:`run`, so the call is recorded like any other."""
        from hpc_agent.slurm.cli import signal_argv

        return self.run(signal_argv(job_id, signal_name))

    @property
    def releases(self) -> List[str]:
        return [j for argv in self.ran("scontrol", "release") for j in argv[2].split(",")]

    @property
    def submissions(self) -> List[List[str]]:
        return self.ran("sbatch")

    def reset_calls(self) -> None:
        self.calls, self.commands, self.sacct_calls, self.counts = [], [], [], Counter()

    def break_command(self, command: str, stderr: str = "", returncode: int = 1, timeout: bool = False) -> None:
        """Make ``command`` fail until :meth:`heal_command`: a non-zero exit with ``stderr`` (SlurmError when the
        caller passes check=True), or with ``timeout`` the SlurmError a hung daemon gives."""
        if timeout:
            self.broken[command] = SlurmError(f"{command} timed out after 30 s")
        else:
            self.broken[command] = (returncode, stderr or f"{command}: error: Unable to contact slurm controller")

    def heal_command(self, command: str) -> None:
        self.broken.pop(command, None)

    # --- the SlurmCLI interface ---------------------------------------------------------------------------
    def sacct(self, job_ids: Iterable[str], fields: Sequence[str] = SACCT_FIELDS, all_attempts: bool = True,
              as_json: bool = False) -> str:
        ids = [str(j) for j in job_ids]
        self.sacct_calls.append(ids)
        if not ids:
            return ""
        argv = sacct_argv(ids, fields, as_json)
        if all_attempts:
            argv.insert(1, "--duplicates")
        return self._run(argv, check=True, record_command=False).stdout

    def sacct_probe(self) -> Result:
        return self._run(JSON_PROBE, check=False, record_command=False)

    def run(self, argv: Sequence[str], check: bool = True, timeout_s: Optional[float] = None) -> Result:
        return self._run(argv, check=check, record_command=True)

    def _run(self, argv: Sequence[str], check: bool, record_command: bool) -> Result:
        argv = [str(a) for a in argv]
        if not argv or argv[0] not in ALLOWED:
            raise SlurmError(f"refusing to run {argv[:1]}: only {', '.join(ALLOWED)} are allowed")
        self.calls.append(argv)
        if record_command:
            self.commands.append(argv)
        self.counts[argv[0]] += 1
        broken = self.broken.get(argv[0])
        if isinstance(broken, Exception):
            raise broken
        if broken is not None:
            result = Result(argv, broken[0], "", broken[1] + "\n")
        else:
            if self.auto_schedule:
                self.schedule()
            rc, out, err = getattr(self, "_cmd_" + argv[0])(argv[1:])
            result = Result(argv, rc, out, err)
        if check and result.returncode != 0:
            raise SlurmError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
        return result

    # --- what the test drives -----------------------------------------------------------------------------
    def submit(self, name: str = "wrap", *, comment: str = "", partition: Optional[str] = None, nodes: int = 1,
               hold: bool = False, begin: Optional[float] = None, array: Optional[Sequence[int]] = None,
               exclude: Sequence[str] = (), nodelist: Sequence[str] = (), time_limit: str = "UNLIMITED",
               stdout: str = "", workdir: str = "/tmp", owner: Optional[Tuple[str, str]] = None) -> str:
        """sbatch: the new job id (an array's base id; its tasks are ``<base>_<i>``), PENDING. ``owner`` (a
        user name and uid) makes it another user's job: squeue lists it unless asked for ``--me``/``--user``,
        sacct lists it to root (or with ``--allusers``) unless asked for ``--user``."""
        partition = partition or self.partitions[0]
        if partition not in self.partitions:
            raise SlurmError(f"sbatch: error: invalid partition specified: {partition}")
        base = str(self._new_id())
        tasks = list(array) if array is not None else [None]
        for i, task in enumerate(tasks):
            job_id = base if task is None else f"{base}_{task}"
            raw = base if i == 0 else str(self._new_id())
            out = (stdout or f"{workdir}/slurm-%j.out").replace("%j", raw).replace("%A", base).replace(
                "%a", str(task) if task is not None else "4294967294")
            job = FakeJob(job_id=job_id, raw_id=raw, name=name, submit_time=self.now, comment=comment,
                          partition=partition, num_nodes=nodes, held=hold, begin=begin, exclude=list(exclude),
                          nodelist=list(nodelist), time_limit=time_limit, stdout=out, stderr=out, workdir=workdir,
                          array_base=base if task is not None else None, array_task=task, owner=owner)
            job.attempts.append(self._new_attempt())
            job.reason = self._pending_reason(job)
            self.jobs[job_id] = job
        return base

    def reuse_job_ids(self, first_job_id: int) -> None:
        """Job ids start again at ``first_job_id`` (a slurmdbd reset, or another cluster of a federation
        handing out the same ids). slurmctld forgets every job it knew; accounting keeps their records, so
        ``sacct --jobs <id>`` lists an older job under a reused id first, as on the real cluster."""
        self.archived.extend(self.jobs.values())
        self.jobs = {}
        self.next_id = first_job_id

    def tasks(self, base: str) -> List[str]:
        """The task ids of array ``base`` (``["900_0", "900_1"]``)."""
        return [j.job_id for j in self.jobs.values() if j.array_base == str(base)]

    def job(self, job_id: str) -> FakeJob:
        return self.jobs[str(job_id)]

    def schedule(self) -> List[str]:
        """What slurmctld's scheduler does: start every pending job that is eligible (not held, BeginTime
        reached). Capacity is not modelled. Returns the ids started."""
        started = []
        for job in list(self.jobs.values()):
            if (job.state == "PENDING" and not job.held and (job.begin is None or job.begin <= self.now)
                    and not self.completing(job.job_id)):
                self.start(job.job_id)
                started.append(job.job_id)
        return started

    def start(self, job_id: str, nodes: Optional[Sequence[str]] = None) -> None:
        """The job starts now (whether or not its BeginTime has come: the test decides), with its batch step."""
        job = self._job(job_id)
        if job.state != "PENDING":
            raise AssertionError(f"job {job_id} is {job.state}, not PENDING: it cannot start")
        if nodes is None:
            pool = job.nodelist or [n for n in self.nodes if n not in job.exclude]
            nodes = pool[:job.num_nodes]
        a = job.attempt
        a.state, a.nodes, a.start = "RUNNING", list(nodes), self.now
        a.steps = [FakeStep("batch", "batch", list(nodes[:1]), self.now)]
        if self.extern_step:
            a.steps.append(FakeStep("extern", "extern", list(nodes), self.now))
        job.reason = "None"

    def step(self, job_id: str, name: str = "python", nodes: Optional[Sequence[str]] = None) -> str:
        """An srun step starts (``<job>.0``, ``.1``...); returns its suffix. End it with :meth:`end_step`."""
        a = self._running(job_id).attempt
        n = sum(1 for s in a.steps if s.suffix.isdigit())
        a.steps.append(FakeStep(str(n), name, list(nodes or a.nodes), self.now))
        return str(n)

    def end_step(self, job_id: str, suffix: str, state: str = "COMPLETED", exit_code: str = "0:0") -> None:
        for s in self._running(job_id).attempt.steps:
            if s.suffix == str(suffix):
                s.state, s.exit_code, s.end = state, exit_code, self.now

    def complete(self, job_id: str) -> None:
        self._end(job_id, "COMPLETED", "0:0", batch=("COMPLETED", "0:0"), steps=("COMPLETED", "0:0"))

    def fail(self, job_id: str, code: int = 1, signal: int = 0) -> None:
        """The batch script exits ``code`` (or dies of ``signal``): FAILED code:signal; srun steps still running
        are cancelled."""
        self._end(job_id, "FAILED", f"{code}:{signal}", batch=("FAILED", f"{code}:{signal}"), steps=("CANCELLED", "0:15"))

    def oom(self, job_id: str) -> None:
        """The cgroup OOM killer: the allocation, the batch step and running steps OUT_OF_MEMORY 0:125."""
        self._end(job_id, "OUT_OF_MEMORY", "0:125", batch=("OUT_OF_MEMORY", "0:125"), steps=("OUT_OF_MEMORY", "0:125"))

    def timeout(self, job_id: str) -> None:
        """The time limit: TIMEOUT 0:0, the steps killed (CANCELLED 0:15)."""
        self._end(job_id, "TIMEOUT", "0:0", batch=("CANCELLED", "0:15"), steps=("CANCELLED", "0:15"))

    def preempt(self, job_id: str) -> None:
        """PreemptMode=REQUEUE after the grace time: PREEMPTED 0:0, steps CANCELLED 0:15, and a new PENDING
        attempt whose BeginTime is ``requeue_delay_s`` away."""
        self._end(job_id, "PREEMPTED", "0:0", batch=("CANCELLED", "0:15"), steps=("CANCELLED", "0:15"))
        self._requeue(self._job(job_id))

    def node_fail(self, job_id: str, requeue: bool = False) -> None:
        """A node of the job stopped answering: NODE_FAIL 0:0, steps CANCELLED 0:15 (requeued when ``requeue``)."""
        self._end(job_id, "NODE_FAIL", "0:0", batch=("CANCELLED", "0:15"), steps=("CANCELLED", "0:15"))
        if requeue:
            self._requeue(self._job(job_id))

    def requeue(self, job_id: str) -> None:
        """``scontrol requeue`` (also what a job does to itself)."""
        rc, _, err = self._cmd_scontrol(["requeue", str(job_id)])
        if rc:
            raise SlurmError(err.strip())

    def cancel(self, job_id: str) -> None:
        """``scancel`` by this fake's uid."""
        self._cmd_scancel([str(job_id)])

    def purge(self, job_id: str) -> None:
        """The job leaves slurmctld (MinJobAge): squeue/scontrol no longer know it; sacct still does."""
        self._job(job_id).purged = True

    def completing(self, job_id: str) -> bool:
        """Whether slurmctld still shows the job COMPLETING (``completing_s`` after its attempt ended)."""
        job = self._job(job_id)
        return job.completing_until is not None and self.now < job.completing_until

    # --- internals ----------------------------------------------------------------------------------------
    def _new_id(self) -> int:
        job_id, self.next_id = self.next_id, self.next_id + 1
        return job_id

    def _new_attempt(self, exit_code: str = "0:0") -> FakeAttempt:
        self._seq += 1
        return FakeAttempt(seq=self._seq, created=self.now, exit_code=exit_code)

    def _job(self, job_id: str) -> FakeJob:
        job = self.jobs.get(str(job_id))
        if job is None:
            raise KeyError(f"FakeSlurm has no job {job_id}")
        return job

    def _running(self, job_id: str) -> FakeJob:
        job = self._job(job_id)
        if job.state != "RUNNING":
            raise AssertionError(f"job {job_id} is {job.state}, not RUNNING")
        return job

    def _end(self, job_id: str, state: str, code: str, batch: Tuple[str, str], steps: Tuple[str, str]) -> None:
        job = self._running(job_id)
        a = job.attempt
        a.state, a.exit_code, a.end = state, code, self.now
        job.completing_until = self.now + self.completing_s if self.completing_s > 0 else None
        for s in a.steps:
            if s.end is None:
                s.state, s.exit_code = (batch if s.suffix == "batch" else ("COMPLETED", "0:0") if s.suffix == "extern"
                                        else steps)
                s.end = self.now
        job.reason = "None" if state in ("COMPLETED", "CANCELLED") else {
            "FAILED": "NonZeroExitCode", "OUT_OF_MEMORY": "OutOfMemory", "TIMEOUT": "TimeLimit",
            "NODE_FAIL": "NodeDown", "PREEMPTED": "None"}.get(state, "None")

    def _requeue(self, job: FakeJob) -> None:
        """A new PENDING attempt (sacct shows it 0:0; scontrol and a later scancel show the last exit code)."""
        job.restarts += 1
        job.last_exit = job.attempt.exit_code
        job.begin = self.now + self.requeue_delay_s
        job.attempts.append(self._new_attempt())
        job.reason = "BeginTime"

    def _ctld_state(self, job: FakeJob) -> str:
        """The state slurmctld prints (squeue %T, scontrol JobState): its COMPLETING flag wins over the base
        state (a requeued job is PENDING underneath), as in Slurm's job_state_string()."""
        return "COMPLETING" if self.completing(job.job_id) else job.state

    def _ctld_attempt(self, job: FakeJob) -> FakeAttempt:
        """The attempt slurmctld describes: while a requeued job completes, the one that ended (its nodes)."""
        if self.completing(job.job_id) and job.state == "PENDING" and len(job.attempts) > 1:
            return job.attempts[-2]
        return job.attempt

    def _pending_reason(self, job: FakeJob) -> str:
        if job.held:
            return "JobHeldUser"
        if job.begin is not None and job.begin > self.now:
            return "BeginTime"
        return "None"

    def _select(self, spec: str) -> List[FakeJob]:
        """Jobs named by one id of a --jobs list: ``123``, an array's ``900`` (every task), ``900_1``."""
        spec = spec.strip()
        if spec in self.jobs and self.jobs[spec].array_base is None:
            return [self.jobs[spec]]
        if spec in self.jobs:
            return [self.jobs[spec]]
        tasks = [j for j in self.jobs.values() if j.array_base == spec]
        if tasks:
            return tasks
        return [j for j in self.jobs.values() if j.raw_id == spec]

    # --- sbatch -------------------------------------------------------------------------------------------
    def _cmd_sbatch(self, args: List[str]) -> Tuple[int, str, str]:
        opts: Dict[str, str] = {}
        flags = set()
        script: Optional[str] = None
        with_value = {"-J": "job-name", "--job-name": "job-name", "--comment": "comment", "-p": "partition",
                      "--partition": "partition", "-N": "nodes", "--nodes": "nodes", "-n": "ntasks",
                      "--ntasks": "ntasks", "--ntasks-per-node": "ntasks-per-node", "-c": "cpus-per-task",
                      "--cpus-per-task": "cpus-per-task", "--mem": "mem", "-t": "time", "--time": "time",
                      "-o": "output", "--output": "output", "-e": "error", "--error": "error", "--begin": "begin",
                      "-a": "array", "--array": "array", "-x": "exclude", "--exclude": "exclude",
                      "-w": "nodelist", "--nodelist": "nodelist", "--wrap": "wrap", "--signal": "signal",
                      "--open-mode": "open-mode", "--gres": "gres", "--gpus-per-node": "gpus-per-node",
                      "-A": "account", "--account": "account", "--qos": "qos", "-C": "constraint",
                      "--constraint": "constraint", "-D": "chdir", "--chdir": "chdir", "--export": "export",
                      "--dependency": "dependency", "-d": "dependency", "--distribution": "distribution",
                      "--mem-per-cpu": "mem-per-cpu", "--gpus": "gpus"}
        no_value = {"--parsable", "--hold", "-H", "--test-only", "--requeue", "--no-requeue", "--exclusive"}
        i = 0
        while i < len(args):
            a = args[i]
            key, eq, val = a.partition("=")
            if a in no_value:
                flags.add(a)
            elif eq and key in with_value:
                opts[with_value[key]] = val
            elif a in with_value:
                opts[with_value[a]] = args[i + 1]
                i += 1
            elif not a.startswith("-"):
                script = a
                break
            else:
                raise AssertionError(f"FakeSlurm: sbatch option {a!r} is not modelled")
            i += 1
        if script is not None and Path(script).is_file():  # #SBATCH lines count, command line wins
            for line in Path(script).read_text(errors="replace").splitlines():
                if line.startswith("#SBATCH"):
                    for word in shlex.split(line[len("#SBATCH"):]):
                        key, eq, val = word.partition("=")
                        if word in no_value:
                            flags.add(word)
                        elif eq and key in with_value:
                            opts.setdefault(with_value[key], val)
        partition = opts.get("partition", self.partitions[0])
        if partition not in self.partitions:
            return 1, "", (f"sbatch: error: invalid partition specified: {partition}\n"
                           "sbatch: error: Batch job submission failed: Invalid partition name specified\n")
        name = opts.get("job-name") or ("wrap" if "wrap" in opts else Path(script).name if script else "sbatch")
        array = _array_indices(opts["array"]) if "array" in opts else None
        begin = None
        if "begin" in opts:
            begin = self._parse_time(opts["begin"])
        job_id = self.submit(name, comment=opts.get("comment", ""), partition=partition,
                             nodes=int(opts.get("nodes", "1").split("-")[0]), hold="--hold" in flags or "-H" in flags,
                             begin=begin, array=array, exclude=_expand(opts.get("exclude", "")),
                             nodelist=_expand(opts.get("nodelist", "")), time_limit=opts.get("time", "UNLIMITED"),
                             stdout=opts.get("output", ""), workdir=opts.get("chdir", "/tmp"))
        if "--test-only" in flags:
            for job in self._select(job_id):
                del self.jobs[job.job_id]
            return 0, "", (f"sbatch: Job {job_id} to start at {_ts(self.now)} using 1 processors on nodes "
                           f"{self.nodes[0]} in partition {partition}\n")
        if "--parsable" in flags:
            return 0, f"{job_id}\n", ""
        return 0, f"Submitted batch job {job_id}\n", ""

    def _parse_time(self, text: str) -> float:
        text = text.strip().lower()
        if text == "now":
            return self.now
        m = re.match(r"^now\+(\d+)(seconds|minutes|hours|days)?$", text)
        if m:
            return self.now + int(m.group(1)) * {"seconds": 1, None: 1, "minutes": 60, "hours": 3600,
                                                 "days": 86400}[m.group(2)]
        return _dt.datetime.strptime(text.upper(), "%Y-%m-%dT%H:%M:%S").timestamp()

    # --- sacct --------------------------------------------------------------------------------------------
    def _cmd_sacct(self, args: List[str]) -> Tuple[int, str, str]:
        opts = _options(args, with_value={"--format": "format", "-o": "format", "--jobs": "jobs", "-j": "jobs",
                                          "--name": "name", "--starttime": "starttime", "-S": "starttime",
                                          "--endtime": "endtime", "-E": "endtime", "--state": "state", "-s": "state",
                                          "--user": "user", "-u": "user"},
                        flags={"--parsable2": "P", "-P": "P", "--parsable": "p", "-p": "p", "--duplicates": "D",
                               "-D": "D", "--allocations": "X", "-X": "X", "--noheader": "n", "-n": "n",
                               "--allusers": "a", "-a": "a", "--json": "J"}, command="sacct")
        # sacct lists only the caller's jobs, except to root (and with --allusers); -u selects users
        scope = lambda found: self._users_filter(found, opts, "a" in opts or self.uid == "0")  # noqa: E731
        fields = opts.get("format", "JobID,JobName,Partition,Account,AllocCPUS,State,ExitCode").split(",")
        for f in fields if "J" not in opts else ():  # --json prints every field and ignores --format
            if f not in SACCT_KNOWN:
                return 1, "", f'sacct: error: Invalid field requested: "{f}"\n'
        jobs: List[FakeJob] = list(self.jobs.values())
        if "jobs" in opts:
            specs = [spec.strip() for spec in opts["jobs"].split(",")]
            old = [j for j in self.archived if j.job_id in specs or j.raw_id in specs or j.array_base in specs]
            jobs = old + [j for spec in specs for j in self._select(spec)]
        else:
            jobs = self.archived + jobs
        if "name" in opts:
            names = set(opts["name"].split(","))
            jobs = [j for j in jobs if j.name in names]
        jobs = scope(jobs)
        since = self._parse_time(opts["starttime"]) if "starttime" in opts else None
        visible = self.now - self.sacct_lag_s
        records: List[Tuple[int, FakeJob, FakeAttempt]] = []
        seen = set()
        for job in jobs:
            if id(job) in seen:
                continue
            seen.add(id(job))
            attempts = [a for a in job.attempts if a.created <= visible]
            if "D" not in opts:
                attempts = attempts[-1:]
            for a in attempts:
                if since is not None and a.end is not None and a.end < since:
                    continue
                records.append((a.seq, job, a))
        records.sort(key=lambda r: r[0])
        rows: List[Dict[str, str]] = []
        collapsed: Dict[str, Dict[str, str]] = {}
        for _, job, a in records:
            if job.array_base is not None and a.state == "PENDING" and len(job.attempts) == 1:
                # unstarted tasks of an array are one record: 900_[1-3]
                key = job.array_base
                if key in collapsed:
                    collapsed[key]["_tasks"].append(job.array_task)
                    continue
                row = self._sacct_row(job, a, None)
                row["_tasks"] = [job.array_task]
                collapsed[key] = row
                rows.append(row)
                continue
            rows.append(self._sacct_row(job, a, None))
            if "X" not in opts and a.start is not None:
                for s in a.steps:
                    rows.append(self._sacct_row(job, a, s))
        for row in collapsed.values():
            tasks = row.pop("_tasks")
            row["JobID"] = f"{row['JobID'].split('_')[0]}_[{_ranges(tasks)}]"
        if "J" in opts:
            return 0, self._sacct_json(records), ""
        sep_end = "|" if "p" in opts else ""
        lines = [] if "n" in opts else ["|".join(fields) + sep_end]
        lines += ["|".join(row.get(f, "") for f in fields) + sep_end for row in rows]
        return 0, "\n".join(lines) + "\n", ""

    def _sacct_row(self, job: FakeJob, a: FakeAttempt, s: Optional[FakeStep]) -> Dict[str, str]:
        if s is None:
            state = f"{a.state} by {a.cancelled_by}" if a.state == "CANCELLED" and a.cancelled_by else a.state
            start = "None" if a.never_started else _ts(a.start)
            end = _ts(a.end)
            run_end = a.end if a.end is not None else self.now
            elapsed = _elapsed(run_end - a.start) if a.start is not None else "00:00:00"
            return {"JobID": job.job_id, "JobIDRaw": job.raw_id, "JobName": job.name, "State": state,
                    "ExitCode": a.exit_code, "DerivedExitCode": "0:0",
                    "NodeList": compress_hostlist(a.nodes) if a.nodes else "None assigned",
                    "Start": start, "End": end, "Elapsed": elapsed, "Submit": _ts(a.created),  # a requeue resubmits
                    "Eligible": _ts(job.begin if job.begin is not None else job.submit_time),
                    "Partition": job.partition, "NNodes": str(max(1, len(a.nodes) or job.num_nodes)),
                    "Comment": job.comment, "MaxRSS": "", "ReqMem": f"{self.mem_mb // self.cpus}M",
                    "Timelimit": job.time_limit, "User": self.owner_of(job)[0], "AllocCPUS": "1",
                    "Reason": job.reason if a is job.attempt else "None"}
        run_end = s.end if s.end is not None else self.now
        return {"JobID": f"{job.job_id}.{s.suffix}", "JobIDRaw": f"{job.raw_id}.{s.suffix}", "JobName": s.name,
                "State": s.state, "ExitCode": s.exit_code, "DerivedExitCode": "",
                "NodeList": compress_hostlist(s.nodes), "Start": _ts(s.start), "End": _ts(s.end),
                "Elapsed": _elapsed(run_end - s.start), "Submit": _ts(s.start), "Eligible": _ts(s.start),
                "Partition": "", "NNodes": str(len(s.nodes)), "Comment": "", "MaxRSS": "0", "ReqMem": "",
                "Timelimit": "", "User": "", "AllocCPUS": "1", "Reason": ""}

    def _sacct_json(self, records: List[Tuple[int, FakeJob, FakeAttempt]]) -> str:
        """``sacct --json`` as 22.05 (openapi dbv0.0.38) prints it: one record per attempt with its steps, the
        fields hpc_agent.slurm.sacct_json reads in their 22.05 shapes. Like 22.05, an exit code reads
        SUCCESS/0 unless a signal ended the job (text mode says 3:0 where JSON says 0: measured, see
        tests/cluster/test_slurm_contract.py); unstarted array tasks are one record with a task bitmap."""
        jobs: List[Dict[str, object]] = []
        collapsed: Dict[str, Dict[str, object]] = {}
        for _, job, a in records:
            if job.array_base is not None and a.state == "PENDING" and len(job.attempts) == 1:
                if job.array_base in collapsed:
                    collapsed[job.array_base]["_tasks"].append(job.array_task)
                    continue
                record = self._json_record(job, a)
                record["_tasks"] = [job.array_task]
                collapsed[job.array_base] = record
                jobs.append(record)
                continue
            jobs.append(self._json_record(job, a))
        for record in collapsed.values():
            tasks = record.pop("_tasks")
            record["array"] = {"job_id": int(record["job_id"]), "task": hex(sum(1 << t for t in tasks)),
                               "task_id": None}
        doc = {"meta": {"plugin": {"type": "openapi/dbv0.0.38", "name": "Slurm OpenAPI DB v0.0.38"},
                        "Slurm": {"version": {"major": 22, "micro": 8, "minor": 5}, "release": "22.05.8"}},
               "errors": [] if jobs else [{"description": "Nothing found", "error_number": 9003,
                                           "error": "Nothing found with query", "source": "slurmdb_jobs_get"}],
               "jobs": jobs}
        import json

        return json.dumps(doc, indent=2)

    @staticmethod
    def _json_exit(code: str) -> Dict[str, object]:
        status, _, signal = code.partition(":")
        if signal and int(signal):
            return {"status": "SIGNALED", "return_code": None, "signal": {"signal_id": int(signal), "name": ""}}
        return {"status": "SUCCESS", "return_code": 0}  # 22.05 drops a non-zero exit status here

    def _json_record(self, job: FakeJob, a: FakeAttempt) -> Dict[str, object]:
        def epoch(t: Optional[float]) -> int:
            return int(t) if t is not None else 0

        steps = [{"nodes": {"list": list(s.nodes), "count": len(s.nodes), "range": compress_hostlist(s.nodes)},
                  "time": {"elapsed": int((s.end if s.end is not None else self.now) - s.start),
                           "end": epoch(s.end), "start": epoch(s.start)},
                  "exit_code": self._json_exit(s.exit_code), "state": s.state,
                  "step": {"job_id": int(job.raw_id), "het": {"component": None},
                           "id": s.suffix if not s.suffix.isdigit() else int(s.suffix), "name": s.name}}
                 for s in (a.steps if a.start is not None else [])]
        return {"account": "root", "comment": {"administrator": None, "job": job.comment or None, "system": None},
                "array": {"job_id": int(job.array_base) if job.array_base else 0, "task": None,
                          "task_id": job.array_task},
                "exit_code": self._json_exit(a.exit_code), "derived_exit_code": {"status": "SUCCESS", "return_code": 0},
                "het": {"job_id": 0, "job_offset": None}, "job_id": int(job.raw_id),
                "kill_request_user": None,  # 22.05 leaves it null even for scancel (text: CANCELLED by <uid>)
                "name": job.name, "nodes": compress_hostlist(a.nodes) if a.nodes else "None assigned",
                "partition": job.partition, "state": {"current": a.state, "reason": job.reason},
                "steps": steps, "time": {"elapsed": int(((a.end if a.end is not None else self.now) - a.start)
                                                        if a.start is not None else 0),
                                         "eligible": epoch(job.begin if job.begin is not None else job.submit_time),
                                         "end": epoch(a.end), "start": epoch(a.start if not a.never_started else a.end),
                                         "submission": epoch(a.created)},
                "user": self.owner_of(job)[0], "working_directory": job.workdir}

    # --- squeue -------------------------------------------------------------------------------------------
    def _cmd_squeue(self, args: List[str]) -> Tuple[int, str, str]:
        opts = _options(args, with_value={"--jobs": "jobs", "-j": "jobs", "--name": "name", "-n": "name",
                                          "--format": "format", "-o": "format", "--states": "states", "-t": "states",
                                          "--user": "user", "-u": "user", "--partition": "partition",
                                          "-p": "partition"},
                        flags={"--noheader": "h", "-h": "h", "--array": "r", "-r": "r", "--me": "me"},
                        command="squeue")
        fmt = opts.get("format", "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R")
        known = [j for j in self.jobs.values() if not j.purged]
        if "jobs" in opts:
            wanted = [j for spec in opts["jobs"].split(",") for j in self._select(spec) if not j.purged]
            if not wanted:
                return 1, "", "slurm_load_jobs error: Invalid job id specified\n"
            known = list({id(j): j for j in wanted}.values())
        if "name" in opts:
            names = set(opts["name"].split(","))
            known = [j for j in known if j.name in names]
        known = self._users_filter(known, opts, listing_all=True)  # squeue: everyone's, without PrivateData
        states = opts.get("states", "")
        if states.lower() == "all":
            listed = known
        elif states:
            allowed = {s.strip().upper() for s in states.split(",")}
            # The base state matches, and so does the COMPLETING flag when asked for (squeue's _filter_job).
            listed = [j for j in known if j.state in allowed or _SHORT.get(j.state) in allowed
                      or (self.completing(j.job_id) and allowed & {"COMPLETING", "CG"})]
        else:
            listed = [j for j in known if j.state in ACTIVE or self.completing(j.job_id)]
        lines = [] if "h" in opts else [_squeue_line(fmt, None)]
        collapsed: Dict[str, List[FakeJob]] = {}
        for job in sorted(listed, key=lambda j: (int(j.raw_id), j.array_task or 0)):
            if "r" not in opts and job.array_base is not None and job.state == "PENDING" and len(job.attempts) == 1:
                if job.array_base not in collapsed:
                    collapsed[job.array_base] = []
                    lines.append(("array", job.array_base))
                collapsed[job.array_base].append(job)
                continue
            lines.append(_squeue_line(fmt, self._squeue_fields(job, job.job_id)))
        out = []
        for line in lines:
            if isinstance(line, tuple):
                group = collapsed[line[1]]
                out.append(_squeue_line(fmt, self._squeue_fields(group[0], f"{line[1]}_[{_ranges([j.array_task for j in group])}]")))
            else:
                out.append(line)
        return 0, "".join(l + "\n" for l in out), ""

    def _squeue_fields(self, job: FakeJob, shown_id: str) -> Dict[str, str]:
        a = self._ctld_attempt(job)
        state = self._ctld_state(job)
        if state == "PENDING":
            start = "N/A" if job.held or job.begin is None else _ts(job.begin)
        else:
            start = _ts(a.start)
        nodes = compress_hostlist(a.nodes) if state != "PENDING" else ""
        reason = job.reason if state == "PENDING" else "None"
        elapsed = _elapsed(self.now - a.start) if a.start is not None and a.end is None else "0:00"
        return {"i": shown_id, "A": job.raw_id, "j": job.name, "T": state, "t": _SHORT.get(state, state),
                "N": nodes, "S": start, "r": reason, "P": job.partition, "k": job.comment or "(null)",
                "u": self.owner_of(job)[0], "D": str(job.num_nodes), "M": elapsed,
                "R": nodes if state != "PENDING" else f"({reason})",
                "F": job.array_base or job.raw_id, "K": str(job.array_task) if job.array_task is not None else "N/A"}

    # --- scancel ------------------------------------------------------------------------------------------
    def _cmd_scancel(self, args: List[str]) -> Tuple[int, str, str]:
        if any(a.startswith("--signal") for a in args):
            return 0, "", ""  # only signals the job's processes (recorded in calls); the job goes on
        only_state = None  # --state=PENDING / -t PENDING: only jobs in that state are cancelled
        specs = []
        for i, a in enumerate(args):
            if a.startswith("--state="):
                only_state = a.split("=", 1)[1].upper()
            elif a in ("-t", "--state"):
                only_state = args[i + 1].upper()
            elif not a.startswith("-") and not (i > 0 and args[i - 1] in ("-t", "--state")):
                specs.append(a)
        for spec in specs:
            for part in spec.split(","):
                for job in self._select(part):
                    if job.purged or job.state not in ACTIVE:
                        continue  # scancel of an ended or unknown job: rc 0, silent (22.05)
                    if only_state is not None and self._ctld_state(job) != only_state:
                        continue
                    a = job.attempt
                    a.cancelled_by = self.uid
                    if job.state == "PENDING":
                        a.state, a.end, a.never_started = "CANCELLED", self.now, True
                        a.exit_code = job.last_exit
                        job.reason = "None"
                    else:
                        self._end(job.job_id, "CANCELLED", "0:0", batch=("CANCELLED", "0:15"),
                                  steps=("CANCELLED", "0:15"))
                        a.cancelled_by = self.uid
        return 0, "", ""

    # --- scontrol -----------------------------------------------------------------------------------------
    def _cmd_scontrol(self, args: List[str]) -> Tuple[int, str, str]:
        oneliner = False
        while args and args[0].startswith("-"):
            if args[0] in ("--oneliner", "-o"):
                oneliner = True
            else:
                raise AssertionError(f"FakeSlurm: scontrol option {args[0]!r} is not modelled")
            args = args[1:]
        verb = args[0].lower() if args else ""
        if verb == "show" and len(args) >= 2 and args[1] == "job":
            return self._show_job(args[2] if len(args) > 2 else None, oneliner)
        if verb in ("requeue", "requeuehold", "release", "hold"):
            errors = []
            for spec in args[1].split(","):
                err = getattr(self, "_verb_" + verb)(spec)
                if err:
                    errors.append(err)
            if errors:
                return 1, "", "".join(e + "\n" for e in errors)
            return 0, "", ""
        if verb == "update":
            return self._update(args[1:])
        raise AssertionError(f"FakeSlurm: scontrol {' '.join(args)!r} is not modelled")

    def _requeue_one(self, job: FakeJob) -> Optional[str]:
        if job.state == "PENDING":
            return f"Job is pending execution for job {job.job_id}"
        a = job.attempt
        if job.state == "RUNNING":
            self._end(job.job_id, "REQUEUED", "0:0", batch=("CANCELLED", "0:15"), steps=("CANCELLED", "0:15"))
        else:  # an ended job can be requeued too: its record becomes REQUEUED, exit code kept
            a.state, a.end, a.cancelled_by = "REQUEUED", self.now, None
        self._requeue(job)
        return None

    def _verb_requeue(self, spec: str) -> Optional[str]:
        jobs = [j for j in self._select(spec) if not j.purged]
        if not jobs:
            return f"Invalid job id specified for job {spec}"
        for job in jobs:
            err = self._requeue_one(job)
            if err:
                return err
        return None

    def _verb_requeuehold(self, spec: str) -> Optional[str]:
        """``scontrol requeuehold``: a requeue whose new attempt is held (PENDING, JobHeldUser) until released."""
        err = self._verb_requeue(spec)
        if err is None:
            for job in (j for j in self._select(spec) if not j.purged):
                job.held, job.reason = True, "JobHeldUser"
        return err

    def _verb_release(self, spec: str) -> Optional[str]:
        jobs = [j for j in self._select(spec) if not j.purged]
        if not jobs:
            return f"Invalid job id specified for job {spec}\nslurm_suspend error: Invalid job id specified"
        if all(j.state not in ACTIVE for j in jobs):
            return f"Job has already finished for job {spec}\nslurm_suspend error: Job has already finished"
        for job in jobs:
            if job.held:
                job.held = False
                job.reason = self._pending_reason(job)
        return None

    def _verb_hold(self, spec: str) -> Optional[str]:
        jobs = [j for j in self._select(spec) if not j.purged]
        if not jobs:
            return f"Invalid job id specified for job {spec}"
        for job in jobs:
            if job.state == "PENDING":
                job.held, job.reason = True, "JobHeldUser"
        return None

    def _update(self, args: List[str]) -> Tuple[int, str, str]:
        pairs = [a.split("=", 1) for a in args]
        keys = {k.lower(): v for k, v in pairs}
        spec = keys.pop("jobid", None)
        if spec is None:
            raise AssertionError(f"FakeSlurm: scontrol update {args} without JobId= is not modelled")
        jobs = [j for j in self._select(spec) if not j.purged]
        if not jobs:
            return 1, "", f"Invalid job id specified for job {spec}\n"
        for job in jobs:
            if job.state not in ACTIVE:
                return 1, "", f"Job has already finished for job {spec}\n"
            if job.state != "PENDING" and not self._no_change(job, keys):
                # (22.05 accepts an update that changes nothing, e.g. the same ExcNodeList again)
                return 1, "", f"Job is no longer pending execution for job {spec}\n"
        for job in jobs:
            for key, value in keys.items():
                if key == "starttime":
                    job.begin = self._parse_time(value)
                elif key == "excnodelist":
                    job.exclude = _expand(value)
                elif key == "comment":
                    job.comment = value
                elif key == "timelimit":
                    job.time_limit = value
                else:
                    raise AssertionError(f"FakeSlurm: scontrol update {key}= is not modelled")
            if not job.held:
                job.reason = self._pending_reason(job)
        return 0, "", ""

    @staticmethod
    def _no_change(job: FakeJob, keys: Dict[str, str]) -> bool:
        current = {"excnodelist": sorted(job.exclude), "comment": job.comment, "timelimit": job.time_limit}
        wanted = {k: sorted(_expand(v)) if k == "excnodelist" else v for k, v in keys.items()}
        return all(k in current and current[k] == v for k, v in wanted.items())

    def _show_job(self, spec: Optional[str], oneliner: bool) -> Tuple[int, str, str]:
        if spec is None:
            jobs = [j for j in self.jobs.values() if not j.purged]
            if not jobs:
                return 0, "No jobs in the system\n", ""
        else:
            jobs = [j for j in self._select(spec) if not j.purged]
            if not jobs:
                return 1, "", "slurm_load_jobs error: Invalid job id specified\n"
        out = []
        for job in jobs:
            pairs = self._scontrol_pairs(job)
            if oneliner:
                out.append(" ".join(f"{k}={v}" for k, v in pairs) + " \n")
            else:
                chunks = [pairs[i:i + 4] for i in range(0, len(pairs), 4)]
                out.append("\n".join(("" if n == 0 else "   ") + " ".join(f"{k}={v}" for k, v in c)
                                     for n, c in enumerate(chunks)) + "\n\n")
        return 0, "".join(out), ""

    def _scontrol_pairs(self, job: FakeJob) -> List[Tuple[str, str]]:
        a = self._ctld_attempt(job)
        state = self._ctld_state(job)
        exit_code = ("0:15" if state == "CANCELLED" and not a.never_started
                     else job.last_exit if state == "PENDING" else a.exit_code)
        eligible = job.begin if job.begin is not None else job.submit_time
        if state == "PENDING":
            start, end, run = _ts(eligible) if not job.held else "Unknown", "Unknown", "00:00:00"
        else:
            start = _ts(a.start) if a.start is not None else _ts(a.end)
            end = _ts(a.end)
            run = _elapsed((a.end if a.end is not None else self.now) - a.start) if a.start is not None else "00:00:00"
        pairs = [("JobId", job.raw_id)]
        if job.array_base is not None:
            pairs += [("ArrayJobId", job.array_base), ("ArrayTaskId", str(job.array_task))]
        user, uid = self.owner_of(job)
        pairs += [("JobName", job.name), ("UserId", f"{user}({uid})"), ("GroupId", f"{user}({uid})"),
                  ("JobState", state), ("Reason", job.reason), ("Dependency", "(null)"), ("Requeue", "1"),
                  ("Restarts", str(job.restarts)), ("BatchFlag", "1"), ("ExitCode", exit_code), ("RunTime", run),
                  ("TimeLimit", job.time_limit), ("SubmitTime", _ts(job.submit_time)), ("EligibleTime", _ts(eligible)),
                  ("StartTime", start), ("EndTime", end), ("Partition", job.partition),
                  ("ReqNodeList", compress_hostlist(job.nodelist) if job.nodelist else "(null)"),
                  ("ExcNodeList", compress_hostlist(job.exclude) if job.exclude else "(null)"),
                  ("NodeList", compress_hostlist(a.nodes) if state != "PENDING" and a.nodes else "")]
        if state != "PENDING" and a.nodes:
            pairs.append(("BatchHost", a.nodes[0]))
        pairs += [("NumNodes", str(job.num_nodes)), ("Comment", job.comment or "(null)"),
                  ("WorkDir", job.workdir), ("StdErr", job.stderr), ("StdIn", "/dev/null"), ("StdOut", job.stdout)]
        if not job.comment:
            pairs = [p for p in pairs if p[0] != "Comment"]
        return pairs

    # --- sinfo --------------------------------------------------------------------------------------------
    def _cmd_sinfo(self, args: List[str]) -> Tuple[int, str, str]:
        opts = _options(args, with_value={"--format": "format", "-o": "format", "--partition": "partition",
                                          "-p": "partition"},
                        flags={"--noheader": "h", "-h": "h", "--summarize": "s", "-s": "s"}, command="sinfo")
        fmt = opts.get("format", "%P|%a|%l|%D|%T|%N")
        values = {"P": None, "a": "up", "l": "infinite", "D": str(len(self.nodes)), "T": "idle",
                  "N": compress_hostlist(self.nodes), "m": str(self.mem_mb), "c": str(self.cpus), "G": "(null)"}
        lines = []
        for n, part in enumerate(self.partitions):
            row = dict(values, P=part + ("*" if n == 0 else ""))
            lines.append(re.sub(r"%[.\d]*(\w)", lambda m: row.get(m.group(1), ""), fmt))
        return 0, "".join(l + "\n" for l in lines), ""


def _options(args: List[str], with_value: Dict[str, str], flags: Dict[str, str], command: str) -> Dict[str, str]:
    opts: Dict[str, str] = {}
    i = 0
    while i < len(args):
        a = args[i]
        key, eq, val = a.partition("=")
        if a in flags:
            opts[flags[a]] = "1"
        elif eq and key in with_value:
            opts[with_value[key]] = val
        elif a in with_value:
            opts[with_value[a]] = args[i + 1]
            i += 1
        else:
            raise AssertionError(f"FakeSlurm: {command} argument {a!r} is not modelled")
        i += 1
    return opts


def _squeue_line(fmt: str, values: Optional[Dict[str, str]]) -> str:
    def one(m: "re.Match[str]") -> str:
        code = m.group(2)
        if code not in _SQUEUE_HEADERS:
            raise AssertionError(f"FakeSlurm: squeue format %{code} is not modelled")
        text = _SQUEUE_HEADERS[code] if values is None else values[code]
        width = m.group(1).lstrip(".")
        return text[:int(width)].rjust(int(width)) if width else text
    return re.sub(r"%(\.?\d*)(\w)", one, fmt)


def _array_indices(spec: str) -> List[int]:
    spec = spec.split("%")[0]
    out: List[int] = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi) + 1) if hi else [int(lo)])
    return out


def _ranges(numbers: Sequence[int]) -> str:
    nums = sorted(numbers)
    parts, lo, hi = [], nums[0], nums[0]
    for n in nums[1:]:
        if n == hi + 1:
            hi = n
        else:
            parts.append(str(lo) if lo == hi else f"{lo}-{hi}")
            lo = hi = n
    parts.append(str(lo) if lo == hi else f"{lo}-{hi}")
    return ",".join(parts)

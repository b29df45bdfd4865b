"""SIGKILL the watcher at every point between a decision and its effects; every decision is carried out once.

Each cycle: a run's job ends (a GPU OOM -> resubmit, or a time limit -> requeue + expedite). A watcher
process ticks with ``HPC_AGENT_CRASH_AT`` set and is SIGKILLed at that point (a real ``kill -9``, from
``crash_point``); a fresh watcher process then starts (start-up reconcile, ticks, the clock moved past the
sbatch grace). Slurm is the canonical fake (tests/helpers/fake_slurm.py, held to the real cluster by
tests/cluster/test_slurm_contract.py), persisted to a file after every command as slurmctld persists its state,
so what the killed process did to "Slurm" survives it. Counted over >= 50 cycles: double submissions or
requeues, and lost decisions (recorded but never carried out, or not in events.jsonl exactly once).
"""
from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import signal
from pathlib import Path

import pytest

from hpc_agent.config.load import build_config, write_run_config
from hpc_agent.jobs.submission import CRASH_ENV, crash_point, record_job
from hpc_agent.slurm.job_match import job_name_for
from hpc_agent.state.journal import Journal
from hpc_agent.state.ledger import Ledger
from hpc_agent.state.lifecycle import Event, EventKind
from hpc_agent.watcher.loop import Watcher
from tests.helpers.fake_slurm import FakeSlurm

OOM_LOG = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
           "79.15 GiB of which 0 bytes is free.\n[hpc_agent] out of memory at step 4; exiting 3\n")
TIMEOUT_LOG = "[hpc_agent] step 40 loss 2.0\n"
POINTS = [("oom", "after_journal"), ("oom", "after_intent"), ("oom", "after_submit"), ("oom", "before_audit"),
          ("timeout", "after_journal"), ("timeout", "after_requeue"), ("timeout", "before_audit")]
CYCLES = 56  # 8 per kill point


class PersistedSlurm:
    """The fake, saved to ``path`` after every command (before the caller can be killed)."""

    def __init__(self, path: Path, now: float):
        self.path = path
        self.fake: FakeSlurm = pickle.loads(path.read_bytes())
        self.fake._now = now

    def _save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_bytes(pickle.dumps(self.fake))
        os.replace(tmp, self.path)

    def run(self, argv, check=True, timeout_s=None):
        try:
            return self.fake.run(argv, check=check, timeout_s=timeout_s)
        finally:
            self._save()

    def sacct(self, job_ids, fields=None, all_attempts=True):
        return self.fake.sacct(job_ids, **({"fields": fields} if fields else {}), all_attempts=all_attempts)


def fake_submit(slurm: PersistedSlurm):
    """submit_attempt's bookkeeping around a fake sbatch: intent, sbatch, job id (same kill points)."""
    def submit(ledger, run_id, run_dir, cfg, config_path, kind, reason):
        sid = ledger.record_intent(run_id, kind, str(config_path), reason=reason)
        crash_point("after_intent")
        job_id = slurm.run(["sbatch", "--parsable", "--job-name", job_name_for(run_id), "--wrap", "train"]).stdout.strip()
        crash_point("after_submit")
        record_job(ledger, sid, run_id, job_id)
        return job_id
    return submit


def _watch(root: Path, now: float, crash: str, ticks: int) -> None:
    """In a child process: a watcher over ``root`` that ticks ``ticks`` times (dies at ``crash`` if set)."""
    if crash:
        os.environ[CRASH_ENV] = crash
    slurm = PersistedSlurm(root / "slurm.pickle", now)
    clock = lambda: now  # noqa: E731
    ledger = Ledger(root / "ledger.sqlite", clock=clock)
    watcher = Watcher(ledger, slurm, runs_root=root, clock=clock, submit=fake_submit(slurm), out=lambda line: None)
    watcher.reconcile()
    for _ in range(ticks):
        watcher.tick()
    ledger.close()


def _in_child(*args) -> int:
    proc = multiprocessing.get_context("fork").Process(target=_watch, args=args)
    proc.start()
    proc.join(60)
    return proc.exitcode


def _new_run(root: Path, ledger: Ledger, i: int, kind: str) -> tuple:
    fake: FakeSlurm = pickle.loads((root / "slurm.pickle").read_bytes())
    fake._now = ledger.clock()
    run_id = f"r{i:03d}"
    run_dir = root / run_id
    (run_dir / "slurm").mkdir(parents=True)
    cfg = build_config([{"run": {"name": "t"}, "train": {"micro_batch_size": 8, "grad_accum_steps": 1}}])
    path = write_run_config(run_dir, cfg)
    job = fake.submit(job_name_for(run_id))
    fake.start(job)
    ledger.add_run(run_id, "t", str(run_dir))
    record_job(ledger, ledger.record_intent(run_id, "slurm", str(path), "submit"), run_id, job)
    ledger.advance(run_id, Event(EventKind.STARTED, job))
    (run_dir / "slurm" / f"{job}_0_log.out").write_text(OOM_LOG if kind == "oom" else TIMEOUT_LOG)
    fake.fail(job, 3) if kind == "oom" else fake.timeout(job)
    (root / "slurm.pickle").write_bytes(pickle.dumps(fake))
    return run_id, run_dir, job


def test_every_recorded_decision_is_carried_out_exactly_once_across_sigkills(tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    (root / "slurm.pickle").write_bytes(pickle.dumps(FakeSlurm(first_job_id=1000)))
    now = [FakeSlurm().now]
    ledger = Ledger(root / "ledger.sqlite", clock=lambda: now[0])
    doubles, lost, killed = [], [], 0
    for i in range(CYCLES):
        kind, point = POINTS[i % len(POINTS)]
        run_id, run_dir, job = _new_run(root, ledger, i, kind)
        code = _in_child(root, now[0], point, 1)
        assert code == -signal.SIGKILL, f"cycle {i}: the watcher was not killed at {point} (exit {code})"
        killed += 1
        now[0] += 5
        assert _in_child(root, now[0], "", 2) == 0  # restarted: young intents are left alone
        now[0] += 200  # past the sbatch grace: intents without a job id are settled with Slurm
        assert _in_child(root, now[0], "", 2) == 0
        fake: FakeSlurm = pickle.loads((root / "slurm.pickle").read_bytes())
        decisions = ledger.decisions(run_id)
        effects = Journal(ledger).effects(run_id)
        events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()] \
            if (run_dir / "events.jsonl").exists() else []
        decided = [e for e in events if "decision" in e]
        if kind == "oom":
            acted = [a for a in fake.ran("sbatch") if job_name_for(run_id) in a]
        else:
            acted = [a for a in fake.requeues if a == job]
        if len(acted) > 1 or len(decisions) > 1 or len(decided) > 1:
            doubles.append((i, point, len(acted), len(decisions), len(decided)))
        if len(acted) != 1 or len(decisions) != 1 or len(decided) != 1 or any(s != "done" for _, _, s in effects) \
                or ledger.run(run_id).phase != "pending":
            lost.append((i, point, len(acted), len(decisions), len(decided), effects, ledger.run(run_id).phase))
        now[0] += 60
    print(f"\n{CYCLES} cycles, {killed} SIGKILLs at {sorted({p for _, p in POINTS})}: "
          f"double submissions/requeues {len(doubles)}, lost decisions {len(lost)}")
    assert killed >= 50
    assert doubles == [] and lost == []


@pytest.mark.parametrize("point", ["after_journal", "before_audit"])
def test_a_second_watcher_finds_nothing_left_to_do(tmp_path, point):
    """After the recovery above, more ticks change nothing: no effect is carried out twice later on."""
    root = tmp_path / "runs"
    root.mkdir()
    (root / "slurm.pickle").write_bytes(pickle.dumps(FakeSlurm(first_job_id=1000)))
    now = [FakeSlurm().now]
    ledger = Ledger(root / "ledger.sqlite", clock=lambda: now[0])
    run_id, _, job = _new_run(root, ledger, 0, "timeout")
    assert _in_child(root, now[0], point, 1) == -signal.SIGKILL
    assert _in_child(root, now[0] + 1, "", 3) == 0
    before = pickle.loads((root / "slurm.pickle").read_bytes()).calls
    assert _in_child(root, now[0] + 300, "", 3) == 0
    after = pickle.loads((root / "slurm.pickle").read_bytes()).calls
    acted = [argv for argv in after[len(before):] if argv[0] in ("sbatch", "scancel") or argv[1:2] == ["requeue"]]
    assert acted == []

"""Running runs on the fake Slurm, as ``submit`` leaves them, for the watcher tests that drive ``Watcher.tick()``
over several runs (tests/unit/test_watcher_isolation.py and the attacks in tests/security/)."""
from __future__ import annotations

from pathlib import Path
from typing import List, Tuple

from hpc_agent.config.load import build_config, write_run_config
from hpc_agent.core import rundir
from hpc_agent.jobs.submission import record_job
from hpc_agent.slurm.job_match import job_name_for
from hpc_agent.state import run_config
from hpc_agent.state.ledger import Ledger
from hpc_agent.state.lifecycle import Event, EventKind
from hpc_agent.watcher.loop import Watcher
from tests.helpers.fake_slurm import FakeSlurm

PREEMPTION_LOG = "[hpc_agent] signal SIGTERM at step 12: checkpoint step_00000012 complete in 0.0s; exiting 75\n"
"""The job's last line at a preemption: the watcher expedites the requeued job."""


def running_run(root: Path, ledger: Ledger, slurm: FakeSlurm, run_id: str, log: str = PREEMPTION_LOG,
                recorded: bool = True) -> Tuple[Path, str]:
    """A run whose job is running, with ``log`` as its rank-0 log; returns the run dir and the job id.
    ``recorded`` False: a run submitted before the ledger kept configs (the watcher adopts its config.yaml on
    first use: hpc_agent/state/run_config.py), so a broken config.yaml is a problem of the run."""
    run_dir = root / run_id
    rundir.slurm_dir(run_dir).mkdir(parents=True)
    cfg = build_config([{"run": {"name": run_id}}])
    path = write_run_config(run_dir, cfg)
    job = slurm.submit(job_name_for(run_id))
    slurm.start(job)
    ledger.add_run(run_id, run_id, str(run_dir))
    if recorded:
        run_config.record(ledger, run_id, cfg, "submitted (submit)")
    record_job(ledger, ledger.record_intent(run_id, "slurm", str(path), "submit"), run_id, job)
    ledger.advance(run_id, Event(EventKind.STARTED, job))
    (rundir.slurm_dir(run_dir) / f"{job}_0_log.out").write_text(log)
    return run_dir, job


def fake_world(tmp_path: Path) -> Tuple[Path, Ledger, FakeSlurm, Watcher, List[str]]:
    """(runs root, ledger, fake Slurm, watcher, the watcher's output lines), all on the fake's one clock."""
    slurm = FakeSlurm()
    root = tmp_path / "runs"
    ledger = Ledger(root / "ledger.sqlite", clock=lambda: slurm.now)
    out: List[str] = []
    watcher = Watcher(ledger, slurm, runs_root=root, clock=lambda: slurm.now, out=out.append)
    return root, ledger, slurm, watcher, out

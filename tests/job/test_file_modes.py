"""Least privilege (issue 16, must-show 7): what hpc_agent creates is 0600/0700, or 0640/0750 with
``run.group_readable``, whatever the umask (022 or a careless 000).

The end-to-end test submits a real run through the local executor (the job trains, checkpoints and logs
TensorBoard), then drives one watcher tick that decides, journals, resubmits and appends events.jsonl; then
it stats every file and folder under the runs root.
"""
from __future__ import annotations

import os
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

from hpc_agent.core import filemodes
from hpc_agent.core.filemodes import make_dir, restricted_umask, shared_with_group
from hpc_agent.core.fsutil import atomic_write_text, hold_lock
from hpc_agent.core.nfs_files import publish_exclusive
from hpc_agent.state.journal import _append
from hpc_agent.state.ledger import Ledger


@contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.mark.parametrize("dir_mode, shared", [
    (0o700, False), (0o750, True), (0o770, True), (0o2770, True), (0o2750, True),
    (0o755, False),   # others may enter: a plain mkdir under umask 022, not a choice to share
    (0o775, False), (0o777, False), (0o710, False), (0o740, False), (0o751, False), (0o1777, False),
])
def test_which_folders_count_as_shared_with_the_group(dir_mode, shared):
    assert shared_with_group(dir_mode) is shared


@pytest.mark.parametrize("mask", [0o022, 0o000, 0o077])
def test_make_dir_sets_modes_explicitly_whatever_the_umask(tmp_path, mask):
    with umask(mask):
        private = make_dir(tmp_path / "a" / "b", group=False)
        shared = make_dir(tmp_path / "s" / "t", group=True)
        inherited = make_dir(shared / "child")  # group=None: follows the folder it is made in
    assert (mode(tmp_path / "a"), mode(private)) == (0o700, 0o700)
    assert (mode(tmp_path / "s"), mode(shared), mode(inherited)) == (0o750, 0o750, 0o750)


def test_make_dir_leaves_existing_folders_alone_and_keeps_setgid(tmp_path):
    mine = tmp_path / "users"
    mine.mkdir()
    os.chmod(mine, 0o755)
    made = make_dir(mine / "runs")            # in a 0755 folder: private
    assert (mode(mine), mode(made)) == (0o755, 0o700)
    project = tmp_path / "project"
    project.mkdir()
    os.chmod(project, 0o2770)
    sub = make_dir(project / "runs")
    assert mode(sub) & 0o777 == 0o750 and mode(project) == 0o2770
    assert mode(sub) & stat.S_ISGID, "a project directory's setgid bit must survive the chmod"
    with pytest.raises(FileExistsError):
        make_dir(made, exist_ok=False)


@pytest.mark.parametrize("mask", [0o022, 0o000])
@pytest.mark.parametrize("group", [False, True])
def test_every_writer_creates_files_with_the_folders_mode(tmp_path, mask, group):
    want = 0o640 if group else 0o600
    with umask(mask):
        folder = make_dir(tmp_path / "root", group=group)
        atomic_write_text(folder / "config.yaml", "a: 1\n")
        _append(folder / "events.jsonl", '{"seq": 1}\n')
        assert publish_exclusive(folder / "train.lease", "{}", "t1")
        lock = hold_lock(folder / "watch.lock")
        ledger = Ledger(folder / "ledger.sqlite")
        ledger.add_run("r", "r", str(folder))  # WAL: -wal and -shm exist while the ledger is open
        created = sorted(p for p in folder.iterdir())
        modes = {p.name: mode(p) for p in created}
        ledger.close()
        lock.close()
    assert {"config.yaml", "events.jsonl", "train.lease", "watch.lock", "ledger.sqlite"} <= set(modes)
    assert modes == {name: want for name in modes}, modes


def test_an_old_world_readable_ledger_is_tightened_on_open(tmp_path):
    path = tmp_path / "root" / "ledger.sqlite"
    Ledger(make_dir(path.parent) / "ledger.sqlite").close()
    os.chmod(path, 0o644)
    Ledger(path).close()
    assert mode(path) == 0o600


# --- end to end: submit (local executor, the job runs) + a watcher tick ------------------------------------
def _bad_modes(root: Path, group: bool, planted: set) -> List[Tuple[str, str]]:
    """Every path under ``root`` whose mode is not what the rule says (links carry no mode of their own)."""
    want_file, want_dir = (0o640, 0o750) if group else (0o600, 0o700)
    bad = [] if mode(root) == want_dir else [(str(root), oct(mode(root)))]
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(top) / name
            if path in planted or path.is_symlink():
                continue
            want = want_dir if path.is_dir() else want_file
            if mode(path) != want:
                bad.append((str(path.relative_to(root)), oct(mode(path))))
    return bad


@pytest.mark.parametrize("mask, group", [(0o022, False), (0o000, False), (0o000, True), (0o022, True)])
def test_a_submitted_run_and_a_watcher_tick_create_nothing_readable_by_others(tmp_path, mask, group):
    from hpc_agent import submit
    from hpc_agent.config.load import build_config
    from hpc_agent.slurm.job_match import job_name_for
    from hpc_agent.config.load import write_run_config
    from hpc_agent.watcher.loop import Watcher
    from tests.helpers.fake_slurm import FakeSlurm
    from tests.unit.test_watcher import OOM_LOG, FakeSubmitter

    root = tmp_path / "runs"
    with umask(mask):
        code = submit.main(["quickstart", "--executor", "local", "--wait", f"run.runs_root={root}",
                            f"run.group_readable={str(group).lower()}", "train.max_steps=4"])
        assert code == 0
        # The watcher's tick on the same root: an OOM'd Slurm job of a second run -> decision, journal,
        # config.<n>.yaml, resubmission, events.jsonl.
        slurm = FakeSlurm()
        ledger = Ledger.in_runs_root(root)
        ledger.clock = lambda: slurm.now
        run_dir = make_dir(root / "oom-run", group=group)
        cfg = build_config([{"run": {"name": "t"}, "train": {"micro_batch_size": 8, "grad_accum_steps": 1}}])
        write_run_config(run_dir, cfg)
        ledger.add_run("oom-run", "t", str(run_dir))
        sid = ledger.record_intent("oom-run", "slurm", str(run_dir / "config.yaml"), "submit")
        job_id = slurm.submit(job_name_for("oom-run"))
        ledger.record_submitted(sid, job_id)
        ledger.set_phase("oom-run", "running")
        slurm.start(job_id)
        slurm.advance(60)
        log = make_dir(run_dir / "slurm") / f"{job_id}_0_log.out"
        log.write_text(OOM_LOG.format(job=job_id))  # the job's log: planted by the test, not checked
        slurm.step(job_id, "python")
        slurm.end_step(job_id, "0", "FAILED", "3:0")
        slurm.fail(job_id, 3)
        submitter = FakeSubmitter(slurm)
        watcher = Watcher(ledger, slurm, runs_root=root, clock=lambda: slurm.now, submit=submitter,
                          out=lambda line: None)
        watcher.tick()
        assert len(submitter.calls) == 1, "the tick did not resubmit: it would check less than it claims"
        bad = _bad_modes(root, group, planted={log})
        ledger.close()
    run_dirs = [p for p in root.iterdir() if p.is_dir()]
    assert len(run_dirs) == 2
    made = {p.name for p in root.rglob("*")}
    for expected in ("ledger.sqlite", "config.yaml", "run.json", "events.jsonl", "COMPLETE.json"):
        assert expected in made, f"{expected} was not created: the test would check nothing about it"
    assert any(n.startswith("events.out.tfevents") for n in made) and any(n.endswith("_log.out") for n in made)
    assert bad == [], f"umask {mask:03o}, group_readable={group}: wrong modes {bad}"


def test_restricted_umask_is_what_third_party_files_get(tmp_path):
    with umask(0o000):
        with restricted_umask(False):
            (tmp_path / "p").write_text("x")
        with restricted_umask(True):
            (tmp_path / "g").write_text("x")
        assert os.umask(0o000) == 0o000  # restored
    assert (mode(tmp_path / "p"), mode(tmp_path / "g")) == (0o600, 0o640)
    assert filemodes.umask_for(False) == 0o077

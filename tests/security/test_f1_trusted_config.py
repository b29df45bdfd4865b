"""Finding 1: the watcher ran a command named in a job-writable file, and resubmitted whatever config.yaml the run
directory held last. Now the config it acts on is the ledger's (hpc_agent/state/run_config.py), the job's repairs
reach it as allow-listed journal records, and a runs root or run directory that others can write is refused.

Each test plants what the attacker (the job's own code, or another member of the runs root's group) can write,
and checks that nothing ran, the watcher stayed up and the other runs went on."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_agent.config.load import build_config, load_run_config, write_run_config
from hpc_agent.core import rundir
from hpc_agent.state import run_config
from hpc_agent.state.journal import Journal
from tests.security.conftest import share_with_group
from tests.unit.test_watcher import CODE_LOG, OOM_LOG, add_run, world  # noqa: F401 (world: the fixture)

REPO = Path(__file__).resolve().parents[2]


def plant(run_dir: Path, marker: Path, **sections) -> None:
    """What the job (or a group member) writes into the run's config.yaml: a notify command, a webhook and a
    training command that would each leave ``marker`` if anything ran them."""
    evil = ["sh", "-c", f"touch {marker}"]
    layer = {"run": {"name": "t"}, "notify": {"command": evil}, "train": {"command": evil},
             "slurm": {"python": "/tmp/evil/bin/python"}}
    for key, value in sections.items():
        layer.setdefault(key, {}).update(value)
    write_run_config(run_dir, build_config([layer]))


def audit(world, run_id):  # noqa: F811
    return [rec for _, _, rec in Journal(world["ledger"]).audit_records(run_id)]


def test_a_notify_command_planted_in_the_run_dir_never_runs_and_the_owners_does(world, tmp_path):  # noqa: F811
    slurm, watcher = world["slurm"], world["watcher"]
    planted, owners = tmp_path / "planted-ran", tmp_path / "owner-notified"
    r_dir, r_job = add_run(world, "r", log=CODE_LOG)  # will give up: a code error notifies
    plant(r_dir, planted)
    o_dir, o_job = add_run(world, "o", log=CODE_LOG)  # the owner's own notify command, recorded at submit
    run_config.record(world["ledger"], "o", build_config([{"run": {"name": "t"}, "notify": {
        "command": ["sh", "-c", f"touch {owners}"]}}]), "submitted (submit)")
    _, s_job = add_run(world, "s")  # an innocent bystander, still running
    slurm.fail(r_job, 1)
    slurm.fail(o_job, 1)
    watcher.tick()
    watcher.tick()
    assert not planted.exists(), "a command written into a run dir ran as the watcher's user"
    assert owners.exists(), "the owner's own notify command (the positive control) did not run"
    assert world["ledger"].run("r").phase == "stopped" and world["ledger"].run("s").phase == "running"


def test_a_resubmission_uses_the_ledgers_config_not_the_planted_one(world, tmp_path):  # noqa: F811
    slurm, watcher = world["slurm"], world["watcher"]
    planted = tmp_path / "planted-ran"
    run_dir, job = add_run(world, "r", log=OOM_LOG)
    _, other = add_run(world, "s", log=OOM_LOG)
    plant(run_dir, planted, train={"micro_batch_size": 64})
    slurm.fail(job, 3)
    slurm.fail(other, 3)
    watcher.tick()
    by_run = {c["run_id"]: c["cfg"] for c in world["submit"].calls}
    assert set(by_run) == {"r", "s"}  # both repaired: the planted run and the bystander
    cfg = by_run["r"]
    assert not cfg.train.command and cfg.slurm.python != "/tmp/evil/bin/python" and cfg.notify.command is None
    assert cfg.train.micro_batch_size == 4  # the repair of the submitted 8, not of the planted 64
    job_copy = load_run_config(run_dir)  # the job's copy was rewritten from the watcher's own
    assert not job_copy.train.command and job_copy.train.micro_batch_size == 4
    assert not planted.exists()


def _in_job_line(job: str, seq: int, patch: dict) -> str:
    return json.dumps({"seq": seq, "job_id": job, "attempt": 0, "step": 7, "cause": "gpu_oom",
                       "action": "in_job_repair", "patch": patch, "from": {}, "rollback_to_step": None,
                       "evidence": ["CUDA out of memory"], "reason": "halve the micro-batch", "at": 1.0,
                       "budget_left": 1}) + "\n"


def test_the_jobs_repairs_reach_the_watcher_only_through_the_allow_list(world, tmp_path):  # noqa: F811
    slurm, watcher, ledger = world["slurm"], world["watcher"], world["ledger"]
    planted = tmp_path / "planted-ran"
    run_dir, job = add_run(world, "r", log=OOM_LOG)
    journal = rundir.in_job_journal_path(run_dir)
    journal.parent.mkdir(parents=True, exist_ok=True)
    # The journal's own reader takes only plain train.* scalars; of those, a workload names code to import.
    journal.write_text(_in_job_line(job, 1, {"train.micro_batch_size": 2, "train.grad_accum_steps": 4,
                                             "train.workload": "evil_pkg.payload:build",
                                             "train.snapshot_code": False}))
    plant(run_dir, planted)
    watcher.tick()
    cfg = run_config.current(ledger, "r")
    assert (cfg.train.micro_batch_size, cfg.train.grad_accum_steps) == (2, 4)  # the repair was taken
    assert cfg.train.workload == "gpt" and cfg.train.snapshot_code is True
    (refusal,) = [r for r in audit(world, "r") if r.get("action") == "refused_in_job_patch"]
    assert refusal["refused_keys"] == ["train.snapshot_code", "train.workload"]
    slurm.fail(job, 3)  # a later resubmission starts from the watcher's copy
    watcher.tick()
    (call,) = world["submit"].calls
    assert call["cfg"].train.workload == "gpt" and call["cfg"].slurm.python != "/tmp/evil/bin/python"
    assert not call["cfg"].train.command
    assert not planted.exists()


def test_a_run_recorded_before_the_ledger_kept_configs_adopts_its_config_once_audited(world):  # noqa: F811
    ledger = world["ledger"]
    run_dir, _ = add_run(world, "r")
    ledger.db.execute("DELETE FROM run_configs WHERE run_id = 'r'")  # as an upgraded ledger has it
    cfg = run_config.current(ledger, "r", run_dir)
    assert cfg.train.micro_batch_size == 8
    write_run_config(run_dir, build_config([{"train": {"micro_batch_size": 64}}]))  # planted after adoption
    assert run_config.current(ledger, "r", run_dir).train.micro_batch_size == 8  # the ledger's copy rules
    assert [r["action"] for r in audit(world, "r")] == ["config_adopted"]


# --- another member of the runs root's group ------------------------------------------------------------------
def _python(*args: str, env_extra: dict, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), **env_extra}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120, env=env, cwd=cwd)


def test_a_group_writable_runs_root_is_refused_without_opt_in(tmp_path, other_user):
    root = tmp_path / "runs"
    root.mkdir()
    share_with_group(root, other_user)  # 2770, as a project directory
    out = _python("-m", "hpc_agent.watch", "--runs-root", str(root), "--once", env_extra={}, cwd=tmp_path)
    assert out.returncode == 2 and "group can write it" in out.stderr and "Traceback" not in out.stderr
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"run:\n  name: t\n  runs_root: {root}\n")
    out = _python("-m", "hpc_agent.submit", str(cfg), env_extra={}, cwd=tmp_path)
    assert out.returncode == 2 and "group can write it" in out.stderr and "Traceback" not in out.stderr
    assert sorted(p.name for p in root.iterdir()) == []  # nothing was made, nothing submitted


def test_a_run_dir_swapped_by_another_group_member_is_not_followed(world, tmp_path, other_user):  # noqa: F811
    """The reproduced attack: in a group-writable (opted-in) runs root, a member renames a run dir away and
    plants one of their own, with a config whose notify command would run as the watcher's user."""
    slurm, watcher, root = world["slurm"], world["watcher"], world["root"]
    marker = tmp_path / "planted-ran"
    run_dir, job = add_run(world, "r", log=CODE_LOG)
    _, bystander = add_run(world, "s", log=OOM_LOG)
    share_with_group(root, other_user)
    for d in (run_dir, root / "s"):
        os.chmod(d, 0o2750)  # what submit makes in a shared root: the group reads, only the owner writes
    os.chmod(tmp_path, 0o755)
    evil = tmp_path / "evil.yaml"
    evil.write_text(f"notify:\n  command: [sh, -c, 'touch {marker}']\ntrain:\n  command: [sh, -c, 'touch {marker}']\n")
    os.chmod(evil, 0o644)
    steps = [["mv", str(run_dir), str(root / "r.old")], ["mkdir", "-p", str(run_dir / "slurm")],
             ["cp", str(evil), str(run_dir / "config.yaml")],
             ["sh", "-c", f"printf '%s' '{OOM_LOG.format(job=job)}' > {run_dir}/slurm/{job}_0_log.out"]]
    for argv in steps:
        done = other_user.run(argv)
        assert done.returncode == 0, (argv, done.stderr)
    assert os.stat(run_dir).st_uid == other_user.uid
    slurm.fail(job, 3)
    slurm.fail(bystander, 3)
    watcher.tick()
    watcher.tick()
    assert not marker.exists()
    assert world["ledger"].run("r").phase == "needs_attention"
    (parked,) = [r for r in audit(world, "r") if "not followed" in json.dumps(r)]
    assert f"owned by uid {other_user.uid}" in json.dumps(parked)
    assert [c["run_id"] for c in world["submit"].calls] == ["s"]  # the bystander was repaired; r got nothing
    assert not any(Path(p).exists() for p in [run_dir / "events.jsonl"])  # nothing written into their dir


def test_a_ledger_another_user_planted_is_refused(tmp_path, other_user):
    root = tmp_path / "runs"
    root.mkdir()
    share_with_group(root, other_user)
    os.chmod(tmp_path, 0o755)
    done = other_user.run(["touch", str(root / "ledger.sqlite-wal")])
    assert done.returncode == 0, done.stderr
    out = _python("-m", "hpc_agent.watch", "--runs-root", str(root), "--once", "--shared-runs-root",
                  env_extra={}, cwd=tmp_path)
    assert out.returncode == 2 and f"owned by uid {other_user.uid}" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("key", sorted(run_config.IN_JOB_KEYS))
def test_every_allowed_key_is_a_setting_that_runs_nothing(key):
    section, name = key.split(".")
    assert section == "train" and name not in ("command", "workload", "script", "python")

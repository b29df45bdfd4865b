"""Issue 42, finding 6: the kill switch (``<runs root>/watch.paused``, ``watch --pause``) was not everywhere.
``submit`` ran sbatch while paused; the job's batch shell still ran ``scontrol requeue`` (and the successor
hand-over: sbatch, scontrol release, requeuehold) after a preemption's checkpoint.

Now submit refuses (exit 5, as a paused sweep; nothing created, no sbatch), the batch shell and a rank that
requeues itself check the pause file right before each scontrol (and exit 75 for the watcher to resume after
``--resume``), every watcher effect is refused at its one door (``effects.carry_out``) and audited, and a sweep
driver audits the refusal it stops on."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

from hpc_agent.cli import exit_status
from hpc_agent.config.load import load_config
from hpc_agent.core import handback
from hpc_agent.core.exit_codes import EXIT_SIGNALLED_AFTER_CHECKPOINT
from hpc_agent.jobs.executor import render_job_script
from hpc_agent.state import killswitch
from hpc_agent.state.journal import Journal
from hpc_agent.state.ledger import Ledger
from hpc_agent.watcher import effects
from tests.conftest import REPO
from tests.unit.test_watcher import add_run, world  # noqa: F401 - the fake-Slurm watcher fixture

OLD, NEW = "41", "57"
RC = EXIT_SIGNALLED_AFTER_CHECKPOINT


def _recorders(bin_dir: Path, calls: Path, answers: Dict[str, str] | None = None) -> Dict[str, str]:
    """Slurm commands first on PATH that append their argv to ``calls`` and answer ``answers[name]``."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in ("sbatch", "scontrol", "scancel", "squeue", "sacct", "sinfo", "srun"):
        answer = (answers or {}).get(name, "")
        (bin_dir / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {calls}\n'
                                    + (f'echo "{answer}"\n' if answer else "") + "exit 0\n")
        (bin_dir / name).chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def _called(calls: Path) -> List[str]:
    return calls.read_text().splitlines() if calls.exists() else []


def _runs_root(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    root.mkdir()
    Ledger.in_runs_root(root).close()  # a runs root: only one can be paused
    return root


# --- submit -------------------------------------------------------------------------------------------------
def test_submit_while_paused_runs_no_sbatch_and_leaves_no_run_dir(tmp_path):
    root = _runs_root(tmp_path)
    assert killswitch.switch(root, pause=True, out=lambda text: None) == 0
    calls = tmp_path / "calls"
    env = {**os.environ, **_recorders(tmp_path / "bin", calls, {"sbatch": "4242"}), "PYTHONPATH": str(REPO)}
    before = sorted(p.name for p in root.iterdir())
    proc = subprocess.run([sys.executable, "-m", "hpc_agent.submit", "quickstart", f"run.runs_root={root}",
                           "--executor", "slurm"], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == exit_status.PAUSED == 5, proc.stderr
    assert "paused" in proc.stderr and "watch.paused" in proc.stderr and "--resume" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not [c for c in _called(calls) if c.startswith(("sbatch", "scontrol", "scancel"))]
    assert sorted(p.name for p in root.iterdir()) == before  # no run dir, nothing else
    ledger = Ledger.in_runs_root(root)
    (record,) = [json.loads(r) for (r,) in ledger.db.execute("SELECT record FROM audit")]
    assert record["action"] == "refused" and record["refused"] == "submit" and record["by"]["process"] == "submit"
    assert ledger.db.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 0


def test_submit_after_resume_reaches_sbatch(tmp_path):
    """The control: the same command, not paused, gets to sbatch (here the fake's answer is not a job id
    submitit can use, so it fails after sbatch ran: what matters is that sbatch was called)."""
    root = _runs_root(tmp_path)
    calls = tmp_path / "calls"
    env = {**os.environ, **_recorders(tmp_path / "bin", calls, {"sbatch": "Submitted batch job 4242"}),
           "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-m", "hpc_agent.submit", "quickstart", f"run.runs_root={root}",
                    "--executor", "slurm"], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert [c for c in _called(calls) if c.startswith("sbatch")]


# --- the job's batch shell ------------------------------------------------------------------------------------
def _rendered_teardown(run_dir: Path, overrides: List[str], step: str = f"(exit {RC})") -> str:
    """The rendered job script's own lines that matter here: its exports (the run dir, the runs root) and its
    teardown, run after ``step``: by default a step that ended 75 (a signal's checkpoint is complete)."""
    cfg = load_config("quickstart", ["slurm.partition=low", "slurm.python=/usr/bin/python3", *overrides], env={})
    script = render_job_script(cfg, run_dir.name, run_dir, run_dir / "config.yaml")
    lines = script.splitlines()
    exports = [line for line in lines if re.match(r"^export HPC_AGENT_(RUN_DIR|RUNS_ROOT|SUCCESSOR_DIR)=", line)]
    assert f"export {handback.RUNS_ROOT_ENV}={run_dir.parent}" in exports  # the job knows its runs root
    teardown = lines[lines.index("# teardown") + 1:]
    assert any("scontrol requeue" in line for line in teardown)
    return "\n".join([*exports, step, *teardown])


@pytest.mark.parametrize("paused", [True, False])
def test_the_batch_shell_requeues_only_when_not_paused(tmp_path, paused):
    run_dir = tmp_path / "runs" / "quickstart-20260101-000000"
    run_dir.mkdir(parents=True)
    if paused:
        (run_dir.parent / "watch.paused").write_text("paused\n")
    calls = tmp_path / "calls"
    env = {**_recorders(tmp_path / "bin", calls), "SLURM_JOB_ID": OLD, "HOME": str(tmp_path)}
    proc = subprocess.run(["bash", "-c", _rendered_teardown(run_dir, [])], env=env, capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == RC, proc.stderr
    if paused:
        assert _called(calls) == []
        assert "kill switch is set" in proc.stderr and f"job {OLD} is not requeued" in proc.stderr
    else:
        assert _called(calls) == [f"scontrol requeue {OLD}"]


def test_a_dangling_link_pauses_the_batch_shell_too(tmp_path):
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    (run_dir.parent / "watch.paused").symlink_to(tmp_path / "nowhere")
    calls = tmp_path / "calls"
    proc = subprocess.run(["bash", "-c", _rendered_teardown(run_dir, [])], capture_output=True, text=True,
                          env={**_recorders(tmp_path / "bin", calls), "SLURM_JOB_ID": OLD}, timeout=30)
    assert proc.returncode == RC and _called(calls) == []


def _successor_files(run_dir: Path) -> Path:
    folder = run_dir / "slurm"
    folder.mkdir(parents=True)
    (folder / f"{OLD}_submission.sh").write_text("#!/bin/bash\nsrun true\n")
    (folder / f"{OLD}_submitted.pkl").write_bytes(b"pickled call")
    return folder


@pytest.mark.parametrize("paused", [True, False])
def test_the_hand_over_to_a_successor_only_when_not_paused(tmp_path, paused):
    run_dir = tmp_path / "runs" / "r1"
    _successor_files(run_dir)
    if paused:
        (run_dir.parent / "watch.paused").write_text("")
    calls = tmp_path / "calls"
    env = {**_recorders(tmp_path / "bin", calls, {"sbatch": f"{NEW};cluster"}), "SLURM_JOB_ID": OLD}
    # rank 0's marker after Slurm's preemption notice (launch/signals.py): only that reason hands over
    marker = f"printf '%s preempted\\n' {OLD} > {run_dir}/{handback.MARKER_PREFIX}{OLD}; (exit 0)"
    script = _rendered_teardown(run_dir, ["resilience.successor_on_preempt=true"], marker)
    proc = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == RC, proc.stderr
    if paused:
        assert _called(calls) == [] and not list(run_dir.glob(".successor-*"))
        assert "kill switch is set" in proc.stderr
    else:
        assert _called(calls)[0].startswith("sbatch --parsable --hold")
        assert _called(calls)[1:] == [f"scontrol release {NEW}", f"scontrol requeuehold {OLD}"]


def test_the_hand_over_function_alone_does_nothing_while_paused(tmp_path):
    run_dir = tmp_path / "runs" / "r1"
    folder = _successor_files(run_dir)
    (run_dir.parent / "watch.paused").write_text("")
    calls = tmp_path / "calls"
    script = "\n".join([*handback.paused_lines(), *handback.successor_lines(),
                        'hpc_agent_hand_over; echo "rc=$?"'])
    env = {**_recorders(tmp_path / "bin", calls, {"sbatch": f"{NEW};cluster"}), "SLURM_JOB_ID": OLD,
           "HPC_AGENT_RUN_DIR": str(run_dir), handback.SUCCESSOR_DIR_ENV: str(folder)}
    proc = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)
    assert proc.stdout.strip() == "rc=1" and _called(calls) == []
    assert sorted(p.name for p in folder.iterdir()) == [f"{OLD}_submission.sh", f"{OLD}_submitted.pkl"]


@pytest.mark.parametrize("paused", [True, False])
def test_a_rank_that_requeues_itself_checks_the_pause_file(tmp_path, monkeypatch, paused):
    """Outside hpc_agent's job script (a user's own sbatch script) rank 0 runs ``scontrol requeue`` itself
    after a SIGUSR2 checkpoint (launch/signals.py)."""
    from launch.signals import hand_back_to_slurm

    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    if paused:
        (run_dir.parent / "watch.paused").write_text("")
    calls = tmp_path / "calls"
    for key, value in {**_recorders(tmp_path / "bin", calls, {"squeue": "UNLIMITED"}), "SLURM_JOB_ID": OLD,
                       "SLURM_PROCID": "0", "HPC_AGENT_RUN_DIR": str(run_dir)}.items():
        monkeypatch.setenv(key, value)
    for key in (handback.BATCH_REQUEUE_ENV, handback.RUNS_ROOT_ENV, "SLURM_ARRAY_JOB_ID", "HPC_AGENT_CLUSTERS"):
        monkeypatch.delenv(key, raising=False)
    said: List[str] = []
    assert hand_back_to_slurm(signal.SIGUSR2, said.append) == RC
    requeues = [c for c in _called(calls) if c.startswith("scontrol requeue")]  # (it asks scontrol show job first)
    if paused:
        assert requeues == [] and any("kill switch is set" in line for line in said)
    else:
        assert requeues == [f"scontrol requeue {OLD}"]


# --- the watcher's effects ------------------------------------------------------------------------------------
KINDS = {"requeue": {}, "expedite": {}, "exclude": {"nodes": "node1", "patch": {"slurm.exclude": "node1"}},
         "cancel": {}, "notify": {"text": "hello"}, "resubmit": {"patch": {}, "reason": "test"},
         "request_stacks": {}, "await_end": {}, "release_lease": {}, "adopt": {"successor": "999"}}


def _journal_effect(ledger: Ledger, run_id: str, kind: str, job_id: str, args: dict) -> None:
    latest = ledger.latest_submission(run_id)
    with ledger.transaction():
        ledger.db.execute("INSERT INTO effects(run_id, kind, job_id, args, after_submission, created_at) "
                          "VALUES (?, ?, ?, ?, ?, ?)", (run_id, kind, job_id, json.dumps(args), latest.id,
                                                        ledger.clock()))


def test_every_effect_kind_is_known_here():
    assert set(KINDS) == set(effects._HANDLERS)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_watcher_effect_is_refused_and_audited_while_paused(world, kind):  # noqa: F811
    """The pause is set between the watcher's own checks and the action (the race the last check is for):
    the effect is not carried out (no Slurm command, no submission), stays pending, and is audited as
    refused; after --resume it is carried out; the other run is untouched."""
    slurm, ledger, watcher = world["slurm"], world["ledger"], world["watcher"]
    run_dir, job = add_run(world, "r")
    add_run(world, "other")
    _journal_effect(ledger, "r", kind, job, KINDS[kind])
    before = len(slurm.calls)
    watcher.pause_file.write_text("paused")
    watcher.carrier.run_effects(ledger.run("r"))
    assert slurm.calls[before:] == [] and world["submit"].calls == []
    assert [e.kind for e in watcher.journal.pending("r")] == [kind]
    refused = [r for _, _, r in watcher.journal.audit_records("r") if r.get("action") == "refused"]
    assert len(refused) == 1 and refused[0]["refused"] == kind and refused[0]["by"]["process"] == "watcher"
    assert str(watcher.pause_file) in refused[0]["pause_file"]
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert any(e.get("action") == "refused" for e in events)
    assert any(f"{kind} refused" in line for line in world["out"])
    assert watcher.journal.pending("other") == []
    killswitch.switch(world["root"], pause=False, out=lambda text: None)
    watcher.carrier.run_effects(ledger.run("r"))
    # Once resumed the effect reaches its handler: done, or tried (an exclude of a running job, an await_end
    # of a live one are retried by design), and no second refusal.
    left = watcher.journal.pending("r")
    assert left == [] or left[0].tries == 1
    assert len([r for _, _, r in watcher.journal.audit_records("r") if r.get("action") == "refused"]) == 1


def test_a_settled_intent_is_not_resubmitted_while_paused(world):  # noqa: F811
    """An intent without a job id that never reached Slurm is submitted again by the carrier's settling:
    refused and audited while paused."""
    slurm, ledger, watcher = world["slurm"], world["ledger"], world["watcher"]
    run_dir, job = add_run(world, "r")
    slurm.oom(job)
    ledger.set_phase("r", "recovering")
    ledger.record_intent("r", "slurm", str(run_dir / "config.yaml"), "gpu_oom: resubmit")
    slurm.advance(200)
    watcher.pause_file.write_text("paused")
    watcher.carrier.settle()
    assert world["submit"].calls == [] and not slurm.ran("sbatch")
    refused = [r for _, _, r in watcher.journal.audit_records("r") if r.get("action") == "refused"]
    assert [r["refused"] for r in refused] == ["submit"]


def test_the_paused_watcher_tick_stays_up_and_acts_on_nothing(world):  # noqa: F811
    _, job = add_run(world, "r")
    world["slurm"].fail(job, 1)
    world["watcher"].pause_file.write_text("paused")
    assert world["watcher"].tick().paused
    assert world["slurm"].calls == [] and world["submit"].calls == []


# --- the sweep ------------------------------------------------------------------------------------------------
def test_a_paused_sweep_driver_audits_its_refusal(tmp_path):
    from hpc_agent.sweep.adopt import sweep_audit_id
    from hpc_agent.sweep.driver import SweepDriver

    root = _runs_root(tmp_path)
    killswitch.switch(root, pause=True, out=lambda text: None)
    ledger = Ledger.in_runs_root(root)
    driver = SweepDriver.__new__(SweepDriver)  # only what halt_if_paused needs: no study, no Slurm
    driver.runs_root, driver.ledger, driver.out = root, ledger, lambda text: None
    driver.spec = type("Spec", (), {"name": "s1"})()
    with pytest.raises(killswitch.Paused):
        driver.halt_if_paused("submitting trials [0, 1]")
    (record,) = [r for _, _, r in Journal(ledger).audit_records(sweep_audit_id("s1"))]
    assert record["action"] == "refused" and record["refused"] == "submitting trials [0, 1]"
    assert record["by"]["process"] == "sweep"

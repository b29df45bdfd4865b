"""Command mode (``train.command``, docs/your_script.md): the environment each task builds, the DeepSpeed config
it writes, the login-node checks that skip the model estimate, the hang rule for scripts that never beat, and
the doc's example script run end to end with the local executor (then resumed from its checkpoint)."""
from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

from hpc_agent.config.load import load_config, load_snapshot
from hpc_agent.core import rundir
from launch.command import Resume, build_launch, plan_resume
from launch.distributed import DistEnv
from launch.dsconfig import build_ds_config
from tests.conftest import REPO, run_cli

DOC = REPO / "docs" / "your_script.md"
COMMAND = 'train.command=[python,train.py,--steps,"12",--save-every,"5"]'


def example_script() -> str:
    """The one python block of docs/your_script.md: the tests run exactly what the page shows."""
    (code,) = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    return code


def command_cfg(*overrides: str):
    return load_config("quickstart", [COMMAND, "train.zero_stage=1", *overrides])


# ---- the environment, argv and DeepSpeed config of one task (pure) -------------------------------------------
def test_launch_environment_from_cfg_and_slurm_env(tmp_path):
    cfg = command_cfg("train.micro_batch_size=4", "train.grad_accum_steps=2", "train.loader_workers=3")
    denv = DistEnv(1, 2, 1, "node1", 23456, "submitit")
    environ = {"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "2", "PYTHONPATH": "/theirs", "KEEP": "me"}
    launch = build_launch(cfg, tmp_path, tmp_path / "config.yaml", denv, on_cuda=False, precision="bf16",
                          resume=Resume("step_00000010"), workdir="/home/me/project", environ=environ,
                          code_root=Path("/opt/hpc"), code_dir=tmp_path / "code", python="/venv/bin/python")
    assert launch.argv == ["/venv/bin/python", "train.py", "--steps", "12", "--save-every", "5"]
    assert launch.cwd == "/home/me/project"
    assert launch.ds_config_path == tmp_path / "deepspeed" / "ds_config.77.2.json"
    env = launch.env
    assert env["HPC_AGENT_DS_CONFIG"] == str(launch.ds_config_path)
    assert env["HPC_AGENT_RUN_DIR"] == str(tmp_path) and env["HPC_AGENT_CKPT_DIR"] == str(tmp_path / "checkpoints")
    assert env["HPC_AGENT_RESUME_TAG"] == "step_00000010" and env["HPC_AGENT_CONFIG"] == str(tmp_path / "config.yaml")
    assert env["HPC_AGENT_LOADER_WORKERS"] == "3"  # train.loader_workers: the watcher halves it after shm_exhausted
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == ("1", "1", "2")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("node1", "23456")
    assert env["PYTHONPATH"].split(":") == [str(tmp_path / "code"), "/opt/hpc", "/theirs"]
    assert env["KEEP"] == "me"
    # The same dict the built-in training builds (launch/engine.py: build_ds_config of train on this world).
    assert launch.ds_config == build_ds_config(cfg.train, world_size=2, precision="bf16", on_cuda=False)
    assert (launch.ds_config["train_micro_batch_size_per_gpu"], launch.ds_config["gradient_accumulation_steps"],
            launch.ds_config["train_batch_size"]) == (4, 2, 16)


def test_fresh_start_and_container_workdir(tmp_path):
    cfg = command_cfg("container.workdir=/workspace")
    launch = build_launch(cfg, tmp_path, tmp_path / "config.yaml", DistEnv(0, 1, 0, "127.0.0.1", 4000, "x"),
                          on_cuda=False, precision="fp32", resume=Resume(), workdir="/home/me", environ={})
    assert launch.env["HPC_AGENT_RESUME_TAG"] == ""
    assert launch.env["HPC_AGENT_LOADER_WORKERS"] == "2"  # the default
    assert launch.cwd is None  # the container runtime enters container.workdir itself
    assert launch.env["HPC_AGENT_WORKDIR"] == "/workspace"
    assert launch.ds_config_path.name == "ds_config.local.0.json"


def test_prepare_writes_the_builtin_ds_config(tmp_path, monkeypatch):
    from hpc_agent.config.load import write_run_config
    from launch.command import prepare

    cfg = command_cfg("train.precision=fp32")
    config_path = write_run_config(tmp_path, cfg)
    env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555",
           "SLURM_JOB_ID": "5", "PATH": "/usr/bin"}
    for key in ("SUBMITIT_LOCAL_JOB_ID", "SLURM_RESTART_COUNT", "SLURM_ARRAY_JOB_ID", "SLURM_PROCID"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    code, launch = prepare(str(tmp_path), str(config_path), "/somewhere", environ=env)
    assert code == 0
    written = json.loads(rundir.ds_config_path(tmp_path, "5", 0).read_text())
    assert written == build_ds_config(cfg.train, world_size=1, precision="fp32", on_cuda=False)
    assert launch.env["MASTER_PORT"] == "29555" and launch.cwd == "/somewhere"


def _fake_checkpoint(root: Path, step: int, layout: dict, complete: bool = True) -> None:
    from hpc_agent.core.checkpoint_format import MARKER, MARKER_VERSION, tag_for

    tag_dir = root / tag_for(step)
    tag_dir.mkdir(parents=True)
    (tag_dir / "mp_rank_00_model_states.pt").write_bytes(b"x" * 10)
    if complete:
        (tag_dir / MARKER).write_text(json.dumps({"version": MARKER_VERSION, "step": step, "tag": tag_for(step),
                                                  "files": {"mp_rank_00_model_states.pt": 10}, "layout": layout}))


def test_resume_picks_newest_complete_and_plans_the_layout(tmp_path):
    layout = {"micro_batch_size": 4, "grad_accum_steps": 1, "world_size": 1, "zero_stage": 1, "offload": "none",
              "precision": "bf16"}
    assert plan_resume(tmp_path, layout) == Resume(lines=())
    _fake_checkpoint(tmp_path, 5, layout)
    _fake_checkpoint(tmp_path, 10, layout, complete=False)  # torn: skipped, as in the built-in resume
    resume = plan_resume(tmp_path, {**layout, "micro_batch_size": 2, "grad_accum_steps": 2})  # the OOM ladder
    assert (resume.tag, resume.universal, resume.refused) == ("step_00000005", False, "")
    assert any("skipping checkpoint step_00000010" in line for line in resume.lines)
    assert plan_resume(tmp_path, {**layout, "zero_stage": 3}).universal  # DeepSpeed reads this at initialize
    assert "global batch" in plan_resume(tmp_path, {**layout, "micro_batch_size": 8}).refused


# ---- login-node side ----------------------------------------------------------------------------------
def test_memory_checks_skip_the_model_estimate_with_a_note():
    from hpc_agent.policy.memory import COMMAND_NOTE, estimate_from_config, gpu_oom_fit
    from hpc_agent.policy.preflight import SKIP, memory_verdict

    cfg = command_cfg("slurm.gpus_per_node=1", "train.micro_batch_size=8")
    with pytest.raises(ValueError, match="train.command"):
        estimate_from_config(cfg)
    verdict = memory_verdict(cfg, 80 << 30, "test")
    assert verdict.level == SKIP and verdict.message == COMMAND_NOTE
    patch, _ = gpu_oom_fit(cfg, 1, True, 80 << 30)  # the next rung alone: no gpt estimate for a user's model
    assert patch["train.micro_batch_size"] == 4 and patch["train.grad_accum_steps"] == 2


def test_submit_job_callable_and_recorded_workdir(tmp_path, monkeypatch):
    from launch.job import CommandJob, TrainingJob
    from hpc_agent.jobs.submission import job_for, update_run_json

    cfg = command_cfg()
    monkeypatch.chdir(tmp_path)
    job = job_for(tmp_path, cfg, tmp_path / "config.yaml")
    assert isinstance(job, CommandJob) and job.workdir == str(tmp_path)
    update_run_json(tmp_path, "r", "local", "1", tmp_path / "config.yaml", cfg)
    monkeypatch.chdir(REPO)  # the watcher resubmits from elsewhere: the recorded directory wins
    assert job_for(tmp_path, cfg, tmp_path / "config.yaml").workdir == str(tmp_path)
    assert isinstance(job_for(tmp_path, load_config("quickstart"), tmp_path / "config.yaml"), TrainingJob)


def test_dry_run_shows_the_command(tmp_path):
    proc = run_cli("-m", "hpc_agent.submit", "quickstart", COMMAND, f"run.runs_root={tmp_path}", "--dry-run",
                   "--executor", "local", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"# Command (once per rank, in {tmp_path}): python train.py --steps 12 --save-every 5" in proc.stdout


def test_no_heartbeat_is_no_hang_verdict_in_command_mode(tmp_path, monkeypatch):
    from hpc_agent.watcher import observe
    from hpc_agent.config.resilience import ResilienceConfig

    settings = ResilienceConfig()
    started = time.time() - 10 * settings.startup_budget_s  # long past the start-up budget
    monkeypatch.setattr(observe, "attempt_start", lambda attempt: started)
    builtin = observe.read_live(tmp_path, None, settings, time.time(), False)
    assert builtin.verdict is not None and builtin.verdict.kind == "startup"
    command = observe.read_live(tmp_path, None, settings, time.time(), False, beats_expected=False)
    assert command.verdict is None


# ---- the doc's example, end to end with the local executor ---------------------------------------------
@pytest.mark.slow
def test_doc_example_runs_locally_and_resumes_from_its_checkpoint(tmp_path):
    from hpc_agent.core.checkpoint_format import complete_steps
    from hpc_agent.state.ledger import Ledger
    from hpc_agent.config.load import write_run_config
    from hpc_agent.jobs.submission import SubmittedButIncomplete, submit_attempt

    work = tmp_path / "project"
    work.mkdir()
    (work / "train.py").write_text(example_script())
    root = tmp_path / "runs"
    proc = run_cli("-m", "hpc_agent.submit", "quickstart", COMMAND, "train.zero_stage=1", "train.precision=fp32",
                   f"run.runs_root={root}", "--executor", "local", "--wait", cwd=work, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = [p for p in root.iterdir() if p.is_dir()]
    log = "\n".join(p.read_text() for p in (run_dir / "slurm").glob("*_0_log.out"))
    assert "done at step 12" in log and "[hpc_agent] step 12 loss" in log
    assert complete_steps(run_dir) == [5, 10, 12]
    (ds_file,) = (run_dir / "deepspeed").glob("ds_config.*.json")
    cfg = load_snapshot(run_dir / "config.yaml")
    assert json.loads(ds_file.read_text()) == build_ds_config(cfg.train, world_size=1, precision="fp32", on_cuda=False)
    assert list((run_dir / "heartbeat").glob("rank-*.json")), "report_step publishes the heartbeat"

    # A second attempt (as the watcher submits one, from another directory) resumes from step 12.
    cfg.train.command = ["python", "train.py", "--steps", "16", "--save-every", "5"]
    write_run_config(run_dir, cfg)
    ledger = Ledger.in_runs_root(root)
    try:
        job = submit_attempt(ledger, run_dir.name, run_dir, cfg, rundir.config_path(run_dir), "local", reason="test")
    except SubmittedButIncomplete as exc:  # no watcher advanced the run past "pending": the job runs all the same
        job = exc.job
    finally:
        ledger.close()
    deadline = time.monotonic() + 300
    while not job.done() and time.monotonic() < deadline:
        time.sleep(0.5)
    log2 = (run_dir / "slurm" / f"{job.job_id}_0_log.out").read_text()
    assert "resumed at step 12" in log2 and "done at step 16" in log2, log2[-3000:]
    assert "[hpc_agent] step 12 loss" not in log2 and "[hpc_agent] step 13 loss" in log2
    assert complete_steps(run_dir)[-1] == 16
    assert f"in {run_dir / 'code'}" in log2  # the snapshot's copy of the submit directory, not the test's
    # report_step's loss reaches TensorBoard with the built-in's tag, one value per step across both attempts
    # (what review's plots and the watcher's divergence alarms read).
    from hpc_agent.metrics.tb_reader import RunScalars

    scalars = RunScalars(run_dir / "tb")
    scalars.update()
    assert [p.step for p in scalars.series("train/loss")] == list(range(1, 17))


def test_become_execs_in_place_with_signals_ignored_env_and_cwd(tmp_path):
    """exec, not a child: the same pid, SIGTERM/SIGUSR2 ignored until the script installs its handler, the
    environment and the working directory of the launch."""
    import subprocess

    probe = ("import os, signal; print(os.getpid(), os.getcwd(), os.environ['HPC_AGENT_RESUME_TAG'], "
             "signal.getsignal(signal.SIGTERM) is signal.SIG_IGN, signal.getsignal(signal.SIGUSR2) is signal.SIG_IGN)")
    code = ("import os, sys; from pathlib import Path; from launch.command import Launch, become; "
            f"print(os.getpid(), flush=True); become(Launch([sys.executable, '-c', {probe!r}], "
            f"dict(os.environ, HPC_AGENT_RESUME_TAG='step_00000007'), {str(tmp_path)!r}, {{}}, Path('x')), local=False)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=str(REPO))
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if not line.startswith("[hpc_agent]")]
    assert lines[1].split() == [lines[0], str(tmp_path), "step_00000007", "True", "True"]

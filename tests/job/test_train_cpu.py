"""launch.train on the CPU: precisions (must-show 6), TensorBoard contents, 2 ranks with gloo
(ZeRO-2 + BF16 + activation checkpointing), SIGTERM on both ranks -> checkpoint + exit 75, and a
resume of that checkpoint on one rank (world size change through a universal checkpoint)."""
import re
import signal
import time
from pathlib import Path

import pytest

from helpers.common import expect, losses, run, run_ranks, snapshot, start, tb_scalars
from hpc_agent.core.checkpoint_format import MARKER, scan, select, tag_for
from hpc_agent.core.exit_codes import EXIT_CONFIG, EXIT_SIGNALLED_AFTER_CHECKPOINT, EXIT_UNAVAILABLE
from launch.distributed import free_port


@pytest.mark.parametrize("precision,picked", [("bf16", "bf16"), ("fp32", "fp32"), ("auto", "bf16")])
def test_precisions_train_on_cpu(tmp_path, precision, picked):
    cfg = snapshot(tmp_path / "cfg.yaml", train={"max_steps": 3, "ckpt_every": 3, "precision": precision,
                                                 "eval_every": 2})
    result = run(cfg, tmp_path / "run")
    expect(result, 0, f", {picked}, device cpu", "done: 3 steps", "checkpoint step_00000003 complete")
    if precision == "auto":
        assert "precision auto -> bf16 (no CUDA device" in result.stdout
    assert sorted(losses(result.stdout)) == [1, 2, 3]


def test_fp16_on_cpu_is_a_clear_error(tmp_path):
    # The schema refuses fp16 with gpus_per_node=0, so ask for a GPU that this machine does not have.
    cfg = snapshot(tmp_path / "cfg.yaml", train={"precision": "fp16"}, slurm={"gpus_per_node": 1})
    result = run(cfg, tmp_path / "run")
    expect(result, EXIT_UNAVAILABLE, "train.precision=fp16 needs a CUDA GPU",
           f"Exiting {EXIT_UNAVAILABLE}.")
    assert "Traceback" not in result.stdout
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_invalid_snapshot_exits_with_config_code(tmp_path):
    bad = tmp_path / "cfg.yaml"
    bad.write_text("train:\n  max_steps: -1\n")
    result = run(bad, tmp_path / "run")
    expect(result, EXIT_CONFIG, "train.max_steps", f"exiting {EXIT_CONFIG}")


def test_tensorboard_scalars(tmp_path):
    cfg = snapshot(tmp_path / "cfg.yaml", train={"max_steps": 4, "ckpt_every": 4, "eval_every": 2,
                                                 "precision": "bf16"})
    run_dir = tmp_path / "run"
    expect(run(cfg, run_dir), 0)
    for tag in ("train/loss", "train/lr", "train/grad_norm", "perf/samples_per_s", "perf/tokens_per_s",
                "perf/step_time_s", "perf/peak_mem_bytes"):
        assert sorted(tb_scalars(run_dir, tag)) == [1, 2, 3, 4], tag
    assert sorted(tb_scalars(run_dir, "eval/loss")) == [2, 4]
    assert tb_scalars(run_dir, "run/attempt") == {1: 0.0}
    assert tb_scalars(run_dir, "train/loss_scale") == {}  # FP16 only
    lrs = tb_scalars(run_dir, "train/lr")
    assert lrs[1] == pytest.approx(0.5e-3) and lrs[2] == pytest.approx(1e-3)  # warmup_steps 2, lr 1e-3
    assert tb_scalars(run_dir, "perf/peak_mem_bytes")[4] > 10 * 2**20
    # A second call after the end trains nothing and logs nothing new.
    again = run(cfg, run_dir)
    expect(again, 0, "already trained 4 of 4 steps")
    assert len(list((run_dir / "tb").glob("events.out.tfevents.*"))) == 1


def _two_rank_cfg(tmp_path: Path, **train):
    base = {"max_steps": 4, "ckpt_every": 2, "zero_stage": 2, "precision": "bf16",
            "activation_checkpointing": True, "micro_batch_size": 4}
    base.update(train)
    return snapshot(tmp_path / "cfg2.yaml", train=base, slurm={"tasks_per_node": 2})


@pytest.mark.slow
def test_two_ranks_zero2_bf16_activation_checkpointing(tmp_path):
    run_dir = tmp_path / "run"
    results = run_ranks(_two_rank_cfg(tmp_path), run_dir, world=2)
    for result in results:
        assert result.returncode == 0, result.stdout[-4000:]
    expect(results[0], 0, "[rank 0/2] host=", "global batch 8 = 4 x 1 x 2 ranks, ZeRO-2, bf16", "done: 4 steps")
    final = select(scan(run_dir / "checkpoints")).chosen
    assert final.step == 4
    shards = sorted(f for f in final.marker["files"] if "optim_states" in f)
    assert len(shards) == 2 and "pp_rank_0_" in shards[0] and "pp_rank_1_" in shards[1]


@pytest.mark.slow
def test_a_stray_sigusr2_is_a_checkpoint_request_and_training_goes_on(tmp_path):
    """A SIGUSR2 that Slurm did not send (a person's ``scancel --signal=USR2``: no PreemptTime, most of the time
    limit left, as the FakeSlurm on PATH answers scontrol) stops nothing: the job saves a checkpoint at the end of
    that step and trains on to the end, exit 0; it never hands over (hpc_agent/slurm/usr2.py)."""
    from tests.helpers import slurm_on_path
    from tests.helpers.fake_slurm import FakeSlurm

    slurm = FakeSlurm()
    job = slurm.submit("hpc_agent:run", time_limit="01:00:00")
    slurm.start(job)
    slurm.advance(60)
    path = slurm_on_path.install(tmp_path / "bin", tmp_path / "slurm.pickle", slurm)
    cfg = snapshot(tmp_path / "cfg.yaml", train={"max_steps": 400, "ckpt_every": 1000, "precision": "bf16"})
    run_dir = tmp_path / "run"
    proc = start(cfg, run_dir, env_extra={"SLURM_JOB_ID": job, "PATH": path})
    _wait_for_step(Path(proc.log_path), 2, [proc])
    proc.send_signal(signal.SIGUSR2)
    proc.wait(timeout=120)
    log = Path(proc.log_path).read_text()
    assert proc.returncode == 0, log[-3000:]
    assert "a checkpoint request" in log and "signal SIGUSR2 at step" not in log, log[-3000:]
    match = re.search(r"checkpoint request \(SIGUSR2\) at step (\d+): checkpoint (step_\d+) complete", log)
    assert match, log[-3000:]
    assert int(match.group(1)) < 400 and (run_dir / "checkpoints" / match.group(2) / MARKER).is_file()
    assert "done: 400 steps" in log and max(losses(log)) == 400
    assert ["scontrol", "--oneliner", "show", "job", job] in slurm_on_path.load(tmp_path / "slurm.pickle").commands
    assert not (run_dir / f".handback-{job}").exists()


def _wait_for_step(log: Path, step: int, procs, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text() if log.exists() else ""
        done = [int(n) for n in re.findall(r"\] step (\d+) loss", text)]
        if done and max(done) >= step:
            return
        if any(p.poll() is not None for p in procs):
            raise AssertionError("a rank exited early:\n" + text[-3000:])
        time.sleep(0.05)
    raise AssertionError(f"no step {step} within {timeout}s:\n" + log.read_text()[-3000:])


@pytest.mark.slow
def test_sigterm_on_two_ranks_saves_and_exits_75_then_resumes_on_one(tmp_path):
    cfg = _two_rank_cfg(tmp_path, max_steps=300, ckpt_every=1000, grad_accum_steps=1)
    run_dir = tmp_path / "run"
    port = free_port()
    procs = [start(cfg, run_dir, rank, 2, port) for rank in range(2)]
    _wait_for_step(Path(procs[0].log_path), 3, procs)
    sent = time.monotonic()
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        proc.wait(timeout=60)
    took = time.monotonic() - sent
    logs = [Path(p.log_path).read_text() for p in procs]
    assert [p.returncode for p in procs] == [EXIT_SIGNALLED_AFTER_CHECKPOINT] * 2, logs[0][-3000:]
    assert took < 30, f"took {took:.1f}s: over the 30 s GraceTime"
    match = re.search(r"signal SIGTERM at step (\d+): checkpoint (step_\d+) complete in [\d.]+s; exiting 75", logs[0])
    assert match, logs[0][-3000:]
    step = int(match.group(1))
    assert match.group(2) == tag_for(step) and (run_dir / "checkpoints" / tag_for(step) / MARKER).exists()
    assert select(scan(run_dir / "checkpoints")).chosen.step == step

    # Resume the 2-rank ZeRO-2 checkpoint on 1 rank with accum 2 (same global batch 8).
    one = snapshot(tmp_path / "cfg1.yaml", train={"max_steps": step + 3, "ckpt_every": 1000, "zero_stage": 2,
                                                  "precision": "bf16", "activation_checkpointing": True,
                                                  "micro_batch_size": 4, "grad_accum_steps": 2})
    resumed = run(one, run_dir)
    expect(resumed, 0, f"resume plan for {tag_for(step)}: universal", f"resumed at step {step}",
           "global batch 8 = 4 x 2 x 1 ranks")
    assert min(losses(resumed.stdout)) == step + 1


@pytest.mark.slow
def test_sigusr2_mid_accumulation_saves_last_complete_step(tmp_path):
    """SIGUSR2 (time limit near) on one rank with 4 micro-steps per step: the checkpoint holds the last
    completed optimizer step (a half-accumulated one is dropped) and the resume continues right after it."""
    # 400 steps (~6 s): the signal must land mid-run, and step lines reach the log up to 1 s late (launch/console.py).
    cfg = snapshot(tmp_path / "cfg.yaml", train={"max_steps": 400, "ckpt_every": 1000, "micro_batch_size": 1,
                                                 "grad_accum_steps": 4, "precision": "bf16"})
    run_dir = tmp_path / "run"
    proc = start(cfg, run_dir)
    _wait_for_step(Path(proc.log_path), 2, [proc])
    proc.send_signal(signal.SIGUSR2)
    proc.wait(timeout=60)
    log = Path(proc.log_path).read_text()
    assert proc.returncode == EXIT_SIGNALLED_AFTER_CHECKPOINT, log[-3000:]
    match = re.search(r"signal SIGUSR2 at step (\d+): checkpoint step_\d+ complete", log)
    assert match, log[-3000:]
    step = int(match.group(1))
    assert max(losses(log)) == step  # the checkpoint is the last step that finished
    resumed = run(cfg, run_dir)
    expect(resumed, 0, f"resumed at step {step} (data position {step * 4} samples)", "done: 400 steps")
    assert min(losses(resumed.stdout)) == step + 1

"""launch.faults: each injected fault fires at its step with a clear line, and train maps it to its
exit code (OOM 3, NaN 65, code bug 1); a hang keeps the process alive without progress."""
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from helpers.common import expect, losses, run, snapshot, start
from hpc_agent.core.exit_codes import EXIT_CRASHED, EXIT_DIVERGED, EXIT_OUT_OF_MEMORY
from launch.faults import _HELD, Faults


def faults(**values):
    base = dict(oom_above_micro_batch=0, host_alloc_mb=0, host_alloc_step=0, nan_at_step=0, hang_at_step=0,
                error_at_step=0)
    base.update(values)
    return SimpleNamespace(**base)


def test_oom_is_a_real_out_of_memory_error_in_forward(capsys):
    model = torch.nn.Linear(4, 4)
    Faults(faults(oom_above_micro_batch=4), micro_batch_size=8, rank=0).install(model)
    with pytest.raises(torch.OutOfMemoryError, match="CUDA out of memory"):
        model(torch.zeros(8, 4))
    assert "fault: out of memory in forward" in capsys.readouterr().out
    with torch.no_grad():  # evaluation is not affected
        model(torch.zeros(8, 4))


def test_oom_not_armed_at_or_below_the_limit():
    model = torch.nn.Linear(4, 4)
    Faults(faults(oom_above_micro_batch=8), micro_batch_size=8, rank=0).install(model)
    model(torch.zeros(8, 4))


def test_nan_error_and_host_alloc_fire_only_at_their_step(capsys):
    f = Faults(faults(nan_at_step=3, error_at_step=5, host_alloc_mb=8, host_alloc_step=2), 4, rank=0)
    assert torch.isfinite(f.loss(2, torch.tensor(1.0)))
    assert torch.isnan(f.loss(3, torch.tensor(1.0)))
    held = len(_HELD)
    f.before_step(1)
    f.before_step(2)
    assert len(_HELD) == held + 1 and len(_HELD[-1]) == 8 * 2**20
    f.before_step(4)
    with pytest.raises(RuntimeError, match="injected code bug at step 5"):
        f.before_step(5)
    out = capsys.readouterr().out
    assert "fault: making the loss NaN at step 3" in out and "fault: allocating and touching 8 MB" in out
    _HELD.clear()


def test_host_alloc_only_on_rank0():
    held = len(_HELD)
    Faults(faults(host_alloc_mb=1, host_alloc_step=1), 4, rank=1).before_step(1)
    assert len(_HELD) == held


@pytest.mark.parametrize("fault,code,needles", [
    ({"oom_above_micro_batch": 2}, EXIT_OUT_OF_MEMORY,
     ["fault: out of memory in forward", "torch.OutOfMemoryError: CUDA out of memory",
      f"out of memory at step 1 during training (micro_batch_size 4, ZeRO-1); exiting {EXIT_OUT_OF_MEMORY}"]),
    ({"nan_at_step": 2, "host_alloc_mb": 32, "host_alloc_step": 1}, EXIT_DIVERGED,
     ["fault: allocating and touching 32 MB", "fault: making the loss NaN at step 2",
      f"diverged: loss is nan at step 2; no checkpoint written; exiting {EXIT_DIVERGED}"]),
    ({"error_at_step": 2}, EXIT_CRASHED,
     ["fault: raising an error (a code bug) at step 2", "RuntimeError: injected code bug at step 2"]),
])
def test_fault_exit_codes(tmp_path, fault, code, needles):
    # in_job_retries 0: the exit codes the watcher acts on (in-job repairs: tests/job/test_in_job_recovery.py)
    cfg = snapshot(tmp_path / "cfg.yaml", train={"max_steps": 4, "ckpt_every": 4}, faults=fault,
                   resilience={"in_job_retries": 0})
    result = run(cfg, tmp_path / "run")
    expect(result, code, *needles)
    if code == EXIT_DIVERGED:
        assert sorted(losses(result.stdout)) == [1]
        assert not list((tmp_path / "run" / "checkpoints").glob("step_*"))


def test_hang_stops_progress(tmp_path):
    cfg = snapshot(tmp_path / "cfg.yaml", train={"max_steps": 50, "ckpt_every": 50}, faults={"hang_at_step": 3})
    proc = start(cfg, tmp_path / "run")
    log = Path(proc.log_path)
    try:
        deadline = time.monotonic() + 120
        while "fault: hanging at step 3" not in (log.read_text() if log.exists() else ""):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        time.sleep(2)
        assert proc.poll() is None
        assert sorted(losses(log.read_text())) == [1, 2]
    finally:
        proc.kill()
        proc.wait(timeout=30)

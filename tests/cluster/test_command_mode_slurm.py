"""Issue 18, must-show 2 on the real Slurm: a user's script in command mode (docs/your_script.md's example, run
as is) trains under the watcher, runs out of GPU memory (injected), is repaired through the DeepSpeed config the
next attempt gets (half the micro batch, twice the accumulation: the global batch kept), is preempted mid-run,
resumes from the checkpoint it wrote on the signal (nothing lost) and completes."""
from __future__ import annotations

import json
import re

import pytest

from hpc_agent.config.load import load_snapshot
from tests.conftest import run_cli
from tests.job.test_command_mode import example_script
from tests.slurm_helpers import (WatcherProcess, events, last_step, ledger_job_ids, log_text, preempt_all_nodes,
                                 run_phase, wait_for)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

# The doc's example, unchanged, run through a wrapper that slows each step down (so there is time to preempt)
# and raises the allocator's error from step OOM_AT on while the DeepSpeed config's micro batch is above
# OOM_ABOVE: what a real script on a too-small GPU does.
WRAPPER = '''"""train.py (docs/your_script.md) with slow steps and an injected GPU out-of-memory."""
import json
import runpy
import sys
import time
from pathlib import Path

import torch

from launch import script_api as hpc

OOM_ABOVE, OOM_AT, STEP_S = 2, 7, 0.3
report = hpc.report_step


def report_step(step, loss=None):
    report(step, loss)
    time.sleep(STEP_S)
    with open(hpc.context().ds_config) as f:
        micro = json.load(f)["train_micro_batch_size_per_gpu"]
    if step >= OOM_AT and micro > OOM_ABOVE:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


hpc.report_step = report_step
sys.argv[0] = str(Path(__file__).with_name("train.py"))
runpy.run_path(sys.argv[0], run_name="__main__")
'''
STEPS, SAVE_EVERY = 40, 5


def _ds(run_dir, job_id, attempt):
    return json.loads((run_dir / "deepspeed" / f"ds_config.{job_id}.{attempt}.json").read_text())


def test_user_script_oom_repaired_preempted_resumed_completed(root, tmp_path):
    work = tmp_path / "project"
    work.mkdir()
    (work / "train.py").write_text(example_script())
    (work / "oom_train.py").write_text(WRAPPER)
    proc = run_cli("-m", "hpc_agent.submit", "quickstart", "--executor", "slurm", f"run.runs_root={root}",
                   "run.name=cmd", "resilience.successor_on_preempt=false",  # preempted: resumed in place
                   f'train.command=[python,oom_train.py,--steps,"{STEPS}",--save-every,"{SAVE_EVERY}"]',
                   "train.micro_batch_size=4", "train.grad_accum_steps=1", "train.zero_stage=1",
                   "train.precision=fp32", "train.log_every=1", "slurm.mem=2G", "slurm.time=00:10:00", cwd=work)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = [p for p in root.iterdir() if p.is_dir()]
    first = json.loads((run_dir / "run.json").read_text())["job_ids"][0]
    watcher = WatcherProcess(root)
    try:
        # 1. The OOM: the watcher resubmits with the next rung of the OOM ladder.
        wait_for(lambda: len(ledger_job_ids(root, run_dir.name)) == 2, 240, what="the OOM resubmission")
        second = ledger_job_ids(root, run_dir.name)[1]
        assert "CUDA out of memory" in log_text(run_dir, first)
        (decision,) = [e for e in events(run_dir) if e.get("cause") == "gpu_oom" and "decision" in e]
        assert decision["config_diff"]["train.micro_batch_size"] == {"from": 4, "to": 2}
        cfg = load_snapshot(run_dir / "config.yaml")
        assert (cfg.train.micro_batch_size, cfg.train.grad_accum_steps) == (2, 2)

        # 2. Preempt the resubmitted job mid-run: it saves on the signal and hands the job back.
        wait_for(lambda: last_step(log_text(run_dir, second)) >= 12, 180, what="the resubmitted job to train")
        preempt_all_nodes(seconds=2)
        wait_for(lambda: "handing the job back" in log_text(run_dir, second), 120, what="the signal checkpoint")

        wait_for(lambda: run_phase(root, run_dir.name) == "completed", 240, what="the run to complete")
    finally:
        watcher.stop()
    assert ledger_job_ids(root, run_dir.name) == [first, second]  # the preemption resumed in place

    # The DeepSpeed config the script got, attempt by attempt: the global batch kept through the repair.
    before, after = _ds(run_dir, first, 0), _ds(run_dir, second, 0)
    assert (before["train_micro_batch_size_per_gpu"], before["gradient_accumulation_steps"]) == (4, 1)
    assert (after["train_micro_batch_size_per_gpu"], after["gradient_accumulation_steps"]) == (2, 2)
    assert before["train_batch_size"] == after["train_batch_size"] == 4
    assert _ds(run_dir, second, 1) == after  # the requeued attempt of the same job

    text = log_text(run_dir, second)
    assert "resumed at step 5 " in text  # from the last checkpoint before the OOM at step 7
    signal = re.search(r"\[hpc_agent\] signal (SIGUSR2|SIGTERM): handing the job back", text)
    saved = re.findall(r"checkpoint step_(\d+) complete", text[:signal.start()])
    preempted_at = last_step(text[:signal.start()])
    assert int(saved[-1]) == preempted_at  # saved at the step it stopped: no work lost
    assert f"resumed at step {preempted_at} " in text[signal.end():]
    assert f"done at step {STEPS}" in text

"""Resume: bit-exact after SIGKILL (must-show 1), under a changed layout (must-show 3), layout
planning (table), and TensorBoard continuity across attempts."""
import signal

import pytest

from helpers.common import expect, losses, run, snapshot, start, tb_scalars, wait_for, wait_for_snapshot
from hpc_agent.core import in_job_journal
from hpc_agent.core.checkpoint_format import MARKER, tag_for
from hpc_agent.core.exit_codes import EXIT_CONFIG
from hpc_agent.policy.adaptive_lr import adaptation_kind
from launch import universal

# Issue 21: the exact-resume tests also run with the adaptive LR schedule on, set to adapt often (a plateau of
# the training loss is any 3 log points that do not beat the best before by 90 %), so warm restarts fall before
# and after the resume and the resumed schedule must continue exactly.
ADAPTIVE = {"off": {},
            "on": {"adaptive": {"enabled": True, "plateau_metric": "train", "plateau_window": 3,
                                "plateau_min_rel_improvement": 0.9, "restart_fraction": 1.0, "restart_warmup_steps": 2,
                                "max_restarts": 8, "cooldown_steps": 4}}}


def adaptations(run_dir):
    """(step, kind) of every adaptation the run's journal records, each once (a killed attempt's adaptations
    past the step it resumed from are made again by the resumed attempt)."""
    decisions, problems = in_job_journal.read(run_dir)
    assert problems == []
    return sorted({(d.step, adaptation_kind(d.reason)) for d in decisions if d.action == in_job_journal.ADAPT_ACTION})


def check_adaptations(mode, straight_dir, resumed_dir, resumed_from):
    """Off: none at all. On: some before and some after the step the run resumed from, the same as the straight run's."""
    want, got = adaptations(straight_dir), adaptations(resumed_dir)
    if mode == "off":
        assert want == got == []
        return
    assert any(s <= resumed_from for s, _ in want) and any(s > resumed_from for s, _ in want), want
    assert got == want


def L(mbs, accum, world, stage, offload="none", precision="bf16"):
    return {"micro_batch_size": mbs, "grad_accum_steps": accum, "world_size": world, "zero_stage": stage,
            "offload": offload, "precision": precision}


@pytest.mark.parametrize("saved,current,mode", [
    (L(8, 1, 1, 1), L(8, 1, 1, 1), universal.NATIVE),
    (L(8, 1, 1, 1), L(4, 2, 1, 1), universal.NATIVE),          # mbs/accum only: nothing saved depends on it
    (L(8, 1, 1, 1), L(4, 2, 1, 2), universal.NATIVE),          # ZeRO-1 <-> 2 share the shard format
    (L(4, 2, 2, 2), L(8, 1, 2, 1), universal.NATIVE),
    (L(8, 1, 2, 2, "none"), L(8, 1, 2, 2, "optimizer"), universal.NATIVE),
    (L(8, 1, 1, 0), L(4, 1, 2, 0), universal.NATIVE),          # ZeRO-0: full state in one file
    (L(8, 1, 1, 1), L(8, 1, 1, 3), universal.UNIVERSAL),
    (L(8, 1, 1, 3), L(4, 2, 1, 2), universal.UNIVERSAL),
    (L(4, 1, 2, 2), L(8, 1, 1, 2), universal.UNIVERSAL),       # world size change
    (L(8, 1, 1, 0), L(8, 1, 1, 2), universal.FROM_STAGE0),
    (L(8, 1, 1, 2), L(8, 1, 1, 0), universal.REFUSE),          # no universal load without ZeRO
    (L(8, 1, 1, 1), L(4, 1, 1, 1), universal.REFUSE),          # global batch 8 -> 4
    (L(8, 1, 2, 1), L(8, 1, 1, 1), universal.REFUSE),          # 16 -> 8
])
def test_plan(saved, current, mode):
    plan = universal.plan(saved, current)
    assert plan.mode == mode, plan.reason
    assert plan.reason


def test_plan_explains_global_batch_change():
    reason = universal.plan(L(8, 1, 1, 1), L(4, 1, 1, 1)).reason
    assert "global batch changed from 8" in reason and "to 4" in reason and "keep the product at 8" in reason


@pytest.mark.slow
@pytest.mark.parametrize("adaptive", ["off", "on"])
def test_sigkill_after_step20_resumes_bit_exact(tmp_path, adaptive):
    """Must-show 1: FP32 gpt, 40 steps uninterrupted vs. SIGKILL after the step-20 checkpoint + resume."""
    train = {"max_steps": 40, "ckpt_every": 20, "precision": "fp32", "warmup_steps": 5}
    cfg = snapshot(tmp_path / "cfg.yaml", train=train, **ADAPTIVE[adaptive])
    straight = run(cfg, tmp_path / "straight")
    expect(straight, 0, "done: 40 steps")

    run_dir = tmp_path / "killed"
    proc = start(cfg, run_dir)
    wait_for(run_dir / "checkpoints" / tag_for(20) / MARKER, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    resumed = run(cfg, run_dir)
    expect(resumed, 0, f"resuming from checkpoint {tag_for(20)} (step 20)", "done: 40 steps")

    want, got = losses(straight.stdout), losses(resumed.stdout)
    assert min(got) == 21
    assert got[40] == pytest.approx(want[40], abs=1e-5)
    # TensorBoard shows each step once: 1..20 from the first attempt, 21..40 from the resumed one
    # (whatever the killed attempt logged past step 20 is purged).
    shown = tb_scalars(run_dir, "train/loss")
    assert sorted(shown) == list(range(1, 41))
    for step in range(21, 41):
        assert shown[step] == pytest.approx(got[step], abs=1e-5)
    assert tb_scalars(run_dir, "run/attempt") == {1: 0.0, 21: 1.0}
    check_adaptations(adaptive, tmp_path / "straight", run_dir, 20)


@pytest.mark.slow
@pytest.mark.parametrize("adaptive", ["off", "on"])
def test_sigkill_resumes_bit_exact_from_snapshot(tmp_path, adaptive):
    """The same with asynchronous snapshots every 3 steps and no checkpoint before the end: the resume
    takes the newest complete snapshot, and the losses equal those of a run that took no snapshots (so
    taking them does not disturb training either)."""
    train = {"max_steps": 120, "ckpt_every": 1000, "precision": "fp32", "warmup_steps": 5}
    straight = run(snapshot(tmp_path / "plain.yaml", train=train, **ADAPTIVE[adaptive]), tmp_path / "straight")
    expect(straight, 0, "done: 120 steps")

    cfg = snapshot(tmp_path / "cfg.yaml", train=train, resilience={"snapshot_every": 3}, **ADAPTIVE[adaptive])
    run_dir = tmp_path / "killed"
    proc = start(cfg, run_dir)
    wait_for_snapshot(run_dir, 9, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert not (run_dir / "checkpoints" / tag_for(120)).exists()
    resumed = run(cfg, run_dir)
    expect(resumed, 0, "resuming from snapshot snap_", "done: 120 steps")
    want, got = losses(straight.stdout), losses(resumed.stdout)
    first = min(got)
    assert first > 9 and (first - 1) % 3 == 0
    for step in range(first, 121):
        assert got[step] == pytest.approx(want[step], abs=1e-6), step
    check_adaptations(adaptive, tmp_path / "straight", run_dir, first - 1)


@pytest.mark.slow
def test_resume_with_new_split_and_zero_stage(tmp_path):
    """Must-show 3: saved at ZeRO-1, mbs 8, accum 1; resumed at ZeRO-2, mbs 4, accum 2 (same global
    batch): no conversion needed, the loss does not jump (here it even matches the unchanged run)."""
    first = snapshot(tmp_path / "a.yaml", train={"max_steps": 12, "ckpt_every": 6, "zero_stage": 1,
                                                 "micro_batch_size": 8, "grad_accum_steps": 1})
    run_dir = tmp_path / "run"
    before = run(first, run_dir)
    expect(before, 0)
    for path in (run_dir / "checkpoints" / tag_for(12)).iterdir():  # make step 6 the newest
        path.unlink()
    second = snapshot(tmp_path / "b.yaml", train={"max_steps": 12, "ckpt_every": 6, "zero_stage": 2,
                                                  "micro_batch_size": 4, "grad_accum_steps": 2})
    after = run(second, run_dir)
    expect(after, 0, "resume plan for step_00000006: native", "global batch 8 = 4 x 2 x 1 ranks, ZeRO-2")
    old, new = losses(before.stdout), losses(after.stdout)
    assert min(new) == 7
    assert abs(new[7] - old[6]) / old[6] < 0.05
    assert new[7] == pytest.approx(old[7], rel=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("stage_a,stage_b,precision,mode", [
    (1, 3, "bf16", "universal"), (3, 2, "bf16", "universal"),
    (0, 2, "bf16", "universal-from-zero0"), (0, 3, "fp32", "universal-from-zero0")])
def test_resume_across_zero3_and_zero0(tmp_path, stage_a, stage_b, precision, mode):
    """ZeRO stage changes DeepSpeed cannot load directly go through a (normalised) universal checkpoint
    and keep the optimizer state: the resumed loss follows the unchanged run."""
    first = snapshot(tmp_path / "a.yaml", train={"max_steps": 8, "ckpt_every": 4, "zero_stage": stage_a,
                                                 "precision": precision})
    run_dir = tmp_path / "run"
    before = run(first, run_dir)
    expect(before, 0)
    for path in (run_dir / "checkpoints" / tag_for(8)).iterdir():
        path.unlink()
    second = snapshot(tmp_path / "b.yaml", train={"max_steps": 8, "ckpt_every": 4, "zero_stage": stage_b,
                                                  "precision": precision, "micro_batch_size": 2,
                                                  "grad_accum_steps": 2})
    after = run(second, run_dir)
    expect(after, 0, f"resume plan for step_00000004: {mode}", "converted step_00000004")
    old, new = losses(before.stdout), losses(after.stdout)
    for step in range(5, 9):  # another reduction order (and bf16 weights): close, not bit-exact
        assert new[step] == pytest.approx(old[step], rel=0.02)
    assert not any((run_dir / "checkpoints" / universal.UNIVERSAL_DIR).glob("step_*"))


@pytest.mark.slow
def test_global_batch_change_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    expect(run(snapshot(tmp_path / "a.yaml", train={"max_steps": 3, "ckpt_every": 3}), run_dir), 0)
    changed = snapshot(tmp_path / "b.yaml", train={"max_steps": 6, "ckpt_every": 3, "micro_batch_size": 2})
    result = run(changed, run_dir)
    expect(result, EXIT_CONFIG, "cannot resume: ", "global batch changed from 4", f"exiting {EXIT_CONFIG}")
    assert "Traceback" not in result.stdout

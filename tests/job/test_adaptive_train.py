"""The adaptive schedule (issue 21) in the training loop: tiny CPU gpt runs. A synthetic plateau fires one warm
restart where ``decide`` replayed on the logged series says, an injected gradient spike decays the LR, both are
journaled, and a resume right after an adaptation continues exactly as the uninterrupted run."""
import re

import pytest

from helpers.common import TINY, expect, losses, merge, run, snapshot, tb_scalars
from hpc_agent.config.load import build_config
from hpc_agent.core import in_job_journal
from hpc_agent.core.checkpoint_format import tag_for
from hpc_agent.policy.adaptive_lr import decide
from launch.lr_schedule import lr_factor, lr_factor_adaptive, lr_factor_unscaled

STEPS, WARMUP, LR = 16, 2, 1e-3


def _sections(adaptive, **faults):
    return dict(train={"max_steps": STEPS, "warmup_steps": WARMUP, "lr": LR, "ckpt_every": 8, "log_every": 1},
                adaptive=dict(enabled=True, plateau_metric="train", cooldown_steps=0, **adaptive), faults=faults)


def _replay(sections, run_dir, tag="train/loss"):
    """``decide`` on what TensorBoard logged: the adaptations the run should have made."""
    cfg = build_config([merge(TINY, sections)])
    t, a = cfg.train, cfg.adaptive
    loss, norm = tb_scalars(run_dir, tag), tb_scalars(run_dir, "train/grad_norm")
    from hpc_agent.policy.adaptive_lr import ScheduleState

    state, made, ls, ns = ScheduleState(), [], [], []
    for step in range(1, STEPS + 1):
        if step in loss:
            ls.append((step, loss[step]))
        ns.append((step, norm[step]))
        now = lr_factor_unscaled(step, state, t.warmup_steps, t.max_steps, t.min_lr_ratio)
        state, adaptation = decide(state, step, ls, ns, t.grad_clip, a, warmup_steps=t.warmup_steps,
                                   total_steps=t.max_steps, lr_factor_now=now)
        if adaptation is not None:
            made.append((adaptation.kind, step, state))
    return cfg, made


def _adaptations(run_dir):
    decisions, problems = in_job_journal.read(run_dir)
    assert problems == []
    return [d for d in decisions if d.action == in_job_journal.ADAPT_ACTION]


PLATEAU = dict(max_restarts=1, plateau_window=3, plateau_min_rel_improvement=0.9, restart_fraction=1.0,
               restart_warmup_steps=2, decay_factor=0.5, explosion_factor=1e6)
SPIKE = dict(max_restarts=0, explosion_window=3, explosion_factor=10.0, decay_factor=0.5, lr_floor_ratio=0.1)


@pytest.mark.slow
def test_a_plateau_fires_one_warm_restart_where_decide_says(tmp_path):
    sections = _sections(PLATEAU)
    run_dir = tmp_path / "run"
    out = run(snapshot(tmp_path / "cfg.yaml", **sections), run_dir)
    expect(out, 0, "done: 16 steps", "adaptive schedule at step")
    cfg, made = _replay(sections, run_dir)
    assert [(k, s) for k, s, _ in made] == [("warm_restart", made[0][1])], made
    (d,) = _adaptations(run_dir)
    assert (d.cause, d.step, d.patch) == ("adaptive", made[0][1], {}) and d.reason.startswith("warm_restart")
    assert d.evidence and all(len(eval_pair(e)) == 2 for e in d.evidence)
    step, state = made[0][1], made[0][2]
    lr = tb_scalars(run_dir, "train/lr")  # the LR of logged step s is update s - 1's
    t = cfg.train
    for s in range(1, STEPS + 1):
        want = LR * (lr_factor_adaptive(s - 1, state, t.warmup_steps, t.max_steps, t.min_lr_ratio) if s - 1 >= step
                     else lr_factor(s - 1, t.warmup_steps, t.max_steps, t.min_lr_ratio))
        assert lr[s] == pytest.approx(want, rel=1e-5), s
    assert tb_scalars(run_dir, "adaptive/warm_restart") == {step: 1.0}


def eval_pair(text):
    import json

    return json.loads(text)


@pytest.mark.slow
def test_a_gradient_spike_decays_the_lr_and_training_goes_on(tmp_path):
    sections = _sections(SPIKE, grad_spike_at_step=8)
    run_dir = tmp_path / "run"
    out = run(snapshot(tmp_path / "cfg.yaml", **sections), run_dir)
    expect(out, 0, "done: 16 steps", "fault: scaling the gradient", "adaptive schedule at step 8: lr_decay")
    cfg, made = _replay(sections, run_dir)
    assert [(k, s) for k, s, _ in made] == [("lr_decay", 8)]
    (d,) = _adaptations(run_dir)
    assert (d.step, d.cause) == (8, "adaptive") and "LR scale 1 -> 0.5" in d.reason
    t, lr = cfg.train, tb_scalars(run_dir, "train/lr")
    for s in range(9, STEPS + 1):
        base = LR * lr_factor(s - 1, t.warmup_steps, t.max_steps, t.min_lr_ratio)
        assert lr[s] == pytest.approx(max(0.5 * base, min(base, 0.1 * LR)), rel=1e-5), s
    assert tb_scalars(run_dir, "adaptive/lr_scale")[STEPS] == 0.5
    got = losses(out.stdout)
    assert sorted(got) == list(range(1, STEPS + 1)) and all(v == v for v in got.values())  # no NaN
    assert "in-job repair" not in out.stdout


@pytest.mark.slow
def test_a_resume_right_after_an_adaptation_is_exact(tmp_path):
    sections = _sections(SPIKE, grad_spike_at_step=8)  # decided at 8, the checkpoint of step 8 holds it
    cfg = snapshot(tmp_path / "cfg.yaml", **sections)
    run_dir = tmp_path / "run"
    straight = run(cfg, run_dir)
    expect(straight, 0, "done: 16 steps")
    for path in (run_dir / "checkpoints" / tag_for(STEPS)).iterdir():  # make step 8 the newest
        path.unlink()
    resumed = run(cfg, run_dir)
    expect(resumed, 0, f"resuming from checkpoint {tag_for(8)} (step 8)", "done: 16 steps")
    want, got = losses(straight.stdout), losses(resumed.stdout)
    assert min(got) == 9
    for step in range(9, STEPS + 1):
        assert got[step] == pytest.approx(want[step], abs=1e-6), step
    lrs = dict(re.findall(r"\] step (\d+) loss \S+ lr (\S+)", straight.stdout))
    lrs_resumed = dict(re.findall(r"\] step (\d+) loss \S+ lr (\S+)", resumed.stdout))
    assert all(lrs_resumed[s] == lrs[s] for s in lrs_resumed)
    assert len(_adaptations(run_dir)) == 1  # the resumed attempt does not decide it again


@pytest.mark.slow
def test_off_by_default_the_same_spike_changes_nothing(tmp_path):
    sections = _sections(SPIKE, grad_spike_at_step=8)
    sections["adaptive"]["enabled"] = False
    run_dir = tmp_path / "run"
    out = run(snapshot(tmp_path / "cfg.yaml", **sections), run_dir)
    expect(out, 0, "done: 16 steps", "fault: scaling the gradient")
    assert "adaptive schedule" not in out.stdout and _adaptations(run_dir) == []
    t = build_config([merge(TINY, sections)]).train
    lr = tb_scalars(run_dir, "train/lr")
    for s in range(1, STEPS + 1):
        assert lr[s] == pytest.approx(LR * lr_factor(s - 1, t.warmup_steps, t.max_steps, t.min_lr_ratio), rel=1e-6)
    assert tb_scalars(run_dir, "adaptive/lr_scale") == {}


@pytest.mark.slow
def test_an_escalation_rolls_back_through_the_divergence_rollback(tmp_path):
    sections = _sections(dict(SPIKE, escalate_after=1), grad_spike_at_step=8)
    sections["train"]["ckpt_every"] = 4
    run_dir = tmp_path / "run"
    out = run(snapshot(tmp_path / "cfg.yaml", **sections), run_dir)
    expect(out, 0, "done: 16 steps", "adaptive schedule at step 8: escalate_rollback",
           "in-job repair 1 of 2: grad_explosion at step 8", "resumed at step 4", "train.lr 0.0005")
    decisions, problems = in_job_journal.read(run_dir)
    assert problems == []
    assert [(d.action, d.cause, d.step) for d in decisions] == [
        ("adaptive_schedule", "adaptive", 8), ("in_job_repair", "diverged", 8)]
    assert (decisions[1].patch, decisions[1].rollback_to_step) == ({"train.lr": 5e-4}, 4)
    assert all(v == v for v in losses(out.stdout).values())


@pytest.mark.slow
def test_two_ranks_take_rank_0s_decision(tmp_path):
    from helpers.common import run_ranks

    sections = _sections(SPIKE, grad_spike_at_step=8)
    run_dir = tmp_path / "run"
    results = run_ranks(snapshot(tmp_path / "cfg.yaml", slurm={"tasks_per_node": 2}, **sections), run_dir, world=2)
    for r in results:
        assert r.returncode == 0, r.stdout[-4000:]
    assert "adaptive schedule at step 8: lr_decay" in results[0].stdout
    assert [d.step for d in _adaptations(run_dir)] == [8]
    assert tb_scalars(run_dir, "adaptive/lr_scale")[STEPS] == 0.5


@pytest.mark.slow
def test_an_eval_loss_plateau_fires_one_warm_restart_where_decide_says(tmp_path):
    sections = _sections(PLATEAU)
    sections["adaptive"]["plateau_metric"] = "eval"
    sections["train"]["eval_every"] = 2
    run_dir = tmp_path / "run"
    out = run(snapshot(tmp_path / "cfg.yaml", **sections), run_dir)
    expect(out, 0, "done: 16 steps", "eval/loss plateau")
    _, made = _replay(sections, run_dir, "eval/loss")
    assert [k for k, _, _ in made] == ["warm_restart"] and made[0][1] % 2 == 0, made
    assert [d.step for d in _adaptations(run_dir)] == [made[0][1]]


def test_the_grad_spike_fault_is_checked():
    with pytest.raises(Exception, match="faults.grad_spike_at_step"):
        build_config([merge(TINY, {"faults": {"grad_spike_at_step": -1}})])

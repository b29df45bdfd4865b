"""hpc_agent.policy.adaptive_lr and the ``adaptive:`` section: the adaptive schedule's decisions and LR factor (pure,
table-driven): synthetic loss and gradient-norm series are fed step by step, as the training loop will."""
from __future__ import annotations

import json
import math
import random
from typing import Callable, List, Tuple

import pytest

from hpc_agent.config.adaptive import AdaptiveConfig
from hpc_agent.config.load import build_config
from hpc_agent.config.problems import ConfigError
from hpc_agent.policy.adaptive_lr import (ESCALATE_ROLLBACK, LR_DECAY, WARM_RESTART, Adaptation, ScheduleState, decide,
                                          restart_factor, scaled_factor, trim_history)
from launch.lr_schedule import lr_factor, lr_factor_adaptive, lr_factor_unscaled

TOTAL, WARMUP, MIN_LR = 1000, 10, 0.1


def config(**changes) -> AdaptiveConfig:
    values = dict(enabled=True, plateau_metric="train", restart_warmup_steps=10)
    values.update(changes)
    return AdaptiveConfig(**values)


def falling_then_flat(flat_from: int) -> Callable[[int], float]:
    """A loss that falls by 1e-3 per step (4e-4 relative: more than the default threshold) until
    ``flat_from``, then stays where it got to."""
    return lambda s: 3.0 - 1e-3 * min(s, flat_from)


def steady_norm(s: int) -> float:
    return 1.0 + 0.1 * math.sin(s)


def simulate(cfg: AdaptiveConfig, loss: Callable[[int], float] = falling_then_flat(10 ** 9),
             norm: Callable[[int], float] = steady_norm, *, eval_every: int = 1, grad_clip: float = 1.0,
             steps: int = TOTAL, trim: bool = True) -> Tuple[ScheduleState, List[Adaptation]]:
    """The loop's side: append this step's points, trim, ask :func:`decide` with the schedule's factor."""
    state, events = ScheduleState(), []
    losses: List[Tuple[int, float]] = []
    norms: List[Tuple[int, float]] = []
    for step in range(1, steps + 1):
        norms.append((step, norm(step)))
        if step % eval_every == 0:
            losses.append((step, loss(step)))
        if trim:
            losses, norms = trim_history(losses, norms, cfg)
        now = lr_factor_unscaled(step, state, WARMUP, TOTAL, MIN_LR)
        state, adaptation = decide(state, step, losses, norms, grad_clip, cfg, warmup_steps=WARMUP,
                                   total_steps=TOTAL, lr_factor_now=now)
        if adaptation is not None:
            events.append(adaptation)
    return state, events


def spikes(at: dict, base: Callable[[int], float] = steady_norm) -> Callable[[int], float]:
    return lambda s: at.get(s, base(s))


# --- plateau -> warm restart ------------------------------------------------------------------------------
# (name, config changes, loss flat from, eval_every, expected warm-restart steps)
PLATEAUS = [
    # The window 601..610 holds only flat points and the best before it (step 600) is as good: fires at 610,
    # once (at 609 step 599's loss was still 4e-4 above the window's best).
    ("fires-once", dict(max_restarts=1), 600, 1, [610]),
    # Each further restart needs a window wholly after the last adaptation and the cooldown behind it.
    ("cooldown-spaces-restarts", dict(max_restarts=3), 600, 1, [610, 660, 710]),
    ("longer-cooldown", dict(max_restarts=3, cooldown_steps=100), 600, 1, [610, 710, 810]),
    ("max-restarts-0-never", dict(max_restarts=0), 600, 1, []),
    # Points are evaluations: window 5 of every 20th step; 600 is the first flat point.
    ("eval-points", dict(max_restarts=1, plateau_window=5), 600, 20, [700]),
    # At step 110 the cosine is still at 0.98 of the peak: a restart to 0.5 would lower the LR, so none...
    ("lr-above-restart-target", dict(max_restarts=1), 100, 1, [540]),
    # ...unless the restart goes to the full peak.
    ("restart-to-full-peak", dict(max_restarts=1, restart_fraction=1.0), 100, 1, [110]),
    # Flat from the start: nothing during the warmup (steps < 10), then the LR (1.0 at step 10) is above 0.5.
    ("steadily-falling-never", dict(), 10 ** 9, 1, []),
    # Near the end there is no room for a re-warm and a second decay (step + 2 x 100 >= 999).
    ("no-room-near-the-end", dict(max_restarts=1, restart_warmup_steps=100), 900, 1, []),
    ("big-threshold-fires-early", dict(max_restarts=1, plateau_min_rel_improvement=0.5), 10 ** 9, 1, [540]),
]


@pytest.mark.parametrize("name, changes, flat_from, eval_every, expected", PLATEAUS, ids=[p[0] for p in PLATEAUS])
def test_plateau_makes_a_warm_restart_at_the_expected_steps(name, changes, flat_from, eval_every, expected):
    state, events = simulate(config(**changes), falling_then_flat(flat_from), eval_every=eval_every)
    assert [(e.kind, e.step) for e in events] == [(WARM_RESTART, s) for s in expected]
    assert state.restarts == len(expected)
    for e in events:
        assert e.metric == "train/loss" and e.lr_scale == e.lr_scale_before == 1.0
        assert len(e.evidence) == changes.get("plateau_window", 10) + 1  # the best before + the window
        assert e.evidence[-1][0] == e.step and "plateau" in e.reason


def test_lr_above_target_case_fires_where_the_cosine_crosses_the_target():
    """The 'lr-above-restart-target' row's 540 is the first step whose factor is below 0.5."""
    crossing = next(s for s in range(WARMUP, TOTAL) if lr_factor(s, WARMUP, TOTAL, MIN_LR) < 0.5)
    assert crossing == 540


def test_a_falling_loss_never_restarts():
    _, events = simulate(config(max_restarts=5))
    assert events == []


# --- gradient explosions -> decay, floor, escalation --------------------------------------------------------
# (name, config changes, norm spikes {step: norm}, expected [(kind, step)], expected final lr_scale)
EXPLOSIONS = [
    ("one-spike-halves", dict(), {200: 20.0}, [(LR_DECAY, 200)], 0.5),
    ("below-factor-ignored", dict(), {200: 9.0}, [], 1.0),
    ("nan-is-an-explosion", dict(), {200: float("nan")}, [(LR_DECAY, 200)], 0.5),
    ("inf-is-an-explosion", dict(), {200: float("inf")}, [(LR_DECAY, 200)], 0.5),
    ("nan-needs-no-full-window", dict(), {20: float("nan")}, [(LR_DECAY, 20)], 0.5),
    ("spike-needs-a-full-window", dict(), {40: 20.0}, [], 1.0),
    ("nothing-in-the-warmup", dict(), {5: float("nan")}, [], 1.0),
    # Spaced beyond the cooldown and the escalation window: each halves, down to the floor, then nothing.
    ("floor", dict(escalate_after=0), {200: 20.0, 300: 20.0, 400: 20.0, 500: 20.0, 600: 20.0},
     [(LR_DECAY, 200), (LR_DECAY, 300), (LR_DECAY, 400), (LR_DECAY, 500)], 0.1),
    ("cooldown-skips-a-decay", dict(escalate_after=0), {200: 20.0, 230: 20.0, 260: 20.0},
     [(LR_DECAY, 200), (LR_DECAY, 260)], 0.25),
    # Three explosions within 200 steps: the first decays, the third escalates (the second is in the cooldown).
    ("repeated-escalate", dict(), {200: 20.0, 201: 20.0, 202: 20.0}, [(LR_DECAY, 200), (ESCALATE_ROLLBACK, 202)], 0.5),
    ("escalate-after-0-never", dict(escalate_after=0), {200: 20.0, 201: 20.0, 202: 20.0}, [(LR_DECAY, 200)], 0.5),
    # 200 has left the 200-step window when 500 comes: two in the window, no escalation.
    ("spread-out-no-escalation", dict(), {200: 20.0, 300: 20.0, 500: 20.0},
     [(LR_DECAY, 200), (LR_DECAY, 300), (LR_DECAY, 500)], 0.125),
    ("escalate-after-1", dict(escalate_after=1), {200: 20.0}, [(ESCALATE_ROLLBACK, 200)], 1.0),
]


@pytest.mark.parametrize("name, changes, at, expected, scale", EXPLOSIONS, ids=[e[0] for e in EXPLOSIONS])
def test_gradient_explosions(name, changes, at, expected, scale):
    state, events = simulate(config(**changes), norm=spikes(at))
    assert [(e.kind, e.step) for e in events] == expected
    assert state.lr_scale == pytest.approx(scale)
    for e in events:
        assert e.metric == "train/grad_norm" and e.evidence[-1][0] == e.step
        json.dumps(e.to_dict(), allow_nan=False)  # a NaN norm in the evidence is still valid JSON
    for e in events:
        if e.kind == LR_DECAY:
            assert e.lr_scale == pytest.approx(max(e.lr_scale_before * 0.5, 0.1))


def test_escalation_names_the_first_explosion_and_clears_the_count():
    state, events = simulate(config(), norm=spikes({200: 20.0, 201: 20.0, 202: 20.0}))
    escalation = events[-1]
    assert escalation.since_step == 200 and "200, 201, 202" in escalation.reason
    assert escalation.lr_scale == escalation.lr_scale_before  # the rollback lowers the LR, not this
    assert state.explosions == () and state.last_adapt_step == 202


def test_decayed_lr_stays_at_or_above_the_floor_and_below_the_schedule():
    cfg = config(escalate_after=0, lr_floor_ratio=0.2)
    at = {s: 50.0 for s in range(100, 1000, 60)}
    state, events = simulate(cfg, norm=spikes(at))
    assert state.lr_scale == pytest.approx(0.2) and len(events) == 3  # 0.5, 0.25, then floored at 0.2
    for step in range(TOTAL + 20):
        base = lr_factor(step, WARMUP, TOTAL, MIN_LR)
        value = lr_factor_adaptive(step, state, WARMUP, TOTAL, MIN_LR)
        assert min(base, 0.2) - 1e-12 <= value <= base + 1e-12


# (name, norms from 300 to 339, clip_streak, grad_clip, expected [(kind, step)], explosions counted)
CLIP = [
    # 20 clipped steps from 300: an explosion at 319; the next streak (320..339) counts, inside the cooldown.
    ("streak", 1.5, 20, 1.0, [(LR_DECAY, 319)], (319, 339)),
    ("off-by-default", 1.5, 0, 1.0, [], ()),
    ("no-clip-no-streak", 1.5, 20, 0.0, [], ()),
    ("at-the-bound-counts", 1.0, 20, 1.0, [(LR_DECAY, 319)], (319, 339)),
    ("under-the-bound", 0.99, 20, 1.0, [], ()),
    ("streak-longer-than-the-run-of-clips", 1.5, 41, 1.0, [], ()),
]


@pytest.mark.parametrize("name, clipped, streak, clip, expected, counted", CLIP, ids=[c[0] for c in CLIP])
def test_clip_streak(name, clipped, streak, clip, expected, counted):
    norm = lambda s: clipped if 300 <= s < 340 else 0.5  # noqa: E731 - never 10x the median
    state, events = simulate(config(clip_streak=streak), norm=norm, grad_clip=clip, steps=400)
    assert [(e.kind, e.step) for e in events] == expected
    assert state.explosions == counted
    if events:
        assert len(events[0].evidence) == streak and "train.grad_clip" in events[0].reason


def test_explosion_wins_over_a_plateau_at_the_same_step():
    state, events = simulate(config(max_restarts=1), falling_then_flat(600), spikes({610: 30.0}))
    # The decay restarted the plateau's patience: the next window starts after 610 (and the cooldown).
    assert [(e.kind, e.step) for e in events] == [(LR_DECAY, 610), (WARM_RESTART, 660)]
    assert state.lr_scale == 0.5 and state.restart_step == 660


def test_disabled_or_stale_evidence_decides_nothing():
    norms = [(s, 1.0) for s in range(1, 60)] + [(60, 50.0)]
    kwargs = dict(warmup_steps=0, total_steps=TOTAL, lr_factor_now=0.3)
    assert decide(ScheduleState(), 60, [], norms, 1.0, AdaptiveConfig(), **kwargs) == (ScheduleState(), None)
    # The spike belongs to step 60: a call for step 61 that got no new norm does not judge it again.
    assert decide(ScheduleState(), 61, [], norms, 1.0, config(), **kwargs) == (ScheduleState(), None)
    assert decide(ScheduleState(), 60, [], norms, 1.0, config(), **kwargs)[1].kind == LR_DECAY


def test_trimmed_history_decides_exactly_as_the_whole_history():
    rng = random.Random(7)
    noise = {s: rng.gauss(0, 0.002) for s in range(TOTAL + 1)}
    at = {s: rng.choice([20.0, float("nan"), 3.0]) for s in rng.sample(range(50, TOTAL), 12)}
    loss = lambda s: falling_then_flat(500)(s) + noise[s]  # noqa: E731
    for cfg in (config(max_restarts=3, clip_streak=5), config(plateau_window=3, escalate_after=0)):
        whole = simulate(cfg, loss, spikes(at, lambda s: 1.0 + noise[s] * 300), grad_clip=1.3, trim=False)
        assert simulate(cfg, loss, spikes(at, lambda s: 1.0 + noise[s] * 300), grad_clip=1.3) == whole
        assert whole[1], "the series should make some adaptations"


# --- the LR factor --------------------------------------------------------------------------------------
@pytest.mark.parametrize("warmup, total, min_ratio", [(10, 100, 0.1), (0, 50, 0.0), (30, 31, 0.5), (5, 5, 0.1),
                                                      (100, 2000, 0.05)])
def test_initial_state_is_exactly_the_base_schedule(warmup, total, min_ratio):
    for step in range(total + 10):
        assert lr_factor_adaptive(step, ScheduleState(), warmup, total, min_ratio) == lr_factor(step, warmup, total,
                                                                                               min_ratio)


def restarted(r: int, fraction: float = 0.5, warm: int = 20, scale: float = 1.0) -> Tuple[ScheduleState, ScheduleState]:
    """(before, after) a warm restart decided at ``r``, as decide makes it."""
    before = ScheduleState(lr_scale=scale, lr_floor_ratio=0.1 if scale != 1.0 else 0.0)
    now = lr_factor_unscaled(r, before, WARMUP, TOTAL, MIN_LR)
    return before, ScheduleState(lr_scale=scale, lr_floor_ratio=before.lr_floor_ratio, restart_step=r,
                                 restart_start_factor=now, restart_peak_fraction=fraction, restart_warmup_steps=warm,
                                 restarts=1, last_adapt_step=r)


@pytest.mark.parametrize("r, fraction, warm, scale", [(600, 0.5, 20, 1.0), (800, 0.7, 50, 1.0), (600, 0.5, 0, 1.0),
                                                      (700, 0.5, 20, 0.5), (900, 1.0, 1, 0.25)])
def test_restart_is_continuous_rewarms_to_the_fraction_then_decays(r, fraction, warm, scale):
    before, after = restarted(r, fraction, warm, scale)
    f = lambda s: lr_factor_adaptive(s, after, WARMUP, TOTAL, MIN_LR)  # noqa: E731
    if warm:  # the restart step keeps the LR it had: no jump when the decision is made
        assert f(r) == lr_factor_adaptive(r, before, WARMUP, TOTAL, MIN_LR)
    assert lr_factor_unscaled(r + warm, after, WARMUP, TOTAL, MIN_LR) == pytest.approx(fraction)
    assert f(r + warm) == pytest.approx(scaled_factor(fraction, after))
    rewarm = [f(s) for s in range(r, r + warm + 1)]
    assert rewarm == sorted(rewarm)
    decay = [f(s) for s in range(r + warm, TOTAL)]
    assert decay == sorted(decay, reverse=True)
    assert lr_factor_unscaled(TOTAL - 1, after, WARMUP, TOTAL, MIN_LR) == pytest.approx(MIN_LR)
    assert lr_factor_unscaled(TOTAL + 50, after, WARMUP, TOTAL, MIN_LR) == pytest.approx(MIN_LR)
    for s in range(r):  # before the restart: as it was
        assert f(s) == lr_factor_adaptive(s, before, WARMUP, TOTAL, MIN_LR)


def test_restart_factor_before_its_restart_is_an_error():
    with pytest.raises(ValueError):
        restart_factor(5, ScheduleState(), TOTAL, MIN_LR)
    with pytest.raises(ValueError):
        restart_factor(5, restarted(10)[1], TOTAL, MIN_LR)


@pytest.mark.parametrize("factor, scale, floor, expected", [
    (0.8, 1.0, 0.0, 0.8),     # no decay: the factor itself
    (0.8, 0.5, 0.1, 0.4),
    (0.8, 0.1, 0.2, 0.2),     # the decay stops at the floor
    (0.15, 0.5, 0.2, 0.15),   # the schedule alone is below the floor: it stands
    (0.3, 0.5, 0.2, 0.2),
])
def test_scaled_factor(factor, scale, floor, expected):
    assert scaled_factor(factor, ScheduleState(lr_scale=scale, lr_floor_ratio=floor)) == pytest.approx(expected)


# --- state in the checkpoint ----------------------------------------------------------------------------
def test_state_round_trips_exactly_and_old_checkpoints_get_the_defaults():
    state, _ = simulate(config(escalate_after=0), falling_then_flat(600), spikes({200: 20.0, 650: 20.0}),
                        steps=700)
    assert state.restarts and state.lr_scale < 1 and state.explosions
    data = json.loads(json.dumps(state.to_dict()))
    assert ScheduleState.from_dict(data) == state
    assert ScheduleState.from_dict(state.to_dict()) == state
    assert ScheduleState.from_dict(None) == ScheduleState() == ScheduleState.from_dict({})
    partial = {"lr_scale": 0.5, "lr_floor_ratio": 0.1, "future_field": [1, 2]}
    assert ScheduleState.from_dict(partial) == ScheduleState(lr_scale=0.5, lr_floor_ratio=0.1)


def test_resuming_from_any_step_decides_as_the_uninterrupted_run():
    """What the checkpoint holds (the state and the trimmed series) is all the decisions depend on."""
    cfg = config(max_restarts=2)
    loss, norm = falling_then_flat(600), spikes({200: 20.0, 630: float("nan")})
    whole = simulate(cfg, loss, norm)
    state, events = ScheduleState(), []
    losses: List[Tuple[int, float]] = []
    norms: List[Tuple[int, float]] = []
    for step in range(1, TOTAL + 1):
        if step % 97 == 0:  # a save and a resume: everything through JSON
            saved = json.loads(json.dumps({"state": state.to_dict(), "losses": losses, "norms": norms}))
            state = ScheduleState.from_dict(saved["state"])
            losses, norms = [tuple(p) for p in saved["losses"]], [tuple(p) for p in saved["norms"]]
        norms.append((step, norm(step)))
        losses.append((step, loss(step)))
        losses, norms = trim_history(losses, norms, cfg)
        now = lr_factor_unscaled(step, state, WARMUP, TOTAL, MIN_LR)
        state, adaptation = decide(state, step, losses, norms, 1.0, cfg, warmup_steps=WARMUP, total_steps=TOTAL,
                                   lr_factor_now=now)
        events += [adaptation] if adaptation else []
    assert (state, events) == whole


# --- the adaptive: section ------------------------------------------------------------------------------
def test_off_by_default_and_loads_with_the_rest():
    cfg = build_config([{}])
    assert cfg.adaptive == AdaptiveConfig() and cfg.adaptive.enabled is False
    on = build_config([{"adaptive": {"enabled": True}, "train": {"eval_every": 100}}])
    assert on.adaptive.enabled is True


def test_every_bad_value_is_reported_at_once_with_what_is_accepted():
    bad = dict(plateau_metric="val", plateau_window=0, plateau_min_rel_improvement=1.5, restart_fraction=0.0,
               restart_warmup_steps=-1, max_restarts=-1, explosion_factor=1.0, explosion_window=2, clip_streak=-3,
               decay_factor=1.0, lr_floor_ratio=1.0, escalate_after=-1, escalate_window=0, cooldown_steps=True)
    with pytest.raises(ConfigError) as info:
        AdaptiveConfig(**bad)
    found = {p.key: p.expected for p in info.value.problems}
    assert set(found) == {f"adaptive.{k}" for k in bad}
    assert "eval or train" in found["adaptive.plateau_metric"] and "e.g. 0.5" in found["adaptive.decay_factor"]


# (layer, key, fragment of the fix)
CROSS = [
    ({"adaptive": {"enabled": True}}, "adaptive.plateau_metric", "train.eval_every"),
    ({"adaptive": {"enabled": True, "plateau_metric": "train", "clip_streak": 20}, "train": {"grad_clip": 0.0}},
     "adaptive.clip_streak", "train.grad_clip"),
    ({"adaptive": {"enabled": True, "plateau_metric": "train", "restart_fraction": 0.1}},
     "adaptive.restart_fraction", "train.min_lr_ratio"),
    ({"adaptive": {"enabled": True, "plateau_metric": "train"}, "train": {"command": ["python", "train.py"]}},
     "adaptive.enabled", "train.command"),
]


@pytest.mark.parametrize("layer, key, fragment", CROSS, ids=[c[1] for c in CROSS])
def test_settings_another_section_makes_useless_name_the_fix(layer, key, fragment):
    with pytest.raises(ConfigError) as info:
        build_config([layer])
    found = {p.key: p.expected for p in info.value.problems}
    assert fragment in found[key]
    disabled = {**layer, "adaptive": {**layer["adaptive"], "enabled": False}}
    build_config([disabled])  # only an enabled section is judged against the others


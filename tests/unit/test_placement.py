"""The placement chooser (hpc_agent.policy.partitions.choose) and its inputs (hpc_agent.policy.partitions.candidates): table tests.

Each row of CASES is a set of candidates and the partition that must win, with a phrase its reason must
contain. Then the option builder: what fits where (and with which OOM-ladder rung), the time model, and the
watcher's rule after a GPU OOM (hpc_agent.policy.partitions.weigh_partitions): move to the bigger GPU when that finishes
sooner, else take the rung in place.
"""
from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

from hpc_agent.config.load import load_config
from hpc_agent.policy.partitions import (Candidate, candidates, change_factor, choose, fmt_duration, fmt_size,
                                         step_seconds)

H = 3600.0
SMALL = dict(gpu_type="a10", gpu_gib=24.0, gpus=1)
BIG = dict(gpu_type="h100", gpu_gib=80.0, gpus=1)


def cand(name, **kw):
    base = dict(fits=True, start_s=0.0, run_s=H)
    base.update(kw)
    return Candidate(name, **base)


CASES = [
    # (id, candidates, winner, phrase in the reason)
    ("only the 80 GiB GPU fits",
     [cand("gpu_small", **SMALL, fits=False, need_bytes=40 * 2**30), cand("gpu_big", **BIG, run_s=0.3 * H)],
     "gpu_big", "only partition"),
    ("both fit and start now: the tie goes to the smaller GPU",
     [cand("gpu_big", **BIG, run_s=60), cand("gpu_small", **SMALL, run_s=200)],
     "gpu_small", "smaller GPU"),
    ("the small one is busy for 2 h: the big one finishes first",
     [cand("gpu_small", **SMALL, start_s=2 * H, run_s=200), cand("gpu_big", **BIG, run_s=60)],
     "gpu_big", "finishes first"),
    ("earliest finish, not earliest start: a later start on faster GPUs wins",
     [cand("gpu_small", **SMALL, start_s=0, run_s=10 * H), cand("gpu_big", **BIG, start_s=1 * H, run_s=3 * H)],
     "gpu_big", "finishes first"),
    ("the user's explicit partition wins even when it finishes later",
     [cand("gpu_small", **SMALL, start_s=5 * H, explicit=True), cand("gpu_big", **BIG)],
     "gpu_small", "you named partition gpu_small"),
    ("a partition the user may not use is out, whatever its speed",
     [cand("gpu_big", **BIG, run_s=60, blocked="you may not use this partition (sbatch: Invalid account)"),
      cand("gpu_small", **SMALL, start_s=H)],
     "gpu_small", "only partition"),
    ("a missing time estimate ranks every candidate by start",
     [cand("gpu_small", **SMALL, start_s=600, run_s=None), cand("gpu_big", **BIG, start_s=1200, run_s=None)],
     "gpu_small", "ranked by start"),
    ("one missing time estimate: by start, and the reason names it",
     [cand("mystery", gpu_type="x9", gpu_gib=None, fits=None, start_s=7200, run_s=None),
      cand("gpu_small", **SMALL, start_s=0)],
     "gpu_small", "no time estimate for mystery"),
    ("an unknown start ranks last",
     [cand("slowq", **SMALL, start_s=None), cand("gpu_big", **BIG, start_s=3 * H)],
     "gpu_big", "finishes first"),
    ("a tie goes to the cheaper partition before the smaller GPU",
     [cand("gpu_small", **SMALL, run_s=H, cost_per_gpu_hour=3.0), cand("gpu_big", **BIG, run_s=H, cost_per_gpu_hour=1.0)],
     "gpu_big", "cheaper"),
    ("a known cost beats an unknown one in a tie",
     [cand("gpu_small", **SMALL), cand("gpu_big", **BIG, cost_per_gpu_hour=2.0)],
     "gpu_big", "its cost is known"),
    ("a known fit beats an unknown one in a tie",
     [cand("untyped", gpu_type=None, gpu_gib=None, fits=None), cand("gpu_big", **BIG)],
     "gpu_big", "its fit is known"),
    ("as is beats a ladder rung in a tie on the same GPU",
     [cand("p2", **SMALL, change={"train.activation_checkpointing": True}, change_text="ckpt"), cand("p1", **SMALL)],
     "p1", "as is"),
    ("a CPU job leaves the GPU partitions alone in a tie",
     [cand("gpu_small", **SMALL, fits=None, run_s=None, node_gpus=2), cand("cpu", fits=None, run_s=None)],
     "cpu", "no GPUs"),
    ("the default partition wins an otherwise exact tie",
     [cand("high"), cand("low", default=True), cand("lowcancel")],
     "low", "default partition"),
    ("an exact tie is settled by name, deterministically",
     [cand("p2", **SMALL), cand("p1", **SMALL)],
     "p1", "by name"),
    ("just outside the tolerance is not a tie",
     [cand("gpu_small", **SMALL, run_s=H + 301), cand("gpu_big", **BIG, run_s=H)],
     "gpu_big", "finishes first"),
]


@pytest.mark.parametrize("rows, winner, phrase", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_choose(rows, winner, phrase):
    choice = choose(rows, tolerance_s=300)
    assert choice.winner is not None and choice.winner.partition == winner, choice.reason
    assert phrase in choice.reason, choice.reason
    assert [r.candidate.partition for r in choice.rows] == [c.partition for c in rows]  # every candidate shown
    verdicts = {r.candidate.partition: r.verdict for r in choice.rows}
    assert verdicts[winner].startswith("chosen")
    assert all(v.startswith("out:") for c, v in ((c, verdicts[c.partition]) for c in rows) if not c.usable)
    table = "\n".join(choice.table())
    assert table.splitlines()[0].split()[:3] == ["partition", "gpu", "fits"] and winner in table
    assert choice.to_dict()["winner"] == winner and choice.patch["slurm.partition"] == winner


def test_after_a_node_failure_a_partition_with_no_node_left_is_out_and_the_run_moves():
    """The watcher gathers the facts with the failed node excluded: sbatch --test-only refuses the partition
    whose only node it was, so the run moves, keeping the exclusion."""
    from hpc_agent.policy.decide import Situation, decide

    cfg = load_config("quickstart", ["slurm.gpus_per_node=1", "slurm.tasks_per_node=1", "slurm.partition=gpu_small",
                                     "placement.mode=auto"])
    gone = (NS(name="gpu_small", gpu_type="a10", gpu_gib=24.0, start_s=None,
               blocked="no node of it can run the job (sbatch: Requested node configuration is not available)"),
            NS(name="gpu_big", gpu_type="h100", gpu_gib=80.0, blocked="", start_s=0.0))
    decision = decide("node_fail", (), cfg, Situation(job_id="7", nodes=("node3",), placement=gone))
    assert decision.action == "resubmit"
    assert decision.patch == {"slurm.exclude": "node3", "slurm.partition": "gpu_big"}, decision.reason
    assert "move to gpu_big as is" in decision.reason


def test_nothing_can_run_it_names_every_reason():
    rows = [cand("gpu_small", **SMALL, fits=False), cand("gpu_big", **BIG, blocked="partition state is down")]
    choice = choose(rows)
    assert choice.winner is None and choice.patch == {}
    assert "gpu_small: does not fit" in choice.reason and "gpu_big: partition state is down" in choice.reason


def test_no_candidates_at_all():
    assert choose([]).winner is None


@pytest.mark.parametrize("seconds, text", [(None, "?"), (0, "<1s"), (0.4, "<1s"), (45, "45s"), (60, "1m"),
                                           (3599, "1h00m"), (7500, "2h05m"), (3 * 86400 + 4 * 3600, "3d04h"),
                                           (float("inf"), "never")])
def test_durations(seconds, text):
    assert fmt_duration(seconds) == text


@pytest.mark.parametrize("size, text", [(0, "1M"), (300 * 2**20, "300M"), (2**30 - 2**20, "1023M"), (2**30, "1.0G"),
                                        (12.34 * 2**30, "12.3G")])
def test_sizes(size, text):
    assert fmt_size(size) == text


def test_sub_second_and_sub_gib_figures_read_as_such_in_the_table():
    """A tiny CPU job: it needs MiBs, runs in under a second, and the loser finishes less than a second later."""
    a = Candidate("a", need_bytes=300 * 2**20, fits=True, start_s=0.0, run_s=0.4, default=True)
    b = Candidate("b", need_bytes=300 * 2**20, fits=True, start_s=0.3, run_s=0.4)
    choice = choose([a, b], tolerance_s=0)
    table = "\n".join(choice.table())
    assert "0.0G" not in table and "300M" in table and "<1s" in table, table
    assert "finishes <1s later" in table and "now later" not in table, table


# --- the options: what fits where, and how long it takes ----------------------------------------------
def gpt(*extra):
    """~1.2 B parameters: model states alone (16-bit + Adam) need ~20 GiB, too much for a 24 GiB GPU as is."""
    return load_config("quickstart", ["slurm.gpus_per_node=1", "slurm.tasks_per_node=1", "train.workload=gpt",
                                      "model.n_layers=24", "model.d_model=2048", "model.n_heads=16",
                                      "model.seq_len=1024", "train.micro_batch_size=4", "train.precision=bf16",
                                      "train.max_steps=10000", *extra])


def facts(small_start=0.0, big_start=0.0):
    return [NS(name="gpu_small", gpu_type="a10", gpu_gib=24.0, gpus_per_node=2, blocked="", start_s=small_start),
            NS(name="gpu_big", gpu_type="h100", gpu_gib=80.0, gpus_per_node=2, blocked="", start_s=big_start),
            NS(name="low", gpu_type=None, gpu_gib=None, gpus_per_node=0, start_s=None,
               blocked="0 GPU(s) per node; the job asks for 1")]


def test_a_big_model_needs_offload_on_the_small_gpu_and_runs_as_is_on_the_big_one():
    rows = {c.partition: c for c in candidates(gpt(), facts(), remaining_steps=10000)}
    assert rows["gpu_big"].change == {} and rows["gpu_big"].fits
    assert rows["gpu_small"].fits and rows["gpu_small"].change.get("train.offload") == "optimizer"
    assert rows["gpu_small"].need_bytes <= 24 * 2**30 * 0.9 < rows["gpu_big"].need_bytes
    assert rows["low"].blocked and rows["low"].need_bytes is None  # not even estimated
    # h100 has ~8x the a10's peak, and offload + checkpointing slow the a10 further.
    assert rows["gpu_small"].run_s > 8 * rows["gpu_big"].run_s
    assert choose(list(rows.values())).winner.partition == "gpu_big"


def test_a_small_model_fits_both_and_the_tie_goes_to_the_small_gpu_unless_it_is_busy():
    small = load_config("quickstart", ["slurm.gpus_per_node=1", "slurm.tasks_per_node=1", "train.max_steps=200"])
    assert choose(candidates(small, facts(), remaining_steps=200)).winner.partition == "gpu_small"
    busy = choose(candidates(small, facts(small_start=1800), remaining_steps=200))
    assert busy.winner.partition == "gpu_big" and "finishes first" in busy.reason


def test_after_an_oom_the_partition_it_ran_on_takes_at_least_one_rung():
    cfg = load_config("quickstart", ["slurm.gpus_per_node=1", "slurm.tasks_per_node=1", "train.micro_batch_size=4"])
    rows = {c.partition: c for c in candidates(cfg, facts(), remaining_steps=100, oom_on="gpu_small")}
    assert rows["gpu_small"].change == {"train.micro_batch_size": 2, "train.grad_accum_steps": 2}
    assert rows["gpu_big"].change == {}


def test_time_model():
    cfg = gpt()
    a10, h100 = step_seconds(cfg, "a10", 0.35), step_seconds(cfg, "h100", 0.35)
    assert a10 / h100 == pytest.approx(989 / 125)
    assert step_seconds(cfg, "h100", 0.35, measured=("a10", 2.0)) == pytest.approx(2.0 * 125 / 989)
    assert step_seconds(cfg, "unknown-gpu", 0.35) is None
    assert change_factor(cfg.train, {"train.activation_checkpointing": True}) == pytest.approx(4 / 3)
    assert change_factor(cfg.train, {"train.micro_batch_size": 1, "train.grad_accum_steps": 4}) == pytest.approx(1.1 ** 2)
    mine = load_config("quickstart", ["slurm.gpus_per_node=1", "slurm.tasks_per_node=1",
                                      "train.workload=classifier"])
    assert step_seconds(mine, "h100", 0.35) is None  # no FLOPs count for it: the chooser ranks by start


def test_costs_by_partition_then_gpu_type():
    cfg = gpt("placement.cost_per_gpu_hour={gpu_big: 4.0, a10: 1.0}")
    rows = {c.partition: c for c in candidates(cfg, facts(), remaining_steps=10000)}
    assert rows["gpu_big"].cost_per_gpu_hour == 4.0 and rows["gpu_small"].cost_per_gpu_hour == 1.0
    assert rows["gpu_big"].cost == pytest.approx(4.0 * rows["gpu_big"].run_s / 3600)


# --- the watcher's rule after a GPU OOM: the bigger GPU when it finishes sooner, else the rung -------------
def _oom_decision(big_start):
    from hpc_agent.policy.decide import Situation, decide

    cfg = load_config("quickstart", ["slurm.gpus_per_node=1", "slurm.tasks_per_node=1", "slurm.partition=gpu_small",
                                     "train.micro_batch_size=4", "train.max_steps=2000", "placement.mode=auto",
                                     # a small model: seconds either way, a tie within the default 5 min
                                     "placement.tolerance_s=0"])
    situation = Situation(job_id="7", placement=tuple(facts(big_start=big_start)[:2]), remaining_steps=1500)
    return decide("gpu_oom", (), cfg, situation)


def test_after_an_oom_a_free_bigger_gpu_wins():
    decision = _oom_decision(big_start=0.0)
    assert decision.action == "resubmit" and decision.patch == {"slurm.partition": "gpu_big"}, decision.reason
    assert "move to gpu_big as is" in decision.reason
    table = decision.to_dict()["placement"]["table"]
    assert any(line.startswith("gpu_big") and line.endswith("chosen") for line in table), table


def test_after_an_oom_a_busy_bigger_gpu_loses_to_the_rung():
    decision = _oom_decision(big_start=6 * H)
    assert decision.action == "resubmit", decision.reason
    assert decision.patch == {"train.micro_batch_size": 2, "train.grad_accum_steps": 2}, decision.reason
    assert "stay on gpu_small" in decision.reason and decision.to_dict()["placement"]["winner"] == "gpu_small"


def test_within_the_tolerance_the_rung_in_place_keeps_the_big_gpus_free():
    from hpc_agent.policy.decide import Situation, decide

    cfg = load_config("quickstart", ["slurm.gpus_per_node=1", "slurm.tasks_per_node=1", "slurm.partition=gpu_small",
                                     "train.micro_batch_size=4", "placement.mode=auto"])
    decision = decide("gpu_oom", (), cfg, Situation(job_id="7", placement=tuple(facts()[:2]), remaining_steps=100))
    assert "train.micro_batch_size" in decision.patch and "slurm.partition" not in decision.patch
    assert "finish within 5m of each other" in decision.reason and "smaller GPU" in decision.reason


def test_without_facts_or_with_placement_off_the_ladder_decides_as_before():
    from hpc_agent.policy.decide import Situation, decide

    cfg = load_config("quickstart", ["slurm.gpus_per_node=1", "slurm.tasks_per_node=1", "slurm.partition=gpu_small",
                                     "train.micro_batch_size=4"])
    plain = decide("gpu_oom", (), cfg, Situation(job_id="7"))
    off = decide("gpu_oom", (), cfg, Situation(job_id="7", placement=tuple(facts()[:2])))
    assert plain == off and "placement" not in off.to_dict()
    assert off.patch == {"train.micro_batch_size": 2, "train.grad_accum_steps": 2}

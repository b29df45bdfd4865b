"""P2's harness (scripts/bench/ettr.py): the baseline's resubmit loop, the seeded schedule both sides share, and
the summary's spread and ratio."""
from __future__ import annotations

import pytest

from scripts.bench import ettr


@pytest.mark.parametrize("queued,state,retries,expect", [
    (True, "", 0, "wait"),                 # in the queue (running, pending, requeued after a preemption)
    (False, "PENDING", 0, "wait"),          # sacct lags squeue
    (False, "UNKNOWN", 0, "wait"),
    (False, "COMPLETED", 0, "done"),
    (False, "FAILED", 0, "resubmit"),       # an OOM, a NaN, a bad node: unchanged, from the newest checkpoint
    (False, "OUT_OF_MEMORY", 2, "resubmit"),
    (False, "NODE_FAIL", 3, "give_up"),      # max_retries 3 used
    (False, "CANCELLED", 3, "give_up"),
])
def test_the_loop_users_write(queued, state, retries, expect):
    assert ettr.loop_action(queued, state, retries, 3) == expect


def test_every_seed_draws_each_fault_once_and_both_sides_get_the_same():
    for seed in (1, 2, 3):
        faults = ettr.schedule(seed, 600.0)
        assert sorted(f.kind for f in faults) == sorted(ettr.MIX)
        assert faults == ettr.schedule(seed, 600.0)
        assert all(30 <= f.at_s <= 600 - 60 for f in faults)
    assert [f.kind for f in ettr.schedule(1, 600.0)] != [f.kind for f in ettr.schedule(2, 600.0)]


def test_summary_reports_median_min_max_and_the_ratio_per_seed():
    trials = []
    for seed, (ours, base) in {1: (0.8, 0.2), 2: (0.6, 0.3), 3: (0.9, 0.1)}.items():
        trials.append({"scale": "small", "seed": seed, "side": "toolkit", "ettr": ours, "stopped_early": "",
                       "lost_by_cause_s": {"hang": 100.0}})
        trials.append({"scale": "small", "seed": seed, "side": "baseline", "ettr": base, "stopped_early": "gave up",
                       "lost_by_cause_s": {"gpu_oom": 300.0} if seed != 2 else {}})
    out = ettr.summarise(trials)["small"]
    assert out["toolkit"]["ettr"] == {"median": 0.8, "min": 0.6, "max": 0.9, "n": 3}
    assert out["ratio_toolkit_over_baseline"] == {"median": 4.0, "min": 2.0, "max": 9.0, "n": 3}
    assert out["baseline"]["lost_by_cause_s_median"] == {"gpu_oom": 300.0}  # a seed without it counts 0
    assert out["baseline"]["ended_early"] == 3 and out["toolkit"]["ended_early"] == 0


def test_recurrences_are_read_from_the_jobs_record(tmp_path):
    (tmp_path / "chaos").mkdir()
    (tmp_path / "chaos" / "recurred.jsonl").write_text(
        '{"kind": "hang", "nonce": "n", "step": 7, "node": "node1", "time": 1010.5}\n'
        'not json\n{"kind": "gpu_oom", "time": "x"}\n'
        '{"kind": "gpu_oom", "nonce": "m", "step": 3, "node": "node2", "time": 1100}\n')
    assert ettr.recurrences(tmp_path, 1000.0) == [("hang", 10.5), ("gpu_oom", 100.0)]
    assert ettr.recurrences(tmp_path / "nothing", 0.0) == []


def test_first_steps_are_read_from_the_printed_log():
    log = ("[small seed 1 toolkit] [chaos      4s] training started; schedule: host_oom@40s\n"
           "[large seed 3 baseline] [chaos     12s] training started; schedule: nan@40s\nnoise\n")
    assert ettr.first_steps(log) == {"small-s1-toolkit": 4.7, "large-s3-baseline": 12.7}


@pytest.mark.parametrize("states,moved,since,now,hung", [
    (["RUNNING"], 0.0, 10.0, 95.0, False),     # running 85 s without a step: not yet
    (["RUNNING"], 0.0, 1.0, 95.0, True),       # 94 s RUNNING, no step
    (["RUNNING"], 0.0, 170.0, 183.0, False),   # a requeued job that has just started: its start-up is not a hang
    (["RUNNING"], 100.0, 1.0, 150.0, False),   # a step 50 s ago
    (["PENDING"], 0.0, None, 500.0, False),    # waiting out the requeue's begin time
    ([], 0.0, None, 500.0, False),
])
def test_a_baseline_job_is_hung_only_after_running_without_a_step(states, moved, since, now, hung):
    assert ettr.looks_hung(states, moved, since, now, training=True) is hung


def test_rerun_trials_replace_those_of_the_same_scale_seed_and_side():
    out = {"trials": [{"scale": "small", "seed": s, "side": side, "ettr": 0.5, "stopped_early": "",
                       "lost_by_cause_s": {}} for s in (1, 2, 3) for side in ("toolkit", "baseline")]}
    rerun = {"trials": [{"scale": "small", "seed": 3, "side": "baseline", "ettr": 0.1, "stopped_early": "",
                         "lost_by_cause_s": {}}], "when": "now", "machine": {"commit": "abc"}}
    assert ettr.replace_trials(out, rerun, "harness bug") == 1
    assert len(out["trials"]) == 6 and out["replaced_trials"][0]["replaced_because"] == "harness bug"
    assert [t["ettr"] for t in out["trials"] if (t["seed"], t["side"]) == (3, "baseline")] == [0.1]
    assert out["summary"]["small"]["baseline"]["ettr"]["min"] == 0.1

"""Pure helpers of scripts/bench/watch_load.py: the synthetic sacct answer parses like sacct's, and the summary."""
from __future__ import annotations

from scripts.bench import watch_load as bench


def test_synthetic_sacct_parses_into_one_attempt_per_job_with_the_intended_states():
    from hpc_agent.slurm.sacct import group_attempts, parse_sacct

    ids = [str(100 + i) for i in range(20)]
    attempts = group_attempts(parse_sacct(bench.synthetic_sacct(ids, pending_every=10)))
    assert sorted(attempts) == sorted(ids)
    states = [attempts[j][-1].state for j in ids]
    assert states.count("PENDING") == 2 and states.count("RUNNING") == 18
    assert [s.step for s in attempts["100"][-1].steps] == ["batch", "0"]
    assert attempts["109"][-1].steps == ()  # a pending job has no steps yet


def test_per_tick_summary_takes_medians_and_the_largest_call_count():
    ticks = [{"calls": {"sacct": 1}, "cpu_ms": 10.0, "wall_ms": 100.0, "sacct_wall_ms": 90.0},
             {"calls": {"sacct": 1, "squeue": 1}, "cpu_ms": 30.0, "wall_ms": 140.0, "sacct_wall_ms": 95.0},
             {"calls": {"sacct": 1}, "cpu_ms": 20.0, "wall_ms": 120.0, "sacct_wall_ms": 92.0}]
    summary = bench.per_tick_summary(ticks)
    assert summary["slurm_calls_per_tick"] == {"sacct": 1, "squeue": 1}
    assert summary["slurm_calls_total_per_tick"] == 2
    assert summary["watcher_cpu_ms_median"] == 20.0 and summary["watcher_cpu_ms_max"] == 30.0
    assert summary["sacct_subprocess_wall_ms_median"] == 92.0


def test_counting_client_counts_by_command_and_answers_every_id(monkeypatch):
    from tests.helpers.fake_slurm import FakeSlurm

    slurm = FakeSlurm()  # knows none of the ids: the real batched query answers just the header
    client = bench.CountingSlurm(slurm)
    text = client.sacct(["1", "2"])
    client.run(["squeue", "--noheader"])
    assert dict(client.calls) == {"sacct": 1, "squeue": 1} == dict(slurm.counts)
    assert text.count("\n") == 1 + 2 * 3  # header, then allocation + batch + step for each running job


def test_growth_is_the_ratio_of_cpu_per_run_between_two_sizes():
    summary = {"1000": {"watcher_cpu_ms_median": 10.0}, "10000": {"watcher_cpu_ms_median": 110.0}}
    g = bench.growth(summary, 1000, 10000)
    assert g["ratio"] == 1.1 and g["at_most_linear"] is True
    assert g["cpu_ms_per_run"] == {"1000": 0.01, "10000": 0.011}
    summary["10000"]["watcher_cpu_ms_median"] = 200.0  # twice the per-run cost: superlinear
    assert bench.growth(summary, 1000, 10000)["at_most_linear"] is False

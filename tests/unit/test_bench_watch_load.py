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


# --- the live mode (issue 45: P4 on live runs) ---------------------------------------------------------------
def _cluster(n: int, t0: float = 1.8e9):
    from scripts.bench import fake_slurm_bin

    names = [f"hpc_agent:load-{i:05d}" for i in range(n)]
    return fake_slurm_bin.build_cluster(names, 9_000_000, t0)


def test_the_cluster_mix_lists_every_kind_as_sacct_does():
    from hpc_agent.slurm.sacct import WATCH_FIELDS, group_attempts, parse_sacct

    fake, kinds = _cluster(200)
    ids = [str(9_000_000 + i) for i in range(200)]
    attempts = group_attempts(parse_sacct(fake.sacct(ids, fields=WATCH_FIELDS)))
    expected = {"running": ["RUNNING"], "running2": ["RUNNING"], "pending": ["PENDING"],
                "preempted_back": ["PREEMPTED", "RUNNING"], "node_fail_back": ["NODE_FAIL", "RUNNING"],
                "requeued_wait": ["PREEMPTED", "PENDING"]}
    assert sorted(set(kinds.values())) == sorted(expected)
    for job, kind in kinds.items():
        assert [a.state for a in attempts[job]] == expected[kind], (job, kind)
        latest = attempts[job][-1]
        if latest.state == "RUNNING":
            assert [s.step for s in latest.steps] == ["batch", "extern", "0"]
            assert len(latest.nodes) == (2 if kind == "running2" else 1)
        assert latest.job_name == f"hpc_agent:load-{int(job) - 9_000_000:05d}"
    first = attempts["9000018"][0]  # preempted_back: the old attempt's batch step was killed
    assert first.exit_code == "0:0" and first.steps[0].state == "CANCELLED" and first.steps[0].exit_code == "0:15"


def test_fake_executables_answer_as_fakeslurm_and_keep_what_changes(tmp_path):
    import subprocess

    from hpc_agent.slurm.cli import sacct_argv
    from hpc_agent.slurm.sacct import WATCH_FIELDS, group_attempts, parse_sacct
    from scripts.bench import fake_slurm_bin

    fake, _ = _cluster(20)
    ids = [str(9_000_000 + i) for i in range(20)]
    fake_slurm_bin.save(fake, tmp_path / "slurm.pkl")
    fake_slurm_bin.install(tmp_path / "bin", tmp_path / "slurm.pkl")
    argv = sacct_argv(ids, WATCH_FIELDS, False)
    argv.insert(1, "--duplicates")
    run = lambda args: subprocess.run([str(tmp_path / "bin" / args[0]), *args[1:]],  # noqa: E731
                                      capture_output=True, text=True, timeout=60)
    first, again = run(argv), run(argv)  # the second from the kept answer
    assert first.returncode == 0 and first.stdout == again.stdout == fake.sacct(ids, fields=WATCH_FIELDS)
    assert run(["scancel", "9000001"]).returncode == 0  # a change is written back, the kept answer dropped
    after = group_attempts(parse_sacct(run(argv).stdout))
    assert after["9000001"][-1].state.startswith("CANCELLED") and after["9000000"][-1].state == "RUNNING"
    refused = run(["scontrol", "requeue", "9000017"])  # pending: Slurm's own refusal, in its words
    assert refused.returncode == 1 and "pending execution" in refused.stderr


def test_the_writer_writes_what_the_job_writes(tmp_path):
    import io

    from hpc_agent.core import rundir
    from hpc_agent.metrics.tb_reader import RunScalars
    from scripts.bench import run_writer

    run_dir = tmp_path / "run"
    for folder in (rundir.heartbeat_dir(run_dir), rundir.slurm_dir(run_dir)):
        folder.mkdir(parents=True)
    manifest = [[str(run_dir), "9000003", 1, 2, 1.8e9]]
    out = io.StringIO()
    run_writer.serve(manifest, io.StringIO("round 1800000100.0 5\nround 1800000105.0 10\nquit\n"), out)
    assert [line.split()[:2] for line in out.getvalue().splitlines()] == [["done", "4"], ["done", "4"]]
    beats = rundir.read_heartbeats(run_dir)
    assert [(b.rank, b.world, b.step, b.attempt, b.written_at) for b in beats] == [
        (0, 2, 10, 1, 1800000105.0), (1, 2, 10, 1, 1800000105.0)]
    log = (rundir.slurm_dir(run_dir) / "9000003_0_log.out").read_text().splitlines()
    assert [line.split()[2] for line in log] == [str(s) for s in range(1, 11)]
    assert log[0].startswith("[hpc_agent] step 1 loss ")
    scalars = RunScalars(rundir.tb_dir(run_dir), tags=("train/loss",))
    scalars.update()
    assert [p.step for p in scalars.series("train/loss")] == list(range(1, 11))


def test_live_summary_spreads_the_watcher_time_without_the_sacct_subprocess():
    ticks = [{"wall_ms": 100.0 + i, "sacct_wall_ms": 60.0, "cpu_ms": 30.0 + i, "runs_judged": 9, "peak_rss_mb": 50.0 + i,
              "calls": {"sacct": 1}} for i in range(5)]
    summary = bench.live_summary(ticks)
    assert summary["watcher_ms"] == {"median": 42.0, "min": 40.0, "max": 44.0, "n": 5}
    assert summary["watcher_cpu_ms"]["median"] == 32.0 and summary["peak_rss_mb"] == 54.0
    assert summary["slurm_calls_per_tick"] == {"sacct": 1}


def test_live_mode_end_to_end_on_a_small_root(tmp_path):
    """20 runs: every running job's heartbeats are judged on every measured tick, one sacct call a tick, no run
    parked, the writer process wrote every round (the child process and FakeSlurm's executables for real)."""
    result = bench.measure_live(20, 2, tmp_path, profile=False, ranks=1, sacct_latency_ms=0.0)
    running = len([k for k in result["jobs_by_kind"] for _ in range(result["jobs_by_kind"][k])
                   if k not in ("pending", "requeued_wait")])
    assert running == 19 == result["running_jobs_written_per_round"]
    assert len(result["samples"]) == 2
    for sample in result["samples"]:
        assert sample["calls"] == {"sacct": 1} and sample["parked"] == []
        assert sample["runs_followed"] == 20 and sample["runs_judged"] == 19
        assert sample["files_written"] == 19 * 3 + 1  # a beat, a log and a TB file each; the 2-node job beats twice

"""Pure helpers of scripts/bench/recovery.py: log parsing into milestones and the latency breakdown."""
from __future__ import annotations

import datetime as dt

import pytest
from scripts.bench import recovery as bench


def ts(text: str) -> float:
    return dt.datetime.fromisoformat(text).timestamp()


@pytest.mark.parametrize("text, expected", [
    ("2026-11-30T12:40:05.536", "2026-11-30T12:40:05.536"),
    ("2026-11-30 12:40:05,536", "2026-11-30T12:40:05.536"),
    ("2026-11-30T12:40:05", "2026-11-30T12:40:05"),
])
def test_parse_stamp_reads_slurm_and_submitit_formats(text, expected):
    assert bench.parse_stamp(text) == pytest.approx(ts(expected))


CTLD = """[2026-11-30T12:39:53.209] sched/backfill: _start_job: Started JobId=183 in low on node[1-2]
[2026-11-30T13:00:02.099] Requeuing JobId=183
[2026-11-30T13:00:02.099] sched: Allocate JobId=184 NodeList=node[1-2] #CPUs=4 Partition=high
[2026-11-30T13:00:02.500] Requeuing JobId=1830
[2026-11-30T13:00:04.149] _job_complete: JobId=184 done
[2026-11-30T13:00:06.462] sched: _update_job: setting begin to 2026-11-30T13:00:06 for JobId=183
[2026-11-30T13:00:06.807] sched: Allocate JobId=183 NodeList=node[1-2] #CPUs=2 Partition=low""".splitlines()


def test_slurmctld_milestones_pick_the_lines_of_this_trial_only():
    found = bench.slurmctld_milestones(CTLD, "183", "184", since=ts("2026-11-30T13:00:00"))
    assert found == {"requeued": ts("2026-11-30T13:00:02.099"), "preemptor_started": ts("2026-11-30T13:00:02.099"),
                     "preemptor_done": ts("2026-11-30T13:00:04.149"), "expedited": ts("2026-11-30T13:00:06.462"),
                     "job_restarted": ts("2026-11-30T13:00:06.807")}  # the 12:39 start is before the clock


def test_slurmd_milestones_take_the_last_node_and_ignore_other_jobs():
    node1 = ["[2026-11-30T13:04:52.330] [197.batch] done with job", "[2026-11-30T13:04:53.636] [197.0] done with job",
             "[2026-11-30T13:04:53.000] [1970.0] done with job"]
    node2 = ["[2026-11-30T13:04:53.649] [197.0] done with job"]
    found = bench.slurmd_milestones([node1, node2], "197", since=ts("2026-11-30T13:04:50"))
    assert found == {"batch_done": ts("2026-11-30T13:04:52.330"), "steps_done": ts("2026-11-30T13:04:53.649")}


def test_submitit_milestones_skip_the_attempt_before_the_preemption():
    log = ("submitit INFO (2026-11-30 12:40:00,100) - Starting with JobEnvironment(job_id=1)\n"
           "[2026-11-30 12:40:01,200] [WARNING] [real_accelerator.py:213:get_accelerator] Setting accelerator to CPU.\n"
           "submitit INFO (2026-11-30 12:40:17,736) - Starting with JobEnvironment(job_id=1)\n"
           "[2026-11-30 12:40:18,833] [WARNING] [real_accelerator.py:213:get_accelerator] Setting accelerator to CPU.\n")
    found = bench.submitit_milestones(log, since=ts("2026-11-30T12:40:05"))
    assert found == {"submitit_started": ts("2026-11-30T12:40:17.736"),
                     "torch_deepspeed_imported": ts("2026-11-30T12:40:18.833")}


def test_breakdown_cuts_by_actual_time_so_segments_add_up():
    times = {"preemptor_submitted": 100.0, "requeued": 103.0, "preemptor_done": 106.0, "expedited": 104.5,
             "first_step_seen": 111.0, "not_a_milestone": 50.0}
    segments = bench.breakdown(times)
    assert [(s["from"], s["to"]) for s in segments] == [("preemptor_submitted", "requeued"), ("requeued", "expedited"),
                                                        ("expedited", "preemptor_done"),
                                                        ("preemptor_done", "first_step_seen")]
    assert sum(s["seconds"] for s in segments) == pytest.approx(11.0)


def test_segment_medians_are_offsets_from_the_clock_start_per_mode():
    trials = [{"mode": "watcher", "milestones": {"preemptor_submitted": 10.0, "first_step_seen": 19.0}},
              {"mode": "watcher", "milestones": {"preemptor_submitted": 50.0, "first_step_seen": 61.0}},
              {"mode": "watcher", "milestones": {"preemptor_submitted": 70.0, "first_step_seen": 80.0}},
              {"mode": "native", "milestones": {"preemptor_submitted": 0.0, "first_step_seen": 131.0}}]
    assert bench.segment_medians(trials, "watcher") == {"preemptor_submitted": 0.0, "first_step_seen": 10.0}
    assert bench.segment_medians(trials, "native") == {"preemptor_submitted": 0.0, "first_step_seen": 131.0}


def test_median_segments_use_only_milestones_every_trial_of_the_mode_has():
    trials = [{"mode": "watcher", "milestones": {"preemptor_submitted": 0.0, "expedited": 4.0, "first_step_seen": 10.0}},
              {"mode": "watcher", "milestones": {"preemptor_submitted": 0.0, "first_step_seen": 12.0}},
              {"mode": "watcher", "milestones": {"preemptor_submitted": 0.0, "first_step_seen": 11.0}}]
    assert bench.median_segments(trials, "watcher") == [
        {"from": "preemptor_submitted", "to": "first_step_seen", "median_s": 11.0, "min_s": 10.0, "max_s": 12.0}]
    assert bench.median_segments(trials, "native") == []


def test_rounds_alternate_modes_and_run_native_only_in_its_first_rounds():
    assert bench.rounds(3, ["watcher", "native"], 1) == [(0, "watcher"), (0, "native"), (1, "watcher"), (2, "watcher")]
    assert bench.rounds(2, ["watcher", "native"], 2) == [(0, "watcher"), (0, "native"), (1, "watcher"), (1, "native")]


def test_reused_trials_keep_one_mode_and_say_where_they_came_from():
    old = {"trials": [{"mode": "native", "latency_s": 130.0}, {"mode": "watcher", "latency_s": 12.0},
                      {"mode": "native", "latency_s": 129.0, "reused_from": "older.json"}]}
    assert bench.reused_trials(old, "native", "old.json") == [
        {"mode": "native", "latency_s": 130.0, "reused_from": "old.json"}]  # not reused twice over


def test_steps_redone_compares_the_last_step_before_the_resume_with_the_resumed_step():
    log = ("[hpc_agent] step 84 loss 3.1\n[hpc_agent] step 85 loss 3.0\n"
           "[hpc_agent] signal SIGUSR2 at step 85: checkpoint step_00000085 complete in 0.0s; exiting 75\n"
           "[hpc_agent] resumed at step 85 (data position 340 samples) from step_00000085\n"
           "[hpc_agent] step 86 loss 2.9\n")
    assert bench.steps_redone(log) == {"saved_step": 85, "resumed_step": 85, "last_step_before": 85,
                                       "steps_redone": 0}
    hard_kill = "[hpc_agent] step 90 loss 3\n[hpc_agent] resumed at step 80 (data position 1 samples) from x\n"
    assert bench.steps_redone(hard_kill)["steps_redone"] == 10
    assert bench.steps_redone("[hpc_agent] step 3 loss 1\n")["resumed_step"] is None


def test_paired_ratios_take_each_round_as_a_pair():
    from scripts.bench.recovery import paired_ratios

    trials = [{"mode": "default", "trial": 0, "latency_s": 3.0}, {"mode": "native", "trial": 0, "latency_s": 120.0},
              {"mode": "default", "trial": 1, "latency_s": 4.0}, {"mode": "native", "trial": 1, "latency_s": 132.0},
              {"mode": "default", "trial": 2, "latency_s": 2.0},  # no native in this round: left out
              {"mode": "native", "trial": 3, "latency_s": 99.0, "reused_from": "old.json"}]
    assert paired_ratios(trials, "default") == {"median": 36.5, "min": 33.0, "max": 40.0, "rounds": 2}
    assert paired_ratios(trials, "watcher") == {}

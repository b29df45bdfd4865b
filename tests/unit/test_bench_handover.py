"""Pure helpers of scripts/bench/handover.py: slurmctld log lines -> milestones -> offsets -> per-path summary,
and the victim script each hand-over path runs."""
from __future__ import annotations

import datetime as dt
import subprocess

import pytest
from scripts.bench import handover as bench


def ts(text: str) -> float:
    return dt.datetime.fromisoformat(text).timestamp()


# Trimmed from a real run (results/bench_handover.json): victim 19, preempting job 20, successor 21, plus
# lines of other jobs whose ids share a prefix.
CTLD = """[2026-12-02T15:11:50.001] sched: Allocate JobId=19 NodeList=node1 #CPUs=1 Partition=low
[2026-12-02T15:11:53.912] _slurm_rpc_submit_batch_job: JobId=20 InitPrio=4294901740 usec=652
[2026-12-02T15:11:54.637] _slurm_rpc_submit_batch_job: JobId=21 InitPrio=4294901739 usec=1107
[2026-12-02T15:11:54.674] Requeuing JobId=190
[2026-12-02T15:11:54.674] Requeuing JobId=19
[2026-12-02T15:11:54.674] sched: Allocate JobId=20 NodeList=node1 #CPUs=2 Partition=high
[2026-12-02T15:11:54.675] sched: Allocate JobId=21 NodeList=node2 #CPUs=1 Partition=low
[2026-12-02T15:11:58.000] sched: Allocate JobId=21 NodeList=node1 #CPUs=1 Partition=low""".splitlines()


def test_milestones_are_the_first_line_of_each_job_and_ignore_other_ids():
    found = bench.ctld_times(CTLD, victim="19", preemptor="20", continuation="21")
    assert found == {"preemptor_submitted": ts("2026-12-02T15:11:53.912"),
                     "victim_done": ts("2026-12-02T15:11:54.674"),
                     "preemptor_allocated": ts("2026-12-02T15:11:54.674"),
                     "continuation_allocated": ts("2026-12-02T15:11:54.675")}
    assert bench.offsets(found) == {"victim_done": 0.762, "preemptor_allocated": 0.762,
                                    "continuation_allocated": 0.763}


def test_a_requeued_victim_is_its_own_continuation_and_its_expedite_is_a_milestone():
    lines = ["[2026-12-02T15:16:00.000] _slurm_rpc_submit_batch_job: JobId=51 InitPrio=1 usec=1",
             "[2026-12-02T15:16:00.950] Requeuing JobId=50",
             "[2026-12-02T15:16:00.950] sched: Allocate JobId=51 NodeList=node1 #CPUs=2 Partition=high",
             "[2026-12-02T15:16:01.000] sched: _update_job: setting begin to 2026-12-02T15:16:01 for JobId=50",
             "[2026-12-02T15:16:03.900] sched/backfill: _start_job: Started JobId=50 in low on node2"]
    assert bench.offsets(bench.ctld_times(lines, "50", "51", "50")) == {
        "victim_done": 0.95, "preemptor_allocated": 0.95, "expedited": 1.0, "continuation_allocated": 3.9}


def test_a_victim_that_ends_for_good_is_done_at_its_job_complete_line():
    lines = ["[2026-12-02T15:08:41.579] _slurm_rpc_submit_batch_job: JobId=9 InitPrio=1 usec=1",
             "[2026-12-02T15:08:43.202] _job_complete: JobId=8 done"]
    assert bench.offsets(bench.ctld_times(lines, "8", "9", None)) == {"victim_done": 1.623}


def test_no_offsets_without_the_preempting_jobs_submission():
    assert bench.offsets({"victim_done": 5.0}) == {}


def test_summary_per_path_counts_only_the_trials_that_saw_a_milestone():
    trials = [{"path": "successor_requeuehold", "offsets_s": {"continuation_allocated": 0.9}},
              {"path": "successor_requeuehold", "offsets_s": {"continuation_allocated": 1.1}},
              {"path": "successor_requeuehold", "offsets_s": {}},  # a trial that timed out
              {"path": "requeue_expedite", "offsets_s": {"continuation_allocated": 3.9, "expedited": 1.0}}]
    out = bench.summary(trials)
    assert out["successor_requeuehold"] == {"trials": 3, "continuation_allocated": {
        "median_s": 1.0, "min_s": 0.9, "max_s": 1.1, "seen": 2}}
    assert out["requeue_expedite"]["expedited"]["median_s"] == 1.0
    assert set(out) == {"successor_requeuehold", "requeue_expedite"}  # paths without trials are left out


@pytest.mark.parametrize("path", bench.PATHS)
def test_each_victim_script_is_valid_bash_and_hands_over_its_own_way(path, tmp_path):
    script = bench.VICTIM.format(path=path, log=tmp_path / "v.log", succ_file=tmp_path / "s.id")
    (tmp_path / "v.sh").write_text(script)
    assert subprocess.run(["bash", "-n", str(tmp_path / "v.sh")], capture_output=True).returncode == 0
    assert "#SBATCH --partition=low" in script and "--requeue" in script and "--signal=B:USR2@60" in script
    case = {"requeue_expedite": 'requeue_expedite*) scontrol requeue "$SLURM_JOB_ID"',
            "requeue_expedite_late": 'requeue_expedite*) scontrol requeue "$SLURM_JOB_ID"',
            "successor_exit": "Requeue=0",
            "successor_requeuehold": 'scontrol requeuehold "$SLURM_JOB_ID"'}[path]
    assert case in script and f"case {path} in" in script

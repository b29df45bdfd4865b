"""Parsing ``sacct --parsable2`` text: header-driven rows, steps, attempts of requeued jobs, arrays, het jobs."""
from __future__ import annotations

from pathlib import Path

import pytest

from hpc_agent.slurm.sacct import (SACCT_FIELDS, attempts_of, expand_hostlist, group_attempts, has_sacct_header,
                                   job_key_of, job_state, latest_attempts, normalize_state, parse_exit_code,
                                   parse_parsable2, parse_sacct)

SACCT = Path(__file__).resolve().parent / "data" / "sacct"


def read(name: str) -> str:
    return (SACCT / name).read_text()


def test_fields_asked_for_contain_what_the_parser_needs():
    assert SACCT_FIELDS[:1] == ("JobID",) and "State" in SACCT_FIELDS and "NodeList" in SACCT_FIELDS


def test_rows_steps_and_columns():
    rows = parse_sacct(read("completed.txt"))
    assert [r.job_id for r in rows] == ["101", "101.batch", "101.extern", "101.0"]
    assert [r.step for r in rows] == [None, "batch", "extern", "0"]
    alloc = rows[0]
    assert (alloc.base_id, alloc.job_key, alloc.state, alloc.exit_status, alloc.signal) == ("101", "101", "COMPLETED", 0, 0)
    assert alloc.get("JobName") == "hpc_agent:gpt-20261130-100000"
    assert alloc.get("Elapsed") == "00:41:07"


@pytest.mark.parametrize("raw,state,by", [
    ("COMPLETED", "COMPLETED", None),
    ("CANCELLED by 0", "CANCELLED", "0"),
    ("CANCELLED by 1000", "CANCELLED", "1000"),
    ("OUT_OF_ME+", "OUT_OF_MEMORY", None),
    ("CANCELLED+", "CANCELLED", None),
    ("NODE_FA+", "NODE_FAIL", None),
    ("REQUEUE+", "REQUEUE+", None),      # ambiguous (REQUEUED, REQUEUE_FED, REQUEUE_HOLD): not guessed
    ("running", "RUNNING", None),
    ("", "", None),
])
def test_normalize_state(raw, state, by):
    assert normalize_state(raw) == (state, by)


@pytest.mark.parametrize("raw,expected", [("1:0", (1, 0)), ("0:125", (0, 125)), ("0:9", (0, 9)), ("", (None, None)),
                                          ("garbage", (None, None))])
def test_parse_exit_code(raw, expected):
    assert parse_exit_code(raw) == expected


@pytest.mark.parametrize("text,hosts", [
    ("node1", ["node1"]),
    ("node[1-2]", ["node1", "node2"]),
    ("node[1-3,7],gpu-a01", ["node1", "node2", "node3", "node7", "gpu-a01"]),
    ("gpu-a[08-10]", ["gpu-a08", "gpu-a09", "gpu-a10"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ("None assigned", []),
    ("", []),
])
def test_expand_hostlist(text, hosts):
    assert expand_hostlist(text) == hosts


def test_requeued_job_attempts_oldest_first_with_their_own_steps():
    attempts = attempts_of(parse_sacct(read("requeued_3_attempts.txt")), "114")
    assert [a.state for a in attempts] == ["PREEMPTED", "PREEMPTED", "RUNNING"]
    assert [a.index for a in attempts] == [0, 1, 2]
    assert [a.nodes for a in attempts] == [["node1"], ["node2"], ["node1"]]
    assert all(len(a.steps) == 2 for a in attempts)
    assert attempts[1].steps[0].get("Start") == "2026-11-30T15:23:15"


def test_attempts_interleaved_with_other_jobs_recorded():
    # Recorded: job 2's second attempt comes after job 3's rows.
    jobs = group_attempts(parse_sacct(read("preempted_then_cancelled.txt")))
    assert list(jobs) == ["2", "3"]
    assert [(a.state, a.cancelled_by) for a in jobs["2"]] == [("PREEMPTED", None), ("CANCELLED", "0")]
    assert [s.job_id for s in jobs["2"][0].steps] == ["2.batch"]
    assert [s.job_id for s in jobs["3"][0].steps] == ["3.batch", "3.0"]


def test_array_tasks_are_jobs_of_their_own():
    rows = parse_sacct(read("array.txt"))
    jobs = group_attempts(rows)
    assert list(jobs) == ["116_1", "116_2", "116_[3-4]"]
    assert jobs["116_2"][0].state == "FAILED" and jobs["116_2"][0].steps[-1].job_id == "116_2.0"
    assert jobs["116_[3-4]"][0].state == "PENDING" and jobs["116_[3-4]"][0].nodes == []
    assert rows[0].array_task == "1" and rows[-1].array_task == "[3-4]"
    assert job_key_of("116_2.batch") == "116_2"


def test_het_job_components_form_one_attempt():
    rows = parse_sacct(read("hetjob.txt"))
    attempts = attempts_of(rows, "117")
    assert len(attempts) == 1
    het = attempts[0]
    assert [r.job_id for r in het.allocations] == ["117+0", "117+1"]
    assert het.state == "OUT_OF_MEMORY"  # the component that explains the end, not the cancelled one
    assert het.nodes == ["node1", "node2"]
    assert attempts_of(rows, "117+1") == attempts  # asking by component finds the whole job
    assert [r.het_offset for r in het.allocations] == [0, 1]


def test_requeued_het_job_starts_a_new_attempt_at_component_0():
    text = ("JobID|State|NodeList|Start\n"
            "9+0|PREEMPTED|node1|2026-11-30T10:00:00\n9+1|PREEMPTED|node2|2026-11-30T10:00:00\n"
            "9+0|RUNNING|node2|2026-11-30T10:05:00\n9+1|RUNNING|node1|2026-11-30T10:05:00\n")
    attempts = attempts_of(parse_sacct(text), "9")
    assert [(a.state, len(a.allocations)) for a in attempts] == [("PREEMPTED", 2), ("RUNNING", 2)]


def test_header_driven_any_order_and_parsable1_trailing_bar():
    rows = parse_sacct(read("parsable1_other_order.txt"))
    assert [(r.job_id, r.state, r.exit_code) for r in rows] == [("127", "FAILED", "1:0"), ("127.batch", "FAILED", "1:0"),
                                                                ("127.0", "FAILED", "1:0")]
    minimal = parse_sacct("State|JobID\nRUNNING|5\n")
    assert minimal[0].state == "RUNNING" and minimal[0].get("NodeList") == ""


def test_job_name_containing_a_bar_is_rejoined():
    rows = parse_sacct("JobID|JobName|State|ExitCode\n7|a|b|FAILED|1:0\n")
    assert rows[0].get("JobName") == "a|b" and rows[0].state == "FAILED"


def test_garbage_empty_and_header_only():
    assert parse_sacct(read("garbage.txt")) == []
    assert parse_sacct("") == []
    assert parse_sacct(read("header_only.txt")) == []
    assert has_sacct_header(read("header_only.txt")) and not has_sacct_header(read("garbage.txt"))
    # Noise around a good reply, and lines that are not job ids, are skipped.
    text = "sacct: warning: something\n" + read("completed.txt") + "----------|---|\ntotal|x|y|z|a|b|c|d\n"
    assert [r.job_id for r in parse_sacct(text)] == ["101", "101.batch", "101.extern", "101.0"]


def test_repeated_header_from_concatenated_replies():
    text = read("pending.txt") + read("running.txt")
    jobs = latest_attempts(parse_sacct(text))
    assert {k: a.state for k, a in jobs.items()} == {"103": "PENDING", "102": "RUNNING"}


def test_orphan_step_still_counts():
    attempts = attempts_of(parse_sacct("JobID|State|ExitCode\n8.batch|OUT_OF_MEMORY|0:125\n"), "8")
    assert attempts[0].allocations == () and attempts[0].state == "OUT_OF_MEMORY"


def test_latest_attempts_for_a_batched_reply():
    text = read("requeued_3_attempts.txt") + read("failed.txt").split("\n", 1)[1]
    latest = latest_attempts(parse_sacct(text))
    assert {k: (a.index, a.state) for k, a in latest.items()} == {"114": (2, "RUNNING"), "111": (0, "FAILED")}


def test_legacy_helpers_used_by_submit_still_work():
    records = parse_parsable2(read("requeued_3_attempts.txt"))
    assert records[0]["JobID"] == "114"
    assert job_state(records, "114") == "RUNNING"
    assert job_state(parse_parsable2(read("cancelled_by_user.txt")), "113") == "CANCELLED"
    assert job_state(parse_parsable2(read("host_oom_truncated.txt")), "110") == "OUT_OF_MEMORY"
    assert job_state(records, "999") is None


def test_attempt_cache_matches_a_full_parse_and_reparses_only_changed_jobs():
    from hpc_agent.slurm.sacct import AttemptCache, split_by_job

    head = "JobID|JobName|State|ExitCode|NodeList|Start|End"
    first = "\n".join([head, "7|a|RUNNING|0:0|node1|2026-12-01T10:00:00|Unknown",
                       "7.batch|batch|RUNNING|0:0|node1|2026-12-01T10:00:00|Unknown",
                       "8_1|b|REQUEUED|0:0|node2|2026-12-01T10:00:00|2026-12-01T10:01:00",
                       "8_1|b|PENDING|0:0|None assigned|Unknown|Unknown", "9+0|c|RUNNING|0:0|node1|x|Unknown",
                       "9+1|c|RUNNING|0:0|node2|x|Unknown"]) + "\n"
    cache = AttemptCache()
    got = cache.attempts(first)
    assert got == group_attempts(parse_sacct(first))
    assert [a.state for a in got["8_1"]] == ["REQUEUED", "PENDING"] and len(got["9"][0].allocations) == 2
    second = first.replace("7|a|RUNNING|0:0|node1|2026-12-01T10:00:00|Unknown",
                           "7|a|FAILED|3:0|node1|2026-12-01T10:00:00|2026-12-01T10:02:00")
    again = cache.attempts(second)
    assert again == group_attempts(parse_sacct(second))
    assert again["8_1"] is got["8_1"] and again["9"] is got["9"]  # unchanged jobs: the same objects
    assert again["7"] is not got["7"] and again["7"][-1].state == "FAILED"
    assert split_by_job("sacct: error: slurmdbd down\n") is None and cache.attempts("garbage") == {}
    twice = first + first  # two headers (concatenated replies): parsed whole, as parse_sacct does
    assert split_by_job(twice) is None and cache.attempts(twice) == group_attempts(parse_sacct(twice))

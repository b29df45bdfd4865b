"""Parsing ``sacct --parsable2`` text: header-driven rows, steps, attempts of requeued jobs, arrays, het jobs."""
from __future__ import annotations

from pathlib import Path

import pytest

from hpc_agent.slurm.hostlist import expand_hostlist
from hpc_agent.slurm.sacct import (SACCT_FIELDS, attempts_of, group_attempts, has_sacct_header, job_key_of, job_state,
                                   latest_attempts, normalize_state, parse_exit_code, parse_parsable2, parse_sacct)

SACCT = Path(__file__).resolve().parents[1] / "data" / "sacct"


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
    from hpc_agent.slurm.attempt_cache import AttemptCache, split_by_job

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


# --- the reader of every format (hpc_agent.slurm.sacct_read / sacct_json) ---------------------------------
import json as _json  # noqa: E402
import time as _time  # noqa: E402

from hpc_agent.slurm.sacct import SacctFormatError as _SacctFormatErrorHome  # noqa: E402
from hpc_agent.slurm.sacct_json import exit_code as json_exit_code, number, parse_sacct_json  # noqa: E402
from hpc_agent.slurm.sacct_read import (FIXED_WIDTH, INFERRED, PARSABLE, PARSABLE2, SacctFormatError,  # noqa: E402
                                        canonical_field, read_sacct, read_sacct_text)

CORPUS = Path(__file__).resolve().parents[1] / "data" / "sacct_corpus"
WIDE_COMMENT_LAST = (
    "JobID|JobName|Partition|State|ExitCode|DerivedExitCode|NodeList|MaxRSS|ReqMem|Comment\n"
    "109|hpc_agent:gpt-20261130-120500|gpu|FAILED|1:0|0:0|node1||64G|\n"
    "109.batch|batch||FAILED|1:0||node1|1843204K||\n"
    "109.0|python3||OUT_OF_MEMORY|0:125||node1|61210344K||\n")


def test_empty_trailing_comment_is_not_mistaken_for_parsable_bar():
    """The bug of issue 16: every row of -P output with an empty last column was dropped."""
    for parse in (parse_sacct, read_sacct_text):
        rows = parse(WIDE_COMMENT_LAST)
        assert [(r.job_id, r.state, r.get("Comment"), r.get("ReqMem")) for r in rows] == [
            ("109", "FAILED", "", "64G"), ("109.batch", "FAILED", "", ""), ("109.0", "OUT_OF_MEMORY", "", "")]
    assert read_sacct(WIDE_COMMENT_LAST).formats == (PARSABLE2,)


def test_parsable_bar_decided_by_the_header():
    text = "State|JobID|ExitCode|Comment|\nFAILED|7|1:0||\nFAILED|7.batch|1:0|note|\n"
    reading = read_sacct(text)
    assert reading.formats == (PARSABLE,)
    assert [(r.job_id, r.get("Comment")) for r in reading.rows] == [("7", ""), ("7.batch", "note")]


def test_crlf_and_unicode_line_separators_in_names():
    text = WIDE_COMMENT_LAST.replace("hpc_agent:gpt", "run\u2028\x85\x0bé").replace("\n", "\r\n")
    rows = read_sacct_text(text)
    assert [r.job_id for r in rows] == ["109", "109.batch", "109.0"]
    assert rows[0].get("JobName").startswith("run\u2028\x85\x0bé") and rows[0].get("Comment") == ""


def test_a_name_cannot_pose_as_a_header():
    text = "JobID|JobName|State|ExitCode\n12|x|JobID|State|FAILED|1:0\n"
    rows = read_sacct_text(text)
    assert [(r.job_id, r.get("JobName"), r.state) for r in rows] == [("12", "x|JobID|State", "FAILED")]


FIXED = (
    "JobID           JobName      State ExitCode        NodeList \n"
    "------------ ---------- ---------- -------- --------------- \n"
    "12345        hpc_agent+ OUT_OF_ME+    0:125           node1 \n"
    "12345.bat+        batch OUT_OF_ME+    0:125           node1 \n"
    "12_[1-4]     hpc_agent+    PENDING      0:0   None assigned \n"
    "13+0         té漢字+ CANCELLED+      0:0       node[1-2] \n")  # the name is 10 bytes, 6 characters


def test_fixed_width_columns_from_the_dashes_truncation_completed():
    assert len("té漢字+".encode()) == 10
    reading = read_sacct(FIXED)
    assert reading.formats == (FIXED_WIDTH,)
    got = [(r.job_id, r.step, r.array_task, r.het_offset, r.state, r.exit_code) for r in reading.rows]
    assert got == [("12345", None, None, None, "OUT_OF_MEMORY", "0:125"),
                   ("12345.batch", "batch", None, None, "OUT_OF_MEMORY", "0:125"),
                   ("12_[1-4]", None, "[1-4]", None, "PENDING", "0:0"),
                   ("13+0", None, None, 0, "CANCELLED", "0:0")]
    assert reading.rows[-1].nodes == ["node1", "node2"]  # widths are bytes: the UTF-8 name does not shift them


def test_truncated_header_names():
    assert [canonical_field(n) for n in ("NodeLi", "ExitC", "DerivedE+", "jobid", "Sta", "Start")] == [
        "NodeList", "ExitCode", "DerivedExitCode", "JobID", "Sta", "Start"]


@pytest.mark.parametrize("text, expected", [
    # sacct -n -P with the default columns
    ("145|ct-oom|OUT_OF_MEMORY|0:125\n145.batch|batch|OUT_OF_MEMORY|0:125\n",
     [("145", "OUT_OF_MEMORY", None, "0:125", ""), ("145.batch", "OUT_OF_MEMORY", None, "0:125", "")]),
    # sacct -n, fixed width, a cancel by a user, a truncated state, an array task, times
    ("      10657815_2 CANCELLED+      0:0   00:07:28\n10657815_2.batch  CANCELLED     0:15   00:07:29\n",
     [("10657815_2", "CANCELLED", None, "0:0", ""), ("10657815_2.batch", "CANCELLED", None, "0:15", "")]),
    ("77  train  gpu  CANCELLED by 1234  0:0  2026-11-30T10:00:00  2026-11-30T11:00:00\n",
     [("77", "CANCELLED", "1234", "0:0", "2026-11-30T10:00:00")]),
    # a header without its line of dashes: the header line is no row, the rows are read
    ("           JobID      State ExitCode    Elapsed  Timelimit\n      10657548_1    TIMEOUT      0:0   00:02:14   "
     "00:02:00\n", [("10657548_1", "TIMEOUT", None, "0:0", "")]),
    # a paste that lost the first row's job id: that line is no row
    ("dagster_a+ boost_usr+ 8  COMPLETED      0:0\n22051504.1   ray_worke+  4 CANCELLED+      0:9\n",
     [("22051504.1", "CANCELLED", None, "0:9", "")]),
])
def test_sacct_without_a_header_is_read_from_its_values(text, expected):
    reading = read_sacct(text)
    assert reading.formats == (INFERRED,)
    assert [(r.job_id, r.state, r.cancelled_by, r.exit_code, r.get("Start")) for r in reading.rows] == expected


@pytest.mark.parametrize("text, needle", [
    ("", "empty"), ("  \r\n", "empty"), ("a\x00b", "binary"),
    ("sacct: error: Connection refused\n", "no sacct header line"),
    ("srun: error: node1: task 0: Exited with exit code 1\n", "without -n"),  # no line starts with a job id
    ("{\"jobs\": 3}", "not `sacct --json`"), ("{oops", "not valid JSON"), ("[" * 100000, "no sacct header"),
    ("{\"jobs\": [], \"errors\": [{\"error\": \"Unable to connect to database\"}]}", "Unable to connect"),
    ("{\"jobs\": [1]}", "jobs[0] is not an object"), ("{" * 100000, "JSON"),
    ("JobID|State\n12 FAILED\n", "none of the 1 line(s)"),
])
def test_not_sacct_is_a_clear_error(text, needle):
    with pytest.raises(SacctFormatError) as info:
        read_sacct_text(text)
    assert needle in str(info.value)
    assert SacctFormatError is _SacctFormatErrorHome and issubclass(SacctFormatError, ValueError)


def test_header_only_is_no_rows_not_an_error():
    assert read_sacct_text(read("header_only.txt")) == []
    assert read_sacct_text('{"meta": {}, "errors": [], "jobs": []}') == []


def _json24_job(**over):
    job = {"job_id": 12, "name": "evil\n12|x|COMPLETED|0:0", "state": {"current": ["FAILED"], "reason": "None"},
           "exit_code": {"status": ["ERROR"], "return_code": {"set": True, "infinite": False, "number": 65},
                         "signal": {"id": {"set": False, "infinite": False, "number": 0}, "name": ""}},
           "array": {"job_id": 0, "task_id": {"set": False, "infinite": False, "number": 0}, "task": ""},
           "het": {"job_id": 0, "job_offset": {"set": False, "infinite": False, "number": 0}},
           "nodes": "node[1-2]", "comment": {"job": "run=abc|x", "administrator": "", "system": ""},
           "time": {"submission": {"set": True, "infinite": False, "number": 1796000000},
                    "start": {"set": True, "infinite": False, "number": 1796000010},
                    "end": {"set": True, "infinite": False, "number": 0}, "elapsed": 3725},
           "steps": [{"step": {"id": "12.batch", "name": "batch"}, "state": ["OUT_OF_MEMORY"],
                      "exit_code": {"status": ["SIGNALED"], "return_code": {"set": False, "number": 0},
                                    "signal": {"id": {"set": True, "number": 125}, "name": ""}},
                      "nodes": {"range": "node1"}, "time": {"start": 1796000010, "end": 1796000020}},
                     {"step": {"id": {"job_id": 12, "step_id": 4294967292}, "name": "extern"}, "state": "COMPLETED",
                      "exit_code": {"status": "SUCCESS", "return_code": 0}, "nodes": "node[1-2]", "time": {}}]}
    job.update(over)
    return job


def test_json_24_shape_becomes_the_rows_text_mode_prints(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    _time.tzset()
    try:
        rows = parse_sacct_json(_json.dumps({"meta": {"slurm": {"version": {"major": "24"}}}, "jobs": [_json24_job()]}))
    finally:
        monkeypatch.undo()
        _time.tzset()
    alloc, batch, extern = rows
    assert (alloc.job_id, alloc.state, alloc.exit_code, alloc.get("JobName")) == (
        "12", "FAILED", "65:0", "evil\n12|x|COMPLETED|0:0")  # one row: the name forges nothing
    assert (alloc.get("Start"), alloc.get("End"), alloc.get("Submit"), alloc.get("Elapsed"), alloc.get("Comment")) == (
        "2026-11-30T00:53:30", "Unknown", "2026-11-30T00:53:20", "01:02:05", "run=abc|x")
    assert alloc.nodes == ["node1", "node2"]
    assert (batch.job_id, batch.state, batch.exit_code) == ("12.batch", "OUT_OF_MEMORY", "0:125")
    assert (extern.job_id, extern.exit_code) == ("12.extern", "0:0")
    [attempt] = attempts_of(rows, "12")
    assert attempt.oom_step is batch


@pytest.mark.parametrize("over, job_id", [
    ({"array": {"job_id": 12, "task_id": {"set": True, "number": 3}}}, "12_3"),
    ({"array": {"job_id": 12, "task_id": None, "task": "0x1e"}}, "12_[1-4]"),
    ({"array": {"job_id": 12, "task_id": {"set": False}, "task": "1-4"}}, "12_[1-4]"),
    ({"het": {"job_id": 12, "job_offset": {"set": True, "number": 1}}}, "12+1"),
    ({"het": {"job_id": 12, "job_offset": 0}}, "12+0"),
])
def test_json_array_and_het_ids(over, job_id):
    rows = parse_sacct_json(_json.dumps({"jobs": [_json24_job(**over)]}))
    assert [r.job_id for r in rows] == [job_id, f"{job_id}.batch", f"{job_id}.extern"]


def test_json_numbers_and_exit_codes():
    assert [number(v) for v in (5, "5", {"set": True, "number": 5}, {"set": False, "number": 5},
                                {"set": True, "infinite": True, "number": 5}, True, None, "x", 1e400)] == [
        5, 5, 5, None, None, None, None, None, None]
    assert json_exit_code({"status": "SIGNALED", "return_code": None, "signal": {"signal_id": 15}}) == "0:15"
    assert json_exit_code({"status": "PENDING", "return_code": None}) == ""


def test_json_2205_lost_exit_status_is_unknown_not_zero():
    """22.05 prints SUCCESS/0 for a job text mode shows as FAILED 65:0 (real, job 2 of the corpus)."""
    doc = _json.loads((CORPUS / "real_2_json24.json").read_text())  # 24.x shape: statuses kept
    assert [r.exit_code for r in parse_sacct_json(_json.dumps(doc)) if r.job_id == "2"][-1] == "65:0"
    lossy = {"meta": {"plugin": {"type": "openapi/dbv0.0.38"}}, "jobs": [_json24_job(exit_code={"status": "SUCCESS", "return_code": 0})]}
    assert parse_sacct_json(_json.dumps(lossy))[0].exit_code == ""


def test_every_format_of_one_real_job_gives_the_same_rows(monkeypatch):
    """Job 590 of the localhost cluster (FAILED 1:0, step OUT_OF_MEMORY) as -P, -p, fixed width and --json."""
    monkeypatch.setenv("TZ", "UTC")  # the cluster printed UTC; the JSON holds epochs
    _time.tzset()
    try:
        shapes = {name: read_sacct_text((CORPUS / name).read_text()) for name in (
            "real_590_P_wide.txt", "real_590_P_crlf.txt", "real_590_fixed.txt", "real_590_json2205.json",
            "real_590_json24.json")}
    finally:
        monkeypatch.undo()
        _time.tzset()
    key = lambda r: (r.job_id, r.state, r.get("NodeList"), r.get("Start"), r.get("End"))  # noqa: E731
    expected = [key(r) for r in shapes["real_590_P_wide.txt"]]
    assert expected[-1][:2] == ("590.0", "OUT_OF_MEMORY")
    for name, rows in shapes.items():
        assert [key(r) for r in rows] == expected, name
    p = read_sacct_text((CORPUS / "real_6_p_reordered.txt").read_text())
    assert [(r.job_id, r.exit_code) for r in p] == [("6", "1:0"), ("6.batch", "1:0"), ("6.0", "0:125")]


def test_steps_printed_before_their_allocation_still_count():
    text = "JobID|State|ExitCode\n12.0|OUT_OF_MEMORY|0:125\n12|FAILED|1:0\n12.batch|FAILED|1:0\n"
    [attempt] = attempts_of(read_sacct_text(text), "12")
    assert attempt.state == "FAILED" and attempt.oom_step is not None and len(attempt.steps) == 2

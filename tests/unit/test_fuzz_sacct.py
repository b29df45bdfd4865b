"""Must-show 5 of issue 16 (sacct target): whatever text arrives, the reader gives rows or a clear
SacctFormatError, and ``diagnose --sacct-file`` a report (exit 0) or a clear error (exit 2). Nothing else
escapes. Strategies: valid tables in every format with hostile field values ('|', '+', newlines, unicode,
CRLF), sacct JSON in both shapes with values of the wrong type, and plain random text/JSON.
"""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hpc_agent import diagnose
from hpc_agent.slurm.sacct import SacctRow
from hpc_agent.slurm.sacct_read import SacctFormatError, read_sacct, read_sacct_text

EXAMPLES = 1000
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
COUNTS: dict = {}

FIELDS = ["JobID", "JobName", "State", "ExitCode", "NodeList", "Start", "End", "Submit", "Partition",
          "DerivedExitCode", "MaxRSS", "ReqMem", "Comment"]
job_ids = st.one_of(
    st.integers(0, 10**12).map(str),
    st.tuples(st.integers(1, 9999), st.sampled_from(["", ".batch", ".extern", ".0", ".1", ".bat+", "_3", "_[1-4]",
                                                     "+0", "+1.batch", "_7.0", "+"])).map(lambda t: f"{t[0]}{t[1]}"),
    st.text(max_size=12))
states = st.one_of(st.sampled_from(["COMPLETED", "FAILED", "OUT_OF_MEMORY", "OUT_OF_ME+", "CANCELLED by 0",
                                    "CANCELLED+", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "PENDING", "RUNNING",
                                    "REQUEUED", "BOOT_FAIL", ""]), st.text(max_size=12))
exit_codes = st.one_of(st.sampled_from(["0:0", "1:0", "0:125", "0:15", "65:0", "3:0", "82:0", "", "x:y"]),
                       st.text(max_size=6))
hostile = st.text(alphabet=st.sampled_from(list("ab|+ \t\r\n_[]-,.:é漢\u2028\x85\x0b{}\"0123456789")), max_size=20)


@st.composite
def tables(draw):
    """A sacct table in a random format, column order and line ending, with hostile values."""
    fields = draw(st.permutations(FIELDS))[:draw(st.integers(2, len(FIELDS)))]
    if "JobID" not in fields:
        fields = ["JobID", *fields]
    if "State" not in fields:
        fields = [*fields, "State"]
    rows = []
    for _ in range(draw(st.integers(0, 6))):
        value = {"JobID": draw(job_ids), "State": draw(states), "ExitCode": draw(exit_codes)}
        rows.append([value.get(f) if f in value else draw(hostile) for f in fields])
    fmt = draw(st.sampled_from(["P", "p", "fixed"]))
    if fmt == "fixed":
        widths = [draw(st.integers(1, 20)) for _ in fields]
        cell = lambda v, w: (v if len(v) <= w else v[:w - 1] + "+").rjust(w)  # noqa: E731
        lines = [" ".join(cell(f, w) for f, w in zip(fields, widths)), " ".join("-" * w for w in widths)]
        lines += [" ".join(cell(v, w) for v, w in zip(row, widths)) for row in rows]
    else:
        end = "|" if fmt == "p" else ""
        lines = ["|".join(fields) + end] + ["|".join(row) + end for row in rows]
    newline = draw(st.sampled_from(["\n", "\r\n"]))
    return newline.join(lines) + draw(st.sampled_from(["", newline]))


json_values = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                           max_leaves=8)
# Wrong-typed values, cheap to draw (the recursive strategy is slow; it is drawn for a few fields only).
odd = st.sampled_from([None, [], {}, "", "x", "12", 1.5, float("nan"), -1, 0, True, 2**70, {"number": "x"},
                       {"set": True, "infinite": True, "number": 3}, [1, "2"], {"current": 5}, ["FAILED"]])
numbers = st.one_of(st.integers(-5, 2**40), odd,
                    st.builds(lambda s, n: {"set": s, "infinite": False, "number": n}, st.booleans(),
                              st.integers(-5, 2**40)))


@st.composite
def sacct_json(draw):
    """sacct --json documents, 22.05 or 24.x shaped, with right and wrong types in every field."""
    def job():
        state = draw(states)
        return {
            "job_id": draw(numbers), "name": draw(st.one_of(hostile, odd)),
            "state": draw(st.sampled_from([{"current": state}, {"current": [state, "REQUEUED"]}, state, None])),
            "exit_code": draw(st.one_of(odd, st.builds(
                lambda s, rc, sig: {"status": s, "return_code": rc, "signal": {"id": sig, "signal_id": sig}},
                st.sampled_from(["SUCCESS", ["SIGNALED"], "FAILED", "PENDING", None]), numbers, numbers))),
            "array": draw(st.one_of(odd, st.builds(lambda j, t, task: {"job_id": j, "task_id": t, "task": task},
                                                           numbers, numbers, st.sampled_from([None, "0x1e", "1-4", "0xzz", "0x" + "f" * 5000])))),
            "het": {"job_id": draw(numbers), "job_offset": draw(numbers)},
            "time": draw(st.one_of(odd, st.fixed_dictionaries(
                {"start": numbers, "end": numbers, "submission": numbers, "elapsed": numbers}))),
            "nodes": draw(st.one_of(hostile, odd)), "comment": draw(st.one_of(odd, json_values)),
            "steps": draw(st.one_of(odd, st.lists(st.fixed_dictionaries({
                "step": st.one_of(odd, st.fixed_dictionaries({"id": st.one_of(hostile, numbers),
                                                              "name": hostile})),
                "state": st.one_of(states, st.lists(states, max_size=2)), "exit_code": odd,
                "nodes": odd, "time": odd}), max_size=2))),
        }
    doc = {"meta": draw(st.one_of(odd, json_values)), "errors": draw(st.one_of(st.just([]), odd)),
           "jobs": [job() for _ in range(draw(st.integers(0, 2)))]}
    return json.dumps(doc)


random_text = st.one_of(st.text(max_size=300), st.binary(max_size=300).map(lambda b: b.decode("utf-8", "replace")),
                        json_values.map(json.dumps), st.text(max_size=50).map(lambda t: "JobID|State\n" + t),
                        st.text(max_size=50).map(lambda t: "{" + t))


def check_reader(text: str) -> str:
    try:
        reading = read_sacct(text)
    except SacctFormatError as exc:
        assert str(exc).strip(), "a format error says what is wrong"
        return "error"
    assert all(isinstance(row, SacctRow) for row in reading.rows)
    assert read_sacct_text(text) == list(reading.rows)  # pure: the same text, the same rows
    return "rows" if reading.rows else "no rows"


def tally(target: str, outcome: str) -> None:
    COUNTS.setdefault(target, {}).setdefault(outcome, 0)
    COUNTS[target][outcome] += 1


@FUZZ
@given(tables())
def test_fuzz_tables(text):
    tally("tables", check_reader(text))


@FUZZ
@given(sacct_json())
def test_fuzz_sacct_json(text):
    tally("json", check_reader(text))


@FUZZ
@given(random_text)
def test_fuzz_random_text(text):
    tally("random", check_reader(text))


@FUZZ
@given(st.one_of(tables(), sacct_json(), random_text))
def test_fuzz_diagnose_cli(tmp_path_factory, text):
    """Through the command: exit 0 with a JSON report, or exit 2 with a one-line reason; never a traceback."""
    path = tmp_path_factory.mktemp("fuzz") / "sacct.txt"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    import contextlib
    import io
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = diagnose.main(["--sacct-file", str(path), "--json", "--runs-root", str(path.parent / "none")])
    if code == 0:
        assert "cause" in json.loads(out.getvalue())
    else:
        assert code == 2 and err.getvalue().startswith("diagnose: ") and not out.getvalue()
    tally("diagnose", f"exit {code}")


def test_fuzz_counts_are_reported():
    """Runs after the targets (file order): every reader target saw >= 1000 examples, and each outcome occurred."""
    if set(COUNTS) < {"tables", "json", "random", "diagnose"}:
        pytest.skip("run with the fuzz targets above (this test reads their counts)")
    print(f"\nsacct fuzz examples per target: {COUNTS}")
    for target in ("tables", "json", "random", "diagnose"):
        assert sum(COUNTS[target].values()) >= EXAMPLES, COUNTS
    assert COUNTS["tables"].get("rows") and COUNTS["json"].get("rows") and COUNTS["random"].get("error")

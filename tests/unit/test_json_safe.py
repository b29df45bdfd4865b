"""hpc_agent.core.json_safe: the one total JSON reader for job-written text (issue 42, finding 2). Table tests."""
from __future__ import annotations

import pytest

from hpc_agent.core import json_safe
from hpc_agent.core.json_safe import Limits, depth_over, loads, loads_object, parse_lines


@pytest.mark.parametrize("text, depth, over", [
    ("[]", 1, False), ("[[]]", 1, True), ("[[]]", 2, False), ('{"a": {"b": [1]}}', 3, False),
    ('{"a": {"b": [1]}}', 2, True), ('["[[[[[[[["]', 1, False),  # brackets inside a string do not count
    ('"\\"[[[["', 1, False), ("[" * 100000, 32, True), ("[1," * 40 + "]" * 40, 32, True),
    ("]" * 50 + "[" * 3, 32, False), ('"' + "[" * 50, 32, True),  # an unterminated string: counted, refused
])
def test_depth_over(text, depth, over):
    assert depth_over(text, depth) is over


@pytest.mark.parametrize("text, limits, value, problem", [
    ('{"a": 1}', Limits(), {"a": 1}, None),
    ("[" * 100000 + "]" * 100000, Limits(), None, "nested deeper than 32 levels"),
    ('{"a": NaN}', Limits(constants=False), None, "not JSON: ValueError: NaN is not JSON"),
    ("x" * 20, Limits(max_line_bytes=10), None, "20 characters, more than the 10 bytes allowed"),
    (b"\xff\xfe[1]", Limits(), None, "not JSON"),
    (12, Limits(), None, "int is not text"),
])
def test_loads_gives_a_value_or_a_named_problem(text, limits, value, problem):
    got, why = loads(text, limits)
    assert got == value and (why is None if problem is None else why.startswith(problem))


def test_loads_object_and_lines():
    assert loads_object("[1]") == ({}, "holds list, not an object")
    values, problems = parse_lines('{"seq": 1}\n' + "[" * 5000 + "\n\n[2]\n{torn", complete_only=True)
    assert values == [(1, {"seq": 1}), (4, [2])] and problems == ["line 2: nested deeper than 32 levels"]
    values, problems = parse_lines("\n".join(["x"] * (json_safe.MAX_PROBLEMS + 5)) + "\n")
    assert values == [] and problems[-1] == "5 more bad line(s)" and len(problems) == json_safe.MAX_PROBLEMS + 1

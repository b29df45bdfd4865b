"""heartbeat_format.decode's quick path (every running rank's beat, every tick) gives exactly what the field-by-field
checks give: the same Beat for a good beat, a ValueError for a bad one. The field-by-field path is reached by
adding an unknown key (which both accept and ignore), so each case is decoded both ways."""
from __future__ import annotations

import json
import math

import pytest

from hpc_agent.core import heartbeat_format
from hpc_agent.core.heartbeat_format import Beat, decode, encode

GOOD = Beat(job_id="123", attempt=1, rank=2, world=4, host="gpu001", pid=4242, phase="training", phase_since=1.7e9,
            step=10, step_at=1.7e9 + 5, start_step=3, recent_step_s=(1.0, 1.5), started_at=1.7e9 - 60,
            written_at=1.7e9 + 6, interval_s=5.0)


def both_ways(raw: dict):
    """(quick path's result, field-by-field result): a Beat or the ValueError's type name, for one object."""
    out = []
    for data in (raw, {**raw, "unknown_key": 1}):
        try:
            out.append(decode(json.dumps(data).encode()))
        except ValueError:
            out.append("ValueError")
    return tuple(out)


def mutated(**change) -> dict:
    raw = json.loads(encode(GOOD))
    raw.update(change)
    return raw


CASES = [
    {}, {"step_at": None}, {"recent_step_s": []}, {"recent_step_s": [1, 2.5, 0]}, {"interval_s": 1},
    {"phase_since": 1700000000}, {"rank": 3}, {"start_step": 10}, {"host": "x" * 256},
    # bad: each one field
    {"rank": 4}, {"world": 0}, {"start_step": 11}, {"phase": "sleeping"}, {"host": "x" * 257}, {"host": "a\nb"},
    {"job_id": 123}, {"attempt": True}, {"attempt": -1}, {"attempt": 2 ** 53 + 1}, {"attempt": 1.0},
    {"written_at": "now"}, {"written_at": -1.0}, {"written_at": 1e12}, {"written_at": True}, {"step_at": "x"},
    {"interval_s": 0.0}, {"interval_s": 86401}, {"recent_step_s": [1.0] * 21}, {"recent_step_s": [-1.0]},
    {"recent_step_s": [1e8]}, {"recent_step_s": [True]}, {"recent_step_s": "1.0"}, {"recent_step_s": [[1.0]]},
    {"pid": None}, {"phase_since": None},
]


@pytest.mark.parametrize("change", CASES, ids=[json.dumps(c)[:40] for c in CASES])
def test_quick_path_agrees_with_the_field_checks(change):
    quick, checked = both_ways(mutated(**change))
    assert quick == checked


def test_a_good_beat_round_trips_and_a_missing_field_is_refused():
    assert decode(encode(GOOD)) == GOOD
    raw = mutated()
    del raw["pid"]
    assert both_ways(raw) == ("ValueError", "ValueError")
    assert heartbeat_format._fast(mutated()) == GOOD
    assert heartbeat_format._fast(mutated(written_at=math.inf)) is None  # never reaches json: the quick path says no

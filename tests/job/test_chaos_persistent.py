"""Persistent chaos faults (launch/chaos_trigger.py): a fault recurs whenever its cause is still there
(docs/benchmarks.md, rule 2), and only then."""
from __future__ import annotations

import json
import math

import pytest

from launch import chaos_trigger as ct


# --- the pure rule, as a table ---------------------------------------------------------------------------------
OOM = {"kind": "gpu_oom", "micro_batch_at_least": 8}
NAN = {"kind": "nan", "step": 40, "lr_at_least": 1e-3}
HOST = {"kind": "host_oom", "mem_at_most_mb": 2048, "mb": 1500}
HANG = {"kind": "hang", "step": 70, "node": "node1"}
BAD = {"kind": "node_fail", "node": "node2"}

# (condition, step, micro_batch, lr, node, mem_mb, first_step) -> fires?
CASES = [
    (OOM, 5, 8, 1e-3, "node1", 2048, False, True),     # the same micro-batch: OOM again
    (OOM, 5, 16, 1e-3, "node1", 2048, False, True),    # larger: OOM
    (OOM, 5, 4, 1e-3, "node1", 2048, False, False),    # the ladder's next rung: fits
    (NAN, 40, 8, 1e-3, "node1", 2048, False, True),    # same checkpoint, same LR, same data order
    (NAN, 40, 8, 5e-4, "node1", 2048, False, False),   # the LR lowered by the repair
    (NAN, 39, 8, 1e-3, "node1", 2048, False, False),   # another step
    (HOST, 1, 8, 1e-3, "node1", 2048, True, True),     # the same --mem: the leak again at the first step
    (HOST, 1, 8, 1e-3, "node1", 1024, True, True),     # less memory
    (HOST, 1, 8, 1e-3, "node1", 3072, True, False),    # more memory (the repair): fits
    (HOST, 2, 8, 1e-3, "node1", 2048, False, False),   # once per process, at its first step
    (HOST, 1, 8, 1e-3, "node1", None, True, True),     # no --mem known: assume the same
    (HANG, 70, 8, 1e-3, "node1", 2048, False, True),   # nothing changed
    (HANG, 70, 8, 1e-3, "node2", 2048, False, False),  # another node
    (HANG, 69, 8, 1e-3, "node1", 2048, False, False),
    (BAD, 3, 8, 1e-3, "node2", 2048, False, True),     # the bad node stays bad
    (BAD, 3, 8, 1e-3, "node1", 2048, False, False),    # excluded: elsewhere
    ({"kind": "gpu_oom"}, 1, 8, 1e-3, "node1", 2048, True, False),             # malformed: never fires
    ({"kind": "nan", "step": "x", "lr_at_least": 1}, 1, 8, 1, "n", 1, True, False),
    ({"kind": "flood"}, 1, 8, 1e-3, "node1", 2048, True, False),
]


@pytest.mark.parametrize("cond,step,mb,lr,node,mem,first,fires", CASES)
def test_recurs_table(cond, step, mb, lr, node, mem, first, fires):
    assert ct.recurs(cond, step, mb, lr, node, mem, first) is fires


def test_condition_for_records_the_cause():
    assert ct.condition_for("gpu_oom", "n", 12, 8, 1e-3, "node1", 2048)["micro_batch_at_least"] == 8
    nan = ct.condition_for("nan", "n", 12, 8, 1e-3, "node1", 2048)
    assert (nan["step"], nan["lr_at_least"]) == (12, 1e-3)
    host = ct.condition_for("host_oom", "n", 12, 8, 1e-3, "node1", 2048, mb=900)
    assert (host["mem_at_most_mb"], host["mb"]) == (2048, 900)
    assert ct.condition_for("hang", "n", 12, 8, 1e-3, "node1", 2048)["node"] == "node1"
    for kind in ct.PERSISTENT_KINDS:  # each recorded condition fires in the context that recorded it
        cond = ct.condition_for(kind, "n", 12, 8, 1e-3, "node1", 2048, mb=1)
        assert ct.recurs(cond, 12, 8, 1e-3, "node1", 2048, True), kind


# --- through the trigger, across attempts ---------------------------------------------------------------------
def _inject(run_dir, kind, nonce, **extra):
    from hpc_agent.chaos.inject import write_trigger

    write_trigger(run_dir, kind, nonce, persistent=True, **extra)


@pytest.fixture
def on_node(monkeypatch):
    def place(node, mem_mb=2048):
        monkeypatch.setenv("SLURMD_NODENAME", node)
        monkeypatch.setenv("SLURM_MEM_PER_NODE", str(mem_mb))
    place("node1")
    return place


def _attempt(run_dir):
    return ct.RuntimeTrigger(run_dir, 0, True, poll_s=0)


def test_a_persistent_gpu_oom_recurs_in_later_attempts_at_the_same_micro_batch(tmp_path, on_node):
    import torch

    _inject(tmp_path, "gpu_oom", "o1")
    first = _attempt(tmp_path)
    first.before_step(10, micro_batch=8, lr=1e-3)
    with pytest.raises(torch.OutOfMemoryError):
        first.loss(1.0)
    recorded = json.loads((tmp_path / "chaos" / "conditions" / "o1.json").read_text())
    assert recorded["micro_batch_at_least"] == 8
    again = _attempt(tmp_path)  # the unchanged resubmission: OOM at its first step
    again.before_step(9, micro_batch=8, lr=1e-3)
    with pytest.raises(torch.OutOfMemoryError):
        again.loss(1.0)
    [line] = (tmp_path / "chaos" / "recurred.jsonl").read_text().splitlines()  # one per recurrence, for the bench
    assert json.loads(line)["kind"] == "gpu_oom" and json.loads(line)["step"] == 9
    repaired = _attempt(tmp_path)  # the ladder's next rung
    repaired.before_step(9, micro_batch=4, lr=1e-3)
    assert repaired.loss(1.0) == 1.0


def test_a_persistent_nan_recurs_from_the_same_checkpoint_until_the_lr_is_lowered(tmp_path, on_node):
    _inject(tmp_path, "nan", "d1")
    first = _attempt(tmp_path)
    first.before_step(40, micro_batch=8, lr=1e-3)
    assert math.isnan(first.loss(2.0))
    same = _attempt(tmp_path)
    for step in range(31, 41):  # replayed from the checkpoint of step 30
        same.before_step(step, micro_batch=8, lr=1e-3)
        value = same.loss(2.0)
        assert math.isnan(value) == (step == 40)
    lowered = _attempt(tmp_path)
    lowered.before_step(40, micro_batch=8, lr=5e-4)
    assert lowered.loss(2.0) == 2.0


def test_a_persistent_host_oom_leaks_at_each_start_until_the_memory_is_raised(tmp_path, on_node, monkeypatch):
    leaks = []
    monkeypatch.setattr(ct, "_leak", leaks.append)
    _inject(tmp_path, "host_oom", "h1", mb=1500)
    first = _attempt(tmp_path)
    first.before_step(1, micro_batch=8, lr=1e-3)  # the first step: nothing recorded yet
    first.before_step(2, micro_batch=8, lr=1e-3)
    first.leak.join(5)
    assert leaks == [1500]
    _attempt(tmp_path).before_step(3, micro_batch=8, lr=1e-3)  # the same --mem: leaks again at once
    on_node("node1", mem_mb=3072)
    _attempt(tmp_path).before_step(3, micro_batch=8, lr=1e-3)
    import time

    time.sleep(0.1)
    assert leaks == [1500, 1500]


class _Stop(Exception):
    pass


def test_a_persistent_hang_recurs_at_the_same_step_on_the_same_node(tmp_path, on_node, monkeypatch):
    def no_sleep(seconds):
        raise _Stop()

    monkeypatch.setattr(ct.time, "sleep", no_sleep)
    _inject(tmp_path, "hang", "g1")
    with pytest.raises(_Stop):
        _attempt(tmp_path).before_step(70, micro_batch=8, lr=1e-3)
    again = _attempt(tmp_path)
    again.before_step(69, micro_batch=8, lr=1e-3)
    with pytest.raises(_Stop):
        again.before_step(70, micro_batch=8, lr=1e-3)
    on_node("node2")
    elsewhere = _attempt(tmp_path)
    for step in (69, 70, 71):
        elsewhere.before_step(step, micro_batch=8, lr=1e-3)


def test_a_bad_node_stays_bad_until_excluded(tmp_path, on_node, monkeypatch, capsys):
    exits = []

    def fake_exit(code):
        exits.append(code)
        raise _Stop()

    monkeypatch.setattr(ct.os, "_exit", fake_exit)
    _inject(tmp_path, "node_fail", "b1")
    with pytest.raises(_Stop):
        _attempt(tmp_path).before_step(12, micro_batch=8, lr=1e-3)
    with pytest.raises(_Stop):  # a later attempt on the same node dies at its first step
        _attempt(tmp_path).before_step(11, micro_batch=8, lr=1e-3)
    assert exits == [1, 1]
    out = capsys.readouterr().out
    assert out.count("GPU has fallen off the bus") == 2
    from hpc_agent.core.causes import Cause
    from hpc_agent.diagnosis.logscan import _classify_line

    xid = next(line for line in out.splitlines() if "Xid" in line)
    assert _classify_line(xid)[0] == Cause.GPU_HW_ERROR  # what the watcher's diagnosis reads in the log
    on_node("node2")
    _attempt(tmp_path).before_step(11, micro_batch=8, lr=1e-3)  # elsewhere: trains


def test_conditions_are_read_as_untrusted(tmp_path, on_node):
    folder = tmp_path / "chaos" / "conditions"
    folder.mkdir(parents=True)
    (folder / "a.json").write_text("[" * 100000)
    (folder / "b.json").write_text(json.dumps({"kind": "gpu_oom", "micro_batch_at_least": "x"}))
    (folder / "c.json").symlink_to("/etc/passwd")
    (folder / "d.json").write_text(json.dumps({"kind": "gpu_oom", "micro_batch_at_least": 8}))
    trig = _attempt(tmp_path)
    assert [c.get("micro_batch_at_least") for c in trig.conditions] == ["x", 8]
    trig.before_step(1, micro_batch=4, lr=1e-3)  # the malformed one never fires
    assert trig.loss(1.0) == 1.0


def test_a_recurring_hang_stops_in_the_same_frames_as_the_first(tmp_path, on_node, monkeypatch):
    """The watcher stops a run that hangs twice at the same step in the same stack (a bug, not the cluster): a
    persistent hang must recur from the same frames, as a real one would."""
    import traceback

    stacks = []

    def no_sleep(seconds):
        stacks.append([(f.name, f.lineno) for f in traceback.extract_stack()[-4:-1]])
        raise _Stop()

    monkeypatch.setattr(ct.time, "sleep", no_sleep)
    _inject(tmp_path, "hang", "g2")
    for _ in range(2):  # the first firing, then the recurrence in a new attempt: called from one line here
        with pytest.raises(_Stop):
            _attempt(tmp_path).before_step(70, micro_batch=8, lr=1e-3)
    assert len(stacks) == 2 and stacks[0] == stacks[1], stacks

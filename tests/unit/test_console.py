"""launch/console.py: the job's stdout is block-buffered while it trains, and nothing printed is lost or reordered."""
from __future__ import annotations

import ast
import subprocess
import sys

from tests.conftest import REPO

CHILD = r"""
import os, sys, time
from launch.console import buffered_stdout

path = sys.argv[1]
size = lambda: os.path.getsize(path)
with buffered_stdout(every_s=0.2) as on:
    print("step 1")
    unflushed = size()
    print("say 1", flush=True)
    with_say = size()
    print("step 2")
    before_tick = size()
    time.sleep(0.7)
    after_tick = size()
    print("step 3")
restored = sys.stdout.write_through
print("after")
sys.stderr.write(repr((on, unflushed, with_say, before_tick, after_tick, size(), restored)))
"""


def test_step_lines_wait_for_a_flush_a_tick_or_the_end_and_keep_their_order(tmp_path):
    out = tmp_path / "stdout.txt"
    with out.open("wb") as fh:  # a regular file, as srun --output gives the job (python -u, as submitit starts it)
        proc = subprocess.run([sys.executable, "-u", "-c", CHILD, str(out)], cwd=str(REPO), stdout=fh,
                              stderr=subprocess.PIPE, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    on, unflushed, with_say, before_tick, after_tick, at_end, restored = ast.literal_eval(proc.stderr.strip())
    assert on and unflushed == 0  # buffered: no write per line
    assert with_say == len(b"step 1\nsay 1\n")  # a flushed line takes the buffered ones out first, in order
    assert before_tick == with_say and after_tick == with_say + len(b"step 2\n")  # the thread's tick wrote it
    assert out.read_text() == "step 1\nsay 1\nstep 2\nstep 3\nafter\n" and at_end == len(out.read_bytes())
    assert restored is True  # as python -u had it


def test_a_stream_that_cannot_be_reconfigured_is_left_alone(monkeypatch, capsys):
    import io

    from launch.console import buffered_stdout

    stream = io.StringIO()
    monkeypatch.setattr(sys, "stdout", stream)
    with buffered_stdout() as on:
        print("line")
    assert on is False and stream.getvalue() == "line\n"

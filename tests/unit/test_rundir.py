"""Reading job-written files: regular files only, bounded, never following links, never blocking."""
from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from hpc_agent.config.load import build_config, load_run_config, to_yaml
from hpc_agent.core import rundir
from hpc_agent.watcher.observe import read_files, scalars_for


def test_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "1_0_log.out"
    os.mkfifo(fifo)  # no writer: a blocking open would hang forever
    with pytest.raises(rundir.UnsafeFile, match="FIFO"):
        rundir.tail_log(fifo, 1024)


def test_link_to_dev_zero_is_not_followed(tmp_path):
    link = tmp_path / "1_0_log.err"
    link.symlink_to("/dev/zero")
    with pytest.raises(rundir.UnsafeFile, match="symbolic link"):
        rundir.tail_log(link, 1024)
    with pytest.raises(rundir.UnsafeFile):
        rundir.read_bounded(link, 1024)


def test_a_file_over_its_cap_is_refused_and_a_tail_is_cut_at_a_line(tmp_path):
    big = tmp_path / "config.yaml"
    big.write_bytes(b"x" * 2048)
    with pytest.raises(rundir.UnsafeFile, match="more than"):
        rundir.read_bounded(big, 1024)
    log = tmp_path / "1_0_log.out"
    log.write_text("".join(f"line {i}\n" for i in range(1000)))
    text, cut = rundir.read_tail(log, 100)
    assert cut and text.splitlines()[0].startswith("line ") and text.endswith("line 999\n")


def _poisoned_run(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    rundir.slurm_dir(run_dir).mkdir(parents=True)
    rundir.config_path(run_dir).write_text("train: [unclosed\n")
    os.mkfifo(rundir.slurm_dir(run_dir) / "7_0_log.out")
    (rundir.slurm_dir(run_dir) / "7_0_log.err").symlink_to("/dev/zero")
    (rundir.slurm_dir(run_dir) / "7_1_log.out").write_text("[hpc_agent] step 3 loss 2.0\n")
    tb = rundir.tb_dir(run_dir)
    tb.mkdir()
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(str(tb))
    for step in (1, 2, 3):
        value = summary_pb2.Summary.Value(tag="train/loss", simple_value=2.0)
        writer.add_event(event_pb2.Event(step=step, wall_time=1.0 + step, summary=summary_pb2.Summary(value=[value])))
    writer.close()
    with open(next(tb.glob("events*")), "ab") as handle:  # a header whose CRC does not match, then junk
        handle.write(struct.pack("<Q", 12) + b"\0\0\0\0" + b"not a record")
    return run_dir


def test_every_poison_is_a_problem_or_a_note_and_nothing_raises(tmp_path):
    run_dir = _poisoned_run(tmp_path)
    files = read_files(run_dir, "7", scalars_for(run_dir), lambda: load_run_config(run_dir))
    assert files.config is None
    reasons = " | ".join(files.problems)
    assert "config.yaml is not a valid config" in reasons
    assert "7_0_log.out is not a regular file (a FIFO)" in reasons
    assert "7_0_log.err is a symbolic link" in reasons
    assert [log.name for log in files.logs] == ["7_1_log.out"]  # the readable log is still read
    assert any("unreadable" in note for note in files.notes)


def test_a_good_run_reads_clean(tmp_path):
    run_dir = tmp_path / "run"
    rundir.slurm_dir(run_dir).mkdir(parents=True)
    rundir.config_path(run_dir).write_text(to_yaml(build_config([{"run": {"name": "t"}}])))
    (rundir.slurm_dir(run_dir) / "7_0_log.out").write_text("ok\n")
    files = read_files(run_dir, "7", scalars_for(run_dir), lambda: load_run_config(run_dir))
    assert files.problems == () and files.notes == () and files.config.run.name == "t"

"""The job's heartbeat: the file format against hostile input, the writer thread while the main thread is
stuck, a real stack dump on SIGURG, and the heartbeat of a real CPU training run."""
import json
import math
import os
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest

from helpers.common import expect, run, run_ranks, snapshot, start
from hpc_agent.core import rundir
from hpc_agent.core.heartbeat_format import MAX_BYTES, PHASES, STACK_SIGNAL, STACK_SIGNAL_NAME, Beat, decode, encode
from hpc_agent.diagnosis.hang import group_stacks
from launch.heartbeat import Heartbeat, rank_and_world

REPO = Path(__file__).resolve().parents[2]
NOW = 1_750_000_000.0
BEAT = Beat(job_id="4242", attempt=1, rank=0, world=2, host="node1", pid=77, phase="training", phase_since=NOW - 50,
            step=12, step_at=NOW - 1, start_step=4, recent_step_s=(0.5, 0.6, 0.55), started_at=NOW - 60,
            written_at=NOW, interval_s=5.0)


def test_signal_is_sigurg_whose_default_is_to_ignore():
    import signal

    assert STACK_SIGNAL == signal.SIGURG and STACK_SIGNAL_NAME == "URG"
    assert signal.getsignal(signal.SIGURG) == signal.SIG_DFL  # default action of SIGURG: ignore
    assert PHASES == ("starting", "loading", "training", "evaluating", "saving", "done")


@pytest.mark.parametrize("beat", [BEAT, replace(BEAT, step_at=None, step=4, recent_step_s=()),
                                  replace(BEAT, phase="done", recent_step_s=tuple(range(20)))])
def test_encode_decode_round_trip(beat):
    assert decode(encode(beat)) == beat


def _mutated(**changes) -> bytes:
    raw = json.loads(encode(BEAT))
    raw.update(changes)
    return json.dumps(raw).encode()


@pytest.mark.parametrize("data,why", [
    (b"", "empty"),
    (b"[1, 2]", "not an object"),
    (b"\xff\xfe{", "not UTF-8"),
    (b"{" * 100000, "deep nesting"),
    (_mutated(step="12"), "string step"),
    (_mutated(step=True), "bool step"),
    (_mutated(step=-1), "negative step"),
    (_mutated(step=1 << 80), "huge step"),
    (_mutated(step=12.5), "float step"),
    (_mutated(written_at=1e300), "time out of bounds"),
    (_mutated(interval_s=0), "zero interval"),
    (_mutated(phase="hacking"), "unknown phase"),
    (_mutated(host="x" * 10000), "long host"),
    (_mutated(job_id="12\n34"), "control character"),
    (_mutated(recent_step_s=[1.0] * 21), "too many durations"),
    (_mutated(recent_step_s="1,2"), "durations not a list"),
    (_mutated(recent_step_s=[-1.0]), "negative duration"),
    (_mutated(rank=2), "rank outside the world"),
    (_mutated(start_step=13), "start past step"),
    (_mutated(step_at="soon"), "step_at a string"),
    (json.dumps({k: v for k, v in json.loads(encode(BEAT)).items() if k != "pid"}).encode(), "missing field"),
    (encode(BEAT).replace(b'"written_at": ' + str(NOW).encode(), b'"written_at": NaN'), "NaN"),
    (encode(BEAT).replace(b'"written_at": ' + str(NOW).encode(), b'"written_at": Infinity'), "Infinity"),
    (b" " * (MAX_BYTES + 1), "huge"),
])
def test_decode_refuses_hostile_input(data, why):
    if why in ("NaN", "Infinity"):
        assert data != encode(BEAT), "the substitution must have happened"
    with pytest.raises(ValueError):
        decode(data)


def test_encode_refuses_nan():
    with pytest.raises(ValueError):
        encode(replace(BEAT, written_at=math.nan))


def test_read_heartbeats_skips_links_garbage_and_other_ranks_files(tmp_path):
    folder = rundir.heartbeat_dir(tmp_path)
    folder.mkdir()
    rundir.heartbeat_path(tmp_path, 0).write_bytes(encode(BEAT))
    target = tmp_path / "elsewhere.json"
    target.write_bytes(encode(replace(BEAT, rank=1)))
    rundir.heartbeat_path(tmp_path, 1).symlink_to(target)               # a link: not followed
    rundir.heartbeat_path(tmp_path, 2).write_bytes(b"{not json")          # garbage: skipped
    rundir.heartbeat_path(tmp_path, 3).write_bytes(encode(BEAT))          # rank 0's beat under rank 3's name
    os.mkfifo(rundir.heartbeat_path(tmp_path, 4))                         # a FIFO: never blocks the reader
    (folder / "notes.txt").write_text("ignored")
    assert rundir.read_heartbeats(tmp_path) == [BEAT]
    assert rundir.heartbeat_path(tmp_path, 7).name == "rank-00007.json"
    assert rundir.stack_path(tmp_path, 7) == tmp_path / "stacks" / "rank-00007.txt"


def test_read_heartbeats_refuses_a_linked_folder(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (real / "rank-00000.json").write_bytes(encode(BEAT))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rundir.heartbeat_dir(run_dir).symlink_to(real)
    assert rundir.read_heartbeats(run_dir) == []
    rundir.stacks_dir(run_dir).symlink_to(real)
    assert rundir.read_stacks(run_dir) == {}


def test_read_stacks_keeps_the_tail(tmp_path):
    rundir.stacks_dir(tmp_path).mkdir()
    rundir.stack_path(tmp_path, 3).write_text("# header\n" + "x" * 100 + "\n" + "y" * (rundir.STACKS_TAIL_BYTES + 10))
    text = rundir.read_stacks(tmp_path)[3]
    assert len(text) <= rundir.STACKS_TAIL_BYTES and text.endswith("y")


@pytest.mark.parametrize("environ,expected", [
    ({}, (0, 1)),
    ({"SLURM_PROCID": "3", "SLURM_NTASKS": "4"}, (3, 4)),
    ({"RANK": "1", "WORLD_SIZE": "2"}, (1, 2)),
    ({"SUBMITIT_LOCAL_GLOBALID": "1", "SUBMITIT_LOCAL_NTASKS": "2", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}, (1, 2)),
    ({"SLURM_PROCID": "x", "SLURM_NTASKS": "4"}, (0, 1)),
    ({"RANK": "5", "WORLD_SIZE": "2"}, (0, 1)),
])
def test_rank_and_world_from_the_environment(environ, expected):
    assert rank_and_world(environ) == expected


def test_thread_keeps_writing_while_the_main_thread_sleeps(tmp_path):
    hb = Heartbeat(tmp_path, 1, 2, interval_s=0.1, environ={"SLURM_JOB_ID": "99", "SLURM_RESTART_COUNT": "2"}).start()
    try:
        hb.resumed_at(10)
        hb.stepped(11, 0.25)
        time.sleep(0.3)
        first = rundir.read_heartbeats(tmp_path)[0]
        time.sleep(0.6)  # the "stuck" main thread: no step, no phase change
        second = rundir.read_heartbeats(tmp_path)[0]
    finally:
        hb.stop()
    assert (first.job_id, first.attempt, first.rank, first.world) == ("99", 2, 1, 2)
    assert second.written_at - first.written_at >= 0.4  # the writer went on
    assert (second.step, second.step_at, second.start_step) == (first.step, first.step_at, 10) == (11, first.step_at, 10)
    assert second.recent_step_s == (0.25,) and second.phase == "training"
    final = rundir.read_heartbeats(tmp_path)[0]
    assert final.phase == "done" and final.step == 11
    mode = os.stat(rundir.heartbeat_path(tmp_path, 1)).st_mode & 0o777
    assert mode == 0o600
    assert rundir.read_stacks(tmp_path)[1].startswith("# job 99 attempt 2 rank 1 host ")


def test_write_failure_never_reaches_training(tmp_path, capfd):
    blocker = tmp_path / "run"
    blocker.write_text("a file where the run directory should be")
    hb = Heartbeat(blocker, 0, 1, interval_s=0.05).start()
    hb.stepped(1, 0.1)
    time.sleep(0.2)
    hb.stop()
    err = capfd.readouterr().err
    assert err.count("cannot write heartbeat") == 1 and "training goes on" in err


def test_a_nan_step_time_does_not_spoil_the_beat(tmp_path):
    hb = Heartbeat(tmp_path, 0, 1, interval_s=60)
    hb.stepped(1, float("nan"))
    hb.stepped(2, 0.5)
    assert decode(encode(hb.beat())).recent_step_s == (0.5,)


def test_unknown_phase_is_a_bug():
    with pytest.raises(ValueError):
        Heartbeat(Path("/nonexistent"), 0, 1).phase("napping")


SLEEPER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from launch.heartbeat import Heartbeat

    def wait_for_ever():
        Path(sys.argv[2]).write_text("ready")
        time.sleep(60)  # the stuck frame

    Heartbeat(Path(sys.argv[1]), 0, 1, interval_s=0.2).start()
    wait_for_ever()
""")


def test_sigurg_leaves_the_sleeping_frame_in_the_stack_file(tmp_path):
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    ready = tmp_path / "ready"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "run"), str(ready)], env=env)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.02)
        assert ready.exists(), "the sleeper did not start"
        time.sleep(0.1)  # into time.sleep
        proc.send_signal(STACK_SIGNAL)
        deadline = time.monotonic() + 10
        while "wait_for_ever" not in rundir.read_stacks(tmp_path / "run").get(0, "") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, "SIGURG must not end the process"
    finally:
        proc.kill()
        proc.wait()
    stacks = rundir.read_stacks(tmp_path / "run")
    groups = group_stacks(stacks)
    line = SLEEPER.splitlines().index("    time.sleep(60)  # the stuck frame") + 1
    assert groups.top_frame == f"{script}:{line} in wait_for_ever", stacks[0]
    assert groups.groups == {groups.majority: (0,)} and groups.outliers == ()


def _watch_phases(proc, run_dir: Path, timeout: float = 240) -> list:
    """The phases seen in rank 0's heartbeat while the job runs (read as the watcher reads them)."""
    seen = []
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        for beat in rundir.read_heartbeats(run_dir):
            if not seen or seen[-1] != beat.phase:
                seen.append(beat.phase)
        time.sleep(0.02)
    proc.wait(timeout=5)
    return seen


def test_a_cpu_training_run_and_its_resume_leave_done_heartbeats_at_their_last_step(tmp_path):
    run_dir = tmp_path / "run"
    # A step of this model takes ~5 ms, so a training stretch needs enough steps to outlast a few beats
    # (9 steps before the first checkpoint: ~70 ms, ~3 beats of 0.02 s) for the watcher to see it.
    cfg = snapshot(tmp_path / "cfg.yaml", train={"max_steps": 18, "ckpt_every": 9, "eval_every": 18},
                   resilience={"heartbeat_s": 0.02})
    proc = start(cfg, run_dir)
    seen = _watch_phases(proc, run_dir)
    expect(subprocess.CompletedProcess(proc.args, proc.returncode, Path(proc.log_path).read_text(), ""), 0,
           "done: 18 steps")
    assert seen[0] in ("starting", "loading") and "training" in seen, seen
    beats = rundir.read_heartbeats(run_dir)
    assert len(beats) == 1
    first = beats[0]
    assert (first.phase, first.step, first.start_step, first.rank, first.world) == ("done", 18, 0, 0, 1)
    assert len(first.recent_step_s) == 18 and first.step_at is not None and first.interval_s == 0.02
    assert first.started_at <= first.step_at <= first.written_at
    assert rundir.read_stacks(run_dir)[0].startswith("# job ")

    more = snapshot(tmp_path / "cfg20.yaml", train={"max_steps": 20, "ckpt_every": 9, "eval_every": 18},
                    resilience={"heartbeat_s": 0.02})
    expect(run(more, run_dir), 0, "resumed at step 18")
    again = rundir.read_heartbeats(run_dir)[0]
    assert (again.phase, again.step, again.start_step, len(again.recent_step_s)) == ("done", 20, 18, 2)
    assert again.started_at > first.written_at


@pytest.mark.slow
def test_two_ranks_write_one_heartbeat_each(tmp_path):
    cfg = snapshot(tmp_path / "cfg2.yaml", train={"max_steps": 4, "ckpt_every": 2, "micro_batch_size": 4},
                   slurm={"tasks_per_node": 2}, resilience={"heartbeat_s": 0.5})
    results = run_ranks(cfg, tmp_path / "run", world=2)
    assert [r.returncode for r in results] == [0, 0], results[0].stdout[-3000:]
    beats = rundir.read_heartbeats(tmp_path / "run")
    assert [(b.rank, b.world, b.phase, b.step) for b in beats] == [(0, 2, "done", 4), (1, 2, "done", 4)]
    assert beats[0].pid != beats[1].pid and beats[0].job_id == beats[1].job_id == "local"
    assert sorted(rundir.read_stacks(tmp_path / "run")) == [0, 1]

"""Runs for load tests: N live runs with heartbeats, and ONE run carrying every poison of issue 42 at once.

Used by ``scripts/bench/watch_load.py --poison`` (the clean tick against the poisoned tick) and by
``tests/security/test_f3_bounded_tick.py`` (the same attack, asserted). Builds files only: no Slurm, no job.

A live run: a ledger row in ``running`` with its job id, a valid ``config.yaml`` and one heartbeat per rank
that :func:`beat_all` rewrites before each tick (the watcher judges every running run's heartbeats each
``heartbeat_s / 2``: the busy path, not the idle one of empty run dirs).

The poison (:func:`plant_poison`), everything a job or a group member can write into a run directory:
thousands of rank logs (hard links to one file of ``log_bytes`` of step lines), tens of thousands of TensorBoard
event files, a tb/ folder tree thousands of levels deep, a 100000-deep JSON line in ``events.jsonl`` and in the
in-job journal, wrong types in ``run.json``, a ``config.yaml`` that names a ``notify.command`` (a harmless
``touch MARKER``: whether the marker appears says whether the watcher ran it), a FIFO and a symbolic link to
``/dev/zero`` among the logs, and a ``journal/`` that is a symbolic link to a folder outside the run.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

FIRST_JOB_ID = 9_000_000
HEARTBEAT_S = 5.0  # the schema's resilience.heartbeat_s


def run_id_of(i: int) -> str:
    return f"load-{i:05d}"


def job_id_of(i: int) -> str:
    return str(FIRST_JOB_ID + i)


def beat_bytes(job_id: str, rank: int, now: float, step: int, world: int = 1) -> bytes:
    """One rank's heartbeat file as the job writes it (``hpc_agent.core.heartbeat_format``): training, a step
    just completed."""
    from hpc_agent.core import heartbeat_format

    beat = heartbeat_format.Beat(job_id=job_id, attempt=0, rank=rank, world=world, host="node1", pid=4242 + rank,
                                 phase="training", phase_since=now - 60.0, step=step, step_at=now - 0.5,
                                 start_step=0, recent_step_s=(0.5,) * 5, started_at=now - 120.0, written_at=now,
                                 interval_s=HEARTBEAT_S)
    return heartbeat_format.encode(beat)


def beat_all(runs: Sequence[Tuple[str, Path, str]], now: float, step: int, ranks: int = 1) -> None:
    """Rewrite every run's heartbeats as of ``now`` (atomically, as the job does: write, then rename)."""
    from hpc_agent.core import rundir

    for _, run_dir, job_id in runs:
        for rank in range(ranks):
            path = rundir.heartbeat_path(run_dir, rank)
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_bytes(beat_bytes(job_id, rank, now, step, ranks))
            os.replace(tmp, path)


def build_live_runs(root: Path, n: int, now: float, ranks: int = 1) -> List[Tuple[str, Path, str]]:
    """``n`` running runs under ``root`` (one ledger transaction): (run id, run dir, job id) each, with a valid
    config.yaml and heartbeats as of ``now``."""
    from hpc_agent.config.load import build_config, write_run_config
    from hpc_agent.core import rundir
    from hpc_agent.state.ledger import Ledger

    root.mkdir(parents=True, exist_ok=True)
    template = write_run_config(root / ".template", build_config([{"run": {"name": "load"}}]))
    config_text = template.read_bytes()
    shutil.rmtree(root / ".template")
    runs = []
    ledger = Ledger.in_runs_root(root)
    with ledger.transaction():
        for i in range(n):
            run_id, job_id = run_id_of(i), job_id_of(i)
            run_dir = root / run_id
            rundir.heartbeat_dir(run_dir).mkdir(parents=True)
            rundir.slurm_dir(run_dir).mkdir()
            rundir.config_path(run_dir).write_bytes(config_text)
            ledger.add_run(run_id, "load", str(run_dir))
            sub = ledger.record_intent(run_id, "slurm", str(rundir.config_path(run_dir)), reason="initial")
            ledger.record_submitted(sub, job_id)
            ledger.set_phase(run_id, "running")
            runs.append((run_id, run_dir, job_id))
    ledger.close()
    beat_all(runs, now, step=1, ranks=ranks)
    return runs


_EVENT_BYTES: Optional[bytes] = None


def event_file_bytes() -> bytes:
    """A small, valid TensorBoard event file (the version record and one ``train/loss`` scalar), made once
    with TensorBoard's own writer."""
    global _EVENT_BYTES
    if _EVENT_BYTES is None:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        with tempfile.TemporaryDirectory() as tmp:
            writer = EventFileWriter(tmp)
            value = summary_pb2.Summary.Value(tag="train/loss", simple_value=1.0)
            writer.add_event(event_pb2.Event(step=1, wall_time=time.time(), summary=summary_pb2.Summary(value=[value])))
            writer.close()
            (path,) = Path(tmp).iterdir()
            _EVENT_BYTES = path.read_bytes()
    return _EVENT_BYTES


def deep_json(depth: int) -> str:
    """One JSON line nested ``depth`` deep: Python's json raises RecursionError on it, not ValueError."""
    return "[" * depth + "]" * depth


def _deep_tree(top: Path, depth: int) -> None:
    """``top/d/d/d...`` ``depth`` levels, made with a descriptor per level (the path is longer than PATH_MAX)."""
    top.mkdir(parents=True, exist_ok=True)
    fd = os.open(top, os.O_RDONLY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            nxt = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = nxt
    finally:
        os.close(fd)


def remove_tree(path: Path) -> None:
    """Remove a tree that may hold a folder chain thousands deep (``shutil.rmtree`` recurses, and a path that
    long is past PATH_MAX): iteratively, by descriptor, hoisting each subfolder's entries up one level until none
    is left. Links are removed, never followed."""
    path = Path(path)
    if not path.is_dir() or path.is_symlink():
        if path.is_symlink() or path.exists():
            path.unlink()
        return
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    fd = os.open(path, flags)
    moved = 0
    try:
        while True:
            subdirs = []
            with os.scandir(fd) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        subdirs.append(entry.name)
                    else:
                        os.unlink(entry.name, dir_fd=fd)
            if not subdirs:
                break
            for name in subdirs:
                sub = os.open(name, flags, dir_fd=fd)
                try:
                    for child in os.listdir(sub):
                        moved += 1
                        os.rename(child, f".rm{moved}", src_dir_fd=sub, dst_dir_fd=fd)
                finally:
                    os.close(sub)
                os.rmdir(name, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(path)


def plant_rank_logs(run_dir: Path, job_id: str, count: int, log_bytes: int) -> Dict[str, Any]:
    """``count`` rank logs of ``log_bytes`` of step lines each, ending in a traceback (hard links to one file:
    each reads as a full log and costs no disk), plus a FIFO and a symbolic link to /dev/zero as the two newest
    ranks' logs."""
    from hpc_agent.core import rundir

    logs = rundir.slurm_dir(run_dir)
    logs.mkdir(parents=True, exist_ok=True)
    line = "[hpc_agent] step 3 loss 2.0000 lr 1.0e-04 samples/s 812.5 step_time_s 0.512 mem_gb 61.2\n"
    tail = "Traceback (most recent call last):\nRuntimeError: boom\n"
    body = line * max(0, (log_bytes - len(tail)) // len(line)) + tail
    first = logs / f"{job_id}_0_log.out"
    first.write_text(body)
    old = time.time() - 3600
    os.utime(first, (old, old))
    for rank in range(1, count):
        os.link(first, logs / f"{job_id}_{rank}_log.out")
    fifo = logs / f"{job_id}_{count}_log.out"
    os.mkfifo(fifo)
    link = logs / f"{job_id}_{count + 1}_log.out"
    link.symlink_to("/dev/zero")  # the newest two: the reader meets them among the ranks it picks
    return {"rank_logs": count, "log_bytes_each": len(body), "fifo_log": fifo.name,
            "symlink_log": f"{link.name} -> /dev/zero"}


def plant_event_files(run_dir: Path, count: int) -> Dict[str, Any]:
    """``count`` small valid event files in ``tb/``, one per (fake) attempt."""
    from hpc_agent.core import rundir

    tb = rundir.tb_dir(run_dir)
    tb.mkdir(parents=True, exist_ok=True)
    data = event_file_bytes()
    base = int(time.time()) - count
    for i in range(count):
        (tb / f"events.out.tfevents.{base + i}.node1.{i}.attempt{i}").write_bytes(data)
    return {"event_files": count}


def plant_deep_tb(run_dir: Path, depth: int) -> Dict[str, Any]:
    """A folder chain ``depth`` levels deep under ``tb/`` (a recursive walk dies of RecursionError)."""
    from hpc_agent.core import rundir

    _deep_tree(rundir.tb_dir(run_dir) / "deep", depth)
    return {"tb_depth": depth}


def plant_deep_json(run_dir: Path, outside: Path, depth: int, victim_job_id: str) -> Dict[str, Any]:
    """A ``depth``-deep JSON line in events.jsonl, and a ``journal/`` that is a symbolic link to ``outside``,
    whose in_job.jsonl holds a repair forged for ``victim_job_id`` and the same deep line."""
    from hpc_agent.core import rundir

    deep = deep_json(depth)
    rundir.events_path(run_dir).write_text(json.dumps({"seq": 1, "run_id": run_dir.name}) + "\n" + deep + "\n")
    journal = outside / "journal"
    journal.mkdir(parents=True, exist_ok=True)
    forged = {"seq": 1, "job_id": victim_job_id, "attempt": 0, "cause": "gpu_oom", "action": "in_job_repair",
              "reason": "forged from another run", "patch": {"train.micro_batch_size": 1}}
    (journal / "in_job.jsonl").write_text(json.dumps(forged) + "\n" + deep + "\n")
    linked = rundir.in_job_journal_path(run_dir).parent
    if linked.is_dir() and not linked.is_symlink():
        shutil.rmtree(linked)
    linked.symlink_to(journal, target_is_directory=True)
    return {"json_depth": depth, "journal_dir": f"symbolic link to {journal}"}


def plant_bad_run_json(run_dir: Path) -> Dict[str, Any]:
    """run.json with the wrong type in every field the readers use."""
    from hpc_agent.core import rundir

    rundir.run_json_path(run_dir).write_text(json.dumps({"run_id": ["not", "a", "string"], "job_ids": 5,
                                                         "workdir": {"not": "a path"}, "submitted_at": [1, 2],
                                                         "tb_dir": 7, "log_paths": {"x": None}}))
    return {"run_json": "wrong types in every field"}


def plant_notify_config(run_dir: Path, marker: Path) -> Dict[str, Any]:
    """A valid config.yaml whose ``notify.command`` is ``touch MARKER``: the marker says whether it ran."""
    from hpc_agent.config.load import build_config, write_run_config

    write_run_config(run_dir, build_config([{"run": {"name": run_dir.name},
                                             "notify": {"command": ["touch", str(marker)]}}]))
    return {"config_notify_command": ["touch", str(marker)]}


def plant_poison(run_dir: Path, job_id: str, outside: Path, marker: Path, *, rank_logs: int = 1200,
                 log_bytes: int = 256 << 10, event_files: int = 20_000, tb_depth: int = 2000,
                 json_depth: int = 100_000, victim_job_id: str = "") -> Dict[str, Any]:
    """Every poison of issue 42 at once in ``run_dir`` (see the module doc); ``outside`` is a folder out of the
    run (the linked journal's target), ``marker`` the file the planted ``notify.command`` would create.
    Returns what was planted (for the benchmark's record)."""
    t0 = time.perf_counter()
    planted: Dict[str, Any] = {}
    planted.update(plant_rank_logs(run_dir, job_id, rank_logs, log_bytes))
    planted.update(plant_event_files(run_dir, event_files))
    planted.update(plant_deep_tb(run_dir, tb_depth))
    planted.update(plant_deep_json(run_dir, outside, json_depth, victim_job_id or job_id))
    planted.update(plant_bad_run_json(run_dir))
    planted.update(plant_notify_config(run_dir, marker))
    planted["plant_s"] = round(time.perf_counter() - t0, 2)
    return planted

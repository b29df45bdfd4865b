"""Issue 42, finding 3: unbounded work per tick. A run directory stuffed with rank logs and event files costs
bounded time and memory, is reported, and is not followed into; the other runs go on.

The attack as the issue states it: 1000 rank logs of 256 KiB (the watcher held 250 MiB), 3000 of them (one tick
took 460 s and 798 MB), ``diagnose`` on 2000 logs (past 2 GB), 20k event files under ``tb/`` (``review``: 27 s,
447 MB), plus a tb/ tree thousands of levels deep. The files are built by ``scripts/bench/poison.py`` (the load
benchmark's poison); rank logs are hard links to one file of step lines, so each reads as a full log but
costs no disk. Each command runs in a
subprocess whose peak RSS is measured (``RUSAGE_CHILDREN`` of a driver that runs only it).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scripts.bench import poison

REPO = Path(__file__).resolve().parents[2]

# What the fixed readers need, with room for a slow CI machine; the unbounded ones measured 250 MiB to 2 GB and
# 27 s to 460 s on these inputs.
TICK_S, TICK_PEAK_MB = 20.0, 48.0
COMMAND_S, COMMAND_RSS_MB = 30.0, 400.0

DRIVER = """
import json, resource, subprocess, sys, time
t = time.monotonic()
p = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=600)
print(json.dumps({"rc": p.returncode, "out": p.stdout[-200000:], "err": p.stderr[-20000:],
                  "wall_s": time.monotonic() - t,
                  "rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""


def measured(argv, cwd: Path) -> dict:
    """Run ``argv`` as the only child of a fresh driver: its exit code, output, wall time and peak RSS."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", DRIVER, *argv], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=900)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def work(tmp_path):
    yield tmp_path
    poison.remove_tree(tmp_path)  # the deep tb/ chain is past what shutil.rmtree's recursion can remove


# --- the watcher: one tick -------------------------------------------------------------------------------------
TICK = """
import json, sys, time, tracemalloc
from pathlib import Path
from scripts.bench import poison
from scripts.bench.watch_load import SyntheticSlurm
from hpc_agent.state.ledger import Ledger
from hpc_agent.watcher.loop import Watcher

work, rank_logs, log_bytes = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
now = [time.time()]
runs = poison.build_live_runs(work / "runs", 12, now[0])
slurm = SyntheticSlurm()
ledger = Ledger.in_runs_root(work / "runs")
lines = []
def refuse(*a, **k):
    raise RuntimeError("the test submits nothing")
watcher = Watcher(ledger, slurm, runs_root=work / "runs", clock=lambda: now[0], submit=refuse, out=lines.append,
                  pause_file=work / "paused", sacct_json=False)
watcher.tick()  # every run running and followed
bad_id, bad_dir, bad_job = runs[0]
poison.plant_poison(bad_dir, bad_job, work / "outside", work / "notify-ran", rank_logs=rank_logs, log_bytes=log_bytes,
                    victim_job_id=runs[1][2])
slurm.failed.add(bad_job)        # the poisoned run's job ended: the watcher reads all of its files
slurm.completed.add(runs[2][2])  # and another run completed on the same tick
now[0] += poison.HEARTBEAT_S
poison.beat_all(runs, now[0], 2)
tracemalloc.start()
t0 = time.perf_counter()
report = watcher.tick()
wall = time.perf_counter() - t0
peak = tracemalloc.get_traced_memory()[1]
tracemalloc.stop()
first = list(lines)
for _ in range(2):  # the next ticks: the run is parked and not followed; nothing said again
    now[0] += poison.HEARTBEAT_S
    poison.beat_all(runs, now[0], 3)
    watcher.tick()
print(json.dumps({"wall_s": wall, "peak_mb": peak / 2 ** 20, "parked": report.parked, "followed": report.runs,
                  "phases": {r: ledger.run(r).phase for r, _, _ in runs}, "lines": lines, "first": first,
                  "bad": bad_id}))
"""


@pytest.mark.parametrize("rank_logs,log_bytes", [(1000, 256 << 10), (3000, 256)],
                         ids=["1000 rank logs of 256 KiB", "3000 tiny rank logs"])
def test_one_watcher_tick_over_a_stuffed_run_is_bounded_and_the_others_are_followed(work, rank_logs, log_bytes):
    got = measured([sys.executable, "-c", TICK, str(work), str(rank_logs), str(log_bytes)], REPO)
    assert got["rc"] == 0 and "Traceback" not in got["err"], got["err"]
    tick = json.loads(got["out"].strip().splitlines()[-1])
    assert tick["wall_s"] < TICK_S, tick["wall_s"]
    assert tick["peak_mb"] < TICK_PEAK_MB, tick["peak_mb"]  # unbounded: every log's tail, 250 MiB for 1000
    bad = tick["bad"]
    # reported, once, naming the caps it met; not followed into (the rest of its logs and event files unread)
    said = [line for line in tick["lines"] if f" {bad}: over the read cap" in line]
    assert any("rank_logs=8" in line and f"{rank_logs + 2} ranks have logs" in line for line in said), tick["lines"]
    assert any("listing=" in line or "event_files=" in line for line in said), said
    assert len(said) == len({line.split(": ", 2)[1].split("=")[0] for line in said})  # each cap said once
    # the run is parked (a FIFO and a link among its logs), the watcher stayed up, the others were followed
    assert tick["phases"][bad] == "needs_attention" and bad in tick["parked"]
    assert tick["followed"] == 12
    assert tick["phases"]["load-00002"] == "completed"  # the run that completed on the same tick was followed
    assert all(phase == "running" for run, phase in tick["phases"].items() if run not in (bad, "load-00002"))


# --- diagnose and review -----------------------------------------------------------------------------------------
def _one_run(work: Path) -> Path:
    from hpc_agent.config.load import build_config, write_run_config

    run_dir = work / "runs" / "load-00000"
    run_dir.mkdir(parents=True)
    write_run_config(run_dir, build_config([{"run": {"name": "load-00000"}}]))
    return run_dir


def test_diagnose_on_2000_rank_logs_and_20k_event_files_is_bounded(work):
    from hpc_agent.slurm.sacct import SACCT_FIELDS
    from scripts.bench.watch_load import synthetic_sacct

    job = "9000000"
    run_dir = _one_run(work)
    poison.plant_rank_logs(run_dir, job, 2000, 1 << 20)  # diagnose reads 1 MiB of each: 2 GB unbounded
    poison.plant_event_files(run_dir, 20_000)
    poison.plant_deep_tb(run_dir, 2000)
    newest = run_dir / "slurm" / f"{job}_2000_log.out"
    newest.unlink()  # a FIFO: diagnose refuses a log it cannot read (exit 2); here the newest rank's plain log
    newest.write_text("RuntimeError: the newest rank\n")
    (run_dir / "slurm" / f"{job}_2001_log.out").unlink()
    sacct = work / "sacct.txt"
    sacct.write_text(synthetic_sacct([job], SACCT_FIELDS, pending_every=0, failed=[job]))
    got = measured([sys.executable, "-m", "hpc_agent.diagnose", job, "--sacct-file", str(sacct), "--runs-root",
                    str(work / "runs"), "--json"], work)
    assert got["rc"] == 0 and "Traceback" not in got["err"], got["err"]
    assert got["rss_mb"] < COMMAND_RSS_MB and got["wall_s"] < COMMAND_S, (got["rss_mb"], got["wall_s"])
    report = json.loads(got["out"])
    assert len(report["logs"]) == 8 and f"{job}_2000_log.out" in report["logs"]  # the newest ranks, not 2000
    evidence = " ".join(report["evidence"])
    assert "over the read cap rank_logs=8: 2001 ranks have logs" in evidence
    # 20k names: the walk stops at the listing cap (before or after the deep chain), the newest 256 of what it saw
    assert "over the read cap listing=4096" in evidence and "over the read cap event_files=256" in evidence


def test_review_on_20k_event_files_and_a_deep_tb_tree_is_bounded(work):
    run_dir = _one_run(work)
    poison.plant_event_files(run_dir, 20_000)
    poison.plant_deep_tb(run_dir, 2000)
    got = measured([sys.executable, "-m", "hpc_agent.review", str(run_dir), "--json"], work)
    assert got["rc"] == 0 and "Traceback" not in got["err"], got["err"]
    assert got["rss_mb"] < COMMAND_RSS_MB and got["wall_s"] < COMMAND_S, (got["rss_mb"], got["wall_s"])
    (run,) = json.loads(got["out"])["runs"]
    notes = " ".join(run["notes"])
    assert "over the read cap listing=4096" in notes and "over the read cap event_files=256" in notes
    assert run["step"] == 1  # what was read is still reviewed: the newest event files' points

    table = measured([sys.executable, "-m", "hpc_agent.review", str(run_dir)], work)  # the table says it too
    assert table["rc"] == 0 and "Traceback" not in table["err"] and "over the read cap" in table["err"]


def test_read_cap_flags_are_checked_and_applied(work):
    run_dir = _one_run(work)
    poison.plant_event_files(run_dir, 40)
    poison.plant_deep_tb(run_dir, 2000)  # a chain thousands deep: a recursive walk raised RecursionError
    got = measured([sys.executable, "-m", "hpc_agent.review", str(run_dir), "--json", "--read-cap", "event_files=10"],
                   work)
    assert got["rc"] == 0 and "Traceback" not in got["err"], got["err"]
    (run,) = json.loads(got["out"])["runs"]
    assert any("over the read cap event_files=10: 40 event files" in n for n in run["notes"])
    assert any("over the read cap tb_depth=4" in n for n in run["notes"])
    bad = measured([sys.executable, "-m", "hpc_agent.review", str(run_dir), "--read-cap", "rank_logs=0"], work)
    assert bad["rc"] == 2 and "Traceback" not in bad["err"] and "rank_logs=0" in bad["err"]


def test_the_caps_pure_parts():
    from hpc_agent.core.read_caps import DEFAULT_CAPS, ReadCaps, cap_of, over_cap

    assert DEFAULT_CAPS.rank_logs == 8
    assert DEFAULT_CAPS.with_overrides(["rank_logs=32", "tb-depth=2"]) == ReadCaps(rank_logs=32, tb_depth=2)
    for bad in ("rank_logs", "nope=3", "rank_logs=x", "rank_logs=0", "rank_logs=-1"):
        with pytest.raises(ValueError):
            DEFAULT_CAPS.with_overrides([bad])
    with pytest.raises(ValueError):
        ReadCaps(event_files=True)
    assert cap_of(over_cap("tb_depth", 4, "x")) == "tb_depth" and cap_of("anything else") == ""


def test_the_newest_ranks_are_read_and_a_listing_is_cut(work):
    """find_logs picks the ranks whose logs are newest by mtime from a capped listing (one lstat per entry)."""
    from hpc_agent.core import rundir
    from hpc_agent.core.read_caps import ReadCaps

    run_dir = _one_run(work)
    logs = rundir.slurm_dir(run_dir)
    logs.mkdir()
    t = time.time() - 1000
    for rank in range(30):
        for suffix in ("out", "err"):
            path = logs / f"7_{rank}_log.{suffix}"
            path.write_text(f"rank {rank}\n")
            os.utime(path, (t + (rank * 7) % 30, t + (rank * 7) % 30))  # mtime order is not rank order
    choice = rundir.find_logs(run_dir, "7", caps=ReadCaps(rank_logs=3))
    newest = sorted(range(30), key=lambda r: (r * 7) % 30)[-3:]
    assert [p.name for p in choice.paths] == [f"7_{r}_log.{s}" for r in sorted(newest) for s in ("err", "out")]
    assert choice.notes and "30 ranks have logs" in choice.notes[0]
    cut = rundir.find_logs(run_dir, "7", caps=ReadCaps(listing=10))
    assert any("over the read cap listing=10" in n for n in cut.notes) and len(cut.paths) <= 10
    texts = list(rundir.tail_logs(choice.paths, 1 << 10, ReadCaps(run_bytes=3 << 10)))
    assert [type(t).__name__ for _, t in texts] == ["LogText"] * 3 + ["str"]
    assert "over the read cap run_bytes" in texts[-1][1]


def test_event_records_past_the_byte_cap_wait_for_the_next_read(work):
    """tb_bytes: one read stops taking new files once the run's event bytes are spent, and says so; the next read
    (the watcher's reader is incremental) goes on where it stopped, so nothing is lost, only spread over ticks."""
    from hpc_agent.core.read_caps import ReadCaps
    from hpc_agent.metrics.tb_reader import RunScalars

    run_dir = _one_run(work)
    poison.plant_event_files(run_dir, 6)
    size = len(poison.event_file_bytes())
    reader = RunScalars(run_dir / "tb", tags=("train/loss",), caps=ReadCaps(tb_bytes=2 * size))
    reads = []
    for _ in range(4):
        reader.update()
        reads.append((len(reader.raw("train/loss")), "tb_bytes" in reader.capped))
    assert reads[0][1] and 0 < reads[0][0] < 6  # cut, and said
    assert reads[-1] == (6, False)  # every file read in the end, the cap no longer met
    assert [n for n, _ in reads] == sorted(n for n, _ in reads)

"""The hang verdict (hpc_agent.diagnosis.hang.judge) as a table, and the stack grouping on real
faulthandler output captured from subprocesses."""
import math
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from hpc_agent.config.resilience import ResilienceConfig
from hpc_agent.core.heartbeat_format import Beat
from hpc_agent.diagnosis.hang import HangVerdict, group_stacks, judge, main_thread, parse_dumps

S = ResilienceConfig()  # defaults: floor 120 s, factor 5, warm-up 5 steps, start-up 600, save 600, eval 900
NOW = 1_750_000_000.0


def beat(rank=0, world=1, done=20, step_s=1.0, silent=2.0, at=NOW, phase="training", phase_age=None, start_step=0,
         started_age=3600.0, recent=None, job="100", attempt=0, step_at="auto") -> Beat:
    """A beat written at ``at`` (the writer's clock) by a rank ``done`` steps into this attempt, its last step
    ``silent`` s before ``at``."""
    return Beat(job_id=job, attempt=attempt, rank=rank, world=world, host=f"node{rank}", pid=1000 + rank,
                phase=phase, phase_since=at - (phase_age if phase_age is not None else started_age - 60),
                step=start_step + done, step_at=(at - silent if done else None) if step_at == "auto" else step_at,
                start_step=start_step, recent_step_s=tuple(recent if recent is not None else [step_s] * min(done, 20)),
                started_at=at - started_age, written_at=at, interval_s=5.0)


def ranks(n, **kw):
    return [beat(rank=r, world=n, **kw) for r in range(n)]


# name, beats, attempt_started_at, expected (kind, ranks) or None
ROWS = [
    # --- progressing, or legitimately slow: must not fire
    ("healthy", [beat()], None, None),
    ("slow but steady steps raise their own limit", [beat(step_s=200, silent=900)], None, None),
    ("long evaluation within its budget", [beat(phase="evaluating", phase_age=800, silent=805)], None, None),
    ("big checkpoint save within its budget", [beat(phase="saving", phase_age=550, silent=560)], None, None),
    ("slow first step (torch.compile) within the start-up budget",
     [beat(done=0, started_age=580, phase_age=500)], None, None),
    ("warm-up steps: start-up budget, not the floor", [beat(done=3, silent=300, started_age=400)], None, None),
    ("back to training after a long save restarts the step clock",
     [beat(phase_age=10, silent=700)], None, None),
    ("one slow rank that still steps",
     [beat(rank=r, world=4, silent=1) for r in range(3)] + [beat(rank=3, world=4, step_s=30, silent=40)], None, None),
    ("node clock an hour ahead", [beat(at=NOW + 3600)], None, None),
    ("node clock a minute behind", [beat(at=NOW - 60)], None, None),
    ("every rank done, long ago", [beat(phase="done", at=NOW - 10_000)], None, None),
    ("a stale beat of the previous attempt is ignored",
     [beat(rank=0, world=2, attempt=1, started_age=60), beat(rank=1, world=2, attempt=0, at=NOW - 5000)], None, None),
    ("a stale beat of an earlier job is ignored",
     [beat(rank=0, world=2, job="200", attempt=0, started_age=60),
      beat(rank=1, world=2, job="100", attempt=3, at=NOW - 5000, started_age=6000)], None, None),
    ("beats older than the attempt's start are the previous attempt's",
     [beat(at=NOW - 400, silent=300)], NOW - 30, None),
    ("no beat yet, within the start-up budget", [], NOW - 500, None),
    ("no beat and no attempt start known", [], None, None),
    # --- stuck
    ("stuck in a step past the floor", [beat(silent=130)], None, ("step", (0,))),
    ("slow steps, then stuck past 5 x their median", [beat(step_s=200, silent=1100)], None, ("step", (0,))),
    ("warm-up steps are left out of the median",
     [beat(done=8, recent=[100] * 5 + [1] * 3, silent=130)], None, ("step", (0,))),
    ("evaluation past its budget", [beat(phase="evaluating", phase_age=950, silent=955)], None, ("evaluating", (0,))),
    ("save past its budget", [beat(phase="saving", phase_age=700, silent=710)], None, ("saving", (0,))),
    ("start-up stall while loading", [beat(done=0, phase="loading", phase_age=650, started_age=700)], None,
     ("startup", (0,))),
    ("start-up stall in the first steps", [beat(done=2, silent=650, started_age=700)], None, ("startup", (0,))),
    ("no heartbeat since the attempt started", [], NOW - 700, ("startup", ())),
    ("one rank of four stuck", [beat(rank=r, world=4, silent=200 if r == 2 else 1) for r in range(4)], None,
     ("step", (2,))),
    ("all ranks stuck in a collective", ranks(4, silent=300), None, ("step", (0, 1, 2, 3))),
    ("node clock an hour ahead, stuck", [beat(at=NOW + 3600, silent=200)], None, ("step", (0,))),
    ("heartbeat lost: process frozen with the GIL held",
     [beat(rank=0, world=2), beat(rank=1, world=2, at=NOW - 300)], None, ("heartbeat_lost", (1,))),
    ("a lost heartbeat wins over ranks waiting on it",
     [beat(rank=0, world=2, silent=400), beat(rank=1, world=2, at=NOW - 300, silent=100)], None,
     ("heartbeat_lost", (1,))),
    # --- malformed values
    ("garbage items are ignored", ["x", None, {"rank": 0}, beat()], None, None),
    ("a step in the writer's future is no silence", [beat(silent=-50)], None, None),
    ("no durations after the warm-up: the floor", [beat(recent=[], silent=130)], None, ("step", (0,))),
    ("NaN durations are ignored", [beat(recent=[math.nan] * 20, silent=130)], None, ("step", (0,))),
]


@pytest.mark.parametrize("name,beats,attempt_started_at,expected", ROWS, ids=[r[0] for r in ROWS])
def test_judge(name, beats, attempt_started_at, expected):
    verdict = judge(beats, NOW, attempt_started_at, S)
    if expected is None:
        assert verdict is None, verdict
    else:
        assert verdict is not None, name
        assert (verdict.kind, verdict.ranks) == expected, verdict
        assert verdict.silent_s > verdict.limit_s > 0 and verdict.reason


def test_verdict_fields_name_the_step_and_the_limit():
    verdict = judge([beat(done=30, start_step=100, step_s=40, silent=260.5)], NOW, None, S)
    assert verdict == HangVerdict("step", 260.5, 200.0, 130, (0,), verdict.reason)
    assert "no step for 260 s after step 130" in verdict.reason and "limit 200 s" in verdict.reason
    assert judge([], NOW, NOW - 700, S).reason.startswith("no heartbeat since the attempt started 700 s ago")
    lost = judge([beat(at=NOW - 130)], NOW, None, S)
    assert (lost.kind, lost.limit_s) == ("heartbeat_lost", 120.0)  # max(4 x 5 s, floor)


def test_settings_are_read_by_name():
    class Tight:
        hang_factor, hang_floor_s, hang_warmup_steps = 2.0, 10.0, 0
        startup_budget_s, save_budget_s, eval_budget_s = 30.0, 30.0, 30.0

    assert judge([beat(silent=12)], NOW, None, Tight()).kind == "step"
    assert judge([beat(silent=12)], NOW, None, S) is None


# --- stacks: real faulthandler output ------------------------------------------------------------------
RANK_SCRIPT = textwrap.dedent("""
    import faulthandler, os, signal, sys, threading, time
    out = open(sys.argv[1], "a")
    out.write("# job 1 attempt 0 rank %s host h pid %d\\n" % (sys.argv[3], os.getpid()))
    out.flush()
    faulthandler.register(signal.SIGURG, file=out, all_threads=True, chain=False)
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()  # another thread in every dump

    def first_wait():
        print("first", flush=True)
        while not os.path.exists(sys.argv[4]):
            time.sleep(0.01)

    def all_reduce():
        print("second", flush=True)
        time.sleep(60)

    def load_batch():
        print("second", flush=True)
        time.sleep(60)

    first_wait()  # an older dump in the same file: the newest one counts
    (all_reduce if sys.argv[2] == "collective" else load_batch)()
""")


def _dump_when(proc, line, path, needle):
    """Wait for the rank to print ``line``, send it SIGURG (from outside, as the watcher does), and wait for
    ``needle`` in its stack file."""
    assert proc.stdout.readline().strip() == line
    time.sleep(0.05)  # into the sleep
    proc.send_signal(signal.SIGURG)
    deadline = time.monotonic() + 10
    while needle not in path.read_text() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert needle in path.read_text()


@pytest.fixture(scope="module")
def real_dumps(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stacks")
    script = folder / "rank.py"
    script.write_text(RANK_SCRIPT)
    where = ["collective", "collective", "collective", "data"]
    paths = [folder / f"rank-{r}.txt" for r in range(4)]
    procs = [subprocess.Popen([sys.executable, str(script), str(paths[r]), where[r], str(r), str(folder / f"go-{r}")],
                              stdout=subprocess.PIPE, text=True) for r in range(4)]
    try:
        for r, proc in enumerate(procs):
            _dump_when(proc, "first", paths[r], " in first_wait")
            (folder / f"go-{r}").touch()
            _dump_when(proc, "second", paths[r], " in all_reduce" if where[r] == "collective" else " in load_batch")
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    lines = RANK_SCRIPT.splitlines()
    line_of = {name: lines.index(f"def {name}():") + 3 for name in ("all_reduce", "load_batch")}
    return script, {r: paths[r].read_text() for r in range(4)}, line_of


def test_real_dumps_parse_into_two_dumps_of_several_threads(real_dumps):
    script, stacks, line_of = real_dumps
    dumps = parse_dumps(stacks[0])
    assert len(dumps) == 2 and all(len(d) >= 2 for d in dumps)
    main = main_thread(stacks[0])
    assert main[0] == f"{script}:{line_of['all_reduce']} in all_reduce" and main[-1].endswith(" in <module>")


def test_four_ranks_one_outlier(real_dumps):
    script, stacks, line_of = real_dumps
    groups = group_stacks(stacks)
    assert len(groups.groups) == 2
    assert groups.groups[groups.majority] == (0, 1, 2) and groups.outliers == (3,)
    assert groups.top_frame == f"{script}:{line_of['all_reduce']} in all_reduce"
    outlier = next(sig for sig in groups.groups if sig != groups.majority)
    assert outlier.startswith(f"{script}:{line_of['load_batch']} in load_batch")


def test_ties_have_no_outliers_and_unreadable_ranks_no_group(real_dumps):
    _, stacks, _ = real_dumps
    groups = group_stacks({0: stacks[0], 1: stacks[3], 2: "garbage\n", 3: ""})
    assert sorted(groups.groups.values()) == [(0,), (1,)] and groups.outliers == ()
    assert groups.groups[groups.majority] == (0,)  # the tie goes to the lowest rank
    assert group_stacks({}) == group_stacks({0: "# only a header\n"})
    assert group_stacks({}).top_frame == "" and group_stacks({}).groups == {}


def test_a_dump_cut_at_its_start_still_parses(real_dumps):
    _, stacks, _ = real_dumps
    cut = stacks[0][len(stacks[0]) // 3:]  # read_stacks keeps a tail: the oldest dump may be cut anywhere
    assert main_thread(cut) == main_thread(stacks[0])

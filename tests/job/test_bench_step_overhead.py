"""scripts/bench/step_overhead.py: the overhead it reads from a run's TensorBoard series."""
from __future__ import annotations

import pytest



def _bench():
    from scripts.bench import step_overhead

    return step_overhead


def test_overhead_is_the_wall_time_outside_the_steps_after_the_warm_up(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    from hpc_agent.core.rundir import tb_dir

    bench = _bench()
    writer = SummaryWriter(str(tb_dir(tmp_path)))
    wall = 1000.0
    for step in range(1, bench.WARMUP + 101):
        wall += 0.1 + (0.002 if step > bench.WARMUP else 5.0)  # 0.1 s inside each step, 2 ms between steps
        writer.add_scalar("perf/step_time_s", 0.1, step, walltime=wall)
    writer.close()
    got = bench.overhead(tmp_path, spawned_at=994.0)
    assert got["steps"] == 100
    assert got["start_to_first_step_s"] == pytest.approx(1005.1 - 0.1 - 994.0)  # spawn to the first step's start
    assert got["between_steps_ms"] == pytest.approx(2.0, abs=1e-3)
    assert got["overhead"] == pytest.approx(0.002 / 0.102, abs=1e-4)


def test_too_few_steps_is_an_error(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    from hpc_agent.core.rundir import tb_dir

    writer = SummaryWriter(str(tb_dir(tmp_path)))
    writer.add_scalar("perf/step_time_s", 0.1, 1)
    writer.close()
    with pytest.raises(RuntimeError, match="only 0 steps"):
        _bench().overhead(tmp_path, spawned_at=0.0)


def test_snapshot_cycle_is_the_step_time_after_each_snapshot_above_the_rest():
    from types import SimpleNamespace

    bench = _bench()
    # 0.1 s steps; the first step after each snapshot (of steps 50, 75, ...) takes 30 ms more, the next one 5 ms
    points = [SimpleNamespace(step=s, value=0.1 + {0: 0.03, 1: 0.005}.get((s - 1) % 25, 0.0)) for s in range(51, 801)]
    got = bench.snapshot_cycle(points, 25)
    assert got["after_snapshot_step_s"][:3] == [0.13, 0.105, 0.1]
    assert got["in_step_overhead"] == pytest.approx(0.035 / 25 / 0.1, abs=1e-5)

"""The in-job GPU health monitor (launch/gpu_monitor.py) with fake readings: schedule, values, verdicts."""
from __future__ import annotations

import pytest

from hpc_agent.diagnosis import gpu_health
from launch.gpu_monitor import NO_GPU_LEVEL, GpuHealthMonitor, scalars_of, simulated_reader


def reading(**kw):
    base = dict(index=0, name="fake", temperature_c=50.0, memory_used_mb=1.0, memory_total_mb=80.0, power_w=100.0,
                power_limit_w=700.0, utilization_pct=90.0, ecc_uncorrected_volatile=0, ecc_corrected_volatile=0,
                retired_pages_pending=False, retired_pages_count=0, remapped_rows_failure=False)
    base.update(kw)
    return gpu_health.GpuReading(**base)


@pytest.mark.parametrize("readings, error, level, reason", [
    ([reading()], None, 0, None),
    ([reading(temperature_c=85.0)], None, 1, "temperature 85 C"),
    ([reading(ecc_uncorrected_volatile=1)], None, 2, "uncorrectable ECC"),
    ([reading(), reading(index=1, xid_errors=(79,))], None, 2, "GPU 1: hardware Xid 79"),
    ([reading(remapped_rows_failure=True)], None, 2, "row remapping failed"),
    ([], "NVIDIA driver not found: libnvidia-ml.so.1", NO_GPU_LEVEL, "NVIDIA driver not found"),
])
def test_read_levels(readings, error, level, reason):
    mon = GpuHealthMonitor(10, local_rank=0, reader=lambda: (readings, error), host="n1")
    got, values, reasons = mon.read()
    assert got == level
    assert (reason is None and not reasons) or any(reason in r for r in reasons)
    assert bool(values) == bool(readings)


def test_only_local_rank_zero_reads():
    calls = []
    mon = GpuHealthMonitor(10, local_rank=1, reader=lambda: calls.append(1) or ([reading()], None))
    assert mon.read() == (0, {}, []) and not calls


@pytest.mark.parametrize("every, step, first, due", [
    (10, 0, True, True), (10, 5, False, False), (10, 20, False, True), (0, 0, True, False), (1, 7, False, True),
])
def test_schedule(every, step, first, due):
    assert GpuHealthMonitor(every, 0, reader=lambda: ([], None)).due(step, first) is due


def test_no_gpu_anywhere_turns_the_checks_off():
    mon = GpuHealthMonitor(10, 0, reader=lambda: ([], "no driver"), host="n1")
    line = mon.conclude(NO_GPU_LEVEL, ["no driver"])
    assert "no NVIDIA GPU" in line and not mon.due(20)


def test_critical_line_names_the_node():
    mon = GpuHealthMonitor(10, 0, reader=lambda: ([], None), host="node2")
    assert mon.conclude(2, ["GPU 0: 2 uncorrectable ECC error(s)"]).startswith("GPU health CRITICAL on node2: GPU 0")
    assert mon.conclude(0, []) is None


def test_scalars_and_simulated_reader():
    step = [3]
    read = simulated_reader(5, lambda: step[0])
    assert gpu_health.judge_all(*read()).level == gpu_health.OK
    step[0] = 5
    readings, _ = read()
    assert gpu_health.judge_all(readings).level == gpu_health.CRITICAL
    values = scalars_of(readings, 2)
    assert values["gpu_health/level"] == 2.0 and values["gpu_health/gpu0/ecc_uncorrected_volatile"] == 2.0
    assert values["gpu_health/gpu0/temperature_c"] == 55.0

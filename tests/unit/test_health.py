"""GPU health rules on fake readings, NVML field mapping through a fake module, and the no-driver path."""
from __future__ import annotations

import dataclasses
import types

import pytest

from hpc_agent.diagnosis import gpu_health
from hpc_agent.diagnosis.gpu_health import (CRITICAL, NO_GPU, OK, WARN, GpuReading, Verdict, format_report, judge,
                                            judge_all, read_gpus)

HEALTHY = GpuReading(index=0, name="NVIDIA H200", temperature_c=55.0, memory_used_mb=1000.0,
                     memory_total_mb=143771.0, power_w=120.0, power_limit_w=700.0, utilization_pct=0.0,
                     ecc_uncorrected_volatile=0, ecc_corrected_volatile=0, retired_pages_pending=False,
                     retired_pages_count=0, remapped_rows_failure=False)


def with_(**kw):
    return dataclasses.replace(HEALTHY, **kw)


CASES = [
    ("healthy", HEALTHY, {OK}),
    ("warm 85C", with_(temperature_c=85.0), {WARN}),
    ("hot 92C", with_(temperature_c=92.0), {CRITICAL}),
    ("ecc uncorrected", with_(ecc_uncorrected_volatile=2), {CRITICAL}),
    ("ecc corrected many", with_(ecc_corrected_volatile=5000), {WARN}),
    ("ecc corrected few", with_(ecc_corrected_volatile=3), {OK}),
    ("retired pages pending", with_(retired_pages_pending=True), {CRITICAL}),
    ("remap failure", with_(remapped_rows_failure=True), {CRITICAL}),
    ("xid 79", with_(xid_errors=(79,)), {CRITICAL}),
    ("xid 13 (application)", with_(xid_errors=(13,)), {OK, WARN}),
    ("hw slowdown", with_(throttle_reasons=("hw_slowdown",)), {WARN}),
    ("power brake", with_(throttle_reasons=("hw_power_brake_slowdown",)), {WARN}),
    ("idle clocks only", with_(throttle_reasons=("gpu_idle",)), {OK}),
    ("memory full while idle", with_(memory_used_mb=140000.0, utilization_pct=0.0), {WARN}),
    ("memory full while busy", with_(memory_used_mb=140000.0, utilization_pct=98.0), {OK}),
    ("unsupported metrics", with_(temperature_c=None, ecc_uncorrected_volatile=None, ecc_corrected_volatile=None,
                                  retired_pages_pending=None, retired_pages_count=None,
                                  remapped_rows_failure=None, utilization_pct=None), {OK}),
]


@pytest.mark.parametrize("reading,levels", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_judge_table(reading, levels):
    verdict = judge(reading)
    assert verdict.level in levels, verdict
    assert bool(verdict.reasons) == (verdict.level != OK)


def test_judge_all_worst_and_no_gpu():
    v = judge_all([HEALTHY, with_(index=1, xid_errors=(79,)), with_(index=2, temperature_c=85.0)], None)
    assert v.level == CRITICAL and any(r.startswith("GPU 1:") for r in v.reasons)
    assert judge_all([HEALTHY], None) == Verdict(OK, ())
    v = judge_all([], "NVIDIA driver not found: x")
    assert v.level == NO_GPU and v.reasons == ("NVIDIA driver not found: x",)


def test_exit_code_matches_diagnosis_table():
    from hpc_agent.core.exit_codes import EXIT_CODES, EXIT_GPU_HEALTH_CRITICAL
    assert EXIT_GPU_HEALTH_CRITICAL == 82  # launch/gpu_monitor.py exits with it; health names no copy of its own
    assert not hasattr(gpu_health, "EXIT_GPU_CRITICAL")
    assert EXIT_CODES[82].cause.value == "gpu_hw_error"


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):  # noqa: N801 - mirrors pynvml's name
    pass


def fake_nvml(count=2, init_error=None):
    """A module-like object with the pynvml functions read_gpus uses; GPU 1 supports fewer metrics."""
    calls = []

    def unsupported(*_):
        raise NVMLError_NotSupported("Not Supported")

    def init():
        calls.append("init")
        if init_error:
            raise init_error

    def per_gpu(values):
        return lambda h, *args: values[h] if not isinstance(values[h], Exception) else (_ for _ in ()).throw(values[h])

    m = types.SimpleNamespace(
        NVMLError=NVMLError, NVMLError_NotSupported=NVMLError_NotSupported,
        NVML_TEMPERATURE_GPU=0, NVML_MEMORY_ERROR_TYPE_CORRECTED=0, NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1,
        NVML_VOLATILE_ECC=0,
        NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS=0, NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR=1,
        nvmlInit=init, nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetCount=lambda: count,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=per_gpu([b"NVIDIA H200", "NVIDIA A100"]),
        nvmlDeviceGetTemperature=per_gpu([61, 91]),
        nvmlDeviceGetMemoryInfo=per_gpu([types.SimpleNamespace(used=2 * 2**30, total=141 * 2**30),
                                         types.SimpleNamespace(used=1 * 2**30, total=80 * 2**30)]),
        nvmlDeviceGetPowerUsage=per_gpu([250_000, 90_000]),
        nvmlDeviceGetEnforcedPowerLimit=per_gpu([700_000, 400_000]),
        nvmlDeviceGetUtilizationRates=per_gpu([types.SimpleNamespace(gpu=97, memory=40),
                                               types.SimpleNamespace(gpu=0, memory=0)]),
        nvmlDeviceGetTotalEccErrors=lambda h, kind, counter: [{0: 4, 1: 0}, {0: 0, 1: 3}][h][kind],
        nvmlDeviceGetRetiredPagesPendingStatus=per_gpu([0, NVMLError_NotSupported("Not Supported")]),
        nvmlDeviceGetRetiredPages=lambda h, cause: [[], [0x1000]][h] if h == 0 or cause == 1 else [],
        nvmlDeviceGetRemappedRows=per_gpu([(0, 0, False, False), NVMLError_NotSupported("Not Supported")]),
        nvmlDeviceGetCurrentClocksEventReasons=per_gpu([0x0, 0x40 | 0x1]),
        # the older name must not be needed when the new one exists
        nvmlDeviceGetCurrentClocksThrottleReasons=unsupported,
    )
    m.calls = calls
    return m


def test_read_gpus_maps_fields():
    nvml = fake_nvml()
    readings, error = read_gpus(nvml)
    assert error is None and nvml.calls == ["init", "shutdown"]
    a, b = readings
    assert (a.index, a.name, a.temperature_c) == (0, "NVIDIA H200", 61.0)
    assert a.memory_used_mb == pytest.approx(2048) and a.memory_total_mb == pytest.approx(141 * 1024)
    assert (a.power_w, a.power_limit_w, a.utilization_pct) == (250.0, 700.0, 97.0)
    assert (a.ecc_corrected_volatile, a.ecc_uncorrected_volatile) == (4, 0)
    assert (a.retired_pages_pending, a.retired_pages_count, a.remapped_rows_failure) == (False, 0, False)
    assert a.throttle_reasons == () and a.xid_errors == ()
    assert b.name == "NVIDIA A100" and b.ecc_uncorrected_volatile == 3
    assert b.retired_pages_pending is None and b.remapped_rows_failure is None  # NotSupported -> None
    assert b.retired_pages_count == 1
    assert b.throttle_reasons == ("gpu_idle", "hw_thermal_slowdown")
    assert judge(a).level == OK
    vb = judge(b)
    assert vb.level == CRITICAL and any("uncorrectable" in r for r in vb.reasons)
    report = format_report(readings, [judge(a), vb])
    assert "NVIDIA H200" in report and "CRITICAL" in report and "uncorrectable" in report


def test_read_gpus_old_pynvml_throttle_name():
    nvml = fake_nvml(count=1)
    del nvml.nvmlDeviceGetCurrentClocksEventReasons
    nvml.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: 0x8
    (a,), _ = read_gpus(nvml)
    assert a.throttle_reasons == ("hw_slowdown",) and judge(a).level == WARN


def test_read_gpus_lost_gpu_is_reported_not_raised():
    nvml = fake_nvml(count=1)

    def lost(i):
        raise NVMLError("GPU is lost")
    nvml.nvmlDeviceGetHandleByIndex = lost
    readings, error = read_gpus(nvml)
    assert "GPU is lost" in error and judge_all(readings, error).level == CRITICAL


def test_driver_absent_fake():
    readings, error = read_gpus(fake_nvml(init_error=NVMLError("Driver Not Loaded")))
    assert readings == [] and error == "NVIDIA driver not found: Driver Not Loaded"
    v = judge_all(readings, error)
    assert v.level == NO_GPU and v.reasons == (error,)
    assert "no GPU readings" in format_report(readings, [v])


def test_driver_absent_real_machine():
    """This test machine has no NVIDIA driver: the real pynvml path must answer NO_GPU, not raise."""
    try:
        import pynvml
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("an NVIDIA driver is present here")
    except ImportError:
        pass
    except Exception:  # noqa: BLE001 - the expected no-driver NVMLError
        pass
    readings, error = read_gpus()
    assert readings == [] and error.startswith("NVIDIA driver not found: ")
    assert judge_all(readings, error).level == NO_GPU


def test_health_module_does_not_import_pynvml_at_top():
    import sys
    import subprocess
    code = "import sys, hpc_agent.diagnosis.gpu_health; print('pynvml' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]
    assert gpu_health.HARDWARE_XIDS >= {48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120}

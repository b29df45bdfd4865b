"""GPU health check: read each GPU through NVML, judge it, report it.

``read_gpus()`` talks to NVML (``pynvml``, imported lazily so this module is safe on a login node) and
never raises: without an NVIDIA driver it returns ``([], "NVIDIA driver not found: <NVML error>")``.
A fake NVML module/object can be injected (``read_gpus(nvml=fake)``) for tests.

``judge()`` and ``judge_all()`` are pure. The rules, worst first:

CRITICAL (the GPU should not run a job; exit ``EXIT_GPU_CRITICAL`` = 82, which
``hpc_agent.core.exit_codes`` maps to ``gpu_hw_error``: exclude the node, tell the admins)
  - any uncorrectable (volatile) ECC error
  - a row-remapping failure
  - retired pages pending (a reset is needed before the retirement takes effect)
  - a hardware Xid: 48 (double-bit ECC), 61-64 (internal micro-controller / ECC page retirement or
    row remapping events), 74 (NVLink), 79 (fallen off the bus), 92 (high single-bit ECC rate),
    94/95 (contained / uncontained ECC error), 119/120 (GSP RPC timeout / GSP error)
  - temperature >= 90 C

WARN (usable, but worth a look)
  - temperature >= 83 C
  - clocks throttled by HW slowdown, HW/SW thermal slowdown or the power brake
  - corrected (volatile) ECC errors above ``Thresholds.ecc_corrected_warn``
  - memory used > 95 % while the GPU is idle (utilisation < 5 %): a stale process holds the memory

Everything else (including application Xids such as 13 or 31, which are usually a code bug) is OK.
A metric that NVML does not support on a GPU is ``None`` and never counts against it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, List, Optional, Sequence, Tuple

# Exit status of a job whose health check found a CRITICAL GPU (the exit-code table's entry -> gpu_hw_error).

OK, WARN, CRITICAL, NO_GPU = "OK", "WARN", "CRITICAL", "NO_GPU"
_RANK = {OK: 0, WARN: 1, CRITICAL: 2, NO_GPU: 3}

HARDWARE_XIDS = frozenset({48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120})
"""Xid codes that point at the hardware (or its firmware) rather than at the application."""

# NVML clocks-event (throttle) reason bits; the values are fixed by the NVML API.
THROTTLE_BITS = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)
WARN_THROTTLES = frozenset({"hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"})


@dataclass(frozen=True)
class GpuReading:
    """One GPU's state. ``None`` means NVML could not (or does not) report the metric."""

    index: int
    name: str
    temperature_c: Optional[float]
    memory_used_mb: Optional[float]
    memory_total_mb: Optional[float]
    power_w: Optional[float]
    power_limit_w: Optional[float]
    utilization_pct: Optional[float]
    ecc_uncorrected_volatile: Optional[int]
    ecc_corrected_volatile: Optional[int]
    retired_pages_pending: Optional[bool]
    retired_pages_count: Optional[int]
    remapped_rows_failure: Optional[bool]
    xid_errors: Tuple[int, ...] = ()
    throttle_reasons: Tuple[str, ...] = ()


@dataclass(frozen=True)
class Verdict:
    level: str
    """``OK``, ``WARN``, ``CRITICAL`` or ``NO_GPU``."""
    reasons: Tuple[str, ...] = ()


@dataclass(frozen=True)
class Thresholds:
    temp_critical_c: float = 90.0
    temp_warn_c: float = 83.0
    ecc_corrected_warn: int = 100
    memory_used_warn_frac: float = 0.95
    idle_util_pct: float = 5.0


def throttle_names(mask: int) -> Tuple[str, ...]:
    """The names of the set bits of an NVML clocks-event-reasons bitmask."""
    return tuple(name for bit, name in THROTTLE_BITS if int(mask) & bit)


def judge(reading: GpuReading, thresholds: Thresholds = Thresholds()) -> Verdict:
    """Apply the rules in the module docstring to one reading. Pure."""
    crit: List[str] = []
    warn: List[str] = []
    r, t = reading, thresholds
    if r.ecc_uncorrected_volatile:
        crit.append(f"{r.ecc_uncorrected_volatile} uncorrectable ECC error(s)")
    if r.remapped_rows_failure:
        crit.append("row remapping failed")
    if r.retired_pages_pending:
        crit.append("retired pages pending (GPU reset needed)")
    hw_xids = sorted(x for x in set(r.xid_errors) if x in HARDWARE_XIDS)
    if hw_xids:
        crit.append("hardware Xid " + ", ".join(map(str, hw_xids)))
    if r.temperature_c is not None:
        if r.temperature_c >= t.temp_critical_c:
            crit.append(f"temperature {r.temperature_c:g} C >= {t.temp_critical_c:g} C")
        elif r.temperature_c >= t.temp_warn_c:
            warn.append(f"temperature {r.temperature_c:g} C >= {t.temp_warn_c:g} C")
    bad_throttles = [name for name in r.throttle_reasons if name in WARN_THROTTLES]
    if bad_throttles:
        warn.append("clocks throttled: " + ", ".join(bad_throttles))
    if r.ecc_corrected_volatile is not None and r.ecc_corrected_volatile > t.ecc_corrected_warn:
        warn.append(f"{r.ecc_corrected_volatile} corrected ECC errors (> {t.ecc_corrected_warn})")
    if (r.memory_used_mb is not None and r.memory_total_mb and r.utilization_pct is not None
            and r.memory_used_mb / r.memory_total_mb > t.memory_used_warn_frac
            and r.utilization_pct < t.idle_util_pct):
        warn.append(f"memory {r.memory_used_mb / r.memory_total_mb:.0%} used while idle "
                    f"({r.utilization_pct:g}% utilisation): another process holds it?")
    if crit:
        return Verdict(CRITICAL, tuple(crit + warn))
    if warn:
        return Verdict(WARN, tuple(warn))
    return Verdict(OK, ())


def judge_all(readings: Sequence[GpuReading], error: Optional[str] = None,
              thresholds: Thresholds = Thresholds()) -> Verdict:
    """NO_GPU (with ``error``) when there is no reading; otherwise the worst level, reasons prefixed by GPU."""
    if not readings:
        return Verdict(NO_GPU, (error or "no GPU found",))
    verdicts = [(r, judge(r, thresholds)) for r in readings]
    level = max((v.level for _, v in verdicts), key=_RANK.__getitem__)
    reasons = tuple(f"GPU {r.index}: {why}" for r, v in verdicts for why in v.reasons)
    if error:  # some GPU could not be read at all: never call that OK
        reasons += (error,)
        level = max(level, WARN, key=_RANK.__getitem__)
    return Verdict(level, reasons)


def format_report(readings: Sequence[GpuReading], verdicts: Iterable[Verdict]) -> str:
    """A short table, one line per GPU, plus the reasons under each."""
    def num(v: Any, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    lines = [f"{'GPU':>3}  {'name':<24} {'level':<8} {'temp':>5} {'mem used/total MB':>19} {'power W':>11} {'util':>5}"]
    for r, v in zip(readings, verdicts):
        mem = f"{num(r.memory_used_mb, '.0f')}/{num(r.memory_total_mb, '.0f')}"
        power = f"{num(r.power_w, '.0f')}/{num(r.power_limit_w, '.0f')}"
        lines.append(f"{r.index:>3}  {r.name[:24]:<24} {v.level:<8} {num(r.temperature_c, '.0f'):>5} {mem:>19} "
                     f"{power:>11} {num(r.utilization_pct, '.0f'):>5}")
        lines.extend(f"       - {why}" for why in v.reasons)
    if not readings:
        lines.append("  (no GPU readings)")
        lines.extend(f"       - {why}" for v in verdicts for why in v.reasons)
    return "\n".join(lines)


def _import_nvml() -> Any:
    import pynvml  # lazy: login nodes may not have it, and it is only needed here
    return pynvml


def _metric(nvml: Any, fn_name: str, *args: Any) -> Any:
    """``nvml.fn_name(*args)``, or None when the function is absent or the metric is unsupported/unavailable."""
    fn = getattr(nvml, fn_name, None)
    if fn is None:
        return None
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - NotSupported, NoPermission, Unknown...: a missing metric, not a failure
        return None


def _const(nvml: Any, name: str, default: int) -> Any:
    return getattr(nvml, name, default)


def _read_one(nvml: Any, index: int) -> GpuReading:
    h = nvml.nvmlDeviceGetHandleByIndex(index)
    name = _metric(nvml, "nvmlDeviceGetName", h) or "unknown"
    if isinstance(name, bytes):
        name = name.decode(errors="replace")
    temp = _metric(nvml, "nvmlDeviceGetTemperature", h, _const(nvml, "NVML_TEMPERATURE_GPU", 0))
    mem = _metric(nvml, "nvmlDeviceGetMemoryInfo", h)
    used_mb = mem.used / 2**20 if mem is not None else None
    total_mb = mem.total / 2**20 if mem is not None else None
    power = _metric(nvml, "nvmlDeviceGetPowerUsage", h)  # milliwatts
    limit = _metric(nvml, "nvmlDeviceGetEnforcedPowerLimit", h)
    if limit is None:
        limit = _metric(nvml, "nvmlDeviceGetPowerManagementLimit", h)
    util = _metric(nvml, "nvmlDeviceGetUtilizationRates", h)
    volatile = _const(nvml, "NVML_VOLATILE_ECC", 0)
    ecc_unc = _metric(nvml, "nvmlDeviceGetTotalEccErrors", h,
                      _const(nvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1), volatile)
    ecc_cor = _metric(nvml, "nvmlDeviceGetTotalEccErrors", h,
                      _const(nvml, "NVML_MEMORY_ERROR_TYPE_CORRECTED", 0), volatile)
    pending = _metric(nvml, "nvmlDeviceGetRetiredPagesPendingStatus", h)
    retired_count: Optional[int] = None
    for cause_name, default in (("NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS", 0),
                                ("NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", 1)):
        pages = _metric(nvml, "nvmlDeviceGetRetiredPages", h, _const(nvml, cause_name, default))
        if pages is not None:
            retired_count = (retired_count or 0) + len(pages)
    remap = _metric(nvml, "nvmlDeviceGetRemappedRows", h)  # (corrected, uncorrected, pending, failure)
    remap_failure = bool(remap[3]) if remap is not None and len(remap) >= 4 else None
    mask = _metric(nvml, "nvmlDeviceGetCurrentClocksEventReasons", h)
    if mask is None:
        mask = _metric(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", h)
    return GpuReading(
        index=index, name=str(name), temperature_c=None if temp is None else float(temp),
        memory_used_mb=used_mb, memory_total_mb=total_mb,
        power_w=None if power is None else power / 1000.0, power_limit_w=None if limit is None else limit / 1000.0,
        utilization_pct=None if util is None else float(util.gpu),
        ecc_uncorrected_volatile=None if ecc_unc is None else int(ecc_unc),
        ecc_corrected_volatile=None if ecc_cor is None else int(ecc_cor),
        retired_pages_pending=None if pending is None else bool(pending),
        retired_pages_count=retired_count, remapped_rows_failure=remap_failure,
        throttle_reasons=throttle_names(mask) if mask is not None else (),
    )


def read_gpus(nvml: Any = None) -> Tuple[List[GpuReading], Optional[str]]:
    """``(readings, error)`` for every GPU NVML sees. Never raises.

    Xid errors are not available from a one-shot NVML query (they arrive as events); callers that scan the
    kernel log can add them with ``dataclasses.replace(reading, xid_errors=...)`` before judging.
    """
    if nvml is None:
        try:
            nvml = _import_nvml()
        except Exception as exc:  # noqa: BLE001
            return [], f"NVIDIA driver not found: pynvml is not importable ({exc})"
    try:
        nvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound / DriverNotLoaded / ...
        return [], f"NVIDIA driver not found: {exc}"
    readings: List[GpuReading] = []
    error: Optional[str] = None
    try:
        count = nvml.nvmlDeviceGetCount()
        for i in range(count):
            try:
                readings.append(_read_one(nvml, i))
            except Exception as exc:  # noqa: BLE001 - e.g. GPU lost: the handle cannot be had
                error = f"GPU {i}: NVML error: {exc}"
                readings.append(GpuReading(i, "unreadable", None, None, None, None, None, None, None, None, None,
                                           None, None, xid_errors=(79,) if "lost" in str(exc).lower() else ()))
    except Exception as exc:  # noqa: BLE001
        error = f"NVML error: {exc}"
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
    return readings, error

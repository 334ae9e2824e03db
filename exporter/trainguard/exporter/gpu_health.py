"""GPU health as NVML reports it, per physical GPU.

Why the clocks are held down, the PCIe link against what it could be, utilisation, power,
temperature, ECC errors and row remapping.

Why: a run that slows down or stalls is most often slowed by its GPU (a hardware slowdown, a
link trained at Gen2, memory going bad) and nothing else says so. These series let the alert
rules page for the GPU states that hurt a run and name the cause on the run's own page.

Read by the GPU collector for every device it enumerates with ``nvmlDeviceGetHandleByIndex``:
physical GPUs only, never MIG instances, so a GPU's counters are published once however it is
partitioned. A read the GPU does not support (``NOT_SUPPORTED``: ECC on a GeForce, remapped rows
before Ampere, utilisation of a MIG-enabled GPU) or the driver does not have
(``FUNCTION_NOT_FOUND``) gives no series, which is not a failure: it is not asked again for
:data:`RECHECK_UNSUPPORTED_S`. Any other error is reported on the scrape (the collector's success
goes to 0) and that reading alone is left out. What cannot change while NVML runs (the link's
maximum, the slowdown temperature) is read once per NVML start.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import pynvml

from trainguard.exporter.collector import MetricSpec
from trainguard.exporter.scrape import Scrape

#: seconds before a read that was not supported is tried again (a GPU whose MIG mode was
#: switched off supports utilisation again)
RECHECK_UNSUPPORTED_S = 600.0

#: nvmlClocksEventReason* bits (nvml.h; the older nvmlClocksThrottleReason* have the same
#: values) and the ``reason`` label each is published as. Literals, not pynvml's constants:
#: older nvidia-ml-py releases (the dependency allows 12.535) lack some of the names.
REASONS: tuple[tuple[int, str], ...] = (
    (0x1, "gpu_idle"),  # GpuIdle
    (0x2, "applications_clocks_setting"),  # ApplicationsClocksSetting
    (0x4, "sw_power_cap"),  # SwPowerCap
    (0x8, "hw_slowdown"),  # HwSlowdown
    (0x10, "sync_boost"),  # SyncBoost
    (0x20, "sw_thermal_slowdown"),  # SwThermalSlowdown
    (0x40, "hw_thermal_slowdown"),  # HwThermalSlowdown
    (0x80, "hw_power_brake_slowdown"),  # HwPowerBrakeSlowdown
    (0x100, "display_clock_setting"),  # DisplayClockSetting
    (0x200, "board_limit"),  # nvmlClocksThrottleReasonBoardLimit
    (0x400, "reliability"),  # nvmlClocksThrottleReasonReliability
)
_KNOWN_BITS = sum(bit for bit, _ in REASONS)

_GPU = ("gpu", "uuid")
CLOCK_EVENT_REASON = MetricSpec(
    "trainguard_gpu_clock_event_reason",
    "gauge",
    ("gpu", "uuid", "reason"),
    "Always 1, one series per reason NVML gives now for holding the GPU's clocks below their "
    "maximum: gpu_idle, sw_power_cap, hw_slowdown, hw_thermal_slowdown, hw_power_brake_slowdown, "
    "sw_thermal_slowdown, sync_boost, applications_clocks_setting, display_clock_setting, "
    "board_limit, reliability, or bit_0x... for a bit this exporter does not know.",
)
CLOCK_EVENT_REASONS = MetricSpec(
    "trainguard_gpu_clock_event_reasons",
    "gauge",
    _GPU,
    "The clock event reasons as NVML's bit mask (0: clocks not held down); absent when unknown.",
)
PCIE_GENERATION = MetricSpec(
    "trainguard_gpu_pcie_link_generation", "gauge", _GPU, "PCIe generation the link runs at now."
)
PCIE_GENERATION_MAX = MetricSpec(
    "trainguard_gpu_pcie_link_generation_max",
    "gauge",
    _GPU,
    "Highest PCIe generation the GPU and the system it sits in allow together.",
)
PCIE_GENERATION_GPU_MAX = MetricSpec(
    "trainguard_gpu_pcie_link_generation_gpu_max",
    "gauge",
    _GPU,
    "Highest PCIe generation the GPU itself supports (above the max: the slot or riser holds it "
    "back).",
)
PCIE_WIDTH = MetricSpec(
    "trainguard_gpu_pcie_link_width", "gauge", _GPU, "PCIe lanes the link runs with now."
)
PCIE_WIDTH_MAX = MetricSpec(
    "trainguard_gpu_pcie_link_width_max",
    "gauge",
    _GPU,
    "Most PCIe lanes the GPU and the system allow together.",
)
UTILIZATION = MetricSpec(
    "trainguard_gpu_utilization_ratio",
    "gauge",
    _GPU,
    "Fraction of the last sample period (1/6 s to 1 s) in which a kernel ran on the GPU (0 to 1).",
)
POWER = MetricSpec("trainguard_gpu_power_usage_watts", "gauge", _GPU, "Power the board draws now.")
POWER_LIMIT = MetricSpec(
    "trainguard_gpu_power_limit_watts",
    "gauge",
    _GPU,
    "Power limit the driver enforces now (the lowest of the limits set).",
)
TEMPERATURE = MetricSpec(
    "trainguard_gpu_temperature_celsius", "gauge", _GPU, "GPU core temperature."
)
TEMPERATURE_SLOWDOWN = MetricSpec(
    "trainguard_gpu_temperature_slowdown_celsius",
    "gauge",
    _GPU,
    "Temperature at which the GPU slows itself down (its own threshold).",
)
ECC_CORRECTED = MetricSpec(
    "trainguard_gpu_ecc_corrected_errors_total",
    "counter",
    _GPU,
    "Memory errors ECC corrected since the driver loaded (volatile count).",
)
ECC_UNCORRECTED = MetricSpec(
    "trainguard_gpu_ecc_uncorrected_errors_total",
    "counter",
    _GPU,
    "Memory errors ECC could not correct since the driver loaded (volatile count).",
)
REMAPPED_ROWS = MetricSpec(
    "trainguard_gpu_remapped_rows_total",
    "counter",
    ("gpu", "uuid", "cause"),
    "Memory rows the GPU has remapped over its life, by the errors that caused it "
    "(cause: correctable, uncorrectable).",
)
ROW_REMAP_PENDING = MetricSpec(
    "trainguard_gpu_row_remap_pending",
    "gauge",
    _GPU,
    "1 if a row remap waits for a GPU reset to take effect, else 0.",
)
ROW_REMAP_FAILED = MetricSpec(
    "trainguard_gpu_row_remap_failed",
    "gauge",
    _GPU,
    "1 if a row remap has failed (no spare row was left): the GPU needs service, else 0.",
)

METRICS: tuple[MetricSpec, ...] = (
    CLOCK_EVENT_REASON,
    CLOCK_EVENT_REASONS,
    PCIE_GENERATION,
    PCIE_GENERATION_MAX,
    PCIE_GENERATION_GPU_MAX,
    PCIE_WIDTH,
    PCIE_WIDTH_MAX,
    UTILIZATION,
    POWER,
    POWER_LIMIT,
    TEMPERATURE,
    TEMPERATURE_SLOWDOWN,
    ECC_CORRECTED,
    ECC_UNCORRECTED,
    REMAPPED_ROWS,
    ROW_REMAP_PENDING,
    ROW_REMAP_FAILED,
)

_UNSUPPORTED = (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound)


class HealthDevice(Protocol):
    """What the GPU collector knows of a device: its index label, UUID and NVML handle."""

    @property
    def index(self) -> str: ...
    @property
    def uuid(self) -> str: ...
    @property
    def handle(self) -> Any: ...


def reason_labels(mask: int) -> list[str]:
    """The ``reason`` label of each bit set in ``mask``, known ones first in nvml.h order."""
    names = [name for bit, name in REASONS if mask & bit]
    unknown = mask & ~_KNOWN_BITS
    names += [f"bit_{1 << i:#x}" for i in range(unknown.bit_length()) if unknown >> i & 1]
    return names


class GpuHealth:
    """Reads the health of one device per :meth:`collect` call into the collector's families.

    Remembers what a device does not support (asked again after
    :data:`RECHECK_UNSUPPORTED_S`), the values that cannot change while NVML runs, and whether
    the driver has the new clock event reasons call or only the older throttle reasons one.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._unsupported: dict[tuple[str, str], float] = {}  # (uuid, read) -> when seen
        self._static: dict[tuple[str, str], float] = {}  # (uuid, read) -> value
        self._handles: dict[str, Any] = {}  # uuid -> handle the static values were read with
        self._reasons_call = "nvmlDeviceGetCurrentClocksEventReasons"

    def collect(self, dev: HealthDevice, families: dict[str, Any], scrape: Scrape) -> None:
        """Add ``dev``'s health series to ``families`` (keyed by metric name).

        A failed read is reported with ``scrape.error`` and leaves out that reading alone.
        """
        if self._handles.get(dev.uuid) is not dev.handle:  # NVML started afresh
            self._handles[dev.uuid] = dev.handle
            for cache in (self._static, self._unsupported):
                for key in [k for k in cache if k[0] == dev.uuid]:
                    del cache[key]
        labels = [dev.index, dev.uuid]
        reader = _Reader(self, dev, scrape)
        mask = reader.read("clock event reasons", self._clock_reasons)
        if mask is not None:
            families[CLOCK_EVENT_REASONS.name].add_metric(labels, mask)
            family = families[CLOCK_EVENT_REASON.name]
            for name in reason_labels(int(mask)):
                family.add_metric([*labels, name], 1)
        read = reader.read
        for spec, what, fn, static, scale in _READS:
            value = read(what, fn, static=static)
            if value is not None:
                families[spec.name].add_metric(labels, value / scale)
        rows = reader.read_tuple("remapped rows", pynvml.nvmlDeviceGetRemappedRows)
        if rows is not None:
            corrected, uncorrected, pending, failed = rows
            family = families[REMAPPED_ROWS.name]
            family.add_metric([*labels, "correctable"], corrected)
            family.add_metric([*labels, "uncorrectable"], uncorrected)
            families[ROW_REMAP_PENDING.name].add_metric(labels, 1 if pending else 0)
            families[ROW_REMAP_FAILED.name].add_metric(labels, 1 if failed else 0)

    def _clock_reasons(self, handle: Any) -> int:
        """The new call, or the older one on a driver (or pynvml) without it (before R535)."""
        if self._reasons_call == "nvmlDeviceGetCurrentClocksEventReasons":
            try:
                return int(_function(self._reasons_call)(handle))
            except pynvml.NVMLError_FunctionNotFound:
                self._reasons_call = "nvmlDeviceGetCurrentClocksThrottleReasons"
        return int(_function(self._reasons_call)(handle))


def _function(name: str) -> Callable[..., Any]:
    """Pynvml's wrapper ``name``, or one that raises FUNCTION_NOT_FOUND where it has none.

    That is what a driver without the call answers; here the installed nvidia-ml-py is too old
    to have the wrapper.
    """
    fn = getattr(pynvml, name, None)
    if fn is not None:
        return fn

    def missing(*_: Any) -> Any:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    return missing


def _call(name: str) -> Callable[[Any], float]:
    fn = _function("nvmlDeviceGet" + name)
    return lambda handle: float(fn(handle))


def _ecc(kind: int) -> Callable[[Any], float]:
    return lambda handle: float(
        pynvml.nvmlDeviceGetTotalEccErrors(handle, kind, pynvml.NVML_VOLATILE_ECC)
    )


#: The readings of one number, in the order they are made: (series, what an error names, read,
#: read once per NVML start, divisor to the series' unit). Built once, not at every scrape.
_READS: tuple[tuple[MetricSpec, str, Callable[[Any], float], bool, float], ...] = (
    (PCIE_GENERATION, "PCIe link generation", _call("CurrPcieLinkGeneration"), False, 1.0),
    (PCIE_WIDTH, "PCIe link width", _call("CurrPcieLinkWidth"), False, 1.0),
    (PCIE_GENERATION_MAX, "PCIe max link generation", _call("MaxPcieLinkGeneration"), True, 1.0),
    (
        PCIE_GENERATION_GPU_MAX,
        "GPU max PCIe generation",
        _call("GpuMaxPcieLinkGeneration"),
        True,
        1.0,
    ),
    (PCIE_WIDTH_MAX, "PCIe max link width", _call("MaxPcieLinkWidth"), True, 1.0),
    (
        UTILIZATION,
        "utilisation",
        lambda h: float(pynvml.nvmlDeviceGetUtilizationRates(h).gpu),
        False,
        100.0,
    ),
    (POWER, "power usage", _call("PowerUsage"), False, 1000.0),
    (POWER_LIMIT, "enforced power limit", _call("EnforcedPowerLimit"), False, 1000.0),
    (
        TEMPERATURE,
        "temperature",
        lambda h: float(pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)),
        False,
        1.0,
    ),
    (
        TEMPERATURE_SLOWDOWN,
        "slowdown temperature",
        lambda h: float(
            pynvml.nvmlDeviceGetTemperatureThreshold(h, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
        ),
        True,
        1.0,
    ),
    (
        ECC_CORRECTED,
        "corrected ECC errors",
        _ecc(pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
        False,
        1.0,
    ),
    (
        ECC_UNCORRECTED,
        "uncorrected ECC errors",
        _ecc(pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
        False,
        1.0,
    ),
)


class _Reader:
    """One device's reads in one scrape.

    Skips what is known unsupported, stops after the GPU is lost (one error, not one per read).
    """

    def __init__(self, health: GpuHealth, dev: HealthDevice, scrape: Scrape) -> None:
        self._health = health
        self._dev = dev
        self._scrape = scrape
        self._lost = False

    def read(self, what: str, fn: Callable[[Any], float], *, static: bool = False) -> float | None:
        result = self._attempt(what, fn, static)
        return None if result is None else float(result)

    def read_tuple(self, what: str, fn: Callable[[Any], tuple[int, ...]]) -> tuple[int, ...] | None:
        return self._attempt(what, fn, False)

    def _attempt(self, what: str, fn: Callable[[Any], Any], static: bool) -> Any:
        health, uuid = self._health, self._dev.uuid
        key = (uuid, what)
        if self._lost:
            return None
        if static and key in health._static:
            return health._static[key]
        seen = health._unsupported.get(key)
        if seen is not None and health._clock() - seen < RECHECK_UNSUPPORTED_S:
            return None
        try:
            value = fn(self._dev.handle)
        except _UNSUPPORTED:
            health._unsupported[key] = health._clock()
            return None
        except pynvml.NVMLError as exc:
            self._lost = isinstance(exc, pynvml.NVMLError_GpuIsLost)
            self._scrape.error(f"GPU {self._dev.index} ({uuid}): {what}: {exc}")
            return None
        health._unsupported.pop(key, None)
        if static:
            health._static[key] = value
        return value

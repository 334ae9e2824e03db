"""The GPU collector's series (memory, processes, Xid errors, health) and the clock reasons' bits.

The one place a GPU metric is defined, in docs/metrics.md's order: docs/metrics.md is checked
against these, and the collector and the health reads (``health/``) name them without either
having to import the other.
"""

from __future__ import annotations

from trainguard.exporter.scrape.collector import MetricSpec

NVML_AVAILABLE = MetricSpec(
    "trainguard_gpu_nvml_available",
    "gauge",
    (),
    "1 if NVML started, 0 if no NVIDIA driver is installed (no NVML library: no GPU series, "
    "and not a failure); absent while an installed driver fails.",
)
GPU_INFO = MetricSpec(
    "trainguard_gpu_info",
    "gauge",
    ("gpu", "uuid", "name", "driver_version"),
    "Always 1 for each GPU NVML reports; labels identify it.",
)
MEMORY_TOTAL = MetricSpec(
    "trainguard_gpu_memory_total_bytes",
    "gauge",
    ("gpu", "uuid"),
    "Total device memory as reported by the driver.",
)
MEMORY_USED = MetricSpec(
    "trainguard_gpu_memory_used_bytes",
    "gauge",
    ("gpu", "uuid"),
    "Device memory in use as reported by the driver (includes the driver's own reservation).",
)
PROCESS_MEMORY = MetricSpec(
    "trainguard_gpu_process_memory_used_bytes",
    "gauge",
    ("gpu", "uuid", "pid", "run"),
    "Device memory the driver attributes to a process; run is empty when the pid belongs to "
    "no known run.",
)
PROCESSES = MetricSpec(
    "trainguard_gpu_processes",
    "gauge",
    ("gpu", "uuid"),
    "Processes NVML lists on the GPU (compute and graphics, each once), whether or not their "
    "memory is known; 0 under WSL, which lists none.",
)
PROCESSES_UNKNOWN = MetricSpec(
    "trainguard_gpu_processes_memory_unknown",
    "gauge",
    ("gpu", "uuid"),
    "Processes on the GPU whose memory the driver reports as not available (WDDM/WSL).",
)
UNATTRIBUTED = MetricSpec(
    "trainguard_gpu_memory_unattributed_bytes",
    "gauge",
    ("gpu", "uuid"),
    "Device memory used minus what live processes account for (a zombie's or a gone "
    "process's memory is not accounted for); absent when any process's memory is unknown.",
)
UNINTERRUPTIBLE = MetricSpec(
    "trainguard_gpu_memory_uninterruptible_bytes",
    "gauge",
    ("gpu", "uuid"),
    "Device memory the driver attributes to listed processes in uninterruptible sleep (D "
    "state: they cannot be killed while in it, often a process stuck in the driver on its "
    "way out); absent when any process's memory is unknown.",
)
XID_ERRORS = MetricSpec(
    "trainguard_gpu_xid_errors_total",
    "counter",
    ("gpu", "uuid", "xid"),
    "Critical Xid errors the driver reported for the GPU since the exporter started, per Xid code.",
)
XID_SUPPORTED = MetricSpec(
    "trainguard_gpu_xid_events_supported",
    "gauge",
    ("gpu", "uuid"),
    "1 if the exporter receives the GPU's critical Xid events, 0 if the driver offers none "
    "(then Xid errors are unknown, not zero).",
)
RUN_MEMORY = MetricSpec(
    "trainguard_run_gpu_memory_used_bytes",
    "gauge",
    ("run", "rank", "gpu"),
    "Driver-view device memory summed over the run's live processes on this GPU.",
)
#: the collector's own series; the health series (:data:`HEALTH`) come rendered from
#: ``health/``, after these
OWN = (
    NVML_AVAILABLE,
    GPU_INFO,
    MEMORY_TOTAL,
    MEMORY_USED,
    PROCESS_MEMORY,
    PROCESSES,
    PROCESSES_UNKNOWN,
    UNATTRIBUTED,
    UNINTERRUPTIBLE,
    RUN_MEMORY,
    XID_ERRORS,
    XID_SUPPORTED,
)

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

RETIRED_PAGES = MetricSpec(
    "trainguard_gpu_retired_pages_total",
    "counter",
    ("gpu", "uuid", "cause"),
    "Memory pages the GPU has retired over its life, by the errors that caused it (cause: "
    "multiple_single_bit_ecc, double_bit_ecc); GPUs before Ampere, which retire pages instead "
    "of remapping rows.",
)
RETIRED_PAGES_PENDING = MetricSpec(
    "trainguard_gpu_retired_pages_pending",
    "gauge",
    _GPU,
    "1 if a page retirement waits for a GPU reset (or reboot) to take effect, else 0; GPUs "
    "before Ampere.",
)
NVLINK_ERRORS = MetricSpec(
    "trainguard_gpu_nvlink_errors_total",
    "counter",
    ("gpu", "uuid", "link", "error"),
    "Errors NVML counted on an active NVLink link of the GPU, per link and kind (error: "
    "replay, recovery, crc_flit, crc_data, ecc_data; a kind the GPU does not count is absent).",
)

HEALTH: tuple[MetricSpec, ...] = (
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
    RETIRED_PAGES,
    RETIRED_PAGES_PENDING,
    NVLINK_ERRORS,
)


def reason_labels(mask: int) -> list[str]:
    """The ``reason`` label of each bit set in ``mask``, known ones first in nvml.h order."""
    names = [name for bit, name in REASONS if mask & bit]
    unknown = mask & ~_KNOWN_BITS
    names += [f"bit_{1 << i:#x}" for i in range(unknown.bit_length()) if unknown >> i & 1]
    return names


METRICS = (*OWN, *HEALTH)

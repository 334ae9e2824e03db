"""NVML's health functions, looked up once in the library pynvml loaded, and the enums they take.

Why: the health reads call NVML's C functions through ctypes with out-parameters made once per
GPU (``gpu_health_device.py``) instead of through pynvml's wrappers, which make new ctypes
objects, look the function up under a lock and raise per call. A driver without a function
answers ``FUNCTION_NOT_FOUND`` from a stand-in, as pynvml says for a missing symbol.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pynvml

#: NVML_NVLINK_MAX_LINKS of nvml.h 12.8 (18 before); links are asked up to the first the GPU
#: does not have
MAX_NVLINKS = 36
#: nvmlNvLinkErrorCounter_t values and the ``error`` label of each
NVLINK_COUNTERS = (
    (0, "replay"),
    (1, "recovery"),
    (2, "crc_flit"),
    (3, "crc_data"),
    (4, "ecc_data"),
)
#: nvmlPageRetirementCause_t values and the ``cause`` label of each
RETIREMENT_CAUSES = ((0, "multiple_single_bit_ecc"), (1, "double_bit_ecc"))


def _missing(*_: Any) -> int:
    """What a driver without the function answers."""
    return pynvml.NVML_ERROR_FUNCTION_NOT_FOUND


def function(symbol: str) -> Callable[..., int]:
    """NVML's C function ``symbol`` (through pynvml's loaded library), or :func:`_missing`."""
    try:
        fn: Callable[..., int] = pynvml._nvmlGetFunctionPointer(symbol)
    except pynvml.NVMLError:
        return _missing
    return fn


class Functions:
    """NVML's health functions, looked up once; and which clock reasons call the driver has."""

    def __init__(self) -> None:
        f = function
        self.reasons = f("nvmlDeviceGetCurrentClocksEventReasons")
        self.throttle_reasons = f("nvmlDeviceGetCurrentClocksThrottleReasons")
        self.new_reasons = True
        self.pcie_gen = f("nvmlDeviceGetCurrPcieLinkGeneration")
        self.pcie_width = f("nvmlDeviceGetCurrPcieLinkWidth")
        self.pcie_max_gen = f("nvmlDeviceGetMaxPcieLinkGeneration")
        self.pcie_gpu_max_gen = f("nvmlDeviceGetGpuMaxPcieLinkGeneration")
        self.pcie_max_width = f("nvmlDeviceGetMaxPcieLinkWidth")
        self.utilization = f("nvmlDeviceGetUtilizationRates")
        self.power = f("nvmlDeviceGetPowerUsage")
        self.power_limit = f("nvmlDeviceGetEnforcedPowerLimit")
        self.temperature = f("nvmlDeviceGetTemperature")
        self.threshold = f("nvmlDeviceGetTemperatureThreshold")
        self.ecc = f("nvmlDeviceGetTotalEccErrors")
        self.remapped = f("nvmlDeviceGetRemappedRows")
        self.retired = f("nvmlDeviceGetRetiredPages")
        self.retired_pending = f("nvmlDeviceGetRetiredPagesPendingStatus")
        self.nvlink_state = f("nvmlDeviceGetNvLinkState")
        self.nvlink_errors = f("nvmlDeviceGetNvLinkErrorCounter")
        self.field_values = f("nvmlDeviceGetFieldValues")

"""The slow health reads of one GPU in one NVML call: ``nvmlDeviceGetFieldValues``.

Why: ECC counts, remapped rows and retired pages took three to five calls a GPU (one per
function, two for the retired pages' causes); NVML answers all of them, each with its own
status, in one call, as DCGM reads them. Only what NVML has a field id for with the same
meaning as the single call is read this way (nvml.h, checked against pynvml 13.615.71):

- ``NVML_FI_DEV_ECC_SBE_VOL_TOTAL`` (3) / ``..._DBE_VOL_TOTAL`` (4): the volatile corrected /
  uncorrected counts of ``nvmlDeviceGetTotalEccErrors`` (single bit is corrected, double bit
  uncorrected, as NVML counts them);
- ``NVML_FI_DEV_RETIRED_SBE`` (29), ``..._DBE`` (30), ``..._PENDING`` (31): the counts of
  ``nvmlDeviceGetRetiredPages`` per cause and ``nvmlDeviceGetRetiredPagesPendingStatus``;
- ``NVML_FI_DEV_REMAPPED_COR`` / ``_UNC`` / ``_PENDING`` / ``_FAILURE`` (142-145):
  ``nvmlDeviceGetRemappedRows``.

Not here: the per-scrape values. NVML has no field for the clock event reasons' mask (the
``CLOCKS_EVENT_REASON`` fields count time spent), the current PCIe generation or width,
utilisation or the GPU temperature; power has one (``POWER_AVERAGE`` / ``POWER_INSTANT``), but
a call for it alone would replace one call by one call, and which of the two equals
``nvmlDeviceGetPowerUsage`` depends on the GPU's generation. Nor NVLink: per-link error fields
stop at link 11 and the scoped ``NVLINK_ERROR_DL_*`` ids do not tell flit from data CRC errors.

A field that does not answer ``SUCCESS`` (a driver before the field answers ``NOT_SUPPORTED``
for it; before the function, the whole call ``FUNCTION_NOT_FOUND``), and every field when the
call fails, is read by its own function call, whose answer decides: a value, not supported
(no series) or an error on the scrape, in the words that function's reads use.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable
from typing import Any

import pynvml

ECC_SBE_VOL_TOTAL = 3
ECC_DBE_VOL_TOTAL = 4
RETIRED_SBE = 29
RETIRED_DBE = 30
RETIRED_PENDING = 31
REMAPPED_COR = 142
REMAPPED_UNC = 143
REMAPPED_PENDING = 144
REMAPPED_FAILURE = 145
#: nvmlDeviceGetRemappedRows' four out-parameters, in its order
REMAPPED = (REMAPPED_COR, REMAPPED_UNC, REMAPPED_PENDING, REMAPPED_FAILURE)
#: the fields one slow read asks, in this order
SLOW_FIELDS = (
    ECC_SBE_VOL_TOTAL,
    ECC_DBE_VOL_TOTAL,
    *REMAPPED,
    RETIRED_SBE,
    RETIRED_DBE,
    RETIRED_PENDING,
)
_SUCCESS = 0
_FUNCTION_NOT_FOUND = 13


#: nvmlFieldValue_t, as the binding declares it: the array NVML fills (read as bytes, below)
FieldValue = pynvml.c_nvmlFieldValue_t


#: one nvmlFieldValue_t as bytes (little-endian, as every platform NVML runs on): fieldId,
#: scopeId, timestamp, latencyUsec, valueType, nvmlReturn, the value union's 8 bytes
_ENTRY = struct.Struct("<IIqqIIQ")
_ULONG_MASK = (1 << (8 * ctypes.sizeof(ctypes.c_ulong))) - 1


def decode(value_type: int, raw: int) -> int:
    """The value union's 8 bytes ``raw`` (as an unsigned int) as the int ``value_type`` says."""
    if value_type == 1:  # NVML_VALUE_TYPE_UNSIGNED_INT
        return raw & 0xFFFF_FFFF
    if value_type == 3:  # UNSIGNED_LONG_LONG
        return raw
    if value_type == 2:  # UNSIGNED_LONG
        return raw & _ULONG_MASK
    if value_type == 4:  # SIGNED_LONG_LONG
        return raw - (1 << 64) if raw >> 63 else raw
    if value_type == 5:  # SIGNED_INT
        raw &= 0xFFFF_FFFF
        return raw - (1 << 32) if raw >> 31 else raw
    if value_type == 6:  # UNSIGNED_SHORT
        return raw & 0xFFFF
    return int(struct.unpack("<d", raw.to_bytes(8, "little"))[0])  # DOUBLE


assert ctypes.sizeof(FieldValue) == _ENTRY.size


class SlowFields:
    """One GPU's slow fields: the array made once, read with one call."""

    def __init__(self) -> None:
        self._values = (FieldValue * len(SLOW_FIELDS))()
        for v, field in zip(self._values, SLOW_FIELDS, strict=True):
            v.fieldId = field  # scopeId 0; NVML writes the rest of each entry at every call
        self._ref = ctypes.byref(self._values)
        self._count = ctypes.c_int32(len(SLOW_FIELDS))
        self.missing = False  # the driver has no nvmlDeviceGetFieldValues

    def read(self, fn: Callable[..., int], handle: Any) -> dict[int, int]:
        """The fields that answered ``SUCCESS``, by id; none when the call failed."""
        if self.missing:
            return {}
        rc = fn(handle, self._count, self._ref)
        if rc != _SUCCESS:
            self.missing = rc == _FUNCTION_NOT_FOUND
            return {}
        # one pass over the array's bytes, not a ctypes object per entry and member
        return {
            field: decode(value_type, raw)
            for field, _, _, _, value_type, status, raw in _ENTRY.iter_unpack(self._values)
            if status == _SUCCESS
        }

"""GPU UUIDs in one spelling, so that CUDA devices and NVML GPUs join exactly.

A training process's CUDA devices are joined with the exporter's NVML GPUs by UUID
(``CUDA_VISIBLE_DEVICES`` renumbers devices; a UUID stays the GPU's own).

NVML's ``nvmlDeviceGetUUID`` says ``GPU-5d6c1b0b-4b3c-fa1e-8f07-2a9b3c4d5e6f``; torch's
``str(torch.cuda.get_device_properties(i).uuid)`` says ``5d6c1b0b-4b3c-fa1e-8f07-2a9b3c4d5e6f``.
Both become NVML's spelling, lower case. A MIG instance's UUID (``MIG-...``) is not a GPU's and
is refused, as is anything else that is not 32 hex digits in the 8-4-4-4-12 groups.
"""

from __future__ import annotations

import re

_UUID = re.compile(
    r"(?:GPU-)?([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})", re.IGNORECASE
)


def normalize_gpu_uuid(value: object) -> str | None:
    """``GPU-`` and the lower-case hex of ``value``, or None when it is not a GPU UUID.

    ``value`` is a string, or an object whose ``str()`` is one, such as torch's CUDA UUID.
    """
    if value is None:
        return None
    try:
        text = str(value).strip()
    except Exception:  # an object whose __str__ fails is not a UUID
        return None
    match = _UUID.fullmatch(text)
    return f"GPU-{match.group(1).lower()}" if match else None

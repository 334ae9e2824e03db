"""The test NVML library's nvmlDeviceGetFieldValues, through the real pynvml: NVML's layout
(nvmlFieldValue_t) and semantics (a status per field; the call fails only for the device)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.nvml_fake import FakeNvmlState, build_fake_nvml

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the fake NVML is a Linux shared library"
)

CHILD = """
import json, time
import pynvml as n
n.nvmlInit()
FIELDS = [3, 4, 5, 6, 29, 30, 31, 142, 143, 144, 145, (185, 0), (186, 0), (186, 1), (185, 9), 1]
out = []
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    try:
        values = n.nvmlDeviceGetFieldValues(h, FIELDS)
    except n.NVMLError as e:
        out.append(type(e).__name__)
        continue
    member = {1: "uiVal", 3: "ullVal"}
    out.append([
        [v.fieldId, v.scopeId, v.nvmlReturn, v.valueType,
         getattr(v.value, member[v.valueType]) if v.nvmlReturn == 0 else None,
         abs(v.timestamp / 1e6 - time.time()) < 60, v.latencyUsec]
        for v in values
    ])
print(json.dumps(out))
"""


def test_field_values_with_nvml_semantics(tmp_path: Path) -> None:
    """ECC totals (single bit = corrected, double bit = uncorrected; volatile and aggregate) as
    unsigned long long; retired pages (ULL) and their pending flag on a GPU before Ampere,
    NOT_SUPPORTED per field on an H100 and the reverse for remapped rows; power in milliwatts
    at GPU scope (module scope NOT_SUPPORTED, an unknown scope INVALID_ARGUMENT); an id the
    library does not answer NOT_SUPPORTED in its own status; a fail line on a value's own call
    fails its fields, `fail nvmlDeviceGetFieldValues:ID` that field alone, and
    `fail nvmlDeviceGetFieldValues` the whole call (as a lost GPU does)."""
    build_fake_nvml()
    state = FakeNvmlState()
    h100 = state.add_gpu()
    h100.ecc_corrected, h100.ecc_uncorrected = 7, 2
    h100.ecc_corrected_aggregate = 9
    h100.remapped_corrected, h100.remapped_uncorrected, h100.remap_failure = 1, 2, True
    h100.power_mw = 512_000
    volta = state.add_gpu()
    volta.page_retirement, volta.retired_sbe, volta.retired_dbe = True, 3, 1
    volta.retired_pending = True
    state.fail("nvmlDeviceGetTotalEccErrors", "not_supported", gpu=1)
    state.fail("nvmlDeviceGetFieldValues:144", "unknown", gpu=0)
    state.add_gpu()
    state.fail("nvmlDeviceGetFieldValues", "gpu_is_lost", gpu=2)
    path = state.write(tmp_path / "nvml.state")
    proc = subprocess.run(
        [sys.executable, "-c", CHILD],
        env=state.env(path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    g0, g1, g2 = json.loads(proc.stdout)
    ns, bad, unknown = 3, 2, 999
    assert g0 == [
        [3, 0, 0, 3, 7, True, 0],
        [4, 0, 0, 3, 2, True, 0],
        [5, 0, 0, 3, 9, True, 0],
        [6, 0, 0, 3, 2, True, 0],
        [29, 0, ns, 3, None, True, 0],
        [30, 0, ns, 3, None, True, 0],
        [31, 0, ns, 1, None, True, 0],
        [142, 0, 0, 1, 1, True, 0],
        [143, 0, 0, 1, 2, True, 0],
        [144, 0, unknown, 1, None, True, 0],
        [145, 0, 0, 1, 1, True, 0],
        [185, 0, 0, 1, 512_000, True, 0],
        [186, 0, 0, 1, 512_000, True, 0],
        [186, 1, ns, 1, None, True, 0],
        [185, 9, bad, 1, None, True, 0],
        [1, 0, ns, 1, None, True, 0],
    ]
    assert [v[2] for v in g1[:4]] == [ns] * 4  # no ECC on this one
    assert [(v[0], v[2], v[4]) for v in g1[4:11]] == [
        (29, 0, 3),
        (30, 0, 1),
        (31, 0, 1),
        (142, ns, None),
        (143, ns, None),
        (144, ns, None),
        (145, ns, None),
    ]
    assert g2 == "NVMLError_GpuIsLost"

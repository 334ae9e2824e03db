"""The slow GPU health reads through nvmlDeviceGetFieldValues (one call per GPU for ECC counts,
remapped rows and retired pages), and their fallback to each value's own call where the driver
lacks a field or the function: the same series either way; and the per-mask clock reason
series kept between scrapes. From the real pynvml on the test NVML library, gathered in a child."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from helpers.exporter_proc import child_env
from helpers.nvml_fake import FakeNvmlState

UUIDS = [f"GPU-{c * 8}-0000-0000-0000-000000000000" for c in "abc"]
SLOW_SYMBOLS = (
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetRetiredPages",
    "nvmlDeviceGetRetiredPagesPendingStatus",
)

#: gathers once per stdin line (the clock), prints the health samples and the scrape's errors
CHILD = r"""
import json, sys
from trainguard.exporter.collectors.gpu.collector import GpuCollector
from trainguard.exporter.scrape.context import Scrape

now = [1000.0]
collector = GpuCollector()
collector._health._clock = lambda: now[0]
for line in sys.stdin:
    now[0] = float(line)
    scrape = Scrape()
    samples = {
        s.name + json.dumps(s.labels, sort_keys=True): s.value
        for f in collector.gather(scrape) for s in f.samples
        if s.name.startswith("trainguard_gpu_") and "memory" not in s.name
        and "process" not in s.name and "info" not in s.name
    }
    print(json.dumps({"samples": samples, "errors": scrape.errors}), flush=True)
"""


def three_gpus() -> FakeNvmlState:
    """An H100 with ECC errors and a row remap pending, a GeForce (no ECC, no row remapping),
    and a V100 that retires pages instead of remapping rows."""
    state = FakeNvmlState()
    h100 = state.add_gpu(UUIDS[0], utilization=100)
    h100.ecc_corrected, h100.ecc_uncorrected = 12, 1
    h100.remapped_corrected, h100.remapped_uncorrected, h100.remap_pending = 3, 1, True
    state.add_gpu(UUIDS[1], name="NVIDIA GeForce RTX 4090")
    for symbol in ("nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRemappedRows"):
        state.fail(symbol, "not_supported", gpu=1)
    v100 = state.add_gpu(UUIDS[2], name="Tesla V100-SXM2-32GB")
    v100.ecc_corrected = 5
    v100.page_retirement, v100.retired_sbe, v100.retired_dbe, v100.retired_pending = True, 4, 1, 1
    return state


def gather(state: FakeNvmlState, tmp: Path, clocks: list[float]) -> tuple[list[dict], list[str]]:
    """One gather per clock value in a child on ``state``: its outputs and the NVML calls made
    (``symbol rc``, from the library's log)."""
    path = state.write(tmp / "nvml.state")
    log = tmp / "calls.log"
    log.unlink(missing_ok=True)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD],
        input="".join(f"{t}\n" for t in clocks),
        env=state.env(path, log_path=log, base=child_env()),
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return [json.loads(line) for line in proc.stdout.splitlines()], log.read_text().splitlines()


def count(calls: list[str], symbol: str, rc: str | None = None) -> int:
    return sum(1 for c in calls if c.split()[0] == symbol and (rc is None or c.split()[1] == rc))


def key(name: str, gpu: int, **labels: str) -> str:
    """A sample's key in the child's output."""
    return name + json.dumps({"gpu": str(gpu), "uuid": UUIDS[gpu], **labels}, sort_keys=True)


def test_one_field_values_call_per_gpu_and_slow_read(tmp_path: Path) -> None:
    """Two slow reads (31 s apart), three GPUs: nvmlDeviceGetFieldValues once per GPU and read;
    a value's own call only where its fields did not answer, and then NOT_SUPPORTED (not
    asked again for 10 minutes); the series are those of the calls one by one."""
    out, calls = gather(three_gpus(), tmp_path, [1000.0, 1031.0])
    assert all(o["errors"] == [] for o in out)
    assert count(calls, "nvmlDeviceGetFieldValues") == count(calls, "nvmlDeviceGetFieldValues", "0")
    assert count(calls, "nvmlDeviceGetFieldValues") == 3 * 2
    # the GeForce's ECC (two counts), once: NOT_SUPPORTED by field and by call
    assert count(calls, "nvmlDeviceGetTotalEccErrors") == 2
    assert count(calls, "nvmlDeviceGetTotalEccErrors", "3") == 2
    # the GeForce and the V100 remap no rows; the H100 and the GeForce retire no pages
    assert count(calls, "nvmlDeviceGetRemappedRows") == 2
    assert count(calls, "nvmlDeviceGetRemappedRows", "3") == 2
    assert count(calls, "nvmlDeviceGetRetiredPages") == 2
    assert count(calls, "nvmlDeviceGetRetiredPages", "3") == 2
    assert count(calls, "nvmlDeviceGetRetiredPagesPendingStatus") == 0
    s = out[0]["samples"]
    assert s[key("trainguard_gpu_remapped_rows_total", 0, cause="correctable")] == 3
    assert s[key("trainguard_gpu_remapped_rows_total", 0, cause="uncorrectable")] == 1
    assert s[key("trainguard_gpu_row_remap_pending", 0)] == 1
    assert s[key("trainguard_gpu_ecc_uncorrected_errors_total", 0)] == 1
    assert s[key("trainguard_gpu_ecc_corrected_errors_total", 2)] == 5
    assert s[key("trainguard_gpu_retired_pages_total", 2, cause="double_bit_ecc")] == 1
    assert s[key("trainguard_gpu_retired_pages_total", 2, cause="multiple_single_bit_ecc")] == 4
    assert s[key("trainguard_gpu_retired_pages_pending", 2)] == 1
    assert not any(("ecc" in k or "remap" in k) and '"gpu": "1"' in k for k in s)
    assert key("trainguard_gpu_row_remap_pending", 2) not in s
    # a driver without the function: the same series, every value by its own call
    state = three_gpus()
    state.fail("nvmlDeviceGetFieldValues", "function_not_found")
    one_by_one, old_calls = gather(state, tmp_path, [1000.0, 1031.0])
    assert [o["samples"] for o in one_by_one] == [o["samples"] for o in out]
    assert all(o["errors"] == [] for o in one_by_one)
    assert count(old_calls, "nvmlDeviceGetFieldValues") == 3  # once per GPU, then not again
    # two counts of GPUs 0 and 2 at both reads, the GeForce's once
    assert count(old_calls, "nvmlDeviceGetTotalEccErrors") == 2 * 2 * 2 + 2
    assert count(old_calls, "nvmlDeviceGetRetiredPagesPendingStatus") == 2


def test_a_field_the_driver_does_not_answer_is_read_by_its_own_call(tmp_path: Path) -> None:
    """Per value: a field answering NOT_SUPPORTED (a driver before that field) or another
    error, or the whole call failing, gives the value from its own call, the same series and
    no failure; the fields that did answer are used."""
    state = three_gpus()
    state.fail("nvmlDeviceGetFieldValues:143", "not_supported")  # remapped uncorrectable
    state.fail("nvmlDeviceGetFieldValues:4", "unknown", gpu=0)  # uncorrected ECC
    state.fail("nvmlDeviceGetFieldValues:31", "not_supported", gpu=2)  # retired pending
    state.fail("nvmlDeviceGetFieldValues", "unknown", gpu=1)
    out, calls = gather(state, tmp_path, [1000.0])
    assert out[0]["errors"] == []
    plain = three_gpus()
    plain.fail("nvmlDeviceGetFieldValues", "function_not_found")
    assert out[0]["samples"] == gather(plain, tmp_path, [1000.0])[0][0]["samples"]
    by_gpu = [c for c in calls if not c.startswith("nvmlEvent")]
    assert count(by_gpu, "nvmlDeviceGetRemappedRows", "0") == 1  # the H100
    assert count(by_gpu, "nvmlDeviceGetTotalEccErrors", "0") == 1  # the H100's uncorrected
    assert count(by_gpu, "nvmlDeviceGetRetiredPagesPendingStatus", "0") == 1  # the V100
    assert count(by_gpu, "nvmlDeviceGetRetiredPages", "0") == 0  # the V100's: by field


def test_clock_reasons_follow_the_mask_from_scrape_to_scrape(tmp_path: Path) -> None:
    """Each mask's reason series are found once and kept: a mask that changes, goes to 0
    (no reason series, the mask series 0) and comes back publishes exactly its own reasons."""
    state = FakeNvmlState()
    gpu = state.add_gpu(UUIDS[0], utilization=100)
    path = tmp_path / "nvml.state"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        env=state.env(path, base=child_env()),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    seen = []
    try:
        for at, mask in enumerate((0x44, 0x0, 0x8, 0x44, 0x0)):
            gpu.clock_event_reasons = mask
            state.write(path)
            child.stdin.write(f"{1000 + at}\n")
            child.stdin.flush()
            s = json.loads(child.stdout.readline())["samples"]
            reasons = sorted(
                json.loads(k.removeprefix("trainguard_gpu_clock_event_reason"))["reason"]
                for k in s
                if k.startswith("trainguard_gpu_clock_event_reason{")
            )
            seen.append((s[key("trainguard_gpu_clock_event_reasons", 0)], reasons))
    finally:
        child.stdin.close()
        child.wait(timeout=60)
    assert seen == [
        (0x44, ["hw_thermal_slowdown", "sw_power_cap"]),
        (0, []),
        (8, ["hw_slowdown"]),
        (0x44, ["hw_thermal_slowdown", "sw_power_cap"]),
        (0, []),
    ]

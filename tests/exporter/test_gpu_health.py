"""GPU health series (clock event reasons, PCIe link, utilisation, power, temperature, ECC,
remapped rows) from the real pynvml on the test NVML library, scraped over HTTP."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from helpers.exporter_proc import Exporter, child_env, select, value
from helpers.nvml_fake import (
    REASON_GPU_IDLE,
    REASON_HW_THERMAL_SLOWDOWN,
    REASON_SW_POWER_CAP,
    FakeNvmlState,
)

UUIDS = [f"GPU-{c * 8}-0000-0000-0000-000000000000" for c in "abc"]
G = [{"gpu": str(i), "uuid": u} for i, u in enumerate(UUIDS)]
NOT_ON_GEFORCE = (
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetEnforcedPowerLimit",
)


def three_gpus() -> FakeNvmlState:
    """GPU 0 trains, slowed by heat, on a link trained down to Gen2; GPU 1 is a GeForce
    (no ECC, no row remapping, no power limit reading); GPU 2 is idle."""
    state = FakeNvmlState()
    hot = state.add_gpu(UUIDS[0], utilization=100, temperature=88)
    hot.clock_event_reasons = REASON_SW_POWER_CAP | REASON_HW_THERMAL_SLOWDOWN | 0x800
    hot.pcie_generation, hot.pcie_width = 2, 8
    hot.power_mw, hot.power_limit_mw = 689_500, 700_000
    hot.ecc_corrected, hot.ecc_uncorrected = 12, 1
    hot.remapped_corrected, hot.remapped_uncorrected, hot.remap_pending = 3, 1, True
    geforce = state.add_gpu(UUIDS[1], name="NVIDIA GeForce RTX 4090", utilization=35)
    geforce.pcie_max_generation, geforce.pcie_gpu_max_generation = 3, 4  # a Gen3 riser
    geforce.pcie_generation = 3
    for symbol in NOT_ON_GEFORCE:
        state.fail(symbol, "not_supported", gpu=1)
    state.add_gpu(UUIDS[2])
    return state


def reasons(s: dict[Any, float], gpu: str) -> set[str]:
    return {dict(lbl)["reason"] for lbl in select(s, "trainguard_gpu_clock_event_reason", gpu=gpu)}


def of_gpu(s: dict[Any, float], gpu: str) -> set[str]:
    """Names of the health series published for one GPU."""
    return {name for name, lbl in s if name.startswith("trainguard_gpu_") and ("gpu", gpu) in lbl}


def test_health_of_three_gpus(tmp_path: Path) -> None:
    state = three_gpus()
    path = state.write(tmp_path / "nvml.state")
    with Exporter(env=state.env(path), state_dir=tmp_path / "s") as exp:
        s = exp.scrape()
    assert value(s, "trainguard_collector_success", collector="gpu") == 1
    # one series per active reason; a bit this exporter does not know is named by its value
    assert reasons(s, "0") == {"sw_power_cap", "hw_thermal_slowdown", "bit_0x800"}
    assert value(s, "trainguard_gpu_clock_event_reasons", **G[0]) == 0x844
    assert set(select(s, "trainguard_gpu_clock_event_reason", gpu="0").values()) == {1}
    assert reasons(s, "1") == set() and value(s, "trainguard_gpu_clock_event_reasons", **G[1]) == 0
    assert reasons(s, "2") == {"gpu_idle"}
    assert value(s, "trainguard_gpu_clock_event_reasons", **G[2]) == REASON_GPU_IDLE
    expected = {
        "trainguard_gpu_pcie_link_generation": (2, 3, 5),
        "trainguard_gpu_pcie_link_generation_max": (5, 3, 5),
        "trainguard_gpu_pcie_link_generation_gpu_max": (5, 4, 5),
        "trainguard_gpu_pcie_link_width": (8, 16, 16),
        "trainguard_gpu_pcie_link_width_max": (16, 16, 16),
        "trainguard_gpu_utilization_ratio": (1.0, 0.35, 0.0),
        "trainguard_gpu_power_usage_watts": (689.5, 70.0, 70.0),
        "trainguard_gpu_power_limit_watts": (700.0, None, 700.0),
        "trainguard_gpu_temperature_celsius": (88, 40, 40),
        "trainguard_gpu_temperature_slowdown_celsius": (87, 87, 87),
        "trainguard_gpu_ecc_corrected_errors_total": (12, None, 0),
        "trainguard_gpu_ecc_uncorrected_errors_total": (1, None, 0),
        "trainguard_gpu_row_remap_pending": (1, None, 0),
        "trainguard_gpu_row_remap_failed": (0, None, 0),
    }
    for name, values in expected.items():
        assert tuple(value(s, name, **g) for g in G) == values, name
    rows = {
        (dict(lbl)["gpu"], dict(lbl)["cause"]): v
        for lbl, v in select(s, "trainguard_gpu_remapped_rows_total").items()
    }
    assert rows == {
        ("0", "correctable"): 3,
        ("0", "uncorrectable"): 1,
        ("2", "correctable"): 0,
        ("2", "uncorrectable"): 0,
    }
    # NOT_SUPPORTED: no series at all (not 0), and not a failure
    assert not any("ecc" in n or "remap" in n or "power_limit" in n for n in of_gpu(s, "1"))


def test_a_failing_read_fails_that_part_only(tmp_path: Path) -> None:
    """Any error but NOT_SUPPORTED is a failure of that reading: collector success 0, the
    reason in the log, the reading left out, every other series still there."""
    state = three_gpus()
    state.fail("nvmlDeviceGetPowerUsage", "no_permission", gpu=0)
    state.fail("nvmlDeviceGetRemappedRows", "unknown", gpu=2)
    path = state.write(tmp_path / "nvml.state")
    with Exporter(env=state.env(path), state_dir=tmp_path / "s") as exp:
        s = exp.scrape()
        state.failures = [f for f in state.failures if f[0] in NOT_ON_GEFORCE and f[2] == 1]
        state.write(path)
        back = exp.scrape()
        log = exp.stop()
    assert value(s, "trainguard_collector_success", collector="gpu") == 0
    assert value(s, "trainguard_gpu_power_usage_watts", **G[0]) is None
    assert value(s, "trainguard_gpu_power_limit_watts", **G[0]) == 700
    assert value(s, "trainguard_gpu_power_usage_watts", **G[1]) == 70
    assert value(s, "trainguard_gpu_row_remap_pending", **G[2]) is None
    assert value(s, "trainguard_gpu_ecc_uncorrected_errors_total", **G[2]) == 0
    assert value(s, "trainguard_gpu_memory_used_bytes", **G[0]) == 0
    assert f"GPU 0 ({UUIDS[0]}): power usage: Insufficient Permissions" in log
    assert f"GPU 2 ({UUIDS[2]}): remapped rows: Unknown Error" in log
    assert value(back, "trainguard_collector_success", collector="gpu") == 1
    assert value(back, "trainguard_gpu_power_usage_watts", **G[0]) == 689.5


def test_unsupported_and_slow_reads_are_not_repeated(tmp_path: Path) -> None:
    """What a GPU does not support is not asked again at every scrape, and what changes slowly
    or never (ECC counts, remapped rows, retired pages, NVLink, the link's maximum, the slowdown
    temperature) is read once per SLOW_READ_S (30 s): three scrapes in a row read it once.
    A driver without nvmlDeviceGetFieldValues, so every value by its own call (with field
    values: tests/exporter/test_gpu_health_fields.py)."""
    state = three_gpus()
    state.fail("nvmlDeviceGetFieldValues", "function_not_found")
    path = state.write(tmp_path / "nvml.state")
    log_path = tmp_path / "calls.log"
    with Exporter(env=state.env(path, log_path=log_path), state_dir=tmp_path / "s") as exp:
        for _ in range(3):
            s = exp.scrape()
            assert value(s, "trainguard_collector_success", collector="gpu") == 1
            assert value(s, "trainguard_gpu_pcie_link_generation_max", **G[1]) == 3
            # published from the last read in between, not left out
            assert value(s, "trainguard_gpu_ecc_uncorrected_errors_total", **G[0]) == 1
    calls = [line.split() for line in log_path.read_text().splitlines()]
    count = lambda sym, rc=None: sum(  # noqa: E731
        1 for c in calls if c[0] == sym and (rc is None or c[1] == rc)
    )
    # ECC: two reads per GPU on the first scrape (GPU 1, a GeForce: NOT_SUPPORTED), then none
    assert count("nvmlDeviceGetTotalEccErrors", "3") == 2
    assert count("nvmlDeviceGetTotalEccErrors") == 2 * 3
    assert count("nvmlDeviceGetRemappedRows", "3") == 1
    assert count("nvmlDeviceGetRemappedRows") == 3
    # H100s retire no pages: NOT_SUPPORTED at the first cause, once per GPU
    assert count("nvmlDeviceGetRetiredPages") == count("nvmlDeviceGetRetiredPages", "3") == 3
    # no NVLink on these: link 0 answers NOT_SUPPORTED, once per GPU
    assert count("nvmlDeviceGetNvLinkState") == count("nvmlDeviceGetNvLinkState", "3") == 3
    assert count("nvmlDeviceGetNvLinkErrorCounter") == 0
    for fixed in (
        "nvmlDeviceGetMaxPcieLinkGeneration",
        "nvmlDeviceGetGpuMaxPcieLinkGeneration",
        "nvmlDeviceGetMaxPcieLinkWidth",
        "nvmlDeviceGetTemperatureThreshold",
    ):
        assert count(fixed) == 3, fixed
    assert count("nvmlDeviceGetCurrPcieLinkGeneration") == 9
    assert count("nvmlDeviceGetEnforcedPowerLimit", "3") == 1  # GPU 1, then not asked again


def test_old_driver_falls_back_to_throttle_reasons(tmp_path: Path) -> None:
    """A driver before nvmlDeviceGetCurrentClocksEventReasons (FUNCTION_NOT_FOUND, as pynvml
    says for a missing symbol): the older call gives the same bit mask."""
    state = three_gpus()
    state.fail("nvmlDeviceGetCurrentClocksEventReasons", "function_not_found")
    path = state.write(tmp_path / "nvml.state")
    log_path = tmp_path / "calls.log"
    with Exporter(env=state.env(path, log_path=log_path), state_dir=tmp_path / "s") as exp:
        s = exp.scrape()
        s2 = exp.scrape()
    for scrape in (s, s2):
        assert value(scrape, "trainguard_collector_success", collector="gpu") == 1
        assert reasons(scrape, "0") == {"sw_power_cap", "hw_thermal_slowdown", "bit_0x800"}
        assert reasons(scrape, "2") == {"gpu_idle"}
    calls = log_path.read_text().split()
    assert calls.count("nvmlDeviceGetCurrentClocksEventReasons") == 1  # tried once
    assert calls.count("nvmlDeviceGetCurrentClocksThrottleReasons") == 6


def test_mig_gpu_is_read_once_as_the_parent(tmp_path: Path) -> None:
    """A GPU in MIG mode with processes in two GPU instances: its health series come once, for
    the physical GPU (MIG instances are never enumerated); utilisation, which NVML does not
    give for a MIG-enabled GPU, is left out, not 0 and not a failure."""
    state = FakeNvmlState()
    mig = state.add_gpu(UUIDS[0], used=30 << 30)
    mig.ecc_corrected = 5
    for gi, pid in ((1, 4001), (2, 4002)):
        state.add_process(0, pid, 10 << 30, gpu_instance_id=gi, compute_instance_id=0)
    state.fail("nvmlDeviceGetUtilizationRates", "not_supported", gpu=0)
    path = state.write(tmp_path / "nvml.state")
    with Exporter(env=state.env(path), state_dir=tmp_path / "s") as exp:
        s = exp.scrape()
    assert value(s, "trainguard_collector_success", collector="gpu") == 1
    assert select(s, "trainguard_gpu_ecc_corrected_errors_total") == {
        frozenset({("gpu", "0"), ("uuid", UUIDS[0])}): 5
    }
    assert select(s, "trainguard_gpu_utilization_ratio") == {}
    assert len(select(s, "trainguard_gpu_power_usage_watts")) == 1


def test_reason_bits_are_nvml_h_as_pynvml_names_them() -> None:
    """The exporter's literal bits (kept literal for older nvidia-ml-py releases) are the
    installed pynvml's nvmlClocksEventReason* / nvmlClocksThrottleReason* constants."""
    import pynvml

    from trainguard.exporter.collectors.gpu.metrics import REASONS, reason_labels

    for bit, name in REASONS:
        camel = "".join(word.capitalize() for word in name.split("_"))
        constant = getattr(pynvml, "nvmlClocksEventReason" + camel, None)
        if constant is None:
            constant = getattr(pynvml, "nvmlClocksThrottleReason" + camel)
        assert constant == bit, name
    assert reason_labels(0) == []
    assert reason_labels(0x1 | 0x40 | 0x1000) == ["gpu_idle", "hw_thermal_slowdown", "bit_0x1000"]


def test_retired_pages_and_nvlink_errors(tmp_path: Path) -> None:
    """A GPU before Ampere: retired pages by cause and pending, no remapped rows (unknown, not
    0). An H100 with NVLink: error counters per active link and kind; an inactive link and the
    kind the GPU does not count (ECC data) have no series. A PCIe card: no NVLink series."""
    state = FakeNvmlState()
    volta = state.add_gpu(UUIDS[0], name="Tesla V100-SXM2-32GB")
    volta.page_retirement, volta.retired_sbe, volta.retired_dbe = True, 4, 1
    volta.retired_pending = True
    h100 = state.add_gpu(UUIDS[1])
    h100.nvlinks, h100.nvlink_down = 3, 0x2
    h100.nvlink_errors = {(0, "replay"): 7, (2, "crc_flit"): 2}
    state.add_gpu(UUIDS[2])
    path = state.write(tmp_path / "nvml.state")
    with Exporter(env=state.env(path), state_dir=tmp_path / "s") as exp:
        s = exp.scrape()
    assert value(s, "trainguard_collector_success", collector="gpu") == 1
    pages = {
        (dict(lbl)["gpu"], dict(lbl)["cause"]): v
        for lbl, v in select(s, "trainguard_gpu_retired_pages_total").items()
    }
    assert pages == {("0", "multiple_single_bit_ecc"): 4, ("0", "double_bit_ecc"): 1}
    assert value(s, "trainguard_gpu_retired_pages_pending", **G[0]) == 1
    assert select(s, "trainguard_gpu_retired_pages_pending", gpu="1") == {}
    assert value(s, "trainguard_gpu_row_remap_pending", **G[0]) is None
    assert value(s, "trainguard_gpu_row_remap_pending", **G[1]) == 0
    links = {
        (dict(lbl)["gpu"], dict(lbl)["link"], dict(lbl)["error"]): v
        for lbl, v in select(s, "trainguard_gpu_nvlink_errors_total").items()
    }
    kinds = ("replay", "recovery", "crc_flit", "crc_data")
    expected = {("1", link, kind): 0 for link in ("0", "2") for kind in kinds}
    expected[("1", "0", "replay")] = 7
    expected[("1", "2", "crc_flit")] = 2
    assert links == expected


def test_a_failing_nvlink_counter_is_a_failure_and_read_again(tmp_path: Path) -> None:
    """An NVLink counter read that fails (not NOT_SUPPORTED) fails the collector's scrape and
    is left out; it is read again at the next scrape, not 30 s later."""
    state = FakeNvmlState()
    h100 = state.add_gpu(UUIDS[0])
    h100.nvlinks = 1
    h100.nvlink_errors = {(0, "replay"): 3}
    state.fail("nvmlDeviceGetNvLinkErrorCounter", "unknown", gpu=0)
    path = state.write(tmp_path / "nvml.state")
    with Exporter(env=state.env(path), state_dir=tmp_path / "s") as exp:
        s = exp.scrape()
        state.failures = []
        state.write(path)
        back = exp.scrape()
        log = exp.stop()
    assert value(s, "trainguard_collector_success", collector="gpu") == 0
    assert select(s, "trainguard_gpu_nvlink_errors_total") == {}
    assert value(s, "trainguard_gpu_ecc_corrected_errors_total", **G[0]) == 0
    assert f"GPU 0 ({UUIDS[0]}): NVLink replay errors: Unknown Error" in log
    assert value(back, "trainguard_collector_success", collector="gpu") == 1
    assert value(back, "trainguard_gpu_nvlink_errors_total", **G[0], link="0", error="replay") == 3


SLOW_CHILD = r"""
import json, sys
from prometheus_client import generate_latest
from trainguard.exporter.collectors.gpu.collector import GpuCollector
from trainguard.exporter.scrape.exposition import TextWriter
from trainguard.exporter.scrape.context import Scrape

class Families:
    def __init__(self, families):
        self.families = families
    def collect(self):
        return self.families

now = [1000.0]
collector = GpuCollector()
collector._health._clock = lambda: now[0]
writer = TextWriter()
for line in sys.stdin:  # one line per scrape: the clock, after the parent rewrote the state
    now[0] = float(line)
    families = list(collector.gather(Scrape()))
    page = writer.render(families)
    assert page == generate_latest(Families(families)), "not generate_latest's page"
    names = sys.argv[1:] or ["trainguard_gpu_ecc_uncorrected_errors_total"]
    values = [[s.value for f in families for s in f.samples if s.name == n] for n in names]
    print(json.dumps(values[0] if len(names) == 1 else values), flush=True)
"""


def slow_child(state: FakeNvmlState, path: Path, *names: str) -> Any:
    """A GpuCollector in a child on a clock of the test's: ``scrape(at)`` gathers at ``at`` s
    and answers the values of ``names`` (each a list, over the GPUs)."""
    child = subprocess.Popen(
        [sys.executable, "-c", SLOW_CHILD, *names],
        env=state.env(path, base=child_env()),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None

    def scrape(at: float) -> Any:
        child.stdin.write(f"{at}\n")  # type: ignore[union-attr]
        child.stdin.flush()  # type: ignore[union-attr]
        return json.loads(child.stdout.readline())  # type: ignore[union-attr]

    return child, scrape


def test_slow_reads_are_at_most_30_s_old(tmp_path: Path) -> None:
    """ECC counts (and the other slow reads) come from a read at most SLOW_READ_S old: a change
    shows at the first scrape 30 s after the last read, not before; and the page, rendered
    lines and all, is generate_latest's for the same families at every scrape."""
    state = FakeNvmlState()
    gpu = state.add_gpu(UUIDS[0])
    path = state.write(tmp_path / "nvml.state")
    child, scrape = slow_child(state, path)
    try:
        assert scrape(1000.0) == [0]
        gpu.ecc_uncorrected = 2
        state.write(path)
        assert scrape(1015.0) == [0]  # the value read at 1000 s, 15 s old
        assert scrape(1029.9) == [0]
        assert scrape(1030.0) == [2]  # 30 s after the last read: read again
        gpu.ecc_uncorrected = 3
        state.write(path)
        assert scrape(1059.0) == [2]
        assert scrape(1060.0) == [3]
    finally:
        child.stdin.close()
        assert child.wait(timeout=60) == 0


def test_a_read_not_supported_is_asked_again_after_ten_minutes(tmp_path: Path) -> None:
    """Utilisation of a GPU in MIG mode is NOT_SUPPORTED: no series, and not asked again at
    every scrape, but again after RECHECK_UNSUPPORTED_S (600 s): MIG switched off, the series
    is back; the GPU's other reads are served all along."""
    state = FakeNvmlState()
    state.add_gpu(UUIDS[0], utilization=40)
    state.fail("nvmlDeviceGetUtilizationRates", "not_supported", gpu=0)
    path = state.write(tmp_path / "nvml.state")
    names = ("trainguard_gpu_utilization_ratio", "trainguard_gpu_power_usage_watts")
    child, scrape = slow_child(state, path, *names)
    try:
        utilisation, power = scrape(1000.0)
        assert (utilisation, len(power)) == ([], 1)
        state.failures.clear()  # MIG mode off
        state.write(path)
        assert scrape(1015.0)[0] == []
        assert scrape(1599.0)[0] == []  # not asked again within 10 minutes
        assert scrape(1600.0)[0] == [0.4]  # asked again: supported
        assert scrape(1615.0)[0] == [0.4]
    finally:
        child.stdin.close()  # type: ignore[union-attr]
        assert child.wait(timeout=60) == 0


def test_a_gpu_lost_during_its_health_reads_loses_only_its_own_series(tmp_path: Path) -> None:
    """GPU 1 answers GPU_IS_LOST to the power read: none of its later reads and none of its
    slow series (served from the last read in between) are published while it is lost, GPU
    0's all are; GPU 1's come back, with the values of its last slow read, when it does."""
    state = FakeNvmlState()
    for uuid in UUIDS[:2]:
        gpu = state.add_gpu(uuid, utilization=90)
        gpu.ecc_uncorrected = 4
    path = state.write(tmp_path / "nvml.state")
    names = (
        "trainguard_gpu_ecc_uncorrected_errors_total",
        "trainguard_gpu_pcie_link_generation_max",
        "trainguard_gpu_utilization_ratio",
        "trainguard_gpu_pcie_link_width",
    )
    child, scrape = slow_child(state, path, *names)
    try:
        both = [[4, 4], [5, 5], [0.9, 0.9], [16, 16]]
        assert scrape(1000.0) == both
        state.fail("nvmlDeviceGetPowerUsage", "gpu_is_lost", gpu=1)
        state.write(path)
        # read before the power: its link width; after: utilisation, and no slow series
        assert scrape(1015.0) == [[4], [5], [0.9], [16, 16]]
        state.failures.clear()
        state.write(path)
        assert scrape(1020.0) == both
    finally:
        child.stdin.close()  # type: ignore[union-attr]
        assert child.wait(timeout=60) == 0

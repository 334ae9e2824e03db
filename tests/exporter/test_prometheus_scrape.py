"""A real Prometheus scrapes the real exporter: the exposition parses and the series arrive."""

from pathlib import Path

import pytest

from helpers.exporter_proc import Exporter
from helpers.promstack import Prometheus

pytestmark = pytest.mark.slow


def test_prometheus_scrapes_exporter(tmp_path: Path) -> None:
    with Exporter(state_dir=tmp_path / "state", env={"LD_LIBRARY_PATH": str(tmp_path)}) as exp:
        prom = Prometheus(tmp_path / "prom", [f"127.0.0.1:{exp.port}"])
        try:
            up = prom.wait_until('up{job="trainguard"} == 1')
            assert up[0]["metric"]["instance"] == f"127.0.0.1:{exp.port}"
            info = prom.wait_until("trainguard_exporter_build_info")
            assert info[0]["value"][1] == "1"
            # no NVML library on this path: a host without an NVIDIA driver, not a failure
            gpu = prom.wait_until('trainguard_collector_success{collector="gpu"}')
            assert gpu[0]["value"][1] == "1"
            nvml = prom.wait_until("trainguard_gpu_nvml_available")
            assert nvml[0]["value"][1] == "0"
            # no scrape errors on the Prometheus side
            targets = prom.api("targets")["data"]["activeTargets"]
            assert [t["lastError"] for t in targets] == [""]
        finally:
            prom.stop()

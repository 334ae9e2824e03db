"""Load: 50 concurrent scrapers over 127.0.0.1, 10 000 scrapes, no errors, no memory growth."""

from __future__ import annotations

import threading
import urllib.request
from pathlib import Path

import psutil

from helpers.exporter_proc import Exporter, value
from helpers.nvml_fake import FakeNvmlState

SCRAPERS = 50
SCRAPES = 10_000


def test_concurrent_scrapers_no_errors_no_growth(tmp_path: Path) -> None:
    state = FakeNvmlState()
    for _ in range(8):
        state.add_gpu(used=40 << 30)
    for i in range(100):
        state.add_process(i % 8, 100_000 + i, 1 << 30)
    path = state.write(tmp_path / "nvml.state")
    with Exporter(env=state.env(path), state_dir=tmp_path / "s") as exp:
        proc = psutil.Process(exp.proc.pid)
        errors: list[str] = []
        lock = threading.Lock()
        remaining = [SCRAPES]
        rss: list[int] = []

        def scraper() -> None:
            while True:
                with lock:
                    if remaining[0] == 0:
                        return
                    remaining[0] -= 1
                    n = SCRAPES - remaining[0]
                try:
                    with urllib.request.urlopen(exp.url + "/metrics", timeout=30) as r:
                        body = r.read().decode()
                    if "trainguard_gpu_memory_used_bytes" not in body:
                        raise AssertionError("incomplete scrape")
                except Exception as exc:
                    with lock:
                        errors.append(f"{type(exc).__name__}: {exc}")
                if n in (2_000, SCRAPES):
                    with lock:
                        rss.append(proc.memory_info().rss)

        threads = [threading.Thread(target=scraper) for _ in range(SCRAPERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        final = exp.scrape()
        rss.append(proc.memory_info().rss)
    assert errors == []
    assert value(final, "trainguard_collector_success", collector="gpu") == 1
    # after warm-up, 8 000 more scrapes may not grow the exporter by more than 4 MiB
    warm, *later = rss
    growth = max(later) - warm
    assert growth < 4 << 20, f"resident memory grew {growth / 2**20:.1f} MiB"

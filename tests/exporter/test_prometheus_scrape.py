"""A real Prometheus scrapes the real exporter: the exposition parses and the series arrive,
also while the port is flooded with idle connections and half-sent request heads."""

import contextlib
import resource
import selectors
import socket
import threading
from pathlib import Path

import pytest

from helpers.exporter_proc import Exporter
from helpers.promstack import Prometheus
from helpers.wait import wait_for

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


class Flood:
    """``idle`` connections that send nothing and ``heads`` that send half a request head, held
    open: each one the exporter closes is opened again at once, from a thread, until stop()."""

    HALF_HEAD = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n"

    def __init__(self, port: int, idle: int, heads: int) -> None:
        self.port = port
        self.selector = selectors.DefaultSelector()
        self.reopened = 0
        for kind, n in ((b"", idle), (self.HALF_HEAD, heads)):
            for _ in range(n):
                self._open(kind)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._hold, daemon=True)
        self._thread.start()

    def _open(self, data: bytes) -> None:
        s = socket.create_connection(("127.0.0.1", self.port), timeout=60)
        if data:
            s.sendall(data)
        s.setblocking(False)
        self.selector.register(s, selectors.EVENT_READ, data)

    def _hold(self) -> None:
        while not self._stop.is_set():
            for key, _ in self.selector.select(0.2):
                s: socket.socket = key.fileobj  # type: ignore[assignment]
                with contextlib.suppress(OSError):
                    s.recv(65536)  # b"" or an answer: either way it is over
                self.selector.unregister(s)
                s.close()
                self._open(key.data)
                self.reopened += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        for key in list(self.selector.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        self.selector.close()


def test_prometheus_scrapes_while_connections_flood_the_port(tmp_path: Path) -> None:
    """Anyone who reaches the port can hold connections open: 2000 saying nothing and 200
    stopped half-way through a request head. Prometheus, connecting after them, must still get
    every scrape, each within its scrape timeout (the interval, 2 s)."""
    idle, heads = 2000, 200
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = idle + heads + 512
    if soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < {needed} files this test holds")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    with Exporter(state_dir=tmp_path / "state", env={"LD_LIBRARY_PATH": str(tmp_path)}) as exp:
        flood = Flood(exp.port, idle, heads)
        prom = None
        try:
            prom = Prometheus(tmp_path / "prom", [f"127.0.0.1:{exp.port}"], scrape_interval="2s")
            seen: dict[str, tuple[str, str]] = {}  # each scrape's start: its health and error

            def three_scrapes() -> bool:
                assert prom is not None
                targets = prom.api("targets")["data"]["activeTargets"]
                if not targets or targets[0]["lastScrape"].startswith("0001-"):
                    return False  # not discovered, or not scraped yet
                (target,) = targets
                seen[target["lastScrape"]] = (target["health"], target["lastError"])
                bad = {t: v for t, v in seen.items() if v != ("up", "")}
                assert not bad, f"scrapes failed during the flood: {bad}"
                return len(seen) >= 3

            wait_for(three_scrapes, 120, 0.25, lambda: f"three scrapes; seen {seen}")
        finally:
            if prom is not None:
                prom.stop()
            flood.stop()

"""The test helper that starts a real exporter (helpers/exporter_proc.py): ready means this
exporter answers, not whatever process holds its port."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import exporter_proc
from helpers.exporter_proc import Exporter


class _Healthy(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"Healthy\n")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def other_server() -> Iterator[http.server.HTTPServer]:
    """Another process's server, healthy on every path, on a port of its own."""
    server = http.server.HTTPServer(("127.0.0.1", 0), _Healthy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_port_taken_before_the_exporter_binds_it_is_its_exit_not_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, other_server: http.server.HTTPServer
) -> None:
    """The port is free-picked, then bound by the child: another session's exporter on a
    shared machine may take it in between and answer /-/healthy for ours, whose bind fails.
    The helper reports our exporter's exit instead of scraping the other one."""
    monkeypatch.setattr(exporter_proc, "free_port", lambda: other_server.server_address[1])
    with pytest.raises(RuntimeError, match="exporter exited"):
        Exporter(state_dir=tmp_path)

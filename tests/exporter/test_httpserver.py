"""The exporter's HTTP/1.1 server over real sockets: persistent connections, bad requests, limits.

Scrapes through a real exporter are in test_cli, test_web_security and test_load; these tests
serve a small WSGI app with the same server, to reach what those can't: the connection a
request was answered on, pipelining, bytes that no HTTP client library sends.
"""

from __future__ import annotations

import http.client
import re
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

import pytest

from helpers.wait import wait_for
from trainguard.exporter.http import server as httpserver
from trainguard.exporter.http.app import make_http_server


def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
    body = f"{environ['REQUEST_METHOD']} {environ['PATH_INFO']}?{environ['QUERY_STRING']}"
    body += f" x={environ.get('HTTP_X_TEST', '')} input={environ['wsgi.input'].read()!r}\n"
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [body.encode()]


@pytest.fixture
def server() -> Iterator[httpserver.ExporterHTTPServer]:
    srv = make_http_server("127.0.0.1:0", app)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def port(srv: httpserver.ExporterHTTPServer) -> int:
    return int(srv.server_address[1])


def connection_threads() -> set[threading.Thread]:
    """The threads serving a connection now (of any server in this process)."""
    return {t for t in threading.enumerate() if "process_request_thread" in t.name}


def exchange(srv: httpserver.ExporterHTTPServer, data: bytes) -> bytes:
    """Send ``data`` on a new connection and read until the server closes it."""
    with socket.create_connection(("127.0.0.1", port(srv)), timeout=30) as s:
        s.sendall(data)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def test_requests_share_one_connection_and_thread(server: httpserver.ExporterHTTPServer) -> None:
    before = connection_threads()
    conn = http.client.HTTPConnection("127.0.0.1", port(server), timeout=30)
    conn.request("GET", "/metrics?a=1", headers={"X-Test": "one"})
    first = conn.getresponse()
    assert first.read() == b"GET /metrics?a=1 x=one input=b''\n"
    assert not first.will_close
    sock = conn.sock
    (own,) = connection_threads() - before  # this connection's thread
    threads = connection_threads() | {own}
    for i in range(20):
        conn.request("GET", f"/p%20{i}")
        r = conn.getresponse()
        assert r.status == 200
        assert r.read() == f"GET /p {i}? x= input=b''\n".encode()
        assert r.getheader("Content-Length") == str(len(f"GET /p {i}? x= input=b''\n"))
        assert r.getheader("Date")
    assert conn.sock is sock  # never reconnected
    assert connection_threads() <= threads  # no thread started for a request
    conn.close()
    wait_for(lambda: own not in connection_threads(), what="the connection's thread to end")


def test_pipelined_requests_are_answered_in_order(server: httpserver.ExporterHTTPServer) -> None:
    out = exchange(
        server,
        b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n"
        b"POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nxyz"
        b"\r\nGET /c HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    bodies = re.findall(rb"\r\n\r\n(\w+ /\w\? x= input=b'\w*'\n)", out)
    assert bodies == [
        b"GET /a? x= input=b''\n",
        b"POST /b? x= input=b'xyz'\n",
        b"GET /c? x= input=b''\n",
    ]
    assert out.count(b"HTTP/1.1 200 OK") == 3
    assert out.count(b"Connection: close") == 1


def test_http_1_0_closes_unless_asked_to_keep_alive(
    server: httpserver.ExporterHTTPServer,
) -> None:
    out = exchange(server, b"GET / HTTP/1.0\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 200 OK\r\n") and b"Connection: close\r\n" in out
    with socket.create_connection(("127.0.0.1", port(server)), timeout=30) as s:
        s.sendall(b"GET /1 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        first = s.recv(65536)
        assert b"Connection: keep-alive\r\n" in first and first.endswith(b"GET /1? x= input=b''\n")
        s.sendall(b"GET /2 HTTP/1.0\r\n\r\n")
        assert s.recv(65536).endswith(b"GET /2? x= input=b''\n")


def test_head_has_the_length_and_no_body(server: httpserver.ExporterHTTPServer) -> None:
    out = exchange(server, b"HEAD /h HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    head, _, body = out.partition(b"\r\n\r\n")
    assert b"Content-Length: 22\r\n" in head
    assert body == b""


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GET /\r\n\r\n", b"400 Bad Request"),
        (b"GET / HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n", b"400 Bad Request"),
        (b"GET / HTTP/1.1\r\nHost: x\r\nX-A : b\r\n\r\n", b"400 Bad Request"),
        (b"GET / HTTP/2.0\r\n\r\n", b"505 HTTP Version Not Supported"),
        (b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
         b"411 Length Required"),
        (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n",
         b"413 Content Too Large"),
        (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", b"400 Bad Request"),
        (b"GET / HTTP/1.1\r\nX: " + b"a" * 70000 + b"\r\n\r\n", b"431 Request Header Fields"),
    ],
)  # fmt: skip
def test_a_bad_request_gets_its_status_and_the_connection_closes(
    server: httpserver.ExporterHTTPServer, request_bytes: bytes, status: bytes
) -> None:
    out = exchange(server, request_bytes)
    assert out.startswith(b"HTTP/1.1 " + status), out[:200]
    assert b"Connection: close\r\n" in out


def test_an_app_that_raises_is_a_500_not_a_dead_server(caplog: pytest.LogCaptureFixture) -> None:
    def broken(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        if environ["PATH_INFO"] == "/boom":
            raise RuntimeError("boom")
        return app(environ, start_response)

    srv = make_http_server("127.0.0.1:0", broken)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        assert exchange(srv, b"GET /boom HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.1 500 ")
        assert b"200 OK" in exchange(
            srv, b"GET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        assert "boom" in caplog.text
    finally:
        srv.shutdown()
        srv.server_close()


def still_open(s: socket.socket) -> bool:
    """Whether the server has neither answered nor closed ``s`` (nothing to read yet)."""
    s.setblocking(False)
    try:
        s.recv(1)
    except BlockingIOError:
        return True
    finally:
        s.setblocking(True)
    return False


def test_a_connection_over_the_cap_closes_the_longest_idle_one_and_is_served(
    server: httpserver.ExporterHTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(httpserver, "MAX_CONNECTIONS", 3)
    conns = server.connections
    a, b, c = (socket.create_connection(("127.0.0.1", port(server)), timeout=30) for _ in "abc")
    socks = [a, b, c]
    try:
        for i, s in enumerate(socks):  # each answered, and kept open: idle, a the longest
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert s.recv(65536).startswith(b"HTTP/1.1 200 OK")
            wait_for(lambda i=i: len(conns.idle) == i + 1, what="the answered ones to be idle")
        d = socket.create_connection(("127.0.0.1", port(server)), timeout=30)
        socks.append(d)
        assert a.recv(1) == b""  # a made room, unanswered
        d.sendall(b"GET /d HTTP/1.1\r\nHost: x\r\n\r\n")
        assert d.recv(65536).startswith(b"HTTP/1.1 200 OK")
        wait_for(lambda: len(conns.idle) == 3, what="b, c and d to be idle")
        # b starts a request and stops half-way: idle ones go before it
        b.sendall(b"GET /b HTTP/1.1\r\n")
        wait_for(lambda: len(conns.reading) == 1, what="b's head to be seen as started")
        e = socket.create_connection(("127.0.0.1", port(server)), timeout=30)
        socks.append(e)
        assert c.recv(1) == b""  # c, the longest idle, made room
        assert still_open(b)
        e.sendall(b"GET /e HTTP/1.1\r\n")  # now b and e are mid-head, d idle
        wait_for(lambda: len(conns.reading) == 2, what="e's head to be seen as started")
        f = socket.create_connection(("127.0.0.1", port(server)), timeout=30)
        socks.append(f)
        assert d.recv(1) == b""  # d, idle since its answer, before either half-sent head
        assert still_open(b) and still_open(e)
        g = socket.create_connection(("127.0.0.1", port(server)), timeout=30)
        socks.append(g)
        assert b.recv(1) == b""  # then the head that started first (f, new, started later)
        for s in (f, g):  # the newest connections are served
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert s.recv(65536).startswith(b"HTTP/1.1 200 OK")
    finally:
        for s in socks:
            s.close()


def test_a_connection_being_answered_is_never_closed_to_make_room(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A slow answer (a collector at its deadline) keeps its connection: the new one waits."""
    monkeypatch.setattr(httpserver, "MAX_CONNECTIONS", 1)
    release = threading.Event()

    def slow(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        if environ["PATH_INFO"] == "/slow":
            release.wait(60)
        return app(environ, start_response)

    srv = make_http_server("127.0.0.1:0", slow)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        with socket.create_connection(("127.0.0.1", port(srv)), timeout=30) as busy:
            busy.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
            wait_for(lambda: len(srv.connections.busy) == 1, what="the slow request to start")
            out = exchange(srv, b"GET /new HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert b"GET /new?" in out  # admitted over the cap, and served
            release.set()
            assert busy.recv(65536).startswith(b"HTTP/1.1 200 OK")
    finally:
        release.set()
        srv.shutdown()
        srv.server_close()


def test_a_request_trickled_byte_by_byte_is_dropped_at_the_head_timeout(
    server: httpserver.ExporterHTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(httpserver, "HEAD_TIMEOUT_SECONDS", 1.0)
    with socket.create_connection(("127.0.0.1", port(server)), timeout=30) as s:
        started = time.monotonic()
        s.sendall(b"GET / HTTP/1.1\r\n")
        closed = False
        while time.monotonic() - started < 60:
            try:
                s.sendall(b"X")  # one byte every 0.1 s: each recv() well within its timeout
            except OSError:
                closed = True
                break
            s.settimeout(0.1)
            try:
                if s.recv(1) == b"":
                    closed = True
                    break
            except TimeoutError:
                pass
        assert closed, "the server kept reading a request that never ended"

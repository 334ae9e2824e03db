"""The exporter's HTTP/1.1 server: persistent connections, a thread per connection, WSGI apps.

Why not wsgiref's server (what prometheus_client serves with): it answers in HTTP/1.0 and closes
the connection after every response, so each scrape paid a TCP handshake, a new thread and
wsgiref's header parsing: at 8 GPUs, accepting and setting up the connection alone was a fifth
of the exporter's time holding the interpreter, and the whole change cut its CPU per scrape by a
quarter (bench/RESULTS.md, "seventh pass"). Prometheus keeps one connection per target open
between scrapes (Go's transport), as node_exporter's server does: here a connection keeps its
thread for as long as its client keeps it open (at most :data:`IDLE_TIMEOUT_SECONDS` between two
requests), and a request is parsed by :mod:`~trainguard.exporter.http.request`.

Why a new connection is never refused: anyone who reaches the port can open connections, and a
server that turns away the newest one when full lets a few hundred idle sockets lock Prometheus
out. So a connection over :data:`MAX_CONNECTIONS` makes room
(:mod:`~trainguard.exporter.http.connections`): the kept-alive connection idle
longest between two requests is closed, else the one whose request head (or, new, its wait for
one) started earliest; never the newest, nor one whose request is being answered. A request
head (and a TLS handshake) must arrive whole within :data:`HEAD_TIMEOUT_SECONDS` of its first
byte (of the connection, for the first request), as Go's ``ReadHeaderTimeout``, so that a
half-sent head, trickled or not, holds its thread briefly. The process's soft limit on open
files is raised to its hard limit at start, as Go's runtime does for every Go exporter, so that
the cap, not the file limit, is what fills.

Only what the exporter's pages need is spoken: GET, HEAD, OPTIONS (a body is read and dropped
when its length is given); no chunked bodies, no ``Expect``, no HTTP/2 (the web config refuses
it).
"""

from __future__ import annotations

import contextlib
import errno
import io
import logging
import socket
import socketserver
import ssl
import sys
import time
from collections.abc import Callable, Iterable
from email.utils import formatdate
from typing import Any
from urllib.parse import unquote

from trainguard.exporter.http.connections import Connections, raise_open_files_limit
from trainguard.exporter.http.request import BadRequest, Request, take_head

log = logging.getLogger(__name__)

#: a request head (and a TLS handshake) must arrive whole within this of its first byte, and a
#: new connection's first head within this of its accept (Prometheus sends a head at once)
HEAD_TIMEOUT_SECONDS = 10.0
#: a client that sends nothing for this long mid-body is dropped
CLIENT_TIMEOUT_SECONDS = 30.0
#: an open connection with no request for this long is closed (Prometheus scrapes far more
#: often; a client that comes back later reconnects, as Go's transport does on its own)
IDLE_TIMEOUT_SECONDS = 120.0
#: connections (threads) open at once; one more closes the longest idle one to make room
MAX_CONNECTIONS = 4096
#: open files kept free of connections (the collectors read files, TLS reads certificates)
RESERVED_FILES = 256

StartResponse = Callable[..., Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


class _Date:
    """The ``Date`` header's value, made again once a second rather than per response."""

    def __init__(self) -> None:
        self._second = -1
        self._value = ""

    def now(self) -> str:
        second = int(time.time())
        if second != self._second:
            self._value, self._second = formatdate(second, usegmt=True), second
        return self._value


def environ(request: Request, server: ExporterHTTPServer, client: Any) -> dict[str, Any]:
    """The WSGI environ (PEP 3333) of ``request``, as wsgiref's server makes it."""
    path, _, query = request.target.partition("?")
    if not path.startswith("/") and "://" in path:  # absolute-form, from a proxy
        path = "/" + path.partition("://")[2].partition("/")[2]
    env: dict[str, Any] = {
        "REQUEST_METHOD": request.method,
        "SCRIPT_NAME": "",
        "PATH_INFO": unquote(path, "iso-8859-1"),
        "QUERY_STRING": query,
        "SERVER_PROTOCOL": request.version,
        "SERVER_NAME": server.server_name,
        "SERVER_PORT": str(server.server_address[1]),
        "REMOTE_ADDR": client[0] if isinstance(client, tuple) else "",
        "CONTENT_TYPE": request.headers.get("content-type", ""),
        "CONTENT_LENGTH": request.headers.get("content-length", ""),
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "http" if server.ssl_context is None else "https",
        "wsgi.input": io.BytesIO(request.body),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
    }
    for key, value in request.headers.items():
        if key not in ("content-type", "content-length"):
            env["HTTP_" + key.upper().replace("-", "_")] = value
    return env


class _Connection(socketserver.BaseRequestHandler):
    """One client's connection: its requests answered in turn until either side closes it."""

    server: ExporterHTTPServer

    def handle(self) -> None:
        sock: socket.socket = self.request
        buffer = bytearray()
        first = True
        while True:
            try:
                head = self._read_head(sock, buffer, first)
                if head is None:
                    return
                first = False
                request = Request(head)
                length = request.body_length()
                request.body = self._read_exactly(sock, buffer, length)
            except BadRequest as exc:
                with contextlib.suppress(OSError):
                    sock.sendall(self._error(exc.status, str(exc)))
                return
            except (OSError, ssl.SSLError):
                return  # the client went away, or stopped talking
            if not self._answer(sock, request):
                return

    def _read_head(self, sock: socket.socket, buffer: bytearray, first: bool) -> bytes | None:
        """The next request's line and headers; None if the client closed or took too long."""
        conns = self.server.connections
        deadline, started = None, first
        if first:  # a new connection: its first head within the head timeout of the accept
            deadline = self.server.accepted.pop(sock, time.monotonic()) + HEAD_TIMEOUT_SECONDS
        elif not buffer:
            conns.move(sock, conns.idle)
        while True:
            head = take_head(buffer)
            if head is not None:
                conns.move(sock, conns.busy)
                return head
            if buffer and not started:
                # a request started: the whole head within the head timeout, so that one
                # byte every few seconds can't hold the connection open for ever
                started = True
                deadline = deadline or time.monotonic() + HEAD_TIMEOUT_SECONDS
                conns.move(sock, conns.reading)
            if deadline is None:
                sock.settimeout(IDLE_TIMEOUT_SECONDS)
            else:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                sock.settimeout(left)
            chunk = sock.recv(65536)
            if not chunk:
                return None
            buffer += chunk

    @staticmethod
    def _read_exactly(sock: socket.socket, buffer: bytearray, length: int) -> bytes:
        sock.settimeout(CLIENT_TIMEOUT_SECONDS)
        while len(buffer) < length:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("the client closed the connection mid-body")
            buffer += chunk
        body = bytes(buffer[:length])
        del buffer[:length]
        return body

    def _answer(self, sock: socket.socket, request: Request) -> bool:
        """Send the app's response to ``request``; whether the connection stays open."""
        env = environ(request, self.server, self.client_address)
        response: list[Any] = []
        written: list[bytes] = []

        def start_response(status: str, headers: list[tuple[str, str]], *exc_info: Any) -> Any:
            response[:] = [status, headers]
            return written.append

        try:
            returned = self.server.app(env, start_response)
            try:
                written.extend(returned)
            finally:
                close = getattr(returned, "close", None)
                if close is not None:
                    close()
            status, headers = response
        except Exception:
            log.exception("error answering %s %s", request.method, request.target[:200])
            sock.sendall(self._error("500 Internal Server Error", "internal error"))
            return False
        keep = request.keep_alive and not self.server.closing
        connection = "keep-alive" if keep and request.version == "HTTP/1.0" else None
        head, body = self._response(status, headers, b"".join(written), keep, connection)
        sock.settimeout(CLIENT_TIMEOUT_SECONDS)
        sock.sendall(head if request.method == "HEAD" else head + body)
        return keep

    def _error(self, status: str, message: str) -> bytes:
        """A response that explains ``status`` and closes the connection."""
        body = f"{status}: {message}\n".encode()
        head, body = self._response(
            status, [("Content-Type", "text/plain; charset=utf-8")], body, False, None
        )
        return head + body

    def _response(
        self,
        status: str,
        headers: list[tuple[str, str]],
        body: bytes,
        keep: bool,
        connection: str | None,
    ) -> tuple[bytes, bytes]:
        """The status line and headers of a response of ``body`` (``Date``, length added)."""
        lines = [f"HTTP/1.1 {status}", f"Date: {self.server.date.now()}"]
        lines.extend(f"{name}: {value}" for name, value in headers)
        if not any(name.lower() == "content-length" for name, _ in headers):
            lines.append(f"Content-Length: {len(body)}")
        if not keep:
            lines.append("Connection: close")
        elif connection:
            lines.append(f"Connection: {connection}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"), body


class ExporterHTTPServer(socketserver.ThreadingMixIn, socketserver.TCPServer):
    """Serves ``app`` on ``address`` (a host and port), TLS on when ``ssl_context`` is given.

    ``serve_forever``, ``shutdown`` and ``server_close`` are socketserver's.
    """

    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    #: a burst of connecting clients waits in the kernel's queue (capped at its somaxconn)
    request_queue_size = 4096

    def __init__(
        self,
        address: tuple[str, int],
        app: WSGIApp,
        ssl_context: ssl.SSLContext | None = None,
        family: socket.AddressFamily = socket.AF_INET,
    ) -> None:
        self.address_family = family
        self.app = app
        self.ssl_context = ssl_context
        self.date = _Date()
        self.closing = False
        self.connections = Connections()
        #: when each connection not yet in its thread was accepted (its first head's deadline)
        self.accepted: dict[socket.socket, float] = {}
        self.open_files = raise_open_files_limit()
        super().__init__(address, _Connection)
        self.server_name = str(self.server_address[0])

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6:
            with contextlib.suppress(OSError):
                self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()

    def get_request(self) -> tuple[socket.socket, Any]:
        try:
            sock, addr = self.socket.accept()
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                self.connections.evict_one()  # the next accept has a file to take
            raise
        self.accepted[sock] = time.monotonic()
        sock.settimeout(HEAD_TIMEOUT_SECONDS)
        if self.ssl_context is not None:
            tls = self.ssl_context.wrap_socket(
                sock, server_side=True, do_handshake_on_connect=False
            )
            self.accepted[tls] = self.accepted.pop(sock)
            sock = tls
        return sock, addr

    def verify_request(self, request: Any, client_address: Any) -> bool:
        limit = min(MAX_CONNECTIONS, max(self.open_files - RESERVED_FILES, 16))
        self.connections.admit(request, limit)
        return True

    def finish_request(self, request: Any, client_address: Any) -> None:
        try:
            if isinstance(request, ssl.SSLSocket):
                try:
                    # the socket's timeout, set at the accept, bounds the whole handshake, not
                    # each read (CPython's do_handshake keeps one deadline for its loop)
                    request.do_handshake()
                except (OSError, ssl.SSLError):
                    return  # a client that can't complete TLS in time gets nothing
            super().finish_request(request, client_address)
        finally:
            self.accepted.pop(request, None)
            self.connections.remove(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-response is not the exporter's error."""

    def shutdown(self) -> None:
        self.closing = True
        super().shutdown()

"""The exporter's HTTP/1.1 server: persistent connections, a thread per connection, WSGI apps.

Why not wsgiref's server (what prometheus_client serves with): it answers in HTTP/1.0 and closes
the connection after every response, so each scrape paid a TCP handshake, a new thread and
wsgiref's header parsing: at 8 GPUs, accepting and setting up the connection alone was a fifth
of the exporter's time holding the interpreter, and the whole change cut its CPU per scrape by a
quarter (bench/RESULTS.md, "seventh pass"). Prometheus keeps one connection per target open
between scrapes (Go's transport), as node_exporter's server does: here a connection keeps its
thread for as long as its client keeps it open (at most :data:`IDLE_TIMEOUT_SECONDS` between two
requests), and a request is parsed with a few byte operations. A slow or stuck client holds only
its own thread, TLS handshakes included (they happen on that thread, not in the accept loop),
and at most :data:`MAX_CONNECTIONS` connections are open at once.

Only what the exporter's pages need is spoken: GET, HEAD and OPTIONS (a request body is read
and discarded when its length is given), no chunked request bodies, no ``Expect`` handling,
no HTTP/2 (the web config refuses to ask for it).
"""

from __future__ import annotations

import contextlib
import io
import logging
import socket
import socketserver
import ssl
import sys
import threading
import time
from collections.abc import Callable, Iterable
from email.utils import formatdate
from typing import Any
from urllib.parse import unquote

log = logging.getLogger(__name__)

#: a client that sends nothing for this long mid-request (or mid-handshake) is dropped, so that
#: it can't hold a thread forever
CLIENT_TIMEOUT_SECONDS = 30.0
#: an open connection with no request for this long is closed (Prometheus scrapes far more
#: often; a client that comes back later reconnects, as Go's transport does on its own)
IDLE_TIMEOUT_SECONDS = 120.0
#: connections open at once (a thread each); one over is closed at once
MAX_CONNECTIONS = 256
#: the request line and headers, at most (Go's net/http allows 1 MiB; no scrape sends 1 KiB)
MAX_HEAD_BYTES = 64 * 1024
#: a request body, at most (the exporter's pages take none: it is read and dropped)
MAX_BODY_BYTES = 64 * 1024

StartResponse = Callable[..., Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


class _BadRequest(Exception):
    """A request this server answers with ``status`` and then closes the connection on."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status


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


class _Request:
    """One parsed request: what the WSGI environ is made of, and whether to keep the connection."""

    __slots__ = ("body", "headers", "keep_alive", "method", "target", "version")

    def __init__(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\n")
        parts = lines[0].rstrip("\r").split(" ")
        if len(parts) != 3 or not parts[0] or not parts[1]:
            raise _BadRequest("400 Bad Request", f"malformed request line {lines[0][:100]!r}")
        self.method, self.target, self.version = parts
        if self.version not in ("HTTP/1.1", "HTTP/1.0"):
            raise _BadRequest(
                "505 HTTP Version Not Supported", f"{self.version[:20]!r}: HTTP/1.1 and 1.0 only"
            )
        self.headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.rstrip("\r").partition(":")
            if not sep or not name or name != name.strip():
                raise _BadRequest("400 Bad Request", f"malformed header line {line[:100]!r}")
            key = name.lower()
            value = value.strip(" \t")
            old = self.headers.get(key)
            self.headers[key] = value if old is None else f"{old}, {value}"
        connection = self.headers.get("connection", "").lower()
        if self.version == "HTTP/1.1":
            self.keep_alive = "close" not in connection
        else:
            self.keep_alive = "keep-alive" in connection
        self.body = b""

    def body_length(self) -> int:
        if "transfer-encoding" in self.headers:
            raise _BadRequest("411 Length Required", "chunked request bodies are not accepted")
        text = self.headers.get("content-length", "0")
        if not text.isdigit():
            raise _BadRequest("400 Bad Request", f"Content-Length {text[:30]!r}: not a length")
        if int(text) > MAX_BODY_BYTES:
            raise _BadRequest(
                "413 Content Too Large", f"a body of {text} bytes (at most {MAX_BODY_BYTES})"
            )
        return int(text)

    def environ(self, server: ExporterHTTPServer, client: Any) -> dict[str, Any]:
        """The WSGI environ (PEP 3333) of this request, as wsgiref's server makes it."""
        path, _, query = self.target.partition("?")
        if not path.startswith("/") and "://" in path:  # absolute-form, from a proxy
            path = "/" + path.partition("://")[2].partition("/")[2]
        env: dict[str, Any] = {
            "REQUEST_METHOD": self.method,
            "SCRIPT_NAME": "",
            "PATH_INFO": unquote(path, "iso-8859-1"),
            "QUERY_STRING": query,
            "SERVER_PROTOCOL": self.version,
            "SERVER_NAME": server.server_name,
            "SERVER_PORT": str(server.server_address[1]),
            "REMOTE_ADDR": client[0] if isinstance(client, tuple) else "",
            "CONTENT_TYPE": self.headers.get("content-type", ""),
            "CONTENT_LENGTH": self.headers.get("content-length", ""),
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": "http" if server.ssl_context is None else "https",
            "wsgi.input": io.BytesIO(self.body),
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": True,
            "wsgi.multiprocess": False,
            "wsgi.run_once": False,
        }
        for key, value in self.headers.items():
            if key not in ("content-type", "content-length"):
                env["HTTP_" + key.upper().replace("-", "_")] = value
        return env


class _Connection(socketserver.BaseRequestHandler):
    """One client's connection: its requests answered in turn until either side closes it."""

    server: ExporterHTTPServer

    def handle(self) -> None:
        sock: socket.socket = self.request
        buffer = bytearray()
        while True:
            try:
                head = self._read_head(sock, buffer)
                if head is None:
                    return
                request = _Request(head)
                length = request.body_length()
                request.body = self._read_exactly(sock, buffer, length)
            except _BadRequest as exc:
                with contextlib.suppress(OSError):
                    sock.sendall(self._error(exc.status, str(exc)))
                return
            except (OSError, ssl.SSLError):
                return  # the client went away, or stopped talking
            if not self._answer(sock, request):
                return

    def _read_head(self, sock: socket.socket, buffer: bytearray) -> bytes | None:
        """The next request's line and headers; None when the client closed between requests."""
        sock.settimeout(IDLE_TIMEOUT_SECONDS if not buffer else CLIENT_TIMEOUT_SECONDS)
        deadline = None
        while True:
            end = buffer.find(b"\r\n\r\n")
            size = 4
            if end < 0:
                end, size = buffer.find(b"\n\n"), 2
            if end > MAX_HEAD_BYTES or (end < 0 and len(buffer) > MAX_HEAD_BYTES):
                raise _BadRequest(
                    "431 Request Header Fields Too Large",
                    f"a request line and headers of over {MAX_HEAD_BYTES} bytes",
                )
            if end >= 0:
                head = bytes(buffer[:end]).lstrip(b"\r\n")
                del buffer[: end + size]
                if head:
                    return head
                continue  # blank lines before a request line are allowed (RFC 9112, 2.2)
            if buffer:
                # a request started: the whole of it within the client timeout, so that one
                # byte every few seconds can't hold the connection open for ever
                now = time.monotonic()
                deadline = deadline or now + CLIENT_TIMEOUT_SECONDS
                if now >= deadline:
                    return None
                sock.settimeout(deadline - now)
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

    def _answer(self, sock: socket.socket, request: _Request) -> bool:
        """Send the app's response to ``request``; whether the connection stays open."""
        environ = request.environ(self.server, self.client_address)
        response: list[Any] = []
        written: list[bytes] = []

        def start_response(status: str, headers: list[tuple[str, str]], *exc_info: Any) -> Any:
            response[:] = [status, headers]
            return written.append

        try:
            returned = self.server.app(environ, start_response)
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
    #: a burst of connecting scrapers waits in the kernel's queue rather than being dropped
    request_queue_size = 128

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
        self._open = 0
        self._open_lock = threading.Lock()
        super().__init__(address, _Connection)
        self.server_name = str(self.server_address[0])

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6:
            with contextlib.suppress(OSError):
                self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = self.socket.accept()
        sock.settimeout(CLIENT_TIMEOUT_SECONDS)
        if self.ssl_context is not None:
            sock = self.ssl_context.wrap_socket(
                sock, server_side=True, do_handshake_on_connect=False
            )
        return sock, addr

    def verify_request(self, request: Any, client_address: Any) -> bool:
        with self._open_lock:
            if self._open >= MAX_CONNECTIONS:
                return False
            self._open += 1
            return True

    def finish_request(self, request: Any, client_address: Any) -> None:
        try:
            if isinstance(request, ssl.SSLSocket):
                try:
                    request.do_handshake()
                except (OSError, ssl.SSLError):
                    return  # a client that can't complete TLS gets nothing
            super().finish_request(request, client_address)
        finally:
            with self._open_lock:
                self._open -= 1

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-response is not the exporter's error."""

    def shutdown(self) -> None:
        self.closing = True
        super().shutdown()

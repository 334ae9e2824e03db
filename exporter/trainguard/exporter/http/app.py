"""The HTTP side: landing page, health endpoint and the metrics.

They are served by :mod:`~trainguard.exporter.http.server`, a thread per connection, so that a slow
client never holds up another scrape.
"""

from __future__ import annotations

import gzip
import html
import math
import socket
import ssl
from collections.abc import Iterable
from typing import Any

from prometheus_client.exposition import gzip_accepted

from trainguard._version import __version__
from trainguard.exporter.http import runbook
from trainguard.exporter.http.server import ExporterHTTPServer, StartResponse, WSGIApp
from trainguard.exporter.http.webconfig import BasicAuth, WebConfig
from trainguard.exporter.scrape.collector import ExporterRegistry
from trainguard.exporter.scrape.exposition import TextWriter

#: Prometheus asks for gzip at every scrape, and prometheus_client compresses at level 9:
#: ~1.5 ms of a scrape for an 85 KB response, to save 15% of the bytes level 1 leaves
#: (10 KB vs 8.7 KB) at a seventh of the CPU. On loopback or a LAN the bytes don't matter.
GZIP_LEVEL = 1
#: the Prometheus text format 0.0.4, what generate_latest writes
TEXT_FORMAT = "text/plain; version=0.0.4; charset=utf-8"
#: the scrape's deadline is Prometheus's scrape timeout (its X-Prometheus-Scrape-Timeout-Seconds
#: header) less this, for the response to travel back, as blackbox_exporter's --timeout-offset
SCRAPE_TIMEOUT_OFFSET = 0.5


def parse_listen_address(address: str) -> tuple[str, int]:
    """``host:port``, ``:port`` (all interfaces) or ``[v6addr]:port``."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT such as ':9636' or '127.0.0.1:9636', got {address!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def landing_page(telemetry_path: str) -> bytes:
    path = html.escape(telemetry_path, quote=True)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>trainguard exporter</title></head>
<body>
<h1>trainguard exporter</h1>
<p>Tells within one scrape that a GPU training run died, stalled, holds ghost memory or left a
truncated checkpoint.</p>
<ul>
<li><a href="{path}">Metrics</a></li>
<li><a href="/-/healthy">Health</a></li>
<li><a href="/runbook">Runbook</a> (each alert's runbook_url points at its section)</li>
</ul>
<p>Version {html.escape(__version__)}</p>
</body></html>
""".encode()


def client_timeout(header: str | None) -> float | None:
    """The seconds a client gives a scrape, from its X-Prometheus-Scrape-Timeout-Seconds header.

    That header less :data:`SCRAPE_TIMEOUT_OFFSET` (but at least half of it); None without a
    usable header (then the exporter's own ``--collector.timeout`` applies, as it caps this
    one).
    """
    try:
        seconds = float(header) if header else math.nan
    except ValueError:
        return None
    if not 0 < seconds < math.inf:
        return None
    return max(seconds - SCRAPE_TIMEOUT_OFFSET, seconds / 2)


def metrics_app(registry: ExporterRegistry) -> WSGIApp:
    """The metrics app: each request is collected within its own deadline.

    It sees the registry through
    :meth:`~trainguard.exporter.scrape.collector.ExporterRegistry.within`, so that nothing is shared
    between two concurrent scrapes but the collectors themselves (and the text writer's caches
    of the last page, which it keeps safe across threads).
    """
    writer = TextWriter()

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD")
        if method == "OPTIONS":
            start_response("200 OK", [("Allow", "OPTIONS,GET")])
            return [b""]
        if method != "GET":
            start_response("405 Method Not Allowed", [("Allow", "OPTIONS,GET")])
            return [f"# HTTP 405 Method Not Allowed: {method}; use OPTIONS or GET\n".encode()]
        timeout = client_timeout(environ.get("HTTP_X_PROMETHEUS_SCRAPE_TIMEOUT_SECONDS"))
        output = writer.render(registry.within(timeout).collect())
        start_response("200 OK", [("Content-Type", TEXT_FORMAT)])
        return [output]

    return app


def make_app(
    registry: ExporterRegistry, telemetry_path: str, web: WebConfig | None = None
) -> WSGIApp:
    """The exporter's one WSGI app: the landing page, ``/metrics``, ``/-/healthy``, ``/runbook``.

    Basic auth and the extra headers of the web config apply to every path alike, so that no
    page of a protected exporter is left open by accident.
    """
    metrics = _gzip(metrics_app(registry))
    landing = landing_page(telemetry_path)
    runbook_page = runbook.page()
    auth = BasicAuth(web.users if web else {})
    extra_headers = list((web.headers if web else {}).items())

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        def respond(status: str, headers: list[tuple[str, str]], *rest: Any) -> Any:
            return start_response(status, headers + extra_headers, *rest)

        if auth and not auth.check(environ.get("HTTP_AUTHORIZATION")):
            respond(
                "401 Unauthorized",
                [
                    ("Content-Type", "text/plain; charset=utf-8"),
                    ("WWW-Authenticate", 'Basic realm="trainguard", charset="UTF-8"'),
                ],
            )
            return [b"Unauthorized\n"]
        return route(environ, respond)

    def route(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == telemetry_path:
            # the Prometheus text format whatever the client prefers, as node_exporter serves by
            # default: OpenMetrics adds nothing to these metrics (no exemplars, units or created
            # timestamps), and prometheus_client's OpenMetrics writer escapes every sample's
            # name character by character, which doubles the cost of a scrape
            return metrics(environ, start_response)
        if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Allow", "GET, HEAD")])
            return [b"method not allowed\n"]
        if path == "/":
            start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
            return [landing]
        if path == "/-/healthy":
            start_response("200 OK", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"Healthy\n"]
        if path == "/runbook":
            if runbook_page is None:
                start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
                return [b"no runbook: this installation was built without alerts/runbook.md\n"]
            start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
            return [runbook_page]
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [b"not found\n"]

    return app


def _gzip(app: WSGIApp) -> WSGIApp:
    """``app`` with its response gzipped at :data:`GZIP_LEVEL` for clients that accept it."""

    def gzipped(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if not gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", "")):
            return app(environ, start_response)
        response: list[Any] = []
        written: list[bytes] = []

        def capture(status: str, headers: list[tuple[str, str]], *rest: Any) -> Any:
            response[:] = [status, headers]
            return written.append

        returned = b"".join(app(environ, capture))
        body = b"".join(written) + returned
        status, headers = response
        if status.startswith("200 ") and body:
            body = gzip.compress(body, compresslevel=GZIP_LEVEL, mtime=0)
            headers = [*headers, ("Content-Encoding", "gzip")]
        start_response(status, headers)
        return [body]

    return gzipped


def make_http_server(
    address: str, app: WSGIApp, ssl_context: ssl.SSLContext | None = None
) -> ExporterHTTPServer:
    """Bind ``address``; an empty host means every interface, IPv6 and IPv4 where possible."""
    host, port = parse_listen_address(address)
    family = socket.AF_INET
    if host == "":
        if socket.has_ipv6:
            family, host = socket.AF_INET6, "::"
        else:
            host = "0.0.0.0"
    elif ":" in host:
        family = socket.AF_INET6
    else:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family = infos[0][0]
    try:
        return ExporterHTTPServer((host, port), app, ssl_context, family)
    except OSError:
        if host != "::":
            raise
        # no IPv6 on this host: fall back to every IPv4 interface
        return ExporterHTTPServer(("0.0.0.0", port), app, ssl_context, socket.AF_INET)

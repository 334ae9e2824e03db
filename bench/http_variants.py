"""The exporter served by another HTTP server, for bench_scrape.py's ``--http-servers``.

    python bench/http_variants.py {cheroot,waitress,h11} EXPORTER-ARGS...

Why a shim and not a flag of the exporter: the comparison needs the very same exporter (config,
collectors, app) with only the server changed, and the servers not adopted have no place in the
package. cheroot and waitress come from ``TRAINGUARD_BENCH_LIBS`` (a ``pip install --target``
folder) when they are not installed. ``h11`` is our connection threads (accept loop, thread per
connection, keep-alive) with h11 parsing the requests and framing the responses in place of
trainguard.exporter.http.request.
"""

from __future__ import annotations

import os
import socketserver
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "exporter"), *filter(None, [os.environ.get("TRAINGUARD_BENCH_LIBS")])]

from trainguard.exporter import cli  # noqa: E402
from trainguard.exporter.http import server as ours  # noqa: E402
from trainguard.exporter.http.app import parse_listen_address  # noqa: E402


class Cheroot:
    """cheroot's WSGI server (CherryPy's): a thread pool, keep-alive, TLS adapters."""

    def __init__(self, host: str, port: int, app: Any) -> None:
        from cheroot import wsgi

        # its backlog of 5 by default drops connection bursts (the client resends its SYN a
        # second later): as deep as ours, so that only the serving differs
        self.server = wsgi.Server((host, port), app, numthreads=10, request_queue_size=4096)
        self.server_address = (host, port)

    def serve_forever(self) -> None:
        self.server.safe_start()

    def shutdown(self) -> None:
        self.server.stop()

    def server_close(self) -> None:
        pass


class Waitress:
    """waitress: an asyncore loop reading requests whole, a thread pool answering them."""

    def __init__(self, host: str, port: int, app: Any) -> None:
        from waitress.server import create_server

        # by default it stops accepting at 100 connections and select()s, which fails past fd
        # 1024: poll() and a limit as high as ours
        self.server = create_server(
            app, host=host, port=port, threads=4, connection_limit=4096, asyncore_use_poll=True
        )
        self.server_address = (host, port)

    def serve_forever(self) -> None:
        self.server.run()

    def shutdown(self) -> None:
        self.server.close()

    def server_close(self) -> None:
        pass


class H11Connection(socketserver.BaseRequestHandler):
    """One connection: h11 parses each request and frames each response."""

    server: ours.ExporterHTTPServer

    def handle(self) -> None:
        import h11

        sock = self.request
        sock.settimeout(ours.IDLE_TIMEOUT_SECONDS)
        conn = h11.Connection(h11.SERVER)
        while True:
            try:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(sock.recv(65536))
                    continue
                if isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                    return
                if not isinstance(event, h11.Request):
                    continue
                body = b""
                while not isinstance(ev := conn.next_event(), h11.EndOfMessage):
                    if ev is h11.NEED_DATA:
                        conn.receive_data(sock.recv(65536))
                    elif isinstance(ev, h11.Data):
                        body += ev.data
            except h11.RemoteProtocolError as exc:
                sock.sendall(f"HTTP/1.1 {exc.error_status_hint} Bad Request\r\n\r\n".encode())
                return
            except OSError:
                return
            status, headers, data = self._call(event, body)
            out = conn.send(h11.Response(status_code=status, headers=headers))
            out += conn.send(h11.Data(data=data)) + conn.send(h11.EndOfMessage())
            sock.sendall(out)
            if conn.our_state is h11.MUST_CLOSE:
                return
            conn.start_next_cycle()

    def _call(self, event: Any, body: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        target = event.target.decode("latin-1")
        path, _, query = target.partition("?")
        env: dict[str, Any] = {
            "REQUEST_METHOD": event.method.decode(),
            "SCRIPT_NAME": "",
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "SERVER_PROTOCOL": "HTTP/" + event.http_version.decode(),
            "wsgi.input": __import__("io").BytesIO(body),
            "wsgi.url_scheme": "http",
        }
        for name, value in event.headers:
            env["HTTP_" + name.decode().upper().replace("-", "_")] = value.decode("latin-1")
        response: list[Any] = []
        chunks = list(self.server.app(env, lambda s, h, *e: response.extend([s, h])))
        data = b"".join(chunks)
        headers = [(n.encode(), v.encode()) for n, v in response[1]]
        headers.append((b"Content-Length", str(len(data)).encode()))
        return int(response[0].split()[0]), headers, data


def main() -> None:
    variant, sys.argv[1:] = sys.argv[1], sys.argv[2:]

    def make(address: str, app: Any, ssl_context: Any = None) -> Any:
        host, port = parse_listen_address(address)
        if variant == "cheroot":
            return Cheroot(host, port, app)
        if variant == "waitress":
            return Waitress(host, port, app)
        srv = ours.ExporterHTTPServer((host, port), app)
        srv.RequestHandlerClass = H11Connection
        return srv

    cli.make_http_server = make  # type: ignore[assignment]
    sys.exit(cli.main())


if __name__ == "__main__":
    main()

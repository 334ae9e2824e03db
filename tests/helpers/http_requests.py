"""Our request parser run over a byte stream as the server runs it, and h11 run over the same
bytes: for the property tests and the fuzz harness of trainguard.exporter.http.request.

Why a second parser: a request smuggled past a proxy is one where two parsers split the same
bytes differently. h11 (python-hyper's HTTP/1.1 state machine) is the reference here: whatever
ours accepts, h11 must read as the same requests with the same bodies. Ours may refuse more.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import h11

from trainguard.exporter.http.request import MAX_BODY_BYTES, BadRequest, Request, take_head


@dataclass(frozen=True)
class Parsed:
    method: str
    target: str
    version: str
    headers: tuple[tuple[str, str], ...]  # (lower-case name, value), duplicates joined by ", "
    body: bytes
    keep_alive: bool
    #: empty lines came before its request line: RFC 9112 2.2 says a server SHOULD ignore
    #: them, as ours does (old clients send a CRLF after a POST body); h11 refuses them
    after_blank: bool = field(default=False, compare=False)


def ours(data: bytes) -> tuple[list[Parsed], BadRequest | None]:
    """The requests the server would answer from ``data``, in order, and the error it would
    answer (then close) on; it stops, as the server does, after a request that closes."""
    buffer = bytearray(data)
    out: list[Parsed] = []
    while True:
        blank = buffer[:1] == b"\n" or buffer[:2] == b"\r\n"
        try:
            head = take_head(buffer)
            if head is None:
                return out, None
            request = Request(head)
            length = request.body_length()
        except BadRequest as exc:
            return out, exc
        if len(buffer) < length:
            return out, None  # the server would wait for the rest of the body
        body = bytes(buffer[:length])
        del buffer[:length]
        out.append(
            Parsed(
                request.method,
                request.target,
                request.version,
                tuple(sorted(request.headers.items())),
                body,
                request.keep_alive,
                blank,
            )
        )
        if not request.keep_alive:
            return out, None


def reference(data: bytes, limit: int) -> list[Parsed]:
    """The first ``limit`` requests h11 reads from ``data`` (fewer where it stops or refuses)."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=1 << 20)
    conn.receive_data(data)
    conn.receive_data(b"")  # the client is done sending
    out: list[Parsed] = []
    while len(out) < limit:
        try:
            event = conn.next_event()
            if not isinstance(event, h11.Request):
                return out
            body = b""
            while not isinstance(ev := conn.next_event(), h11.EndOfMessage):
                if not isinstance(ev, h11.Data):
                    return out
                body += ev.data
        except h11.RemoteProtocolError:
            return out
        headers: dict[str, str] = {}
        for name, value in event.headers:
            key, text = name.decode("latin-1"), value.decode("latin-1")
            headers[key] = text if key not in headers else f"{headers[key]}, {text}"
        out.append(
            Parsed(
                event.method.decode("latin-1"),
                event.target.decode("latin-1"),
                "HTTP/" + event.http_version.decode(),
                tuple(sorted(headers.items())),
                body,
                conn.their_state is not h11.MUST_CLOSE,
            )
        )
        # answered as the exporter answers: a CONNECT gets 405 and the connection stays HTTP
        # (a 2xx would switch h11 to the tunnel the client asked for)
        status = 405 if event.method == b"CONNECT" else 200
        conn.send(h11.Response(status_code=status, headers=[("Content-Length", "0")]))
        conn.send(h11.EndOfMessage())
        if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
            return out
        conn.start_next_cycle()
    return out


TOKEN = frozenset("!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")


def check(data: bytes) -> None:
    """What must hold for any bytes: only BadRequest, sound requests, and h11 agrees."""
    requests, _ = ours(data)
    for r in requests:
        assert r.method and set(r.method) <= TOKEN, r
        assert r.target and all("\x21" <= c <= "\x7e" for c in r.target), r
        assert r.version in ("HTTP/1.0", "HTTP/1.1"), r
        for name, value in r.headers:
            assert name and set(name) <= TOKEN and name == name.lower(), r
            assert not any(c in value for c in "\r\n\0"), r
        assert "transfer-encoding" not in dict(r.headers), r
        assert len(r.body) <= MAX_BODY_BYTES
        assert r.version == "HTTP/1.0" or "host" in dict(r.headers), r
    for i, r in enumerate(requests):
        if r.after_blank:  # h11 stops there: compare what comes before
            del requests[i:]
            break
    if not requests:
        return
    theirs = reference(data, len(requests))
    # h11 reads the same requests at the same boundaries: nothing ours answers is read as
    # something else by a parser in front of it (h11 may stop sooner: it keeps no HTTP/1.0
    # connection open, and keep-alive is compared only where both go on)
    for a, b in zip(requests, theirs, strict=False):
        assert _same(a) == _same(b), (a, b)
    assert len(theirs) == len(requests) or not theirs[-1].keep_alive, (requests, theirs)


def _same(r: Parsed) -> tuple[object, ...]:
    """What two parsers must agree on: h11 folds repeated equal Content-Lengths into one, so
    the length is compared as the body it framed."""
    headers = tuple((n, v) for n, v in r.headers if n != "content-length")
    return r.method, r.target, r.version, headers, r.body

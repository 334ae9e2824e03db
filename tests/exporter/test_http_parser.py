"""The request parser against what a maintained one is held to: the malformed requests of RFC
9110/9112 (smuggling through Content-Length and Transfer-Encoding, obs-fold, bare CR and LF)
over real sockets, and property tests over heads, bodies and pipelining, with h11 as the
reference parser (tests/helpers/http_requests.py). The coverage-guided fuzz run of the same
check is tests/fuzz/fuzz_http_request.py (test_atheris_http_fuzz_run, below)."""

from __future__ import annotations

import importlib.util
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.http_requests import Parsed, check, ours, reference
from helpers.paths import DATA, TESTS
from trainguard.exporter.http.app import make_http_server
from trainguard.exporter.http.server import ExporterHTTPServer


def echo(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
    body = f"{environ['REQUEST_METHOD']} {environ['PATH_INFO']} {environ['wsgi.input'].read()!r}"
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [body.encode() + b"\n"]


@pytest.fixture(scope="module")
def server() -> Iterator[ExporterHTTPServer]:
    srv = make_http_server("127.0.0.1:0", echo)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def exchange(srv: ExporterHTTPServer, chunks: list[bytes]) -> bytes:
    """Send ``chunks`` one by one on a new connection; read until the server closes it."""
    with socket.create_connection(("127.0.0.1", int(srv.server_address[1])), timeout=30) as s:
        for chunk in chunks:
            s.sendall(chunk)
        s.shutdown(socket.SHUT_WR)
        out = []
        while data := s.recv(65536):
            out.append(data)
        return b"".join(out)


H = b"Host: x\r\n"
SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"

# (request bytes, status of the one answer); each is followed on the wire by SMUGGLED, which
# must never be answered: the connection closes after the error
MALFORMED = {
    # RFC 9112 6.1/6.3: both framings present, the classic desync (CL.TE and TE.CL)
    "CL.TE": (b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n"
              b"\r\n0\r\n\r\n", b"411"),
    "TE.CL": (b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n"
              b"\r\n5\r\nxyzzy\r\n0\r\n\r\n", b"411"),
    "TE with odd case and tab": (b"POST / HTTP/1.1\r\n" + H + b"transfer-ENCODING:\tchunked\r\n"
                                 b"\r\n0\r\n\r\n", b"411"),
    "TE obfuscated": (b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: xchunked\r\n\r\n", b"411"),
    "TE space before colon": (b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding : chunked\r\n"
                              b"\r\n0\r\n\r\n", b"400"),
    # RFC 9110 8.6: differing lengths, in two fields or one list
    "two Content-Lengths": (b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 3\r\n"
                            b"Content-Length: 5\r\n\r\nxyzzy", b"400"),
    "Content-Length list": (b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 3, 5\r\n\r\nxyzzy",
                            b"400"),
    "Content-Length signed": (b"POST / HTTP/1.1\r\n" + H + b"Content-Length: +3\r\n\r\nxyz",
                              b"400"),
    "Content-Length hex": (b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 0x3\r\n\r\nxyz", b"400"),
    "Content-Length superscript digit": (b"POST / HTTP/1.1\r\n" + H + b"Content-Length: \xb2\r\n"
                                         b"\r\nxy", b"400"),
    "Content-Length empty": (b"POST / HTTP/1.1\r\n" + H + b"Content-Length:\r\n\r\n", b"400"),
    # RFC 9112 5.2: obs-fold, a header line continued on the next
    "obs-fold": (b"GET / HTTP/1.1\r\n" + H + b"X-A: b\r\n c\r\n\r\n", b"400"),
    "obs-fold with tab hiding a Content-Length": (b"POST / HTTP/1.1\r\n" + H + b"X-A: b\r\n"
                                                  b"\tContent-Length: 3\r\n\r\nxyz", b"400"),
    # RFC 9112 2.2: a bare CR is invalid (a bare LF as a line end is allowed: see below)
    "bare CR in a value": (b"GET / HTTP/1.1\r\n" + H + b"X-A: b\rContent-Length: 3\r\n\r\nxyz",
                           b"400"),
    "bare CR ending a line": (b"GET / HTTP/1.1\r" + H + b"\r\n", b"400"),
    "bare CR in the request line": (b"GET /\r HTTP/1.1\r\n" + H + b"\r\n", b"400"),
    # RFC 9112 5.1, 9110 5.1/5.5: field syntax
    "space before colon": (b"GET / HTTP/1.1\r\n" + H + b"X-A : b\r\n\r\n", b"400"),
    "name not a token": (b"GET / HTTP/1.1\r\n" + H + b"X A: b\r\n\r\n", b"400"),
    "empty name": (b"GET / HTTP/1.1\r\n" + H + b": b\r\n\r\n", b"400"),
    "NUL in a value": (b"GET / HTTP/1.1\r\n" + H + b"X-A: b\x00c\r\n\r\n", b"400"),
    # RFC 9112 3.2: Host, exactly one in HTTP/1.1
    "no Host": (b"GET / HTTP/1.1\r\n\r\n", b"400"),
    "two Hosts": (b"GET / HTTP/1.1\r\n" + H + b"Host: y\r\n\r\n", b"400"),
    # RFC 9112 3: the request line
    "two spaces": (b"GET  / HTTP/1.1\r\n" + H + b"\r\n", b"400"),
    "lower-case version": (b"GET / http/1.1\r\n" + H + b"\r\n", b"400"),
    "version 1.2": (b"GET / HTTP/1.2\r\n" + H + b"\r\n", b"505"),
    "method not a token": (b"G(T / HTTP/1.1\r\n" + H + b"\r\n", b"400"),
    "control character in the target": (b"GET /\x01 HTTP/1.1\r\n" + H + b"\r\n", b"400"),
    "space in the target": (b"GET /a b HTTP/1.1\r\n" + H + b"\r\n", b"400"),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_a_malformed_request_is_refused_and_nothing_after_it_is_read(
    server: ExporterHTTPServer, name: str
) -> None:
    request, status = MALFORMED[name]
    out = exchange(server, [request + SMUGGLED])
    assert out.startswith(b"HTTP/1.1 " + status), out[:300]
    assert out.count(b"\r\nDate: ") == 1, out  # one answer: the smuggled request had none
    assert b"Connection: close\r\n" in out
    assert ours(request + SMUGGLED)[1] is not None  # the stream driver agrees


@pytest.mark.parametrize(
    ("request_bytes", "body"),
    [
        (b"GET /lf HTTP/1.1\nHost: x\n\n", b"GET /lf b''\n"),  # bare LF line ends (RFC 9112 2.2)
        (b"GET /mixed HTTP/1.1\r\nHost: x\n\r\n", b"GET /mixed b''\n"),
        (b"\r\n\r\nGET /blank HTTP/1.1\r\nHost: x\r\n\r\n", b"GET /blank b''\n"),
        (b"POST /same HTTP/1.1\r\nHost: x\r\nContent-Length: 3, 3\r\n\r\nxyz",
         b"POST /same b'xyz'\n"),  # one length, listed twice (RFC 9110 8.6 allows)
        (b"POST /ows HTTP/1.1\r\nHost: x\r\nContent-Length:  3 \t\r\n\r\nxyz",
         b"POST /ows b'xyz'\n"),
        (b"GET /old HTTP/1.0\r\n\r\n", b"GET /old b''\n"),  # HTTP/1.0 needs no Host
        (b"GET /o HTTP/1.1\r\nHost: x\r\nX-A: caf\xe9\r\n\r\n", b"GET /o b''\n"),  # obs-text
    ],
)  # fmt: skip
def test_what_the_rfc_allows_is_answered(
    server: ExporterHTTPServer, request_bytes: bytes, body: bytes
) -> None:
    out = exchange(server, [request_bytes])
    assert out.startswith(b"HTTP/1.1 200 OK"), out[:300]
    assert out.endswith(body)


# ------------------------------------------------------------------------ property tests

TCHAR = "!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
tokens = st.text(TCHAR, min_size=1, max_size=12)
targets = st.text(
    st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=0, max_size=40
).map(lambda t: "/" + t)
values = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0xFF, blacklist_categories=("Cc",)),
    max_size=30,
).map(lambda v: v.strip(" \t"))
names = tokens.filter(lambda n: n.lower() not in ("host", "content-length", "transfer-encoding"))


@st.composite
def requests(draw: st.DrawFn) -> tuple[bytes, Parsed]:
    """A valid request's bytes (CRLF or LF line ends, headers in any case) and its parse."""
    method = draw(st.sampled_from(["GET", "POST", "HEAD", "OPTIONS"]) | tokens)
    target = draw(targets)
    headers = draw(st.lists(st.tuples(names, values), max_size=6))
    body = draw(st.binary(max_size=200))
    eol = draw(st.sampled_from(["\r\n", "\n"]))
    lines = [f"{method} {target} HTTP/1.1", "Host: example"]
    lines += [f"{n}:{draw(st.sampled_from(['', ' ', chr(9)]))}{v}" for n, v in headers]
    if body or draw(st.booleans()):
        lines.append(f"Content-Length: {len(body)}")
    data = (eol.join(lines) + eol + eol).encode("latin-1") + body
    merged: dict[str, str] = {"host": "example"}
    for n, v in headers:
        key = n.lower()
        merged[key] = v if key not in merged else f"{merged[key]}, {v}"
    if b"Content-Length" in data:
        merged["content-length"] = str(len(body))
    return data, Parsed(method, target, "HTTP/1.1", tuple(sorted(merged.items())), body, True)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(requests(), min_size=1, max_size=5))
def test_pipelined_requests_parse_to_what_was_sent_as_h11_reads_them(
    reqs: list[tuple[bytes, Parsed]],
) -> None:
    data = b"".join(d for d, _ in reqs)
    parsed, error = ours(data)
    assert error is None
    assert parsed == [p for _, p in reqs]
    assert reference(data, len(reqs)) == parsed
    check(data)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(requests(), min_size=1, max_size=4), st.data())
def test_pipelined_requests_split_anywhere_are_answered_in_order(
    server: ExporterHTTPServer, reqs: list[tuple[bytes, Parsed]], data: st.DataObject
) -> None:
    """Through the real server: the bytes cut at arbitrary points, sent piece by piece."""
    stream = b"".join(d for d, _ in reqs)
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(stream) - 1)), max_size=6)))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    out = exchange(server, chunks)
    assert out.count(b"HTTP/1.1 200 OK") == len(reqs), out[:2000]
    at = 0
    for _, p in reqs:  # each answer's body, in order (HEAD: none)
        path = unquote(p.target.partition("?")[0], "iso-8859-1")
        body = f"{p.method} {path} {p.body!r}\n".encode("latin-1")
        if p.method != "HEAD":
            found = out.find(b"\r\n\r\n" + body, at)
            assert found >= 0, (body, out[at : at + 2000])
            at = found + len(body)


def mutate(data: bytes, edits: list[tuple[int, int, bytes]]) -> bytes:
    for pos, cut, insert in edits:
        pos %= len(data) + 1
        data = data[:pos] + insert + data[pos + cut :]
    return data


SPECIAL = st.sampled_from(
    [b"\r", b"\n", b"\r\n", b" ", b"\t", b":", b",", b"\x00", b"\xb2", b"0", b"9", b"-",
     b"Content-Length: ", b"Transfer-Encoding: chunked\r\n", b"Host: y\r\n", b"\r\n ",
     b"Connection: close\r\n", b"HTTP/1.0", b"\r\n\r\n"]
)  # fmt: skip


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(requests(), min_size=1, max_size=3),
    st.lists(st.tuples(st.integers(0, 2000), st.integers(0, 3), SPECIAL | st.binary(max_size=3)),
             max_size=4),
)  # fmt: skip
def test_mutated_requests_are_refused_or_read_as_h11_reads_them(
    reqs: list[tuple[bytes, Parsed]], edits: list[tuple[int, int, bytes]]
) -> None:
    """Any bytes: only BadRequest, sound requests, the same boundaries as h11 (check())."""
    check(mutate(b"".join(d for d, _ in reqs), edits))


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_are_refused_or_read_as_h11_reads_them(data: bytes) -> None:
    check(data)


# ------------------------------------------------------------------- coverage-guided fuzzing

HAVE_ATHERIS = importlib.util.find_spec("atheris") is not None
RUNS = 30_000  # about 15 s on a busy 2-core VM


@pytest.mark.parametrize(
    "name", sorted(p.name for p in (DATA / "http_requests").iterdir()), ids=str
)
def test_every_corpus_input_holds(name: str) -> None:
    """The fuzz corpus replayed without atheris: each input the fuzzer once found (a CONNECT
    followed by more bytes made the h11 reference itself raise) stays a passing case."""
    check((DATA / "http_requests" / name).read_bytes())


SEED = 20261206


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_ATHERIS, reason="atheris not installed: the hypothesis runs cover")
def test_atheris_http_fuzz_run(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    shutil.copytree(DATA / "http_requests", corpus)
    cmd = [
        sys.executable,
        str(TESTS / "fuzz" / "fuzz_http_request.py"),
        str(corpus),
        f"-runs={RUNS}",
        f"-seed={SEED}",
        f"-dict={TESTS / 'fuzz' / 'http.dict'}",
        "-timeout=10",
        "-rss_limit_mb=2048",
        f"-artifact_prefix={tmp_path}/",
        "-print_final_stats=1",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    crashes = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("crash", "oom")))
    assert r.returncode == 0 and not crashes, f"{crashes}\n{r.stdout[-4000:]}{r.stderr[-8000:]}"
    assert "Done " in r.stderr and "stat::number_of_executed_units" in r.stderr

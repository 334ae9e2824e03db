"""The HTTP/1.1 request parser: a request head's bytes to a :class:`Request`, or a 4xx/5xx.

Why it is strict: the exporter faces the network (every interface by default), often behind a
proxy, and a parser that accepts what another one along the way reads differently is how
requests are smuggled. So what RFC 9112 lets a server reject is rejected, with the connection
closed after the answer: a ``Transfer-Encoding`` of any kind (the pages take no body, and with
a ``Content-Length`` beside it it is the classic desync), a ``Content-Length`` that is not one
plain decimal (or several that disagree), header lines folded onto the next (obs-fold), bare
CR, control characters, whitespace before a header's colon, header names that are not tokens,
an HTTP/1.1 request without exactly one ``Host``. A bare LF as line end is accepted, as the RFC
allows (section 2.2). The property and fuzz tests (tests/exporter/test_http_parser.py) hold it
to this over heads, bodies and pipelined requests.
"""

from __future__ import annotations

import re

#: the request line and headers, at most (Go's net/http allows 1 MiB; no scrape sends 1 KiB)
MAX_HEAD_BYTES = 64 * 1024
#: a request body, at most (the exporter's pages take none: it is read and dropped)
MAX_BODY_BYTES = 64 * 1024

#: RFC 9110 5.6.2: token = 1*tchar
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
#: a request target: visible ASCII only (no space, no control character, nothing over 0x7e)
_TARGET = re.compile(r"[\x21-\x7e]+\Z")
#: a field value: visible characters, space and tab (obs-text, 0x80-0xff, is allowed)
_VALUE = re.compile(r"[\t\x20-\x7e\x80-\xff]*\Z")
_VERSION = re.compile(r"HTTP/[0-9]\.[0-9]\Z")
_DIGITS = re.compile(r"[0-9]+\Z")


class BadRequest(Exception):
    """A request answered with ``status``, after which the connection is closed."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status


def head_end(buffer: bytes | bytearray) -> tuple[int, int]:
    """The length of the head ``buffer`` starts with, and of it and its blank line; -1, -1 before.

    The head keeps its last line's end. CRLF CRLF ends a head, and so does LF LF or a mix, as
    RFC 9112 2.2 allows.
    """
    crlf = buffer.find(b"\n\r\n")
    lf = buffer.find(b"\n\n")
    if lf >= 0 and (crlf < 0 or lf < crlf):
        return lf + 1, lf + 2
    if crlf >= 0:
        return crlf + 1, crlf + 3
    return -1, -1


def take_head(buffer: bytearray) -> bytes | None:
    """Take the next request's head off the front of ``buffer``; None until it has all come.

    Blank lines before a request line are skipped (RFC 9112 2.2); a head over
    :data:`MAX_HEAD_BYTES` is a 431.
    """
    while True:
        size, taken = head_end(buffer)
        if size > MAX_HEAD_BYTES or (size < 0 and len(buffer) > MAX_HEAD_BYTES):
            raise BadRequest(
                "431 Request Header Fields Too Large",
                f"a request line and headers of over {MAX_HEAD_BYTES} bytes",
            )
        if size < 0:
            return None
        head = bytes(buffer[:size])
        del buffer[:taken]
        while head[:1] == b"\n" or head[:2] == b"\r\n":  # empty lines, not a lone CR
            head = head[1:] if head[:1] == b"\n" else head[2:]
        if head:
            return head


class Request:
    """One parsed request: what the WSGI environ is made of, and whether to keep the connection."""

    __slots__ = ("body", "headers", "keep_alive", "method", "target", "version")

    def __init__(self, head: bytes) -> None:
        if b"\r" in head.replace(b"\r\n", b""):
            raise BadRequest("400 Bad Request", "a bare CR in the request head")
        lines = head.decode("latin-1").replace("\r\n", "\n").split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        if not lines:
            raise BadRequest("400 Bad Request", "an empty request head")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not _TOKEN.match(parts[0]) or not _TARGET.match(parts[1]):
            raise BadRequest("400 Bad Request", f"malformed request line {lines[0][:100]!r}")
        self.method, self.target, self.version = parts
        if self.version not in ("HTTP/1.1", "HTTP/1.0"):
            if not _VERSION.match(self.version):
                raise BadRequest("400 Bad Request", f"malformed request line {lines[0][:100]!r}")
            raise BadRequest(
                "505 HTTP Version Not Supported", f"{self.version[:20]!r}: HTTP/1.1 and 1.0 only"
            )
        self.headers: dict[str, str] = {}
        hosts = 0
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not _TOKEN.match(name):
                # also a line folded onto the one above (obs-fold: it starts with a space), and
                # a space before the colon, which RFC 9112 5.1 says must be refused with a 400
                raise BadRequest("400 Bad Request", f"malformed header line {line[:100]!r}")
            value = value.strip(" \t")
            if not _VALUE.match(value):
                raise BadRequest("400 Bad Request", f"a control character in header {name!r}")
            key = name.lower()
            hosts += key == "host"
            old = self.headers.get(key)
            self.headers[key] = value if old is None else f"{old}, {value}"
        if hosts > 1 or (hosts == 0 and self.version == "HTTP/1.1"):
            raise BadRequest("400 Bad Request", f"{hosts} Host headers: HTTP/1.1 needs one")
        connection = self.headers.get("connection", "").lower()
        if self.version == "HTTP/1.1":
            self.keep_alive = "close" not in connection
        else:
            self.keep_alive = "keep-alive" in connection
        self.body = b""

    def body_length(self) -> int:
        """The body's length in bytes, from ``Content-Length`` (0 without one)."""
        if "transfer-encoding" in self.headers:
            raise BadRequest("411 Length Required", "chunked request bodies are not accepted")
        text = self.headers.get("content-length")
        if text is None:
            return 0
        values = {v.strip(" \t") for v in text.split(",")}
        if len(values) != 1 or not _DIGITS.match(next(iter(values))):
            raise BadRequest("400 Bad Request", f"Content-Length {text[:30]!r}: not one length")
        length = int(values.pop())
        if length > MAX_BODY_BYTES:
            raise BadRequest(
                "413 Content Too Large", f"a body of {length} bytes (at most {MAX_BODY_BYTES})"
            )
        return length

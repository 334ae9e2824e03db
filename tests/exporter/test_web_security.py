"""TLS, basic auth and slow clients, with real clients over 127.0.0.1."""

from __future__ import annotations

import base64
import socket
import ssl
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import bcrypt
import pytest

from helpers.exporter_proc import Exporter, child_env
from trainguard.exporter.http import server as httpserver
from trainguard.exporter.http.app import make_http_server
from trainguard.exporter.http.webconfig import WebConfigError, load_web_config


def openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a server certificate for 127.0.0.1 and a client certificate."""
    d = tmp_path_factory.mktemp("pki")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
            "-keyout", d / "ca.key", "-out", d / "ca.crt")  # fmt: skip
    for name, ext in (
        ("server", "subjectAltName=IP:127.0.0.1"),
        ("client", "extendedKeyUsage=clientAuth"),
    ):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                "-keyout", d / f"{name}.key", "-out", d / f"{name}.csr")  # fmt: skip
        (d / f"{name}.ext").write_text(ext + "\n")
        openssl("x509", "-req", "-in", d / f"{name}.csr", "-CA", d / "ca.crt",
                "-CAkey", d / "ca.key", "-CAcreateserial", "-days", "2",
                "-extfile", d / f"{name}.ext", "-out", d / f"{name}.crt")  # fmt: skip
    return d


def client_ctx(pki: Path, with_cert: bool = False) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if with_cert:
        ctx.load_cert_chain(str(pki / "client.crt"), str(pki / "client.key"))
    return ctx


def get(url: str, ctx: ssl.SSLContext | None = None, auth: tuple[str, str] | None = None) -> int:
    req = urllib.request.Request(url)
    if auth:
        req.add_header(
            "Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode()
        )
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
            return int(r.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


def test_tls_and_basic_auth(tmp_path: Path, pki: Path) -> None:
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=10)).decode()
    cfg = tmp_path / "web.yml"
    cfg.write_text(
        "tls_server_config:\n"
        f"  cert_file: {pki / 'server.crt'}\n"
        f"  key_file: {pki / 'server.key'}\n"
        "basic_auth_users:\n"
        f"  prometheus: {hashed}\n"
    )
    with Exporter(args=[f"--web.config.file={cfg}"], state_dir=tmp_path / "s", scheme="https",
                  ssl_context=client_ctx(pki), auth=("prometheus", "s3cret")) as exp:  # fmt: skip
        https = exp.url
        assert https.startswith("https://")
        ctx = client_ctx(pki)
        assert get(https + "/metrics", ctx, ("prometheus", "s3cret")) == 200
        assert get(https + "/metrics", ctx, ("prometheus", "wrong")) == 401
        assert get(https + "/metrics", ctx, ("nobody", "s3cret")) == 401
        assert get(https + "/metrics", ctx) == 401
        # plain HTTP on the TLS port gets no metrics
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            urllib.request.urlopen(https.replace("https://", "http://") + "/metrics", timeout=5)
        # a client that doesn't trust the certificate is refused by its own TLS check
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(
                https + "/metrics", timeout=5, context=ssl.create_default_context()
            )


def test_client_certificates_required(tmp_path: Path, pki: Path) -> None:
    cfg = tmp_path / "web.yml"
    cfg.write_text(
        "tls_server_config:\n"
        f"  cert_file: {pki / 'server.crt'}\n"
        f"  key_file: {pki / 'server.key'}\n"
        f"  client_ca_file: {pki / 'ca.crt'}\n"
        "  client_auth_type: RequireAndVerifyClientCert\n"
        "  min_version: TLS12\n"
    )
    with Exporter(args=[f"--web.config.file={cfg}"], state_dir=tmp_path / "s", scheme="https",
                  ssl_context=client_ctx(pki, with_cert=True)) as exp:  # fmt: skip
        assert get(exp.url + "/metrics", client_ctx(pki, with_cert=True)) == 200
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
            get(exp.url + "/metrics", client_ctx(pki, with_cert=False))


def test_slow_clients_do_not_block_scrapes(tmp_path: Path, pki: Path) -> None:
    cfg = tmp_path / "web.yml"
    cfg.write_text(
        f"tls_server_config:\n  cert_file: {pki / 'server.crt'}\n  key_file: {pki / 'server.key'}\n"
    )
    with Exporter(args=[f"--web.config.file={cfg}"], state_dir=tmp_path / "s", scheme="https",
                  ssl_context=client_ctx(pki)) as exp:  # fmt: skip
        # clients that connect and then say nothing: mid-handshake and mid-request
        stalled = [socket.create_connection(("127.0.0.1", exp.port)) for _ in range(20)]
        try:
            for _ in range(5):
                assert get(exp.url + "/metrics", client_ctx(pki)) == 200
            # answered while every stalled client still held its connection: a server that
            # waited for them (a handshake in the accept loop) would have answered only after
            # dropping each of them at its head timeout (HEAD_TIMEOUT_SECONDS, 10 s)
            for s in stalled:
                s.setblocking(False)
                with pytest.raises(BlockingIOError):
                    s.recv(1)  # b"": the server had given up on this one
        finally:
            for s in stalled:
                s.close()


def test_a_tls_handshake_trickled_byte_by_byte_is_dropped_at_the_head_timeout(
    pki: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The handshake is bounded as a whole, not per read: a ClientHello sent a byte every
    0.1 s must not hold its thread for as long as the client cares to keep going (CPython's
    do_handshake keeps one deadline, the socket's timeout; this holds the server to it)."""
    monkeypatch.setattr(httpserver, "HEAD_TIMEOUT_SECONDS", 1.0)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(pki / "server.crt"), str(pki / "server.key"))
    srv = make_http_server("127.0.0.1:0", lambda env, start: [b""], ctx)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    out = ssl.MemoryBIO()
    tls = client_ctx(pki).wrap_bio(ssl.MemoryBIO(), out, server_hostname="127.0.0.1")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    hello = out.read()  # a real ClientHello, a few hundred bytes
    try:
        with socket.create_connection(("127.0.0.1", int(srv.server_address[1])), timeout=30) as s:
            s.settimeout(0.1)
            closed = False
            for i in range(len(hello)):
                try:
                    s.sendall(hello[i : i + 1])
                    if s.recv(1) == b"":
                        closed = True
                        break
                except TimeoutError:
                    continue
                except OSError:
                    closed = True
                    break
            assert closed, f"the server was still reading a handshake of {len(hello)} bytes"
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tls_server_config:\n  cert_file: /nonexistent.crt\n  key_file: /x.key\n",
         "2:14: tls_server_config.cert_file: no such file '/nonexistent.crt'"),
        # a relative path is relative to the file: web.yml is the file itself, so it exists
        ("tls_server_config:\n  cert_file: web.yml\n",
         "2:3: tls_server_config: both cert_file and key_file are required"),
        ("basic_auth_users:\n  alice: plaintext\n",
         "2:10: basic_auth_users.alice: expected a bcrypt hash"),
        ("tls_config: {}\n", "1:1: tls_config: unknown key"),
        ("http_server_config:\n  http2: true\n",
         "2:10: http_server_config.http2: trainguard serves HTTP/1.1 only"),
        ("http_server_config:\n  http2: 'no'\n",
         "2:10: http_server_config.http2: expected true or false, got 'no'"),
        ("tls_server_config:\n  prefer_server_cipher_suites: 1\n",
         "2:32: tls_server_config.prefer_server_cipher_suites: expected true or false, got 1"),
        ("http_server_config:\n  headers: {X-A: b}\n  headers: {}\n",
         "3:3: invalid YAML: duplicate key 'headers', first given on line 2"),
        ("tls_server_config:\n  cipher_suites: [TLS_AES_128_GCM_SHA256]\n",
         "2:18: tls_server_config.cipher_suites: not supported by trainguard"),
    ],
)  # fmt: skip
def test_bad_web_config_is_a_clear_error(tmp_path: Path, text: str, message: str) -> None:
    cfg = tmp_path / "web.yml"
    cfg.write_text(text)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainguard",
            f"--web.config.file={cfg}",
            "--web.listen-address=127.0.0.1:0",
        ],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2
    assert f"--web.config.file: {cfg}:{message}" in r.stderr, r.stderr


def test_web_config_file_has_the_size_cap_of_the_config_file(tmp_path: Path) -> None:
    """The same loader as --config.file: a file over 1 MiB is refused, naming it."""
    cfg = tmp_path / "web.yml"
    cfg.write_bytes(b"#" * (1024 * 1024 + 1))
    with pytest.raises(WebConfigError) as err:
        load_web_config(cfg)
    assert str(err.value).startswith(f"{cfg}: web config file is larger than 1 MiB")


@pytest.mark.parametrize(("setting", "preferred"), [("", True), ("true", True), ("false", False)])
def test_prefer_server_cipher_suites_is_honoured(
    tmp_path: Path, pki: Path, setting: str, preferred: bool
) -> None:
    """exporter-toolkit's key, default true: the server's cipher order wins the handshake."""
    line = f"  prefer_server_cipher_suites: {setting}\n" if setting else ""
    cfg = tmp_path / "web.yml"
    cfg.write_text(
        f"tls_server_config:\n  cert_file: {pki / 'server.crt'}\n"
        f"  key_file: {pki / 'server.key'}\n{line}http_server_config:\n  http2: false\n"
    )
    ctx = load_web_config(cfg).ssl_context
    assert ctx is not None
    assert bool(ctx.options & ssl.OP_CIPHER_SERVER_PREFERENCE) is preferred

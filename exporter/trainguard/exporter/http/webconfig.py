"""TLS and basic auth from the web configuration file that Prometheus exporters share.

That file is ``--web.config.file``, in the exporter-toolkit format, so that one file and one
habit serve node_exporter, dcgm-exporter and trainguard alike.

Read like exporter-toolkit reads it: its structs tagged with YAML names, unmarshalled strictly,
are the dataclasses below (:mod:`trainguard.exporter.config.schema`), read by the same loader as the
config file (:mod:`trainguard.exporter.config.yamlfile`: size cap, line and column in errors).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bcrypt

from trainguard.exporter.config import schema
from trainguard.exporter.config.schema import FieldError, key
from trainguard.exporter.config.yamlfile import ConfigError, load_yaml

CLIENT_AUTH_TYPES = {
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_OPTIONAL,
    "RequireAnyClientCert": ssl.CERT_REQUIRED,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}


def _header_name(name: Any) -> str | None:
    return None if isinstance(name, str) and name else f"expected a header name, got {name!r}"


def _user_name(name: Any) -> str | None:
    return None if isinstance(name, str) and name else f"expected a user name, got {name!r}"


def _bcrypt_hash(value: schema.Value) -> bytes:
    if not isinstance(value.raw, str) or not value.raw.startswith("$2"):
        value.fail("expected a bcrypt hash ($2a$/$2b$/$2y$...)")
    return value.raw.encode()


class WebConfigError(ConfigError):
    """A web config file that cannot be used, naming the file, line and field."""


@dataclass(frozen=True)
class WebConfig:
    """What the web server needs from the file: TLS, the users of basic auth, extra headers."""

    ssl_context: ssl.SSLContext | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)


_UNSUPPORTED = "not supported by trainguard; Python's TLS defaults are used"
_VERIFYING = ("VerifyClientCertIfGiven", "RequireAndVerifyClientCert")


@dataclass(frozen=True)
class TLSServerConfig:
    """exporter-toolkit's ``tls_server_config``, less what Python's ssl cannot set."""

    cert_file: str | None = field(
        default=None, metadata=key(schema.existing_file, "the server's certificate (PEM)")
    )
    key_file: str | None = field(
        default=None, metadata=key(schema.existing_file, "the certificate's private key")
    )
    client_auth_type: str = field(
        default="NoClientCert",
        metadata=key(schema.choice(tuple(CLIENT_AUTH_TYPES)), "whether clients show a cert"),
    )
    client_ca_file: str | None = field(
        default=None, metadata=key(schema.existing_file, "CAs that sign client certificates")
    )
    min_version: str | None = field(
        default=None, metadata=key(schema.choice(tuple(TLS_VERSIONS)), "oldest TLS version")
    )
    max_version: str | None = field(
        default=None, metadata=key(schema.choice(tuple(TLS_VERSIONS)), "newest TLS version")
    )
    cipher_suites: None = field(default=None, metadata=key(schema.refused(_UNSUPPORTED), ""))
    curve_preferences: None = field(default=None, metadata=key(schema.refused(_UNSUPPORTED), ""))
    #: exporter-toolkit's default is true: the server's cipher order wins
    prefer_server_cipher_suites: bool = field(
        default=True, metadata=key(schema.boolean, "the server's cipher order wins")
    )

    def __post_init__(self) -> None:
        if self.cert_file is None or self.key_file is None:
            raise FieldError("both cert_file and key_file are required")
        if self.client_auth_type in _VERIFYING and self.client_ca_file is None:
            raise FieldError(f"client_auth_type {self.client_auth_type} needs client_ca_file")


@dataclass(frozen=True)
class HTTPServerConfig:
    """exporter-toolkit's ``http_server_config``."""

    http2: bool = field(default=False, metadata=key(schema.boolean, "serve HTTP/2"))
    headers: Mapping[str, str] = field(
        default_factory=dict,
        metadata=key(
            schema.mapping_of(_header_name, schema.string, "name: value strings"),
            "headers added to every response",
        ),
    )

    def __post_init__(self) -> None:
        if self.http2:
            raise FieldError(
                "trainguard serves HTTP/1.1 only (which is all Prometheus needs); set it to "
                "false or remove it",
                "http2",
            )


def _tls_section(value: schema.Value) -> TLSServerConfig | None:
    """An empty ``tls_server_config: {}`` is no TLS, as a missing one."""
    if value.raw == {}:
        return None
    return schema.read(TLSServerConfig, value)


@dataclass(frozen=True)
class WebConfigFile:
    """The file, in the exporter-toolkit format that Prometheus exporters share."""

    tls_server_config: TLSServerConfig | None = field(
        default=None, metadata=key(_tls_section, "serve HTTPS")
    )
    http_server_config: HTTPServerConfig = field(
        default_factory=HTTPServerConfig,
        metadata=key(schema.section(HTTPServerConfig), "HTTP settings"),
    )
    basic_auth_users: Mapping[str, bytes] = field(
        default_factory=dict,
        metadata=key(
            schema.mapping_of(_user_name, _bcrypt_hash), "user name: bcrypt hash of the password"
        ),
    )


def _ssl_context(tls: TLSServerConfig, at: schema.Value) -> ssl.SSLContext:
    """The server's TLS context; at: the ``tls_server_config`` section, for errors."""
    assert tls.cert_file is not None and tls.key_file is not None  # __post_init__
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(tls.cert_file, tls.key_file)
    except (ssl.SSLError, OSError) as exc:
        at.fail(f"cannot load certificate and key: {exc}")
    ctx.verify_mode = CLIENT_AUTH_TYPES[tls.client_auth_type]
    if tls.client_ca_file is not None:
        try:
            ctx.load_verify_locations(tls.client_ca_file)
        except (ssl.SSLError, OSError) as exc:
            at.child("client_ca_file").fail(str(exc))
    if tls.min_version is not None:
        ctx.minimum_version = TLS_VERSIONS[tls.min_version]
    if tls.max_version is not None:
        ctx.maximum_version = TLS_VERSIONS[tls.max_version]
    if tls.prefer_server_cipher_suites:
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    else:
        ctx.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    return ctx


def load_web_config(path: str | Path | None) -> WebConfig:
    """Read and validate the ``--web.config.file``; no path means plain HTTP, no auth."""
    if path is None:
        return WebConfig()
    try:
        doc = schema.Value.root(
            load_yaml(path, "web config file"), str(path), Path(path).resolve().parent
        )
        parsed = schema.read(WebConfigFile, doc)
        tls = parsed.tls_server_config
        ctx = None if tls is None else _ssl_context(tls, doc.child("tls_server_config"))
    except WebConfigError:
        raise
    except ConfigError as exc:
        raise WebConfigError(exc.source, exc.message, field=exc.field, mark=exc.mark) from None
    return WebConfig(
        ssl_context=ctx,
        users=parsed.basic_auth_users,
        headers=dict(parsed.http_server_config.headers),
    )


class BasicAuth:
    """Checks ``Authorization: Basic`` against bcrypt hashes.

    bcrypt is slow on purpose, so a password that already matched is remembered (keyed by an HMAC,
    never stored in clear), as exporter-toolkit does, to keep a scrape cheap.
    """

    def __init__(self, users: Mapping[str, bytes]) -> None:
        self._users = dict(users)
        self._key = bcrypt.gensalt()
        self._good: set[bytes] = set()
        self._lock = threading.Lock()
        self._dummy = bcrypt.hashpw(b"unknown user", bcrypt.gensalt(rounds=10))

    def __bool__(self) -> bool:
        return bool(self._users)

    def check(self, header: str | None) -> bool:
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        hashed = self._users.get(user)
        if hashed is None:
            # spend the same time as for a known user, so user names can't be probed
            bcrypt.checkpw(password.encode(), self._dummy)
            return False
        token = hmac.digest(
            self._key, b"\0".join([user.encode(), password.encode(), hashed]), "sha256"
        )
        with self._lock:
            if token in self._good:
                return True
        if bcrypt.checkpw(password.encode(), hashed):
            with self._lock:
                if len(self._good) > 1024:
                    self._good.clear()
                self._good.add(token)
            return True
        return False

"""TLS and basic auth from the web configuration file that Prometheus exporters share
(``--web.config.file``, the exporter-toolkit format), so that one file and one habit serve
node_exporter, dcgm-exporter and trainguard alike."""

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
import yaml

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


class WebConfigError(ValueError):
    """A web config file that cannot be used, naming the file and field."""


@dataclass(frozen=True)
class WebConfig:
    ssl_context: ssl.SSLContext | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)


def _mapping(source: str, where: str, value: Any, allowed: tuple[str, ...]) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise WebConfigError(f"{source}: {where}: expected a mapping")
    for key in value:
        if key not in allowed:
            raise WebConfigError(
                f"{source}: {where}.{key}: unknown key; expected one of: {', '.join(allowed)}"
                if where
                else f"{source}: {key}: unknown key; expected one of: {', '.join(allowed)}"
            )
    return value


def _file(source: str, base: Path, where: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise WebConfigError(f"{source}: {where}: expected a file path")
    path = Path(value)
    if not path.is_absolute():
        path = base / path  # relative to the config file, as exporter-toolkit does
    if not path.is_file():
        raise WebConfigError(f"{source}: {where}: no such file {str(path)!r}")
    return str(path)


def _ssl_context(source: str, base: Path, tls: dict[str, Any]) -> ssl.SSLContext:
    where = "tls_server_config"
    # exporter-toolkit's default is true: the server's cipher order wins
    prefer_server = _flag(source, f"{where}.prefer_server_cipher_suites", tls, default=True)
    if "cert_file" not in tls or "key_file" not in tls:
        raise WebConfigError(f"{source}: {where}: both cert_file and key_file are required")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    cert = _file(source, base, f"{where}.cert_file", tls["cert_file"])
    key = _file(source, base, f"{where}.key_file", tls["key_file"])
    try:
        ctx.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        raise WebConfigError(f"{source}: {where}: cannot load certificate and key: {exc}") from exc
    auth_type = tls.get("client_auth_type", "NoClientCert")
    if auth_type not in CLIENT_AUTH_TYPES:
        raise WebConfigError(
            f"{source}: {where}.client_auth_type: expected one of "
            f"{', '.join(CLIENT_AUTH_TYPES)}, got {auth_type!r}"
        )
    ctx.verify_mode = CLIENT_AUTH_TYPES[auth_type]
    if "client_ca_file" in tls:
        ca = _file(source, base, f"{where}.client_ca_file", tls["client_ca_file"])
        try:
            ctx.load_verify_locations(ca)
        except (ssl.SSLError, OSError) as exc:
            raise WebConfigError(f"{source}: {where}.client_ca_file: {exc}") from exc
    elif auth_type in ("VerifyClientCertIfGiven", "RequireAndVerifyClientCert"):
        raise WebConfigError(
            f"{source}: {where}: client_auth_type {auth_type} needs client_ca_file"
        )
    for bound in ("min_version", "max_version"):
        if bound in tls:
            name = tls[bound]
            if name not in TLS_VERSIONS:
                raise WebConfigError(
                    f"{source}: {where}.{bound}: expected one of {', '.join(TLS_VERSIONS)}, "
                    f"got {name!r}"
                )
            setattr(
                ctx,
                "minimum_version" if bound == "min_version" else "maximum_version",
                TLS_VERSIONS[name],
            )
    if prefer_server:
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    else:
        ctx.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    return ctx


def _flag(source: str, where: str, section: Mapping[str, Any], *, default: bool) -> bool:
    value = section.get(where.rsplit(".", 1)[-1], default)
    if not isinstance(value, bool):
        raise WebConfigError(f"{source}: {where}: expected true or false, got {value!r}")
    return value


def load_web_config(path: str | Path | None) -> WebConfig:
    if path is None:
        return WebConfig()
    source = str(path)
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise WebConfigError(f"{source}: cannot read web config file: {exc.strerror}") from exc
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise WebConfigError(f"{source}: invalid YAML: {exc}") from exc
    top = _mapping(
        source, "", data or {}, ("tls_server_config", "http_server_config", "basic_auth_users")
    )
    base = Path(path).resolve().parent
    tls = _mapping(
        source,
        "tls_server_config",
        top.get("tls_server_config"),
        (
            "cert_file",
            "key_file",
            "client_auth_type",
            "client_ca_file",
            "min_version",
            "max_version",
            "cipher_suites",
            "curve_preferences",
            "prefer_server_cipher_suites",
        ),
    )
    for unsupported in ("cipher_suites", "curve_preferences"):
        if unsupported in tls:
            raise WebConfigError(
                f"{source}: tls_server_config.{unsupported}: not supported by trainguard; "
                "Python's TLS defaults are used"
            )
    http = _mapping(
        source, "http_server_config", top.get("http_server_config"), ("http2", "headers")
    )
    if _flag(source, "http_server_config.http2", http, default=False):
        raise WebConfigError(
            f"{source}: http_server_config.http2: trainguard serves HTTP/1.1 only (which is all "
            "Prometheus needs); set it to false or remove it"
        )
    headers = http.get("headers") or {}
    if not isinstance(headers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        raise WebConfigError(f"{source}: http_server_config.headers: expected name: value strings")
    users: dict[str, bytes] = {}
    for user, hashed in (top.get("basic_auth_users") or {}).items():
        if not isinstance(user, str) or not isinstance(hashed, str) or not hashed.startswith("$2"):
            raise WebConfigError(
                f"{source}: basic_auth_users.{user}: expected a bcrypt hash ($2a$/$2b$/$2y$...)"
            )
        users[user] = hashed.encode()
    ctx = _ssl_context(source, base, tls) if tls else None
    return WebConfig(ssl_context=ctx, users=users, headers=dict(headers))


class BasicAuth:
    """Checks ``Authorization: Basic`` against bcrypt hashes. bcrypt is slow on purpose, so a
    password that already matched is remembered (keyed by an HMAC, never stored in clear), as
    exporter-toolkit does, to keep a scrape cheap."""

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

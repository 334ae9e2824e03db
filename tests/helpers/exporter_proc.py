"""Start the real exporter as a process and scrape it over HTTP: the seam tests assert on."""

from __future__ import annotations

import base64
import contextlib
import os
import socket
import ssl
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil
from prometheus_client.parser import text_string_to_metric_families

from helpers.paths import REPO
from helpers.wait import WaitTimeout, wait_for

EXPORTER_SRC = REPO / "exporter"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for a child Python that imports this checkout's trainguard."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(EXPORTER_SRC), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("PYTHONUNBUFFERED", "1")
    if extra:
        env.update(extra)
    return env


def parse_samples(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


class Exporter:
    """A running ``trainguard-exporter`` bound to 127.0.0.1 on a free port."""

    def __init__(
        self,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        state_dir: Path | None = None,
        *,
        scheme: str = "http",
        ssl_context: ssl.SSLContext | None = None,
        auth: tuple[str, str] | None = None,
        log_path: Path | None = None,
    ) -> None:
        """``log_path``: send the exporter's output to that file instead of a pipe, so a test
        can read what it logged so far while it still runs (``stop()`` returns all of it)."""
        self.port = free_port()
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        self._ssl = ssl_context
        self._auth = auth
        cmd = [
            sys.executable,
            "-m",
            "trainguard",
            f"--web.listen-address=127.0.0.1:{self.port}",
            *args,
        ]
        if state_dir is not None:
            cmd.append(f"--state.dir={state_dir}")
        self.log_path = log_path
        out: Any = subprocess.PIPE
        if log_path is not None:
            out = open(log_path, "w")  # noqa: SIM115 - the child holds it; closed below
        try:
            self.proc = subprocess.Popen(
                cmd, env=child_env(env), stdout=out, stderr=subprocess.STDOUT, text=True
            )
        finally:
            if log_path is not None:
                out.close()
        self._wait_ready()

    def _wait_ready(self, timeout: float = 60.0) -> None:
        def healthy() -> bool:
            if self.proc.poll() is not None:
                out = self.log()
                raise RuntimeError(f"exporter exited with {self.proc.returncode}:\n{out}")
            # the port is free-picked then bound by the child: another process (another test
            # session's exporter on this machine) may have taken it in between, and would
            # answer here while ours exits on its failed bind
            if not self._listening():
                return False
            with self._open("/-/healthy", timeout=5) as r:
                return bool(r.status == 200)

        try:
            wait_for(healthy, timeout, what="the exporter to become healthy", ignore=OSError)
        except WaitTimeout as exc:  # a RuntimeError, as an exit is (bench/ catches both)
            self.stop()
            raise RuntimeError(f"exporter did not become healthy in time: {exc}") from None

    def _listening(self) -> bool:
        """Whether this exporter process itself listens on ``self.port``."""
        try:
            sockets = psutil.Process(self.proc.pid).net_connections(kind="tcp")
        except psutil.NoSuchProcess:
            return False
        return any(
            c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == self.port
            for c in sockets
        )

    def _open(self, path: str, timeout: float) -> Any:
        req = urllib.request.Request(self.url + path)
        if self._auth:
            token = base64.b64encode(":".join(self._auth).encode()).decode()
            req.add_header("Authorization", f"Basic {token}")
        return urllib.request.urlopen(req, timeout=timeout, context=self._ssl)

    def get(self, path: str = "/metrics", timeout: float = 60.0) -> str:
        """``timeout`` bounds a client that would otherwise wait for ever; it is not a latency
        target (a scrape on a busy machine can take several seconds; bench/ measures them)."""
        with self._open(path, timeout) as r:
            return str(r.read().decode())

    def scrape(self) -> Samples:
        return parse_samples(self.get())

    def stop(self) -> str:
        """Stop the exporter and return everything it logged."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.log()

    def log(self) -> str:
        """What the exporter logged: so far with ``log_path``, else everything (after stop)."""
        if self.log_path is not None:
            return self.log_path.read_text(errors="backslashreplace")
        return self.proc.stdout.read() if self.proc.stdout else ""

    def __enter__(self) -> Exporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def poll(exp: Exporter, ok: Callable[[Samples], bool], timeout: float = 60.0) -> Samples:
    """Scrape until ``ok`` holds (or ``timeout`` passes); return the last scrape. The deadline
    is generous (a busy machine is many times slower); when ``ok`` holds it returns at once.
    A timeout is not raised here: the caller's assertions on the last scrape say what is wrong
    (and tests/gpu records its figures from it first)."""
    last: list[Samples] = []

    def scraped() -> bool:
        last[:] = [exp.scrape()]
        return ok(last[0])

    with contextlib.suppress(WaitTimeout):
        wait_for(scraped, timeout, what="the scrape to satisfy the condition")
    return last[0]


def value(samples: Samples, metric: str, /, **labels: str) -> float | None:
    """The sample with exactly these labels, or None."""
    return samples.get((metric, frozenset(labels.items())))


def select(
    samples: Samples, metric: str, /, **labels: str
) -> dict[frozenset[tuple[str, str]], float]:
    """All samples of ``metric`` whose labels include ``labels``."""
    want = set(labels.items())
    return {lbl: v for (n, lbl), v in samples.items() if n == metric and want <= set(lbl)}

"""Real Prometheus and Alertmanager (Debian packages) on 127.0.0.1, and a webhook receiver,
for end-to-end tests: what the exporter publishes really pages, and every dashboard query
really returns data."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from helpers.exporter_proc import free_port
from helpers.wait import WaitTimeout, wait_for

PROMETHEUS = shutil.which("prometheus")
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
#: the mark of a test that starts a real Prometheus and Alertmanager: skipped without them
needs_stack = pytest.mark.skipif(
    not (PROMETHEUS and ALERTMANAGER),
    reason="needs the Debian packages prometheus and prometheus-alertmanager (./run-tests "
    "installs them)",
)


def _wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 90) -> None:
    def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited {proc.returncode}:\n{log.read_text()}")
        with urllib.request.urlopen(url, timeout=10) as r:
            return bool(r.status == 200)

    try:
        wait_for(ready, timeout, 0.1, f"{url} to answer", ignore=OSError)
    except WaitTimeout as exc:  # a RuntimeError, as an exit is
        raise RuntimeError(f"{exc}; its log:\n{log.read_text()}") from None


class Webhook:
    """Collects what Alertmanager posts."""

    def __init__(self) -> None:
        self.received: list[tuple[float, dict[str, Any]]] = []
        self._cond = threading.Condition()
        webhook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with webhook._cond:
                    webhook.received.append((time.time(), json.loads(body)))
                    webhook._cond.notify_all()
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_message(
        self, ok: Callable[[dict[str, Any]], bool], timeout: float, what: str
    ) -> dict[str, Any]:
        """The first message posted (of any kind: a Slack-style payload too) that ``ok``
        accepts, waiting up to ``timeout`` seconds for it."""

        def posted() -> dict[str, Any] | None:
            with self._cond:
                return next((msg for _, msg in self.received if ok(msg)), None)

        return wait_for(posted, timeout, what=lambda: f"{what} posted; got {self.received}")

    def alerts(self, status: str = "firing") -> list[tuple[float, dict[str, Any]]]:
        with self._cond:
            return [
                (t, a) for t, msg in self.received for a in msg["alerts"] if a["status"] == status
            ]

    def wait_for(
        self, alertname: str, timeout: float, **labels: str
    ) -> tuple[float, dict[str, Any]]:
        """The first firing alert named ``alertname`` with these labels delivered (when it
        was received, and the alert), waiting up to ``timeout`` seconds for it."""

        def delivered() -> tuple[float, dict[str, Any]] | None:
            for t, a in self.alerts():
                lbl = a["labels"]
                if lbl.get("alertname") == alertname and all(
                    lbl.get(k) == v for k, v in labels.items()
                ):
                    return t, a
            return None

        return wait_for(
            delivered,
            timeout,
            what=lambda: (
                f"{alertname} {labels} delivered; got "
                f"{[a['labels'].get('alertname') for _, a in self.alerts()]}"
            ),
        )

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Server:
    """A Debian-packaged server started on a free 127.0.0.1 port, logging to its workdir."""

    port: int
    url: str
    log: Path
    proc: subprocess.Popen[bytes]

    def _launch(self, workdir: Path, name: str, cmd: list[str], ready_path: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / f"{name}.log"
        self.proc = subprocess.Popen(
            [*cmd, f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        _wait_http(self.url + ready_path, self.proc, self.log)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Alertmanager(_Server):
    """``config``: a whole Alertmanager configuration (e.g. the shipped one, its receivers
    pointed at 127.0.0.1); by default one webhook receiver at ``webhook_url``."""

    def __init__(
        self,
        workdir: Path,
        webhook_url: str,
        group_wait: str = "1s",
        config: dict[str, Any] | None = None,
    ) -> None:
        assert ALERTMANAGER, "prometheus-alertmanager is not installed"
        self.group_wait = group_wait
        workdir.mkdir(parents=True, exist_ok=True)
        cfg = workdir / "alertmanager.yml"
        cfg.write_text(
            yaml.safe_dump(
                config
                or {
                    "route": {
                        "receiver": "hook",
                        "group_by": ["alertname", "run", "instance"],
                        "group_wait": group_wait,
                        "group_interval": "1s",
                        "repeat_interval": "1h",
                    },
                    "receivers": [{"name": "hook", "webhook_configs": [{"url": webhook_url}]}],
                }
            )
        )
        self._launch(
            workdir,
            "alertmanager",
            [
                ALERTMANAGER,
                f"--config.file={cfg}",
                f"--storage.path={workdir / 'data'}",
                "--cluster.listen-address=",  # no gossip: nothing leaves 127.0.0.1
            ],
            "/-/ready",
        )


class Prometheus(_Server):
    def __init__(
        self,
        workdir: Path,
        targets: Sequence[str],
        rule_files: Sequence[Path] = (),
        alertmanager: str | None = None,
        scrape_interval: str = "1s",
        evaluation_interval: str = "1s",
        scrape_configs: Sequence[dict[str, Any]] | None = None,
    ) -> None:
        """``scrape_configs``: Prometheus' own, in place of one static job "trainguard" of
        ``targets`` (e.g. file_sd with a relabelling under test)."""
        assert PROMETHEUS, "prometheus is not installed"
        workdir.mkdir(parents=True, exist_ok=True)
        config: dict[str, Any] = {
            "global": {
                "scrape_interval": scrape_interval,
                "evaluation_interval": evaluation_interval,
            },
            "scrape_configs": list(scrape_configs)
            if scrape_configs is not None
            else [{"job_name": "trainguard", "static_configs": [{"targets": list(targets)}]}],
            "rule_files": [str(p) for p in rule_files],
        }
        if alertmanager:
            config["alerting"] = {
                "alertmanagers": [
                    {"static_configs": [{"targets": [alertmanager.removeprefix("http://")]}]}
                ]
            }
        cfg = workdir / "prometheus.yml"
        cfg.write_text(yaml.safe_dump(config))
        self._launch(
            workdir,
            "prometheus",
            [
                PROMETHEUS,
                f"--config.file={cfg}",
                f"--storage.tsdb.path={workdir / 'data'}",
                "--web.enable-lifecycle",
            ],
            "/-/ready",
        )

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=60) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as err:
            return json.loads(err.read())

    def rule_group_iterations(self) -> dict[str, float]:
        """How many times each rule group has been evaluated so far, from Prometheus's own
        metrics (``prometheus_rule_group_iterations_total``)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=60) as r:
            text = r.read().decode()
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "prometheus_rule_group_iterations_total":
                    out[sample.labels["rule_group"]] = sample.value
        return out

    def wait_evaluations(self, n: int, timeout: float = 120) -> None:
        """Wait until every rule group has been evaluated ``n`` more times from now: whatever
        the data queried before this call, the rules have since judged it. On a busy machine
        Prometheus may miss ticks, so this counts evaluations rather than sleeping."""
        start = self.rule_group_iterations()
        assert start, "Prometheus has no rule groups"

        now: list[dict[str, float]] = []

        def evaluated() -> bool:
            now[:] = [self.rule_group_iterations()]
            return all(now[0].get(g, 0) >= start[g] + n for g in start)

        what = lambda: f"rule groups evaluated {n} times from {start}: {now}"  # noqa: E731
        wait_for(evaluated, timeout, 0.25, what)

    def query(self, expr: str) -> Any:
        return self.api("query", query=expr)

    def wait_until(self, expr: str, timeout: float = 60) -> list[Any]:
        """Poll until the instant query returns a non-empty vector."""

        answers: list[Any] = []

        def answered() -> list[Any]:
            res = self.query(expr)
            answers[:] = [res]
            return list(res["data"]["result"]) if res.get("status") == "success" else []

        return wait_for(answered, timeout, 0.25, lambda: f"{expr!r} to return data: {answers}")

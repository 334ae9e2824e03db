"""The ``trainguard-exporter`` command: parse flags, validate the config, serve.

Flags are in the style of the Prometheus exporter family; the config is validated at start, then
the exporter serves until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import gc
import logging
import signal
import sys
import threading
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from prometheus_client.process_collector import ProcessCollector

from trainguard._version import __version__
from trainguard.exporter.collectors import COLLECTORS
from trainguard.exporter.collectors.runs.collector import STATE_DIR_MISSING
from trainguard.exporter.config.model import Config, ConfigError, load_config, resolve_state_dir
from trainguard.exporter.http.app import SCRAPE_TIMEOUT_OFFSET, make_app, make_http_server
from trainguard.exporter.http.webconfig import WebConfigError, load_web_config
from trainguard.exporter.runs.table import RunTable, Setup
from trainguard.exporter.scrape.collector import (
    DEFAULT_COLLECTOR_TIMEOUT,
    Collector,
    ExporterCollector,
    ExporterRegistry,
)
from trainguard.shared.statedir import STATE_DIR_ENV
from trainguard.shared.units import parse_duration

log = logging.getLogger("trainguard")

LOG_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "error": logging.ERROR,
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="trainguard-exporter",
        description="Prometheus exporter that tells within one scrape that a GPU training run "
        "died, stalled, holds ghost GPU memory or left a truncated checkpoint.",
    )
    p.add_argument(
        "--web.listen-address",
        dest="listen_address",
        default=":9636",
        metavar="ADDR",
        help="address to listen on; ':9636' is every interface, use '127.0.0.1:9636' to keep "
        "it on this host (default: %(default)s)",
    )
    p.add_argument(
        "--web.telemetry-path",
        dest="telemetry_path",
        default="/metrics",
        metavar="PATH",
        help="path under which to expose metrics (default: %(default)s)",
    )
    p.add_argument(
        "--web.config.file",
        dest="web_config_file",
        default=None,
        metavar="FILE",
        help="web configuration file (TLS, basic auth) in the format Prometheus exporters share",
    )
    p.add_argument(
        "--config.file",
        dest="config_file",
        default=None,
        metavar="FILE",
        help="optional YAML config: runs not using trainguard.Run, process name counts",
    )
    p.add_argument(
        "--state.dir",
        dest="state_dir",
        default=None,
        metavar="DIR",
        help=f"directory where training processes write heartbeats (default: ${STATE_DIR_ENV}, "
        "the config file's state_dir, or a per-user state directory)",
    )
    p.add_argument(
        "--collector.timeout",
        dest="collector_timeout",
        default=DEFAULT_COLLECTOR_TIMEOUT,
        type=_timeout,
        metavar="DURATION",
        help="the scrape's deadline: the collectors run side by side, and one still running "
        "then (a hung GPU driver or network filesystem) is reported failed while the others' "
        "series are served. Prometheus's X-Prometheus-Scrape-Timeout-Seconds header, less "
        f"{SCRAPE_TIMEOUT_OFFSET:g}s, shortens it (default: %(default)ss)",
    )
    for c in COLLECTORS:
        p.add_argument(
            f"--collector.{c.name}",
            dest=f"collector_{c.name}",
            action=argparse.BooleanOptionalAction,
            default=c.enabled_by_default,
            help=f"enable the {c.name} collector: {c.help} "
            f"(default: {'enabled' if c.enabled_by_default else 'disabled'})",
        )
    p.add_argument(
        "--log.level",
        dest="log_level",
        default="info",
        choices=sorted(LOG_LEVELS),
        help="only log messages of this severity or above (default: %(default)s)",
    )
    p.add_argument("--version", action="version", version=f"trainguard-exporter {__version__}")
    return p


def _timeout(value: str) -> float:
    """A positive duration, in the one grammar of the config file (``8s``, ``2.5``, ``1500ms``)."""
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive duration, got {value!r}")
    return seconds


def default_collectors() -> list[str]:
    """The names of the collectors on unless switched off."""
    return [c.name for c in COLLECTORS if c.enabled_by_default]


def build_collectors(
    config: Config, state_dir: Path, enabled: Collection[str] | None = None
) -> list[Collector]:
    """Build the enabled collectors (None: those on by default).

    Each is wired to what they share (see :class:`~trainguard.exporter.runs.table.Setup`).
    """
    on = default_collectors() if enabled is None else enabled
    setup = Setup(config, state_dir, RunTable(config, state_dir))
    return [c.build(setup) for c in COLLECTORS if c.name in on]


def build_registry(
    collectors: Sequence[Collector], timeout: float = DEFAULT_COLLECTOR_TIMEOUT
) -> ExporterRegistry:
    registry = ExporterRegistry()
    registry.register(ExporterCollector(collectors, timeout))
    ProcessCollector(registry=registry)
    return registry


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=LOG_LEVELS[args.log_level],
        format="time=%(asctime)s level=%(levelname)s source=%(name)s msg=%(message)s",
        stream=sys.stderr,
    )
    if not args.telemetry_path.startswith("/") or args.telemetry_path in ("/", "/-/healthy"):
        print(
            f"trainguard-exporter: error: --web.telemetry-path: expected a path starting with '/' "
            f"other than '/' and '/-/healthy', got {args.telemetry_path!r}",
            file=sys.stderr,
        )
        return 2
    try:
        config = load_config(args.config_file)
    except ConfigError as exc:
        print(f"trainguard-exporter: error: {exc}", file=sys.stderr)
        return 2
    for warning in config.warnings:
        log.warning("%s", warning)
    try:
        web = load_web_config(args.web_config_file)
    except WebConfigError as exc:
        print(f"trainguard-exporter: error: --web.config.file: {exc}", file=sys.stderr)
        return 2
    state_dir = resolve_state_dir(args.state_dir, config)
    enabled = [c.name for c in COLLECTORS if getattr(args, f"collector_{c.name}")]
    collectors = build_collectors(config, state_dir, enabled)
    app = make_app(build_registry(collectors, args.collector_timeout), args.telemetry_path, web)
    try:
        server = make_http_server(args.listen_address, app, web.ssl_context)
    except (OSError, ValueError) as exc:
        print(
            f"trainguard-exporter: error: --web.listen-address {args.listen_address!r}: {exc}",
            file=sys.stderr,
        )
        return 2

    def stop(signum: int, frame: Any) -> None:
        log.info("received signal %d, shutting down", signum)
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    # Everything alive now (modules, config, collectors) lives as long as the process: move it
    # out of the cyclic garbage collector's sight, so that a full collection, which a scrape's
    # allocations trigger every few dozen scrapes, walks the caches rather than every object
    # of every imported module (the bulk of the p99 scrape latency at the target load).
    gc.collect()
    gc.freeze()
    host, port = server.server_address[:2]
    log.info(
        "trainguard-exporter %s listening on %s port %d (%s%s), metrics at %s, state dir %s, "
        "collectors %s",
        __version__,
        host or "*",
        port,
        "https" if web.ssl_context else "http",
        ", basic auth" if web.users else "",
        args.telemetry_path,
        state_dir,
        ",".join(enabled) or "none",
    )
    if "runs" in enabled and not state_dir.is_dir():
        log.warning(STATE_DIR_MISSING, state_dir)  # a typo here would otherwise never page
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0

import gzip
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from helpers.exporter_proc import Exporter, child_env, value
from trainguard import __version__


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainguard", *args],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_version_and_help() -> None:
    r = run_cli("--version")
    assert r.returncode == 0
    assert r.stdout.strip() == f"trainguard-exporter {__version__}"
    r = run_cli("--help")
    assert r.returncode == 0
    for flag in (
        "--web.listen-address",
        "--web.telemetry-path",
        "--web.config.file",
        "--config.file",
        "--state.dir",
        "--log.level",
        "--collector.gpu",
        "--no-collector.gpu",
        "--no-collector.checkpoints",
    ):
        assert flag in r.stdout


def test_collectors_can_be_switched_off(tmp_path) -> None:
    """node_exporter-style --no-collector.NAME: the collector is not run at all (no
    collector_success series, none of its metrics), the others still are."""
    args = ["--no-collector.gpu", "--no-collector.processes"]
    with Exporter(args=args, state_dir=tmp_path) as exp:
        s = exp.scrape()
        log = exp.stop()
    collectors = {dict(lbl)["collector"] for (n, lbl) in s if n == "trainguard_collector_success"}
    assert collectors == {"runs", "checkpoints", "restore"}
    assert not [n for (n, _) in s if n.startswith(("trainguard_gpu_", "trainguard_process_count"))]
    assert "collectors runs,checkpoints,restore" in log
    # and on again explicitly: the default
    with Exporter(args=["--collector.gpu"], state_dir=tmp_path) as exp:
        s = exp.scrape()
    assert value(s, "trainguard_collector_duration_seconds", collector="gpu") is not None


def test_starts_without_nvml_or_config(tmp_path) -> None:
    # no libnvidia-ml on this path (a host without an NVIDIA driver): the gpu collector has
    # nothing to watch, which is not a failure; the scrape answers
    env = {"LD_LIBRARY_PATH": str(tmp_path)}
    with Exporter(env=env, state_dir=tmp_path / "state") as exp:
        first = exp.scrape()
        second = exp.scrape()
        for s in (first, second):
            assert value(s, "trainguard_collector_success", collector="gpu") == 1
            assert value(s, "trainguard_gpu_nvml_available") == 0
        assert value(first, "trainguard_collector_success", collector="processes") == 1
        assert value(first, "trainguard_exporter_build_info", version=__version__) == 1
        assert value(first, "trainguard_collector_duration_seconds", collector="gpu") is not None
        log = exp.stop()
    # the reason is logged once, without a traceback, not at every scrape
    assert log.count("no NVIDIA driver") == 1, log
    assert "Traceback" not in log


def test_landing_page_health_and_404(tmp_path) -> None:
    with Exporter(args=["--web.telemetry-path=/prom"], state_dir=tmp_path) as exp:
        page = exp.get("/")
        assert 'href="/prom"' in page
        assert exp.get("/-/healthy").strip() == "Healthy"
        assert "trainguard_exporter_build_info" in exp.get("/prom")
        with pytest.raises(urllib.error.HTTPError) as err:
            exp.get("/nope")
        assert err.value.code == 404
        req = urllib.request.Request(exp.url + "/", method="POST", data=b"x")
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=5)
        assert err.value.code == 405


def test_bad_config_is_a_clear_error(tmp_path) -> None:
    cfg = tmp_path / "tg.yml"
    cfg.write_text("process_counts:\n  - name: vmmem\n    matches: '^vmmem'\n")
    r = run_cli(f"--config.file={cfg}")
    assert r.returncode == 2
    assert (
        f"error: {cfg}:3:5: process_counts[0].matches: unknown key; expected one of: name, match\n"
        in r.stderr
    )


def test_bad_listen_address(tmp_path) -> None:
    r = run_cli("--web.listen-address=nonsense", f"--state.dir={tmp_path}")
    assert r.returncode == 2
    assert "--web.listen-address 'nonsense'" in r.stderr


#: what Prometheus 2.42 sends at every scrape (captured from the Debian package)
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


def test_text_format_gzipped_for_clients_that_ask(tmp_path) -> None:
    """Prometheus prefers OpenMetrics; it gets the text format, like node_exporter's default."""
    with Exporter(state_dir=tmp_path) as exp:
        url = exp.url + "/metrics"
        for accept in (PROMETHEUS_ACCEPT, "text/plain", "application/openmetrics-text"):
            req = urllib.request.Request(
                url, headers={"Accept": accept, "Accept-Encoding": "deflate, gzip;q=0.9"}
            )
            with urllib.request.urlopen(req, timeout=10) as r:
                assert r.headers["Content-Encoding"] == "gzip"
                assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
                raw = r.read()
            # the header's XFL byte says how hard it was compressed: 4 "fastest" (our level
            # 1: a tenth of the CPU), not prometheus_client's 2 "maximum" (level 9)
            assert raw[8] == 4
            body = gzip.decompress(raw)
            assert b"trainguard_exporter_build_info" in body
            assert b"# EOF" not in body
        # no gzip unless asked for
        with urllib.request.urlopen(url, timeout=10) as r:
            assert r.headers["Content-Encoding"] is None
            assert b"trainguard_exporter_build_info" in r.read()


def test_config_warnings_are_logged_at_start(tmp_path) -> None:
    cfg = tmp_path / "tg.yml"
    cfg.write_text('runs:\n  - name: sd\n    process_match: "^python3?$"\n')
    with Exporter(args=[f"--config.file={cfg}"], state_dir=tmp_path / "state") as exp:
        log = exp.stop()
    assert "runs[0].process_match: '^python3?$' matches the interpreter name 'python'" in log

"""One site configuration for the rules and the dashboards: ``alerts/build.py`` and
``grafana/generate.py`` take the same ``--set``/``--config``, and the dashboards follow it (the
site's target labels kept in every grouping, its thresholds drawn on the panels).

The site here adds ``region`` to its target labels and changes thresholds that panels draw. The
queries are evaluated with the real ``promtool`` over two regions that both run ``llama-ft`` in
the same cluster and namespace, beside the rules generated with the same options.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from alerts import build
from grafana import generate
from helpers import dashboard_queries as queries

GIB = 1024**3
TARGET_LABELS = "cluster, namespace, region, job, instance"
#: the target labels a dashboard grouping keeps: all but job and instance, in the site's order
KEPT = ["cluster", "namespace", "region"]
SITE = [
    "--set",
    f"target_labels={TARGET_LABELS}",
    "--set",
    "unattributed_floor=3GiB",
    "--set",
    "leak_horizon=12h",
    "--set",
    "stall=30m",
    "--set",
    "log_stale=1h",
    "--set",
    "volume_fill_window=12h",
    "--set",
    "volume_fill_horizon=2d",
]
THROUGHPUT = {"throughput_baseline": "12h"}  # from a --config file: the two sources combine

_GROUPING_RE = re.compile(r"\b(by|on) \(([^)]*)\)")


@pytest.fixture(scope="module")
def site_output(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Rules and dashboards generated for the site by the two command lines."""
    out = tmp_path_factory.mktemp("site")
    config = out / "site.yml"
    config.write_text(yaml.safe_dump(THROUGHPUT), encoding="utf-8")
    options = ["--config", str(config), *SITE]
    assert build.main([*options, "-o", str(out / "trainguard.rules.yml")]) == 0
    assert generate.main([*options, "-o", str(out / "dashboards")]) == 0
    return out


@pytest.fixture(scope="module")
def dashboards(site_output: Path) -> dict[str, dict[str, Any]]:
    return queries.load_dashboards(site_output / "dashboards")


def _panel(dashboards: dict[str, dict[str, Any]], uid: str, title: str) -> dict[str, Any]:
    board = dashboards[f"{uid}.json"]
    found = [p for p in queries.walk_panels(board["panels"]) if p.get("title") == title]
    assert len(found) == 1, f"{uid}: {len(found)} panels titled {title!r}"
    return found[0]


def _steps(panel: dict[str, Any]) -> list[tuple[float | None, str]]:
    steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    return [(s["value"], s["color"]) for s in steps]


def test_every_grouping_keeps_the_site_target_labels(dashboards: dict[str, dict[str, Any]]) -> None:
    seen = 0
    for q in queries.extract_queries(dashboards):
        for keyword, labels in _GROUPING_RE.findall(q.raw):
            seen += 1
            names = [name.strip() for name in labels.split(",")]
            assert names[: len(KEPT)] == KEPT, (
                f"{q.dashboard_uid} / {q.title}: {keyword} ({labels}) in {q.raw}"
            )
    assert seen > 40  # the check saw the dashboards' aggregations and joins


def test_panels_draw_the_site_thresholds(
    site_output: Path, dashboards: dict[str, dict[str, Any]]
) -> None:
    gpu, runs = "trainguard-gpu-memory", "trainguard-runs"
    unattributed = _panel(dashboards, gpu, "Unattributed device memory")
    assert _steps(unattributed) == [(None, "green"), (3 * GIB, "red")]
    # the rules generated with the same options fire at the very value the panel turns red at
    rules = (site_output / "trainguard.rules.yml").read_text(encoding="utf-8")
    assert f"trainguard_gpu_memory_unattributed_bytes > {3 * GIB}\n" in rules

    to_full = _panel(dashboards, gpu, "Time until full at the current leak pace")
    assert _steps(to_full) == [(None, "red"), (12 * 3600, "orange"), (4 * 12 * 3600, "green")]
    assert "AllocatorMemoryLeak's horizon (12h;" in to_full["description"]

    heartbeat = _panel(dashboards, runs, "Heartbeat age")
    assert _steps(heartbeat) == [(None, "green"), (900, "orange"), (1800, "red")]
    assert "(at least 30m)" in _panel(dashboards, runs, "Time since last step")["description"]

    usual = _panel(dashboards, runs, "Steps per minute")["targets"][1]
    assert usual["legendFormat"].endswith("usual (p90 12h)")
    assert usual["expr"].endswith(")[12h:1m])")

    # the two panels that contradicted their alerts with literals
    log_age = _panel(dashboards, runs, "Log age")
    assert _steps(log_age) == [(None, "green"), (1800, "orange"), (3600, "red")]
    assert "Unchanged for 1h while the run is alive is TrainingLogStale" in log_age["description"]
    ckpt = "trainguard-checkpoints"
    until_full = _panel(dashboards, ckpt, "Time until volume is full")
    assert _steps(until_full) == [(None, "red"), (2 * 86400, "green")]
    assert "deriv(trainguard_checkpoint_filesystem_avail_bytes{" in until_full["targets"][0]["expr"]
    assert "[12h]) > 0)" in until_full["targets"][0]["expr"]
    forecast = _panel(dashboards, ckpt, "Free space and 2d forecast")["targets"][3]["expr"]
    assert "[12h], 172800))" in forecast
    # ...as CheckpointVolumeFillingUp's prediction
    assert re.search(
        r"predict_linear\(\s+trainguard_checkpoint_filesystem_avail_bytes\[12h\],\s+172800\s+\)",
        rules,
    )


def test_both_generators_take_the_same_options(
    site_output: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = ["--config", str(site_output / "site.yml")]
    capsys.readouterr()
    assert build.main(["--list", *config, *SITE]) == 0
    listed = capsys.readouterr().out
    assert generate.main(["--list", *config, *SITE]) == 0
    assert capsys.readouterr().out == listed
    assert yaml.safe_load(listed)["target_labels"] == TARGET_LABELS

    out = site_output / "dashboards"
    assert generate.main([*config, *SITE, "-o", str(out), "--check"]) == 0
    # the site's dashboards are not the defaults: --check without the options says so, and
    # names the command that regenerates them as they were asked for
    assert generate.main(["-o", str(out), "--check"]) == 1
    assert "is stale: run python grafana/generate.py -o" in capsys.readouterr().err
    assert generate.main([*SITE, "-o", str(out), "--check"]) == 1  # the config file is missing
    assert f"run python grafana/generate.py --set 'target_labels={TARGET_LABELS}'" in (
        capsys.readouterr().err
    )

    for main in (build.main, generate.main):
        assert main(["--set", "stall=soon", "-o", str(site_output / "bad")]) == 2
        err = capsys.readouterr().err
        assert "threshold stall (duration): expected a duration such as" in err, err
        assert "got 'soon'" in err, err
    assert not (site_output / "bad").exists()


# --- evaluated with promtool over two regions --------------------------------------------------


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found: install the Debian package 'prometheus'")
    return path


TARGET = {"cluster": "gpu", "namespace": "ml", "job": "trainguard", "instance": "node0:9636"}


def _series(name: str, region: str, value: int, **labels: str) -> dict[str, str]:
    inner = ",".join(f'{k}="{v}"' for k, v in {**TARGET, "region": region, **labels}.items())
    return {"series": f"{name}{{{inner}}}", "values": f"{value}x30"}


def _sample(value: int, labels: dict[str, str]) -> dict[str, Any]:
    return {"labels": "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}", "value": value}


def _kept(region: str, **labels: str) -> dict[str, str]:
    """The labels of a dashboard series: the kept target labels, then its own."""
    return {"cluster": "gpu", "namespace": "ml", "region": region, **labels}


#: the same cluster, namespace, exporter address and run in two regions
INPUT = [
    _series("trainguard_run_step", "east", 100, run="llama-ft", rank="0"),
    _series("trainguard_run_step", "west", 200, run="llama-ft", rank="0"),
    _series("trainguard_checkpoint_last_step", "east", 90, run="llama-ft", location="primary"),
    _series("trainguard_checkpoint_last_step", "west", 150, run="llama-ft", location="primary"),
    # above the default floor (1GiB) in both regions, above the site's (3GiB) in one
    _series("trainguard_gpu_memory_unattributed_bytes", "east", 4 * GIB, gpu="0", uuid="GPU-e"),
    _series("trainguard_gpu_memory_unattributed_bytes", "west", 2 * GIB, gpu="0", uuid="GPU-w"),
]


def _dashboard_tests(exprs: dict[str, str]) -> list[dict[str, Any]]:
    """The Step panel draws one line per region, and the steps-at-risk join pairs each
    region's step with its own checkpoint (instead of failing as many-to-many)."""
    return [
        {
            "expr": exprs["Step"],
            "eval_time": "5m",
            "exp_samples": [
                _sample(100, _kept("east", run="llama-ft", rank="0")),
                _sample(200, _kept("west", run="llama-ft", rank="0")),
            ],
        },
        {
            "expr": exprs["Steps since last complete checkpoint"],
            "eval_time": "5m",
            "exp_samples": [
                _sample(10, _kept("east", run="llama-ft", location="primary")),
                _sample(50, _kept("west", run="llama-ft", location="primary")),
            ],
        },
    ]


def _promtool_test(workdir: Path, doc: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    path = workdir / "two_regions_test.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return subprocess.run(
        [_promtool(), "test", "rules", str(path)], capture_output=True, text=True, timeout=120
    )


def test_two_regions_stay_two_in_rules_and_dashboards(
    site_output: Path, dashboards: dict[str, dict[str, Any]]
) -> None:
    exprs = {title: expr for _, title, expr in queries.iter_queries(dashboards)}
    record = {"__name__": "run:trainguard_run_steps_since_checkpoint:max", **TARGET}
    doc = {
        "rule_files": ["trainguard.rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": INPUT,
                "promql_expr_test": [
                    *_dashboard_tests(exprs),
                    # the rules' own view of the same: per region, as the dashboard shows it
                    {
                        "expr": "run:trainguard_run_steps_since_checkpoint:max",
                        "eval_time": "5m",
                        "exp_samples": [
                            _sample(10, {**record, "region": "east", "run": "llama-ft"}),
                            _sample(50, {**record, "region": "west", "run": "llama-ft"}),
                        ],
                    },
                    # the alert fires where the panel turns red: above the site's 3GiB
                    {
                        "expr": 'ALERTS{alertname="GPUUnattributedMemory",alertstate="firing"}',
                        "eval_time": "20m",
                        "exp_samples": [
                            _sample(
                                1,
                                {
                                    "__name__": "ALERTS",
                                    "alertname": "GPUUnattributedMemory",
                                    "alertstate": "firing",
                                    **TARGET,
                                    "region": "east",
                                    "gpu": "0",
                                    "uuid": "GPU-e",
                                    "severity": "warning",
                                },
                            )
                        ],
                    },
                ],
            }
        ],
    }
    result = _promtool_test(site_output, doc)
    assert result.returncode == 0, result.stdout + result.stderr


def test_default_dashboards_merge_the_two_regions(tmp_path: Path) -> None:
    """The check above has teeth: the committed dashboards (default target labels, no region)
    draw the two regions' runs as one line, and their join fails as many-to-many."""
    exprs = {title: expr for _, title, expr in queries.iter_queries()}
    doc = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {"interval": "1m", "input_series": INPUT, "promql_expr_test": _dashboard_tests(exprs)}
        ],
    }
    result = _promtool_test(tmp_path, doc)
    assert result.returncode != 0
    out = result.stdout + result.stderr
    assert "many-to-many" in out or "got:" in out, out


def test_a_site_without_run_labels_still_parses(tmp_path: Path) -> None:
    """Target labels of job and instance alone: the groupings keep nothing more (``by (run)``)
    and every query is still PromQL (``promtool check rules``)."""
    out = tmp_path / "dashboards"
    assert generate.main(["--set", "target_labels=job, instance", "-o", str(out)]) == 0
    got = queries.extract_queries(queries.load_dashboards(out))
    groupings = [labels for q in got for _, labels in _GROUPING_RE.findall(q.raw)]
    assert "run" in groupings and "run, rank" in groupings
    assert not [g for g in groupings if g.startswith(("cluster", ","))]
    rules = {
        "groups": [
            {
                "name": "dashboard_queries",
                "rules": [{"record": f"q_{i}", "expr": q.expr} for i, q in enumerate(got)],
            }
        ]
    }
    path = tmp_path / "queries.rules.yml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False), encoding="utf-8")
    result = subprocess.run(
        [_promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(got)} rules found" in result.stdout

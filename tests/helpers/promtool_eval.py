"""Evaluate a PromQL expression with promtool over samples scraped from the real exporter, with
the shipped rules loaded (their recording rules are evaluated too): ``promtool test rules``
with one ``promql_expr_test``, the scraped values held constant over the input window."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

import yaml

from helpers.exporter_proc import REPO, Samples

RULES = REPO / "alerts" / "trainguard.rules.yml"
PROMTOOL = shutil.which("promtool")
#: what Prometheus adds at scrape time, and what the rules join on
TARGET = {"job": "trainguard", "instance": "gpu-host:9636"}
#: the scraped values are held this many minutes; the expression is read at the end
WINDOW_MIN = 30


def _selector(name: str, labels: Mapping[str, str]) -> str:
    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    inner = ",".join(f'{k}="{esc(v)}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def _number(v: float) -> str:
    text = repr(float(v))
    return text[:-2] if text.endswith(".0") else text


def shipped_alert_expr(alert: str) -> str:
    """The ``expr`` of the first rule named ``alert`` in alerts/trainguard.rules.yml."""
    doc = yaml.safe_load(RULES.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == alert:
                return str(rule["expr"])
    raise LookupError(f"no alert {alert} in {RULES}")


def rules_test_file(
    samples: Samples,
    expr: str,
    expected: Iterable[tuple[str, Mapping[str, str], float]],
    prefix: str = "trainguard_",
) -> dict[str, object]:
    """The promtool unit-test document: every scraped ``prefix`` sample as an input series
    (with ``TARGET``'s labels), ``expr`` expected to give exactly ``expected`` (name, labels
    without the target's, value) at the end of the window."""
    series = []
    for (name, labels), v in sorted(samples.items(), key=lambda kv: (kv[0][0], sorted(kv[0][1]))):
        if not name.startswith(prefix):
            continue
        series.append(
            {
                "series": _selector(name, {**dict(labels), **TARGET}),
                "values": f"{_number(v)}x{WINDOW_MIN}",
            }
        )
    return {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [
                    {
                        "expr": expr,
                        "eval_time": f"{WINDOW_MIN}m",
                        "exp_samples": [
                            {"labels": _selector(n, {**dict(lbl), **TARGET}), "value": float(v)}
                            for n, lbl, v in expected
                        ],
                    }
                ],
            }
        ],
    }


def promtool_expect(
    samples: Samples,
    expr: str,
    expected: Iterable[tuple[str, Mapping[str, str], float]],
    workdir: Path,
) -> subprocess.CompletedProcess[str]:
    """Run ``promtool test rules`` on :func:`rules_test_file`; the caller asserts on
    ``returncode`` (promtool prints what it got instead on a mismatch)."""
    if PROMTOOL is None:
        raise AssertionError("promtool is not on PATH (tests/gpu/run-on-device.sh carries one)")
    path = workdir / "promtool_test.yml"
    path.write_text(yaml.safe_dump(rules_test_file(samples, expr, expected), sort_keys=False))
    return subprocess.run(
        [PROMTOOL, "test", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

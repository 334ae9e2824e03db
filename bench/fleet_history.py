"""Hours of history for bench/bench_fleet.py's fleet, so that long-range rules read full windows.

A run of a few minutes gives ``max_over_time(x[6h])`` a few minutes of samples; a Prometheus
that has watched the fleet for hours gives it 1440 per series. ``--history-hours H`` closes that
gap for every series the rules read over a range or at an offset (:func:`ranged_series`): after
a short first session, in which the recording rules have written their series, the bench asks
Prometheus for each such series and its value, writes the hours before that session as
OpenMetrics (every 15 s, each series back to its rule's range or ``H``, whichever is shorter;
values moving as the live simulation moves them) and turns it into TSDB blocks with
``promtool tsdb create-blocks-from openmetrics``; the measured session then starts on that
data directory. Series the rules read only at the present are not backfilled.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

STEP = 15  # seconds: the scrape and evaluation interval
STEPS_PER_S = 2.0  # bench/fleet_node.py's pace

#: a range or offset in PromQL: ``name{...}[6h]`` or ``name{...} offset 30m``
_RANGED = re.compile(
    r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{[^}]*\})?\s*(?:\[(\d+)([smhd])\]|offset (\d+)([smhd]))"
)
_UNIT = {"s": 1 / 3600, "m": 1 / 60, "h": 1.0, "d": 24.0}
_LOOKBACK_H = 5 / 60  # an instant selector with an offset looks back 5 minutes from there
_NOT_SERIES = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset"}


def record_steps(rules: Path) -> dict[str, int]:
    """The seconds between samples of each recorded series: its group's interval (a series
    a slow group records every 5 minutes has one sample per 5 minutes of history)."""
    out: dict[str, int] = {}
    for group in yaml.safe_load(rules.read_text())["groups"]:
        interval = group.get("interval", f"{STEP}s")
        seconds = int(interval[:-1]) * {"s": 1, "m": 60, "h": 3600}[interval[-1]]
        for rule in group["rules"]:
            if "record" in rule:
                out[rule["record"]] = seconds
    return out


def ranged_series(rules: Path) -> dict[str, float]:
    """Each series the rules' expressions read over a range or at an offset, with the longest
    such reach in hours (``up`` as the fleet's ``up{job="trainguard"}``)."""
    out: dict[str, float] = {}
    for group in yaml.safe_load(rules.read_text())["groups"]:
        for rule in group["rules"]:
            for m in _RANGED.finditer(rule["expr"]):
                name = m[1]
                if name in _NOT_SERIES:
                    continue
                ranged = int(m[3]) * _UNIT[m[4]] if m[3] else None
                hours = ranged if ranged is not None else int(m[5]) * _UNIT[m[6]] + _LOOKBACK_H
                key = 'up{job="trainguard"}' if name == "up" else name
                out[key] = max(out.get(key, 0.0), hours)
    return out


Series = tuple[dict[str, str], float, float]  # labels (with __name__), value now, hours back


def snapshot(base: str, rules: Path, hours: float) -> list[Series]:
    """Each ranged series Prometheus at ``base`` holds now, its value, how far back."""
    out: list[Series] = []
    for selector, window in ranged_series(rules).items():
        url = f"{base}/api/v1/query?query={urllib.parse.quote(selector)}"
        with urllib.request.urlopen(url, timeout=60) as r:
            result = json.loads(r.read())["data"]["result"]
        for s in result:
            out.append((dict(s["metric"]), float(s["value"][1]), min(window, hours)))
    return out


def past_value(name: str, now_value: float, ago: float, phase: float, at: float) -> float:
    """The value ``ago`` seconds before ``now_value`` (read at ``at``), moving as
    bench/fleet_node.py moves it: the clock's timestamps and the step go back, counters,
    flags, steps of checkpoints and deaths stay, measured values wander by about 1 %."""
    if "timestamp" in name and now_value > at - 300:
        return now_value - ago
    if name in ("trainguard_run_step", "run:trainguard_run_step:max"):
        return max(0.0, float(int(now_value - STEPS_PER_S * ago)))
    if (
        now_value in (0.0, 1.0)
        or name == "up"
        or name.endswith("_total")
        or "timestamp" in name
        or "last_step" in name
        or "death_step" in name
    ):
        return now_value
    v = now_value * (1 + 0.01 * math.sin((-ago) / 97 + phase))
    return float(round(v)) if now_value.is_integer() and abs(now_value) >= 1000 else v


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def write_openmetrics(
    path: Path, series: list[Series], end: float, at: float, steps_of: dict[str, int] | None = None
) -> int:
    """The history of ``series`` up to ``end`` (Unix seconds) as OpenMetrics; the sample count.

    A series named in ``steps_of`` (:func:`record_steps`) gets one sample per that many seconds,
    others one per STEP.
    """
    by_name: dict[str, list[Series]] = {}
    for s in series:
        by_name.setdefault(s[0]["__name__"], []).append(s)
    count = 0
    with path.open("w") as f:
        for name, members in by_name.items():
            f.write(f"# TYPE {name} gauge\n")
            for k, (labels, value, hours) in enumerate(members):
                text = ",".join(
                    f'{key}="{_escape(v)}"'
                    for key, v in sorted(labels.items())
                    if key != "__name__"
                )
                prefix = f"{name}{{{text}}} "
                phase = (k * 104_729) % 1000 / 1000 * 2 * math.pi
                step = (steps_of or {}).get(name, STEP)
                steps = int(hours * 3600 // step)
                lines = []
                for i in range(steps, 0, -1):
                    ago = i * step
                    lines.append(
                        f"{prefix}{past_value(name, value, ago, phase, at)!r} {end - ago:.3f}\n"
                    )
                f.writelines(lines)
                count += steps
        f.write("# EOF\n")
    return count


def backfill(promtool: str, openmetrics: Path, data_dir: Path) -> None:
    """Turn the OpenMetrics file into blocks in Prometheus's data directory."""
    subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(openmetrics), str(data_dir)],
        check=True,
        stdout=subprocess.DEVNULL,
    )

"""Hours of history for bench/bench_fleet.py's fleet, so that long-range rules read full windows.

A run of a few minutes gives ``max_over_time(x[6h])`` a few minutes of samples; a Prometheus
that has watched the fleet for hours gives it 1440 per series. ``--history-hours H`` closes that
gap for the series the rules read over ranges of 30 minutes or more (:data:`LONG_RANGE`): after
a short first session, in which the recording rules have written their series, the bench asks
Prometheus for each such series and its value, writes the hours before that session as
OpenMetrics (every 15 s, each series back to its rule's range or ``H``, whichever is shorter;
values moving as the live simulation moves them) and turns it into TSDB blocks with
``promtool tsdb create-blocks-from openmetrics``; the measured session then starts on that
data directory. Series read only over short ranges are not backfilled: their windows fill
within the run.
"""

from __future__ import annotations

import json
import math
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

STEP = 15  # seconds: the scrape and evaluation interval

#: the series the shipped rules read over ranges of 30 minutes or more, with that range in
#: hours (alerts/trainguard.rules.yml; the longest where a series is read over several)
LONG_RANGE: tuple[tuple[str, float], ...] = (
    ("run_rank:trainguard_run_step_age_seconds:running", 6),
    ("run_rank:trainguard_run_step_gap_seconds:max", 4),
    ("run_rank:trainguard_run_steps_per_second:deriv", 6),
    ("trainguard_checkpoint_filesystem_avail_bytes", 6),
    ("trainguard_checkpoint_last_timestamp_seconds", 3),
    ("trainguard_checkpoint_location_up", 3),
    ("trainguard_checkpoint_last_step", 24 * 7),
    ("run:trainguard_run_step:max", 3),
    ('up{job="trainguard"}', 24),
    ("instance:trainguard_run_active_ranks:sum", 24),
    ("run:trainguard_run_death_step_distance:new", 24),
    ("trainguard_gpu_memory_unattributed_bytes", 1),
    ("uuid_run:trainguard_gpu_training:group", 1),
    ("trainguard_gpu_ecc_uncorrected_errors_total", 1),
    ("trainguard_gpu_xid_errors_total", 1),
    ("trainguard_run_allocator_allocated_bytes", 0.5),
    ("run_rank_device:trainguard_run_allocator_allocated_bytes:floor", 0.5),
    ("trainguard_run_allocator_ooms_total", 0.5),
    ("trainguard_run_memory_snapshots_total", 0.5),
    ("trainguard_run_log_modified_timestamp_seconds", 0.5),
)

Series = tuple[dict[str, str], float, float]  # labels (with __name__), value now, hours back


def snapshot(base: str, hours: float) -> list[Series]:
    """Each long-range series Prometheus at ``base`` holds now, its value, how far back."""
    out: list[Series] = []
    for selector, window in LONG_RANGE:
        url = f"{base}/api/v1/query?query={urllib.parse.quote(selector)}"
        with urllib.request.urlopen(url, timeout=60) as r:
            result = json.loads(r.read())["data"]["result"]
        for s in result:
            out.append((dict(s["metric"]), float(s["value"][1]), min(window, hours)))
    return out


def past_value(name: str, now_value: float, ago: float, phase: float) -> float:
    """The value ``ago`` seconds before ``now_value``, moving as bench/fleet_node.py moves it."""
    if "timestamp" in name and now_value > 1e9:
        return now_value - ago
    if name == "run:trainguard_run_step:max":
        return max(0.0, float(int(now_value - 2.0 * ago)))
    if now_value in (0.0, 1.0) or name == "up" or "last_step" in name or "death_step" in name:
        return now_value
    v = now_value * (1 + 0.01 * math.sin((-ago) / 97 + phase))
    return float(round(v)) if now_value.is_integer() and abs(now_value) >= 1000 else v


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def write_openmetrics(path: Path, series: list[Series], end: float) -> int:
    """The history of ``series`` up to ``end`` (Unix seconds) as OpenMetrics; the sample count."""
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
                steps = int(hours * 3600 // STEP)
                lines = []
                for i in range(steps, 0, -1):
                    ago = i * STEP
                    lines.append(
                        f"{prefix}{past_value(name, value, ago, phase)!r} {end - ago:.3f}\n"
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

"""Scrapes of real exporters turned into promtool ``input_series`` over simulated minutes.

The alerts that matter for a job of many nodes need tens of minutes of history (a stall
threshold learnt from the run's pace, a slow rank ``for: 15m``), which a test cannot wait for.
What the exporters expose over a few real seconds is stretched instead: each :class:`Phase`
(stepping, then stuck, say) is a few real scrapes of every exporter, held for a number of
simulated minutes. Counters (and the step) keep growing at the rate measured between the
phase's first and last scrape; the ages that are clocks (time since start, since the last step
while the run does not step) grow one minute a minute; every other sample is the phase's real
scrapes replayed in turn (heartbeat ages, step ages of a stepping run, the info series). A
series absent from a scrape is absent (``_``) for that minute.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from helpers.exporter_proc import Samples

#: what Prometheus adds at scrape time (with ``instance``), and what the rules join on
JOB = "trainguard"
#: ages that are a clock since an event, growing in every phase
CLOCKS = ("trainguard_run_start_age_seconds", "trainguard_run_last_death_age_seconds")
#: the age since the last step: a clock only in a phase where the run does not step
STEP_AGE = "trainguard_run_step_age_seconds"
#: gauges that grow with progress, like counters
PROGRESS = ("trainguard_run_step",)

Key = tuple[str, frozenset[tuple[str, str]]]


@dataclass
class Phase:
    """Real scrapes of every exporter (``(seconds, {instance: samples})``), held ``minutes``.

    ``stepping``: the run steps during the phase (its step age is replayed, not a clock).
    """

    minutes: int
    stepping: bool
    scrapes: Sequence[tuple[float, Mapping[str, Samples]]] = ()

    def snapshots(self) -> list[tuple[float, dict[Key, float]]]:
        """Each scrape as one sample set, every sample labelled with its target."""
        out = []
        for when, by_instance in self.scrapes:
            merged: dict[Key, float] = {}
            for instance, samples in by_instance.items():
                for (name, labels), v in samples.items():
                    if not name.startswith("trainguard_") or name.endswith("_created"):
                        continue
                    if math.isnan(v):
                        continue
                    target = frozenset({("job", JOB), ("instance", instance)})
                    merged[(name, frozenset(labels) | target)] = v
                merged[("up", frozenset({("job", JOB), ("instance", instance)}))] = 1.0
            out.append((when, merged))
        return out


def _is_counter(name: str) -> bool:
    return name.endswith("_total") or name in PROGRESS


def _number(v: float) -> str:
    text = repr(float(v))
    return text[:-2] if text.endswith(".0") else text


def _selector(key: Key) -> str:
    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    name, labels = key
    return name + "{" + ",".join(f'{k}="{esc(v)}"' for k, v in sorted(labels)) + "}"


def input_series(phases: Sequence[Phase]) -> list[dict[str, str]]:
    """promtool ``input_series`` (interval 1m) for the phases one after the other."""
    snaps = [p.snapshots() for p in phases]
    keys = sorted({k for phase in snaps for _, s in phase for k in s})
    series = []
    for key in keys:
        name = key[0]
        values: list[str] = []
        carried: float | None = None  # a counter's simulated value at the previous phase's end
        last_real: float | None = None  # ...and its last real value then
        minute = 0
        for phase, shots in zip(phases, snaps, strict=True):
            present = [(t, s[key]) for t, s in shots if key in s]
            first = present[0] if present else None
            last = present[-1] if present else None
            rate = 0.0
            if first and last and last[0] > first[0] and last[1] >= first[1]:
                rate = (last[1] - first[1]) / (last[0] - first[0])
            base = None
            if first is not None and _is_counter(name):
                base = first[1]
                if carried is not None and last_real is not None:
                    base = carried + max(0.0, first[1] - last_real)
            for j in range(phase.minutes):
                shot = shots[j % len(shots)][1]
                if key not in shot and not (_is_counter(name) and first is not None):
                    values.append("_")
                elif _is_counter(name) and base is not None:
                    values.append(_number(base + rate * 60 * j))
                elif name in CLOCKS and first is not None:
                    values.append(_number(first[1] + 60 * (minute + j)))
                elif name == STEP_AGE and not phase.stepping and last is not None:
                    values.append(_number(last[1] + 60 * j))
                else:
                    values.append(_number(shot[key]))
            if base is not None and last is not None:
                carried, last_real = base + rate * 60 * (phase.minutes - 1), last[1]
            minute += phase.minutes
        series.append({"series": _selector(key), "values": " ".join(values)})
    return series

"""Every threshold of trainguard's alert rules, with its kind and meaning: the ONE place to change
a default. Overrides (``--set``, ``--config``) are parsed and validated here, by kind
(``alerts/kinds.py``), so a typo is an error naming the threshold and the kind of value it
expects instead of a rule file Prometheus rejects (or, worse, loads).

The rule modules (``alerts/rules/``) refer to a threshold as ``${name}``. A duration also
provides ``${name_s}`` (its seconds, for comparisons with ages) and a byte size ``${name_h}``
(``2GiB``, for annotations); see :func:`resolve`. ``${slow_rules_lookback}`` is derived:
three times ``slow_rules_interval``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from alerts.kinds import (
    BYTES,
    DURATION,
    LABELS,
    NUMBER,
    SELECTOR,
    URL,
    XIDS,
    Kind,
    format_duration,
)
from trainguard.exporter.yamlfile import ConfigError, load_yaml

Value = str | int | float


class ThresholdError(ValueError):
    """A bad override: unknown name, or a value that is not of the threshold's kind."""


# ------------------------------------------------------------------------------- thresholds


@dataclass(frozen=True)
class Threshold:
    """One tunable value of the rules: its default here, its meaning in ``doc``."""

    name: str
    default: Value
    kind: Kind
    doc: str


# Order matters: it is the order of the generated file's header and of --list.
THRESHOLDS: tuple[Threshold, ...] = (
    Threshold(
        "job_selector",
        'job=~"trainguard.*"',
        SELECTOR,
        "Selector for Prometheus' own `up` series of the trainguard scrape job(s), used by "
        "TrainguardExporterDown; the other alerts select by metric name.",
    ),
    Threshold(
        "target_labels",
        "cluster, namespace, job, instance",
        LABELS,
        "Labels that identify a scrape target, kept by every aggregation and join of the rules "
        "(and used to select an alert's own series in annotation queries): on a global "
        "Prometheus or Thanos, runs of two clusters stay apart and alerts keep their routing "
        "labels. A label absent from the series costs nothing; add those your relabelling sets "
        "(node, region...). Must include job and instance.",
    ),
    Threshold(
        "runbook_base",
        'http://{{ or $labels.instance "localhost:9636" }}/runbook',
        URL,
        "Where the runbook lives; each alert links to <runbook_base>#<alertname lowercased>. "
        "The default is the runbook the exporter ships and serves at /runbook, on the "
        "exporter the alert is about (an alert without an instance, the Watchdog: "
        "localhost:9636). Set your wiki's address here (https://wiki.example.com/trainguard), "
        "or https:// where the exporter serves TLS.",
    ),
    Threshold(
        "slow_rules_interval",
        "5m",
        DURATION,
        "Evaluation interval of the group trainguard.rules.slow: the recording rules over days "
        "([7d] changes, max_over_time, min_over_time), too costly to evaluate every 15s. Their "
        "readers look back 3 intervals (last_over_time), so a late evaluation leaves no gap.",
    ),
    Threshold(
        "keep_firing_for",
        "10m",
        DURATION,
        "TrainingProcessDied and the other alerts on a lasting state of a run keep firing this "
        "long after their condition was last seen (Prometheus' keep_firing_for): a missed scrape, "
        "an exporter or Prometheus restart must not resolve them and page a second time.",
    ),
    Threshold(
        "stall",
        "10m",
        DURATION,
        "TrainingStalled: the least time without a new step (or without a heartbeat) that is a "
        "stall, however fast the run steps.",
    ),
    Threshold(
        "stall_factor",
        3,
        NUMBER,
        "TrainingStalled: a run is stalled after this many times its longest recent interval "
        "between two steps (its own pace: slow steps are not a stall)...",
    ),
    Threshold(
        "stall_window",
        "6h",
        DURATION,
        "TrainingStalled: ...the longest interval between steps seen within this window "
        "(recording rule run_rank:trainguard_run_step_gap_seconds:max)...",
    ),
    Threshold(
        "stall_max",
        "4h",
        DURATION,
        "TrainingStalled: ...but never more than this, which is also the threshold while the "
        "run's pace is not known yet (before it completed an interval between two steps).",
    ),
    Threshold(
        "first_step",
        "1h",
        DURATION,
        "TrainingNoFirstStep: a live process that has reported no step this long after it "
        "started (NCCL rendezvous, data loader, checkpoint loading hung).",
    ),
    Threshold(
        "throughput_ratio",
        0.5,
        NUMBER,
        "TrainingThroughputDropped: a live run stepping at less than this fraction of its usual "
        "rate...",
    ),
    Threshold(
        "throughput_window",
        "10m",
        DURATION,
        "TrainingThroughputDropped: ...its rate now being deriv(step) over this window, within "
        "the current process (a just started or resumed process has no rate for this long)...",
    ),
    Threshold(
        "throughput_baseline",
        "6h",
        DURATION,
        "TrainingThroughputDropped: ...its usual rate the 90th percentile of that rate over "
        "this window (earlier processes of the run included: a slower relaunch counts)...",
    ),
    Threshold(
        "throughput_for",
        "15m",
        DURATION,
        "TrainingThroughputDropped: ...for this long.",
    ),
    Threshold(
        "log_stale",
        "30m",
        DURATION,
        "TrainingLogStale: the run's log file not modified for this long (by Prometheus's "
        "clock: no change of its mtime) while the run is alive, and was alive this long ago.",
    ),
    Threshold(
        "checkpoint_stale",
        "3h",
        DURATION,
        "CheckpointStale: newest complete checkpoint unchanged for this long (Prometheus's "
        "clock) while the run is alive (and was alive this long ago, so a freshly resumed run "
        "does not fire).",
    ),
    Threshold(
        "steps_at_risk_factor",
        3,
        NUMBER,
        "StepsAtRisk: steps since the newest complete primary checkpoint above this many times "
        "the run's usual step distance between checkpoints.",
    ),
    Threshold(
        "checkpoint_cadence_window",
        "7d",
        DURATION,
        "StepsAtRisk: the window over which the usual step distance between checkpoints is "
        "estimated (recording rule run:trainguard_checkpoint_step_cadence:avg).",
    ),
    Threshold(
        "steps_at_risk_for",
        "10m",
        DURATION,
        "StepsAtRisk: how long the steps must stay at risk before the alert fires.",
    ),
    Threshold(
        "checkpoint_damage_for",
        "2m",
        DURATION,
        "CheckpointTruncated / CheckpointHashMismatch: how long the damage must be seen before "
        "paging (the exporter already ignores files still inside their write grace period).",
    ),
    Threshold(
        "partial_orphaned",
        "30m",
        DURATION,
        "CheckpointPartialOrphaned: a .part file not modified for this long.",
    ),
    Threshold(
        "checkpoint_unjudged_for",
        "30m",
        DURATION,
        "CheckpointUnknownMtime, CheckpointUnrecordedFiles: how long checkpoint files that cannot "
        "be judged (mtime 0; no record where records are expected) are seen before warning.",
    ),
    Threshold(
        "volume_fill_window",
        "6h",
        DURATION,
        "CheckpointVolumeFillingUp: the window of the linear prediction of free space.",
    ),
    Threshold(
        "volume_fill_horizon",
        "24h",
        DURATION,
        "CheckpointVolumeFillingUp: the prediction says the volume is full within this long...",
    ),
    Threshold(
        "volume_fill_min_checkpoints",
        10,
        NUMBER,
        "CheckpointVolumeFillingUp: ...and fewer than this many average-sized checkpoints still "
        "fit.",
    ),
    Threshold(
        "volume_fill_for",
        "30m",
        DURATION,
        "CheckpointVolumeFillingUp: how long both must hold before the alert fires.",
    ),
    Threshold(
        "checkpoint_fit_margin",
        1.25,
        NUMBER,
        "CheckpointWillNotFit: the location's free space below this many times the largest of "
        "its newest checkpoints (the next one is as big, plus growth and other writers)...",
    ),
    Threshold(
        "checkpoint_fit_for",
        "10m",
        DURATION,
        "CheckpointWillNotFit: ...for this long while the run is active (longer than a save "
        "and the prune after it, whose dip in free space is no alarm).",
    ),
    Threshold(
        "ghost_ratio",
        1.5,
        NUMBER,
        "GPUGhostMemory: driver-view VRAM of a run's rank above this many times its allocator "
        "reserved memory...",
    ),
    Threshold(
        "ghost_floor",
        "2GiB",
        BYTES,
        "GPUGhostMemory: ...and above it by at least this much (robust to the CUDA context's "
        "fixed ~300-600 MiB).",
    ),
    Threshold(
        "ghost_window",
        "5m",
        DURATION,
        "GPUGhostMemory: both conditions must hold for the whole of this window...",
    ),
    Threshold(
        "ghost_for",
        "10m",
        DURATION,
        "GPUGhostMemory: ...and then for this long before the alert fires.",
    ),
    Threshold(
        "ghost_context_allowance",
        "600MiB",
        BYTES,
        "GPUGhostMemory per GPU (where NVML cannot attribute memory to processes: WDDM/WSL): "
        "device memory each live process is allowed beyond its allocator's reserved bytes (its "
        "CUDA context, cuBLAS/cuDNN workspaces)...",
    ),
    Threshold(
        "ghost_device_floor",
        "3GiB",
        BYTES,
        "GPUGhostMemory per GPU: ...and the device's used memory must exceed that by this much "
        "(and by ghost_ratio), for ghost_window and ghost_for. Above the per-rank ghost_floor: "
        "on a desktop the display and other applications use the GPU too.",
    ),
    Threshold(
        "unattributed_floor",
        "1GiB",
        BYTES,
        "GPUUnattributedMemory: device VRAM used that no live process accounts for, above this.",
    ),
    Threshold(
        "unattributed_for",
        "15m",
        DURATION,
        "GPUUnattributedMemory: how long the unattributed memory must stay before the alert fires.",
    ),
    Threshold(
        "duplicate_process_for",
        "5m",
        DURATION,
        "DuplicateHostProcess: more than one instance of a configured host process for this long.",
    ),
    Threshold(
        "xid_critical",
        "48,62,64,74,79,95,119,120,140,154",
        XIDS,
        "GPUXidError (critical): Xid codes after which the GPU needs a reset, a reboot or "
        "service before it can train again (fallen off the bus, uncontained ECC, GSP, "
        "NVLink...; the table is in the runbook).",
    ),
    Threshold(
        "xid_warning",
        "13,31,43,61,63,69,92,94,109",
        XIDS,
        "GPUXidError (warning): Xid codes that killed or hurt the application but leave the GPU "
        "usable (a contained ECC error, a page fault, a retired page...). A code in both lists "
        "is critical; codes in neither (45, a follow-up of others) do not alert.",
    ),
    Threshold(
        "xid_window",
        "1h",
        DURATION,
        "GPUXidError: an Xid counted within this window fires at once and resolves when the "
        "window holds no new one.",
    ),
    Threshold(
        "alloc_retry_window",
        "10m",
        DURATION,
        "AllocatorRetrying: cudaMalloc retries in every window of this length...",
    ),
    Threshold(
        "alloc_retry_for",
        "15m",
        DURATION,
        "AllocatorRetrying: ...for this long.",
    ),
    Threshold(
        "oom_window",
        "5m",
        DURATION,
        "AllocatorOOM, AllocatorOOMCaught: a rank that stepped within this window is still "
        "making progress after its OOM (warning); one that did not, or whose process is gone, "
        "pages.",
    ),
    Threshold(
        "oom_recent",
        "30m",
        DURATION,
        "AllocatorOOM, AllocatorOOMCaught: an OOM (or OOM memory snapshot) within this window is "
        "news; also a counter that appeared above 0 within it while Prometheus was scraping the "
        "exporter (an OOM in the first batch).",
    ),
    Threshold(
        "leak_floor_window",
        "5m",
        DURATION,
        "AllocatorMemoryLeak: a rank's allocated memory floor is its minimum over this window "
        "(recording rule run_rank_device:trainguard_run_allocator_allocated_bytes:floor): what "
        "it keeps across steps; a spike inside a step does not raise it...",
    ),
    Threshold(
        "leak_warmup",
        "30m",
        DURATION,
        "AllocatorMemoryLeak: ...no warning in a process's first leak_warmup + leak_window "
        "(the ramp of the first steps: optimizer state, caches, the longest batch so far)...",
    ),
    Threshold(
        "leak_window",
        "30m",
        DURATION,
        "AllocatorMemoryLeak: ...the floor's pace (deriv) and its growth per step are measured "
        "over this window...",
    ),
    Threshold(
        "leak_rise_window",
        "10m",
        DURATION,
        "AllocatorMemoryLeak: ...the floor must be above its value this long ago at every "
        "evaluation for leak_for (a steady climb, not one step up)...",
    ),
    Threshold(
        "leak_horizon",
        "24h",
        DURATION,
        "AllocatorMemoryLeak: ...and at that pace fill the device (its headroom above the "
        "recent peak of allocated memory) within this long...",
    ),
    Threshold(
        "leak_for",
        "30m",
        DURATION,
        "AllocatorMemoryLeak: ...all of it for this long.",
    ),
    Threshold(
        "frag_window",
        "10m",
        DURATION,
        "AllocatorFragmentation: averages of reserved, allocated and inactive split bytes over "
        "this window, and cudaMalloc retries within it...",
    ),
    Threshold(
        "frag_free_ratio",
        0.3,
        NUMBER,
        "AllocatorFragmentation: ...reserved bytes not allocated (the allocator's free cache) "
        "above this fraction of reserved...",
    ),
    Threshold(
        "frag_free_floor",
        "2GiB",
        BYTES,
        "AllocatorFragmentation: ...and above this many bytes...",
    ),
    Threshold(
        "frag_split_share",
        0.5,
        NUMBER,
        "AllocatorFragmentation: ...with inactive split bytes above this fraction of that free "
        "cache (free, but in pieces of split blocks that large requests cannot use)...",
    ),
    Threshold(
        "frag_for",
        "15m",
        DURATION,
        "AllocatorFragmentation: ...while cudaMalloc retries happen, for this long.",
    ),
    Threshold(
        "collector_failing_for",
        "5m",
        DURATION,
        "TrainguardCollectorFailing: a collector failed every scrape for this long.",
    ),
    Threshold(
        "exporter_down_for",
        "5m",
        DURATION,
        "TrainguardExporterDown: Prometheus failed to scrape the exporter for this long.",
    ),
    Threshold(
        "exporter_down_active_lookback",
        "1d",
        DURATION,
        "TrainguardExporterDown is critical when the target was watching an active run at the "
        "last evaluation before it vanished, looking back at most this far; a target that left "
        "service discovery is remembered (and alerted on) this long.",
    ),
    Threshold(
        "restart_window",
        "1h",
        DURATION,
        "TrainingProcessRestarted: a restarted run recorded a death whose last heartbeat is less "
        "than this old (one alert per death, firing this long).",
    ),
    Threshold(
        "repeated_death_window",
        "24h",
        DURATION,
        "RepeatedDeathNearSameStep: a death recorded within this window...",
    ),
    Threshold(
        "repeated_death_steps",
        500,
        NUMBER,
        "RepeatedDeathNearSameStep: ...whose step lies within this many steps of the previous "
        "recorded death(s).",
    ),
    # ---- GPU health (alerts/rules/gpu_health.py)
    Threshold(
        "gpu_slowdown_for",
        "10m",
        DURATION,
        "GPUHardwareSlowdown: a GPU with a training process on it held down by a hardware "
        "reason (HW slowdown, HW thermal, HW power brake) for this long.",
    ),
    Threshold(
        "pcie_busy_ratio",
        0.5,
        NUMBER,
        "GPUPcieLinkDegraded: the GPU counts as busy with its utilisation, averaged over "
        "pcie_busy_window, at least this (an idle GPU lowers its link on purpose)...",
    ),
    Threshold(
        "pcie_busy_window",
        "5m",
        DURATION,
        "GPUPcieLinkDegraded: ...averaged over this window.",
    ),
    Threshold(
        "pcie_degraded_for",
        "10m",
        DURATION,
        "GPUPcieLinkDegraded: a busy GPU with a training process on it below its maximum PCIe "
        "generation or width for this long.",
    ),
    Threshold(
        "ecc_window",
        "1h",
        DURATION,
        "GPUUncorrectableMemoryErrors: uncorrectable ECC errors counted within this window.",
    ),
    Threshold(
        "released_floor",
        "512MiB",
        BYTES,
        "GPUMemoryNotReleased: memory no live process accounts for, this much above its level "
        "while the run trained on the GPU...",
    ),
    Threshold(
        "released_for",
        "1m",
        DURATION,
        "GPUMemoryNotReleased: ...this long after the last process of the run on it died.",
    ),
    Threshold(
        "released_lookback",
        "1h",
        DURATION,
        "GPUMemoryNotReleased: how long after a run left a GPU it is judged (and how far back "
        "its level while the run trained is taken from).",
    ),
    Threshold(
        "hang_util_ratio",
        0.95,
        NUMBER,
        "The gpu_cause annotation of TrainingStalled and TrainingThroughputDropped names a GPU "
        "of the run busy at least this much...",
    ),
    Threshold(
        "hang_power_ratio",
        0.3,
        NUMBER,
        "...while drawing less than this fraction of its power limit: a collective spinning on a "
        "peer that never comes (the NCCL hang signature).",
    ),
)

BY_NAME: Mapping[str, Threshold] = MappingProxyType({t.name: t for t in THRESHOLDS})
DEFAULTS: Mapping[str, Value] = MappingProxyType({t.name: t.default for t in THRESHOLDS})


# -------------------------------------------------------------------------------- overrides


def parse_set(items: list[str]) -> dict[str, str]:
    """``--set KEY=VALUE`` arguments as a mapping (later ones win)."""
    overrides: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ThresholdError(f"--set expects KEY=VALUE, got {item!r}")
        overrides[key.strip()] = value.strip()
    return overrides


def load_config(path: Path) -> dict[str, object]:
    """A ``--config`` file: a flat YAML mapping of threshold name to value, read as the
    exporter reads its config file (size cap, duplicate keys refused, line and column)."""
    try:
        loaded = load_yaml(path, "thresholds file")
    except ConfigError as exc:
        raise ThresholdError(str(exc)) from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict) or not all(isinstance(k, str) for k in loaded):
        raise ThresholdError(f"{path}: expected a mapping of threshold: value")
    return loaded


def _check_names(overrides: Mapping[str, object]) -> None:
    for key in overrides:
        if key not in BY_NAME:
            raise ThresholdError(f"unknown threshold {key!r}; known: {', '.join(sorted(BY_NAME))}")


def _placeholders(threshold: Threshold, value: object) -> dict[str, str]:
    try:
        parts = threshold.kind.placeholders(value)
    except ValueError as exc:
        kind = threshold.kind
        raise ThresholdError(
            f"threshold {threshold.name} ({kind.name}): {exc}; expected e.g. {kind.hint}"
        ) from None
    return {threshold.name + suffix: text for suffix, text in parts.items()}


def resolve(overrides: Mapping[str, object] | None = None) -> dict[str, str]:
    """Validate overrides and return the placeholder table of the rule templates.

    For a duration ``k``: ``${k}`` is the PromQL duration, ``${k_s}`` the seconds. For a byte
    size ``k``: ``${k}`` is the integer, ``${k_h}`` a human string such as 2GiB.
    """
    overrides = overrides or {}
    _check_names(overrides)
    table: dict[str, str] = {}
    for threshold in THRESHOLDS:
        table.update(_placeholders(threshold, overrides.get(threshold.name, threshold.default)))
    # how far a reader of the slow group's series looks back: three of its intervals
    table["slow_rules_lookback"] = format_duration(3 * int(table["slow_rules_interval_s"]))
    return table


def shown(table: Mapping[str, str]) -> dict[str, str]:
    """Each threshold's value as people write it (2GiB, not 2147483648), in THRESHOLDS order."""
    return {t.name: table[t.name + t.kind.shown] for t in THRESHOLDS}

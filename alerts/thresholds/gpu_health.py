"""Thresholds of the GPU health alerts (``alerts/rules/gpu_health.py``).

They tune when a GPU's hardware state pages (slowdown, PCIe link, ECC, memory not released)
and what the stall and throughput pages name as the GPU cause (the NCCL hang signature).
"""

from __future__ import annotations

from alerts.kinds import BYTES, DURATION, NUMBER
from alerts.thresholds.threshold import Threshold

THRESHOLDS: tuple[Threshold, ...] = (
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
    Threshold(
        "nvlink_window",
        "15m",
        DURATION,
        "GPUNvLinkErrors: NVLink errors (replay, recovery, CRC, ECC) of a GPU a run trains on "
        "counted within this window...",
    ),
    Threshold(
        "nvlink_errors",
        1,
        NUMBER,
        "GPUNvLinkErrors: ...at least this many, all its active links together (a healthy "
        "link counts none).",
    ),
)

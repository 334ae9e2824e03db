"""GPU health panels of the GPU dashboard: which GPU slows a run, and why, at a glance.

Per GPU: why it holds its clocks down, its PCIe link against what it could be, utilisation,
power, temperature, ECC errors, row remapping or page retirement, and NVLink errors (the series
of ``trainguard/exporter/collectors/gpu/health/``); GPUHardwareSlowdown, GPUPcieLinkDegraded,
GPUNvLinkErrors and the memory alerts judge the same.
"""

from __future__ import annotations

from grafana.panels import NONZERO_IS_BAD, Panel, table_panel, ts
from grafana.promql import I, Promql

PER_GPU = "{{instance}} GPU {{gpu}}"
LINK = "instance, gpu, uuid"


def panels(q: Promql) -> list[Panel]:
    """The section's panels, in dashboard order."""
    ecc_window = q.site.shown("ecc_window")
    return [
        table_panel(
            "GPU health now",
            "Per GPU, now: the PCIe link (generation and lanes) against what GPU and slot allow "
            "together, temperature against the GPU's own slowdown temperature, power against "
            "the enforced limit, utilisation, uncorrectable ECC errors since the driver loaded, "
            "and row remapping. An idle GPU lowers its link on purpose; GPUPcieLinkDegraded "
            "judges the link only while the GPU is busy. Empty cells: the GPU does not report "
            "that reading (ECC on a GeForce, remapped rows before Ampere).",
            [
                q.by(LINK, "trainguard_gpu_pcie_link_generation", "max", I),
                q.by(LINK, "trainguard_gpu_pcie_link_generation_max", "max", I),
                q.by(LINK, "trainguard_gpu_pcie_link_width", "max", I),
                q.by(LINK, "trainguard_gpu_pcie_link_width_max", "max", I),
                q.by(LINK, "trainguard_gpu_utilization_ratio", "max", I),
                q.by(LINK, "trainguard_gpu_temperature_celsius", "max", I),
                q.by(LINK, "trainguard_gpu_temperature_slowdown_celsius", "max", I),
                q.by(LINK, "trainguard_gpu_power_usage_watts", "max", I),
                q.by(LINK, "trainguard_gpu_power_limit_watts", "max", I),
                q.by(LINK, "trainguard_gpu_ecc_uncorrected_errors_total", "max", I),
                q.by(LINK, "trainguard_gpu_row_remap_pending", "max", I),
                q.by(LINK, "trainguard_gpu_row_remap_failed", "max", I),
            ],
            columns={
                "instance": ("Exporter", ""),
                "gpu": ("GPU", ""),
                "uuid": ("UUID", ""),
                "Value #A": ("PCIe gen", "none"),
                "Value #B": ("max gen", "none"),
                "Value #C": ("lanes", "none"),
                "Value #D": ("max lanes", "none"),
                "Value #E": ("Utilisation", "percentunit"),
                "Value #F": ("Temperature", "celsius"),
                "Value #G": ("slows at", "celsius"),
                "Value #H": ("Power", "watt"),
                "Value #I": ("limit", "watt"),
                "Value #J": ("Uncorrectable ECC", "none"),
                "Value #K": ("Remap pending", "none"),
                "Value #L": ("Remap failed", "none"),
            },
            thresholds=NONZERO_IS_BAD,
        ),
        ts(
            "Clock event reasons",
            "One line per GPU and reason the driver gives for holding its clocks below their "
            "maximum, at 1 while it holds. hw_slowdown, hw_thermal_slowdown and "
            "hw_power_brake_slowdown slow a run (GPUHardwareSlowdown, on a GPU a run trains "
            "on, for 10 minutes); sw_power_cap at full load and gpu_idle are normal.",
            "none",
            [
                (
                    q.by("instance, gpu, reason", "trainguard_gpu_clock_event_reason", "max", I),
                    f"{PER_GPU} {{{{reason}}}}",
                )
            ],
            bars=True,
            minimum=0,
        ),
        ts(
            "PCIe link generation and lanes",
            "The PCIe generation and lane count each GPU's link runs at (solid) against what GPU "
            "and slot allow (dashed). Low while idle is normal; low while busy is a degraded "
            "link.",
            "none",
            [
                (f"trainguard_gpu_pcie_link_generation{{{I}}}", f"{PER_GPU} gen"),
                (f"trainguard_gpu_pcie_link_generation_max{{{I}}}", f"{PER_GPU} gen max"),
                (f"trainguard_gpu_pcie_link_width{{{I}}}", f"{PER_GPU} lanes"),
                (f"trainguard_gpu_pcie_link_width_max{{{I}}}", f"{PER_GPU} lanes max"),
            ],
            minimum=0,
            dashed="/ max$/",
        ),
        ts(
            "Utilisation",
            "Fraction of time a kernel ran on each GPU. 100% at low power while the run does not "
            "step is the signature of a collective (NCCL) waiting on a peer.",
            "percentunit",
            [(f"trainguard_gpu_utilization_ratio{{{I}}}", PER_GPU)],
            minimum=0,
        ),
        ts(
            "Power draw vs enforced limit",
            "Board power per GPU (solid) against the limit the driver enforces (dashed).",
            "watt",
            [
                (f"trainguard_gpu_power_usage_watts{{{I}}}", f"{PER_GPU} draw"),
                (f"trainguard_gpu_power_limit_watts{{{I}}}", f"{PER_GPU} limit"),
            ],
            minimum=0,
            dashed="/ limit$/",
        ),
        ts(
            f"ECC errors per {ecc_window}",
            f"Memory errors per GPU over the last {ecc_window}: corrected ones are ECC doing its "
            "job (a "
            "fast rise precedes row remaps); any uncorrectable one pages "
            "(GPUUncorrectableMemoryErrors).",
            "none",
            [
                (
                    f"sum {q.group_by('instance, gpu')} (increase("
                    f"trainguard_gpu_ecc_corrected_errors_total{{{I}}}[{ecc_window}]))",
                    f"{PER_GPU} corrected",
                ),
                (
                    f"sum {q.group_by('instance, gpu')} (increase("
                    f"trainguard_gpu_ecc_uncorrected_errors_total{{{I}}}[{ecc_window}]))",
                    f"{PER_GPU} uncorrectable",
                ),
            ],
            minimum=0,
            colors={"/uncorrectable$/": "red"},
        ),
        ts(
            "Retired memory pages (GPUs before Ampere)",
            "Pages each GPU before Ampere has retired over its life, by cause (solid), and "
            "whether a retirement waits for a GPU reset (dashed, 1 = waiting: "
            "GPURetiredPagesPending pages, the bad page is still in use until then). Ampere and "
            "later GPUs remap rows instead (the table above); no line here for them.",
            "none",
            [
                (
                    q.by("instance, gpu, cause", "trainguard_gpu_retired_pages_total", "max", I),
                    f"{PER_GPU} {{{{cause}}}}",
                ),
                (
                    q.by("instance, gpu", "trainguard_gpu_retired_pages_pending", "max", I),
                    f"{PER_GPU} pending",
                ),
            ],
            minimum=0,
            dashed="/ pending$/",
            colors={"/ double_bit_ecc$/": "red", "/ pending$/": "orange"},
        ),
        ts(
            "NVLink errors per hour",
            "Errors counted on each GPU's active NVLink links over the last hour, per link and "
            "kind (replay, recovery, CRC, ECC). Each replay or recovery stalls the collectives "
            "over that link; GPUNvLinkErrors warns while a run trains on the GPU. No line: a "
            "PCIe card without NVLink.",
            "none",
            [
                (
                    f"sum {q.group_by('instance, gpu, link, error')} (increase("
                    f"trainguard_gpu_nvlink_errors_total{{{I}}}[1h]))",
                    f"{PER_GPU} link {{{{link}}}} {{{{error}}}}",
                )
            ],
            w=24,
            minimum=0,
            colors={"/ recovery$/": "red"},
        ),
    ]

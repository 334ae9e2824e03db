"""Alerts on a GPU that slows a run down or whose memory is failing.

GPUHardwareSlowdown, GPUPcieLinkDegraded, GPUMemoryNotReleased, GPUUncorrectableMemoryErrors,
GPURowRemapFailure, GPURowRemapPending, GPURetiredPagesPending, GPUNvLinkErrors. The three
judged over minutes (slowdown, PCIe link, NVLink) are evaluated every window_rules_interval
(``WINDOW``), the rest at every evaluation.

The slowdown and link rules judge only a GPU a training process is on (the driver's process
list, or, where it lists none as under WSL, the live runs' allocator devices by UUID) and never
a normal state: the software power cap at full load, the idle reason, an idle GPU that lowered
its link to Gen1, a hot GPU below its own slowdown temperature. Memory that is failing is news
whoever uses the GPU: the next run placed on it dies, so those rules judge every GPU (a pending
remap or retirement is critical only where a run trains on the GPU: elsewhere a reset at the next
opportunity does). NVLink
errors are judged on a GPU a run trains on (they slow its collectives; an idle GPU's link is
news for no one until a run is placed on it).

Longer than 400 lines because the group carries its own thresholds at its top, beside the
rules they tune (one group, one file: a new alert and its thresholds are one edit here, not
a rule here and a table elsewhere); split, the two halves would be one concern again.
"""

from __future__ import annotations

from alerts.kinds import BYTES, DURATION, NUMBER, Threshold
from alerts.rules.common import Alert, Group, Record, query_bytes, query_value
from alerts.rules.gpu import GPU_ARGS, GPU_SEL
from alerts.rules.gpu import SNIPPETS as GPU_SNIPPETS
from alerts.rules.recording import UNATTRIBUTED_MIN

THRESHOLDS: tuple[Threshold, ...] = (
    Threshold(
        "gpu_slowdown_window",
        "10m",
        DURATION,
        "GPUHardwareSlowdown: a GPU with a training process on it held down by a hardware "
        "reason (HW slowdown, HW thermal, HW power brake) at a share of its scrapes within "
        "this window...",
    ),
    Threshold(
        "gpu_slowdown_share",
        0.5,
        NUMBER,
        "GPUHardwareSlowdown: ...at least this share (a sawtooth counts: the run is that much "
        "slower, as DCGM's violation counters measure it)...",
    ),
    Threshold(
        "gpu_slowdown_for",
        "10m",
        DURATION,
        "GPUHardwareSlowdown: ...and that for this long before it fires.",
    ),
    Threshold(
        "pcie_busy_ratio",
        0.05,
        NUMBER,
        "GPUPcieLinkDegraded: a GPU whose utilisation, averaged over pcie_busy_window, is below "
        "this is idle and not judged (an idle GPU lowers its link on purpose); a data-starved "
        "run above it is, and a MIG GPU (no utilisation) too...",
    ),
    Threshold(
        "pcie_busy_window",
        "5m",
        DURATION,
        "GPUPcieLinkDegraded: ...averaged over this window, in which the link never reached its "
        "maximum generation or width.",
    ),
    Threshold(
        "pcie_degraded_for",
        "10m",
        DURATION,
        "GPUPcieLinkDegraded: a GPU a run trains on below its maximum PCIe generation or width "
        "for this long.",
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
        "GPUNvLinkErrors: NVLink errors of a GPU a run trains on are judged within this window...",
    ),
    Threshold(
        "nvlink_recoveries",
        1,
        NUMBER,
        "GPUNvLinkErrors: ...at least this many recovery errors (a link that went down and "
        "retrained), all its active links together...",
    ),
    Threshold(
        "nvlink_corrected_rate",
        100,
        NUMBER,
        "GPUNvLinkErrors: ...or errors the link corrects itself (replay, CRC of flits or data, "
        "ECC of data) at least this many per second on one link and kind, averaged over the "
        "window (DCGM's limit for CRC errors: below it they cost nothing measurable).",
    ),
)

HW_REASONS = "hw_slowdown|hw_thermal_slowdown|hw_power_brake_slowdown"


def _gpu_value(metric: str, fmt: str = 'printf "%.0f"', suffix: str = "") -> str:
    return query_value(metric + "{" + GPU_SEL + "}", GPU_ARGS, fmt, suffix=suffix)


SNIPPETS = {
    "unattributed_min": UNATTRIBUTED_MIN,  # PromQL: the slow group's record
    "hw_reasons": HW_REASONS,
    "gpu_name": GPU_SNIPPETS["gpu_name"],
    # "hw_thermal_slowdown, sw_power_cap": the reasons the clocks are held down now
    "reasons": (
        "{{ range $i, $s := printf `trainguard_gpu_clock_event_reason{"
        + GPU_SEL
        + "}` "
        + GPU_ARGS
        + ' | query | sortByLabel "reason" }}{{ if $i }}, {{ end }}{{ $s.Labels.reason }}'
        "{{ else }}none now{{ end }}"
    ),
    # "llama-ft, eval-7b": the runs with a process on the GPU now
    "runs": (
        "{{ range $i, $s := printf `uuid_run:trainguard_gpu_training:group{${target_labels_sel},"
        'uuid=%q}` ${target_labels_args} $labels.uuid | query | sortByLabel "run" }}'
        "{{ if $i }}, {{ end }}{{ $s.Labels.run }}{{ else }}none{{ end }}"
    ),
    "gpu_used": query_bytes("trainguard_gpu_memory_used_bytes{" + GPU_SEL + "}", GPU_ARGS),
    "uninterruptible": query_bytes(
        "trainguard_gpu_memory_uninterruptible_bytes{" + GPU_SEL + "}", GPU_ARGS
    ),
    # the runs that had a process on the GPU within released_lookback
    "recent_runs_here": (
        "{{ range $i, $s := printf `max by (${target_labels}, run) (max_over_time("
        "uuid_run:trainguard_gpu_training:group{${target_labels_sel},uuid=%q}"
        "[${released_lookback}]))` ${target_labels_args} $labels.uuid"
        ' | query | sortByLabel "run" }}'
        "{{ if $i }}, {{ end }}{{ $s.Labels.run }}{{ else }}none{{ end }}"
    ),
    "temperature": _gpu_value("trainguard_gpu_temperature_celsius", suffix=" °C"),
    "slowdown_temperature": _gpu_value("trainguard_gpu_temperature_slowdown_celsius", suffix=" °C"),
    "power": _gpu_value("trainguard_gpu_power_usage_watts", suffix=" W"),
    "power_limit": _gpu_value("trainguard_gpu_power_limit_watts", suffix=" W"),
    "gen": _gpu_value("trainguard_gpu_pcie_link_generation"),
    "gen_max": _gpu_value("trainguard_gpu_pcie_link_generation_max"),
    "width": _gpu_value("trainguard_gpu_pcie_link_width"),
    "width_max": _gpu_value("trainguard_gpu_pcie_link_width_max"),
    "utilization": _gpu_value("trainguard_gpu_utilization_ratio", "humanizePercentage"),
    "ecc_uncorrected": _gpu_value("trainguard_gpu_ecc_uncorrected_errors_total"),
    "rows_uncorrectable": query_value(
        "trainguard_gpu_remapped_rows_total{" + GPU_SEL + ',cause="uncorrectable"}', GPU_ARGS
    ),
    "rows_correctable": query_value(
        "trainguard_gpu_remapped_rows_total{" + GPU_SEL + ',cause="correctable"}', GPU_ARGS
    ),
    "retired_dbe": query_value(
        "trainguard_gpu_retired_pages_total{" + GPU_SEL + ',cause="double_bit_ecc"}', GPU_ARGS
    ),
    "retired_sbe": query_value(
        "trainguard_gpu_retired_pages_total{" + GPU_SEL + ',cause="multiple_single_bit_ecc"}',
        GPU_ARGS,
    ),
    # "link 0 replay +3, link 2 crc_flit +1": the links and kinds that counted errors
    "nvlink_links": (
        "{{ range $i, $s := printf `sum by (${target_labels}, link, error) (increase("
        "trainguard_gpu_nvlink_errors_total{"
        + GPU_SEL
        + "}[${nvlink_window}])) > 0` "
        + GPU_ARGS
        + ' | query | sortByLabel "link" }}{{ if $i }}, {{ end }}link {{ $s.Labels.link }} '
        '{{ $s.Labels.error }} +{{ $s.Value | printf "%.0f" }}{{ else }}none now{{ end }}'
    ),
}

# The GPU causes on the GPUs a run trains on, one series per GPU and cause (evaluated in the
# annotation of the run's own alert, with the run's target labels and name as printf args).
_T = "${target_labels}"
_SEL = "${target_labels_sel}"
_RUN_GPUS = "uuid_run:trainguard_gpu_training:group{" + _SEL + ",run=%q}"
_CAUSES = (
    "max by (" + _T + ", gpu, uuid, cause) ("
    "label_replace(trainguard_gpu_clock_event_reason{" + _SEL + ',reason=~"' + HW_REASONS + '"}'
    ', "cause", "$1", "reason", "(.*)")'
    " or label_replace("
    "(max_over_time(trainguard_gpu_pcie_link_generation{" + _SEL + "}[${pcie_busy_window}])"
    " < trainguard_gpu_pcie_link_generation_max"
    " or max_over_time(trainguard_gpu_pcie_link_width{" + _SEL + "}[${pcie_busy_window}])"
    " < trainguard_gpu_pcie_link_width_max)"
    " unless on (" + _T + ", gpu, uuid)"
    " avg_over_time(trainguard_gpu_utilization_ratio[${pcie_busy_window}])"
    " < ${pcie_busy_ratio}"
    ', "cause", "pcie", "", "")'
    " or label_replace("
    "trainguard_gpu_utilization_ratio{" + _SEL + "} >= ${hang_util_ratio}"
    " and on (" + _T + ", gpu, uuid) trainguard_gpu_power_usage_watts"
    " < ${hang_power_ratio} * trainguard_gpu_power_limit_watts"
    ', "cause", "busy_low_power", "", "")'
    ") and on (" + _T + ", uuid) " + _RUN_GPUS
)
_CAUSE_ARGS = " ".join(["${target_labels_args}"] * _CAUSES.count(_SEL))
_ON_TRAINING = "on (${target_labels}, uuid) uuid_run:trainguard_gpu_training:group"
#: the GPUs with a row remap (a page retirement) waiting for a reset, and those of them a run
#: trains on: recorded once for the warning and the critical alert of each (empty on a healthy
#: fleet, so the four alerts read next to nothing; each read of a per-GPU series costs the same
#: whatever its range, bench/RESULTS.md, "Fleet scale, sixth pass")
REMAP_PENDING = "gpu:trainguard_gpu_row_remap_pending:present"
PAGES_PENDING = "gpu:trainguard_gpu_retired_pages_pending:present"
PENDING_TRAINING = "gpu:trainguard_gpu_reset_pending:training"
_ON_GPU = "on (${target_labels}, gpu, uuid) "
_LINK_ARGS = "${target_labels_args} $s.Labels.uuid"


def _link(metric: str) -> str:
    return (
        "{{ with printf `" + metric + "{" + _SEL + ",uuid=%q}` " + _LINK_ARGS + " | query }}"
        '{{ . | first | value | printf "%.0f" }}{{ else }}?{{ end }}'
    )


#: the ``gpu_cause`` annotation of TrainingStalled and TrainingThroughputDropped: "GPU 3
#: (GPU-...): hw_thermal_slowdown; GPU 3 (GPU-...): PCIe link at Gen2 x16 of Gen5 x16", or
#: "none seen on its GPUs"
GPU_CAUSE = (
    "{{ range $i, $s := printf `" + _CAUSES + "` " + _CAUSE_ARGS + " $labels.run"
    ' | query | sortByLabel "gpu" }}{{ if $i }}; {{ end }}'
    "GPU {{ $s.Labels.gpu }} ({{ $s.Labels.uuid }}): "
    '{{ if eq $s.Labels.cause "pcie" }}PCIe link at Gen'
    + _link("trainguard_gpu_pcie_link_generation")
    + " x"
    + _link("trainguard_gpu_pcie_link_width")
    + " of Gen"
    + _link("trainguard_gpu_pcie_link_generation_max")
    + " x"
    + _link("trainguard_gpu_pcie_link_width_max")
    + '{{ else if eq $s.Labels.cause "busy_low_power" }}busy at low power (utilisation >= '
    "${hang_util_ratio}, power below ${hang_power_ratio}x its limit): the signature of a "
    "collective (NCCL) waiting on a peer that never comes"
    "{{ else }}{{ $s.Labels.cause }} (clocks held down by the hardware){{ end }}"
    "{{ else }}none seen on its GPUs{{ end }}"
)

GROUP = Group(
    "trainguard-gpu-health",
    snippets=SNIPPETS,
    rules=(
        # The runs with a process on each GPU now: the driver's process list (Linux), or the
        # live runs' allocator devices by UUID (WSL, where the driver lists no process).
        Record(
            "uuid_run:trainguard_gpu_training:group",
            """
            group by (${target_labels}, uuid, run) (
              trainguard_gpu_process_memory_used_bytes{run!=""}
            )
            or
            group by (${target_labels}, uuid, run) (
              trainguard_run_allocator_device_info
              and on (${target_labels}, run, rank) trainguard_run_process_up == 1
            )
            """,
        ),
        # The GPU's unattributed level is its least over released_lookback as the slow group
        # recorded it (recording.UNATTRIBUTED_MIN): up to 5m older, a level from before the
        # death either way.
        # nvidia-resiliency-ext waits for exactly this before it restarts workers: memory the
        # driver did not give back after a run's last process on the GPU died. Relative to the
        # GPU's own unattributed level while the run trained (the driver's overhead, a few
        # hundred MiB, is never attributed), so a normal end of a run never pages. Memory a
        # process in D state holds counts too: alive, it accounts for its memory, but once its
        # run is gone it gives it back only when it leaves D state. Not judged where the
        # driver lists no process and gives no Xid events (WSL): there all used memory is
        # "unattributed", and a notebook or a game after a clean finish is not a leak.
        Alert(
            "GPUMemoryNotReleased",
            "critical",
            expr="""
            (
              max by (${target_labels}, gpu, uuid) (
                trainguard_gpu_memory_unattributed_bytes
                + on (${target_labels}, gpu, uuid) trainguard_gpu_memory_uninterruptible_bytes
                or trainguard_gpu_memory_unattributed_bytes
              )
              - on (${target_labels}, gpu, uuid)
              last_over_time(${unattributed_min}[${slow_rules_lookback}])
            ) > ${released_floor}
            and on (${target_labels}, uuid)
            max_over_time(uuid_run:trainguard_gpu_training:group[${released_lookback}])
            unless on (${target_labels}, uuid) uuid_run:trainguard_gpu_training:group
            unless on (${target_labels}, gpu, uuid)
            (
              trainguard_gpu_processes == 0
              and on (${target_labels}, gpu, uuid) trainguard_gpu_xid_events_supported == 0
            )
            """,
            for_="${released_for}",
            keep_firing_for="${keep_firing_for}",
            summary="""
            GPU {{ $labels.gpu }} on {{ $labels.instance }} did not get its memory back after a
            run's last process on it died.
            """,
            description="""
            ${released_for} after the last training process on GPU {{ $labels.gpu }}${gpu_name},
            uuid {{ $labels.uuid }}, on {{ $labels.instance }} died, {{ $value | humanize1024 }}B
            more than while it trained is still in use with no live process accounting for it
            or held by a process in uninterruptible sleep (threshold ${released_floor_h}; used
            now ${gpu_used}; held by processes in D state: ${uninterruptible}). The next run
            placed on this GPU will run out of memory. Runs on it in the last
            ${released_lookback}: ${recent_runs_here}. Kill what is left of those runs (a
            defunct process still holds the context until its parent reaps it); a process in D
            state cannot be killed until it leaves it: if it stays, reset the GPU or reboot; if
            nothing is left, reset the GPU or restart the driver session.
            """,
        ),
        Alert(
            "GPUUncorrectableMemoryErrors",
            "critical",
            expr="increase(trainguard_gpu_ecc_uncorrected_errors_total[${ecc_window}]) > 0",
            keep_firing_for="${keep_firing_for}",
            summary="""
            GPU {{ $labels.gpu }} on {{ $labels.instance }} had uncorrectable memory errors.
            """,
            description="""
            GPU {{ $labels.gpu }}${gpu_name}, uuid {{ $labels.uuid }}, on {{ $labels.instance }}
            counted uncorrectable ECC errors within the last ${ecc_window} (${ecc_uncorrected} since
            the driver loaded). The process that read the bad memory was killed (Xid 48, 94 or 95);
            runs on it now: ${runs}. Drain the GPU and reset it so the row is remapped; check
            GPURowRemapFailure before putting it back.
            """,
        ),
        Record(REMAP_PENDING, "trainguard_gpu_row_remap_pending == 1"),
        Record(PAGES_PENDING, "trainguard_gpu_retired_pages_pending == 1"),
        Record(
            PENDING_TRAINING,
            "(" + REMAP_PENDING + " or " + PAGES_PENDING + ") and " + _ON_TRAINING,
        ),
        Alert(
            "GPURowRemapFailure",
            "critical",
            expr="trainguard_gpu_row_remap_failed == 1",
            keep_firing_for="${keep_firing_for}",
            summary="""
            GPU {{ $labels.gpu }} on {{ $labels.instance }} failed to remap a bad memory row.
            """,
            description="""
            GPU {{ $labels.gpu }}${gpu_name}, uuid {{ $labels.uuid }}, on {{ $labels.instance }}
            could not remap a failing memory row (no spare row left; rows remapped so far:
            ${rows_uncorrectable} for uncorrectable, ${rows_correctable} for correctable errors).
            Its memory will keep failing: the GPU needs service (RMA). Runs on it now: ${runs}.
            """,
        ),
        Alert(
            "GPURowRemapPending",
            "critical",
            expr=REMAP_PENDING + " and " + _ON_GPU + PENDING_TRAINING,
            keep_firing_for="${keep_firing_for}",
            summary="""
            GPU {{ $labels.gpu }} on {{ $labels.instance }} trains run(s) on a bad memory row
            waiting for a reset.
            """,
            description="""
            GPU {{ $labels.gpu }}${gpu_name}, uuid {{ $labels.uuid }}, on {{ $labels.instance }} has
            a memory row remap waiting for a GPU reset while run(s) ${runs} train on it: until the
            reset the bad row stays in use, and the run may die of it (an uncorrectable error
            kills the process that reads it). Save a checkpoint, drain the GPU and reset it
            (nvidia-smi --gpu-reset -i {{ $labels.gpu }}, or reboot).
            """,
        ),
        # nothing trains on it: a reset at the next opportunity, before a run is placed on it
        Alert(
            "GPURowRemapPending",
            "warning",
            expr=REMAP_PENDING + " unless " + _ON_GPU + PENDING_TRAINING,
            keep_firing_for="${keep_firing_for}",
            summary="""
            GPU {{ $labels.gpu }} on {{ $labels.instance }} needs a reset to remap a bad memory
            row.
            """,
            description="""
            GPU {{ $labels.gpu }}${gpu_name}, uuid {{ $labels.uuid }}, on {{ $labels.instance }} has
            a memory row remap waiting for a GPU reset; no run trains on it now. Reset it
            at the next opportunity, before a run is placed on it (nvidia-smi --gpu-reset -i {{
            $labels.gpu }} with nothing on it, or reboot): until then the bad row stays in use.
            """,
        ),
        # GPUs before Ampere retire pages where later ones remap rows: the same need for a reset
        Alert(
            "GPURetiredPagesPending",
            "critical",
            expr=PAGES_PENDING + " and " + _ON_GPU + PENDING_TRAINING,
            keep_firing_for="${keep_firing_for}",
            summary="""
            GPU {{ $labels.gpu }} on {{ $labels.instance }} trains run(s) on a bad memory page
            waiting for a reset.
            """,
            description="""
            GPU {{ $labels.gpu }}${gpu_name}, uuid {{ $labels.uuid }}, on {{ $labels.instance }} has
            a memory page retirement waiting for a GPU reset while run(s) ${runs} train on it: until
            the reset the bad page stays in use, and the run may die of it (an uncorrectable error
            kills the process that reads it). Pages retired so far: ${retired_dbe} for double-bit,
            ${retired_sbe} for repeated single-bit ECC errors. Save a checkpoint, drain the GPU and
            reset it (nvidia-smi --gpu-reset -i {{ $labels.gpu }}, or reboot).
            """,
        ),
        # nothing trains on it: a reset at the next opportunity, before a run is placed on it
        Alert(
            "GPURetiredPagesPending",
            "warning",
            expr=PAGES_PENDING + " unless " + _ON_GPU + PENDING_TRAINING,
            keep_firing_for="${keep_firing_for}",
            summary="""
            GPU {{ $labels.gpu }} on {{ $labels.instance }} needs a reset to retire a bad memory
            page.
            """,
            description="""
            GPU {{ $labels.gpu }}${gpu_name}, uuid {{ $labels.uuid }}, on {{ $labels.instance }} has
            a memory page retirement waiting for a GPU reset; no run trains on it now. Pages retired
            so far: ${retired_dbe} for double-bit, ${retired_sbe} for repeated single-bit ECC
            errors. Reset it at the next opportunity, before a run is placed on it (nvidia-smi
            --gpu-reset -i {{ $labels.gpu }} with nothing on it, or reboot): until then the bad page
            stays in use.
            """,
        ),
    ),
)

#: The alerts on a GPU that slows its run over minutes (a share of a 10m window held for 10m, a
#: link below its best for 10m, link errors within 15m), evaluated every window_rules_interval
#: (1m) instead of every 15 s: each fires up to one interval later. The runs on each GPU are
#: read from GROUP's record, at most one global interval old.
WINDOW = Group(
    "trainguard-gpu-health.window",
    snippets=SNIPPETS,
    interval="${window_rules_interval}",
    rules=(
        Alert(
            "GPUHardwareSlowdown",
            "warning",
            # the share of the GPU's scrapes (its info series is in every one) within the
            # window at which a hardware reason was given: a reason that clears between
            # scrapes, or a missed scrape, does not start the count again
            expr="""
            max by (${target_labels}, gpu, uuid) (
              count_over_time(
                trainguard_gpu_clock_event_reason{reason=~"${hw_reasons}"}[${gpu_slowdown_window}]
              )
            )
            / on (${target_labels}, gpu, uuid)
            sum by (${target_labels}, gpu, uuid) (
              count_over_time(trainguard_gpu_info[${gpu_slowdown_window}])
            )
            >= ${gpu_slowdown_share}
            and on (${target_labels}, uuid) uuid_run:trainguard_gpu_training:group
            """,
            for_="${gpu_slowdown_for}",
            keep_firing_for="${keep_firing_for}",
            summary="""
            GPU {{ $labels.gpu }} on {{ $labels.instance }} is slowed down by its hardware
            while training.
            """,
            description="""
            The driver has held the clocks of GPU {{ $labels.gpu }}${gpu_name}, uuid {{
            $labels.uuid }}, on {{ $labels.instance }} down for a hardware reason at {{ $value |
            humanizePercentage }} of its scrapes over the last ${gpu_slowdown_window}
            (threshold ${gpu_slowdown_share}, for ${gpu_slowdown_for}; reasons now: ${reasons})
            while run(s) ${runs} train on it: they step slower, 3x and more is common.
            Temperature ${temperature} (it slows itself at
            ${slowdown_temperature}), power ${power} (limit ${power_limit}). hw_thermal: cooling
            (fans, airflow, a blocked inlet); hw_power_brake: the chassis or PSU asserted the brake;
            hw_slowdown alone: either, or a failing board.
            """,
        ),
        Alert(
            "GPUPcieLinkDegraded",
            "warning",
            # An idle GPU lowers its link on purpose, and a run's GPU drops it in its idle
            # gaps: the link is judged on its best within the window (a healthy link is at its
            # maximum whenever work arrives), on a GPU a run trains on unless it was idle (its
            # utilisation below pcie_busy_ratio; a MIG GPU has no utilisation and is judged).
            expr="""
            max by (${target_labels}, gpu, uuid) (
              max_over_time(trainguard_gpu_pcie_link_generation[${pcie_busy_window}])
                < trainguard_gpu_pcie_link_generation_max
              or
              max_over_time(trainguard_gpu_pcie_link_width[${pcie_busy_window}])
                < trainguard_gpu_pcie_link_width_max
            )
            unless on (${target_labels}, gpu, uuid)
            avg_over_time(trainguard_gpu_utilization_ratio[${pcie_busy_window}])
              < ${pcie_busy_ratio}
            and on (${target_labels}, uuid) uuid_run:trainguard_gpu_training:group
            """,
            for_="${pcie_degraded_for}",
            keep_firing_for="${keep_firing_for}",
            summary="""
            GPU {{ $labels.gpu }} on {{ $labels.instance }} trains on a degraded PCIe link.
            """,
            description="""
            For ${pcie_degraded_for} GPU {{ $labels.gpu }}${gpu_name}, uuid {{ $labels.uuid }}, on
            {{ $labels.instance }} has been busy (utilisation now ${utilization}) on a PCIe link at
            Gen${gen} x${width} where GPU and slot allow Gen${gen_max} x${width_max}, while run(s)
            ${runs} train on it: every host-device copy and every collective that goes over PCIe is
            that much slower, and nothing else reports it. Reseat the GPU or its riser, check the
            slot's BIOS setting; a link that trains down again needs service.
            """,
        ),
        Alert(
            "GPUNvLinkErrors",
            "warning",
            # a recovery is the link going down and back: any at all; the kinds the link
            # corrects itself by retransmission only at a rate (a few an hour is normal)
            expr="""
            (
              sum by (${target_labels}, gpu, uuid) (
                increase(trainguard_gpu_nvlink_errors_total{error="recovery"}[${nvlink_window}])
              ) >= ${nvlink_recoveries}
              or
              max by (${target_labels}, gpu, uuid) (
                rate(trainguard_gpu_nvlink_errors_total{error!="recovery"}[${nvlink_window}])
              ) >= ${nvlink_corrected_rate}
            )
            and on (${target_labels}, uuid) uuid_run:trainguard_gpu_training:group
            """,
            keep_firing_for="${keep_firing_for}",
            summary="""
            GPU {{ $labels.gpu }} on {{ $labels.instance }} counts NVLink errors while training.
            """,
            description="""
            GPU {{ $labels.gpu }}${gpu_name}, uuid {{ $labels.uuid }}, on {{ $labels.instance }}
            counted NVLink errors within the last ${nvlink_window} (${nvlink_links}) while run(s)
            ${runs} train on it: a link that went down and retrained (recovery, threshold
            ${nvlink_recoveries}), or errors a link corrects itself at ${nvlink_corrected_rate}/s
            or more on one link. Each replay or recovery stalls the collectives over that link,
            so the run steps slower; a link that keeps failing drops out (Xid 74) and takes the
            run with it. Check with nvidia-smi nvlink -e -i {{
            $labels.gpu }}; reseat or replace the NVLink bridge or cable, and drain the GPU if
            recovery errors keep rising.
            """,
        ),
    ),
)

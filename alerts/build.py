#!/usr/bin/env python3
"""Generate alerts/trainguard.rules.yml from one table of thresholds.

Every threshold a user may want to change lives in ``DEFAULTS`` below and nowhere else; the rules
file is generated from it and committed, so Prometheus users who never run Python can still load
it as-is.  A test (tests/test_alerts.py) checks that the committed file equals this script's
output, and promtool unit tests (alerts/tests/) pin the behaviour of the defaults.

    python alerts/build.py                            # rewrite alerts/trainguard.rules.yml
    python alerts/build.py --check                    # exit 1 if the committed file is stale
    python alerts/build.py --set stall=1h --set ghost_ratio=2 -o /etc/prometheus/trainguard.yml
    python alerts/build.py --config my-thresholds.yml -o -      # YAML mapping of overrides; stdout

Why a generator and not "threshold" recording rules joined by the alerts: a literal threshold in
the expression cannot silently disappear (a missing or late threshold series would make an alert
quietly never fire), and the annotations can state the threshold that was used.
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
RULES_FILE = HERE / "trainguard.rules.yml"

# --------------------------------------------------------------------------------------------
# Thresholds: the ONE place to change them.  Durations are PromQL durations ("30m", "6h", "7d")
# or plain seconds; byte sizes are integers or strings such as "2GiB" / "512MiB".
# --------------------------------------------------------------------------------------------
DEFAULTS: dict[str, Any] = {
    # Selector for Prometheus' own `up` series of the trainguard scrape job(s).
    "job_selector": 'job=~"trainguard.*"',
    # Where the runbook lives; each alert links to <runbook_base>#<alertname lowercased>.
    "runbook_base": "https://github.com/trainguard/trainguard/blob/main/alerts/runbook.md",
    # TrainingStalled: no new step / heartbeat for this long while the process is alive.
    "stall": "30m",
    # TrainingLogStale: the run's log file not modified for this long while the process is alive.
    "log_stale": "30m",
    # CheckpointStale: newest complete checkpoint older than this while the run is alive
    # (and the run has been alive that long, so a freshly resumed run does not fire).
    "checkpoint_stale": "3h",
    # StepsAtRisk: steps since the newest complete primary checkpoint above
    # steps_at_risk_factor x the run's usual step distance between checkpoints, which is
    # estimated over checkpoint_cadence_window.
    "steps_at_risk_factor": 3,
    "checkpoint_cadence_window": "7d",
    "steps_at_risk_for": "10m",
    # CheckpointTruncated / CheckpointHashMismatch: how long the damage must be seen before
    # paging (the exporter already ignores files still inside their write grace period).
    "checkpoint_damage_for": "2m",
    # CheckpointPartialOrphaned: a .part file not modified for this long.
    "partial_orphaned": "30m",
    # CheckpointVolumeFillingUp: linear prediction over volume_fill_window says the volume is
    # full within volume_fill_horizon, and fewer than volume_fill_min_checkpoints average-sized
    # checkpoints still fit.
    "volume_fill_window": "6h",
    "volume_fill_horizon": "24h",
    "volume_fill_min_checkpoints": 10,
    "volume_fill_for": "30m",
    # GPUGhostMemory: driver-view VRAM of a run's rank above ghost_ratio x its allocator
    # reserved memory AND above it by ghost_floor (robust to the CUDA context's fixed
    # ~300-600 MiB), both for the whole ghost_window, then for ghost_for.
    "ghost_ratio": 1.5,
    "ghost_floor": "2GiB",
    "ghost_window": "5m",
    "ghost_for": "10m",
    # GPUUnattributedMemory: device VRAM used that no live process accounts for.
    "unattributed_floor": "1GiB",
    "unattributed_for": "15m",
    # DuplicateHostProcess: more than one instance of a configured host process.
    "duplicate_process_for": "5m",
    # AllocatorRetrying: cudaMalloc retries in every alloc_retry_window for alloc_retry_for.
    "alloc_retry_window": "10m",
    "alloc_retry_for": "15m",
    # AllocatorOOM: an OOM (or OOM memory snapshot) within this window.
    "oom_window": "5m",
    # TrainguardCollectorFailing / TrainguardExporterDown.
    "collector_failing_for": "5m",
    "exporter_down_for": "5m",
    # TrainguardExporterDown is critical when the target was watching an active run at the last
    # evaluation before it vanished, looking back at most this far.
    "exporter_down_active_lookback": "1d",
    # RepeatedDeathNearSameStep: a death recorded within repeated_death_window whose step lies
    # within repeated_death_steps of the previous recorded death(s).
    "repeated_death_window": "24h",
    "repeated_death_steps": 500,
}

DURATION_KEYS = {
    "stall",
    "log_stale",
    "checkpoint_stale",
    "checkpoint_cadence_window",
    "steps_at_risk_for",
    "checkpoint_damage_for",
    "partial_orphaned",
    "volume_fill_window",
    "volume_fill_horizon",
    "volume_fill_for",
    "ghost_window",
    "ghost_for",
    "unattributed_for",
    "duplicate_process_for",
    "alloc_retry_window",
    "alloc_retry_for",
    "oom_window",
    "collector_failing_for",
    "exporter_down_for",
    "exporter_down_active_lookback",
    "repeated_death_window",
}
BYTES_KEYS = {"ghost_floor", "unattributed_floor"}
NUMBER_KEYS = {
    "steps_at_risk_factor",
    "volume_fill_min_checkpoints",
    "ghost_ratio",
    "repeated_death_steps",
}
STRING_KEYS = {"job_selector", "runbook_base"}
assert set(DEFAULTS) == DURATION_KEYS | BYTES_KEYS | NUMBER_KEYS | STRING_KEYS

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
_BYTE_UNITS = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_duration(value: str | float) -> int:
    """Seconds in a PromQL duration ("90m", "1h30m") or a plain number of seconds."""
    if isinstance(value, (int, float)):
        seconds = int(value)
    else:
        text = value.strip()
        if text.isdigit():
            seconds = int(text)
        else:
            parts = re.findall(r"(\d+)([smhdwy])", text)
            if not parts or "".join(n + u for n, u in parts) != text:
                raise ValueError(f"not a duration: {value!r} (use e.g. 30m, 6h, 7d)")
            seconds = sum(int(n) * _UNITS[u] for n, u in parts)
    if seconds <= 0:
        raise ValueError(f"duration must be positive: {value!r}")
    return seconds


def format_duration(seconds: int) -> str:
    """The shortest single-unit PromQL duration for seconds (7d, 90m, 45s)."""
    for unit in ("d", "h", "m"):
        if seconds % _UNITS[unit] == 0:
            return f"{seconds // _UNITS[unit]}{unit}"
    return f"{seconds}s"


def parse_bytes(value: str | float) -> int:
    """Bytes in 1073741824, "1GiB", "512MiB"."""
    if isinstance(value, (int, float)):
        return int(value)
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]iB|B)?\s*", value, re.IGNORECASE)
    if not match:
        raise ValueError(f"not a byte size: {value!r} (use e.g. 2GiB, 512MiB, 1073741824)")
    return int(float(match.group(1)) * _BYTE_UNITS[(match.group(2) or "").lower()])


def format_bytes(n: int) -> str:
    for unit, factor in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= factor and n % factor == 0:
            return f"{n // factor}{unit}"
    return f"{n}B"


def format_number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def resolve(overrides: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Validate thresholds and return the placeholder table used by the rule templates.

    For a duration key ``k``: ``[[k]]`` is the PromQL duration, ``[[k_s]]`` the seconds.
    For a byte key ``k``: ``[[k]]`` is the integer, ``[[k_h]]`` a human string such as 2GiB.
    """
    values = dict(DEFAULTS)
    for key, value in (overrides or {}).items():
        if key not in DEFAULTS:
            known = ", ".join(sorted(DEFAULTS))
            raise ValueError(f"unknown threshold {key!r}; known: {known}")
        values[key] = value
    table: dict[str, str] = {}
    for key, value in values.items():
        if key in DURATION_KEYS:
            seconds = parse_duration(value)
            # Keep a duration the user wrote as text ("24h"), format plain seconds ("86400").
            text = str(value).strip()
            table[key] = text if not text.isdigit() else format_duration(seconds)
            table[key + "_s"] = str(seconds)
        elif key in BYTES_KEYS:
            n = parse_bytes(value)
            if n < 0:
                raise ValueError(f"{key} must not be negative")
            table[key] = str(n)
            table[key + "_h"] = format_bytes(n)
        elif key in NUMBER_KEYS:
            number = float(value)
            if number <= 0:
                raise ValueError(f"{key} must be positive: {value!r}")
            table[key] = format_number(number)
        else:
            table[key] = str(value)
    return table


def fill(template: str, table: Mapping[str, str]) -> str:
    """Replace [[name]] placeholders; an unknown name is an error, not a silent blank."""

    def sub(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in table:
            raise KeyError(f"unknown placeholder [[{name}]]")
        return table[name]

    return re.sub(r"\[\[(\w+)\]\]", sub, template)


def expr(text: str) -> str:
    """A PromQL expression written as an indented block in this file."""
    return textwrap.dedent(text).strip()


def para(text: str) -> str:
    """An annotation written over several lines here, one line in the alert."""
    return " ".join(text.split())


# Go-template snippets shared by annotations.  %q quotes a label value as a PromQL string.
RUN_SEL = "job=%q,instance=%q,run=%q"
RUN_ARGS = "$labels.job $labels.instance $labels.run"
RANK_SEL = "job=%q,instance=%q,run=%q,rank=%q"
RANK_ARGS = "$labels.job $labels.instance $labels.run $labels.rank"


def q_value(query: str, args: str, fmt: str, unknown: str = "unknown", suffix: str = "") -> str:
    """Template text printing the first sample of a query (``fmt`` is a pipeline tail)."""
    return (
        f"{{{{ with printf `{query}` {args} | query }}}}"
        f"{{{{ . | first | value | {fmt} }}}}{suffix}{{{{ else }}}}{unknown}{{{{ end }}}}"
    )


def q_bytes(query: str, args: str) -> str:
    """Template text printing the first sample of a query as 1.5GiB, or "unknown"."""
    return q_value(query, args, "humanize1024", suffix="B")


INT = 'printf "%.0f"'


def recording_rules() -> list[dict[str, Any]]:
    return [
        {
            "record": "run:trainguard_run_active_ranks:count",
            "expr": expr("""
                count by (job, instance, run) (
                  trainguard_run_process_up == 1
                  unless on (job, instance, run, rank) trainguard_run_finished == 1
                )
            """),
        },
        {
            "record": "instance:trainguard_run_active_ranks:sum",
            "expr": expr("""
                sum by (job, instance) (run:trainguard_run_active_ranks:count)
                or
                max by (job, instance) (trainguard_exporter_build_info) * 0
            """),
        },
        {
            "record": "run:trainguard_run_step:max",
            "expr": "max by (job, instance, run) (trainguard_run_step)",
        },
        {
            "record": "run:trainguard_run_steps_since_checkpoint:max",
            "expr": expr("""
                clamp_min(
                  run:trainguard_run_step:max
                  - on (job, instance, run)
                  max by (job, instance, run) (trainguard_checkpoint_last_step{location="primary"}),
                  0
                )
            """),
        },
        {
            "record": "run:trainguard_checkpoint_step_cadence:avg",
            "expr": expr("""
                max by (job, instance, run) (
                  (
                    max_over_time(
                      trainguard_checkpoint_last_step{location="primary"}[[[checkpoint_cadence_window]]]
                    )
                    - min_over_time(
                      trainguard_checkpoint_last_step{location="primary"}[[[checkpoint_cadence_window]]]
                    )
                  )
                  / (
                    changes(
                      trainguard_checkpoint_last_step{location="primary"}[[[checkpoint_cadence_window]]]
                    ) > 0
                  )
                ) > 0
            """),
        },
        {
            "record": "run_rank:trainguard_run_gpu_memory_used_bytes:sum",
            "expr": "sum by (job, instance, run, rank) (trainguard_run_gpu_memory_used_bytes)",
        },
        {
            "record": "run_rank:trainguard_run_allocator_reserved_bytes:sum",
            "expr": "sum by (job, instance, run, rank) (trainguard_run_allocator_reserved_bytes)",
        },
        {
            "record": "run_rank:trainguard_run_gpu_memory_ghost_bytes:sum",
            "expr": expr("""
                run_rank:trainguard_run_gpu_memory_used_bytes:sum
                - run_rank:trainguard_run_allocator_reserved_bytes:sum
            """),
        },
        {
            "record": "run_rank:trainguard_run_gpu_memory_used_over_reserved:ratio",
            "expr": expr("""
                run_rank:trainguard_run_gpu_memory_used_bytes:sum
                / run_rank:trainguard_run_allocator_reserved_bytes:sum
            """),
        },
    ]


def alert(
    name: str,
    severity: str,
    rule_expr: str,
    for_: str,
    summary: str,
    description: str,
) -> dict[str, Any]:
    rule: dict[str, Any] = {"alert": name, "expr": expr(rule_expr)}
    if for_ != "0m":
        rule["for"] = for_
    rule["labels"] = {"severity": severity}
    rule["annotations"] = {
        "summary": Folded(para(summary)),
        "description": Folded(para(description)),
        "runbook_url": f"[[runbook_base]]#{name.lower()}",
    }
    return rule


def run_alerts() -> list[dict[str, Any]]:
    dead_ranks = (
        "{{ range $i, $s := printf "
        "`trainguard_run_process_up{" + RUN_SEL + "} == 0 unless on (job, instance, run, rank) "
        "trainguard_run_finished == 1` " + RUN_ARGS + ' | query | sortByLabel "rank" }}'
        '{{ if $i }}, {{ end }}{{ or $s.Labels.rank "-" }}{{ end }}'
    )
    last_step = q_value("max(trainguard_run_step{" + RUN_SEL + "})", RUN_ARGS, INT)
    ckpt_step = q_value(
        "max(trainguard_checkpoint_last_step{" + RUN_SEL + ',location="primary"})',
        RUN_ARGS,
        INT,
        "none known",
    )
    vram = (
        "{{ with printf `sum(trainguard_run_gpu_memory_used_bytes{" + RUN_SEL + "} "
        "and on (job, instance, run, rank) trainguard_run_process_up == 0) > 0` "
        + RUN_ARGS
        + " | query }}The driver still attributes "
        "{{ . | first | value | humanize1024 }}B of VRAM to the dead rank(s): "
        "not released yet, or a defunct process holds it."
        "{{ else }}No driver-view VRAM is attributed to the dead rank(s).{{ end }}"
    )
    return [
        alert(
            "TrainingProcessDied",
            "critical",
            """
            count by (job, instance, run) (
              trainguard_run_process_up == 0
              unless on (job, instance, run, rank) trainguard_run_finished == 1
            )
            """,
            "0m",
            "Training run {{ $labels.run }} died on {{ $labels.instance }}.",
            f"""
            {{{{ $value }}}} rank(s) of run {{{{ $labels.run }}}} on {{{{ $labels.instance }}}}
            are gone without a clean exit (no live process with the recorded PID and create
            time): rank(s) {dead_ranks}. Last step {last_step}; newest complete primary
            checkpoint at step {ckpt_step}. {vram}
            """,
        ),
        alert(
            "TrainingStalled",
            "warning",
            """
            max by (job, instance, run) (
              (
                (
                  time() - (trainguard_run_heartbeat_timestamp_seconds > 0) > [[stall_s]]
                )
                or
                (
                  (changes(trainguard_run_step[[[stall]]]) == 0) + [[stall_s]]
                  and min_over_time(trainguard_run_process_up[[[stall]]]) == 1
                  and trainguard_run_step offset [[stall]]
                )
              )
              and on (job, instance, run, rank) trainguard_run_process_up == 1
              unless on (job, instance, run, rank) trainguard_run_finished == 1
            )
            """,
            "2m",
            "Training run {{ $labels.run }} on {{ $labels.instance }} is alive but not "
            "progressing.",
            f"""
            The process of run {{{{ $labels.run }}}} on {{{{ $labels.instance }}}} is alive, but
            a rank has made no progress (no new step, or no new heartbeat) for at least
            {{{{ $value | humanizeDuration }}}} (threshold [[stall]]). Last step {last_step}.
            """,
        ),
        alert(
            "TrainingLogStale",
            "warning",
            """
            (time() - (trainguard_run_log_modified_timestamp_seconds > 0)) > [[log_stale_s]]
            and on (job, instance, run) run:trainguard_run_active_ranks:count > 0
            """,
            "2m",
            "The log of training run {{ $labels.run }} on {{ $labels.instance }} is stale.",
            """
            The log file of run {{ $labels.run }} on {{ $labels.instance }} has not been
            modified for {{ $value | humanizeDuration }} (threshold [[log_stale]]) although its
            process is alive. The run may be hung, or logging to somewhere else.
            """,
        ),
    ]


def checkpoint_alerts() -> list[dict[str, Any]]:
    loc_sel = "job=%q,instance=%q,run=%q,location=%q"
    loc_args = "$labels.job $labels.instance $labels.run $labels.location"
    truncated_steps = (
        "{{ range $i, $s := printf `trainguard_checkpoint_size_bytes{" + loc_sel + "} / "
        "trainguard_checkpoint_expected_size_bytes < 1` "
        + loc_args
        + ' | query | sortByLabel "step" }}{{ if $i }}, {{ end }}step {{ $s.Labels.step }} '
        "holds {{ $s.Value | humanizePercentage }}{{ end }}"
    )
    cadence = q_value("run:trainguard_checkpoint_step_cadence:avg{" + RUN_SEL + "}", RUN_ARGS, INT)
    avail = q_bytes("trainguard_checkpoint_filesystem_avail_bytes{" + loc_sel + "}", loc_args)
    avg_size = q_bytes(
        "trainguard_checkpoint_bytes{" + loc_sel + "} / trainguard_checkpoint_files", loc_args
    )
    return [
        alert(
            "CheckpointStale",
            "warning",
            """
            (time() - (trainguard_checkpoint_last_timestamp_seconds > 0)) > [[checkpoint_stale_s]]
            and on (job, instance, run) run:trainguard_run_active_ranks:count
            and on (job, instance, run)
              run:trainguard_run_active_ranks:count offset [[checkpoint_stale]]
            """,
            "5m",
            "No new checkpoint of run {{ $labels.run }} at {{ $labels.location }} for "
            "{{ $value | humanizeDuration }}.",
            """
            The newest complete checkpoint of run {{ $labels.run }} at location
            {{ $labels.location }} on {{ $labels.instance }} is {{ $value | humanizeDuration }}
            old (threshold [[checkpoint_stale]]) while the run has been alive for at least that
            long. Everything trained since then is lost if the run dies now.
            """,
        ),
        alert(
            "CheckpointTruncated",
            "critical",
            "trainguard_checkpoint_truncated_files > 0",
            "[[checkpoint_damage_for]]",
            "Truncated checkpoint(s) of run {{ $labels.run }} at {{ $labels.location }}.",
            f"""
            {{{{ $value }}}} checkpoint file(s) of run {{{{ $labels.run }}}} at location
            {{{{ $labels.location }}}} on {{{{ $labels.instance }}}} are smaller than the size
            recorded when they were written ({truncated_steps}). They load and then produce
            garbage; do not resume from them.
            """,
        ),
        alert(
            "CheckpointHashMismatch",
            "critical",
            "trainguard_checkpoint_hash_mismatch_files > 0",
            "[[checkpoint_damage_for]]",
            "Corrupt checkpoint(s) of run {{ $labels.run }} at {{ $labels.location }}.",
            """
            {{ $value }} checkpoint file(s) of run {{ $labels.run }} at location
            {{ $labels.location }} on {{ $labels.instance }} no longer match the sha256
            recorded when they were written. Do not resume from them.
            """,
        ),
        alert(
            "CheckpointPartialOrphaned",
            "warning",
            "trainguard_checkpoint_oldest_partial_age_seconds > [[partial_orphaned_s]]",
            "5m",
            "Orphaned partial checkpoint of run {{ $labels.run }} at {{ $labels.location }}.",
            """
            A .part file of run {{ $labels.run }} at location {{ $labels.location }} on
            {{ $labels.instance }} has not been written to for {{ $value | humanizeDuration }}
            (threshold [[partial_orphaned]]): a save or copy died half-way. It takes space and
            the checkpoint it was meant to become does not exist.
            """,
        ),
        alert(
            "CheckpointVolumeFillingUp",
            "warning",
            """
            predict_linear(
              trainguard_checkpoint_filesystem_avail_bytes[[[volume_fill_window]]],
              [[volume_fill_horizon_s]]
            ) < 0
            and
            trainguard_checkpoint_filesystem_avail_bytes
              < [[volume_fill_min_checkpoints]]
                * (trainguard_checkpoint_bytes / (trainguard_checkpoint_files > 0))
            """,
            "[[volume_fill_for]]",
            "Checkpoint volume of run {{ $labels.run }} at {{ $labels.location }} is filling up.",
            f"""
            The volume holding checkpoints of run {{{{ $labels.run }}}} at location
            {{{{ $labels.location }}}} on {{{{ $labels.instance }}}} has {avail} free and, at
            the rate of the last [[volume_fill_window]], is full within
            [[volume_fill_horizon]]; that is fewer than [[volume_fill_min_checkpoints]]
            checkpoints of the average size ({avg_size}).
            """,
        ),
        alert(
            "StepsAtRisk",
            "warning",
            """
            run:trainguard_run_steps_since_checkpoint:max
              > [[steps_at_risk_factor]] * run:trainguard_checkpoint_step_cadence:avg
            and on (job, instance, run) run:trainguard_run_active_ranks:count
            """,
            "[[steps_at_risk_for]]",
            "Run {{ $labels.run }} is {{ $value }} steps past its newest complete checkpoint.",
            f"""
            Run {{{{ $labels.run }}}} on {{{{ $labels.instance }}}} is {{{{ $value }}}} steps
            past its newest complete primary checkpoint, more than [[steps_at_risk_factor]]x its
            usual {cadence} steps between checkpoints. If it dies now, those steps are lost.
            """,
        ),
    ]


def gpu_alerts() -> list[dict[str, Any]]:
    driver = q_bytes(
        "run_rank:trainguard_run_gpu_memory_used_bytes:sum{" + RANK_SEL + "}", RANK_ARGS
    )
    reserved = q_bytes(
        "run_rank:trainguard_run_allocator_reserved_bytes:sum{" + RANK_SEL + "}", RANK_ARGS
    )
    ratio = q_value(
        "run_rank:trainguard_run_gpu_memory_used_over_reserved:ratio{" + RANK_SEL + "}",
        RANK_ARGS,
        'printf "%.2f"',
    )
    gpu_sel = "job=%q,instance=%q,gpu=%q,uuid=%q"
    gpu_args = "$labels.job $labels.instance $labels.gpu $labels.uuid"
    gpu_name = (
        "{{ with printf `trainguard_gpu_info{"
        + gpu_sel
        + "}` "
        + gpu_args
        + ' | query }} ({{ . | first | label "name" }}){{ end }}'
    )
    gpu_total = q_bytes("trainguard_gpu_memory_total_bytes{" + gpu_sel + "}", gpu_args)
    return [
        alert(
            "GPUGhostMemory",
            "warning",
            """
            min_over_time(
              run_rank:trainguard_run_gpu_memory_ghost_bytes:sum[[[ghost_window]]]
            ) > [[ghost_floor]]
            and
            min_over_time(
              run_rank:trainguard_run_gpu_memory_used_over_reserved:ratio[[[ghost_window]]]
            ) > [[ghost_ratio]]
            """,
            "[[ghost_for]]",
            "GPU driver holds far more VRAM for run {{ $labels.run }} than its allocator reserved.",
            f"""
            For at least [[ghost_window]] the driver has attributed
            {{{{ $value | humanize1024 }}}}B or more VRAM to run {{{{ $labels.run }}}} rank
            {{{{ $labels.rank }}}} on {{{{ $labels.instance }}}} than its PyTorch allocator has
            reserved (now: driver {driver}, reserved {reserved}, ratio {ratio}; thresholds:
            ratio > [[ghost_ratio]] and gap > [[ghost_floor_h]]). Typical of ghost memory left
            by crashed runs under WDDM/WSL: throughput drops until the VM or driver session is
            restarted.
            """,
        ),
        alert(
            "GPUUnattributedMemory",
            "warning",
            """
            trainguard_gpu_memory_unattributed_bytes > [[unattributed_floor]]
            unless on (job, instance, gpu, uuid) trainguard_gpu_processes_memory_unknown > 0
            """,
            "[[unattributed_for]]",
            "GPU {{ $labels.gpu }} on {{ $labels.instance }} has VRAM in use that no live "
            "process accounts for.",
            f"""
            GPU {{{{ $labels.gpu }}}}{gpu_name} on {{{{ $labels.instance }}}} has
            {{{{ $value | humanize1024 }}}}B of its {gpu_total} in use that no live process
            accounts for (threshold [[unattributed_floor_h]], sustained [[unattributed_for]]).
            Memory of crashed processes the driver never released; it stays lost until the
            driver session (the VM, under WSL) is restarted.
            """,
        ),
        alert(
            "DuplicateHostProcess",
            "warning",
            "trainguard_process_count > 1",
            "[[duplicate_process_for]]",
            "{{ $value }} instances of host process {{ $labels.name }} on {{ $labels.instance }}.",
            """
            {{ $value }} processes on {{ $labels.instance }} match the configured name
            {{ $labels.name }}, which should run once, for more than [[duplicate_process_for]].
            For the WSL VM host process (vmmem) this means an old VM session was never
            released, and with it the GPU memory it held.
            """,
        ),
    ]


def allocator_alerts() -> list[dict[str, Any]]:
    stats = (
        "Allocator now: reserved "
        + q_bytes("sum(trainguard_run_allocator_reserved_bytes{" + RANK_SEL + "})", RANK_ARGS)
        + ", allocated "
        + q_bytes("sum(trainguard_run_allocator_allocated_bytes{" + RANK_SEL + "})", RANK_ARGS)
        + ", inactive split "
        + q_bytes("sum(trainguard_run_allocator_inactive_split_bytes{" + RANK_SEL + "})", RANK_ARGS)
        + "."
    )
    snapshots = q_value(
        "sum(increase(trainguard_run_memory_snapshots_total{" + RANK_SEL + "}[[[oom_window]]]))",
        RANK_ARGS,
        INT,
    )
    ooms = q_value(
        "sum(increase(trainguard_run_allocator_ooms_total{" + RANK_SEL + "}[[[oom_window]]]))",
        RANK_ARGS,
        INT,
        "unknown",
    )
    return [
        alert(
            "AllocatorRetrying",
            "warning",
            "increase(trainguard_run_allocator_alloc_retries_total[[[alloc_retry_window]]]) > 0",
            "[[alloc_retry_for]]",
            "The CUDA allocator of run {{ $labels.run }} keeps retrying allocations.",
            f"""
            The PyTorch allocator of run {{{{ $labels.run }}}} rank {{{{ $labels.rank }}}}
            (device {{{{ $labels.device }}}}) on {{{{ $labels.instance }}}} had to free its
            cache and retry a cudaMalloc in every [[alloc_retry_window]] for
            [[alloc_retry_for]] ({{{{ $value | {INT} }}}} retries in the last
            [[alloc_retry_window]]): memory pressure or fragmentation, slow steps, an OOM
            coming. {stats}
            """,
        ),
        alert(
            "AllocatorOOM",
            "critical",
            """
            sum by (job, instance, run, rank) (
              increase(trainguard_run_allocator_ooms_total[[[oom_window]]])
            ) > 0
            or
            sum by (job, instance, run, rank) (
              increase(trainguard_run_memory_snapshots_total[[[oom_window]]])
            ) > 0
            """,
            "0m",
            "Run {{ $labels.run }} rank {{ $labels.rank }} hit CUDA out of memory.",
            f"""
            Run {{{{ $labels.run }}}} rank {{{{ $labels.rank }}}} on {{{{ $labels.instance }}}}
            recorded a CUDA out-of-memory in the last [[oom_window]] (OOMs: {ooms}, memory
            snapshots dumped: {snapshots}). {stats} Reserved far above allocated, or a large
            inactive split, means fragmentation: "free" VRAM that no large block fits in.
            """,
        ),
    ]


def deaths_alerts() -> list[dict[str, Any]]:
    last_death = q_value("trainguard_run_last_death_step{" + RUN_SEL + "}", RUN_ARGS, INT)
    cause = (
        "{{ with printf `trainguard_run_last_death_info{"
        + RUN_SEL
        + "}` "
        + RUN_ARGS
        + ' | query }}{{ . | first | label "cause" }}{{ else }}unknown{{ end }}'
    )
    return [
        alert(
            "RepeatedDeathNearSameStep",
            "warning",
            """
            (
              max_over_time(trainguard_run_last_death_step[[[repeated_death_window]]])
              - min_over_time(trainguard_run_last_death_step[[[repeated_death_window]]])
            ) <= [[repeated_death_steps]]
            and on (job, instance, run)
              increase(trainguard_run_deaths_total[[[repeated_death_window]]]) > 0
            and on (job, instance, run)
              max_over_time(trainguard_run_deaths_total[[[repeated_death_window]]]) >= 2
            """,
            "0m",
            "Run {{ $labels.run }} died again near the same step.",
            f"""
            Run {{{{ $labels.run }}}} on {{{{ $labels.instance }}}} died again in the last
            [[repeated_death_window]], at step {last_death} (cause: {cause}), within
            {{{{ $value | {INT} }}}} steps of its previous recorded death (threshold
            [[repeated_death_steps]] steps). Once is bad luck, twice at the same place is a
            pattern: look at what that region of training does.
            """,
        ),
    ]


def exporter_alerts() -> list[dict[str, Any]]:
    active = q_value(
        "last_over_time(instance:trainguard_run_active_ranks:sum{job=%q,instance=%q}"
        "[[[exporter_down_active_lookback]]])",
        "$labels.job $labels.instance",
        INT,
    )
    return [
        alert(
            "TrainguardCollectorFailing",
            "warning",
            "trainguard_collector_success == 0",
            "[[collector_failing_for]]",
            "trainguard collector {{ $labels.collector }} on {{ $labels.instance }} is failing.",
            """
            The {{ $labels.collector }} collector of the trainguard exporter on
            {{ $labels.instance }} has failed every scrape for [[collector_failing_for]]. The
            metrics it provides are missing, so the alerts built on them cannot fire. See the
            exporter's log.
            """,
        ),
        alert(
            "TrainguardExporterDown",
            "critical",
            """
            up{[[job_selector]]} == 0
            and on (job, instance)
            last_over_time(
              instance:trainguard_run_active_ranks:sum[[[exporter_down_active_lookback]]]
            ) > 0
            """,
            "[[exporter_down_for]]",
            "trainguard exporter {{ $labels.instance }} is down while training runs were "
            "active there.",
            f"""
            Prometheus has failed to scrape the trainguard exporter {{{{ $labels.instance }}}}
            (job {{{{ $labels.job }}}}) for [[exporter_down_for]]; when it was last seen it
            watched {active} active training rank(s). The host may have rebooted or the VM been
            torn down, taking the runs with it; nothing can tell their death until it is back.
            """,
        ),
        alert(
            "TrainguardExporterDown",
            "warning",
            """
            up{[[job_selector]]} == 0
            unless on (job, instance)
            last_over_time(
              instance:trainguard_run_active_ranks:sum[[[exporter_down_active_lookback]]]
            ) > 0
            """,
            "[[exporter_down_for]]",
            "trainguard exporter {{ $labels.instance }} is down.",
            """
            Prometheus has failed to scrape the trainguard exporter {{ $labels.instance }}
            (job {{ $labels.job }}) for [[exporter_down_for]]. No active training run was
            watched there when it was last seen, but none will be watched until it is back.
            """,
        ),
    ]


def rule_groups() -> list[dict[str, Any]]:
    return [
        {"name": "trainguard.rules", "rules": recording_rules()},
        {"name": "trainguard-runs", "rules": run_alerts()},
        {"name": "trainguard-checkpoints", "rules": checkpoint_alerts()},
        {"name": "trainguard-gpu", "rules": gpu_alerts()},
        {"name": "trainguard-allocator", "rules": allocator_alerts()},
        {"name": "trainguard-deaths", "rules": deaths_alerts()},
        {"name": "trainguard-exporter", "rules": exporter_alerts()},
    ]


def _fill_all(node: object, table: Mapping[str, str]) -> object:
    if isinstance(node, Folded):
        return Folded(fill(node, table))
    if isinstance(node, str):
        return fill(node, table)
    if isinstance(node, list):
        return [_fill_all(item, table) for item in node]
    if isinstance(node, dict):
        return {key: _fill_all(value, table) for key, value in node.items()}
    return node


class Folded(str):
    """A long one-line string, written as a folded YAML block for readability."""


class _Dumper(yaml.SafeDumper):
    pass


def _str_representer(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


def _folded_representer(dumper: yaml.SafeDumper, data: Folded) -> yaml.ScalarNode:
    style = ">" if len(data) > 60 else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", str(data), style=style)


_Dumper.add_representer(str, _str_representer)
_Dumper.add_representer(Folded, _folded_representer)

HEADER = """\
# GENERATED by alerts/build.py -- do not edit by hand.
# Change thresholds in DEFAULTS in alerts/build.py (or pass --set/--config) and regenerate:
#   python alerts/build.py
# Thresholds used for this file:
"""


def render(overrides: Mapping[str, Any] | None = None) -> str:
    table = resolve(overrides)
    doc = {"groups": _fill_all(rule_groups(), table)}
    body = yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)
    shown = {key: table.get(key + "_h", table[key]) for key in DEFAULTS}
    listing = "".join(f"#   {key}: {value}\n" for key, value in shown.items())
    return HEADER + listing + body


def _parse_set(items: list[str]) -> dict[str, str]:
    overrides: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set expects key=value, got {item!r}")
        overrides[key.strip()] = value.strip()
    return overrides


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "-o",
        "--output",
        default=str(RULES_FILE),
        help="file to write, '-' for stdout (default: %(default)s)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one threshold (repeatable)",
    )
    parser.add_argument("--config", help="YAML file: a mapping of threshold overrides")
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if the output file differs from what would be generated",
    )
    parser.add_argument("--list", action="store_true", help="print the thresholds and exit")
    args = parser.parse_args(argv)

    try:
        overrides: dict[str, Any] = {}
        if args.config:
            loaded = yaml.safe_load(Path(args.config).read_text(encoding="utf-8")) or {}
            if not isinstance(loaded, dict):
                raise ValueError(f"{args.config}: expected a mapping of threshold: value")
            overrides.update(loaded)
        overrides.update(_parse_set(args.set))
        if args.list:
            table = resolve(overrides)
            for key in DEFAULTS:
                print(f"{key}: {table[key]}")
            return 0
        text = render(overrides)
    except (ValueError, KeyError, OSError) as exc:
        print(f"build.py: error: {exc}", file=sys.stderr)
        return 2

    if args.output == "-":
        sys.stdout.write(text)
        return 0
    out = Path(args.output)
    if args.check:
        current = out.read_text(encoding="utf-8") if out.exists() else ""
        if current != text:
            print(f"{out} is stale: run python alerts/build.py", file=sys.stderr)
            return 1
        return 0
    out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

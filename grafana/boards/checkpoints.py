"""The checkpoints dashboard.

It shows the newest complete checkpoint per run and location, sizes vs the sizes recorded at
write time, truncated / mismatched / partial files and free space.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.models.dashboard import DynamicConfigValue

from alerts.site import Site
from grafana.boards import saves
from grafana.boards.saves import PER_LOCATION, REACHABLE_MAPPINGS, by_loc, reachable
from grafana.dashboard import dashboard
from grafana.panels import (
    NONZERO_IS_BAD,
    Panel,
    Steps,
    stat_panel,
    table_panel,
    ts,
)
from grafana.promql import IR, Promql

UID = "trainguard-checkpoints"


def age(q: Promql) -> str:
    """Seconds since the newest complete checkpoint per run and location was written."""
    return "time() - " + by_loc(q, "trainguard_checkpoint_last_timestamp_seconds")


def free(q: Promql) -> str:
    """Free bytes on the volume of each run's location."""
    return q.by("run, location", "trainguard_checkpoint_filesystem_avail_bytes", "min")


# (title, metric, description, thresholds) of the problem-file counters.
PROBLEM_FILES: list[tuple[str, str, str, Steps]] = [
    (
        "Truncated files",
        "trainguard_checkpoint_truncated_files",
        "Checkpoint files smaller than the size recorded when they were written, over the "
        "selected runs and locations (CheckpointTruncated). Files still being written are "
        "never counted.",
        NONZERO_IS_BAD,
    ),
    (
        "Hash-mismatch files",
        "trainguard_checkpoint_hash_mismatch_files",
        "Checkpoint files whose sha256 differs from the one recorded at write time "
        "(CheckpointHashMismatch).",
        NONZERO_IS_BAD,
    ),
    (
        "Partial files",
        "trainguard_checkpoint_partial_files",
        "In-flight or orphaned .part files. Non-zero during a save is normal; an old one "
        "is CheckpointPartialOrphaned.",
        ((None, "green"), (1, "orange")),
    ),
    (
        "Unrecorded files",
        "trainguard_checkpoint_unrecorded_files",
        "Checkpoint files with no size recorded at write time (written without "
        "trainguard.checkpoint): they cannot be judged, and never count as complete unless the "
        "location trusts them (trust_unrecorded). Lasting where it does not trust them is "
        "CheckpointUnrecordedFiles.",
        ((None, "green"), (1, "orange")),
    ),
    (
        "Unknown-mtime files",
        "trainguard_checkpoint_unknown_mtime_files",
        "Files and .part files whose modification time is unknown (0): never judged old, "
        "truncated or complete. Lasting is CheckpointUnknownMtime.",
        ((None, "green"), (1, "orange")),
    ),
]


def overview(q: Promql) -> list[Panel]:
    """One table row per run and location, then the problem-file totals."""
    locations = table_panel(
        "Checkpoint locations",
        "One row per run and location (primary or a mirror): newest complete step, when "
        "it was written, files and bytes, problem files and free space.",
        [
            by_loc(q, "trainguard_checkpoint_last_step"),
            by_loc(q, "trainguard_checkpoint_last_timestamp_seconds") + " * 1000",
            age(q),
            by_loc(q, "trainguard_checkpoint_files"),
            by_loc(q, "trainguard_checkpoint_bytes"),
            *(by_loc(q, metric) for _, metric, _, _ in PROBLEM_FILES),
            free(q),
            reachable(q),
        ],
        columns={
            "run": ("Run", ""),
            "location": ("Location", ""),
            "Value #A": ("Last step", "none"),
            "Value #B": ("Written", "dateTimeAsIso"),
            "Value #C": ("Age", "s"),
            "Value #D": ("Files", "none"),
            "Value #E": ("Bytes", "bytes"),
            "Value #F": ("Truncated", "none"),
            "Value #G": ("Hash mismatch", "none"),
            "Value #H": ("Partial", "none"),
            "Value #I": ("Unrecorded", "none"),
            "Value #J": ("Unknown mtime", "none"),
            "Value #K": ("Free space", "bytes"),
            "Value #L": ("Reachable", "none"),
        },
        extra={
            "Value #L": [
                DynamicConfigValue(id_val="mappings", value=REACHABLE_MAPPINGS),
                DynamicConfigValue(id_val="custom.cellOptions", value={"type": "color-text"}),
            ]
        },
    )
    totals = [
        stat_panel(
            title,
            description,
            "none",
            (f"sum({by_loc(q, metric)}) or vector(0)", title.lower()),
            thresholds=steps,
            w=4,
        )
        for title, metric, description, steps in PROBLEM_FILES
    ]
    unreachable = stat_panel(
        "Unreachable locations",
        "Locations whose directory or manifest could not be read at the last scrape "
        "(trainguard_checkpoint_location_up 0: unmounted, permissions, a hung filesystem). An "
        "unreachable location is never judged stale or complete: see its log line.",
        "none",
        (
            f"count(min {q.group_by('run, location')} "
            f"(trainguard_checkpoint_location_up{{{IR}}}) == 0) or vector(0)",
            "unreachable",
        ),
        thresholds=NONZERO_IS_BAD,
        w=4,
    )
    return [locations, *totals, unreachable]


def progress(q: Promql) -> list[Panel]:
    """Newest complete step and its age, per location: a lagging mirror reads lower."""
    return [
        ts(
            "Newest complete step per location",
            "Step of the newest COMPLETE checkpoint per run and location. A mirror lagging "
            "behind the primary shows as a lower line. Dashed: the newest damaged (truncated "
            "or hash-mismatched) step of a location; at or below some location's complete "
            "step the run can still resume (CheckpointTruncated / CheckpointHashMismatch "
            "warn), above all of them it pages.",
            "none",
            [
                (by_loc(q, "trainguard_checkpoint_last_step"), PER_LOCATION),
                (
                    q.by("run, location, damage", "trainguard_checkpoint_newest_damaged_step"),
                    PER_LOCATION + " damaged ({{damage}})",
                ),
            ],
            dashed="/damaged/",
        ),
        ts(
            "Checkpoint age per location",
            "Seconds since the newest complete checkpoint per run and location was written. "
            f"Older than {q.site.shown('checkpoint_stale')} while the run trains is "
            "CheckpointStale.",
            "s",
            [(age(q), PER_LOCATION)],
            thresholds=((None, "green"), (q.site.seconds("checkpoint_stale"), "red")),
            minimum=0,
        ),
    ]


def integrity(q: Promql) -> list[Panel]:
    """Sizes on disk against the sizes recorded at write time, and the problem files."""
    size = q.by("run, location, step", "trainguard_checkpoint_size_bytes")
    expected = q.by("run, location, step", "trainguard_checkpoint_expected_size_bytes")
    ratio_colors = [
        DynamicConfigValue(
            id_val="thresholds",
            value={
                "mode": "absolute",
                "steps": [
                    {"value": None, "color": "red"},
                    {"value": 1, "color": "green"},
                    {"value": 1.0000001, "color": "orange"},
                ],
            },
        ),
        DynamicConfigValue(id_val="custom.cellOptions", value={"type": "color-background"}),
    ]
    return [
        table_panel(
            "Size vs expected (newest checkpoints)",
            "For the newest checkpoints of each location: size on disk, size recorded when it "
            "was written, and their ratio. Below 100% is a truncated file (a 73% mirror passes "
            "a 'bigger than 50 MB' check; it does not pass this one).",
            [size, expected, f"{size}\n/ {expected}"],
            columns={
                "run": ("Run", ""),
                "location": ("Location", ""),
                "step": ("Step", ""),
                "Value #A": ("Size", "bytes"),
                "Value #B": ("Expected", "bytes"),
                "Value #C": ("Size / expected", "percentunit"),
            },
            w=12,
            h=9,
            extra={"Value #C": ratio_colors},
        ),
        ts(
            "Smallest size / expected per location",
            "Lowest ratio of on-disk size to recorded size among the newest checkpoints of "
            "each location. 100% is healthy; anything below is truncation.",
            "percentunit",
            [
                (
                    f"min {q.group_by('run, location')} (\n"
                    f"  trainguard_checkpoint_size_bytes{{{IR}}}\n"
                    f"  / trainguard_checkpoint_expected_size_bytes{{{IR}}}\n"
                    ")",
                    PER_LOCATION,
                )
            ],
            thresholds=((None, "red"), (1, "green")),
            w=12,
            h=9,
        ),
        ts(
            "Truncated, mismatched and partial files",
            "Problem files per run and location over time.",
            "none",
            [
                (by_loc(q, metric), f"{PER_LOCATION} {name}")
                for metric, name in (
                    ("trainguard_checkpoint_truncated_files", "truncated"),
                    ("trainguard_checkpoint_hash_mismatch_files", "hash mismatch"),
                    ("trainguard_checkpoint_partial_files", "partial"),
                )
            ],
            minimum=0,
        ),
        ts(
            "Oldest partial file age",
            "Age of the oldest .part file per run and location. A save in progress is young; "
            "one that keeps ageing was abandoned by a crash: older than "
            f"{q.site.shown('partial_orphaned')} is CheckpointPartialOrphaned.",
            "s",
            [(by_loc(q, "trainguard_checkpoint_oldest_partial_age_seconds"), PER_LOCATION)],
            thresholds=((None, "green"), (q.site.seconds("partial_orphaned"), "red")),
            minimum=0,
        ),
    ]


def storage(q: Promql) -> list[Panel]:
    """Free space, when it runs out, and what the checkpoints take.

    The forecast and the time until full are CheckpointVolumeFillingUp's: the trend over its
    ``volume_fill_window``, judged against its ``volume_fill_horizon``; the lines under the free
    space are its ``volume_fill_min_checkpoints`` and CheckpointWillNotFit's margin.
    """
    site = q.site
    window = site.duration("volume_fill_window")
    horizon, horizon_s = site.shown("volume_fill_horizon"), site.seconds("volume_fill_horizon")
    margin = site.number("checkpoint_fit_margin")
    room = site.number("volume_fill_min_checkpoints")
    avail = f"trainguard_checkpoint_filesystem_avail_bytes{{{IR}}}"
    return [
        ts(
            f"Free space and {horizon} forecast",
            "Free bytes on the volume of each checkpoint location, and the linear forecast "
            f"{horizon} ahead from the last {window}'s trend (dashed; predict_linear). A "
            f"forecast below 0 while free space is below {room} average checkpoints"
            " (dashed 'room for') is CheckpointVolumeFillingUp. Free space "
            f"below {site.shown('checkpoint_fit_margin')} times the location's largest newest "
            "checkpoint (dashed 'largest checkpoint') means the next save will not fit "
            "(CheckpointWillNotFit).",
            "bytes",
            [
                (free(q), f"{PER_LOCATION} free"),
                (
                    f"{margin} * "
                    + q.by("run, location", "trainguard_checkpoint_size_bytes", "max"),
                    f"{PER_LOCATION} largest checkpoint x {site.shown('checkpoint_fit_margin')}",
                ),
                (
                    f"{room} * {q.by('run, location', 'trainguard_checkpoint_bytes')}\n"
                    f"/ {q.join_on('run, location')} "
                    f"({q.by('run, location', 'trainguard_checkpoint_files')} > 0)",
                    f"{PER_LOCATION} room for {site.shown('volume_fill_min_checkpoints')} "
                    "checkpoints",
                ),
                (
                    f"min {q.group_by('run, location')} "
                    f"(predict_linear({avail}[{window}], {horizon_s}))",
                    f"{PER_LOCATION} forecast +{horizon}",
                ),
            ],
            dashed="/forecast|largest checkpoint|room for/",
        ),
        ts(
            "Time until volume is full",
            f"Free bytes divided by the rate they shrank at over the last {window} (only where "
            f"they shrink). Below {horizon} (red) is CheckpointVolumeFillingUp's forecast; it "
            "resets when old checkpoints are pruned.",
            "s",
            [
                (
                    f"min {q.group_by('run, location')} (\n"
                    f"  {avail}\n"
                    f"  / (-deriv({avail}[{window}]) > 0)\n"
                    ")",
                    PER_LOCATION,
                )
            ],
            thresholds=((None, "red"), (horizon_s, "green")),
            minimum=0,
        ),
        ts(
            "Checkpoint bytes per location",
            "Total bytes of checkpoint files per run and location.",
            "bytes",
            [(by_loc(q, "trainguard_checkpoint_bytes"), PER_LOCATION)],
            minimum=0,
        ),
        ts(
            "Checkpoint files per location",
            "Number of checkpoint files per run and location (pruning keeps it bounded).",
            "none",
            [(by_loc(q, "trainguard_checkpoint_files"), PER_LOCATION)],
            minimum=0,
        ),
    ]


def build(site: Site) -> db.Dashboard:
    """The dashboard, for the site's target labels."""
    q = Promql(site)
    return dashboard(
        UID,
        "Checkpoints",
        "Newest complete checkpoint per run and location, sizes vs the sizes recorded at write "
        "time, truncated / mismatched / partial files and free space.",
        [
            ("Overview", overview(q)),
            ("Progress", progress(q)),
            ("Saves, restore drills and reachability", saves.panels(q)),
            ("Integrity", integrity(q)),
            ("Storage", storage(q)),
        ],
    )

"""The runs dashboard's table of where stuck ranks are (``trainguard_run_stuck_info``).

One row per rank whose step is overdue: its host, where its main thread is, the collective it
waits in and whether it is saving a checkpoint. Like every panel it reads the exporters' series,
not the rules' recorded ones (a dashboard must work without the rules loaded), so the rank apart
from the rest is the one reader to spot: an empty "Waits in" among ranks that wait in a
collective (TrainingRankStuck names it).
"""

from __future__ import annotations

from grafana.panels import Panel, table_panel
from grafana.promql import IR, Promql

STUCK = "trainguard_run_stuck_info"


def panels(q: Promql) -> list[Panel]:
    """The table of stuck ranks, for the Status row."""
    return [
        table_panel(
            "Where stuck ranks are",
            "Ranks whose step is overdue by their own pace (3x their median interval between "
            "steps, at least 30 s): where their main thread is (the library function the "
            "user's code called, then the user's innermost frames) and the torch.distributed "
            "collective it waits in. A rank with nothing under Waits in while the others of its "
            "job wait in a collective is the one holding the job up (TrainingRankStuck names "
            "it). In a save: the rank's main thread is inside a checkpoint save (rank 0 writing "
            "while the others wait in a barrier), a routine pause while within the run's stall "
            "threshold. Empty table = no rank is stuck.",
            [
                q.by("run, rank, where, collective, saving", STUCK),
                f"{q.by('run, rank, host', 'trainguard_run_info')} "
                f"and {q.join_on('run, rank')} {STUCK}{{{IR}}}",
            ],
            columns={
                "run": ("Run", ""),
                "rank": ("Rank", ""),
                "host": ("Host", ""),
                "where": ("Where", ""),
                "collective": ("Waits in", ""),
                "saving": ("In a save", ""),
            },
            hide=("Value #A", "Value #B"),
            h=6,
        )
    ]

"""One scrape's GPU health lines, and the slots each series' line is kept in between scrapes.

Why a module of its own: what a sample costs is what happens per series and scrape, so this is
kept to a comparison and two appends (``put``): a series' line is made again only when its raw
value changed (``update``), and its row (labels, value) for readers other than the text writer
is kept with it rather than made per scrape. The reads themselves: ``gpu_health_device.py``.

A slot is a list ``[prefix, labels, raw, line, (labels, value), series' index in HEALTH]``.
"""

from __future__ import annotations

from typing import Any

from trainguard.exporter.collectors.gpu import metrics as hm
from trainguard.exporter.scrape.exposition import value_text


class Out:
    """One scrape's health lines and rows (labels, value), per metric in ``HEALTH`` order."""

    def __init__(self) -> None:
        self.lines: list[list[str]] = [[] for _ in hm.HEALTH]
        self.rows: list[list[tuple[dict[str, str], float]]] = [[] for _ in hm.HEALTH]


def update(slot: list[Any], raw: int, scale: float) -> None:
    """A slot's value ``raw / scale``: its line and row made again only when ``raw`` changed."""
    if slot[2] != raw:
        value = raw / scale
        slot[2], slot[4] = raw, (slot[1], value)
        slot[3] = f"{slot[0]}{value_text(value)}\n"


def put(
    lines: list[list[str]],
    rows: list[list[tuple[dict[str, str], float]]],
    slot: list[Any],
    raw: int,
    scale: float,
) -> None:
    """A slot's sample at ``raw / scale`` into a scrape's lines and rows (:class:`Out`)."""
    if slot[2] != raw:
        update(slot, raw, scale)
    i = slot[5]
    lines[i].append(slot[3])
    rows[i].append(slot[4])

"""One scrape's GPU health lines, and the slots each series' line is kept in between scrapes.

Why a module of its own: what a sample costs is what happens per series and scrape, so this is
kept to a comparison and two appends (``put``): a series' line is made again only when its raw
value changed (``update``), and its row (labels, value) for readers other than the text writer
is kept with it rather than made per scrape. The reads themselves: ``device.py``.
"""

from __future__ import annotations

from trainguard.exporter.collectors.gpu import metrics as hm
from trainguard.exporter.scrape.exposition import value_text


class Slot:
    """One series of one GPU: its line kept between scrapes, made again when its value changes.

    ``prefix`` is the line up to its value (name and labels), ``raw`` the value NVML gave for
    the line and ``row`` kept for readers other than the text writer; ``index`` is the series'
    place in ``HEALTH``, which says which family the line goes to.
    """

    __slots__ = ("index", "labels", "line", "prefix", "raw", "row")

    def __init__(self, prefix: str, labels: dict[str, str], index: int) -> None:
        self.prefix = prefix
        self.labels = labels
        self.raw: int | None = None
        self.line = ""
        self.row: tuple[dict[str, str], float] = (labels, 0.0)  # never read before update()
        self.index = index


class Out:
    """One scrape's health lines and rows (labels, value), per metric in ``HEALTH`` order."""

    def __init__(self) -> None:
        self.lines: list[list[str]] = [[] for _ in hm.HEALTH]
        self.rows: list[list[tuple[dict[str, str], float]]] = [[] for _ in hm.HEALTH]


def update(slot: Slot, raw: int, scale: float) -> None:
    """A slot's value ``raw / scale``: its line and row made again only when ``raw`` changed."""
    if slot.raw != raw:
        value = raw / scale
        slot.raw, slot.row = raw, (slot.labels, value)
        slot.line = f"{slot.prefix}{value_text(value)}\n"


def put(
    lines: list[list[str]],
    rows: list[list[tuple[dict[str, str], float]]],
    slot: Slot,
    raw: int,
    scale: float,
) -> None:
    """A slot's sample at ``raw / scale`` into a scrape's lines and rows (:class:`Out`)."""
    if slot.raw != raw:
        update(slot, raw, scale)
    i = slot.index
    lines[i].append(slot.line)
    rows[i].append(slot.row)

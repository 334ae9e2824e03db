"""Which checkpoint files are complete: the one verdict that ``trainguard.checkpoint.latest``
and ``prune`` act on and the exporter publishes, so that the two never disagree."""

from __future__ import annotations

from typing import NamedTuple

from trainguard.shared.fileio import settled
from trainguard.shared.listing import Entry, Listing


class Judged(NamedTuple):
    """One checkpoint file judged against what its writer recorded (a named tuple, like
    :class:`Entry`)."""

    entry: Entry
    expected_size: int | None  # None: no record here nor on the primary
    expected_sha256: str | None
    mtime_known: bool
    settled: bool  # untouched for the grace period
    complete: bool  # size matches the expected size and the mtime is known
    truncated: bool  # smaller than expected and settled
    oversized: bool  # larger than expected and settled


def judge(
    listing: Listing,
    *,
    now_ns: int,
    grace_ns: int,
    primary: Listing | None = None,
    trust_unrecorded: bool = False,
) -> list[Judged]:
    """Judge every file of a location. Its own record gives the expected size and hash; a
    mirror's file without a record falls back on the primary's record of the same name, or on
    the primary file's size once that has settled. With ``trust_unrecorded``, a settled file
    for which none of these gives a size is complete (its writer recorded nothing to check).

    Whatever the records and the trust setting, a mirror's file smaller than the settled primary
    file of the same name (itself not smaller nor larger than its own record) is judged against
    the primary's size: a copy taken while an unrecorded primary was still being written carries
    a record of its own short size, and is a truncated copy, not a checkpoint."""
    by_name = {e.name: e for e in primary.files} if primary is not None else {}
    out = []
    for entry in listing.files:
        rec = listing.records.get(entry.name)
        size: int | None = None
        sha: str | None = None
        if rec is not None:
            size, sha = rec.size, rec.sha256
            pfile = by_name.get(entry.name)
            if (
                primary is not None
                and pfile is not None
                and pfile.stat.st_size > entry.stat.st_size
                and settled(pfile.stat, now_ns, grace_ns)
            ):
                prec = primary.records.get(entry.name)
                if prec is None or prec.size == pfile.stat.st_size:
                    size, sha = pfile.stat.st_size, None if prec is None else prec.sha256
        elif primary is not None:
            prec = primary.records.get(entry.name)
            if prec is not None:
                size, sha = prec.size, prec.sha256
            else:
                pfile = by_name.get(entry.name)
                if pfile is not None and settled(pfile.stat, now_ns, grace_ns):
                    size = pfile.stat.st_size
        st = entry.stat
        mtime = st.st_mtime_ns
        known = mtime > 0  # touched_ns() and settled(), inlined: this runs per file per scrape
        is_settled = known and now_ns - mtime >= grace_ns
        actual = st.st_size
        out.append(
            Judged(
                entry,
                size,
                sha,
                known,
                is_settled,
                known
                and (
                    actual == size
                    if size is not None
                    else trust_unrecorded and is_settled and actual > 0
                ),
                is_settled and size is not None and actual < size,
                is_settled and size is not None and actual > size,
            )
        )
    return out

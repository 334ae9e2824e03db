"""Which checkpoint files and step directories are complete.

The one verdict that ``trainguard.checkpoint.latest`` and ``prune`` act on and the exporter
publishes, so that the two never disagree.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from trainguard.shared.fileio import settled
from trainguard.shared.listing import Entry, Listing
from trainguard.shared.selfcheck import expected_size
from trainguard.shared.stepdir import StepDir


class Judged(NamedTuple):
    """One checkpoint file judged against what its writer recorded.

    A named tuple, like :class:`Entry`.
    """

    entry: Entry
    expected_size: int | None  # None: no record here nor on the primary
    expected_sha256: str | None
    mtime_known: bool
    settled: bool  # untouched for the grace period
    complete: bool  # size matches the expected size and the mtime is known
    truncated: bool  # smaller than expected, and settled or judged by its own record
    oversized: bool  # larger than expected, and settled or judged by its own record


def judged(
    entry: Entry,
    size: int | None,
    sha: str | None,
    now_ns: int,
    grace_ns: int,
    trust_unrecorded: bool,
    vouched: bool = False,
    committed: bool = False,
) -> Judged:
    """One file judged against its expected ``size`` (None: nothing says what it should be).

    The one rule for a single checkpoint file and for a file of a step directory alike: with a
    size, complete when it has that size; smaller or larger, damaged once settled, or at once
    when ``committed`` (the size is the file's own record, committed only after the file was
    whole: nothing is still writing it, so the grace period, which is for files a writer may
    still be filling, does not apply); without one, complete only when its directory was
    committed by its framework and has settled (``vouched``), or with ``trust_unrecorded`` once
    it has settled and is not empty (an empty file is what a crash between create and write
    leaves). A file whose mtime is unknown (0) is never complete, never settled.
    """
    st = entry.stat
    mtime = st.st_mtime_ns
    known = mtime > 0
    is_settled = known and now_ns - mtime >= grace_ns
    actual = st.st_size
    if size is None:
        complete = known and (vouched or (trust_unrecorded and is_settled and actual > 0))
        return Judged(entry, None, sha, known, is_settled, complete, False, False)
    final = is_settled or (committed and known)
    return Judged(
        entry,
        size,
        sha,
        known,
        is_settled,
        known and actual == size,
        final and actual < size,
        final and actual > size,
    )


def judge(
    listing: Listing,
    *,
    now_ns: int,
    grace_ns: int,
    primary: Listing | None = None,
    trust_unrecorded: bool = False,
) -> list[Judged]:
    """Judge every file of a location.

    Its own record gives the expected size and hash; a mirror's file without a record falls back on
    the primary's record of the same name, or on the primary file's size once that has settled. With
    ``trust_unrecorded``, a settled file for which none of these gives a size is complete (its
    writer recorded nothing to check).

    Whatever the records and the trust setting, a mirror's file smaller than the settled primary
    file of the same name (itself not smaller nor larger than its own record) is judged against
    the primary's size: a copy taken while an unrecorded primary was still being written carries
    a record of its own short size, and is a truncated copy, not a checkpoint.
    """
    by_name = {e.name: e for e in primary.files} if primary is not None else {}
    out = []
    for entry in listing.files:
        rec = listing.records.get(entry.name)
        size: int | None = None
        sha: str | None = None
        committed = False  # the size is the file's own record (judged at once)
        if rec is not None:
            size, sha = rec.size, rec.sha256
            committed = True
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
                    committed = False
        elif primary is not None:
            prec = primary.records.get(entry.name)
            if prec is not None:
                size, sha = prec.size, prec.sha256
            else:
                pfile = by_name.get(entry.name)
                if pfile is not None and settled(pfile.stat, now_ns, grace_ns):
                    size = pfile.stat.st_size
        out.append(judged(entry, size, sha, now_ns, grace_ns, trust_unrecorded, False, committed))
    return out


#: a location's settled step directories' verdicts: name -> (the StepDir judged, the
#: primary's StepDir it was judged against, (trust, grace, primary settled), the verdict)
StepCache = dict[str, tuple[StepDir, "StepDir | None", tuple[bool, int, bool], "StepVerdict"]]


class StepVerdict(NamedTuple):
    """A committed step directory judged as a whole.

    Its files one by one (against its own record, or for a mirror the primary's record or
    directory of the same step), the files expected but absent, and whether the step is a
    complete checkpoint.
    """

    dir: StepDir
    files: list[Judged]
    missing: int  # files the record (or the primary's directory) has and this one lacks
    missing_bytes: int
    settled: bool  # nothing under it touched for the grace period
    complete: bool


def judge_dirs(
    listing: Listing,
    *,
    now_ns: int,
    grace_ns: int,
    primary: Listing | None = None,
    trust_unrecorded: bool = False,
    cache: StepCache | None = None,
) -> list[StepVerdict]:
    """Judge every committed step directory of a location.

    A directory committed by a trainguard record is complete once every file it lists is there with
    its recorded size (as a recorded file is); one committed by its framework's marker once nothing
    under it has been touched for the grace period, or at once when every file in it carries its own
    length (:mod:`trainguard.shared.selfcheck`: safetensors, torch zips, JSON) and has it; a file
    shorter than its own header says is never complete, and truncated once settled. A mirror's
    directory is compared file by file with the primary's directory of the same step (its record,
    else its files once settled): a missing or smaller file is truncation, and the step is not
    complete.

    ``cache`` (the same dict for every judgement of one location) keeps the verdict of each
    settled directory: judged again only when it, or the primary's directory of its step, is
    another object (changed), or the settings differ.
    """
    pdirs = {d.name: d for d in primary.dirs} if primary is not None else {}
    out: list[StepVerdict] = []
    fresh: StepCache = {}
    for d in listing.dirs:
        is_settled = d.touched_ns is not None and now_ns - d.touched_ns >= grace_ns
        pd = pdirs.get(d.name)
        p_settled = (
            pd is not None and pd.touched_ns is not None and now_ns - pd.touched_ns >= grace_ns
        )
        settings = (trust_unrecorded, grace_ns, p_settled)
        hit = cache.get(d.name) if cache is not None and is_settled else None
        if hit is not None and hit[0] is d and hit[1] is pd and hit[2] == settings:
            verdict = hit[3]
        else:
            verdict = _judge_dir(
                d,
                _reference(d, pd, p_settled),
                listing.directory,
                now_ns=now_ns,
                grace_ns=grace_ns,
                trust_unrecorded=trust_unrecorded,
                is_settled=is_settled,
            )
        out.append(verdict)
        if is_settled:
            fresh[d.name] = (d, pd, settings, verdict)
    if cache is not None:
        cache.clear()
        cache.update(fresh)
    return out


#: a step directory's files as they should be: path under it -> (size, SHA-256 or None)
FileMap = dict[str, tuple[int, str | None]]


def _reference(d: StepDir, pd: StepDir | None, p_settled: bool) -> FileMap | None:
    """What the files of step directory ``d`` should be; None when nothing says.

    Its own record first. A mirror's directory without one is held to the primary's directory
    of the same step: its record, else its files as they are once settled (a primary still
    being written is no reference, its files may yet grow).
    """
    if d.record is not None:
        return d.record.file_map()
    if pd is None:
        return None
    if pd.record is not None:
        return pd.record.file_map()
    if p_settled:
        cut = len(pd.name) + 1
        return {e.name[cut:]: (e.stat.st_size, None) for e in pd.files}
    return None


def _judge_dir(
    d: StepDir,
    ref: FileMap | None,
    directory: Path,
    *,
    now_ns: int,
    grace_ns: int,
    trust_unrecorded: bool,
    is_settled: bool,
) -> StepVerdict:
    """One committed step directory: each of its files against ``ref``, and the whole.

    Each file goes through :func:`judged`, the rule single files follow too. What is the
    directory's own: the files ``ref`` lists that are absent, and when a directory committed by
    its framework's marker has no reference at all, the lengths its files' formats carry
    (:mod:`trainguard.shared.selfcheck`), which let it be complete before it has settled.
    """
    vouched = d.commit == "marker" and is_settled
    # nobody recorded it: files whose format carries their length are checked by it
    own = ref is None and d.commit == "marker"
    self_checked = own
    cut = len(d.name) + 1
    judged_files: list[Judged] = []
    present: set[str] = set()
    for e in d.files:
        rel = e.name[cut:]
        present.add(rel)
        expected = ref.get(rel) if ref is not None else None
        size, sha = expected if expected is not None else (None, None)
        if own:
            size = expected_size(directory / e.name, e.stat)
            self_checked = self_checked and size is not None
        judged_files.append(
            judged(
                e,
                size,
                sha,
                now_ns,
                grace_ns,
                trust_unrecorded,
                vouched,
                d.record is not None and expected is not None,  # its own record's size
            )
        )
    missing = [(rel, exp[0]) for rel, exp in (ref or {}).items() if rel not in present]
    complete = (
        d.touched_ns is not None
        and bool(judged_files)
        and not missing
        and all(j.complete for j in judged_files)
        and (d.commit == "record" or is_settled or self_checked)
    )
    return StepVerdict(
        d,
        judged_files,
        len(missing) if is_settled or d.commit == "record" else 0,
        sum(size for _, size in missing),
        is_settled,
        complete,
    )

"""The saves into each checkpoint location, as the training processes recorded them.

The checkpoint library folds every save's outcome into a status file per checkpoint directory in
the state directory (:mod:`trainguard.shared.save_status`); the checkpoints collector publishes
it per watched location here: failed saves by reason (every reason from 0, so that the first
failure is an increase a rule sees), the last success (and its age by this host's clock,
which the rules judge) and the last failure.
"""

from __future__ import annotations

import time
from pathlib import Path

from trainguard.exporter.collectors.checkpoints.metrics import (
    LAST_FAILURE,
    LAST_FAILURE_AGE,
    LAST_SUCCESS,
    LAST_SUCCESS_AGE,
    SAVE_FAILURES,
)
from trainguard.exporter.collectors.checkpoints.verdicts import Families
from trainguard.exporter.runs.rows import age
from trainguard.exporter.runs.targets import CheckpointTarget, ownership_problem
from trainguard.exporter.scrape.context import Scrape
from trainguard.shared.fileio import UntrustedFileError, read_untrusted
from trainguard.shared.save_status import (
    MAX_BYTES,
    REASONS,
    SaveStatus,
    SaveStatusError,
    location_key,
    parse_status,
    status_path,
)


def read_status(state_dir: Path, t: CheckpointTarget) -> SaveStatus | None:
    """The location's save status; None when no save recorded one.

    Raises SaveStatusError for a file that cannot be used: unreadable, malformed, about another
    directory, or (for a location announced in a heartbeat) not owned by the heartbeat's owner,
    since whoever can write the state directory could otherwise clear or forge the counts.
    """
    path = status_path(state_dir, t.path)
    try:
        data, st = read_untrusted(path, MAX_BYTES)
    except FileNotFoundError:
        return None
    except (UntrustedFileError, OSError) as exc:
        raise SaveStatusError(str(exc)) from None
    problem = ownership_problem(st, t.owner, "save status file")
    if problem is not None:
        raise SaveStatusError(problem)
    status = parse_status(data)
    if status.directory != location_key(t.path):
        raise SaveStatusError(f"names another directory than {t.path}")
    return status


def publish(
    families: dict[str, Families], state_dir: Path, t: CheckpointTarget, scrape: Scrape
) -> None:
    """Add the location's save outcomes: every reason's count (0 without a status file)."""
    labels = [t.run, t.location]
    try:
        status = read_status(state_dir, t)
    except SaveStatusError as exc:
        scrape.error(
            f"save status of run {t.run!r}, location {t.location!r} "
            f"({status_path(state_dir, t.path)}): {exc}"
        )
        return  # absent, not zero: a rule must not read a reset
    failures = status.failures if status is not None else {}
    for reason in REASONS:
        families[SAVE_FAILURES.name].add_metric([*labels, reason], failures.get(reason, 0))
    if status is None:
        return
    now = time.time()  # after the status was read: every age is >= 0 on this host's one clock
    if status.last_success is not None:
        families[LAST_SUCCESS.name].add_metric(labels, status.last_success)
        families[LAST_SUCCESS_AGE.name].add_metric(labels, age(now, status.last_success))
    if status.last_failure is not None:
        families[LAST_FAILURE.name].add_metric(labels, status.last_failure)
        families[LAST_FAILURE_AGE.name].add_metric(labels, age(now, status.last_failure))

"""Reading a heartbeat file that anyone may have written.

This is the exporter's side of the format in :mod:`trainguard.shared.heartbeat.record`; the reporter
reads its predecessor's the same way: no symlinks, regular files only, at most 1 MiB, every
field's type, range and length checked, and every failure a
:class:`~trainguard.shared.heartbeat.record.HeartbeatError` naming the file and the field. Error
messages never quote string values from the file (a hard link to a private file must not leak
its contents into the exporter's log).
"""

from __future__ import annotations

import json
import os
from typing import Any

from trainguard.shared.fileio import UntrustedFileError, read_untrusted
from trainguard.shared.heartbeat.fields import Fields, one_of
from trainguard.shared.heartbeat.record import (
    FORMAT,
    MAX_BYTES,
    MAX_INT,
    MAX_PID,
    MAX_RANK,
    STATES,
    Heartbeat,
    HeartbeatError,
    check_run_name,
    heartbeat_filename,
    kind_of,
)
from trainguard.shared.nonfinite_read import read_nonfinite


def read_heartbeat(path: str | os.PathLike[str], *, check_name: bool = True) -> Heartbeat:
    """Read and validate one heartbeat file that anyone may have written.

    Raises only :class:`HeartbeatError`. With ``check_name`` the file name must be the one the run
    and rank inside it would get, so a copied or renamed file cannot pose as another run.
    """
    source = os.fspath(path)
    hb = parse_heartbeat_bytes(_read_file(source), source)
    if check_name:
        expected = heartbeat_filename(hb.run, hb.rank)
        if os.path.basename(source) != expected:
            raise HeartbeatError(
                f"{source}: file name does not match the run and rank inside it (expected "
                f"{expected}); a copied or renamed heartbeat is not trusted"
            )
    return hb


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise _DuplicateKey
    return out


def parse_heartbeat_bytes(raw: bytes, source: str = "<heartbeat>") -> Heartbeat:
    """Decode and validate the bytes of a heartbeat file; raises only :class:`HeartbeatError`.

    A key given twice in one object is refused: which of the two a reader takes differs
    between JSON parsers, so such a file can mean two things.
    """
    if len(raw) > MAX_BYTES:
        raise HeartbeatError(f"{source}: {len(raw)} bytes, larger than the 1 MiB limit; refused")
    if not raw:
        raise HeartbeatError(f"{source}: empty file (truncated or not a heartbeat)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HeartbeatError(f"{source}: not UTF-8 text (bad byte at offset {exc.start})") from None
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        raise HeartbeatError(
            # json's message may end in "at" already ("Invalid control character at")
            f"{source}: not valid JSON: {exc.msg.removesuffix(' at')} at line {exc.lineno} "
            f"column {exc.colno}"
            " (truncated or not a heartbeat)"
        ) from None
    except _DuplicateKey:
        raise HeartbeatError(
            f"{source}: not usable JSON: a key appears twice in one object"
        ) from None
    except (RecursionError, ValueError) as exc:  # nesting too deep, ints too long
        raise HeartbeatError(f"{source}: not usable JSON: {type(exc).__name__}") from None
    return parse_heartbeat(data, source)


def _read_file(source: str) -> bytes:
    try:
        return read_untrusted(source, MAX_BYTES)[0]
    except FileNotFoundError as exc:
        raise HeartbeatError(f"{source}: cannot open: {exc.strerror or exc}") from None
    except UntrustedFileError as exc:
        raise HeartbeatError(str(exc)) from None


def parse_heartbeat(data: Any, source: str = "<heartbeat>") -> Heartbeat:
    """Validate an already-decoded JSON document; raises only :class:`HeartbeatError`."""
    if not isinstance(data, dict):
        raise HeartbeatError(f"{source}: expected a JSON object, got {kind_of(data)}")
    if "format" not in data:
        raise HeartbeatError(f"{source}: not a trainguard heartbeat (no 'format' field)")
    fmt = data["format"]
    if fmt != FORMAT or isinstance(fmt, bool):
        shown = fmt if isinstance(fmt, int) and not isinstance(fmt, bool) else kind_of(fmt)
        raise HeartbeatError(
            f"{source}: field 'format': unsupported heartbeat format {shown} (this trainguard "
            f"reads format {FORMAT})"
        )
    f = Fields(source, data)
    run = f.get("run", check_run_name)
    rank = f.integer("rank", 0, MAX_RANK)
    state = f.get("state", one_of(STATES), default="running")
    return Heartbeat(
        run=run,
        rank=rank,
        pid=f.integer("pid", 1, MAX_PID),
        create_time=f.timestamp("create_time"),
        start_ticks=f.integer("start_ticks", 0, MAX_INT, optional=True),
        host=f.text("host", 255, default=""),
        started=f.timestamp("started"),
        time=f.timestamp("time"),
        state=state,
        error=f.text("error", 200, optional=True),
        step=f.integer("step", 0, MAX_INT, optional=True),
        step_time=f.timestamp("step_time", optional=True),
        first_step=f.integer("first_step", 0, MAX_INT, optional=True),
        scalars=f.scalars("scalars"),
        world_size=f.integer("world_size", 1, MAX_RANK + 1, optional=True),
        boot_id=f.text("boot_id", 64, optional=True),
        boot_time=f.timestamp("boot_time", optional=True),
        pid_ns=f.integer("pid_ns", 0, 2**64 - 1, optional=True),
        checkpoint_dir=f.abspath("checkpoint_dir"),
        checkpoint_pattern=f.text("checkpoint_pattern", 255, optional=True),
        checkpoint_layout=f.text("checkpoint_layout", 32, optional=True),
        mirrors=f.mirrors("mirrors"),
        log_file=f.abspath("log_file"),
        allocator=f.allocator("allocator"),
        memory_snapshots=f.integer("memory_snapshots", 0, MAX_INT, default=0),
        deaths=f.integer("deaths", 0, MAX_INT, default=0),
        death_history=f.deaths("death_history"),
        version=f.text("version", 64, optional=True),
        snapshots=f.snapshots("snapshots"),
        nonfinite=read_nonfinite(f, "nonfinite"),
        stuck=f.stuck("stuck"),
        signal=f.signal_name("signal"),
        exit_cause=f.exit_cause("exit_cause"),
        last_signal=f.signal_name("last_signal"),
        last_signal_time=f.timestamp("last_signal_time", optional=True),
        job=f.job("job"),
        timing=f.timing("timing"),
        starting=f.get("starting", _boolean, default=False),
    )


def _boolean(v: Any) -> str | None:
    return None if isinstance(v, bool) else f"expected true or false, got {kind_of(v)}"

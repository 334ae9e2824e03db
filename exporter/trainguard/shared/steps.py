"""Step directories: checkpoints as the frameworks write them, and which are committed.

A directory per step (``checkpoint-500/``, ``step-500/``, ``global_step500/``, ``iter_0000500/``),
often one file per rank, committed by the framework's own protocol. This module says which step
directories are committed (their *layout*: which marker the framework writes last); what each holds
(every regular file under it, walked without following links and within bounds) is
:mod:`trainguard.shared.stepdir`. The library (``latest``/``prune``) and the exporter share both, so
that they never disagree on what is complete.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from trainguard.shared.fileio import (
    UntrustedFileError,
    is_not_a_dir_error,
    open_untrusted,
    read_untrusted,
)
from trainguard.shared.manifest import ManifestError, Record
from trainguard.shared.pattern import CheckpointPattern
from trainguard.shared.selfcheck import indented_json_closed
from trainguard.shared.stepdir import Entry, InFlight, StepDir, Tree, TreeMemo, open_dir, walk

#: how a location's step directories are committed; ``auto`` picks one from what is there
LAYOUTS = (
    "auto",
    "files",  # single files only (step directories are ignored)
    "trainguard",  # committed by a trainguard.checkpoint record only
    "dcp",  # torch.distributed.checkpoint: `.metadata`, written last (atomic rename)
    "huggingface",  # Hugging Face Trainer: `trainer_state.json`, written last
    "deepspeed",  # steps up to the one named in `latest`, beside the step directories
    "megatron",  # steps up to the one in `latest_checkpointed_iteration.txt`
    "orbax",  # the final name (renamed from `.orbax-checkpoint-tmp*`) and `commit_success.txt`
)
DEFAULT_LAYOUT = "auto"
DEEPSPEED_LATEST = "latest"
MEGATRON_LATEST = "latest_checkpointed_iteration.txt"
#: files beside the step directories that name the newest committed one
TRACKERS = {DEEPSPEED_LATEST: "deepspeed", MEGATRON_LATEST: "megatron"}
DCP_MARKER = ".metadata"
HF_MARKER = "trainer_state.json"
ORBAX_COMMIT = "commit_success.txt"
ORBAX_MARKERS = (ORBAX_COMMIT, "_CHECKPOINT_METADATA")
#: tracker files are a line of text; trainer_state.json grows with the log history
MAX_TRACKER_BYTES = 4096
MAX_HF_STATE_BYTES = 32 * 1024 * 1024


class LayoutError(ManifestError):
    """A location whose layout cannot be told: it fails visibly rather than guessing.

    Ambiguous markers, or a tracker file naming something that is not a step.
    """


def layout_problem(layout: str) -> str | None:
    """Why ``layout`` is not a layout name, or None."""
    if layout not in LAYOUTS:
        return f"expected one of {', '.join(LAYOUTS)}, got {layout!r}"
    return None


def _read_marker(name: str, dir_fd: int | None, directory: Path, cap: int) -> bytes | None:
    """A marker or tracker file's content, None when it is larger than ``cap``.

    Read as every untrusted file is (:func:`~trainguard.shared.fileio.read_untrusted`).
    """
    try:
        return read_untrusted(directory / name, cap, dir_fd=dir_fd)[0]
    except UntrustedFileError as exc:
        if exc.too_large:
            return None
        raise ManifestError(str(exc)) from None


def tracker_step(
    layout: str, dir_fd: int | None, directory: Path, pattern: CheckpointPattern
) -> int | None:
    """The newest committed step named by a tracker file beside the step directories.

    The tracker is DeepSpeed's ``latest`` or Megatron's ``latest_checkpointed_iteration.txt``.
    None when there is none yet (or Megatron's ``release``). A tracker naming something that is
    not a step is a LayoutError.
    """
    name = DEEPSPEED_LATEST if layout == "deepspeed" else MEGATRON_LATEST
    try:
        data = _read_marker(name, dir_fd, directory, MAX_TRACKER_BYTES)
    except FileNotFoundError:
        return None
    if data is None:
        raise LayoutError(f"{directory / name} is larger than {MAX_TRACKER_BYTES} bytes")
    text = data.decode("utf-8", "replace").strip()
    if not text:
        return None  # being written (neither framework writes it atomically)
    if layout == "megatron":
        if text == "release":
            return None
        if text.isascii() and text.isdigit() and len(text) <= 18:
            return int(text)
    else:
        step = pattern.dir_step(text)
        if step is not None:
            return step
    raise LayoutError(
        f"{directory / name} names {text[:80]!r}, which is not a step directory of the pattern "
        f"{pattern.pattern!r}"
    )


def _hf_state_ok(dfd: int, where: Path, st: os.stat_result, memo: TreeMemo | None) -> bool:
    """Whether ``trainer_state.json`` is whole, so that it marks its step committed.

    It is written with a plain open/write, so a save killed while writing it leaves a partial
    document: it marks the step only once it is whole (as the Trainer writes it, indented, its
    last line the top-level ``}``: two small reads; else once it parses).
    """
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if memo is not None:
        cached = memo.marker(key)
        if cached is not None:
            return cached
    try:
        ok = _hf_state_closed(dfd, where)
        if not ok:  # not as the Trainer writes it (indented): parse it
            data = _read_marker(HF_MARKER, dfd, where, MAX_HF_STATE_BYTES)
            ok = data is None or isinstance(json.loads(data), dict)  # too large: present
    except (OSError, ValueError, ManifestError, UntrustedFileError):
        ok = False
    if memo is not None:
        memo.store_marker(key, ok)
    return ok


def _hf_state_closed(dfd: int, where: Path) -> bool:
    """trainer_state.json as the Trainer writes it, whole, by two small reads (selfcheck).

    Opened as every file anyone may have written is (:func:`open_untrusted`): a link or
    anything but a regular file raises, and the caller counts that as not whole.
    """
    fd, st = open_untrusted(where / HF_MARKER, dir_fd=dfd)
    try:
        return indented_json_closed(fd, st.st_size)
    finally:
        os.close(fd)


def _kinds(top: Mapping[str, os.stat_result], temp: bool) -> set[str]:
    """The layouts a step directory's own files (not its subdirectories') point to."""
    kinds = set()
    if HF_MARKER in top:
        kinds.add("huggingface")
    elif DCP_MARKER in top:  # an FSDP Trainer checkpoint holds DCP files as well
        kinds.add("dcp")
    if temp or any(m in top for m in ORBAX_MARKERS):
        kinds.add("orbax")
    return kinds


class _Seen(NamedTuple):
    name: str
    step: int
    temp: bool
    tree: Tree
    top: dict[str, os.stat_result]
    hf_ok: bool


def step_directories(
    directory: Path,
    dir_fd: int | None,
    pattern: CheckpointPattern,
    layout: str,
    records: Mapping[str, Record],
    candidates: list[tuple[str, int, bool]],
    trackers: set[str],
    memo: TreeMemo | None = None,
    fallback: str | None = None,
) -> tuple[tuple[StepDir, ...], tuple[InFlight, ...], str]:
    """The committed and in-flight step directories of a location.

    ``candidates`` are the (name, step, temporary name) of its directories that the pattern matched,
    ``trackers`` the tracker files beside them. Returns them with the layout they were judged by
    (``auto`` resolved: ``fallback`` when nothing here tells, which for a mirror is its primary's
    layout, else ``none``, so that only trainguard records commit).
    """
    seen: list[_Seen] = []
    for name, step, temp in candidates:
        try:
            dfd = open_dir(name, dir_fd, directory)
        except FileNotFoundError:
            continue  # renamed (committed) or pruned since the listing
        except OSError as exc:
            if is_not_a_dir_error(exc):
                raise ManifestError(f"{directory / name} is a symbolic link") from None
            raise
        try:
            tree = walk(dfd, directory / name, name, memo)
            top = tree.top
            hf_ok = HF_MARKER in top and _hf_state_ok(dfd, directory / name, top[HF_MARKER], memo)
        finally:
            os.close(dfd)
        seen.append(_Seen(name, step, temp, tree, top, hf_ok))
    resolved = layout
    if layout == "auto":
        resolved = _detect(directory, seen, trackers)
        if resolved == "none" and fallback is not None:
            resolved = fallback
    latest = (
        tracker_step(resolved, dir_fd, directory, pattern)
        if resolved in ("deepspeed", "megatron")
        else None
    )
    # an Orbax that writes commit_success.txt writes it in every step it commits
    orbax_files = resolved == "orbax" and any(ORBAX_COMMIT in s.top for s in seen if not s.temp)
    committed: list[StepDir] = []
    inflight: list[InFlight] = []
    for s in seen:
        rec = records.get(s.name)
        if rec is not None and rec.files is None:
            raise ManifestError(f"record for {directory / s.name} names a non-regular file")
        commit = None
        if s.temp:
            commit = None
        elif rec is not None:
            commit = "record"
        elif _marked(resolved, s, latest, orbax_files):
            commit = "marker"
        if commit is None:
            inflight.append(InFlight(s.name, s.step, s.tree.touched_ns, len(s.tree.files)))
            continue
        old = memo.step_dir(s.name) if memo is not None else None
        if old is not None and old.tree is s.tree and old.commit == commit and old.record is rec:
            committed.append(old)  # the same object: compared by identity, judged as before
            continue
        files = tuple(Entry(f"{s.name}/{rel}", s.step, st) for rel, st in s.tree.files)
        made = StepDir(s.name, s.step, files, s.tree.touched_ns, commit, rec, s.tree)
        if memo is not None:
            memo.store_step_dir(made)
        committed.append(made)
    return tuple(committed), tuple(inflight), resolved


def _marked(layout: str, s: _Seen, latest: int | None, orbax_files: bool) -> bool:
    if layout == "huggingface":
        return s.hf_ok
    if layout == "dcp":
        return DCP_MARKER in s.top
    if layout in ("deepspeed", "megatron"):
        return latest is not None and s.step <= latest
    if layout == "orbax":
        return _orbax_committed(s, orbax_files)
    return False  # trainguard and none: a record only


def _orbax_committed(s: _Seen, orbax_files: bool) -> bool:
    """Whether an Orbax step directory under its final name is still what Orbax committed.

    Orbax (0.12) writes ``commit_success.txt`` last, then renames the temporary directory; it
    deletes an old step in place (``max_to_keep``: a recursive delete under the final name), so
    a kill while deleting leaves a partial step under a committed name. Each removal touches
    its parent directory, so a step is committed only while ``commit_success.txt`` is there and
    nothing under the step is newer than it. Where no step of the location holds one (an Orbax
    that writes none), the final name alone commits.
    """
    mark = s.top.get(ORBAX_COMMIT)
    if mark is None:
        return not orbax_files
    return s.tree.touched_ns is not None and s.tree.touched_ns <= mark.st_mtime_ns


def _detect(directory: Path, seen: list[_Seen], trackers: set[str]) -> str:
    """The layout a location's contents show, where they show only one."""
    found = {TRACKERS[t] for t in trackers}
    if len(found) > 1:
        raise LayoutError(
            f"{directory}: holds both {DEEPSPEED_LATEST!r} and {MEGATRON_LATEST!r}; set the "
            "location's layout in the config"
        )
    if found:
        return found.pop()
    kinds: set[str] = set()
    for s in seen:
        kinds |= _kinds(s.top, s.temp and ".orbax-checkpoint-tmp" in s.name)
    if len(kinds) > 1:
        raise LayoutError(
            f"{directory}: step directories look like {' and '.join(sorted(kinds))}; set the "
            "location's layout in the config (layout: one of "
            f"{', '.join(LAYOUTS[1:])})"
        )
    return kinds.pop() if kinds else "none"

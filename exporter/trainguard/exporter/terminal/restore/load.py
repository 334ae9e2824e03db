"""The restore drill's loader: loads one checkpoint the way training would, in a child process.

``trainguard verify --restore`` (:mod:`trainguard.exporter.terminal.restore.command`) starts it as
``python -m trainguard.exporter.terminal.restore.load --out FILE [--memory-limit N] PATH``. It
caps its own address space first (before torch is imported), so a checkpoint that needs more
memory fails here with a message instead of taking the host down, then loads and writes one
JSON object to FILE: ``{"status": "ok"|"failed"|"unchecked", "reason", "files", "bytes"}``.
Exit 0 loaded, 1 failed, 3 unchecked (a part needs torch, which is not installed).

What is loaded: a torch file (``.pt``, ``.pth``, ``.ckpt``, ``.bin``, anything not otherwise
known) with ``torch.load(weights_only=True)``; safetensors with the ``safetensors`` package (every
tensor), else their header and every data byte (:mod:`trainguard.shared.selfcheck`); a DCP
directory (``.metadata``): its metadata, every storage file it names (present and long enough),
then a load of every item; a Hugging Face checkpoint (``trainer_state.json``): that file, the
model's weights (every shard its index names) and every other file as above.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import warnings
from pathlib import Path

from trainguard.exporter.terminal.restore.files import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_UNCHECKED,
    MAX_FILES,
    LoadFailed,
    Tally,
    load_file,
    load_json,
    loading,
    torch_or_none,
)
from trainguard.shared.steps import DCP_MARKER, HF_MARKER


def load_dcp(directory: Path, prefix: str, tally: Tally) -> None:
    """A DCP checkpoint: metadata, every storage file it names, then every item loaded."""
    if torch_or_none() is None:
        tally.unchecked.append(prefix + DCP_MARKER)
        return
    from torch.distributed.checkpoint import FileSystemReader

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with loading(prefix + DCP_MARKER, "reading the DCP metadata", tally):
            metadata = FileSystemReader(str(directory)).read_metadata()
        storage = getattr(metadata, "storage_data", None)
        if not storage:
            raise LoadFailed(f"{prefix}{DCP_MARKER}: names no storage files")
        needed: dict[str, tuple[int, str]] = {}
        for index, info in storage.items():
            end = int(info.offset) + int(info.length)
            have = needed.get(info.relative_path)
            if have is None or end > have[0]:
                needed[info.relative_path] = (end, index.fqn)
        for rel, (end, fqn) in sorted(needed.items()):
            try:
                size = os.stat(directory / rel, follow_symlinks=False).st_size
            except FileNotFoundError:
                raise LoadFailed(
                    f"{prefix}{rel}: missing (named in {DCP_MARKER}, holds {fqn!r} among others)"
                ) from None
            if size < end:
                raise LoadFailed(
                    f"{prefix}{rel}: {size} bytes, {DCP_MARKER} needs at least {end}: truncated"
                )
            tally.bytes += size
        tally.files += len(needed) + 1
        _dcp_load_all(directory, prefix, tally)


def _dcp_load_all(directory: Path, prefix: str, tally: Tally) -> None:
    """Load every item of a DCP checkpoint into memory, as ``dcp_to_torch_save`` does."""
    try:
        from torch.distributed.checkpoint import FileSystemReader
        from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
        from torch.distributed.checkpoint.state_dict_loader import _load_state_dict
    except ImportError:  # private API moved: the checks above are what is left
        return
    state: dict[str, object] = {}
    with loading(prefix.rstrip("/") or directory.name, "the DCP load", tally):
        _load_state_dict(
            state,
            storage_reader=FileSystemReader(str(directory)),
            planner=_EmptyStateDictLoadPlanner(),
            no_dist=True,
        )
    del state
    gc.collect()


def _is_weights(rel: str) -> bool:
    base = rel.rsplit("/", 1)[-1]
    return base.startswith(("model", "pytorch_model", "adapter_model", "consolidated")) and (
        base.endswith((".safetensors", ".bin", ".pt", ".pth"))
    )


def load_hf(directory: Path, prefix: str, tally: Tally) -> None:
    """A Hugging Face Trainer checkpoint: its state, its model weights, everything else."""
    state = load_json(directory / HF_MARKER, prefix + HF_MARKER, tally)
    if not isinstance(state, dict) or not isinstance(state.get("global_step"), int):
        raise LoadFailed(f"{prefix}{HF_MARKER}: no integer 'global_step' in it")
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if not (directory / index).exists():
            continue
        doc = load_json(directory / index, prefix + index, tally)
        shards = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(shards, dict):
            raise LoadFailed(f"{prefix}{index}: no 'weight_map' in it")
        for shard in sorted(set(map(str, shards.values()))):
            if os.path.basename(shard) != shard or shard in (".", ".."):
                raise LoadFailed(f"{prefix}{index}: names {shard!r}, not a file beside it")
            if not (directory / shard).is_file():
                raise LoadFailed(f"{prefix}{shard}: missing (named in {index})")
    files, dirs = _walk(directory)
    if not any(_is_weights(f) for f in files) and not dirs:
        raise LoadFailed(
            f"{prefix or directory.name + '/'}: no model weights (model.safetensors, "
            "pytorch_model.bin, their shards, or a subdirectory of them)"
        )
    load_tree(directory, prefix, tally, skip={HF_MARKER})


def _walk(directory: Path) -> tuple[list[str], list[str]]:
    """Every visible file and subdirectory under ``directory`` (relative), links not followed."""
    files: list[str] = []
    dirs: list[str] = []
    for root, subdirs, names in os.walk(directory):
        rel = os.path.relpath(root, directory)
        base = "" if rel == "." else rel + "/"
        subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))
        dirs += [base + d for d in subdirs]
        files += [base + n for n in sorted(names) if not n.startswith(".") or n == DCP_MARKER]
        if len(files) > MAX_FILES:
            raise LoadFailed(f"{directory}: more than {MAX_FILES} files")
    return files, dirs


def load_tree(directory: Path, prefix: str, tally: Tally, skip: set[str] | None = None) -> None:
    """Every file under a step directory; a DCP directory under it as a whole."""
    if (directory / DCP_MARKER).is_file():
        load_dcp(directory, prefix, tally)
        return
    files, dirs = _walk(directory)
    dcp_dirs = [d for d in dirs if (directory / d / DCP_MARKER).is_file()]
    for d in dcp_dirs:
        load_dcp(directory / d, prefix + d + "/", tally)
    for rel in files:
        if rel in (skip or ()) or any(rel.startswith(d + "/") for d in dcp_dirs):
            continue
        path = directory / rel
        if path.is_symlink() or not path.is_file():
            continue
        load_file(path, prefix + rel, tally)
    if not files:
        raise LoadFailed(f"{directory.name}/: holds no files")


def load(path: Path, tally: Tally) -> None:
    """Load the checkpoint at ``path`` (a file or a step directory)."""
    if path.is_dir():
        prefix = path.name + "/"
        if (path / DCP_MARKER).is_file():
            load_dcp(path, prefix, tally)
        elif (path / HF_MARKER).is_file():
            load_hf(path, prefix, tally)
        else:
            load_tree(path, prefix, tally)
    else:
        load_file(path, path.name, tally)


def _cap_memory(limit: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="restore_load")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--memory-limit", type=int, default=0, help="RLIMIT_AS in bytes; 0: none")
    p.add_argument("path", type=Path)
    args = p.parse_args(argv)
    if args.memory_limit:
        _cap_memory(args.memory_limit)
    tally = Tally(memory_limit=args.memory_limit)
    try:
        load(args.path, tally)
    except LoadFailed as exc:
        status, reason, code = "failed", str(exc), EXIT_FAILED
    except MemoryError:
        status, code = "failed", EXIT_FAILED
        reason = "out of memory (raise --memory-limit if the host has the memory)"
    else:
        if tally.unchecked:
            status, code = "unchecked", EXIT_UNCHECKED
            shown = ", ".join(tally.unchecked[:5]) + (", ..." if len(tally.unchecked) > 5 else "")
            reason = (
                f"torch is not installed here: {len(tally.unchecked)} file(s) not loaded "
                f"({shown}); install trainguard[torch] where the drill runs"
            )
        else:
            status, code, reason = "ok", EXIT_OK, ""
    doc = {"status": status, "reason": reason, "files": tally.files, "bytes": tally.bytes}
    args.out.write_text(json.dumps(doc), encoding="utf-8")
    return code


if __name__ == "__main__":
    sys.exit(main())

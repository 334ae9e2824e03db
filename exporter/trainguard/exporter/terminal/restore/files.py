"""The restore drill's loaders of single files, and how a failure to load is told.

A torch file with ``torch.load(weights_only=True)`` (``.pt``, ``.pth``, ``.ckpt``, ``.bin``,
anything not otherwise known: it is how training reads what it wrote); safetensors with the
``safetensors`` package (every tensor), else their header and every data byte
(:mod:`trainguard.shared.selfcheck`); JSON parsed; every file first checked against the size
its own format gives. Used by :mod:`trainguard.exporter.terminal.restore.load`, in its child.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from trainguard.shared.fileio import FILE_FLAGS, O_CLOEXEC
from trainguard.shared.selfcheck import expected_size

EXIT_OK, EXIT_FAILED, EXIT_UNCHECKED = 0, 1, 3
#: known non-torch files, only read; a file of any other name is loaded with torch.load (it is
#: how training reads what it wrote)
READ_ONLY_SUFFIXES = (".txt", ".md", ".yaml", ".yml", ".model", ".vocab", ".distcp", ".log")
MAX_JSON = 64 * 1024 * 1024
MAX_FILES = 100_000
_CHUNK = 8 * 1024 * 1024
#: how allocation failures read (torch's allocator, C++, dlopen, OpenBLAS)
_MEMORY_MESSAGES = (
    "can't allocate memory",
    "bad_alloc",
    "Cannot allocate memory",
    "cannot allocate memory",
    "failed to map segment",
    "Memory allocation",
)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class LoadFailed(Exception):
    """The checkpoint does not load; the message names the file and what failed."""


@dataclass
class Tally:
    """What was loaded, and what could not be checked (torch missing)."""

    memory_limit: int = 0
    files: int = 0
    bytes: int = 0
    unchecked: list[str] = field(default_factory=list)


def _first_line(exc: BaseException) -> str:
    """The line of an error that says what failed (torch's messages run to paragraphs)."""
    text = _ANSI.sub("", str(exc)).strip() or type(exc).__name__
    for marker in ("Unsupported global", "Unsupported operand", "WeightsUnpickler error"):
        at = text.find(marker)
        if at >= 0:
            return text[at:].splitlines()[0].split(". ", 1)[0].strip()[:500]
    return text.splitlines()[0].strip()[:500]


def _memory_error(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    text = str(exc)
    return any(m in text for m in _MEMORY_MESSAGES)


@contextlib.contextmanager
def loading(name: str, how: str, tally: Tally) -> Iterator[None]:
    """Turn whatever loading ``name`` raised into a :class:`LoadFailed` that names it."""
    try:
        yield
    except LoadFailed:
        raise
    except Exception as exc:  # any failure to load is the finding
        if _memory_error(exc):
            limit = f"{tally.memory_limit / 2**30:.1f} GiB" if tally.memory_limit else "none"
            raise LoadFailed(
                f"{name}: out of memory during {how} (address-space limit {limit}; raise "
                "--memory-limit if the host has the memory)"
            ) from None
        if how.startswith("torch.load") and type(exc).__name__ == "UnpicklingError":
            raise LoadFailed(
                f"{name}: {how} refused it (it holds objects other than tensors and "
                f"containers): {_first_line(exc)}"
            ) from None
        raise LoadFailed(
            f"{name}: {how} failed: {type(exc).__name__}: {_first_line(exc)}"
        ) from None


def _check_size(path: Path, name: str) -> int:
    """The file's size, after checking it against the size its own format gives."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        raise LoadFailed(f"{name}: missing") from None
    want = expected_size(path, st)
    if want is not None and want != st.st_size:
        raise LoadFailed(
            f"{name}: {st.st_size} bytes, but its format says {want}: "
            + ("truncated" if st.st_size < want else "oversized")
        )
    return st.st_size


def _read_all(path: Path, name: str) -> None:
    """Read every byte (an I/O error or a file cut short by a failing disk shows here)."""
    try:
        fd = os.open(path, os.O_RDONLY | FILE_FLAGS | O_CLOEXEC)
        try:
            while os.read(fd, _CHUNK):
                pass
        finally:
            os.close(fd)
    except OSError as exc:
        raise LoadFailed(f"{name}: cannot read: {exc.strerror or exc}") from None


def torch_or_none() -> object | None:
    """torch, or None where it is not installed; a torch that fails to import is a failure."""
    try:
        import torch
    except ModuleNotFoundError as exc:
        if exc.name == "torch":
            return None
        raise LoadFailed(f"importing torch failed: {_first_line(exc)}") from None
    except Exception as exc:  # e.g. a library that cannot be mapped
        hint = " (out of memory: raise --memory-limit)" if _memory_error(exc) else ""
        raise LoadFailed(f"importing torch failed: {_first_line(exc)}{hint}") from None
    return torch


def load_torch_file(path: Path, name: str, tally: Tally) -> None:
    size = _check_size(path, name)
    if torch_or_none() is None:
        tally.unchecked.append(name)
        return
    import torch as t

    how = "torch.load(weights_only=True)"
    with loading(name, how, tally), _numpy_allowed(path.name):
        obj = t.load(path, map_location="cpu", weights_only=True)
        del obj
    gc.collect()
    tally.files += 1
    tally.bytes += size


def _numpy_allowed(filename: str) -> contextlib.AbstractContextManager[object]:
    """The numpy types the Hugging Face Trainer allows when it loads its RNG state.

    ``rng_state*.pth`` holds numpy's generator state; the Trainer loads it with
    ``weights_only=True`` and these allowed, so the drill does too.
    """
    if not filename.startswith("rng_state"):
        return contextlib.nullcontext()
    try:
        import numpy as np
        import torch
    except ImportError:
        return contextlib.nullcontext()
    core = getattr(np, "_core", None) or np.core
    allowed = [core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    return torch.serialization.safe_globals(allowed)


def load_safetensors(path: Path, name: str, tally: Tally) -> None:
    size = _check_size(path, name)
    with open(path, "rb") as f:
        if len(f.read(8)) < 8:
            raise LoadFailed(f"{name}: shorter than a safetensors header")
    if importlib.util.find_spec("safetensors") is not None and torch_or_none() is not None:
        from safetensors import safe_open

        with loading(name, "safetensors load", tally), safe_open(path, framework="pt") as st:
            for key in st.keys():  # noqa: SIM118 - safe_open is not a mapping
                tensor = st.get_tensor(key)
                del tensor
    else:
        if expected_size(path, os.stat(path)) is None:
            raise LoadFailed(f"{name}: not a safetensors file (its header does not parse)")
        _read_all(path, name)
    tally.files += 1
    tally.bytes += size


def load_json(path: Path, name: str, tally: Tally) -> object:
    size = _check_size(path, name)
    if size > MAX_JSON:
        _read_all(path, name)
        return None
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise LoadFailed(f"{name}: not valid JSON: {_first_line(exc)}") from None
    tally.files += 1
    tally.bytes += size
    return doc


def load_file(path: Path, name: str, tally: Tally) -> None:
    lower = path.name.lower()
    if lower.endswith(".safetensors"):
        load_safetensors(path, name, tally)
    elif lower.endswith(".json"):
        load_json(path, name, tally)
    elif lower.endswith(READ_ONLY_SUFFIXES):
        size = _check_size(path, name)
        _read_all(path, name)
        tally.files += 1
        tally.bytes += size
    else:
        load_torch_file(path, name, tally)

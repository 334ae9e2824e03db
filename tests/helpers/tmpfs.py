"""A real tmpfs for a test: a volume of a chosen size that fills up for real (ENOSPC)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A real tmpfs mounted at ``path`` for the block (skips the test where mounting is not
    permitted)."""
    error = try_mount(path, size)
    if error is not None:
        pytest.skip(f"cannot mount a tmpfs here (needs root with CAP_SYS_ADMIN): {error}")
    try:
        yield path
    finally:
        unmount(path)


@contextlib.contextmanager
def many_files_dir(path: Path) -> Iterator[Path]:
    """A directory at ``path`` for a test that creates a hundred thousand files: a tmpfs where
    mounting is permitted, else a plain directory; emptied at the end either way (pytest keeps
    recent temporary directories, not these).

    What such a test checks (one listing a scrape, no stat per unrelated name, bounded memory)
    holds on any filesystem; on a busy disk, creating the files (each a journalled inode) was
    most of its time.
    """
    mounted = try_mount(path, "64m") is None
    try:
        yield path
    finally:
        if mounted:
            unmount(path)
        else:
            shutil.rmtree(path, ignore_errors=True)


def try_mount(path: Path, size: str) -> str | None:
    """Mount a tmpfs at ``path`` (created if missing); None when mounted, else why not.

    For a test that still has something to check without its own volume.
    """
    path.mkdir(exist_ok=True)
    if shutil.which("mount") is None:
        return "mount(8) is not installed"
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    return None if r.returncode == 0 else r.stderr.strip() or f"mount exited {r.returncode}"


def unmount(path: Path) -> None:
    """Lazily unmount ``path`` if something is mounted there."""
    if os.path.ismount(path):
        subprocess.run(["umount", "-l", str(path)], check=True)

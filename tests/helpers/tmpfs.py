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
    if shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs mount(8)")
    path.mkdir(exist_ok=True)
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root with CAP_SYS_ADMIN): {r.stderr}")
    try:
        yield path
    finally:
        unmount(path)


def unmount(path: Path) -> None:
    if os.path.ismount(path):
        subprocess.run(["umount", "-l", str(path)], check=True)

"""The one reader of files anyone may write (``fileio.read_untrusted``), on its own: each
refusal names the file and says why, a missing file stays FileNotFoundError for the caller to
treat as absent, and the cap holds even for a file whose size fstat does not tell (procfs:
st_size 0), which is the same path as a file that grows while it is read."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from trainguard.shared.fileio import UntrustedFileError, read_untrusted


def test_a_regular_file_is_read_whole_with_its_stat(tmp_path: Path) -> None:
    data = os.urandom(3 * 1024 * 1024 + 5)  # several reads of the largest chunk
    path = tmp_path / "f"
    path.write_bytes(data)
    got, st = read_untrusted(path, len(data))
    assert got == data and st.st_size == len(data) and st.st_ino == path.stat().st_ino
    (tmp_path / "empty").touch()
    assert read_untrusted(tmp_path / "empty", 0)[0] == b""


def test_refusals_name_the_file_and_say_why(tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.write_bytes(b"x" * 2049)
    link = tmp_path / "link"
    link.symlink_to(big)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    cases = {
        big: (f"{big}: 2049 bytes, larger than the 2 KiB limit; refused", True),
        link: (f"{link}: is a symbolic link; refused", False),
        fifo: (f"{fifo}: not a regular file; refused", False),  # opened without blocking
        tmp_path: (f"{tmp_path}: not a regular file; refused", False),
    }
    for path, (message, too_large) in cases.items():
        with pytest.raises(UntrustedFileError) as caught:
            read_untrusted(path, 2048)
        assert (str(caught.value), caught.value.too_large) == (message, too_large)
    with pytest.raises(FileNotFoundError):
        read_untrusted(tmp_path / "missing", 2048)


def test_relative_to_an_open_directory_the_name_is_opened_there(tmp_path: Path) -> None:
    """A directory swapped for a link after it was opened cannot redirect the read."""
    real, other = tmp_path / "real", tmp_path / "other"
    real.mkdir()
    other.mkdir()
    (real / "rec").write_bytes(b"real")
    (other / "rec").write_bytes(b"other")
    dfd = os.open(real, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.rename(real, tmp_path / "moved")
        (tmp_path / "real").symlink_to(other)
        assert read_untrusted(tmp_path / "real" / "rec", 100, dir_fd=dfd)[0] == b"real"
    finally:
        os.close(dfd)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="procfs")
def test_the_cap_holds_where_fstat_does_not_tell_the_size() -> None:
    """/proc files are regular with st_size 0: what is read beyond the size fstat gave is
    capped the same way as a file that grew while it was read."""
    whole, st = read_untrusted("/proc/self/status", 1024 * 1024)
    assert st.st_size == 0 and b"Pid:" in whole and len(whole) > 200
    with pytest.raises(UntrustedFileError) as caught:
        read_untrusted("/proc/self/status", 100)
    assert str(caught.value) == "/proc/self/status: larger than the 100 bytes limit; refused"
    assert caught.value.too_large

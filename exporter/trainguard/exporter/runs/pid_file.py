"""Reading a configured run's pid file: the untrusted reader, and a symbolic link if its owner's.

The pid file is named by the operator, but it lives where the run (or anyone who can write that
directory) puts it, so it is read as every file others may write is
(:func:`trainguard.shared.fileio.read_untrusted`): a FIFO planted in its place cannot block a
scrape, a device or a huge file is not read. A pid file that is a symbolic link is followed only
to a file owned by the owner of the link (Apache's ``SymLinksIfOwnerMatch``): a service that
links its pid file elsewhere keeps working, and a link someone made to another user's file (a
private file) is refused, naming the file, before a byte of it is read.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from trainguard.shared.fileio import UntrustedFileError, read_untrusted

#: a pid is at most 10 digits; a line end and some blanks around it are tolerated
MAX_BYTES = 64


def read_pid_file(path: Path) -> tuple[bytes, float]:
    """The content (at most :data:`MAX_BYTES`) and modification time of a pid file.

    FileNotFoundError when there is none (a link to nothing counts as none: its daemon removed
    the file it pointed to); :class:`UntrustedFileError` when it is refused, its ``why`` saying
    why (for a link, naming the file it points to).
    """
    link = os.lstat(path)
    if not stat.S_ISLNK(link.st_mode):
        raw, st = read_untrusted(path, MAX_BYTES)
        return raw, st.st_mtime
    target = os.path.realpath(path)

    def foreign(st: os.stat_result) -> str | None:  # the file opened, not a name: no race
        if st.st_uid == link.st_uid:
            return None
        return f"owned by uid {st.st_uid}, not by the link's owner (uid {link.st_uid}); refused"

    try:
        raw, st = read_untrusted(target, MAX_BYTES, refuse=foreign)  # no link, regular, capped
    except UntrustedFileError as exc:
        raise UntrustedFileError(
            str(path), f"is a symbolic link to {target}: {exc.why}", too_large=exc.too_large
        ) from None
    return raw, st.st_mtime

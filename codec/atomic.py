"""Files that appear whole or not at all."""

from __future__ import annotations

import os
from pathlib import Path

from .fsutil import fsync_directory, link_new, temporary_name

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def write_file_atomically(target: Path, data: bytes, *, mode: int = 0o644, replace: bool = True) -> None:
    """Make ``target`` appear whole with ``data``: temp file, fsync, rename, fsync dir.

    With ``replace=False`` an existing ``target`` is never written over
    (FileExistsError), even one another process makes meanwhile: the temp
    file is hard-linked to its name instead of renamed (codec.fsutil.link_new).
    Errors are the ``OSError`` the system raised."""
    directory = target.parent
    temp_path = directory / temporary_name(target.name)
    try:
        fd = os.open(temp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC, 0o600)
    except OSError as error:
        raise _named_after(error, target) from None
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            if replace:
                os.replace(temp_path, target)
            else:
                link_new(temp_path, target)
        except OSError as error:
            raise _named_after(error, target) from None
    except BaseException:
        try:
            os.unlink(temp_path)
        except FileNotFoundError:
            pass
        raise
    fsync_directory(directory)


def _named_after(error: OSError, target: Path) -> OSError:
    """``error`` named after the target (a folder in its place, say), not the
    temporary file the user never made."""
    return type(error)(error.errno, error.strerror, str(target))

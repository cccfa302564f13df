"""Files that appear whole or not at all."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path


def write_file_atomically(target: Path, data: bytes, *, mode: int = 0o644, replace: bool = True) -> None:
    """Make ``target`` appear whole with ``data``: temp file, fsync, rename, fsync dir.

    With ``replace=False`` an existing ``target`` is never written over
    (FileExistsError), even one another process makes meanwhile: the temp
    file is hard-linked to its name instead of renamed."""
    directory = target.parent
    fd, temp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            if replace:
                os.replace(temp_name, target)
            else:
                _link_new(temp_name, target)
        except OSError as error:
            # Named after the target (a folder in its place, say), not the
            # temporary file the user never made.
            raise type(error)(error.errno, error.strerror, str(target)) from None
    except BaseException:
        try:
            os.unlink(temp_name)
        except FileNotFoundError:
            pass
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _link_new(temp_name: str, target: Path) -> None:
    try:
        os.link(temp_name, target)
    except FileExistsError:
        raise
    except OSError:
        # No hard links on this file system (FAT, say): the check and the
        # rename are two steps there.
        if os.path.lexists(target):
            raise FileExistsError(errno.EEXIST, "File exists", str(target)) from None
        os.rename(temp_name, target)
        return
    os.unlink(temp_name)

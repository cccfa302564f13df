"""Files that appear whole or not at all."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_file_atomically(target: Path, data: bytes, *, mode: int = 0o644) -> None:
    """Make ``target`` appear whole with ``data``: temp file, fsync, rename, fsync dir."""
    directory = target.parent
    fd, temp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.replace(temp_name, target)
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

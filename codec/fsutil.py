"""File-system rules every part of fieldsync shares: flushing a directory,
the names of temporary files, and giving a file a name it must not take
from another.

Rules of this file:
* One implementation of each rule; the agent, the spool, the transports and
  the codec call these instead of their own copies.  The module lives in
  ``codec`` because that is the lowest layer, which all of them import.
* Every failure propagates as the ``OSError`` the system raised (named
  after the path involved): the caller turns it into its own typed error.
  Nothing here logs, retries or swallows an error.
* A file system that has no fsync for a directory (Windows, some network
  shares) raises :class:`DirectoryFlushUnsupported`, an ``OSError`` too:
  whether a rename that cannot be flushed is good enough is the caller's
  decision, never this module's.
* No clock, no shared state.
* A temporary file that takes long to write (an extracted database) is
  claimed (:func:`claim_temporary`): held with an exclusive ``flock`` for
  as long as its writer lives, so that the next writer of the same name
  can tell one that a killed writer left (no one holds it) from one being
  written, and removes the first.  Any file a step makes and must take
  back if it is killed (a new site's key file) is claimed the same way
  (:func:`claim`, :func:`abandoned`).
"""

from __future__ import annotations

import errno
import os
import re
import secrets

try:
    import fcntl
except ImportError:  # Windows: nothing is claimed, nothing left behind is removed
    fcntl = None  # type: ignore[assignment]

__all__ = ["DirectoryFlushUnsupported", "TEMPORARY_SUFFIXES", "abandoned", "claim", "claim_temporary",
           "fsync_directory", "is_temporary", "link_new", "remove_database_file", "temporary_name", "temporary_target"]

_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
# What fsync answers on a directory of a file system that cannot flush one
# (CIFS and other network shares, some FUSE file systems): the operation is
# missing, not failed.  An I/O error (EIO) is never among them.
_FLUSH_UNSUPPORTED = frozenset({errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF, errno.EACCES})

# fieldsync's temporary files: ``.<name>.<16 hex>.tmp`` beside ``name``.
_TEMPORARY = re.compile(r"\.(?P<name>.+)\.[0-9a-f]{16}\.tmp\Z")
#: Partial files of other tools (copy programs, SFTP clients, editors).
TEMPORARY_SUFFIXES = (".tmp", ".part", ".partial", ".filepart", ".crdownload", "~")


class DirectoryFlushUnsupported(OSError):
    """The directory's file system (or the platform) cannot fsync a directory:
    a rename in it is as durable as the file system makes it."""


def fsync_directory(directory: str | os.PathLike[str]) -> None:
    """Flush ``directory`` itself, so that names made or removed in it
    survive a power cut.  Raises ``OSError`` (:class:`DirectoryFlushUnsupported`
    where the file system cannot do it)."""
    if os.name == "nt":
        # os.open cannot open a directory on Windows; NTFS journals renames itself.
        raise DirectoryFlushUnsupported(errno.ENOTSUP, "Windows cannot fsync a directory", os.fspath(directory))
    fd = os.open(directory, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as error:
        if error.errno in _FLUSH_UNSUPPORTED:
            raise DirectoryFlushUnsupported(error.errno, error.strerror, os.fspath(directory)) from None
        raise type(error)(error.errno, error.strerror, os.fspath(directory)) from None
    finally:
        os.close(fd)


def temporary_name(name: str) -> str:
    """A fresh name for the temporary file that becomes ``name`` in the same
    directory: a dot-name (hidden, skipped by every reader) that no other
    writer picks, and from which :func:`temporary_target` reads ``name``."""
    return f".{name}.{secrets.token_hex(8)}.tmp"


def claim_temporary(target: str | os.PathLike[str], mode: int = 0o600) -> tuple[str, list[str], int]:
    """A new, empty temporary file for ``target`` (:func:`temporary_name`,
    beside it), claimed: an open descriptor holding an exclusive ``flock``,
    which the system lets go when the process ends, however it ends.

    First the temporary files of ``target`` that no process holds are
    removed, with the journals SQLite keeps beside them (``-wal``, ``-shm``,
    ``-journal``): their writer was killed before it renamed or removed
    them.  One held by a live writer, or one whose lock cannot be tested
    (a file system without ``flock``), is left.  Returns the path, the
    names of the files removed, and the descriptor, which the caller
    closes once the file is renamed or removed; for a database, after
    SQLite closed it (closing any descriptor of a file lets go of the
    process's POSIX locks on it, SQLite's too)."""
    directory, name = os.path.split(os.fspath(target))
    removed = _remove_abandoned(directory or os.curdir, name)
    path = os.path.join(directory, temporary_name(name))
    return path, removed, claim(path, mode)


def claim(path: str | os.PathLike[str], mode: int = 0o600) -> int:
    """Create the empty file ``path`` (never over an existing one:
    ``FileExistsError``) and claim it: return an open descriptor holding an
    exclusive ``flock``, which the system lets go when the process ends,
    however it ends (:func:`abandoned` tells).  On a file system without
    ``flock`` the file is left unclaimed, and never judged abandoned."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC, mode)
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            pass  # no flock here: left unclaimed, and abandoned() says False of it too
    return fd


def abandoned(path: str | os.PathLike[str]) -> bool:
    """Whether the file ``path`` is a claim (:func:`claim`) that no process
    holds: its maker ended, killed, before it removed it.  False when it is
    held by a live process, gone, not a file this process may read, or its
    lock cannot be tested (a file system without ``flock``)."""
    if fcntl is None:
        return False
    try:
        fd = os.open(path, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


# What SQLite keeps beside a database file while it writes it.
_SQLITE_SIDECARS = ("-wal", "-shm", "-journal")


def remove_database_file(path: str | os.PathLike[str]) -> None:
    """Remove the SQLite database file ``path`` and the journals SQLite
    keeps beside it (``-wal``, ``-shm``, ``-journal``); those missing are
    no error."""
    for suffix in ("", *_SQLITE_SIDECARS):
        try:
            os.unlink(f"{os.fspath(path)}{suffix}")
        except FileNotFoundError:
            pass


def _remove_abandoned(directory: str, name: str) -> list[str]:
    """Remove the temporary files of ``name`` in ``directory`` that no
    process holds (:func:`claim_temporary`); return their names."""
    if fcntl is None:
        return []
    with os.scandir(directory) as entries:
        left = [entry.name for entry in entries if temporary_target(entry.name) == name]
    removed = []
    for temporary in left:
        path = os.path.join(directory, temporary)
        if abandoned(path):  # its name is new each time: no writer takes it meanwhile
            remove_database_file(path)
            removed.append(temporary)
    return removed


def temporary_target(name: str) -> str | None:
    """The name a temporary file made with :func:`temporary_name` stands for;
    None for any other name."""
    match = _TEMPORARY.match(name)
    return None if match is None else match["name"]


def is_temporary(name: str) -> bool:
    """A file no reader may take as finished: a dot-name (ours, or hidden) or
    another tool's partial file."""
    return name.startswith(".") or name.endswith(TEMPORARY_SUFFIXES)


def link_new(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    """Give the file ``source`` the name ``target``, never replacing a file
    there, even one another process makes meanwhile: ``FileExistsError``.

    A hard link makes the name in one step.  On a file system without hard
    links (FAT, say) the check and the rename are two steps: a file made
    between them is still replaced.  The caller fsyncs the directory."""
    taken = FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), os.fspath(target))
    try:
        os.link(source, target)
    except FileExistsError:
        raise taken from None
    except OSError:
        if os.path.lexists(target):  # a dangling link too
            raise taken from None
        os.rename(source, target)
        return
    os.unlink(source)

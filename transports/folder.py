"""The ``folder`` transport: message files in a directory per site inbox.

Rules of this file:
* The address is a directory that must already exist; a missing one is a
  folder that is not mounted or plugged in, never something to create.
* A file becomes visible whole or not at all: it is written under a dot-name
  ``.<name>.<16 hex>.tmp`` in the same directory (codec.fsutil's temporary
  names), fsynced, renamed with ``os.replace`` and the directory fsynced.
  A folder whose file system cannot fsync a directory (some network shares,
  Windows) is accepted: the rename is then as durable as it makes it.
* Only entries directly inside the inbox are read or removed, by the name the
  listing gave; symbolic links, directories, devices and FIFOs are ignored
  and opened with ``O_NOFOLLOW``, so nothing outside the inbox is touched.
* Every blocking call runs in a worker thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import stat
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from codec.fsutil import DirectoryFlushUnsupported, fsync_directory, is_temporary, temporary_name
from codec.message import MAX_FILE_SIZE

from ._remote import is_own_temp
from .base import Incoming, NameFilter, Transport, refuse
from .errors import BadAddress, BadTransportOptions, TransportError, TransportRefused, TransportUnavailable
from .options import ByteCount, FileMode, Seconds, check_size_limit

log = logging.getLogger(__name__)

DEFAULT_STALE_TEMP_AGE = 3600.0
# Nothing larger can be a message (codec.message.MAX_FILE_SIZE).
DEFAULT_MAX_FILE_SIZE = MAX_FILE_SIZE

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

_REFUSED_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})


@dataclass(frozen=True, slots=True)
class _FolderToken:
    """Which copy of a file a receive read; ack removes only that copy."""

    directory: str
    name: str
    device: int
    inode: int
    size: int
    mtime_ns: int

    @property
    def path(self) -> str:
        return os.path.join(self.directory, self.name)

    def matches(self, status: os.stat_result) -> bool:
        return (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns) == (
            self.device, self.inode, self.size, self.mtime_ns)


@dataclass(frozen=True, slots=True)
class _Refused:
    """A file the receive leaves unread (reported to the caller, see base.Refusal)."""

    reason: str
    identity: str


def _translate(error: OSError, doing: str, path: str) -> TransportError:
    """One-line transport error for an OSError raised while ``doing`` ``path``."""
    code = errno.errorcode.get(error.errno or 0, "unknown")
    text = f"{doing} {path}: {error.strerror or error} [{code}]"
    if error.errno in _REFUSED_ERRNOS:
        return TransportRefused(text + "; check the folder's permissions and that it is writable")
    if error.errno in (errno.ENOENT, errno.ENOTDIR):
        return TransportUnavailable(text + "; is the drive or share mounted?")
    return TransportUnavailable(text)


def _flush_folder(directory: str) -> None:
    try:
        fsync_directory(directory)
    except DirectoryFlushUnsupported as error:
        log.debug("folder %s does not support fsync (%s); rename durability is up to the file system",
                  directory, error.strerror)
    except OSError as error:
        raise _translate(error, "cannot flush folder", directory) from None


class FolderTransport(Transport):
    """Message files in directories, e.g. ``/mnt/share/fieldsync/hq``.

    Options:
        stale_temp_age: seconds after which a temp file left by a crashed
            sender is removed by ``receive`` (default one hour).
        min_age: seconds a file must be unmodified before ``receive`` yields
            it (default 0).  Set a few seconds when people copy files into the
            inbox by hand, so a copy in progress is not read.
        max_file_size: files larger than this are left in place and logged,
            never read into memory (default 16 MiB, the largest message).
        file_mode: permission bits for sent files; default: 0o666 less umask.
    """

    def __init__(self, *, stale_temp_age: Seconds = DEFAULT_STALE_TEMP_AGE, min_age: Seconds = 0.0,
                 max_file_size: ByteCount = DEFAULT_MAX_FILE_SIZE, file_mode: FileMode | None = None) -> None:
        super().__init__()
        for option, value, low in (("stale_temp_age", stale_temp_age, "> 0"), ("min_age", min_age, ">= 0")):
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not (value > 0 if low == "> 0" else value >= 0)):
                raise BadTransportOptions(f"{option} must be a number of seconds {low}, got {value!r}")
        check_size_limit("max_file_size", max_file_size)
        if file_mode is not None and (type(file_mode) is not int or not 0 <= file_mode <= 0o777):
            shown = f"0o{file_mode:o}" if type(file_mode) is int and file_mode >= 0 else repr(file_mode)
            raise BadTransportOptions(f"file_mode must be permission bits 0..0o777, got {shown}")
        self.stale_temp_age = float(stale_temp_age)
        self.min_age = float(min_age)
        self.max_file_size = max_file_size
        self.file_mode = file_mode

    def __repr__(self) -> str:
        return f"FolderTransport(closed={self.closed})"

    def check_address(self, address: str) -> str:
        """The address is a directory path; ``~`` is expanded, the result made absolute."""
        address = super().check_address(address)
        return os.path.abspath(os.path.expanduser(address))

    # -- send ----------------------------------------------------------------

    async def _send(self, address: str, name: str, data: bytes) -> None:
        await asyncio.to_thread(self._send_blocking, address, name, data)

    def _send_blocking(self, directory: str, name: str, data: bytes) -> None:
        self._require_directory(directory, "cannot send to folder")
        temp_path = os.path.join(directory, temporary_name(name))
        target_path = os.path.join(directory, name)
        try:
            fd = os.open(temp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC, 0o666)
        except OSError as error:
            raise _translate(error, "cannot create a file in folder", directory) from None
        try:
            try:
                if self.file_mode is not None:
                    os.fchmod(fd, self.file_mode)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temp_path, target_path)
        except BaseException as error:
            try:
                os.unlink(temp_path)
            except OSError:
                pass
            if isinstance(error, OSError):
                raise _translate(error, f"cannot write {name} to folder", directory) from None
            raise
        _flush_folder(directory)

    @staticmethod
    def _require_directory(directory: str, doing: str) -> None:
        try:
            status = os.stat(directory)
        except OSError as error:
            if error.errno == errno.ENOENT:
                raise TransportUnavailable(
                    f"{doing} {directory}: it does not exist; is the drive or share mounted? "
                    "(fieldsync never creates it: create it or fix the address)") from None
            if error.errno == errno.ENOTDIR:
                raise BadAddress(f"{doing} {directory}: part of the path is a file, not a folder") from None
            raise _translate(error, doing, directory) from None
        if not stat.S_ISDIR(status.st_mode):
            raise BadAddress(f"{doing} {directory}: it is a file, not a folder; fix the address")

    # -- receive -------------------------------------------------------------

    async def _receive(self, address: str, wanted: NameFilter) -> AsyncIterator[Incoming]:
        names = await asyncio.to_thread(self._scan_blocking, address)
        for name in names:
            self._check_open()
            if not wanted(name):
                continue
            incoming = await asyncio.to_thread(self._read_blocking, address, name)
            if isinstance(incoming, _Refused):
                refuse(wanted, name, incoming.reason, incoming.identity)
            elif incoming is not None:
                yield incoming

    def _scan_blocking(self, directory: str) -> list[str]:
        """Sorted names of the regular files to read; removes stale temp files."""
        self._require_directory(directory, "cannot read inbox folder")
        names: list[str] = []
        now = time.time()
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    if entry.is_symlink() or not entry.is_file(follow_symlinks=False):
                        continue
                    if is_temporary(entry.name):
                        self._remove_if_stale_temp(directory, entry, now)
                        continue
                    names.append(entry.name)
        except OSError as error:
            raise _translate(error, "cannot list inbox folder", directory) from None
        names.sort()
        return names

    def _remove_if_stale_temp(self, directory: str, entry: os.DirEntry[str], now: float) -> None:
        if not is_own_temp(entry.name):
            return
        try:
            age = now - entry.stat(follow_symlinks=False).st_mtime
            if age < self.stale_temp_age:
                return
            os.unlink(entry.path)
        except FileNotFoundError:
            return
        except OSError as error:
            log.warning("could not remove stale temp file %s in %s: %s", entry.name, directory, error.strerror)
            return
        log.info("removed %s in %s: a send that was interrupted %.0f s ago left it", entry.name, directory, age)

    def _read_blocking(self, directory: str, name: str) -> Incoming | _Refused | None:
        path = os.path.join(directory, name)
        try:
            fd = os.open(path, os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC)
        except FileNotFoundError:
            return None  # taken by another reader, or acked, since the listing
        except OSError as error:
            if error.errno == errno.ELOOP:
                return None  # became a symbolic link since the listing
            if error.errno in (errno.EACCES, errno.EPERM):
                log.warning("cannot read %s in inbox %s: %s; fix its permissions", name, directory, error.strerror)
                return None
            raise _translate(error, f"cannot read {name} in inbox folder", directory) from None
        try:
            before = os.fstat(fd)
            if not stat.S_ISREG(before.st_mode):
                return None
            # Which file this is: a later file of the name is reported again.
            identity = f"inode {before.st_dev}:{before.st_ino}, {before.st_size} bytes, mtime_ns {before.st_mtime_ns}"
            if before.st_nlink != 1:
                # A hard link made by whoever can write the inbox would have
                # the agent read (and set aside) a file from elsewhere.
                return _Refused(f"it has {before.st_nlink} links (a hard link to a file elsewhere?)", identity)
            if before.st_size > self.max_file_size:
                return _Refused(f"it is {before.st_size} bytes, over the {self.max_file_size} byte limit (max_file_size)",
                                identity)
            if self.min_age and time.time() - before.st_mtime < self.min_age:
                return None  # maybe still being copied in; next receive reads it
            chunks = []
            remaining = before.st_size + 1  # one more byte tells us the file grew
            while remaining > 0:
                chunk = os.read(fd, min(remaining, 1 << 20))
                if not chunk:
                    break
                chunks.append(chunk)
                remaining -= len(chunk)
            data = b"".join(chunks)
            after = os.fstat(fd)
        except OSError as error:
            raise _translate(error, f"cannot read {name} in inbox folder", directory) from None
        finally:
            os.close(fd)
        if len(data) != before.st_size or (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
            log.info("%s in inbox %s changed while it was read; it will be read on the next receive", name, directory)
            return None
        token = _FolderToken(directory, name, before.st_dev, before.st_ino, before.st_size, before.st_mtime_ns)
        return Incoming(name, data, token)

    # -- ack -----------------------------------------------------------------

    async def _ack(self, incoming: Incoming) -> None:
        token = incoming.token
        if not isinstance(token, _FolderToken):
            raise TypeError(f"{incoming!r} was not received by a folder transport")
        await asyncio.to_thread(self._ack_blocking, token)

    @staticmethod
    def _ack_blocking(token: _FolderToken) -> None:
        path = token.path
        try:
            if not token.matches(os.stat(path, follow_symlinks=False)):
                # Replaced by a new delivery since it was read: that copy has not
                # been stored yet, so it stays for the next receive.
                log.debug("%s was replaced since it was received; keeping the new copy", path)
                return
            os.unlink(path)
        except FileNotFoundError:
            return
        except OSError as error:
            raise _translate(error, f"cannot remove {token.name} from inbox folder", token.directory) from None
        # No fsync of the folder: a removal lost in a crash brings back a
        # file the agent has already stored or set aside, which it then reads
        # as a duplicate; an fsync per file would let a flood of junk cost
        # about 11 ms a file.

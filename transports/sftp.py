"""The ``sftp`` transport: message files in a directory on an SSH server.

Rules of this file:
* paramiko blocks, so every call into it runs in a worker thread
  (``asyncio.to_thread``); the event loop only waits and sleeps.
* One SSH connection per server per transport instance, made on first use
  and reused; it carries up to ``channels`` SFTP sessions, each used by one
  thread at a time.  A connection that fails is dropped whole and made
  again, with backoff, up to ``retries`` times within one call.
* The server's host key is checked before any credential is sent, and
  the login made, by ``_ssh`` (its rules); the address is ``_sftp_address``'s.
* A file becomes visible whole or not at all: it is written under
  ``codec.fsutil.temporary_name`` in the inbox, flushed with
  ``fsync@openssh.com`` where the server has it, and renamed with
  ``posix-rename@openssh.com``.
* Names from the server are data: only plain files directly in the inbox,
  by the name the listing gave, are read or removed.  A file with more than
  one hard link (the link count of the listing's ``ls -l`` line, which
  OpenSSH sends) or over ``max_file_size`` is left unread and reported to
  the caller, as the folder transport does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import logging
import stat
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TypeVar

import paramiko
from paramiko.sftp import CMD_EXTENDED

from codec.fsutil import temporary_name
from codec.message import MAX_FILE_SIZE

from ._remote import Backoff, SecretSource, check_timeouts, is_own_temp, is_temporary, one_line
from ._sftp_address import SftpAddress
from ._ssh import CONNECTION_ERRORS, DEFAULT_KNOWN_HOSTS, Connection, SshLogin, describe_error
from .base import Incoming, NameFilter, Transport, refuse
from .errors import BadTransportOptions, TransportError, TransportRefused, TransportUnavailable
from .options import ByteCount, FileMode, Seconds, check_size_limit

__all__ = ["SftpAddress", "SftpTransport", "quiet_read_ahead_threads"]

log = logging.getLogger(__name__)

DEFAULT_MAX_FILE_SIZE = MAX_FILE_SIZE  # nothing larger can be a message
DEFAULT_STALE_TEMP_AGE = 3600.0

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class _Refused:
    """A file the receive leaves unread (reported to the caller, see base.Refusal)."""

    reason: str
    identity: str


def link_count(entry: paramiko.SFTPAttributes) -> int | None:
    """The hard-link count in the ``ls -l`` line a listing gives (SFTP v3's
    attributes have none), or None when the server's line is not in that form."""
    fields = (getattr(entry, "longname", None) or "").split()
    if len(fields) >= 2 and fields[1].isdigit() and fields[0][:1] in "-dlcbps":
        return int(fields[1])
    return None


class _ConnectionLost(Exception):
    """Internal: the connection broke during an operation; ``_run`` reconnects and retries."""


@dataclass(frozen=True, slots=True)
class _SftpToken:
    """Which copy of a file a receive read: ack removes it only if it is still that copy."""

    address: SftpAddress
    name: str
    size: int
    mtime: int


class SftpTransport(Transport):
    """Message files in inbox directories on SSH servers (``sftp://user@host:port/path``).

    Options (all keyword-only; secrets come from files or environment
    variables, never from option values):
        key_file: private key for public-key authentication (OpenSSH or PEM).
        key_passphrase_file / key_passphrase_env: the key's passphrase, if it has one.
        password_file / password_env: password, tried when no key is given or the key is refused.
        known_hosts: OpenSSH known_hosts file checked for the server's host key
            (default ``~/.ssh/known_hosts``).
        accept_new_host_key: record the host key of a server not yet in
            known_hosts instead of refusing it (a changed key is always refused).
        connect_timeout: seconds to wait for the server to answer (default 15).
        timeout: seconds an SFTP request may take before the connection is
            treated as dead (default 60).
        retries / retry_delay: reconnect attempts within one call, and the
            first wait between them (doubling, at most 30 s); default 3 and 1 s.
        channels: SFTP sessions used at the same time on the one connection (default 4).
        max_file_size: larger files are left on the server with a warning (default 16 MiB, the largest message).
        stale_temp_age: a temp file left by an interrupted send is removed by
            ``receive`` once it is this many seconds old (default one hour).
        file_mode: permission bits for sent files (default: the server's umask).
    """

    def __init__(self, *, key_file: str | None = None, key_passphrase_file: str | None = None,
                 key_passphrase_env: str | None = None, password_file: str | None = None,
                 password_env: str | None = None, known_hosts: str = DEFAULT_KNOWN_HOSTS,
                 accept_new_host_key: bool = False, connect_timeout: Seconds = 15.0, timeout: Seconds = 60.0,
                 retries: int = 3, retry_delay: Seconds = 1.0, channels: int = 4,
                 max_file_size: ByteCount = DEFAULT_MAX_FILE_SIZE, stale_temp_age: Seconds = DEFAULT_STALE_TEMP_AGE,
                 file_mode: FileMode | None = None) -> None:
        super().__init__()
        login = SshLogin(key_file, SecretSource("key_passphrase", key_passphrase_file, key_passphrase_env),
                         SecretSource("password", password_file, password_env), known_hosts, accept_new_host_key,
                         connect_timeout)
        check_timeouts(connect_timeout=connect_timeout, timeout=timeout)
        if isinstance(stale_temp_age, bool) or not isinstance(stale_temp_age, (int, float)) or not stale_temp_age > 0:
            raise BadTransportOptions(f"stale_temp_age must be a number of seconds > 0, got {stale_temp_age!r}")
        if type(channels) is not int or not 1 <= channels <= 32:
            raise BadTransportOptions(f"channels must be 1..32, got {channels!r}")
        check_size_limit("max_file_size", max_file_size)
        if file_mode is not None and (type(file_mode) is not int or not 0 <= file_mode <= 0o777):
            shown = f"0o{file_mode:o}" if type(file_mode) is int and file_mode >= 0 else repr(file_mode)
            raise BadTransportOptions(f"file_mode must be permission bits 0..0o777, got {shown}")
        self.login = dataclasses.replace(login, connect_timeout=float(connect_timeout))
        self.connect_timeout = float(connect_timeout)
        self.timeout = float(timeout)
        self.backoff = Backoff(retries, retry_delay)
        self.channels = channels
        self.max_file_size = max_file_size
        self.stale_temp_age = float(stale_temp_age)
        self.file_mode = file_mode
        self._connections: dict[tuple[str, str, int], Connection] = {}
        self._connecting: dict[tuple[str, str, int], asyncio.Lock] = {}
        self._slots: dict[tuple[str, str, int], asyncio.Semaphore] = {}

    def __repr__(self) -> str:
        return f"SftpTransport(connections={len(self._connections)}, closed={self.closed})"

    def check_address(self, address: str) -> str:
        return str(SftpAddress.parse(super().check_address(address)))

    # -- send ----------------------------------------------------------------

    async def _send(self, address: str, name: str, data: bytes) -> None:
        target = SftpAddress.parse(address)
        # One temp name for every attempt of this send: a retry overwrites
        # what a dropped attempt left instead of leaving another temp file.
        temp = temporary_name(name)
        await self._run(target, f"cannot send {name} to", lambda connection, client: self._upload_blocking(
            connection, client, target, name, temp, data))

    def _upload_blocking(self, connection: Connection, client: paramiko.SFTPClient, target: SftpAddress,
                         name: str, temp: str, data: bytes) -> None:
        temp_path, final_path = target.file(temp), target.file(name)
        try:
            with client.open(temp_path, "wb") as remote:
                remote.set_pipelined(True)
                remote.write(data)
                if self.file_mode is not None:
                    remote.chmod(self.file_mode)
                remote.flush()
                self._fsync_blocking(connection, client, remote)
            client.posix_rename(temp_path, final_path)
        except CONNECTION_ERRORS:
            raise  # the retry rewrites the same temp file
        except OSError:
            if connection.alive:
                try:
                    client.remove(temp_path)
                except (OSError, *CONNECTION_ERRORS):
                    pass
            raise

    @staticmethod
    def _fsync_blocking(connection: Connection, client: paramiko.SFTPClient, remote: paramiko.SFTPFile) -> None:
        if not connection.fsync_supported:
            return
        try:
            # paramiko has no public call for OpenSSH's fsync extension.
            client._request(CMD_EXTENDED, "fsync@openssh.com", remote.handle)
        except OSError as error:
            if not connection.alive:
                raise
            connection.fsync_supported = False
            log.info("%s does not support fsync@openssh.com (%s); sent files are as durable as the server makes "
                     "them", connection.label, error)

    # -- receive -------------------------------------------------------------

    async def _receive(self, address: str, wanted: NameFilter) -> AsyncIterator[Incoming]:
        inbox = SftpAddress.parse(address)
        listed = await self._run(inbox, "cannot list inbox", lambda _connection, client: self._scan_blocking(
            client, inbox))
        for name, links in listed:
            self._check_open()
            if not wanted(name):
                continue
            incoming = await self._run(inbox, f"cannot read {name} in inbox",
                                       lambda _connection, client, name=name, links=links: self._read_blocking(
                                           client, inbox, name, links))
            if isinstance(incoming, _Refused):
                refuse(wanted, name, incoming.reason, incoming.identity)
            elif incoming is not None:
                yield incoming

    def _scan_blocking(self, client: paramiko.SFTPClient, inbox: SftpAddress) -> list[tuple[str, int | None]]:
        """The plain files to read, in name order, each with its link count (None: the server did not say)."""
        listed = []
        now = time.time()
        for entry in client.listdir_attr(inbox.path):
            if entry.st_mode is None or not stat.S_ISREG(entry.st_mode):
                continue  # links, directories, devices: never followed or read
            if is_temporary(entry.filename):
                self._remove_if_stale_temp(client, inbox, entry, now)
                continue
            listed.append((entry.filename, link_count(entry)))
        listed.sort()
        return listed

    def _remove_if_stale_temp(self, client: paramiko.SFTPClient, inbox: SftpAddress,
                              entry: paramiko.SFTPAttributes, now: float) -> None:
        if not is_own_temp(entry.filename) or entry.st_mtime is None:
            return
        # The server's clock stamps the file: a skewed clock only makes cleanup earlier or later.
        age = now - entry.st_mtime
        if age < self.stale_temp_age:
            return
        try:
            client.remove(inbox.file(entry.filename))
        except OSError as error:
            if error.errno != errno.ENOENT:
                log.warning("could not remove stale temp file %s in %s: %s", entry.filename, inbox, error)
            return
        log.info("removed %s in %s: a send that was interrupted %.0f s ago left it", entry.filename, inbox, age)

    def _read_blocking(self, client: paramiko.SFTPClient, inbox: SftpAddress, name: str,
                       links: int | None) -> Incoming | _Refused | None:
        path = inbox.file(name)
        try:
            before = client.lstat(path)
        except OSError as error:
            if error.errno == errno.ENOENT:
                return None  # acked or taken by another reader since the listing
            raise
        if before.st_mode is None or not stat.S_ISREG(before.st_mode):
            return None
        size = before.st_size or 0
        # SFTP v3 gives no inode: the size and modification time tell a later file of the name.
        identity = f"{size} bytes, mtime {before.st_mtime}"
        if links is not None and links != 1:
            # As in the folder transport: a hard link made by whoever can
            # write the inbox would have the agent read a file from elsewhere.
            return _Refused(f"it has {links} links (a hard link to a file elsewhere?)", identity)
        if size > self.max_file_size:
            return _Refused(f"it is {size} bytes, over the {self.max_file_size} byte limit (max_file_size)", identity)
        try:
            with client.open(path, "rb") as remote:
                quiet_read_ahead_threads()
                remote.prefetch(size)
                data = remote.read(size + 1)  # one more byte tells us the file grew
                after = remote.stat()
        except OSError as error:
            if error.errno == errno.ENOENT:
                return None
            if error.errno == errno.EACCES:
                log.warning("cannot read %s in inbox %s: permission denied; fix its permissions", name, inbox)
                return None
            raise
        if len(data) != size or (after.st_size, after.st_mtime) != (before.st_size, before.st_mtime):
            log.info("%s in inbox %s changed while it was read; it will be read on the next receive", name, inbox)
            return None
        return Incoming(name, data, _SftpToken(inbox, name, size, before.st_mtime or 0))

    # -- ack -----------------------------------------------------------------

    async def _ack(self, incoming: Incoming) -> None:
        token = incoming.token
        if not isinstance(token, _SftpToken):
            raise TypeError(f"{incoming!r} was not received by an sftp transport")
        await self._run(token.address, f"cannot remove {token.name} from inbox",
                        lambda _connection, client: self._ack_blocking(client, token))

    @staticmethod
    def _ack_blocking(client: paramiko.SFTPClient, token: _SftpToken) -> None:
        path = token.address.file(token.name)
        try:
            status = client.lstat(path)
            if (status.st_mode is None or not stat.S_ISREG(status.st_mode)
                    or (status.st_size, status.st_mtime) != (token.size, token.mtime)):
                # Replaced by a new delivery since it was read: that copy stays for the next receive.
                log.debug("%s was replaced since it was received; keeping the new copy", path)
                return
            client.remove(path)
        except OSError as error:
            if error.errno != errno.ENOENT:
                raise

    # -- connections, retries and errors ---------------------------------------

    async def _run(self, address: SftpAddress, doing: str,
                   operation: Callable[[Connection, paramiko.SFTPClient], T]) -> T:
        """Run ``operation`` on an SFTP channel in a worker thread, reconnecting with backoff.

        Only a failed or lost connection is retried; an answer from the
        server about the file itself (no such directory, permission denied,
        disk full) is raised at once.
        """
        delays = self.backoff.delays()
        while True:
            try:
                connection = await self._connection(address)
            except TransportUnavailable as error:
                failure = error
            else:
                slots = self._slots.setdefault(address.server, asyncio.Semaphore(self.channels))
                try:
                    async with slots:
                        return await asyncio.to_thread(self._on_channel_blocking, connection, address, doing,
                                                       operation)
                except _ConnectionLost as lost:
                    failure = TransportUnavailable(str(lost))
            delay = next(delays, None)
            if delay is None or self._closed:
                raise failure
            log.info("%s; trying again in %.1f s", failure, delay)
            await asyncio.sleep(delay)

    def _on_channel_blocking(self, connection: Connection, address: SftpAddress, doing: str,
                             operation: Callable[[Connection, paramiko.SFTPClient], T]) -> T:
        where = f"{address} ({connection.label})"
        try:
            client = connection.borrow(self.timeout)
        except (*CONNECTION_ERRORS, OSError) as error:
            self._drop(address, connection)
            raise _ConnectionLost(f"{doing} {where}: the SSH connection failed: {describe_error(error)}") from None
        try:
            result = operation(connection, client)
        except (*CONNECTION_ERRORS, OSError) as error:
            if isinstance(error, CONNECTION_ERRORS) or not connection.alive:
                connection.discard(client)
                self._drop(address, connection)
                raise _ConnectionLost(f"{doing} {where}: the connection was lost: {describe_error(error)}") from None
            connection.give_back(client)
            raise _translate_sftp_error(error, doing, address) from None
        except BaseException:
            connection.discard(client)
            raise
        connection.give_back(client)
        return result

    def _drop(self, address: SftpAddress, connection: Connection) -> None:
        if self._connections.get(address.server) is connection:
            del self._connections[address.server]
        connection.close()

    async def _connection(self, address: SftpAddress) -> Connection:
        connection = self._connections.get(address.server)
        if connection is not None and connection.alive:
            return connection
        lock = self._connecting.setdefault(address.server, asyncio.Lock())
        async with lock:
            connection = self._connections.get(address.server)
            if connection is not None and connection.alive:
                return connection
            if connection is not None:
                self._drop(address, connection)
            self._check_open()
            connection = await asyncio.to_thread(self.login.connect, address)
            if self._closed:
                connection.close()
                self._check_open()
            self._connections[address.server] = connection
            return connection

    # -- closing ---------------------------------------------------------------

    async def _aclose(self) -> None:
        connections = list(self._connections.values())
        self._connections.clear()
        for connection in connections:
            await asyncio.to_thread(connection.close)

    def _release(self) -> None:
        for connection in self._connections.values():
            connection.close()
        self._connections.clear()


def _translate_sftp_error(error: OSError, doing: str, address: SftpAddress) -> TransportError:
    """One-line transport error for an SFTP status the server answered for a file."""
    code = errno.errorcode.get(error.errno or 0)
    text = f"{doing} {address}: {error.strerror or one_line(error) or 'failure'}"
    if error.errno == errno.ENOENT:
        return TransportUnavailable(f"{text}: the directory {address.path} does not exist on the server; "
                                    "create it there or fix the address")
    if error.errno in (errno.EACCES, errno.EPERM):
        return TransportRefused(f"{text} [{code}]; check the permissions of {address.path} on the server")
    # SSH_FX_FAILURE covers a full disk or quota on most servers.
    return TransportUnavailable(f"{text}; the server may be out of space")


def quiet_read_ahead_threads() -> None:
    """Keep the traceback of paramiko's read-ahead thread off stderr when its
    connection is lost: the read that waits for its data fails too, as a
    ``TransportUnavailable`` line, and the connection is made again.  Chained
    in front of ``threading.excepthook`` (again if someone replaced it since);
    any other thread's exception goes on to the hook as before."""
    previous = threading.excepthook
    if getattr(previous, "_fieldsync_read_ahead", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        thread = args.thread
        if (thread is not None and thread.name.endswith(f"({_READ_AHEAD})")
                and isinstance(args.exc_value, (EOFError, OSError, paramiko.SSHException))):
            log.debug("SFTP read-ahead stopped with its connection: %s",
                      one_line(args.exc_value) or type(args.exc_value).__name__)
            return
        previous(args)

    hook._fieldsync_read_ahead = True  # type: ignore[attr-defined]
    threading.excepthook = hook


# The target of the thread paramiko's SFTPFile.prefetch starts; a thread
# started without a name is named "Thread-N (<target>)".
_READ_AHEAD = paramiko.SFTPFile._prefetch_thread.__name__

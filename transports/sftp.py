"""The ``sftp`` transport: message files in a directory on an SSH server.

Rules of this file:
* paramiko blocks, so every call into it runs in a worker thread
  (``asyncio.to_thread``); the event loop only waits and sleeps.
* One SSH connection per server per transport instance, made on first use
  and reused; it carries up to ``channels`` SFTP sessions, each used by one
  thread at a time.  A connection that fails is dropped whole and made
  again, with backoff, up to ``retries`` times within one call.
* The server's host key is checked against ``known_hosts`` before any
  credential is sent.  An unknown key is refused unless
  ``accept_new_host_key`` is set (then it is recorded); a changed key is
  always refused.
* A file becomes visible whole or not at all: it is written under
  ``.<name>.<16 hex>.tmp`` in the inbox, flushed with ``fsync@openssh.com``
  where the server has it, and renamed with ``posix-rename@openssh.com``.
* Names from the server are data: only plain files directly in the inbox,
  by the name the listing gave, are read or removed.  A file with more than
  one hard link (the link count of the listing's ``ls -l`` line, which
  OpenSSH sends) or over ``max_file_size`` is left unread and reported to
  the caller, as the folder transport does.
"""

from __future__ import annotations

import asyncio
import base64
import errno
import hashlib
import logging
import os
import posixpath
import secrets
import socket
import stat
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TypeVar
from urllib.parse import quote, unquote, urlsplit

import paramiko
from paramiko.sftp import CMD_EXTENDED

from codec.message import MAX_FILE_SIZE

from .base import Incoming, NameFilter, Transport, refuse
from .errors import BadAddress, BadTransportOptions, TransportError, TransportRefused, TransportUnavailable
from ._remote import Backoff, SecretSource, check_timeouts, is_own_temp, is_temporary, one_line
from .options import ByteCount, FileMode, Seconds, check_size_limit, has_control_character

log = logging.getLogger(__name__)

DEFAULT_PORT = 22
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
DEFAULT_MAX_FILE_SIZE = MAX_FILE_SIZE  # nothing larger can be a message
DEFAULT_STALE_TEMP_AGE = 3600.0

T = TypeVar("T")

# Errors that mean the SSH connection (or its SFTP channel) is gone, as
# opposed to an SFTP status for one file.
_CONNECTION_ERRORS = (EOFError, paramiko.SSHException, socket.timeout, ConnectionError)


@dataclass(frozen=True, slots=True)
class SftpAddress:
    """``sftp://user@host[:port]/path``: the inbox directory ``path`` on ``host``.

    ``/~/dir`` is ``dir`` in the user's home directory on the server.
    """

    user: str
    host: str
    port: int
    path: str

    @classmethod
    def parse(cls, address: str) -> "SftpAddress":
        try:
            parts = urlsplit(address)
            port = parts.port
        except ValueError as error:
            raise BadAddress(f"sftp address {address!r} is not a URL: {error}") from None
        if parts.scheme.lower() != "sftp":
            raise BadAddress(f"sftp address must look like sftp://user@host:port/path, got {address!r}")
        if parts.password is not None:
            raise BadAddress(f"sftp address {_redact(address)} holds a password: never put one in an address; "
                             "use the password_file or password_env option")
        if not parts.username:
            raise BadAddress(f"sftp address {address!r} names no user; write it as sftp://user@host/path")
        if not parts.hostname:
            raise BadAddress(f"sftp address {address!r} names no host")
        if parts.query or parts.fragment:
            raise BadAddress(f"sftp address {address!r} has a '?' or '#' part, which means nothing here")
        path = unquote(parts.path)
        if path in ("", "/"):
            raise BadAddress(f"sftp address {address!r} names no inbox directory; add its path, "
                             "as in sftp://user@host/srv/fieldsync/hq")
        if path == "/~" or path.startswith("/~/"):
            path = posixpath.normpath(path[3:] or ".")
        else:
            path = posixpath.normpath(path)
        if has_control_character(path):
            raise BadAddress(f"sftp address {address!r} has a control character in its path")
        return cls(unquote(parts.username), parts.hostname, port or DEFAULT_PORT, path)

    @property
    def server(self) -> tuple[str, str, int]:
        return (self.user, self.host, self.port)

    @property
    def known_hosts_entry(self) -> str:
        """The host as OpenSSH writes it in known_hosts."""
        return self.host if self.port == DEFAULT_PORT else f"[{self.host}]:{self.port}"

    @property
    def display_host(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def file(self, name: str) -> str:
        return posixpath.join(self.path, name)

    def __str__(self) -> str:
        path = self.path if self.path.startswith("/") else "/~/" + self.path.removeprefix("./")
        if self.path == ".":
            path = "/~"
        return f"sftp://{quote(self.user, safe='')}@{self.display_host}{quote(path)}"


def _redact(address: str) -> str:
    parts = urlsplit(address)
    return address.replace(f":{parts.password}@", ":***@") if parts.password else address


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's SHA256 fingerprint of a public key."""
    digest = base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")
    return f"SHA256:{digest}"


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


@dataclass(eq=False)
class _Connection:
    """One SSH connection and its idle SFTP channels.  Used from worker threads."""

    ssh: paramiko.Transport
    label: str
    fsync_supported: bool = True
    _idle: list[paramiko.SFTPClient] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def alive(self) -> bool:
        return self.ssh.is_active()

    def borrow(self, timeout: float) -> paramiko.SFTPClient:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        client = paramiko.SFTPClient.from_transport(self.ssh)
        if client is None:
            raise paramiko.SSHException("the server refused to start an SFTP session")
        client.get_channel().settimeout(timeout)
        return client

    def give_back(self, client: paramiko.SFTPClient) -> None:
        with self._lock:
            self._idle.append(client)

    def discard(self, client: paramiko.SFTPClient) -> None:
        try:
            client.close()
        except Exception:  # closing a broken channel can fail in many ways; it is gone either way
            pass

    def close(self) -> None:
        self.ssh.close()


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
        if key_file is not None and (type(key_file) is not str or not key_file):
            raise BadTransportOptions(f"key_file must be a path, got {key_file!r}")
        if type(known_hosts) is not str or not known_hosts:
            raise BadTransportOptions(f"known_hosts must be a path, got {known_hosts!r}")
        if type(accept_new_host_key) is not bool:
            raise BadTransportOptions(f"accept_new_host_key must be True or False, got {accept_new_host_key!r}")
        check_timeouts(connect_timeout=connect_timeout, timeout=timeout)
        if isinstance(stale_temp_age, bool) or not isinstance(stale_temp_age, (int, float)) or not stale_temp_age > 0:
            raise BadTransportOptions(f"stale_temp_age must be a number of seconds > 0, got {stale_temp_age!r}")
        if type(channels) is not int or not 1 <= channels <= 32:
            raise BadTransportOptions(f"channels must be 1..32, got {channels!r}")
        check_size_limit("max_file_size", max_file_size)
        if file_mode is not None and (type(file_mode) is not int or not 0 <= file_mode <= 0o777):
            shown = f"0o{file_mode:o}" if type(file_mode) is int and file_mode >= 0 else repr(file_mode)
            raise BadTransportOptions(f"file_mode must be permission bits 0..0o777, got {shown}")
        self.key_file = key_file
        self.key_passphrase = SecretSource("key_passphrase", key_passphrase_file, key_passphrase_env)
        self.password = SecretSource("password", password_file, password_env)
        self.known_hosts = known_hosts
        self.accept_new_host_key = accept_new_host_key
        self.connect_timeout = float(connect_timeout)
        self.timeout = float(timeout)
        self.backoff = Backoff(retries, retry_delay)
        self.channels = channels
        self.max_file_size = max_file_size
        self.stale_temp_age = float(stale_temp_age)
        self.file_mode = file_mode
        self._connections: dict[tuple[str, str, int], _Connection] = {}
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
        temp = f".{name}.{secrets.token_hex(8)}.tmp"
        await self._run(target, f"cannot send {name} to", lambda connection, client: self._upload_blocking(
            connection, client, target, name, temp, data))

    def _upload_blocking(self, connection: _Connection, client: paramiko.SFTPClient, target: SftpAddress,
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
        except _CONNECTION_ERRORS:
            raise  # the retry rewrites the same temp file
        except OSError:
            if connection.alive:
                try:
                    client.remove(temp_path)
                except (OSError, *_CONNECTION_ERRORS):
                    pass
            raise

    @staticmethod
    def _fsync_blocking(connection: _Connection, client: paramiko.SFTPClient, remote: paramiko.SFTPFile) -> None:
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
                   operation: Callable[[_Connection, paramiko.SFTPClient], T]) -> T:
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

    def _on_channel_blocking(self, connection: _Connection, address: SftpAddress, doing: str,
                             operation: Callable[[_Connection, paramiko.SFTPClient], T]) -> T:
        where = f"{address} ({connection.label})"
        try:
            client = connection.borrow(self.timeout)
        except (*_CONNECTION_ERRORS, OSError) as error:
            self._drop(address, connection)
            raise _ConnectionLost(f"{doing} {where}: the SSH connection failed: {_describe(error)}") from None
        try:
            result = operation(connection, client)
        except (*_CONNECTION_ERRORS, OSError) as error:
            if isinstance(error, _CONNECTION_ERRORS) or not connection.alive:
                connection.discard(client)
                self._drop(address, connection)
                raise _ConnectionLost(f"{doing} {where}: the connection was lost: {_describe(error)}") from None
            connection.give_back(client)
            raise _translate_sftp_error(error, doing, address) from None
        except BaseException:
            connection.discard(client)
            raise
        connection.give_back(client)
        return result

    def _drop(self, address: SftpAddress, connection: _Connection) -> None:
        if self._connections.get(address.server) is connection:
            del self._connections[address.server]
        connection.close()

    async def _connection(self, address: SftpAddress) -> _Connection:
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
            connection = await asyncio.to_thread(self._connect_blocking, address)
            if self._closed:
                connection.close()
                self._check_open()
            self._connections[address.server] = connection
            return connection

    def _connect_blocking(self, address: SftpAddress) -> _Connection:
        where = address.display_host
        try:
            sock = socket.create_connection((address.host, address.port), timeout=self.connect_timeout)
        except socket.gaierror as error:
            raise TransportUnavailable(f"cannot find SSH server {address.host}: {error.strerror}; "
                                       "check the host name and the network") from None
        except TimeoutError:
            raise TransportUnavailable(f"SSH server {where} did not answer within {self.connect_timeout:.0f} s; "
                                       "is it up and reachable?") from None
        except OSError as error:
            raise TransportUnavailable(f"cannot connect to SSH server {where}: {error.strerror or error}; "
                                       "is it running?") from None
        # SFTP answers are small packets: without this, Nagle and delayed ACKs
        # add 40 ms to every write.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        ssh = paramiko.Transport(sock)
        try:
            known = self._load_known_hosts()
            recorded = known.lookup(address.known_hosts_entry)
            if recorded:
                # Ask for a key type known_hosts holds, so a server with several
                # host keys is checked against the one we know.
                options = ssh.get_security_options()
                wanted = set(recorded.keys())
                options.key_types = sorted(options.key_types, key=lambda kind: _base_key_type(kind) not in wanted)
            ssh.start_client(timeout=self.connect_timeout)
            self._verify_host_key(address, ssh.get_remote_server_key(), recorded)
            self._authenticate(address, ssh)
            ssh.set_keepalive(30)
        except TransportError:
            ssh.close()
            raise
        except paramiko.ssh_exception.IncompatiblePeer as error:
            ssh.close()
            raise TransportRefused(f"SSH server {where} shares no algorithm with this client: {one_line(error)}") from None
        except (*_CONNECTION_ERRORS, OSError) as error:
            ssh.close()
            raise TransportUnavailable(f"SSH connection to {where} failed: {_describe(error)}") from None
        return _Connection(ssh, f"{address.user}@{where}")

    def _load_known_hosts(self) -> paramiko.HostKeys:
        path = os.path.expanduser(self.known_hosts)
        keys = paramiko.HostKeys()
        try:
            keys.load(path)
        except FileNotFoundError:
            pass
        except OSError as error:
            raise TransportRefused(f"cannot read known_hosts {path}: {error.strerror}") from None
        return keys

    def _verify_host_key(self, address: SftpAddress, offered: paramiko.PKey, recorded) -> None:
        entry = address.known_hosts_entry
        path = os.path.expanduser(self.known_hosts)
        kind = offered.get_name()
        if not recorded:
            if not self.accept_new_host_key:
                raise TransportRefused(
                    f"unknown host key for {entry}: {kind} {fingerprint(offered)} is not in {path}; check the "
                    "fingerprint with the server's administrator, then add it to known_hosts or connect once "
                    "with accept_new_host_key=True")
            self._record_host_key(path, entry, offered)
            return
        known = recorded.get(kind)
        if known is not None and known == offered:
            return
        if known is not None:
            was = f"known_hosts has {fingerprint(known)}"
        else:
            was = f"known_hosts has only {', '.join(sorted(recorded.keys()))} keys for it"
        raise TransportRefused(
            f"HOST KEY CHANGED for {entry}: the server offered {kind} {fingerprint(offered)} but {was} ({path}); "
            "someone may be intercepting the connection. If the server was re-keyed, remove the old key with "
            f"ssh-keygen -R '{entry}' -f {path}")

    @staticmethod
    def _record_host_key(path: str, entry: str, key: paramiko.PKey) -> None:
        directory = os.path.dirname(path) or "."
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                size = os.fstat(fd).st_size
                prefix = b""
                if size:
                    with open(path, "rb") as existing:
                        existing.seek(size - 1)
                        prefix = b"" if existing.read(1) == b"\n" else b"\n"
                os.write(fd, prefix + f"{entry} {key.get_name()} {key.get_base64()}\n".encode())
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as error:
            raise TransportRefused(f"cannot record the host key of {entry} in {path}: {error.strerror}") from None
        log.warning("recorded the new host key of %s (%s %s) in %s", entry, key.get_name(), fingerprint(key), path)

    def _authenticate(self, address: SftpAddress, ssh: paramiko.Transport) -> None:
        where = f"{address.user}@{address.display_host}"
        if self.key_file is None and not self.password.configured:
            raise TransportRefused(f"no credentials for {where}: set key_file, or password_file or password_env")
        tried = []
        refusal = ""
        if self.key_file is not None:
            key = self._load_key()
            tried.append(f"key {self.key_file} ({fingerprint(key)})")
            try:
                ssh.auth_publickey(address.user, key)
            except paramiko.BadAuthenticationType as error:
                refusal = f"the server accepts only {', '.join(error.allowed_types)}"
            except paramiko.AuthenticationException as error:
                refusal = one_line(error)
        if not ssh.is_authenticated() and self.password.configured:
            password = self.password.read()
            tried.append(self.password.describe())
            try:
                ssh.auth_password(address.user, password)
            except paramiko.BadAuthenticationType as error:
                refusal = f"the server does not take passwords (it accepts {', '.join(error.allowed_types)})"
            except paramiko.AuthenticationException as error:
                refusal = one_line(error)
        if not ssh.is_authenticated():
            raise TransportRefused(
                f"SSH server {address.display_host} refused login as {address.user} ({refusal or 'more steps wanted'}; "
                f"tried {' then '.join(tried)}); check the credentials and the server's authorized_keys")

    def _load_key(self) -> paramiko.PKey:
        path = os.path.expanduser(self.key_file)
        passphrase = self.key_passphrase.read()
        try:
            return paramiko.PKey.from_path(path, passphrase.encode() if passphrase is not None else None)
        except FileNotFoundError:
            raise TransportRefused(f"key_file {path} does not exist") from None
        except (paramiko.PasswordRequiredException, TypeError) as error:
            # cryptography raises TypeError for an encrypted key given no passphrase.
            if passphrase is not None or isinstance(error, TypeError) and "password" not in str(error).lower():
                raise TransportRefused(f"key_file {path} cannot be used: {one_line(error)}") from None
            raise TransportRefused(f"key_file {path} is encrypted: give its passphrase with key_passphrase_file "
                                   "or key_passphrase_env") from None
        except (paramiko.SSHException, ValueError) as error:
            raise TransportRefused(f"key_file {path} cannot be used: {one_line(error)}") from None
        except OSError as error:
            raise TransportRefused(f"cannot read key_file {path}: {error.strerror}") from None

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


def _base_key_type(kind: str) -> str:
    return "ssh-rsa" if kind.startswith("rsa-sha2-") else kind


def _describe(error: BaseException) -> str:
    text = one_line(error) or type(error).__name__
    return text if text != type(error).__name__ else f"{text} (connection closed)"


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

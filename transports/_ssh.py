"""The SSH connection under the ``sftp`` transport: connecting, checking
the server's host key, logging in, and the SFTP channels one connection
carries.

Rules of this file:
* Blocking (paramiko): every call here runs in a worker thread.
* The server's host key is checked against ``known_hosts`` before any
  credential is sent.  An unknown key is refused unless
  ``accept_new_host_key`` is set (then it is recorded); a changed key is
  always refused.
* A login tries the key (``key_file``), then the password; the refusal
  says what was tried.  Secrets come from a file or an environment
  variable.
* A failure to reach the server is ``TransportUnavailable`` (retried by
  the caller); what an operator must fix is ``TransportRefused``.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import socket
import threading
from dataclasses import dataclass, field

import paramiko

from ._remote import SecretSource, one_line
from ._sftp_address import SftpAddress
from .errors import BadTransportOptions, TransportError, TransportRefused, TransportUnavailable

log = logging.getLogger("transports.sftp")  # the transport's logger: operators filter by transport

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"

# Errors that mean the SSH connection (or its SFTP channel) is gone, as
# opposed to an SFTP status for one file.
CONNECTION_ERRORS = (EOFError, paramiko.SSHException, socket.timeout, ConnectionError)


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's SHA256 fingerprint of a public key."""
    digest = base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")
    return f"SHA256:{digest}"


@dataclass(eq=False)
class Connection:
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



@dataclass(frozen=True, slots=True)
class SshLogin:
    """How to reach and log in to a server: the host keys to trust and the credentials."""

    key_file: str | None
    key_passphrase: SecretSource
    password: SecretSource
    known_hosts: str = DEFAULT_KNOWN_HOSTS
    accept_new_host_key: bool = False
    connect_timeout: float = 15.0

    def __post_init__(self) -> None:
        if self.key_file is not None and (type(self.key_file) is not str or not self.key_file):
            raise BadTransportOptions(f"key_file must be a path, got {self.key_file!r}")
        if type(self.known_hosts) is not str or not self.known_hosts:
            raise BadTransportOptions(f"known_hosts must be a path, got {self.known_hosts!r}")
        if type(self.accept_new_host_key) is not bool:
            raise BadTransportOptions(f"accept_new_host_key must be True or False, got {self.accept_new_host_key!r}")

    def connect(self, address: SftpAddress) -> Connection:
        """A new SSH connection to ``address``'s server, its host key checked and logged in.  Blocking."""
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
        except (*CONNECTION_ERRORS, OSError) as error:
            ssh.close()
            raise TransportUnavailable(f"SSH connection to {where} failed: {describe_error(error)}") from None
        return Connection(ssh, f"{address.user}@{where}")

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


def _base_key_type(kind: str) -> str:
    return "ssh-rsa" if kind.startswith("rsa-sha2-") else kind


def describe_error(error: BaseException) -> str:
    text = one_line(error) or type(error).__name__
    return text if text != type(error).__name__ else f"{text} (connection closed)"

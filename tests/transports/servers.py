"""Real servers for the transport integration tests, started on 127.0.0.1.

Rules of this file:
* Every server is the real program: OpenSSH's ``sshd``, Dovecot's IMAP
  server, and aiosmtpd speaking SMTP with STARTTLS or implicit TLS and AUTH.
  Nothing here imitates a protocol.
* Keys and certificates are made at start-up, in a fresh temporary
  directory, from the templates in ``fixtures/servers/``; nothing outside
  that directory is written, except ``/run/sshd``, the directory sshd needs
  for privilege separation (created empty if missing, as its service does).
* A server that does not come up raises ``ServerFailed`` with the tail of its
  log, so a test fails with the reason; nothing here skips.
* Stopping a server stops its child processes too (sshd forks one per
  connection), so "the server stopped" really drops every connection.
* ``benchmarks.transports`` uses the same classes.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import itertools
import logging
import os
import pwd
import shutil
import signal
import socket
import ssl
import string
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any
from pathlib import Path

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

REPO_ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = REPO_ROOT / "fixtures" / "servers"
SSHD = "/usr/sbin/sshd"
DOVECOT = "/usr/sbin/dovecot"
MAIL_DOMAIN = "example.test"
START_TIMEOUT = 20.0


class ServerFailed(RuntimeError):
    """A test server could not be started (the message carries its log tail)."""


# Ports for the test servers: below the kernel's ephemeral range (32768 and
# up on Linux), which hands out bind(0) ports and the source ports of
# outgoing connections, so a port found free is not given to a client
# before its server binds it; each pytest-xdist worker draws from a stripe
# of its own, so two workers never pick the same one.
PORTS_BELOW = 32768
PORT_STRIPE = 3000
_PORTS_FROM = PORTS_BELOW - 4 * PORT_STRIPE
_next_port: list[int] = []


def free_port() -> int:
    """A port of 127.0.0.1 nothing listens on, from this worker's stripe
    (see above), never the same twice in one process."""
    if not _next_port:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
        number = int(worker[2:]) if worker[2:].isdigit() else 0
        start = _PORTS_FROM + (number % 4) * PORT_STRIPE
        # A random place in the stripe: another test session on the machine
        # starts elsewhere, and the bind below skips what it holds.
        _next_port.extend((start, int.from_bytes(os.urandom(2), "big") % PORT_STRIPE))
    start, offset = _next_port
    for step in range(PORT_STRIPE):
        port = start + (offset + step) % PORT_STRIPE
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        _next_port[1] = offset + step + 1
        return port
    raise ServerFailed(f"no free port in 127.0.0.1:{start}..{start + PORT_STRIPE - 1}")


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as error:
        return f"(no log at {path}: {error.strerror})"


def _render(template: str, target: Path, **values: object) -> Path:
    text = string.Template((TEMPLATES / template).read_text()).substitute(
        {key: str(value) for key, value in values.items()})
    target.write_text(text)
    return target


def _wait_for_banner(port: int, process: subprocess.Popen, expect: bytes, log: Path, what: str) -> None:
    """Wait until ``port`` greets with ``expect``; raise ServerFailed with the log if not."""
    deadline = time.monotonic() + START_TIMEOUT
    last_error = "no attempt"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServerFailed(f"{what} exited with status {process.returncode} while starting:\n{_tail(log)}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as probe:
                if probe.recv(200).startswith(expect):
                    return
        except OSError as error:
            last_error = str(error)
        time.sleep(0.05)
    raise ServerFailed(f"{what} did not answer on 127.0.0.1:{port} within {START_TIMEOUT:.0f} s "
                       f"({last_error}):\n{_tail(log)}")


def _start_in_foreground(server: Any, command: list[str], output: Path,
                         package: str, port: int, banner: bytes, what: str) -> None:
    """Run ``command``, a server that stays in the foreground, as
    ``server._process`` with its output appended to ``output``, and wait
    until ``port`` greets with ``banner``.  On failure the server is stopped
    and ServerFailed names the package to install, or ends with the
    server's log and output."""
    with open(output, "ab") as sink:
        try:
            server._process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=sink, stderr=sink)
        except OSError as error:
            raise ServerFailed(f"cannot run {command[0]}: {error}; run scripts/setup to install {package}") from None
    try:
        _wait_for_banner(port, server._process, banner, server.log, what)
    except ServerFailed as error:
        more = "" if output == server.log else f"\n{_tail(output)}"
        server.stop()
        raise ServerFailed(f"{error}{more}") from None


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (sshd's per-connection children call setsid, so no group kill)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat_file:
                fields = stat_file.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    found: list[int] = []
    pending = [pid]
    while pending:
        for child in children.get(pending.pop(), []):
            found.append(child)
            pending.append(child)
    return found


def _stop_process_tree(process: subprocess.Popen | None) -> None:
    if process is None or process.poll() is not None:
        return
    victims = _descendants(process.pid)
    process.terminate()
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


# -- keys and certificates ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Certificates:
    """A CA and a server certificate for 127.0.0.1 and localhost, as PEM files."""

    ca_file: Path
    cert_file: Path
    key_file: Path
    #: A second CA that signed nothing the servers use: verifying with it fails.
    other_ca_file: Path
    #: A certificate for another host name, signed by the right CA.
    wrong_host_cert_file: Path
    wrong_host_key_file: Path


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o644)  # Dovecot's unprivileged processes read it in the tests only


def _make_ca(common_name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = _new_key()
    now = datetime.datetime.now(datetime.timezone.utc)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, certificate


def _issue(ca_key, ca_cert: x509.Certificate, names: list[x509.GeneralName], common_name: str):
    key = _new_key()
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return key, certificate


def make_certificates(directory: Path) -> Certificates:
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o755)
    pem = serialization.Encoding.PEM
    ca_key, ca_cert = _make_ca("fieldsync test CA")
    _other_key, other_cert = _make_ca("fieldsync test CA (not the servers')")
    server_key, server_cert = _issue(ca_key, ca_cert, [
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")], "127.0.0.1")
    wrong_key, wrong_cert = _issue(ca_key, ca_cert, [x509.DNSName("mail.elsewhere.test")], "mail.elsewhere.test")
    paths = Certificates(directory / "ca.crt", directory / "server.crt", directory / "server.key",
                         directory / "other-ca.crt", directory / "wrong-host.crt", directory / "wrong-host.key")
    paths.ca_file.write_bytes(ca_cert.public_bytes(pem))
    paths.other_ca_file.write_bytes(other_cert.public_bytes(pem))
    paths.cert_file.write_bytes(server_cert.public_bytes(pem))
    paths.wrong_host_cert_file.write_bytes(wrong_cert.public_bytes(pem))
    _write_key(server_key, paths.key_file)
    _write_key(wrong_key, paths.wrong_host_key_file)
    return paths


def make_ssh_key(path: Path) -> str:
    """Write a new Ed25519 private key in OpenSSH format; return its public key line."""
    key = ed25519.Ed25519PrivateKey.generate()
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                       serialization.NoEncryption()))
    path.chmod(0o600)
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return public.decode()


# -- sshd -------------------------------------------------------------------------


class SshServer:
    """OpenSSH's sshd with internal-sftp, as root on 127.0.0.1, non-daemon.

    ``known_hosts`` holds its host key; ``client_key`` is authorised to log
    in as ``user``.  ``new_inbox()`` makes a fresh directory to use as an
    inbox and returns its ``sftp://`` address and local path.
    """

    def __init__(self, base: Path | None = None, port: int | None = None) -> None:
        self.base = Path(base or tempfile.mkdtemp(prefix="fieldsync-sshd-"))
        self.port = port or free_port()
        self.user = pwd.getpwuid(os.getuid()).pw_name
        self.host_key = self.base / "ssh_host_ed25519_key"
        self.client_key = self.base / "client_ed25519_key"
        self.known_hosts = self.base / "known_hosts"
        self.root = self.base / "inboxes"
        self.log = self.base / "sshd.log"
        self._process: subprocess.Popen | None = None
        self._inboxes = itertools.count(1)
        self.root.mkdir(parents=True, exist_ok=True)
        self.host_public_key = make_ssh_key(self.host_key)
        (self.base / "authorized_keys").write_text(make_ssh_key(self.client_key) + "\n")
        self.known_hosts.write_text(f"{self.host_entry} {self.host_public_key}\n")
        _render("sshd_config.template", self.base / "sshd_config", port=self.port, base=self.base)

    @property
    def host_entry(self) -> str:
        return f"[127.0.0.1]:{self.port}"

    def address(self, path: Path | str) -> str:
        return f"sftp://{self.user}@127.0.0.1:{self.port}{path}"

    def new_inbox(self, label: str = "inbox") -> tuple[str, Path]:
        path = self.root / f"{label}-{next(self._inboxes)}"
        path.mkdir()
        return self.address(path), path

    def start(self) -> "SshServer":
        if self._process is not None and self._process.poll() is None:
            return self
        if not os.path.isdir("/run/sshd"):
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        _start_in_foreground(self, [SSHD, "-D", "-e", "-f", str(self.base / "sshd_config")], self.log,
                             "openssh-server", self.port, b"SSH-2.0-", "sshd")
        return self

    def stop(self) -> None:
        """Stop sshd and every session it forked: all connections drop."""
        _stop_process_tree(self._process)
        self._process = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.base, ignore_errors=True)


# -- Dovecot IMAP -----------------------------------------------------------------


class DovecotServer:
    """Dovecot serving Maildirs under a temporary directory, IMAP (STARTTLS) and IMAPS.

    Users are added while it runs with ``add_user``; every user has the
    password ``password`` unless told otherwise, and a Maildir that the
    SMTP server below delivers into.
    """

    MAIL_USER = "nobody"
    PASSWORD = "correct horse battery staple"

    def __init__(self, base: Path | None = None, certificates: Certificates | None = None) -> None:
        # Dovecot's unprivileged processes must reach these files: not under pytest's 0700 tmp.
        self.base = Path(base or tempfile.mkdtemp(prefix="fieldsync-imap-"))
        self.base.chmod(0o755)
        self.certificates = certificates or make_certificates(self.base / "tls")
        if self.certificates.cert_file.parent != self.base / "tls":
            shutil.copytree(self.certificates.cert_file.parent, self.base / "tls", dirs_exist_ok=True)
        self.imap_port = free_port()
        self.imaps_port = free_port()
        self.log = self.base / "dovecot.log"
        self.users_file = self.base / "users"  # a directory: one passwd-file per user
        self.mail_root = self.base / "mail"
        self._users: dict[str, str] = {}
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        owner = pwd.getpwnam(self.MAIL_USER)
        self.mail_uid, self.mail_gid = owner.pw_uid, owner.pw_gid
        for directory in ("run", "state"):
            (self.base / directory).mkdir(exist_ok=True)
        self.mail_root.mkdir(exist_ok=True)
        self.mail_root.chmod(0o755)
        self.users_file.mkdir()
        self.users_file.chmod(0o755)
        _render("dovecot.conf.template", self.base / "dovecot.conf", base=self.base,
                imap_port=self.imap_port, imaps_port=self.imaps_port)

    def start(self) -> "DovecotServer":
        if self._process is not None and self._process.poll() is None:
            return self
        _start_in_foreground(self, [DOVECOT, "-F", "-c", str(self.base / "dovecot.conf")],
                             self.base / "dovecot.stderr", "dovecot-imapd", self.imap_port, b"* OK", "dovecot")
        return self

    def stop(self) -> None:
        _stop_process_tree(self._process)
        self._process = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.base, ignore_errors=True)

    def url(self, user: str, mailbox: str = "INBOX", *, implicit_tls: bool = True) -> str:
        if implicit_tls:
            return f"imaps://{user}@127.0.0.1:{self.imaps_port}/{mailbox}"
        return f"imap://{user}@127.0.0.1:{self.imap_port}/{mailbox}"

    def add_user(self, user: str, password: str | None = None) -> None:
        """Create ``user`` (login name and local part of ``user@example.test``) with a Maildir."""
        home = self.mail_root / user
        with self._lock:
            if user in self._users:
                raise ValueError(f"user {user} exists")
            for sub in ("", "Maildir", "Maildir/new", "Maildir/cur", "Maildir/tmp"):
                (home / sub).mkdir(exist_ok=True)
                os.chown(home / sub, self.mail_uid, self.mail_gid)
            self._users[user] = password or self.PASSWORD
            line = f"{user}:{{PLAIN}}{self._users[user]}:{self.mail_uid}:{self.mail_gid}::{home}::\n"
            entry = self.users_file / user
            entry.write_text(line)
            entry.chmod(0o644)

    def has_user(self, user: str) -> bool:
        return user in self._users

    def maildir(self, user: str) -> Path:
        return self.mail_root / user / "Maildir"

    _deliveries = itertools.count(1)

    def deliver(self, user: str, message: bytes, *, flags: str = "") -> Path:
        """Put ``message`` in ``user``'s Maildir as a delivery agent does: tmp/, then new/ (or cur/ with flags)."""
        maildir = self.maildir(user)
        now = time.time_ns()
        unique = f"{now // 10**9}.M{(now // 1000) % 10**6}P{os.getpid()}Q{next(self._deliveries)}.fieldsync-test"
        temp = maildir / "tmp" / unique
        with open(temp, "wb") as file:
            file.write(message)
            file.flush()
            os.fsync(file.fileno())
        os.chown(temp, self.mail_uid, self.mail_gid)
        if flags:
            target = maildir / "cur" / f"{unique}:2,{flags}"
        else:
            target = maildir / "new" / unique
        os.rename(temp, target)
        return target

    def files(self, user: str) -> dict[str, bytes]:
        """Every message file in the user's Maildir (new/ and cur/), by base name without flags."""
        found = {}
        for sub in ("new", "cur"):
            for path in (self.maildir(user) / sub).iterdir():
                found[path.name.split(":2,")[0]] = path.read_bytes()
        return found


# -- SMTP (aiosmtpd) --------------------------------------------------------------


class _MaildirDelivery:
    """aiosmtpd handler: accept mail for the Dovecot users and deliver it into their Maildirs."""

    def __init__(self, dovecot: DovecotServer) -> None:
        self.dovecot = dovecot
        self.refuse_with: str | None = None
        self.accepted: list[tuple[str, bytes]] = []

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):  # noqa: N802 (aiosmtpd's name)
        if self.refuse_with is not None:
            return self.refuse_with
        local, _, domain = address.rpartition("@")
        if domain.lower() != MAIL_DOMAIN or not self.dovecot.has_user(local):
            return f"550 5.1.1 <{address}>: no such mailbox here"
        envelope.rcpt_tos.append(address)
        return "250 2.1.5 OK"

    async def handle_DATA(self, server, session, envelope):  # noqa: N802
        content = envelope.original_content or envelope.content
        for recipient in envelope.rcpt_tos:
            local = recipient.rpartition("@")[0]
            self.dovecot.deliver(local, b"Return-Path: <%s>\r\n" % envelope.mail_from.encode() + content)
            self.accepted.append((recipient, content))
        return "250 2.0.0 OK delivered"


class SmtpServer:
    """aiosmtpd on 127.0.0.1 with AUTH, delivering into a DovecotServer's Maildirs.

    ``tls`` is ``"starttls"`` (STARTTLS required before AUTH and MAIL) or
    ``"tls"`` (implicit TLS).  Set ``refuse_with`` to an SMTP reply such as
    ``"452 4.2.2 Mailbox full"`` to refuse every recipient.
    """

    def __init__(self, dovecot: DovecotServer, tls: str = "starttls", port: int | None = None,
                 certificates: Certificates | None = None) -> None:
        if tls not in ("starttls", "tls"):
            raise ValueError(tls)
        self.dovecot = dovecot
        self.tls = tls
        self.port = port or free_port()
        self.certificates = certificates or dovecot.certificates
        self.handler = _MaildirDelivery(dovecot)
        self.logins: list[str] = []
        self._controller: Controller | None = None

    @property
    def refuse_with(self) -> str | None:
        return self.handler.refuse_with

    @refuse_with.setter
    def refuse_with(self, reply: str | None) -> None:
        self.handler.refuse_with = reply

    def _authenticate(self, server, session, envelope, mechanism, auth_data) -> AuthResult:
        if isinstance(auth_data, LoginPassword):
            user = auth_data.login.decode()
            password = auth_data.password.decode()
            expected = self.dovecot._users.get(user.split("@")[0])
            if expected is not None and password == expected:
                self.logins.append(user)
                return AuthResult(success=True)
        return AuthResult(success=False, handled=False)

    def start(self) -> "SmtpServer":
        if self._controller is not None:
            return self
        # aiosmtpd warns about its own use of a deprecated attribute on every login.
        logging.getLogger("mail.log").setLevel(logging.ERROR)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.certificates.cert_file, self.certificates.key_file)
        options = dict(hostname="127.0.0.1", port=self.port, authenticator=self._authenticate,
                       server_hostname="127.0.0.1", data_size_limit=64 * 1024 * 1024, ident="fieldsync test SMTP")
        if self.tls == "tls":
            # aiosmtpd counts only STARTTLS as TLS for AUTH, and warns when AUTH is required
            # without it: over implicit TLS it offers AUTH but cannot require it (``logins`` shows it).
            controller = Controller(self.handler, ssl_context=context, auth_require_tls=False,
                                    auth_required=False, **options)
        else:
            controller = Controller(self.handler, tls_context=context, require_starttls=True,
                                    auth_require_tls=True, auth_required=True, **options)
        try:
            controller.start()
        except Exception as error:  # aiosmtpd raises whatever bind or its readiness probe raised
            raise ServerFailed(f"aiosmtpd could not start on 127.0.0.1:{self.port}: {error!r}") from error
        self._controller = controller
        return self

    def stop(self) -> None:
        if self._controller is not None:
            self._controller.stop()
            self._controller = None

    def close(self) -> None:
        self.stop()


# -- a TCP proxy that can cut connections -------------------------------------------


class TcpProxy:
    """Forwards 127.0.0.1:port to a server; can cut every connection, or one mid-transfer.

    ``cut_after(upload=n)`` makes the next connection that carries more than
    ``n`` bytes from the client drop both sides at that point (``download=n``
    counts bytes from the server), the way a lost network link looks to both
    ends.  ``connections`` counts the connections accepted.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._limits: dict[bool, int | None] = {True: None, False: None}
        self.connections = 0
        self.cuts = 0
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name="tcp-proxy", daemon=True)
        self._thread.start()

    def cut_after(self, *, upload: int | None = None, download: int | None = None) -> None:
        with self._lock:
            self._limits = {True: upload, False: download}

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._open) // 2

    def cut_all(self) -> None:
        with self._lock:
            connections = list(self._open)
        for connection in connections:
            self._shut(connection)

    @staticmethod
    def _shut(connection: socket.socket) -> None:
        try:
            connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self.connections += 1
                self._open.update((client, upstream))
            counts = {True: 0, False: 0}
            threading.Thread(target=self._pump, args=(client, upstream, counts, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, counts, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, counts: dict, from_client: bool) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                with self._lock:
                    limit = self._limits[from_client]
                    cut = limit is not None and counts[from_client] + len(data) > limit
                    if cut:
                        self._limits = {True: None, False: None}
                        self.cuts += 1
                if cut:
                    sink.sendall(data[:max(0, limit - counts[from_client])])
                    break
                counts[from_client] += len(data)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                for connection in (source, sink):
                    self._shut(connection)
                    if connection in self._open:
                        self._open.discard(connection)
                        connection.close()

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        self.cut_all()


# -- helpers for SMTP clients that misbehave on purpose ------------------------------


async def abandon_smtp_transaction(server: SmtpServer, sender: str, recipient: str, partial: bytes) -> None:
    """Open an SMTP session, send part of a message after DATA, then drop the connection.

    This is what a sender killed half-way through a send leaves: a
    transaction the server must discard.
    """
    import aiosmtplib

    context = ssl.create_default_context(cafile=str(server.certificates.ca_file))
    client = aiosmtplib.SMTP(hostname="127.0.0.1", port=server.port, use_tls=server.tls == "tls",
                             start_tls=server.tls == "starttls", tls_context=context,
                             username=f"{sender}", password=server.dovecot.PASSWORD)
    await client.connect()
    await client.mail(f"{sender}@{MAIL_DOMAIN}")
    await client.rcpt(recipient)
    code, _ = await client.execute_command(b"DATA")
    assert code == 354, code
    client.transport.write(partial)
    await asyncio.sleep(0.05)
    client.transport.abort()
    client.close()

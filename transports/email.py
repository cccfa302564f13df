"""The ``email`` transport: one email per message file, SMTP out, IMAP in.

Rules of this file:
* A message file travels as one email: the file is its only attachment,
  named like the file; the name is also in the subject and in the header
  ``X-Fieldsync-Message``, which is what marks fieldsync's mail.
* On the IMAP side only mail carrying ``X-Fieldsync-Message`` is ever read,
  flagged, moved or expunged.  Everything is read with ``BODY.PEEK`` (no
  ``\\Seen``); other mail in the mailbox is left exactly as it was.
* A message leaves the mailbox only in ``ack`` (expunged by UID, or moved to
  ``move_to``), i.e. after the agent stored it.  Copies of one name (a
  resend, a duplicate delivery) are yielded once, the newest; ``ack``
  removes every copy that receive saw.
* Mail that is ours but unusable (no attachment, a bad name, too large) is
  logged and left in place, or moved to ``quarantine_folder`` if set.  Mail
  too large is reported to the caller (base.Refusal) instead of logged.
* The server's ``RFC822.SIZE`` is a hint, not a bound: a body is fetched
  with ``BODY.PEEK[]<0.N>``, at most ``max_message_size`` + 1 bytes, and
  one that fills it is too large whatever size was announced.
* TLS is always verified (system CAs, or ``ca_file``); STARTTLS is required
  when asked for, never opportunistic.  Secrets come from a file or an
  environment variable.
* A login is tried once: SMTP with one mechanism (another only when the
  server says it does not take the first), and a password a server refused
  is not offered to it again while this transport lives (servers such as
  Dovecot answer each failure later than the last); a changed password is
  tried.
* Connection failures are retried with backoff (``retries``); what the
  server refuses on purpose is raised at once: ``TransportRefused`` for a
  permanent (5xx) answer, ``TransportUnavailable`` for a temporary one (4xx,
  such as a full mailbox).
"""

from __future__ import annotations

import asyncio
import email.policy
import hashlib
import logging
import os
import re
import secrets
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from email.message import EmailMessage
from email.parser import BytesHeaderParser, BytesParser
from email.utils import formatdate, make_msgid, parseaddr
from typing import TypeVar
from urllib.parse import quote, unquote, urlsplit

import aioimaplib  # noqa: F401  (used by ._imap; imported here so a missing package fails this module's import)
import aiosmtplib

from codec.message import MAX_FILE_SIZE

from .base import Incoming, NameFilter, Transport, refuse
from .errors import BadAddress, BadTransportOptions, TransportError, TransportRefused, TransportUnavailable
from ._imap import CommandFailed, ImapSession, SessionLost, TlsRefused
from ._remote import Backoff, SecretSource, check_timeouts, one_line
from .options import ByteCount, Seconds, check_size_limit, has_control_character

log = logging.getLogger(__name__)

HEADER = "X-Fieldsync-Message"
SMTP_TLS_MODES = ("starttls", "tls", "none")
DEFAULT_SMTP_PORTS = {"starttls": 587, "tls": 465, "none": 25}
DEFAULT_IMAP_PORTS = {"imaps": 993, "imap": 143}
# The largest message file (codec.message.MAX_FILE_SIZE) in base64, with room for the headers.
DEFAULT_MAX_MESSAGE_SIZE = MAX_FILE_SIZE * 4 // 3 + 1024 * 1024

# RFC 5322 allows 998-character lines: long file names stay whole, unfolded.
_POLICY = email.policy.SMTP.clone(max_line_length=998)
_SEARCH_OURS = ("HEADER", HEADER, '""')
IDLE_RENEWAL = 29 * 60.0  # seconds; RFC 2177 section 3

T = TypeVar("T")


# -- addresses ---------------------------------------------------------------------


def _check_email(text: str, what: str) -> str:
    """``local@domain`` or BadAddress; nothing that could smuggle a header or a command."""
    if type(text) is not str:
        raise BadAddress(f"{what} must be an email address, got {text!r}")
    if any(char in text for char in "\r\n\x00 <>,;\"()[]\\") or any(ord(char) < 32 for char in text):
        raise BadAddress(f"{what} {text!r} is not a plain email address like field1@example.com")
    name, parsed = parseaddr(text)
    local, _, domain = parsed.rpartition("@")
    if parsed != text or not local or not domain or "." not in domain.strip(".") and domain != "localhost":
        raise BadAddress(f"{what} {text!r} is not a plain email address like field1@example.com")
    return text


@dataclass(frozen=True, slots=True)
class Recipient:
    """Where ``send`` delivers: ``mailto:field1@example.com`` (or the bare address)."""

    email: str

    @classmethod
    def parse(cls, address: str) -> "Recipient":
        text = address.strip()
        if text.lower().startswith("mailto:"):
            text = unquote(text[len("mailto:"):])
            if "?" in text:
                raise BadAddress(f"email address {address!r} has a '?' part; give only the recipient, "
                                 "as in mailto:field1@example.com")
        return cls(_check_email(text, "recipient"))

    def __str__(self) -> str:
        return f"mailto:{self.email}"


@dataclass(frozen=True, slots=True)
class Mailbox:
    """Where ``receive`` reads: ``imaps://user@host[:port]/INBOX`` (implicit TLS) or
    ``imap://...`` (STARTTLS, required)."""

    tls: str
    user: str
    host: str
    port: int
    mailbox: str

    @classmethod
    def parse(cls, address: str) -> "Mailbox":
        try:
            parts = urlsplit(address.strip())
            port = parts.port
        except ValueError as error:
            raise BadAddress(f"IMAP address {address!r} is not a URL: {error}") from None
        scheme = parts.scheme.lower()
        if scheme not in DEFAULT_IMAP_PORTS:
            raise BadAddress(f"email inbox must be an IMAP URL like imaps://user@host/INBOX, got {address!r}")
        if parts.password is not None:
            raise BadAddress(f"IMAP address for {parts.hostname} holds a password: never put one in an address; "
                             "use the password_file or password_env option")
        if not parts.username:
            raise BadAddress(f"IMAP address {address!r} names no user; write it as imaps://user@host/INBOX "
                             "(an @ in the user name is written %40)")
        if not parts.hostname:
            raise BadAddress(f"IMAP address {address!r} names no host")
        if parts.query or parts.fragment:
            raise BadAddress(f"IMAP address {address!r} has a '?' or '#' part, which means nothing here")
        mailbox = unquote(parts.path.lstrip("/")) or "INBOX"
        if has_control_character(mailbox):
            raise BadAddress(f"IMAP address {address!r} has a control character in its mailbox name")
        tls = "tls" if scheme == "imaps" else "starttls"
        return cls(tls, unquote(parts.username), parts.hostname, port or DEFAULT_IMAP_PORTS[scheme], mailbox)

    @property
    def server(self) -> tuple[str, str, str, int]:
        return (self.tls, self.user, self.host, self.port)

    @property
    def display_host(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def __str__(self) -> str:
        scheme = "imaps" if self.tls == "tls" else "imap"
        return f"{scheme}://{quote(self.user, safe='')}@{self.display_host}/{quote(self.mailbox, safe='')}"


# -- the email format -----------------------------------------------------------------


def build_email(name: str, data: bytes, sender: str, recipient: str) -> bytes:
    """The email that carries file ``name``: a short note and the file as attachment."""
    message = EmailMessage(policy=_POLICY)
    message["From"] = sender
    message["To"] = recipient
    message["Subject"] = f"fieldsync {name}"
    message["Date"] = formatdate(usegmt=True)
    message["Message-ID"] = make_msgid("fieldsync", domain=sender.rpartition("@")[2])
    message[HEADER] = name
    # No vacation replies or bounces-to-bounces for machine mail (RFC 3834).
    message["Auto-Submitted"] = "auto-generated"
    message.set_content(f"fieldsync message file {name} ({len(data)} bytes) is attached.\n"
                        "It is read and removed by the fieldsync agent of the receiving site.\n")
    message.add_attachment(data, maintype="application", subtype="octet-stream", filename=name)
    return message.as_bytes()


class Malformed(Exception):
    """An email marked as fieldsync's that cannot be a message file (the reason)."""


def usable_name(name: str | None) -> bool:
    """A name that is safe to hand to the agent as a file name (message name or not)."""
    return (bool(name) and len(name.encode("utf-8", "surrogatepass")) <= 255 and not name.startswith(".")
            and not any(char in name for char in "/\\") and not any(ord(char) < 32 or ord(char) == 127
                                                                    for char in name))


def read_attachment(raw: bytes, name: str) -> bytes:
    """The file carried by ``raw``, an email announcing ``name``; Malformed if it is not one."""
    message = BytesParser(policy=email.policy.default).parsebytes(raw)
    announced = [str(value).strip() for value in message.get_all(HEADER, [])]
    if announced != [name]:
        raise Malformed(f"its {HEADER} headers changed to {announced!r}")
    if not message.is_multipart():
        raise Malformed("it has no attachment")
    files = [part for part in message.iter_attachments() if part.get_filename() is not None]
    if len(files) != 1:
        raise Malformed(f"it has {len(files)} attached files, not one")
    [part] = files
    if part.get_filename() != name:
        raise Malformed(f"its attachment is named {part.get_filename()!r}, not {name!r}")
    if part.get_content_maintype() in ("multipart", "message"):
        raise Malformed("its attachment is not a file")
    data = part.get_payload(decode=True)
    encoding = (part.get("Content-Transfer-Encoding") or "").strip().lower()
    if encoding == "base64" and any("base64" in type(defect).__name__.lower() or "padding" in str(defect).lower()
                                    for defect in part.defects):
        raise Malformed("its attachment is not valid base64")
    if not isinstance(data, bytes):
        raise Malformed("its attachment has no content")
    return data


def oversize(announced: int, fetched: int | None, limit: int) -> str | None:
    """Why an email is too large to read, or None.  ``announced`` is the
    server's RFC822.SIZE, ``fetched`` how many bytes a fetch of at most
    ``limit`` + 1 gave (None before the fetch): only what was fetched is
    believed, the announced size only spares the fetch of a large one."""
    if announced > limit:
        return f"it is {announced} bytes, over the max_message_size of {limit}"
    if fetched is not None and fetched > limit:
        return (f"it is over the max_message_size of {limit} (the server announced {announced} bytes; "
                f"reading stopped at {fetched})")
    return None


def announced_name(header_block: bytes) -> str | None:
    values = BytesHeaderParser(policy=email.policy.default).parsebytes(header_block).get_all(HEADER, [])
    return str(values[0]).strip() or None if len(values) == 1 else None


@dataclass(frozen=True, slots=True)
class _ImapToken:
    """The copies of one name that a receive saw: ack removes exactly these."""

    mailbox: Mailbox
    uidvalidity: int
    uids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class _Listed:
    name: str | None
    uids: tuple[int, ...]
    size: int

    @property
    def newest(self) -> int:
        return self.uids[-1]


# -- the transport ---------------------------------------------------------------------


class EmailTransport(Transport):
    """Message files as emails: sent with SMTP, read from an IMAP mailbox.

    Addresses: ``send`` takes the recipient site's email address
    (``mailto:field1@example.com``); ``receive`` and ``wait_incoming`` take
    this site's mailbox as an IMAP URL (``imaps://user@host:993/INBOX``,
    or ``imap://...:143/INBOX`` for STARTTLS).

    Options (keyword-only; secrets come from a file or an environment variable):
        smtp_host, smtp_port: the SMTP submission server (port default: 587
            for starttls, 465 for tls, 25 for none).
        smtp_tls: ``"starttls"`` (default, required), ``"tls"`` (implicit) or
            ``"none"`` (only for a relay on the same machine; no login then).
        from_address: the sending site's address (``hq@example.com``).
        username: SMTP login (default: from_address).  The IMAP login is the
            user in the IMAP URL.
        password_file / password_env: the password for both SMTP and IMAP.
        smtp_password_file / smtp_password_env, imap_password_file /
            imap_password_env: a password for one side only, when the SMTP
            and IMAP logins differ (default: password_file / password_env).
        ca_file: PEM file of the CA(s) to trust for TLS (default: the system's).
        move_to: IMAP folder that acked messages are moved to (default: expunge them).
        quarantine_folder: IMAP folder for unusable fieldsync mail (default: leave it, logged).
        max_message_size: larger emails are not downloaded (default 22.3 MiB: a 16 MiB message file in base64).
        idle: use IMAP IDLE in wait_incoming when the server has it (default True).
        connect_timeout, timeout: seconds for connecting, and for each command (15, 60).
        retries, retry_delay: reconnects within one call and the first wait (3, 1 s; doubling).
    """

    def __init__(self, *, smtp_host: str | None = None, smtp_port: int | None = None, smtp_tls: str = "starttls",
                 from_address: str | None = None, username: str | None = None, password_file: str | None = None,
                 password_env: str | None = None, smtp_password_file: str | None = None,
                 smtp_password_env: str | None = None, imap_password_file: str | None = None,
                 imap_password_env: str | None = None, ca_file: str | None = None, move_to: str | None = None,
                 quarantine_folder: str | None = None, max_message_size: ByteCount = DEFAULT_MAX_MESSAGE_SIZE,
                 idle: bool = True, connect_timeout: Seconds = 15.0, timeout: Seconds = 60.0, retries: int = 3,
                 retry_delay: Seconds = 1.0) -> None:
        super().__init__()
        if smtp_host is not None and (type(smtp_host) is not str or not smtp_host.strip()):
            raise BadTransportOptions(f"smtp_host must be a host name, got {smtp_host!r}")
        if smtp_tls not in SMTP_TLS_MODES:
            raise BadTransportOptions(f"smtp_tls must be one of {', '.join(SMTP_TLS_MODES)}, got {smtp_tls!r}")
        if smtp_port is not None and (type(smtp_port) is not int or not 0 < smtp_port < 65536):
            raise BadTransportOptions(f"smtp_port must be 1..65535, got {smtp_port!r}")
        if from_address is not None:
            try:
                _check_email(from_address, "from_address")
            except BadAddress as error:
                raise BadTransportOptions(str(error)) from None
        if username is not None and (type(username) is not str or not username):
            raise BadTransportOptions(f"username must be a login name, got {username!r}")
        for option, folder in (("move_to", move_to), ("quarantine_folder", quarantine_folder)):
            if folder is not None and (type(folder) is not str or not folder.strip()
                                       or any(ord(char) < 32 for char in folder)):
                raise BadTransportOptions(f"{option} must be an IMAP folder name, got {folder!r}")
        check_size_limit("max_message_size", max_message_size)
        if type(idle) is not bool:
            raise BadTransportOptions(f"idle must be True or False, got {idle!r}")
        check_timeouts(connect_timeout=connect_timeout, timeout=timeout)
        if ca_file is not None and (type(ca_file) is not str or not ca_file):
            raise BadTransportOptions(f"ca_file must be a path, got {ca_file!r}")
        self.smtp_host = smtp_host
        self.smtp_tls = smtp_tls
        self.smtp_port = smtp_port or DEFAULT_SMTP_PORTS[smtp_tls]
        self.from_address = from_address
        self.username = username
        self.password = SecretSource("password", password_file, password_env)
        smtp_password = SecretSource("smtp_password", smtp_password_file, smtp_password_env)
        imap_password = SecretSource("imap_password", imap_password_file, imap_password_env)
        self.smtp_password = smtp_password if smtp_password.configured else self.password
        self.imap_password = imap_password if imap_password.configured else self.password
        self.ca_file = ca_file
        self.move_to = move_to
        self.quarantine_folder = quarantine_folder
        self.max_message_size = max_message_size
        self.idle = idle
        self.connect_timeout = float(connect_timeout)
        self.timeout = float(timeout)
        self.backoff = Backoff(retries, retry_delay)
        self._tls_context: ssl.SSLContext | None = None
        self._smtp: aiosmtplib.SMTP | None = None
        self._smtp_lock = asyncio.Lock()
        self._sessions: dict[tuple, ImapSession] = {}
        self._session_locks: dict[tuple, asyncio.Lock] = {}
        self._idle_sessions: dict[tuple, ImapSession] = {}
        self._last_seen: dict[tuple, tuple[int, int]] = {}
        self._rejected: set[tuple] = set()
        self._folders_made: set[tuple] = set()
        self._failing = False  # a server stopped answering; warned once until it answers again
        # Logins a server refused, by (protocol, host, port, user, keyed hash of the password).
        self._refused_logins: dict[tuple, TransportRefused] = {}
        self._login_key_salt = secrets.token_bytes(16)

    def __repr__(self) -> str:
        return f"EmailTransport(smtp_host={self.smtp_host!r}, closed={self.closed})"

    def check_address(self, address: str) -> str:
        """``mailto:`` (or a bare address) for send; an ``imap(s)://`` URL for receive."""
        address = super().check_address(address)
        if re.match(r"(?i)imaps?://", address.strip()):
            return str(Mailbox.parse(address))
        return str(Recipient.parse(address))

    def check_inbox_address(self, address: str) -> str:
        address = Transport.check_address(self, address)
        if not address.lower().strip().startswith(("imap://", "imaps://")):
            raise BadAddress(f"an email site's inbox is its IMAP mailbox (imaps://user@host/INBOX), not {address}; "
                             "peers send to its reply address (mailto:...)")
        return str(Mailbox.parse(address))

    def check_send_address(self, address: str) -> str:
        address = Transport.check_address(self, address)
        if address.lower().strip().startswith(("imap://", "imaps://")):
            raise BadAddress(f"email is sent to the recipient's address (mailto:site@example.com), not to its IMAP "
                             f"mailbox {address}")
        return str(Recipient.parse(address))

    def _context(self) -> ssl.SSLContext:
        """The TLS settings for SMTP and IMAP: verify the chain and the host name."""
        if self._tls_context is None:
            try:
                context = ssl.create_default_context(cafile=os.path.expanduser(self.ca_file) if self.ca_file else None)
            except (OSError, ssl.SSLError) as error:
                raise TransportRefused(f"cannot load ca_file {self.ca_file}: {error}") from None
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            self._tls_context = context
        return self._tls_context

    @staticmethod
    async def _password(source: SecretSource) -> str | None:
        return await asyncio.to_thread(source.read)

    def _login_key(self, protocol: str, host: str | None, port: int, user: str, password: str) -> tuple:
        digest = hashlib.blake2b(password.encode("utf-8", "surrogatepass"), key=self._login_key_salt).digest()
        return (protocol, host, port, user, digest)

    def _refused_before(self, key: tuple) -> None:
        """Raise at once for a login this server refused already with the same password."""
        refusal = self._refused_logins.get(key)
        if refusal is not None:
            raise TransportRefused(f"{refusal} (not tried again: the server refused this password already; "
                                   "it is tried again once the password changes)")

    async def _backing_off(self, failure: TransportError, delays) -> None:
        delay = next(delays, None)
        if delay is None or self._closed:
            raise failure
        # One warning when a server goes away, not one per retry or per call.
        level = logging.INFO if self._failing else logging.WARNING
        self._failing = True
        log.log(level, "%s; trying again in %.1f s", failure, delay)
        await asyncio.sleep(delay)

    # -- send (SMTP) ---------------------------------------------------------------------

    async def _send(self, address: str, name: str, data: bytes) -> None:
        if address.lower().startswith(("imap://", "imaps://")):
            raise BadAddress(f"send takes the recipient's email address (mailto:site@example.com), "
                             f"not an IMAP mailbox ({address})")
        recipient = Recipient.parse(address)
        if self.smtp_host is None or self.from_address is None:
            raise TransportRefused("this email transport cannot send: set smtp_host and from_address")
        message = await asyncio.to_thread(build_email, name, data, self.from_address, recipient.email)
        delays = self.backoff.delays()
        while True:
            async with self._smtp_lock:
                reused = self._smtp is not None
                try:
                    smtp = await self._smtp_connection()
                    await smtp.sendmail(self.from_address, [recipient.email], message)
                    return
                except aiosmtplib.SMTPResponseException as error:
                    # The server answered; start the next message on a fresh session.
                    self._drop_smtp()
                    if isinstance(error, aiosmtplib.SMTPAuthenticationError):
                        raise self._smtp_login_refused(error) from None
                    if isinstance(error, aiosmtplib.SMTPConnectResponseError) and 400 <= error.code < 500:
                        failure = TransportUnavailable(f"SMTP server {self._smtp_where()} is busy: "
                                                       f"{error.code} {one_line(error.message)}")
                    else:
                        raise _smtp_refusal(error, name, recipient, self._smtp_where()) from None
                except aiosmtplib.SMTPRecipientsRefused as error:
                    self._drop_smtp()
                    raise _smtp_refusal(error.recipients[0], name, recipient, self._smtp_where()) from None
                except (aiosmtplib.SMTPException, OSError, TimeoutError) as error:
                    self._drop_smtp()
                    refused = _tls_refusal(error)
                    if refused is not None:
                        raise TransportRefused(f"cannot send {name} through SMTP server {self._smtp_where()}: "
                                               f"{refused}") from None
                    failure = TransportUnavailable(
                        f"cannot send {name} through SMTP server {self._smtp_where()}: {_describe(error)}")
                    if reused:
                        # The server may have closed an idle session: one fresh try at once.
                        log.debug("%s; reconnecting", failure)
                        continue
                except BaseException:
                    # Cancelled mid-dialogue, or refused before connecting: no half-used session stays.
                    self._drop_smtp()
                    raise
            await self._backing_off(failure, delays)

    def _smtp_where(self) -> str:
        return f"{self.smtp_host}:{self.smtp_port}"

    def _smtp_login(self) -> str:
        return self.username or self.from_address or ""

    def _smtp_login_refused(self, error: aiosmtplib.SMTPResponseException) -> TransportError:
        text = (f"SMTP server {self._smtp_where()} refused login as {self._smtp_login()}: "
                f"{error.code} {one_line(error.message)}")
        if 400 <= error.code < 500:
            return TransportUnavailable(text + "; trying again later")
        return TransportRefused(text + f"; check username and {self.smtp_password.describe()}")

    async def _smtp_connection(self) -> aiosmtplib.SMTP:
        if self._smtp is not None and self._smtp.is_connected:
            return self._smtp
        self._drop_smtp()
        password = await self._password(self.smtp_password)
        use_tls = self.smtp_tls == "tls"
        start_tls = True if self.smtp_tls == "starttls" else False
        context = self._context() if self.smtp_tls != "none" else None
        smtp = aiosmtplib.SMTP(hostname=self.smtp_host, port=self.smtp_port, use_tls=use_tls, start_tls=start_tls,
                               tls_context=context, timeout=self.timeout,
                               local_hostname=self.from_address.rpartition("@")[2])
        if password is not None and self.smtp_tls == "none":
            raise TransportRefused(f"not sending the SMTP password to {self._smtp_where()} without TLS; "
                                   "use smtp_tls='starttls' or 'tls', or no password for a local relay")
        key = None
        if password is not None:
            key = self._login_key("smtp", self.smtp_host, self.smtp_port, self._smtp_login(), password)
            self._refused_before(key)
        self._smtp = smtp  # dropped by the caller if anything below fails
        async with asyncio.timeout(self.connect_timeout + self.timeout):
            await smtp.connect(timeout=self.connect_timeout)
        if password is not None:
            try:
                await _smtp_login_once(smtp, self._smtp_login(), password)
            except aiosmtplib.SMTPAuthenticationError as error:
                refusal = self._smtp_login_refused(error)
                if isinstance(refusal, TransportRefused):
                    self._refused_logins[key] = refusal
                raise refusal from None
        return smtp

    def _drop_smtp(self) -> None:
        if self._smtp is not None:
            self._smtp.close()
            self._smtp = None

    # -- receive (IMAP) ---------------------------------------------------------------------

    def _mailbox(self, address: str, doing: str) -> Mailbox:
        if not address.lower().startswith(("imap://", "imaps://")):
            raise BadAddress(f"{doing} takes this site's IMAP mailbox (imaps://user@host/INBOX), not {address}")
        return Mailbox.parse(address)

    async def _receive(self, address: str, wanted: NameFilter) -> AsyncIterator[Incoming]:
        box = self._mailbox(address, "receive")
        uidvalidity, listed = await self._on_mailbox(box, "cannot list", lambda session: self._list(session, box))
        for entry in listed:
            self._check_open()
            if not wanted(entry.name):
                continue  # only its header was fetched, by the listing
            incoming = await self._on_mailbox(
                box, f"cannot read message {entry.name!r} from",
                lambda session, entry=entry: self._read(session, box, uidvalidity, entry, wanted))
            if incoming is not None:
                yield incoming

    async def _list(self, session: ImapSession, box: Mailbox) -> tuple[int, list[_Listed]]:
        """The fieldsync mail in the mailbox: one entry per name (all its UIDs), in name order."""
        selected = session.selected
        await session.noop()  # a session that stays selected sees mail delivered since only after a sync
        uids = await session.uid_search("UNDELETED", *_SEARCH_OURS)
        self._last_seen[box.server + (box.mailbox,)] = (selected.uidvalidity, max(uids, default=0))
        items = await session.uid_fetch(uids, f"(UID RFC822.SIZE BODY.PEEK[HEADER.FIELDS ({HEADER})])")
        by_name: dict[str, list[tuple[int, int]]] = {}
        for item in items:
            if (box.server, box.mailbox, selected.uidvalidity, item.uid) in self._rejected:
                continue  # logged once already
            header = next((value for key, value in item.literals.items() if key.startswith("BODY[HEADER")), b"")
            name = announced_name(header)
            size = item.numbers.get("RFC822.SIZE", 0)
            if name is None:
                await self._reject(session, box, selected.uidvalidity, item.uid, name,
                                   f"its {HEADER} header is repeated or empty")
                continue
            if not usable_name(name):
                await self._reject(session, box, selected.uidvalidity, item.uid, name,
                                   "the name it announces is not a usable file name")
                continue
            by_name.setdefault(name, []).append((item.uid, size))
        listed = []
        for name in sorted(by_name):
            copies = sorted(by_name[name])
            listed.append(_Listed(name, tuple(uid for uid, _ in copies), copies[-1][1]))
        return selected.uidvalidity, listed

    async def _read(self, session: ImapSession, box: Mailbox, uidvalidity: int, entry: _Listed,
                    wanted: NameFilter) -> Incoming | None:
        if session.selected.uidvalidity != uidvalidity:
            return None  # the mailbox was rebuilt since the listing; the next receive starts over
        limit = self.max_message_size
        too_large = oversize(entry.size, None, limit)
        raw = b""
        if too_large is None:
            # At most one byte past the limit, whatever RFC822.SIZE said: one more byte tells it is too large.
            [item] = await session.uid_fetch([entry.newest], f"(UID BODY.PEEK[]<0.{limit + 1}>)") or [None]
            if item is None or "BODY[]<0>" not in item.literals:
                return None  # removed by another reader since the listing
            raw = item.literals["BODY[]<0>"]
            too_large = oversize(entry.size, len(raw), limit)
        if too_large is not None:
            if self.quarantine_folder is not None:
                await self._reject(session, box, uidvalidity, entry.newest, entry.name, too_large)
            else:
                refuse(wanted, entry.name, f"{too_large} (message UID {entry.newest} in {box})",
                       f"UIDVALIDITY {uidvalidity}, UID {entry.newest}")
            return None
        try:
            data = await asyncio.to_thread(read_attachment, raw, entry.name)
        except Malformed as error:
            await self._reject(session, box, uidvalidity, entry.newest, entry.name, str(error))
            return None
        # Only the copy read goes on ack: another email of the same name (a
        # resend, or anyone's mail under that name) is read on its own first.
        return Incoming(entry.name, data, _ImapToken(box, uidvalidity, (entry.newest,)))

    async def _reject(self, session: ImapSession, box: Mailbox, uidvalidity: int, uid: int, name: str | None,
                      reason: str) -> None:
        key = (box.server, box.mailbox, uidvalidity, uid)
        described = f"message UID {uid} ({name!r}) in {box}"
        if self.quarantine_folder is not None:
            await self._ensure_folder(session, box, self.quarantine_folder)
            await session.uid_move([uid], self.quarantine_folder)
            log.warning("moved %s to folder %s: %s", described, self.quarantine_folder, reason)
            return
        level = logging.DEBUG if key in self._rejected else logging.WARNING
        self._rejected.add(key)
        log.log(level, "skipped %s, left in place: %s (set quarantine_folder to move such mail aside)",
                described, reason)

    async def _ensure_folder(self, session: ImapSession, box: Mailbox, folder: str) -> None:
        key = box.server + (folder,)
        if key not in self._folders_made:
            await session.create(folder)
            self._folders_made.add(key)
            # CREATE leaves the selected mailbox selected.

    # -- ack ---------------------------------------------------------------------------

    async def _ack(self, incoming: Incoming) -> None:
        token = incoming.token
        if not isinstance(token, _ImapToken):
            raise TypeError(f"{incoming!r} was not received by an email transport")
        await self._on_mailbox(token.mailbox, f"cannot remove {incoming.name!r} from",
                               lambda session: self._remove(session, token, incoming.name))

    async def _remove(self, session: ImapSession, token: _ImapToken, name: str) -> None:
        if session.selected.uidvalidity != token.uidvalidity:
            log.warning("%s was rebuilt (UIDVALIDITY changed) since %s was received; it stays and will be "
                        "received again", token.mailbox, name)
            return
        if self.move_to is not None:
            await self._ensure_folder(session, token.mailbox, self.move_to)
            try:
                await session.uid_move(token.uids, self.move_to)
            except CommandFailed as error:
                if "NONEXISTENT" not in error.text.upper() and "NO MATCHING" not in error.text.upper():
                    raise
            return
        if not session.has_capability("UIDPLUS"):
            raise TransportRefused(f"IMAP server {token.mailbox.display_host} lacks UIDPLUS, so acked messages "
                                   "cannot be expunged without touching other mail; set move_to to a folder")
        await session.uid_store(token.uids, "+FLAGS.SILENT", r"(\Deleted)")
        await session.uid_expunge(token.uids)

    # -- wait_incoming (IDLE) --------------------------------------------------------------

    async def _wait_incoming(self, address: str, timeout: float) -> bool:
        box = self._mailbox(address, "wait_incoming")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        key = box.server + (box.mailbox,)
        delays = self.backoff.delays()
        while True:
            try:
                session = self._idle_sessions.get(key)
                if session is None or not session.alive:
                    session = await self._open_session(box)
                    self._idle_sessions[key] = session
                    await session.select(box.mailbox)
                validity, last = self._last_seen.get(key, (None, 0))
                if validity != session.selected.uidvalidity:
                    last = 0
                await session.noop()
                waiting = await session.uid_search(f"UID {last + 1}:*", "UNDELETED", *_SEARCH_OURS)
                fresh = [uid for uid in waiting if uid > last]
                if fresh:
                    # Reported once: until more arrives, the next call sleeps even if
                    # the caller has not received these yet (no NOOP/SEARCH spinning).
                    self._last_seen[key] = (session.selected.uidvalidity, max(fresh))
                    return True
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return False
                if self.idle and session.has_capability("IDLE"):
                    # RFC 2177: a client renews IDLE at least every 29 minutes.
                    woke = await session.idle(min(remaining, IDLE_RENEWAL))
                    if not woke and loop.time() < deadline:
                        continue
                    return woke
                await asyncio.sleep(min(remaining, 30.0))
                if loop.time() < deadline:
                    continue
                return False
            except SessionLost as lost:
                self._drop_idle_session(key)
                failure = TransportUnavailable(f"cannot wait for mail in {box}: {lost}")
            except CommandFailed as error:
                self._drop_idle_session(key)
                raise self._imap_refusal(box, "cannot wait for mail in", error) from None
            if loop.time() >= deadline:
                raise failure
            await self._backing_off(failure, delays)

    def _drop_idle_session(self, key: tuple) -> None:
        session = self._idle_sessions.pop(key, None)
        if session is not None:
            session.close()

    # -- IMAP sessions, retries and errors --------------------------------------------------

    async def _on_mailbox(self, box: Mailbox, doing: str, operation: Callable[[ImapSession], Awaitable[T]]) -> T:
        """Run ``operation`` with the mailbox selected, reconnecting with backoff if the connection fails."""
        delays = self.backoff.delays()
        lock = self._session_locks.setdefault(box.server, asyncio.Lock())
        while True:
            async with lock:
                try:
                    session = self._sessions.get(box.server)
                    if session is None or not session.alive:
                        session = await self._open_session(box)
                        self._sessions[box.server] = session
                    if session.selected is None or session.selected.mailbox != box.mailbox:
                        await session.select(box.mailbox)
                    result = await operation(session)
                    if self._failing:
                        self._failing = False
                        log.info("IMAP server %s answers again", box.display_host)
                    return result
                except SessionLost as lost:
                    self._drop_session(box.server)
                    failure = TransportUnavailable(f"{doing} {box}: {lost}")
                except CommandFailed as error:
                    raise self._imap_refusal(box, doing, error) from None
            await self._backing_off(failure, delays)

    def _drop_session(self, server: tuple) -> None:
        session = self._sessions.pop(server, None)
        if session is not None:
            session.close()

    async def _open_session(self, box: Mailbox) -> ImapSession:
        """A new logged-in session.  Raises SessionLost (retry), or the error to report."""
        password = await self._password(self.imap_password)
        if password is None:
            raise TransportRefused(f"no password for {box}: set password_file or password_env "
                                   "(or imap_password_file / imap_password_env)")
        key = self._login_key("imap", box.host, box.port, box.user, password)
        self._refused_before(key)
        try:
            return await ImapSession.open(host=box.host, port=box.port, tls=box.tls, context=self._context(),
                                          user=box.user, password=password, connect_timeout=self.connect_timeout,
                                          timeout=self.timeout)
        except TlsRefused as error:
            raise TransportRefused(f"IMAP server {box.display_host}: {error}; set ca_file to the CA that signed "
                                   "its certificate, and use the host name the certificate names") from None
        except CommandFailed as error:
            if "UNAVAILABLE" in error.text.upper():
                raise SessionLost(f"the server cannot log in {box.user} now: {error.text}") from None
            refusal = TransportRefused(f"IMAP server {box.display_host} refused login as {box.user}: {error.text}; "
                                       f"check the user name and {self.imap_password.describe()}")
            self._refused_logins[key] = refusal
            raise refusal from None
        except TimeoutError:
            raise SessionLost(f"IMAP server {box.display_host} did not answer within "
                              f"{self.connect_timeout:.0f} s") from None
        except OSError as error:
            raise SessionLost(f"cannot connect to IMAP server {box.display_host}: "
                              f"{error.strerror or error}; is it running?") from None

    @staticmethod
    def _imap_refusal(box: Mailbox, doing: str, error: CommandFailed) -> TransportError:
        text = f"{doing} {box}: the server answered {error.command} with {error.result} {error.text}"
        if error.command == "SELECT":
            return TransportRefused(f"{text}; does the mailbox {box.mailbox!r} exist?")
        upper = error.text.upper()
        if any(code in upper for code in ("[UNAVAILABLE]", "[INUSE]", "[SERVERBUG]", "[LIMIT]", "[OVERQUOTA]")):
            return TransportUnavailable(text)
        return TransportRefused(text)

    # -- closing ------------------------------------------------------------------------------

    async def _aclose(self) -> None:
        sessions = [*self._sessions.values(), *self._idle_sessions.values()]
        self._sessions.clear()
        self._idle_sessions.clear()
        for session in sessions:
            await session.logout()
        if self._smtp is not None:
            smtp, self._smtp = self._smtp, None
            try:
                await smtp.quit()
            except (aiosmtplib.SMTPException, OSError):
                smtp.close()

    def _release(self) -> None:
        for session in [*self._sessions.values(), *self._idle_sessions.values()]:
            session.close()
        self._sessions.clear()
        self._idle_sessions.clear()
        self._drop_smtp()


# What an SMTP server answers when it does not take a mechanism (RFC 4954):
# only then is the next one tried.  Any other refusal (535: the user name or
# password is wrong) is final; a retry would cost another failed login.
_MECHANISM_REFUSED = frozenset({504, 534, 538})


async def _smtp_login_once(smtp: aiosmtplib.SMTP, user: str, password: str) -> None:
    """Log in with the server's first mechanism that aiosmtplib has.

    ``SMTP.login`` tries every mechanism in turn after a refusal, so one
    wrong password is several failed logins, each answered later than the
    last by servers that slow down guessing (Dovecot behind Postfix).
    """
    if smtp.is_ehlo_or_helo_needed:
        await smtp.ehlo()
    methods = smtp.supported_auth_methods
    if not methods:
        await smtp.login(user, password)  # raises aiosmtplib's error: no AUTH, or no mechanism in common
        return
    for number, method in enumerate(methods):
        try:
            await getattr(smtp, f"auth_{method.replace('-', '')}")(user, password)
            return
        except aiosmtplib.SMTPAuthenticationError as error:
            if error.code not in _MECHANISM_REFUSED or number == len(methods) - 1:
                raise


def _describe(error: BaseException) -> str:
    text = one_line(error)
    return text or type(error).__name__


def _tls_refusal(error: BaseException) -> str | None:
    """Why TLS failed, if ``error`` (or what caused it) is a certificate problem."""
    seen = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ssl.SSLCertVerificationError):
            return (f"the server's certificate does not verify: {current.verify_message}; set ca_file to the CA "
                    "that signed it, and use the host name the certificate names")
        if isinstance(current, aiosmtplib.SMTPNotSupported) or "STARTTLS" in str(current) and "not supported" in str(current):
            return f"{one_line(current)}; the server does not offer STARTTLS (try smtp_tls='tls')"
        current = current.__cause__ or current.__context__
    if "CERTIFICATE_VERIFY_FAILED" in str(error):
        return f"the server's certificate does not verify ({one_line(error)}); set ca_file"
    return None


def _smtp_refusal(error: aiosmtplib.SMTPResponseException, name: str, recipient: Recipient,
                  where: str) -> TransportError:
    """What the server said about this message: 4xx is temporary (retry later), 5xx is final."""
    what = {aiosmtplib.SMTPSenderRefused: "refused the sender",
            aiosmtplib.SMTPRecipientRefused: f"refused the recipient {recipient.email}",
            aiosmtplib.SMTPDataError: "refused the message"}.get(type(error), "refused")
    text = f"SMTP server {where} {what} for {name}: {error.code} {one_line(error.message)}"
    if 400 <= error.code < 500:
        return TransportUnavailable(f"{text}; the message was not sent, try again later")
    return TransportRefused(f"{text}; the message was not sent")

"""The ``email`` transport: one email per message file, SMTP out, IMAP in.

The email's format is ``_email_format``'s, the addresses
``_email_address``'s, the SMTP side ``_smtp``'s, and what both sides share
(TLS, refused logins, retries) ``_mail_servers``'s: each states its rules.

Rules of this file (the IMAP side and the transport):
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
* An IMAP login is tried once; a password a server refused is not offered
  to it again while this transport lives; a changed password is tried.
* Connection failures are retried with backoff (``retries``); what the
  server refuses on purpose is raised at once: ``TransportRefused`` for a
  permanent answer, ``TransportUnavailable`` for a temporary one (such as
  a full mailbox).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import aioimaplib  # noqa: F401  (used by ._imap; imported here so a missing package fails this module's import)
import aiosmtplib  # noqa: F401  (used by ._smtp; likewise)

from codec.message import MAX_FILE_SIZE

from ._email_address import DEFAULT_IMAP_PORTS, Mailbox, Recipient, check_email  # noqa: F401 (re-exported)
from ._email_format import (HEADER, Malformed, announced_name, build_email, oversize,  # noqa: F401 (re-exported)
                            read_attachment, usable_name)
from ._imap import CommandFailed, ImapSession, SessionLost, TlsRefused
from ._mail_servers import MailServers
from ._remote import Backoff, SecretSource, check_timeouts
from ._smtp import SmtpSender
from .base import Incoming, NameFilter, Transport, refuse
from .errors import BadAddress, BadTransportOptions, TransportError, TransportRefused, TransportUnavailable
from .options import ByteCount, Seconds, check_size_limit

log = logging.getLogger(__name__)

SMTP_TLS_MODES = ("starttls", "tls", "none")
DEFAULT_SMTP_PORTS = {"starttls": 587, "tls": 465, "none": 25}
# The largest message file (codec.message.MAX_FILE_SIZE) in base64, with room for the headers.
DEFAULT_MAX_MESSAGE_SIZE = MAX_FILE_SIZE * 4 // 3 + 1024 * 1024

_SEARCH_OURS = ("HEADER", HEADER, '""')
IDLE_RENEWAL = 29 * 60.0  # seconds; RFC 2177 section 3

T = TypeVar("T")


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
                check_email(from_address, "from_address")
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
        self._servers = MailServers(ca_file=ca_file, backoff=self.backoff, closed=lambda: self._closed)
        self._smtp = SmtpSender(self._servers, host=smtp_host, port=self.smtp_port, tls=smtp_tls,
                                from_address=from_address, username=username, password=self.smtp_password,
                                timeout=self.timeout, connect_timeout=self.connect_timeout)
        self._sessions: dict[tuple, ImapSession] = {}
        self._session_locks: dict[tuple, asyncio.Lock] = {}
        self._idle_sessions: dict[tuple, ImapSession] = {}
        self._last_seen: dict[tuple, tuple[int, int]] = {}
        self._rejected: set[tuple] = set()
        self._folders_made: set[tuple] = set()

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

    # -- send (SMTP) ---------------------------------------------------------------------

    async def _send(self, address: str, name: str, data: bytes) -> None:
        if address.lower().startswith(("imap://", "imaps://")):
            raise BadAddress(f"send takes the recipient's email address (mailto:site@example.com), "
                             f"not an IMAP mailbox ({address})")
        recipient = Recipient.parse(address)
        if self.smtp_host is None or self.from_address is None:
            raise TransportRefused("this email transport cannot send: set smtp_host and from_address")
        await self._smtp.send(recipient, name, data)

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
            await self._servers.backing_off(failure, delays)

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
                    if self._servers.failing:
                        self._servers.failing = False
                        log.info("IMAP server %s answers again", box.display_host)
                    return result
                except SessionLost as lost:
                    self._drop_session(box.server)
                    failure = TransportUnavailable(f"{doing} {box}: {lost}")
                except CommandFailed as error:
                    raise self._imap_refusal(box, doing, error) from None
            await self._servers.backing_off(failure, delays)

    def _drop_session(self, server: tuple) -> None:
        session = self._sessions.pop(server, None)
        if session is not None:
            session.close()

    async def _open_session(self, box: Mailbox) -> ImapSession:
        """A new logged-in session.  Raises SessionLost (retry), or the error to report."""
        password = await self._servers.password(self.imap_password)
        if password is None:
            raise TransportRefused(f"no password for {box}: set password_file or password_env "
                                   "(or imap_password_file / imap_password_env)")
        key = self._servers.login_key("imap", box.host, box.port, box.user, password)
        self._servers.refused_before(key)
        try:
            return await ImapSession.open(host=box.host, port=box.port, tls=box.tls, context=self._servers.context(),
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
            self._servers.remember_refusal(key, refusal)
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
        await self._smtp.aclose()

    def _release(self) -> None:
        for session in [*self._sessions.values(), *self._idle_sessions.values()]:
            session.close()
        self._sessions.clear()
        self._idle_sessions.clear()
        self._smtp.drop()

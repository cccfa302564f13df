"""A small, strict IMAP session on top of aioimaplib, for the email transport.

Rules of this file:
* One command at a time per session; the caller holds ``session.lock``
  across a sequence of commands that belong together (SELECT, then SEARCH).
* Every command has a deadline.  A timeout, a dropped connection, a
  cancelled command or a reply this file cannot read leaves the protocol
  state unknown, so the session is closed and ``SessionLost`` raised; the
  transport then makes a new session.  A tagged NO or BAD is ``CommandFailed``
  and leaves the session usable.
* Nothing here changes a message's flags except ``store``; bodies and
  headers are always read with ``BODY.PEEK``.
* aioimaplib leaves a few things to its caller, done here: STARTTLS (the
  socket is upgraded with ``loop.start_tls``), failing pending commands at
  once when the connection drops (instead of waiting for their timeout),
  quoting of arguments, and parsing of SEARCH and FETCH replies.
"""

from __future__ import annotations

import asyncio
import base64
import re
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field

import aioimaplib

_FETCH_START = re.compile(rb"\d+ FETCH \(")
_LITERAL_ATTRIBUTE = re.compile(rb"(BODY\[[^\]]*\](?:<\d+>)?|RFC822(?:\.HEADER|\.TEXT)?) \{\d+\}\Z", re.IGNORECASE)
_NUMBER_ATTRIBUTE = re.compile(rb"\b(UID|RFC822\.SIZE) (\d+)", re.IGNORECASE)
_RESPONSE_CODE = re.compile(rb"\[(UIDVALIDITY|UIDNEXT) (\d+)\]", re.IGNORECASE)


class SessionLost(Exception):
    """The connection is gone or in an unknown state; make a new session."""


class CommandFailed(Exception):
    """The server answered NO or BAD; ``text`` is its reply, on one line."""

    def __init__(self, command: str, result: str, text: str) -> None:
        super().__init__(f"{command}: {result} {text}")
        self.command = command
        self.result = result
        self.text = text


class TlsRefused(Exception):
    """The server's certificate did not verify, or it does not offer TLS."""


def quoted(text: str) -> str:
    """An IMAP quoted string (RFC 3501 section 4.3)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def encode_mailbox(name: str) -> str:
    """A mailbox name in IMAP's modified UTF-7 (RFC 3501 section 5.1.3), quoted."""
    out = []
    pending: list[str] = []

    def flush() -> None:
        if pending:
            raw = "".join(pending).encode("utf-16-be")
            out.append("&" + base64.b64encode(raw).decode().rstrip("=").replace("/", ",") + "-")
            pending.clear()

    for char in name:
        if 0x20 <= ord(char) <= 0x7E:
            flush()
            out.append("&-" if char == "&" else char)
        else:
            pending.append(char)
    flush()
    return quoted("".join(out))


def uid_set(uids: Sequence[int]) -> str:
    """``1:3,7,9:10`` for [1, 2, 3, 7, 9, 10]."""
    ordered = sorted(set(uids))
    ranges = []
    start = previous = ordered[0]
    for uid in ordered[1:]:
        if uid == previous + 1:
            previous = uid
            continue
        ranges.append(f"{start}:{previous}" if previous != start else str(start))
        start = previous = uid
    ranges.append(f"{start}:{previous}" if previous != start else str(start))
    return ",".join(ranges)


class _RetrievedTasks(set):
    """aioimaplib's set of its own tasks, each one's outcome retrieved when
    it ends (:func:`_retrieve`)."""

    def add(self, task: asyncio.Future) -> None:  # type: ignore[override]
        task.add_done_callback(_retrieve)
        super().add(task)


def _retrieve(task: asyncio.Future) -> None:
    """Take a finished task's outcome, so that a failure nobody waits for is not reported as unretrieved."""
    if not task.cancelled():
        task.exception()


async def _idle_start(client: aioimaplib.IMAP4) -> asyncio.Task:
    """Send IDLE and wait for the server's continuation; return the IDLE
    command's task.

    aioimaplib's ``IMAP4.idle_start`` loses the task when the connection
    drops before the server's answer (it raises, and the task's
    SessionLost is reported as "Task exception was never retrieved"):
    here its outcome is retrieved from the moment it exists, whichever
    way this ends.  The caller bounds the wait for the answer and ends
    IDLE itself (``idle_done``), so no server-push timer is set."""
    idle = asyncio.ensure_future(client.protocol.idle())
    idle.add_done_callback(_retrieve)
    acknowledged = asyncio.ensure_future(client.protocol.wait_for_idle_response())
    try:
        await asyncio.wait({idle, acknowledged}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        idle.cancel()
        raise
    finally:
        acknowledged.cancel()
    if not client.has_pending_idle():
        if idle.done() and not idle.cancelled() and idle.exception() is not None:
            raise idle.exception()
        raise aioimaplib.Abort("the server refused IDLE")
    return idle


def _text(lines: Sequence[bytes | bytearray]) -> str:
    return " ".join(bytes(line).decode("utf-8", "replace") for line in lines
                    if isinstance(line, bytes)).strip()[:300]


@dataclass(slots=True)
class FetchItem:
    """One message's FETCH reply: ``numbers`` (UID, RFC822.SIZE) and ``literals`` by attribute."""

    numbers: dict[str, int] = field(default_factory=dict)
    literals: dict[str, bytes] = field(default_factory=dict)

    @property
    def uid(self) -> int | None:
        return self.numbers.get("UID")


def parse_fetch(lines: Sequence[bytes | bytearray]) -> list[FetchItem]:
    """Parse aioimaplib's FETCH reply lines (text as bytes, literals as bytearray)."""
    items: list[FetchItem] = []
    current: FetchItem | None = None
    literal_for: str | None = None
    for line in lines:
        if isinstance(line, bytearray):
            if current is not None and literal_for is not None:
                current.literals[literal_for] = bytes(line)
            literal_for = None
            continue
        if _FETCH_START.match(line):
            current = FetchItem()
            items.append(current)
        elif current is None:
            continue
        for attribute, number in _NUMBER_ATTRIBUTE.findall(line):
            current.numbers[attribute.decode().upper()] = int(number)
        match = _LITERAL_ATTRIBUTE.search(line)
        literal_for = match.group(1).decode().upper() if match else None
    return items


@dataclass(frozen=True, slots=True)
class Selected:
    mailbox: str
    uidvalidity: int
    uidnext: int | None


class ImapSession:
    """One IMAP connection, logged in.  Make it with ``await ImapSession.open(...)``."""

    def __init__(self, client: aioimaplib.IMAP4, host: str, timeout: float) -> None:
        self._client = client
        self.host = host
        self.timeout = timeout
        self.lock = asyncio.Lock()
        self.selected: Selected | None = None
        self._alive = True

    # -- opening -------------------------------------------------------------

    @classmethod
    async def open(cls, *, host: str, port: int, tls: str, context: ssl.SSLContext, user: str, password: str,
                   connect_timeout: float, timeout: float) -> "ImapSession":
        """Connect, secure (implicit TLS or STARTTLS) and log in.

        Raises OSError / TimeoutError (cannot connect), TlsRefused,
        CommandFailed (login refused) or SessionLost.
        """
        holder: list[ImapSession] = []

        def connection_lost(error: Exception | None) -> None:
            if holder:
                holder[0]._connection_lost()

        client = aioimaplib.IMAP4(host=host, port=port, timeout=timeout, conn_lost_cb=connection_lost,
                                  ssl_context=context if tls == "tls" else None)
        # aioimaplib answers the greeting in a task of its own (CAPABILITY),
        # whose failure nobody waits for: a connection lost then was reported
        # as "Task exception was never retrieved".  Each is retrieved when it
        # ends; the session learns of the lost connection by its own callback.
        client.protocol.tasks = _RetrievedTasks(client.protocol.tasks)
        session = cls(client, host, timeout)
        holder.append(session)
        try:
            try:
                async with asyncio.timeout(connect_timeout):
                    await client.wait_hello_from_server()
            except ssl.SSLCertVerificationError as error:
                raise TlsRefused(f"the server's certificate does not verify: {error.verify_message}") from None
            if tls == "starttls":
                await session._starttls(context)
            response = await session._run(client.protocol.login(quoted(user), password), "LOGIN")
            if response.result != "OK":
                raise CommandFailed("LOGIN", response.result, _text(response.lines))
            return session
        except BaseException:
            session.close()
            raise

    async def _starttls(self, context: ssl.SSLContext) -> None:
        protocol = self._client.protocol
        if "STARTTLS" not in protocol.capabilities:
            raise TlsRefused("the server does not offer STARTTLS; use an imaps:// address if it takes implicit TLS")
        command = aioimaplib.Command("STARTTLS", protocol.new_tag(), loop=protocol.loop)
        response = await self._run(protocol.execute(command), "STARTTLS")
        if response.result != "OK":
            raise TlsRefused(f"STARTTLS was refused: {_text(response.lines)}")
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.timeout):
                protocol.transport = await loop.start_tls(protocol.transport, protocol, context,
                                                          server_hostname=self.host)
        except ssl.SSLCertVerificationError as error:
            raise TlsRefused(f"the server's certificate does not verify: {error.verify_message}") from None
        except (OSError, TimeoutError, ssl.SSLError) as error:
            self.close()
            raise SessionLost(f"the TLS handshake after STARTTLS failed: {error}") from None
        # Capabilities change once the link is encrypted (RFC 3501 section 6.2.1).
        await self._run(protocol.capability(), "CAPABILITY")

    # -- state -----------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return self._alive

    def has_capability(self, name: str) -> bool:
        return name.upper() in self._client.protocol.capabilities

    def _connection_lost(self) -> None:
        self._alive = False
        protocol = self._client.protocol
        # aioimaplib would let pending commands wait for their timeout; fail them now.
        pending = [*protocol.pending_async_commands.values(), protocol.pending_sync_command]
        for command in pending:
            if command is not None and not command._event.is_set():
                command._exception = SessionLost("the server closed the connection")
                command.close(b"connection lost", "KO")
        protocol.idle_queue.put_nowait([b"connection lost"])

    def close(self) -> None:
        """Drop the connection now.  Idempotent, never blocks."""
        self._alive = False
        self.selected = None
        transport = self._client.protocol.transport
        if transport is not None:
            transport.abort()
        task = getattr(self._client, "_client_task", None)
        if task is not None and not task.done():
            task.cancel()

    async def logout(self) -> None:
        if self._alive:
            try:
                await self._run(self._client.protocol.logout(), "LOGOUT")
            except (SessionLost, CommandFailed):
                pass
        self.close()

    # -- commands --------------------------------------------------------------

    async def _run(self, awaitable, name: str):
        if not self._alive:
            awaitable.close()
            raise SessionLost("the connection was closed")
        try:
            async with asyncio.timeout(self.timeout):
                return await awaitable
        except TimeoutError:
            self.close()
            raise SessionLost(f"no answer to {name} within {self.timeout:.0f} s") from None
        except SessionLost:
            self.close()
            raise
        except (OSError, aioimaplib.AioImapException, ssl.SSLError, ValueError, IndexError) as error:
            self.close()
            raise SessionLost(f"{name} failed: {error or type(error).__name__}") from None
        except BaseException:
            # Cancelled half-way: the server's answer would arrive for a command nobody waits for.
            self.close()
            raise

    async def _checked(self, awaitable, name: str):
        response = await self._run(awaitable, name)
        if response.result != "OK":
            raise CommandFailed(name, response.result, _text(response.lines))
        return response

    async def select(self, mailbox: str) -> Selected:
        protocol = self._client.protocol
        self.selected = None
        response = await self._checked(protocol.select(encode_mailbox(mailbox)), "SELECT")
        codes = {}
        for line in response.lines:
            if isinstance(line, bytes):
                for code, number in _RESPONSE_CODE.findall(line):
                    codes[code.decode().upper()] = int(number)
        if "UIDVALIDITY" not in codes:
            self.close()
            raise SessionLost(f"SELECT {mailbox} gave no UIDVALIDITY")
        self.selected = Selected(mailbox, codes["UIDVALIDITY"], codes.get("UIDNEXT"))
        return self.selected

    async def noop(self) -> None:
        """Let the server bring the selected mailbox up to date (new mail gets UIDs)."""
        await self._checked(self._client.protocol.simple_command("NOOP"), "NOOP")

    async def uid_search(self, *criteria: str) -> list[int]:
        response = await self._checked(
            self._client.protocol.search(*criteria, charset=None, by_uid=True), "UID SEARCH")
        uids = []
        for line in response.lines[:-1]:
            if isinstance(line, bytes) and re.fullmatch(rb"[\d ]*", line):
                uids.extend(int(number) for number in line.split())
        return sorted(set(uids))

    async def uid_fetch(self, uids: Sequence[int], attributes: str) -> list[FetchItem]:
        if not uids:
            return []
        protocol = self._client.protocol
        response = await self._checked(
            protocol.fetch(uid_set(uids), attributes, by_uid=True, timeout=self.timeout), "UID FETCH")
        wanted = set(uids)
        return [item for item in parse_fetch(response.lines) if item.uid in wanted]

    async def uid_store(self, uids: Sequence[int], change: str, flags: str) -> None:
        await self._checked(self._client.protocol.store(uid_set(uids), change, flags, by_uid=True), "UID STORE")

    async def uid_expunge(self, uids: Sequence[int]) -> None:
        await self._checked(self._client.protocol.expunge(uid_set(uids), by_uid=True), "UID EXPUNGE")

    async def uid_move(self, uids: Sequence[int], mailbox: str) -> None:
        protocol = self._client.protocol
        if self.has_capability("MOVE"):
            await self._checked(protocol.move(uid_set(uids), encode_mailbox(mailbox), by_uid=True), "UID MOVE")
            return
        await self._checked(protocol.copy(uid_set(uids), encode_mailbox(mailbox), by_uid=True), "UID COPY")
        await self.uid_store(uids, "+FLAGS.SILENT", r"(\Deleted)")
        await self.uid_expunge(uids)

    async def create(self, mailbox: str) -> None:
        """Create ``mailbox``; one that exists already is fine."""
        try:
            await self._checked(self._client.protocol.simple_command("CREATE", encode_mailbox(mailbox)), "CREATE")
        except CommandFailed as error:
            if "ALREADYEXISTS" not in error.text.upper() and "EXISTS" not in error.text.upper():
                raise

    async def idle(self, timeout: float) -> bool:
        """Wait in IDLE for new mail: True when the server reports some, False after ``timeout``.

        Also True when the connection drops (the caller then finds out what
        is waiting, or that the server is gone, by receiving).
        """
        client = self._client
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            async with asyncio.timeout(self.timeout):
                idle_command = await _idle_start(client)
        except TimeoutError:
            self.close()
            raise SessionLost("no answer to IDLE") from None
        except (OSError, aioimaplib.AioImapException) as error:
            self.close()
            raise SessionLost(f"IDLE failed: {error}") from None
        except BaseException:
            self.close()
            raise
        woke = False
        try:
            while not woke:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    pushed = await client.wait_server_push(timeout=remaining)
                except TimeoutError:
                    break
                if not self._alive:
                    return True
                if pushed == aioimaplib.STOP_WAIT_SERVER_PUSH:
                    break
                woke = any(isinstance(line, bytes) and re.search(rb"\d+ (EXISTS|RECENT)\Z", line)
                           for line in pushed)
            if not self._alive:
                return True
            client.idle_done()
            async with asyncio.timeout(self.timeout):
                await idle_command
        except SessionLost:
            self.close()
            return True  # dropped while idle: whoever receives next finds out why
        except TimeoutError:
            self.close()
            raise SessionLost("no answer to DONE after IDLE") from None
        except (OSError, aioimaplib.AioImapException) as error:
            self.close()
            raise SessionLost(f"IDLE failed: {error}") from None
        except BaseException:
            self.close()
            raise
        return woke

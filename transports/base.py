"""The async transport interface every plugin implements.

Rules of this file:
* The public methods (``send``, ``receive``, ``ack``, ``wait_incoming``,
  ``aclose``) are concrete and do the checks every transport needs: the
  transport is open, the address is well formed, the name is a fieldsync
  message file name.  A plugin implements the private hooks (``_send``,
  ``_receive``, ``_ack``, optionally ``_wait_incoming``, ``_aclose`` and
  ``_release``), the way fsspec's filesystems implement ``_open``.
* A name handed to ``send`` is checked with ``MessageName.parse`` before the
  hook runs, so no plugin ever sees an unchecked name.  ``receive`` yields
  whatever names it finds that the caller's ``wanted`` accepts, and reads
  (downloads) no file whose name it refuses: the agent refuses the names
  that are not this site's, so another site's mail costs a listing, not a
  download, at every poll.
* A file the transport finds and will not read (over its size limit, a
  hard link, ...) is reported as a :class:`Refusal` to the caller's
  ``refused``, never logged by the transport itself: the agent remembers
  what it was told across runs, so an operator hears of each file once.
  Without ``refused``, a transport warns once per file per instance.
* Constructors do no I/O: connections are made lazily on first use, so
  building a transport (or a wrapper around one) never needs cleanup.
* Blocking libraries run in threads (``asyncio.to_thread``), never on the loop.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import math
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import ClassVar

from codec.errors import BadFileName
from codec.names import MessageName

from .errors import BadAddress, InvalidMessageName, TransportClosed

log = logging.getLogger(__name__)

#: Whether a file of this name is to be read; called once per name a receive finds.
NameFilter = Callable[[str], bool]


def every_name(name: str) -> bool:
    """The :data:`NameFilter` that accepts every name."""
    return True


@dataclass(frozen=True, slots=True)
class Refusal:
    """A file at an inbox that the transport leaves unread, and why.

    ``identity`` tells this copy from a later file of the same name (an
    inode, size and modification time; an IMAP UID): the same refusal is
    news again only for another file.
    """

    name: str
    reason: str
    identity: str = ""

    def __post_init__(self) -> None:
        for field_name in ("name", "reason", "identity"):
            if type(getattr(self, field_name)) is not str:
                raise TypeError(f"Refusal.{field_name} must be str, got {type(getattr(self, field_name)).__name__}")


#: Told of each file a receive leaves unread (called on the event loop, at every receive that finds it).
RefusalSink = Callable[[Refusal], None]


class Screen:
    """What a receive hook is given as ``wanted``: the caller's name filter
    (call it with a name) and :meth:`refuse`, to report a file left unread."""

    __slots__ = ("_wanted", "_refused")

    def __init__(self, wanted: NameFilter, refused: RefusalSink) -> None:
        self._wanted = wanted
        self._refused = refused

    def __call__(self, name: str) -> bool:
        return self._wanted(name)

    def refuse(self, name: str, reason: str, identity: str = "") -> None:
        self._refused(Refusal(name, reason, identity))


def refuse(wanted: NameFilter, name: str, reason: str, identity: str = "") -> None:
    """Report a refused file through ``wanted`` if it is a :class:`Screen`, else log it."""
    if isinstance(wanted, Screen):
        wanted.refuse(name, reason, identity)
    else:
        log.warning("left %s at the inbox, not read: %s", name, reason)


@dataclass(frozen=True, slots=True)
class Incoming:
    """One file waiting at an inbox.

    ``token`` is the transport's own handle on the copy it read (a path and
    inode, an IMAP UID, ...); only the transport that yielded it interprets it.
    """

    name: str
    data: bytes
    token: object

    def __post_init__(self) -> None:
        if type(self.name) is not str:
            raise TypeError(f"Incoming.name must be str, got {type(self.name).__name__}")
        if type(self.data) is not bytes:
            raise TypeError(f"Incoming.data must be bytes, got {type(self.data).__name__}")

    def __repr__(self) -> str:
        # The data can be megabytes; a log line wants the name and the size.
        return f"Incoming(name={self.name!r}, size={len(self.data)})"


def check_message_name(name: str) -> MessageName:
    """Return the parsed name, or raise InvalidMessageName for anything else."""
    try:
        return MessageName.parse(name)
    except BadFileName as error:
        raise InvalidMessageName(f"refusing to send: {error}") from None


def _as_bytes(data: bytes | bytearray | memoryview) -> bytes:
    if type(data) is bytes:
        return data
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"message data must be bytes, got {type(data).__name__}")


class Transport(abc.ABC):
    """Moves whole message files to and from site inboxes.

    Usable as ``async with``; ``aclose()`` is idempotent.
    """

    #: Set on classes that wrap another transport (``faults+folder``).
    is_wrapper: ClassVar[bool] = False
    #: Bound on the graceful part of ``aclose()`` (logging out, flushing).
    close_timeout: ClassVar[float] = 10.0

    def __init__(self) -> None:
        self._closed = False
        self._warned_refusals: set[Refusal] = set()

    # -- public interface -------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    async def send(self, address: str, name: str, data: bytes) -> None:
        """Make ``name`` visible at ``address`` with ``data``, whole or not at all.

        Sending a name again replaces the earlier copy (or keeps one of them);
        there are never two files of one name at the destination.
        """
        self._check_open()
        check_message_name(name)
        address = self.check_address(address)
        await self._send(address, name, _as_bytes(data))

    def receive(self, address: str, *, wanted: NameFilter | None = None,
                refused: RefusalSink | None = None) -> AsyncIterator[Incoming]:
        """Yield the files waiting at ``address`` in name order; remove nothing.

        Never yields a half-written or temporary file.  Files whose names are
        not message names are yielded too, for the caller to judge.  With
        ``wanted``, a file whose name it refuses is neither read nor yielded
        (``wanted`` is called on the event loop, once per name found).  A
        wanted file the transport will not read (too large, a hard link) is
        told to ``refused`` at each receive that finds it; without
        ``refused`` it is logged as a warning once per file and transport.
        """
        self._check_open()
        if wanted is not None and not callable(wanted):
            raise TypeError(f"wanted must be a callable taking a name, got {type(wanted).__name__}")
        if refused is not None and not callable(refused):
            raise TypeError(f"refused must be a callable taking a Refusal, got {type(refused).__name__}")
        if isinstance(wanted, Screen) and refused is None:
            screen = wanted  # handed on by a wrapper
        else:
            screen = Screen(wanted or every_name, refused or self._warn_once)
        return self._receive(self.check_address(address), screen)

    async def ack(self, incoming: Incoming) -> None:
        """Remove a received file.  Call only once its content is durably stored.

        Acking twice, or acking a file that is already gone, is not an error.
        """
        self._check_open()
        if not isinstance(incoming, Incoming):
            raise TypeError(f"ack() takes an Incoming, got {type(incoming).__name__}")
        await self._ack(incoming)

    async def wait_incoming(self, address: str, timeout: float) -> bool:
        """Return True when new files may be waiting at ``address``, False after ``timeout`` seconds.

        True is said once per arrival: files already reported are not
        reported again, so a caller that receives after True sleeps in the
        next call instead of being woken at once, again and again.
        """
        self._check_open()
        if not isinstance(timeout, (int, float)) or math.isnan(timeout) or timeout < 0:
            raise ValueError(f"timeout must be a number of seconds >= 0, got {timeout!r}")
        return bool(await self._wait_incoming(self.check_address(address), float(timeout)))

    def check_address(self, address: str) -> str:
        """Return ``address`` in the transport's normal form, or raise BadAddress.

        Plugins override this to parse their own address form; the base only
        refuses what no transport can use.
        """
        if type(address) is not str or not address.strip():
            raise BadAddress(f"address must be a non-empty string, got {address!r}")
        if "\x00" in address:
            raise BadAddress(f"address {address!r} contains a NUL character")
        return address

    def check_inbox_address(self, address: str) -> str:
        """``address`` as this site's inbox (what ``receive`` reads), or BadAddress.

        The same as :meth:`check_address` for a transport whose inbox is
        also where peers send (a folder); email refuses ``mailto:`` here.
        """
        return self.check_address(address)

    def check_send_address(self, address: str) -> str:
        """``address`` as where ``send`` delivers to a peer, or BadAddress (email refuses an IMAP URL)."""
        return self.check_address(address)

    async def aclose(self) -> None:
        """Release the transport's resources.  Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            async with asyncio.timeout(self.close_timeout):
                await self._aclose()
        except TimeoutError:
            log.warning("%s: graceful close took over %.0f s; closing anyway",
                        type(self).__name__, self.close_timeout)
        finally:
            # Runs on cancellation too (CancelledError propagates after it).
            self._release()

    async def __aenter__(self) -> "Transport":
        self._check_open()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, traceback: TracebackType | None) -> None:
        await self.aclose()

    def _warn_once(self, refusal: Refusal) -> None:
        """The ``refused`` of a caller that gives none: one warning per file while this transport lives."""
        if refusal in self._warned_refusals:
            return
        if len(self._warned_refusals) >= 10_000:
            self._warned_refusals.clear()
        self._warned_refusals.add(refusal)
        log.warning("%s: left %s at the inbox, not read: %s", type(self).__name__, refusal.name, refusal.reason)

    def _check_open(self) -> None:
        if self._closed:
            raise TransportClosed(f"{type(self).__name__} was used after aclose()")

    # -- hooks for plugins -------------------------------------------------

    @abc.abstractmethod
    async def _send(self, address: str, name: str, data: bytes) -> None:
        """Deliver one file.  ``name`` is a valid message name, ``address`` checked."""

    @abc.abstractmethod
    def _receive(self, address: str, wanted: NameFilter) -> AsyncIterator[Incoming]:
        """An async generator over the files waiting at ``address`` whose
        names ``wanted`` accepts, in name order.  Ask ``wanted`` before
        reading a file, so that a refused one costs no read.  ``wanted`` is
        a :class:`Screen`: report a wanted file left unread with
        ``wanted.refuse(name, reason, identity)`` (or :func:`refuse`).

        It must hold no resources across ``yield`` that need an explicit
        close: the caller may stop iterating at any point.
        """

    @abc.abstractmethod
    async def _ack(self, incoming: Incoming) -> None:
        """Remove the file ``incoming`` was read from, if it is still there."""

    async def _wait_incoming(self, address: str, timeout: float) -> bool:
        # Transports that can be told about new files (IMAP IDLE) override this.
        await asyncio.sleep(timeout)
        return False

    async def _aclose(self) -> None:
        """Graceful part of closing (log out, say goodbye); bounded by close_timeout."""

    def _release(self) -> None:
        """Forceful part of closing: drop sockets, threads, handles.  Must not block."""


class TransportWrapper(Transport):
    """A transport that delegates to another (``wrapper+inner`` in a spec).

    Subclasses override the hooks whose behaviour they change (the ``faults``
    wrapper drops, duplicates, delays ...) and call ``self.inner`` for the rest.
    Closing the wrapper closes the inner transport.
    """

    is_wrapper: ClassVar[bool] = True

    def __init__(self, inner: Transport) -> None:
        super().__init__()
        if not isinstance(inner, Transport):
            raise TypeError(f"{type(self).__name__} wraps a Transport, got {type(inner).__name__}")
        self.inner = inner

    def check_address(self, address: str) -> str:
        return self.inner.check_address(address)

    async def _send(self, address: str, name: str, data: bytes) -> None:
        await self.inner.send(address, name, data)

    def _receive(self, address: str, wanted: NameFilter) -> AsyncIterator[Incoming]:
        return self.inner.receive(address, wanted=wanted)

    async def _ack(self, incoming: Incoming) -> None:
        await self.inner.ack(incoming)

    async def _wait_incoming(self, address: str, timeout: float) -> bool:
        return await self.inner.wait_incoming(address, timeout)

    async def _aclose(self) -> None:
        await self.inner.aclose()

"""The asyncio agent: drives one :class:`~agent.protocol.PairProtocol` per peer
with the site database, the message queues and the transports.

Rules of this file:
* Blocking work (sqlite3, file queues, packing) runs in threads via
  ``asyncio.to_thread``; nothing blocking runs on the event loop.
* Events are handled one at a time, in one task: the protocol core sees a
  strictly sequential history, and actions are carried out in order.
* A pair's state is persisted before the actions that follow a change are
  carried out, and again after them.
* A file is acknowledged to the transport only once it is durably queued
  (or durably quarantined).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import threading
import time
from collections import deque
from datetime import datetime
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable

from codec.atomic import write_file_atomically
from codec.errors import BadFileName, BadSignature, CodecError, InvalidValue, MessageError
from codec.keys import Keyring, PublicKeys
from codec.message import EncodedMessage, check_message, decode_message, encode_control_message, reassemble
from codec.names import Kind, MessageName
from codec.packing import DEFAULT_MAX_SIZE, check_max_size
from transports import Incoming, Transport, TransportError

from .crashpoints import crash_point
from .errors import AgentError
from .keyfiles import agent_directory, load_site_keys, open_site
from .left_files import LeftFiles
from .outbound import SEND_ERRORS, Packed, pack_sends
from .protocol import (Apply, DeleteInbound, PairProtocol, PairState, PurgeOutbound, Quarantine, SendControl,
                       SendData, Settings, StreamStopped)
from .quarantine import QuarantineLimits, QuarantineStore
from .queues import MessageQueues
from .restore import check_restored
from .schedule import sending_due
from .site.errors import LogOffsetError, SiteError
from .spark.engine import SparkBatch, SparkOptions, run_spark_batch
from .spark.errors import SparkBatchCancelled, SparkBatchError
from .spark.export import BatchSend
from .spark.take import TakenFile
from .transport_options import TransportOptions

log = logging.getLogger("fieldsync.agent")
# Files refused on receipt are written to the quarantine in blocks of at most this many files or bytes.
ASIDE_FILES = 256
ASIDE_BYTES = 16 * 1024 * 1024

# Columns of the remote-user row the protocol owns.
_ROW_FIELDS = ("log_send", "log_sent", "confirm_sent", "resend_count", "log_received", "confirm_received",
               "rereceive_count", "peer_incarnation")
# Protocol state kept beside the database (agent bookkeeping, not replicated state).
_EXTRA_FIELDS = ("peer_log_sent", "gap_polls", "request_patience")


def _log_restart(queues: MessageQueues) -> None:
    """Say what opening the spool had to repair after an unclean stop
    (docs/spool-format.md, "Restart"); a clean stop repairs nothing."""
    stats = getattr(queues, "last_restart", None)
    if stats is None:
        return
    where = getattr(queues, "path", "the spool")
    if stats.torn_bytes:
        log.warning("%s: the agent did not stop cleanly: the last %d bytes of the spool's log, an unfinished write, "
                    "were dropped (no step had yet relied on them)", where, stats.torn_bytes)
    if stats.units_backed_out:
        log.info("%s: %d unfinished queue operation(s) of the last run were backed out", where,
                 stats.units_backed_out)
    for problem in getattr(queues, "restart_problems", ()):
        log.warning("%s: %s", where, problem)


def open_queues(database: str | os.PathLike[str]) -> MessageQueues:
    """The message queues of a site's agent: the recovery-log spool in
    ``<db>.agent/spool`` (docs/spool-format.md).  Only one process at a time
    may hold them; offline tools read them with ``agent.spool.check_spool``."""
    from .spool import SpoolQueues

    return SpoolQueues(agent_directory(database) / "spool")


@dataclass(frozen=True, slots=True)
class RunOptions:
    """How ``agent run`` behaves (dbremote's switches in brackets)."""

    transport: str | None = None  # default: the site's configured transport, else folder
    address: str | None = None  # this site's inbox address; default: the site's address
    max_message_size: int = DEFAULT_MAX_SIZE  # [-l]
    group: int = 20  # [-g] accepted for compatibility: each message applies in one transaction
    receive: bool = True  # False: --send-only [-s]
    send: bool = True  # False: --receive-only [-r]
    patience: int = 1  # [-rp]
    resend_urgency: float | None = None  # [-ru]; default: half the send delay
    receive_delay: float = 60.0  # [-rd]
    send_delay: float = 60.0  # [-sd]
    heartbeat_cycles: int = 10  # continuous mode: confirm at least every N send cycles
    seal: bool = True  # seal messages to the peer's X25519 key when it is known
    keep: bool = False  # [-p] received files stay in the message system (not acked)
    # -O NAME=VALUE, for the site's own transport (and others of its plugin)
    transport_options: dict[str, Any] = field(default_factory=dict)
    # -O PREFIX.NAME=VALUE, per transport or wrapper: {"sftp": {...}, "faults": {"seed": 7}}
    named_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    spark: SparkOptions = field(default_factory=SparkOptions)  # large outbound batches (docs/spark.md)
    quarantine: QuarantineLimits = field(default_factory=QuarantineLimits)  # caps (docs/security.md)

    def __post_init__(self) -> None:
        check_max_size(self.max_message_size)
        if not (self.receive or self.send):
            raise AgentError("--receive-only and --send-only exclude each other")
        if self.receive_delay <= 0 or self.send_delay <= 0:
            raise AgentError("receive and send delays must be positive")

    def settings(self, batch: bool) -> Settings:
        urgency = self.resend_urgency
        if urgency is None:
            urgency = 0.0 if batch else self.send_delay / 2
        return Settings(patience=self.patience, resend_urgency=urgency)


class Problems(list[str]):
    """A run's problems of one kind, as one line each: every text once, in
    the order first met, with how often it came (a continuous run meets a
    peer that stays unreachable at every cycle, and must neither grow
    without bound nor repeat itself when it stops); past ``LIMIT`` texts,
    new ones are only counted.  Compares equal to the list of its texts."""

    LIMIT = 100

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}
        self.not_kept = 0

    def append(self, text: str) -> None:
        if text in self.counts:
            self.counts[text] += 1
        elif len(self) >= self.LIMIT:
            self.not_kept += 1
        else:
            self.counts[text] = 1
            super().append(text)


@dataclass(slots=True)
class RunReport:
    """What one run did, per peer and in total."""

    received: int = 0
    applied_messages: int = 0
    quarantined: int = 0
    sent: int = 0
    resend_requests: int = 0
    spark_batches: int = 0  # Spark jobs whose files were queued
    quarantine_dropped: int = 0  # older quarantined files dropped for the quarantine's caps
    left_in_inbox: int = 0  # files at the inbox not read (not for this site, or refused), at the last receive
    transport_errors: Problems = field(default_factory=Problems)
    stopped_streams: Problems = field(default_factory=Problems)

    @property
    def ok(self) -> bool:
        return not self.transport_errors and not self.stopped_streams


@dataclass(slots=True)
class _Peer:
    name: str
    protocol: PairProtocol
    public: PublicKeys | None
    address: str | None
    transport: str | None
    persisted: PairState | None = None


class Agent:
    """One site's agent.  Use as ``async with Agent(path, options) as agent``."""

    def __init__(self, database: str | os.PathLike[str], options: RunOptions | None = None, *,
                 batch: bool = True, clock: Callable[[], float] = time.time,
                 queues: MessageQueues | None = None) -> None:
        self.path = Path(database)
        options = options or RunOptions()
        if options.spark.cancel is None:
            # A Spark job runs in a worker thread that cancelling the agent's
            # task does not reach: the agent needs its own event to stop it.
            options = replace(options, spark=replace(options.spark, cancel=threading.Event()))
        self.options = options
        self.batch = batch
        self.clock = clock
        self.directory = agent_directory(self.path)
        self._queues = queues
        self._transports: dict[str, Transport] = {}
        self.peers: dict[str, _Peer] = {}
        self.report = RunReport()
        self._send_cycles = 0
        self._closed = False
        self._restored = False
        self._last_scheduled: dict[str, datetime] = {}
        # Files a Spark batch made for a peer's due send, taken by _send_data.
        self._prepared: dict[str, tuple[SendData, list[TakenFile]]] = {}
        # Due sends packed and queued here in one pass, taken by _send_data.
        self._packed: dict[str, tuple[SendData, Packed]] = {}
        self.quarantine = QuarantineStore(self.directory / "quarantine", options.quarantine, clock=clock)
        # Files refused on receipt, set aside a block at a time (one thread
        # hop per block, not per file: a flood of junk is read at the speed
        # of its listing).  Bounded by ASIDE_FILES and ASIDE_BYTES.
        self._aside: list[tuple[str | None, str, bytes, str]] = []
        self._aside_bytes = 0

    # -- life cycle ------------------------------------------------------------------

    async def __aenter__(self) -> "Agent":
        try:
            await asyncio.to_thread(self._open)
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def _open(self) -> None:
        if not self.path.exists():
            raise AgentError(f"{self.path}: no such site database (create one with `agent init`)")
        self.db = open_site(self.path)
        identity = self.db.identity
        self.name = identity.name
        self.keys = load_site_keys(self.db)
        self.address = self.options.address or identity.address
        self.left = LeftFiles(self.directory / "state" / "left.json", self.address)
        for table in self.db.missing_tables():
            log.warning("published table %r is no longer in %s (renamed or dropped?): give it back its name, or "
                        "stop publishing it with `agent publication remove %s %s`", table, self.path, self.path, table)
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "state").mkdir(exist_ok=True)
        self.quarantine.secure()
        # The spool first: a run refused because another agent holds it
        # (or it cannot be read) must not count as a run.
        if self._queues is None:
            self._queues = open_queues(self.path)
        _log_restart(self._queues)
        old = check_restored(self.db, self.directory)
        if old is not None:
            log.error("%s was restored from an older copy: it now has a new incarnation id; its peers will "
                      "stop its streams until it is extracted again", self.path)
            self.report.stopped_streams.append(f"{self.name} was restored from an older copy (new incarnation "
                                               f"{self.db.identity.incarnation.hex()[:8]})")
        self.keyring = Keyring()
        self._load_peers()

    def _load_peers(self) -> bool:
        """(Re)build each peer's protocol from its remote-user row when the row
        changed behind the agent's back (a remote added, removed or extracted
        again while the agent runs); return True when anything changed."""
        settings = self.options.settings(self.batch)
        rows = {remote.name: remote for remote in self.db.remotes()}
        changed = False
        for name in list(self.peers):
            if name not in rows:
                del self.peers[name]
                changed = True
        for remote in rows.values():
            peer = self.peers.get(remote.name)
            if peer is not None and peer.persisted is not None and all(
                    getattr(peer.persisted, field) == getattr(remote, field)
                    for field in ("resend_count", "rereceive_count", "peer_incarnation")):
                continue
            changed = True
            public = None
            if remote.public_key:
                try:
                    public = PublicKeys.from_line(remote.public_key)
                    self.keyring.add(public, replace=True)
                except InvalidValue as error:
                    raise AgentError(f"remote {remote.name}: bad public key ({error})") from None
            extras = self._load_extras(remote.name, _stream_key(remote))
            superseded = self._superseded(remote.name, remote.peer_incarnation)
            state = PairState(**{name: getattr(remote, name) for name in _ROW_FIELDS}, **extras)
            protocol = PairProtocol(remote.name, state, settings, superseded=superseded)
            self.peers[remote.name] = _Peer(remote.name, protocol, public, remote.address, remote.transport,
                                            persisted=state)
        return changed

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            async with asyncio.timeout(10):
                for transport in self._transports.values():
                    await transport.aclose()
        finally:
            if self._queues is not None:
                await asyncio.to_thread(self._queues.close)
            db = getattr(self, "db", None)
            if db is not None:
                await asyncio.to_thread(db.close)

    @property
    def transports(self) -> dict[str, Transport]:
        """The transports this agent opened, by spec (tests and tools)."""
        return self._transports

    @property
    def queues(self) -> MessageQueues:
        assert self._queues is not None
        return self._queues

    # -- bookkeeping -------------------------------------------------------------------

    def _extras_path(self, peer: str) -> Path:
        return self.directory / "state" / f"{peer}.json"

    def _superseded(self, peer: str, current: bytes | None) -> frozenset[bytes]:
        """Incarnations ``peer`` had before it was extracted again.

        Extraction records the copy it replaces in the database; the agent
        folder also keeps the ones it has seen replaced in the remote-user
        row (extractions made before the database recorded them).
        """
        replaced = self.db.replaced_incarnations(peer)
        path = self.directory / "state" / f"{peer}.incarnations.json"
        try:
            known = json.loads(path.read_text())
            seen = [bytes.fromhex(value) for value in known.get("seen", [])]
            last = bytes.fromhex(known["current"]) if known.get("current") else None
        except (OSError, ValueError, AttributeError, TypeError):
            seen, last = [], None
        if last is not None and last != current and last not in seen:
            seen.append(last)
        if current is not None or seen:
            record = {"current": current.hex() if current else None, "seen": [value.hex() for value in seen]}
            write_file_atomically(path, json.dumps(record).encode())
        return frozenset(value for value in (*seen, *replaced) if value != current)

    def _load_extras(self, peer: str, stream: list) -> dict[str, int]:
        """The bookkeeping kept beside the database, if it belongs to the
        stream the remote-user row describes now (an extraction starts a new
        stream, and then the old bookkeeping is forgotten)."""
        try:
            data = json.loads(self._extras_path(peer).read_text())
            if data.get("stream") != stream:
                return {}
            return {name: int(data.get(name, 0)) for name in _EXTRA_FIELDS}
        except (OSError, ValueError, AttributeError):
            return {}

    async def _save(self, peer: _Peer) -> None:
        """Persist a pair's state when it changed (compared here: a file
        refused or an idle poll costs no thread hop)."""
        if peer.protocol.state != peer.persisted:
            await asyncio.to_thread(self._persist, peer)

    def _persist(self, peer: _Peer) -> None:
        state = peer.protocol.state
        before = peer.persisted
        if state == before:
            return
        changes = {name: getattr(state, name) for name in _ROW_FIELDS
                   if before is None or getattr(before, name) != getattr(state, name)}
        changes.pop("log_received", None)  # moves only together with applied data
        if changes:
            self.db.update_remote(peer.name, **changes)
        extras: dict[str, Any] = {name: getattr(state, name) for name in _EXTRA_FIELDS}
        if before is None or any(getattr(before, name) != getattr(state, name) for name in _EXTRA_FIELDS + (
                "resend_count", "rereceive_count", "peer_incarnation")):
            extras["stream"] = _stream_key(state)
            write_file_atomically(self._extras_path(peer.name), json.dumps(extras).encode())
        peer.persisted = state

    def _transport_for(self, name: str | None) -> Transport:
        """The transport to a peer whose remote row names ``name`` (``None``:
        this site's own, which it receives on); ``--transport`` overrides
        both.  One per spec, built with the options that are its
        (agent.transport_options)."""
        spec = self.options.transport or name or "folder"
        transport = self._transports.get(spec)
        if transport is None:
            options = TransportOptions(self.options.transport_options, self.options.named_options)
            transport = options.create(spec, own=self.own_transport)
            self._transports[spec] = transport
        return transport

    @property
    def own_transport(self) -> str:
        """The spec of the transport this site receives on."""
        return self.options.transport or self.db.identity.transport or "folder"

    # -- running ------------------------------------------------------------------------

    async def _restore_pending(self) -> None:
        """Tell each pair's protocol about the inbound messages still queued
        from earlier runs (the core keeps no state of its own across runs)."""
        if self._restored:
            return
        self._restored = True
        resolve = getattr(self.queues, "resolve_in_doubt", None)
        if resolve is not None:
            # A dequeue in doubt (the process died between the database commit
            # of an apply and the dequeue's commit) is settled by the database.
            for peer in self.peers.values():
                settled = await asyncio.to_thread(resolve, peer.name, peer.protocol.state.log_received)
                if settled.dequeued or settled.restored:
                    log.info("after an unclean stop, %d message(s) from %s were in doubt: %d had been applied "
                             "(now dequeued), %d had not (queued again)", len(settled.dequeued) + len(settled.restored),
                             peer.name, len(settled.dequeued), len(settled.restored))
        for peer in self.peers.values():
            queued = await asyncio.to_thread(self._queued_headers, peer.name)
            for name, message in queued:
                crash_point("restart.pending")
                await self._execute(peer, peer.protocol.message_queued(self.clock(), name, message.header,
                                                                       message.incarnation))

    def _queued_headers(self, peer: str) -> list[tuple[str, Any]]:
        found = []
        for name in self.queues.inbound(peer):
            try:
                found.append((name, check_message(self.queues.read_inbound(peer, name), source=name,
                                                  keyring=self.keyring, recipient=self.name)))
            except MessageError as error:  # e.g. the peer's key changed since: set it aside
                self._set_aside(peer, name, self.queues.read_inbound(peer, name), str(error))
                self.queues.delete_inbound(peer, [name])
        return found

    async def _refresh(self) -> None:
        if await asyncio.to_thread(self._load_peers):
            self._restored = False
        await self._restore_pending()

    async def run_once(self) -> RunReport:
        """Batch mode: receive and apply everything available, send what is
        due, confirm, flush the outbound queues."""
        await self._refresh()
        if self.options.receive:
            await self.receive_phase()
        if self.options.send:
            await self.send_phase(force_controls=True)
        await self.flush_outbound()
        await asyncio.to_thread(self.db.truncate_log)
        return self.report

    async def run_forever(self, stop: asyncio.Event) -> RunReport:
        """Continuous mode until ``stop`` is set: receive every receive delay
        (sooner when the transport signals new files), send every send delay."""
        await self._restore_pending()
        loop = asyncio.get_running_loop()
        next_receive = next_send = loop.time()
        while not stop.is_set():
            now = loop.time()
            if self.options.receive and now >= next_receive:
                await self._refresh()
                await self.receive_phase()
                next_receive = now + self.options.receive_delay
            if self.options.send and now >= next_send:
                self._send_cycles += 1
                heartbeat = self._send_cycles % max(1, self.options.heartbeat_cycles) == 1
                await self.send_phase(force_controls=heartbeat)
                next_send = now + self.options.send_delay
            await self._timers()
            await self.flush_outbound()
            deadline = min(next_receive if self.options.receive else float("inf"),
                           next_send if self.options.send else float("inf"))
            timer = self._next_timer()
            if timer is not None:
                deadline = min(deadline, loop.time() + max(0.0, timer - self.clock()))
            await self._wait(stop, max(0.0, deadline - loop.time()))
        await self.flush_outbound()
        return self.report

    async def _wait(self, stop: asyncio.Event, timeout: float) -> None:
        if timeout <= 0:
            return
        waiter = asyncio.ensure_future(stop.wait())
        try:
            if self.options.receive and self.address:
                incoming = asyncio.ensure_future(
                    self._transport_for(self.own_transport).wait_incoming(self.address, timeout))
                try:
                    await asyncio.wait({waiter, incoming}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    incoming.cancel()
                    with contextlib.suppress(asyncio.CancelledError, TransportError):
                        await incoming
            else:
                await asyncio.wait({waiter}, timeout=timeout)
        finally:
            waiter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiter

    def _next_timer(self) -> float | None:
        timers = [t for p in self.peers.values() if (t := p.protocol.get_timer()) is not None]
        return min(timers, default=None)

    async def _timers(self) -> None:
        now = self.clock()
        for peer in self.peers.values():
            timer = peer.protocol.get_timer()
            if timer is not None and timer <= now:
                await self._execute(peer, peer.protocol.handle_timer(now))

    # -- receiving -----------------------------------------------------------------------

    async def receive_phase(self) -> None:
        if not self.address:
            raise AgentError(f"site {self.name} has no inbox address; set one with --address")
        transport = self._transport_for(self.own_transport)
        await asyncio.to_thread(self.left.load)
        try:
            async for incoming in transport.receive(self.address, wanted=self._for_this_site):
                await self._receive_file(transport, incoming)
        except TransportError as error:
            self.report.transport_errors.append(f"receiving at {self.address}: {error}")
            log.warning("receiving at %s failed: %s", self.address, error)
        else:
            self.report.left_in_inbox = self.left.met
            await asyncio.to_thread(self.left.end_receive)
        await self._flush_aside()
        # Rule 2-4: apply what became applicable, then look for gaps.
        for peer in self.peers.values():
            await self._execute(peer, peer.protocol.poll(self.clock()))

    async def _receive_file(self, transport: Transport, incoming: Incoming) -> None:
        name_text, data = incoming.name, incoming.data
        if self.options.keep and await asyncio.to_thread(self.quarantine.contains, data):
            # Left in the message system and set aside at an earlier poll.  (A
            # file put back in the inbox without --keep is read afresh.)
            log.debug("%s is in the quarantine already", name_text)
            return
        if not self._for_this_site(name_text):
            return  # a transport that reads what it was told to leave: left all the same
        name = MessageName.parse(name_text)
        peer = self.peers.get(name.sender)
        if peer is None:
            reason = f"from {name.sender}, which is not a peer of {self.name}"
            await self._quarantine_file(None, name_text, data, reason)
            await self._ack(transport, incoming)
            return
        now = self.clock()
        try:
            if name.kind is Kind.CONTROL:
                message = decode_message(data, source=name_text, keyring=self.keyring, recipient=self.name,
                                         recipient_keys=self.keys)
            else:
                message = check_message(data, source=name_text, keyring=self.keyring, recipient=self.name)
            if message.header != name.header or message.sender != name.sender or message.kind is not name.kind:
                raise _Mismatch(name_text)
        except (MessageError, _Mismatch) as error:
            claimed = error.claimed_incarnation if isinstance(error, BadSignature) else None
            if claimed is not None and claimed in peer.protocol.superseded:
                # Late mail from a copy of the peer that was extracted again
                # (with new keys): no message of the peer's current stream,
                # so not counted as a rejected one.  The claim is unverified;
                # it only explains why the file is set aside.
                reason = (f"{error}: it names {peer.name}'s incarnation {claimed.hex()[:8]}, a copy that was "
                          f"extracted again since (late mail from a database that no longer exists)")
                await self._quarantine_file(peer.name, name_text, data, reason)
                await self._ack(transport, incoming)
                return
            await self._quarantine_file(peer.name, name_text, data, str(error))
            await self._ack(transport, incoming)
            await self._execute(peer, peer.protocol.message_rejected(now, name_text, str(error)))
            return
        if (self.options.keep and message.kind is not Kind.CONTROL
                and peer.protocol.already_taken(name_text, message.header, message.incarnation)):
            return  # kept in the message system, and taken in at an earlier poll
        self.report.received += 1
        if message.kind is Kind.CONTROL:
            assert message.control is not None
            await self._execute(peer, peer.protocol.control_received(now, message.control, message.incarnation))
            await self._ack(transport, incoming)
            return
        await asyncio.to_thread(self.queues.put_inbound, peer.name, name_text, data)
        crash_point("receive.after-queue")
        await self._ack(transport, incoming)
        await self._execute(peer, peer.protocol.message_queued(now, name_text, message.header,
                                                               message.incarnation))

    def _for_this_site(self, name_text: str) -> bool:
        """Whether a file at the inbox is this site's to read: a message name
        addressed to it.  Any other is left (and logged once per run)
        without being read: the transports ask this before they download."""
        try:
            name = MessageName.parse(name_text)
        except BadFileName as error:
            self._leave(name_text, str(error))
            return False
        if name.recipient != self.name:
            self._leave(name_text, f"addressed to {name.recipient}, not {self.name}")
            return False
        return True

    def _leave(self, name: str, reason: str) -> None:
        """A file that is not this site's (another name, another recipient)
        stays where it is: the agent removes only what was written for it,
        so a wrong --address costs a warning (once), never someone else's files."""
        self.left.leave(name, f"{reason} (is that this site's inbox?)")

    async def _quarantine_file(self, peer: str | None, name: str, data: bytes, reason: str) -> None:
        """Set aside a file refused on receipt.  It may be acked before its
        block is written: the quarantine is evidence, not state (see
        agent.quarantine), and the protocol counts the file as missing."""
        self._aside.append((peer, name, data, reason))
        self._aside_bytes += len(data)
        self.report.quarantined += 1
        if len(self._aside) >= ASIDE_FILES or self._aside_bytes >= ASIDE_BYTES:
            await self._flush_aside()

    async def _flush_aside(self) -> None:
        block, self._aside, self._aside_bytes = self._aside, [], 0
        if block:
            await asyncio.to_thread(self._put_block, block)

    def _put_block(self, block: list[tuple[str | None, str, bytes, str]]) -> None:
        for peer, name, data, reason in block:
            self.quarantine.put(peer, name, data, reason)
        self.report.quarantine_dropped = self.quarantine.dropped

    def _set_aside(self, peer: str | None, name: str, data: bytes, reason: str) -> None:
        """Every refused file goes through here: into the quarantine, counted."""
        self.quarantine.put(peer, name, data, reason)
        self.report.quarantined += 1
        self.report.quarantine_dropped = self.quarantine.dropped

    async def _ack(self, transport: Transport, incoming: Incoming) -> None:
        """Let the transport remove a file that is durably stored or set aside,
        unless ``--keep`` leaves every file in the message system."""
        if not self.options.keep:
            await transport.ack(incoming)

    # -- carrying out actions ------------------------------------------------------------

    async def _execute(self, peer: _Peer, actions: Iterable[Any]) -> None:
        work = deque(actions)
        try:
            await self._carry_out(peer, work)
        except BaseException:
            # Cancelled or failed half-way: the Apply or SendData the protocol
            # handed out and this did not finish (work[0] is the one under
            # way) are given back to it, so that the agent's next poll or
            # send phase starts them again.
            self._release(peer, work)
            raise

    def _release(self, peer: _Peer, actions: Iterable[Any]) -> None:
        """Give back to the protocol the Apply and SendData of ``actions``,
        which will not be carried out; the other actions are dropped (their
        effects are derived again: duplicates are deleted at the next
        restart, confirmations go out at the next send phase)."""
        now = self.clock()
        for action in actions:
            if isinstance(action, Apply) and peer.protocol.applying == action:
                peer.protocol.apply_aborted(now)
            elif isinstance(action, SendData) and peer.protocol.sending == action:
                peer.protocol.send_aborted(now)

    async def _carry_out(self, peer: _Peer, work: deque[Any]) -> None:
        """Carry out ``work`` in order, with what each action leads to; an
        action leaves ``work`` once it is done."""
        while work:
            action = work[0]
            await self._save(peer)
            more: list[Any] = []
            if isinstance(action, Apply):
                more = await self._apply(peer, action)
            elif isinstance(action, DeleteInbound):
                await asyncio.to_thread(self.queues.delete_inbound, peer.name, action.message_ids)
            elif isinstance(action, Quarantine):
                await asyncio.to_thread(self._quarantine_queued, peer.name, action)
            elif isinstance(action, SendData):
                more = await self._send_data(peer, action)
            elif isinstance(action, PurgeOutbound):
                await asyncio.to_thread(self.queues.purge_outbound, peer.name, action.below_resend_count)
            elif isinstance(action, SendControl):
                try:
                    await asyncio.to_thread(self._queue_control, peer, action)
                except CodecError as error:  # e.g. the peer's sealing key is another site's
                    log.error("preparing a control message for %s failed: %s", peer.name, error)
                    self.report.transport_errors.append(f"preparing a control message for {peer.name}: {error}")
                else:
                    if action.reason == "resend request":
                        self.report.resend_requests += 1
            elif isinstance(action, StreamStopped):
                message = (f"{peer.name} changed its incarnation id ({action.expected.hex()[:8]} -> "
                           f"{action.received.hex()[:8]}): its stream is stopped; re-extract the remote "
                           "or re-add it")
                log.error("%s", message)
                self.report.stopped_streams.append(message)
                await asyncio.to_thread(self.db.record_transport_error, peer.name, message)
            else:  # pragma: no cover - the protocol has no other actions
                raise AgentError(f"unknown action {action!r}")
            work.popleft()
            work.extendleft(reversed(more))
        await self._save(peer)

    def _quarantine_queued(self, peer: str, action: Quarantine) -> None:
        if action.message_id in self.queues.inbound(peer):
            data = self.queues.read_inbound(peer, action.message_id)
            self._set_aside(peer, action.message_id, data, action.reason)
            self.queues.delete_inbound(peer, [action.message_id])

    async def _apply(self, peer: _Peer, action: Apply) -> list[Any]:
        """Carry out ``action`` as one unit (I4): the database transaction,
        the spool's dequeue and the protocol's state go together, so a
        cancelled apply is finished first and the cancellation goes on
        after it (a second cancellation stops the waiting, not the apply)."""
        applying = asyncio.ensure_future(self._apply_now(peer, action))
        try:
            return await asyncio.shield(applying)
        except asyncio.CancelledError:
            self._release(peer, await applying)
            raise

    async def _apply_now(self, peer: _Peer, action: Apply) -> list[Any]:
        now = self.clock()
        try:
            transactions = await asyncio.to_thread(self._load_transactions, peer.name, action.message_ids)
        except MessageError as error:
            log.warning("cannot apply %s from %s: %s", action.message_ids[0], peer.name, error)
            return peer.protocol.apply_aborted(now, quarantine=str(error))
        begin = getattr(self.queues, "begin_dequeue", None)
        token = None
        if begin is not None:
            # The dequeue is in doubt until the database has committed the apply.
            token = await asyncio.to_thread(begin, peer.name, action.message_ids, action.log_received)
        try:
            await asyncio.to_thread(self.db.apply, peer.name, transactions, log_received=action.log_received,
                                    messages=len(action.message_ids), skip_through=action.skip_through,
                                    peer_incarnation=peer.protocol.state.peer_incarnation)
        except SiteError as error:  # the database refused: keep the messages, retry at the next poll
            log.error("applying %s from %s failed: %s", action.message_ids[0], peer.name, error)
            self.report.transport_errors.append(f"applying from {peer.name}: {error}")
            if token is not None:
                await asyncio.to_thread(self.queues.abort_dequeue, token)  # type: ignore[attr-defined]
            return peer.protocol.apply_aborted(now)
        crash_point("apply.after-commit")
        if token is not None:
            await asyncio.to_thread(self.queues.commit_dequeue, token)  # type: ignore[attr-defined]
        self.report.applied_messages += len(action.message_ids)
        peer.persisted = _with(peer.persisted, log_received=action.log_received)
        return peer.protocol.apply_done(now, action.log_received)

    def _load_transactions(self, peer: str, message_ids: tuple[str, ...]) -> list:
        messages = [decode_message(self.queues.read_inbound(peer, message_id), source=message_id,
                                   keyring=self.keyring, recipient=self.name, recipient_keys=self.keys)
                    for message_id in message_ids]
        if messages[0].is_part:
            return [reassemble(messages, source=message_ids[0])]
        return list(messages[0].transactions or ())

    # -- sending --------------------------------------------------------------------------

    async def send_phase(self, *, force_controls: bool) -> None:
        """Scan the log; send to every peer whose schedule is due (batch
        runs: every peer), and confirm.

        The due sends are collected first, so that a large backlog can go to
        one Spark batch (docs/spark.md), or else be packed here in one pass
        over the log for all of them (agent.outbound); then, peer by peer,
        each send is recorded (``log_sent``, once its files are durably
        queued) and the peer's confirmation queued.
        """
        log_end = await asyncio.to_thread(self.db.scan)
        now = self.clock()
        rows = {} if self.batch else {row.name: row for row in await asyncio.to_thread(self.db.remotes)}
        wall = datetime.now().astimezone()
        due: list[tuple[_Peer, SendData | None]] = []
        try:
            for peer in self.peers.values():
                row = rows.get(peer.name)
                # The schedule counts from the last scheduled send of this agent
                # (or the last recorded send), whether or not it carried data.
                last = self._last_scheduled.get(peer.name, row.last_sent_at if row is not None else None)
                if row is None or sending_due(wall, last, send_every=row.send_every, send_at=row.send_at):
                    self._last_scheduled[peer.name] = wall
                    actions = peer.protocol.send_due(now, log_end)
                else:
                    # Not due by its schedule; a resend that was asked for still goes.
                    actions = peer.protocol.handle_timer(now)
                # A SendData is always the last action (after a resend's purge).
                send = actions.pop() if actions and isinstance(actions[-1], SendData) else None
                due.append((peer, send))
                await self._execute(peer, actions)
            sends = [(peer, send) for peer, send in due if send is not None]
            batch, failed = await self._spark_batch(sends)
            try:
                if batch is None and not failed and sends:
                    packed = await asyncio.to_thread(self._pack_local, sends)
                    for (peer, send), outcome in zip(sends, packed):
                        self._packed[peer.name] = (send, outcome)
                for peer, send in due:
                    if send is not None:
                        await self._execute(peer, peer.protocol.send_aborted(self.clock()) if failed else [send])
                    await self._execute(peer, peer.protocol.send_controls(now, force=force_controls))
            finally:
                self._prepared.clear()
                self._packed.clear()
                if batch is not None:
                    await asyncio.to_thread(batch.close)
        except BaseException:
            # Cancelled (an application stopping its agent's task) or failed
            # before every send was done: the sends handed out and not done
            # are given back, so that this agent's next send phase starts them.
            for peer, send in due:
                if send is not None:
                    self._release(peer, [send])
            raise

    async def _spark_batch(self, sends: list[tuple[_Peer, SendData]]) -> tuple[SparkBatch | None, bool]:
        """Run the due sends as one Spark batch when the engine says so;
        return the batch (its files noted for :meth:`_send_data`) and whether
        the sends are to be given up for this run (``--engine spark``
        failed)."""
        spark = self.options.spark
        backlog = sum(send.end - send.start for _, send in sends)
        if not sends or not spark.uses_spark(backlog):
            return None, False
        batch_sends = self._batch_sends(sends)
        log.info("preparing %d sends (backlog %d log offsets) on Spark (%s)", len(sends), backlog, spark.master)
        # The job's own stop event: cancelling this task stops this job (it
        # would run on in its thread) and no later one; the agent's event
        # (options.spark.cancel, stop_spark) stops every job.
        job = threading.Event()
        try:
            batch = await asyncio.to_thread(run_spark_batch, self.db, self.keys, batch_sends,
                                            max_size=self.options.max_message_size, options=spark,
                                            work=spark.work or self.directory / "spark", stop=job)
        except asyncio.CancelledError:
            job.set()
            raise
        except SparkBatchCancelled:
            # The agent is stopping: neither a failure nor a reason to pack here.
            log.warning("the Spark batch of %d sends was stopped; they are left for the next run", len(sends))
            return None, True
        except SparkBatchError as error:
            if spark.engine == "auto":
                log.warning("the Spark batch of %d sends failed, so they are packed here: %s", len(sends), error)
                return None, False
            log.error("the Spark batch of %d sends failed; they are left for the next run: %s", len(sends), error)
            self.report.transport_errors.append(f"Spark batch of {len(sends)} sends: {error}")
            return None, True
        self.report.spark_batches += 1
        for peer, send in sends:
            self._prepared[peer.name] = (send, batch.files[peer.name])
        return batch, False

    async def _send_data(self, peer: _Peer, action: SendData) -> list[Any]:
        prepared = self._prepared.pop(peer.name, None)
        packed = self._packed.pop(peer.name, None)
        try:
            if prepared is not None and prepared[0] == action:
                count = await asyncio.to_thread(self._queue_prepared, peer, action, prepared[1])
            else:
                if packed is None or packed[0] != action:
                    # A send outside a send phase (a resend request acted on later).
                    [outcome] = await asyncio.to_thread(self._pack_local, [(peer, action)])
                else:
                    outcome = packed[1]
                if outcome.error is not None:
                    raise outcome.error  # at the peer's turn, as packing on its own would
                count = outcome.messages
        except (LogOffsetError, *SEND_ERRORS) as error:
            # A range the log cannot serve (its remote row disagrees with the
            # log) fails this peer's send and no other: the peers packed in
            # the same pass are recorded as usual.
            log.error("preparing messages for %s failed: %s", peer.name, error)
            self.report.transport_errors.append(f"preparing messages for {peer.name}: {error}")
            return peer.protocol.send_aborted(self.clock())
        crash_point("send.after-queue")
        await asyncio.to_thread(self.db.record_send, peer.name, log_sent=action.end, messages=count)
        peer.persisted = _with(peer.persisted, log_sent=action.end)
        self.report.sent += count
        return peer.protocol.send_done(self.clock(), action.end)

    def stop_spark(self) -> None:
        """Stop a running Spark job (its processes killed, its folder
        deleted) and keep new ones from starting: the agent is stopping.
        Safe from any thread."""
        assert self.options.spark.cancel is not None
        self.options.spark.cancel.set()

    def _seal_to(self, peer: _Peer) -> PublicKeys | None:
        return peer.public if (self.options.seal and peer.public is not None) else None

    def _batch_sends(self, sends: list[tuple[_Peer, SendData]]) -> list[BatchSend]:
        return [BatchSend(peer.name, send.start, send.end, send.resend_count, self._seal_to(peer))
                for peer, send in sends]

    def _group_commit(self) -> contextlib.AbstractContextManager[Any]:
        """One wait for durability for the puts of a block, where the queues offer it."""
        group = getattr(self.queues, "group_commit", None)
        return group() if group is not None else contextlib.nullcontext()

    def _queue_prepared(self, peer: _Peer, action: SendData, files: list[TakenFile]) -> int:
        """Queue the checked files a Spark batch made for ``action``."""
        with self._group_commit():
            for file in files:
                self.queues.put_outbound(peer.name, file.name, file.read(), action.resend_count)
        return len(files)

    def _pack_local(self, sends: list[tuple[_Peer, SendData]]) -> list[Packed]:
        """Pack ``sends`` here, in one pass over the log, and queue their
        messages as they are made; every put is durable on return.  The
        files of a send that failed stay queued: its log_sent does not
        move, so they are sent again."""
        batch_sends = self._batch_sends(sends)

        def put(index: int, message: EncodedMessage) -> None:
            send = batch_sends[index]
            self.queues.put_outbound(send.subscriber, message.name, message.data, send.resend_count)

        try:
            with self._group_commit():
                return pack_sends(self.db, self.keys, batch_sends, put, max_size=self.options.max_message_size)
        except (AgentError, OSError) as error:
            # The block's wait for durability failed: none of its puts counts as queued.
            return [Packed(0, error) for _ in sends]

    def _queue_control(self, peer: _Peer, action: SendControl) -> None:
        message = encode_control_message(action.state, keys=self.keys, recipient=peer.name,
                                         incarnation=self.db.identity.incarnation, seal_to=self._seal_to(peer))
        self.queues.put_outbound(peer.name, message.name, message.data, None)

    async def flush_outbound(self) -> None:
        """Hand queued outbound files to the transports, oldest first; a
        failing peer keeps its queue and is retried at the next flush."""
        for peer in self.peers.values():
            names = await asyncio.to_thread(self.queues.outbound, peer.name)
            if not names:
                continue
            if not peer.address:
                self.report.transport_errors.append(f"{peer.name} has no address; messages stay queued")
                continue
            transport = self._transport_for(peer.transport)
            try:
                for name in names:
                    data = await asyncio.to_thread(self.queues.read_outbound, peer.name, name)
                    await transport.send(peer.address, name, data)
                    crash_point("flush.after-send")
                    await asyncio.to_thread(self.queues.delete_outbound, peer.name, name)
            except TransportError as error:
                message = f"sending to {peer.name} at {peer.address}: {error}"
                log.warning("%s", message)
                self.report.transport_errors.append(message)
                await asyncio.to_thread(self.db.record_transport_error, peer.name, str(error))


def _stream_key(row: Any) -> list:
    """What identifies one stream of a pair: its epochs and the peer's incarnation."""
    incarnation = row.peer_incarnation.hex() if row.peer_incarnation else None
    return [row.resend_count, row.rereceive_count, incarnation]


class _Mismatch(Exception):
    def __init__(self, name: str) -> None:
        super().__init__(f"{name}: file name does not match the message inside it")


def _with(state: PairState | None, **changes: int) -> PairState | None:
    if state is None:
        return None
    return replace(state, **changes)


async def run_agent(database: str | os.PathLike[str], options: RunOptions, *, once: bool,
                    on_open: Callable[[Agent], None] | None = None) -> RunReport:
    """Run an agent in batch or continuous mode.  ``on_open(agent)`` is
    called on the event loop once the agent is open, before it runs (the
    metrics endpoint reads the agent it is given).

    In continuous mode SIGINT or SIGTERM stop the agent cleanly after the
    current step, and stop a running Spark job at once (its sends are left
    for the next run); a second signal gets the default action.
    """
    async with Agent(database, options, batch=once) as agent:
        if on_open is not None:
            on_open(agent)
        if once:
            return await agent.run_once()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        signals = (signal.SIGINT, signal.SIGTERM)

        def restore_handlers() -> None:
            for signum in signals:
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.remove_signal_handler(signum)

        def stopping() -> None:
            stop.set()
            agent.stop_spark()
            restore_handlers()

        for signum in signals:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signum, stopping)
        try:
            return await agent.run_forever(stop)
        finally:
            restore_handlers()

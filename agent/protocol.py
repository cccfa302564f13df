"""The message-tracking protocol for one pair of sites, both directions.

Rules of this file:
* Sans-I/O: no asyncio, files, sockets, clock or randomness.  Every entry
  point takes ``now`` (seconds, any epoch) and returns a list of actions for
  the caller to carry out, in order (``message_rejected``: the reason to
  set the file aside with).  ``get_timer()`` says when
  ``handle_timer(now)`` wants to run next.
* The caller persists :attr:`PairProtocol.state` whenever it changed
  *before* carrying out the actions that follow (a resend request must not
  leave before the ``rereceive_count`` it carries is durable).
* Receiving side (this site reads the peer's log): ``log_received``,
  ``confirm_received``, ``rereceive_count`` and the pending inbound messages.
  Publishing side (the peer reads this site's log): ``log_send``,
  ``log_sent``, ``confirm_sent``, ``resend_count``.
* Offsets on the receiving side are in the peer's log; on the publishing
  side in this site's log.  Rule numbers refer to docs/protocol.md.
* Misuse by local code raises :class:`LocalProtocolError` (a bug); anything
  a peer sends is handled with actions, never exceptions.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace

from codec.header import Header
from codec.message import ControlState

from .controls import HEARTBEAT_SPREAD, control_due, heartbeat_period, probe_wait  # noqa: F401 (with the core)
# The core's values, imported from here by its callers.
from .pair_values import (Action, Apply, Counters, DeleteInbound, LocalProtocolError,  # noqa: F401
                          PairState, PurgeOutbound, Quarantine, SendControl, SendData, Settings, StreamStopped)


@dataclass(frozen=True, slots=True)
class _Pending:
    sort_key: tuple[int, int, int, int]
    message_id: str
    header: Header
    size: int = 0  # the file's bytes (0: not told)


# Rule 2: consecutive messages applied in one database transaction, at most
# this many and this many bytes of files (the first whatever its size).
CHAIN_MESSAGES = 64
CHAIN_BYTES = 2 * 2**20


@dataclass(slots=True)
class _ResendRequest:
    resend_count: int
    log_received: int
    due: float


class PairProtocol:
    """One pair of sites: this site and ``peer``.

    ``superseded`` holds incarnation ids the peer had before it was
    extracted again: files from such a copy are late mail from a database
    that no longer exists, so they are set aside quietly instead of
    stopping the stream.
    """

    def __init__(self, peer: str, state: PairState, settings: Settings | None = None,
                 superseded: frozenset[bytes] = frozenset(), log_start: int = 0) -> None:
        self.peer = peer
        self.superseded = superseded
        self.settings = settings or Settings()
        self._state = state
        self._pending: dict[str, _Pending] = {}
        self._by_prev: list[tuple[tuple[int, int, int, int], str]] = []
        self._applying: Apply | None = None
        self._singles = 0  # applies left that take one message (after an apply that did not commit)
        self._sending: SendData | None = None
        self._stopped: StreamStopped | None = None
        self._resend_request: _ResendRequest | None = None
        # The log holds the entries after here (rule 8): a resend acted on
        # before the next send_due must not read below it.
        self._log_start = log_start
        self.counters = Counters()

    # -- read-only views ---------------------------------------------------------------

    @property
    def state(self) -> PairState:
        return self._state

    @property
    def stopped(self) -> StreamStopped | None:
        return self._stopped

    @property
    def pending_ids(self) -> tuple[str, ...]:
        return tuple(message_id for _, message_id in self._by_prev)

    def pending_header(self, message_id: str) -> Header:
        """The header of a pending message (KeyError when it is not pending)."""
        return self._pending[message_id].header

    def get_timer(self) -> float | None:
        return None if self._resend_request is None else self._resend_request.due

    def _count(self, **increments: int) -> None:
        self.counters = replace(self.counters, **{name: getattr(self.counters, name) + value
                                                  for name, value in increments.items()})

    # -- receiving side ------------------------------------------------------------------

    def _check_incarnation(self, incarnation: bytes) -> list[Action]:
        known = self._state.peer_incarnation
        if known is None:
            self._state = self._state.evolve(peer_incarnation=incarnation)
            return []
        if known != incarnation and self._stopped is None:
            self._stopped = StreamStopped(known, incarnation)
            return [self._stopped]
        return []

    def message_queued(self, now: float, message_id: str, header: Header, incarnation: bytes, *,
                       queued_earlier: bool = False, size: int = 0, apply: bool = True) -> list[Action]:
        """A data message from the peer is durably in the inbound queue;
        ``queued_earlier``: it was queued before this core was told of it,
        by an earlier run or before the remotes changed (the caller tells
        the core what is queued when it starts), so it did not arrive now:
        the peer is not heard from, and it asks for no answer.  ``size``:
        its file's bytes (rule 2 bounds an apply of several by them);
        ``apply`` False: what it makes applicable waits for
        :meth:`take_applicable` or the next poll (a receive poll queues
        the files waiting first, so consecutive ones go together)."""
        superseded = incarnation in self.superseded
        actions: list[Action] = []
        if not superseded:  # late mail of a replaced copy does not stop the stream
            actions = self._check_incarnation(incarnation)
            if self._stopped is not None and incarnation != self._state.peer_incarnation:
                return actions + [Quarantine(message_id, "sender incarnation changed (site restored or rebuilt?)")]
        if not superseded and not queued_earlier:
            self._heard(now)
        if message_id in self._pending:
            return actions
        if self._stale(header, superseded):
            self._count(stale_deleted=1)
            return actions + [DeleteInbound((message_id,), "stale")]
        if not superseded and not queued_earlier and self._covered(header) and not self._state.confirm_owed:
            # Rule 3: a resend or duplicate of what is applied already (rule
            # 1 deletes it below): the peer sent it again because it lacks
            # the confirmation, so one is owed even though log_received
            # did not move.
            self._state = self._state.evolve(confirm_owed=True)
        sort_key = (header.prev, header.resend_count, header.seq, header.last)
        self._pending[message_id] = _Pending(sort_key, message_id, header, size)
        bisect.insort(self._by_prev, (sort_key, message_id))
        return actions + self._advance(now) if apply else actions

    def take_applicable(self, now: float) -> list[Action]:
        """Rules 1-2 now, without counting a poll: what the messages queued
        with ``apply=False`` made applicable."""
        return self._advance(now)

    def already_taken(self, message_id: str, header: Header, incarnation: bytes) -> bool:
        """Whether queueing this data message now would add nothing: it is
        pending already, or :meth:`message_queued` would delete it at once
        (from a superseded copy, stale, or covered by ``log_received``).
        ``agent run --keep`` reads kept files again at every poll."""
        state, settings = self._state, self.settings
        superseded = incarnation in self.superseded
        if not superseded and incarnation != state.peer_incarnation:
            return False  # a first message, or one that stops the stream: let it through
        if message_id in self._pending or self._stale(header, superseded):
            return True
        if settings.unsafe_without_duplicate_rule:
            return False
        return self._covered(header)

    def _covered(self, header: Header) -> bool:
        """Rule 1: ``log_received`` covers this message (a non-final part
        once ``log_received`` moved past its ``prev``)."""
        if self.settings.unsafe_without_duplicate_rule:
            return False
        log_received = self._state.log_received
        return header.last <= log_received if header.is_final_part else header.prev < log_received

    def _stale(self, header: Header, superseded: bool) -> bool:
        """Rule 1 for one arriving file: its epoch is below rereceive_count.

        A file of a copy replaced by extraction is always of an older epoch
        (extraction started a new one both ways); one in a newer epoch (only
        a lost device that heard the new copy's requests sends one) is
        deleted all the same, whatever the test-only switch says."""
        older = header.resend_count < self._state.rereceive_count
        if superseded:
            return not (older and self.settings.unsafe_without_stale_rule)
        return older and not self.settings.unsafe_without_stale_rule

    def message_rejected(self, now: float, message_id: str, reason: str, *,
                         claimed_incarnation: bytes | None = None) -> str:
        """A file from the peer failed its checks before it was queued;
        return the reason the caller sets it aside with.  It counts as
        missing, nothing else changes; unless the incarnation it claims (an
        unverified claim: the checks failed) is one of a copy of the peer
        extracted again since (with new keys): late mail from a database
        that no longer exists, no message of the current stream, so not
        counted (:meth:`message_queued` judges a verified one so)."""
        if claimed_incarnation is not None and claimed_incarnation in self.superseded:
            return (f"{reason}: it names {self.peer}'s incarnation {claimed_incarnation.hex()[:8]}, a copy that was "
                    f"extracted again since (late mail from a database that no longer exists)")
        self._count(rejected=1)
        return reason

    def poll(self, now: float) -> list[Action]:
        """A receive poll (every receive delay, and once per batch run)."""
        actions = self._advance(now)
        if self._applying is not None or self._stopped is not None:
            return actions
        state = self._state
        if not self._gap_evident():
            if state.gap_polls:
                self._state = state.evolve(gap_polls=0)
            return actions
        patience = state.request_patience or self.settings.patience
        if state.gap_polls < patience:
            # Rule 4: a gap must still be there after `patience` more polls.
            self._state = state.evolve(gap_polls=state.gap_polls + 1)
            return actions
        # The gap outlived patience: ask for a resend.  The next request needs
        # twice the patience (until progress), so a slow resend is not
        # overtaken by another one: no resend storms.
        self._state = state.evolve(gap_polls=0, rereceive_count=state.rereceive_count + 1,
                              request_patience=min(patience * 2, self.settings.max_patience))
        self._count(resend_requests_sent=1)
        actions += self._delete_stale()
        actions.append(self._control("resend request", now))
        return actions

    def apply_done(self, now: float, log_received: int) -> list[Action]:
        """The database committed the last :class:`Apply` with this ``log_received``."""
        applying = self._applying
        if applying is None or log_received != applying.log_received:
            raise LocalProtocolError(f"apply_done({log_received}) without a matching Apply")
        self._applying = None
        if self._singles:
            self._singles -= 1
        for message_id in applying.message_ids:
            self._forget(message_id)
        self._state = self._state.evolve(log_received=log_received, gap_polls=0, request_patience=0)
        self._count(applied_messages=len(applying.message_ids))
        return [DeleteInbound(applying.message_ids, "applied")] + self._advance(now)

    def apply_aborted(self, now: float, quarantine: str | None = None, *, culprit: str | None = None
                      ) -> list[Action]:
        """The last :class:`Apply` did not commit.  With ``quarantine`` (the
        messages cannot ever be applied, e.g. a malformed payload from a faulty
        peer) they are set aside and count as missing, and what is applicable
        without them starts (a receive poll queues every file first: each
        one that fails must not hold the rest back to a poll of its own);
        otherwise they stay queued and are tried again at the next poll.
        ``culprit``: of consecutive messages applied together (rule 2), the
        one that cannot be applied: only it is set aside.  The next applies
        after one of several messages take one message each, as many as it
        held."""
        applying = self._applying
        if applying is None:
            raise LocalProtocolError("apply_aborted without an Apply")
        self._applying = None
        first = self._pending.get(applying.message_ids[0])
        chained = len(applying.message_ids) > 1 and first is not None and not first.header.is_part
        if chained:
            self._singles = max(self._singles, len(applying.message_ids))
        if quarantine is None:
            return []
        actions: list[Action] = []
        for message_id in (culprit,) if chained and culprit in applying.message_ids else applying.message_ids:
            self._forget(message_id)
            self._count(rejected=1)
            actions.append(Quarantine(message_id, quarantine))
        return actions + self._advance(now)

    def _forget(self, message_id: str) -> None:
        pending = self._pending.pop(message_id)
        index = bisect.bisect_left(self._by_prev, (pending.sort_key, message_id))
        del self._by_prev[index]

    def _delete_stale(self) -> list[Action]:
        """Rule 1, after rereceive_count grew: epochs below it are stale."""
        rereceive_count = self._state.rereceive_count
        if self.settings.unsafe_without_stale_rule:
            return []
        stale = [p.message_id for p in self._pending.values() if p.header.resend_count < rereceive_count]
        for message_id in stale:
            self._forget(message_id)
        if not stale:
            return []
        self._count(stale_deleted=len(stale))
        return [DeleteInbound(tuple(stale), "stale")]

    def _delete_duplicates(self) -> list[Action]:
        """Rule 1: messages log_received already covers (a non-final part once
        log_received has moved past its prev).  Only messages with
        prev <= log_received can qualify, and they sort first."""
        log_received = self._state.log_received
        if self.settings.unsafe_without_duplicate_rule:
            return []
        end = bisect.bisect_right(self._by_prev, ((log_received, 2**63, 2**63, 2**63), ""))
        duplicates = [message_id for _, message_id in self._by_prev[:end]
                      if self._covered(self._pending[message_id].header)]
        for message_id in duplicates:
            self._forget(message_id)
        if not duplicates:
            return []
        self._count(duplicates_deleted=len(duplicates))
        return [DeleteInbound(tuple(duplicates), "duplicate")]

    def _advance(self, now: float) -> list[Action]:
        """Rules 1-2: clean up, then start applying the next applicable message."""
        actions = self._delete_duplicates()
        if self._applying is not None or self._stopped is not None:
            return actions
        candidate = self._applicable()
        if candidate is not None and self.settings.unsafe_without_duplicate_rule:
            first = self._pending[candidate.message_ids[0]].header
            candidate = Apply(candidate.message_ids, first.prev, candidate.log_received)
        if candidate is not None:
            self._applying = candidate
            actions.append(candidate)
        return actions

    def _applicable(self) -> Apply | None:
        """Rule 2: a message or complete group with prev <= log_received < last,
        the newest epoch first, and the messages that continue a message
        exactly after it (:meth:`_chained`)."""
        best = self._applicable_at(self._state.log_received)
        if best is None or self._singles or self._pending[best.message_ids[0]].header.is_part:
            return best
        return self._chained(best)

    def _chained(self, first: Apply) -> Apply:
        """``first`` (one message, not a part) and the pending messages rule
        2 would apply after it, each not a part and starting where the one
        before ends, within CHAIN_MESSAGES and CHAIN_BYTES."""
        ids = [first.message_ids[0]]
        size = self._pending[ids[0]].size
        last = first.log_received
        while len(ids) < CHAIN_MESSAGES:
            following = self._applicable_at(last)
            if following is None:
                break
            pending = self._pending[following.message_ids[0]]
            header = pending.header
            if header.is_part or header.prev != last or size + pending.size > CHAIN_BYTES:
                break
            ids.append(pending.message_id)
            size += pending.size
            last = header.last
        return first if len(ids) == 1 else Apply(tuple(ids), first.skip_through, last)

    def _applicable_at(self, log_received: int) -> Apply | None:
        """Rule 2 with ``log_received`` where it is or where an apply would take it."""
        end = bisect.bisect_right(self._by_prev, ((log_received, 2**63, 2**63, 2**63), ""))
        best: Apply | None = None
        best_epoch = -1
        groups: dict[tuple[int, int], list[_Pending]] = {}
        for _, message_id in self._by_prev[:end]:
            pending = self._pending[message_id]
            header = pending.header
            if header.is_part:
                groups.setdefault((header.resend_count, header.prev), []).append(pending)
            elif header.last > log_received and header.resend_count > best_epoch:
                best = Apply((message_id,), log_received, header.last)
                best_epoch = header.resend_count
        for (epoch, _), members in groups.items():
            members.sort(key=lambda p: p.header.seq)
            final = members[-1].header
            complete = (final.is_final_part and final.seq == len(members) - 1
                        and all(m.header.seq == index for index, m in enumerate(members)))
            if complete and final.last > log_received and epoch > best_epoch:
                best = Apply(tuple(m.message_id for m in members), log_received, final.last)
                best_epoch = epoch
        return best

    def _gap_evident(self) -> bool:
        """Something is known to be missing: a later message waits, or the
        peer said it sent beyond what arrived."""
        return bool(self._pending) or self._state.peer_log_sent > self._state.log_received

    # -- control messages ------------------------------------------------------------

    def control_received(self, now: float, control: ControlState, incarnation: bytes) -> list[Action]:
        """A control message from the peer (fields are monotone: merge by max)."""
        if incarnation in self.superseded:
            return []
        actions = self._check_incarnation(incarnation)
        if self._stopped is not None and incarnation != self._state.peer_incarnation:
            return actions
        self._heard(now)
        state = self._state
        # Receiving side: the peer's view of what it has sent (tail-loss detection),
        # and publishing side, rule 6: a confirmation.  One sent before this
        # epoch of the stream began (the peer had not yet asked for it) is
        # ignored: after an extraction it counts offsets of the old copy's
        # log, and otherwise a later confirmation says at least as much.
        peer_log_sent = max(state.peer_log_sent, control.log_sent)
        confirmed = state.confirm_sent
        if control.rereceive_count >= state.resend_count:
            confirmed = max(confirmed, min(control.log_received, state.log_sent))
        # Rule 3: a control that asks for a confirmation (a probe) is answered
        # when this site has all the peer announced (else rule 4 answers with
        # a resend request); one that does not ask says the peer holds a
        # confirmation of all it sent, up to the log_sent it carries.
        peer_confirmed, owed = state.peer_confirmed, state.confirm_owed
        request_patience = state.request_patience
        if control.asks_confirmation:
            owed = owed or state.log_received >= control.log_sent
            if control.log_sent > state.log_received:
                # Rule 4: the publisher probes a confirm timeout after its
                # last message and still misses what it announced, so the
                # last resend request (or the resend) was lost: the next one
                # goes after --patience polls again, not the doubled wait.
                request_patience = 0
        else:
            peer_confirmed = max(peer_confirmed, control.log_sent)
        probes = 0 if confirmed != state.confirm_sent else state.probes
        # The peer's schema version, merged by max like the rest (a late
        # control message cannot lower it); one that says none leaves it.
        schema_version = state.peer_schema_version
        if control.schema_version is not None and (schema_version is None or control.schema_version > schema_version):
            schema_version = control.schema_version
        if (peer_log_sent, confirmed, peer_confirmed, owed, probes, request_patience, schema_version) != (
                state.peer_log_sent, state.confirm_sent, state.peer_confirmed, state.confirm_owed, state.probes,
                state.request_patience, state.peer_schema_version):
            self._state = state.evolve(peer_log_sent=peer_log_sent, confirm_sent=confirmed,
                                  peer_confirmed=peer_confirmed, confirm_owed=owed, probes=probes,
                                  request_patience=request_patience, peer_schema_version=schema_version)
        # Rule 7: a resend request, acted on after the urgency delay.
        if control.rereceive_count > self._state.resend_count:
            request = self._resend_request
            if request is None:
                self._resend_request = _ResendRequest(control.rereceive_count, control.log_received,
                                                      now + self.settings.resend_urgency)
            else:
                request.resend_count = max(request.resend_count, control.rereceive_count)
                request.log_received = max(request.log_received, control.log_received)
            actions += self.handle_timer(now)
        return actions

    def _heard(self, now: float) -> None:
        """A message of the peer's current copy arrived.  The peer is
        reachable again: the probe backoff (rule 3) starts over."""
        if self._state.heard_at is None or now > self._state.heard_at:
            self._state = self._state.evolve(heard_at=now)
        if self._state.probes:
            self._state = self._state.evolve(probes=0)

    def handle_timer(self, now: float) -> list[Action]:
        request = self._resend_request
        if request is None or now < request.due or self._sending is not None:
            return []
        self._resend_request = None
        state = self._state
        if request.resend_count <= state.resend_count:
            return []
        confirm_sent = max(state.confirm_sent, min(request.log_received, state.log_sent))
        # The peer has all that was sent: what was read for it and held
        # nothing stays read.  Else the log is read again from confirm_sent.
        log_read = state.log_read if confirm_sent >= state.log_sent else confirm_sent
        self._state = state.evolve(resend_count=request.resend_count, confirm_sent=confirm_sent,
                              log_sent=confirm_sent, log_read=log_read,
                              log_send=max(state.log_send, state.read_through))
        self._count(resends_done=1)
        return [PurgeOutbound(request.resend_count)] + self._start_send()

    def send_controls(self, now: float, *, heartbeat: float | None = None, confirm_timeout: float | None = None,
                      force: bool = False) -> list[Action]:
        """The send phase, rule 3: at most one control message, when it says
        something the peer needs: a confirmation when ``log_received`` moved
        since the last one, or one that is owed (data went to a peer not
        known to hold it, a probe or a duplicate arrived); a probe when the
        stream to the peer is unconfirmed and nothing went to the peer for
        :func:`probe_wait` seconds (``confirm_timeout``; None: no probes);
        with ``heartbeat`` (seconds), a heartbeat when no control message
        went to the peer for that long, less the peer's share of it
        (:func:`heartbeat_period`).  ``force``: confirm anyway (an
        operator's explicit request; tests)."""
        reason = control_due(self.peer, self._state, now, heartbeat=heartbeat, confirm_timeout=confirm_timeout,
                             force=force)
        if reason is None:
            return []
        if reason == "probe":
            self._state = self._state.evolve(probes=self._state.probes + 1)
            self._count(probes_sent=1)
        return [self._control(reason, now)]

    def _control(self, reason: str, now: float) -> SendControl:
        """A control message with this site's view of the pair; it asks for
        a confirmation while the stream to the peer is unconfirmed, and
        confirms ``log_received`` (so it pays what was owed)."""
        state = self._state
        self._state = state = state.evolve(confirm_received=state.log_received, control_sent_at=now,
                                      confirm_owed=False)
        self._count(controls_sent=1)
        return SendControl(ControlState(log_received=state.log_received, rereceive_count=state.rereceive_count,
                                        log_sent=state.log_sent, resend_count=state.resend_count,
                                        asks_confirmation=state.unconfirmed), reason)

    # -- publishing side -------------------------------------------------------------

    def send_due(self, now: float, log_end: int, log_start: int = 0, *, scheduled: bool = True) -> list[Action]:
        """A send phase: everything committed up to ``log_end`` is due; the
        log holds the entries after ``log_start`` (rule 8).  ``scheduled``
        False: the peer's send schedule (SEND EVERY, SEND AT) is not due,
        so nothing new is; only a resend asked for goes (rule 7)."""
        self.log_truncated(log_start)
        if not scheduled:
            return self.handle_timer(now)
        state = self._state
        if log_end > state.log_send:
            self._state = state.evolve(log_send=log_end)
        return self.handle_timer(now) + self._start_send()

    def log_truncated(self, log_start: int) -> None:
        """The log now holds only the entries after ``log_start`` (rule 8)."""
        self._log_start = max(self._log_start, log_start)

    def _start_send(self) -> list[Action]:
        state = self._state
        # What the log truncated after confirm_sent held nothing for the peer
        # (rule 8): a send that starts before the truncation reads from it.
        read = max(state.read_through, min(self._log_start, state.log_send))
        if self._sending is not None or state.log_send <= read:
            return []
        self._sending = SendData(state.log_sent, state.log_send, state.resend_count,
                                 read_from=read if read > state.log_sent else None)
        return [self._sending]

    @property
    def applying(self) -> Apply | None:
        """The :class:`Apply` handed out and not yet done or aborted."""
        return self._applying

    @property
    def sending(self) -> SendData | None:
        """The :class:`SendData` handed out and not yet done or aborted."""
        return self._sending

    def send_done(self, now: float, log_sent: int, *, empty: bool = False) -> list[Action]:
        """The messages of the last :class:`SendData` are durably queued;
        ``empty``: its range held nothing for the peer, and no message was
        made (rule 5: no message without news; only ``log_read`` moves).
        A send of an epoch replaced meanwhile moves nothing."""
        sending = self._sending
        if sending is None or log_sent != sending.end:
            raise LocalProtocolError(f"send_done({log_sent}) without a matching SendData")
        self._sending = None
        state = self._state
        if sending.resend_count == state.resend_count and sending.start == state.log_sent:
            if empty:
                self._state = state.evolve(log_read=max(state.log_read, log_sent))
            else:
                # Rule 3: a confirmation goes with the data unless the peer
                # is known to hold it; the stream changed, so probes start over.
                self._state = state.evolve(log_sent=log_sent, log_read=max(state.log_read, log_sent),
                                      data_sent_at=now, probes=0,
                                      confirm_owed=state.confirm_owed or state.peer_confirmed < state.log_received)
        return self.handle_timer(now) + self._start_send()

    def send_aborted(self, now: float) -> list[Action]:
        """The last :class:`SendData` failed before log_sent could move; retry later."""
        if self._sending is None:
            raise LocalProtocolError("send_aborted without a SendData")
        self._sending = None
        return []

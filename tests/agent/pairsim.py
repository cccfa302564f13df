"""A pure simulation of one publisher and one subscriber around the protocol core.

Only for the core's unit tests: the "log" is a list of commit offsets, a
"message" is a list of commits, the "database" a list of applied commits.
Faults are applied by the test to the in-flight list.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from agent.protocol import (Apply, DeleteInbound, PairProtocol, PairState, PurgeOutbound, Quarantine, SendControl,
                            SendData, Settings, StreamStopped)
from codec.header import Header

INCARNATION_P = b"P" * 16
INCARNATION_S = b"S" * 16


@dataclass
class Flight:
    message_id: str
    kind: str  # "data" or "control"
    header: Header | None = None
    commits: tuple[int, ...] = ()
    control: object = None
    incarnation: bytes = INCARNATION_P
    corrupt: bool = False


@dataclass
class Pair:
    """P publishes its log to S; S sends controls back (S's own log is empty)."""

    settings: Settings = field(default_factory=Settings)
    per_message: int = 3
    big: frozenset[int] = frozenset()  # commits that travel as 3-part groups
    others: set[int] = field(default_factory=set)  # commits that hold nothing for S
    log: list[int] = field(default_factory=list)
    to_s: list[Flight] = field(default_factory=list)
    to_p: list[Flight] = field(default_factory=list)
    applied: list[int] = field(default_factory=list)
    inbox: dict[str, Flight] = field(default_factory=dict)  # S's durable inbound queue
    outbox_epochs: list[tuple[int, Flight]] = field(default_factory=list)
    stopped: list[StreamStopped] = field(default_factory=list)
    quarantined: list[str] = field(default_factory=list)
    now: float = 0.0

    def __post_init__(self) -> None:
        self.p = PairProtocol("S", PairState(), self.settings)  # at P, about S
        self.s = PairProtocol("P", PairState(), self.settings)  # at S, about P
        self._serial = 0

    # -- P -----------------------------------------------------------------------
    def commit(self, count: int = 1, *, for_s: bool = True) -> None:
        for _ in range(count):
            self.log.append((self.log[-1] if self.log else 0) + random.Random(len(self.log)).randint(1, 9))
            if not for_s:
                self.others.add(self.log[-1])

    @property
    def log_s(self) -> list[int]:
        """The commits that hold something for S."""
        return [c for c in self.log if c not in self.others]

    def p_run(self, actions) -> None:
        for action in actions:
            if isinstance(action, SendData):
                made = self._pack(action)
                self.p_run(self.p.send_done(self.now, action.end, empty=not made))
            elif isinstance(action, PurgeOutbound):
                self.outbox_epochs = [(e, f) for e, f in self.outbox_epochs if e >= action.below_resend_count]
            elif isinstance(action, SendControl):
                self._control(self.to_s, action, INCARNATION_P)
            elif isinstance(action, StreamStopped):
                self.stopped.append(action)
            else:  # pragma: no cover - P receives no data in this simulation
                raise AssertionError(action)

    def _pack(self, send: SendData) -> int:
        """Queue the messages of ``send``; return how many were made."""
        assert all(c in self.others for c in self.log if send.start < c <= send.read_start), "read_from skips data"
        commits = [c for c in self.log if send.read_start < c <= send.end and c not in self.others]
        prev = send.start
        chunks: list[list[int]] = []
        for commit in commits:
            if commit in self.big:
                chunks.append([commit])
                chunks.append([])
            elif chunks and chunks[-1] and len(chunks[-1]) < self.per_message and chunks[-1][0] not in self.big:
                chunks[-1].append(commit)
            else:
                chunks.append([commit])
        chunks = [c for c in chunks if c]
        if not chunks:
            return 0  # nothing for S: no message (rule 5)
        made = 0
        for index, chunk in enumerate(chunks):
            last = send.end if index == len(chunks) - 1 else chunk[-1]
            if chunk and chunk[0] in self.big:
                for seq in range(3):
                    header = Header(send.resend_count, prev, last if seq == 2 else prev, seq)
                    self._enqueue(send.resend_count, Flight(self._name(header), "data", header,
                                                            tuple(chunk) if seq == 2 else ()))
            else:
                header = Header(send.resend_count, prev, last, 0)
                self._enqueue(send.resend_count, Flight(self._name(header), "data", header, tuple(chunk)))
            made += 1
            prev = last
        return made

    def _name(self, header: Header) -> str:
        return f"P.S.d.{header.resend_count:010d}-{header.prev:019d}-{header.last:019d}-{header.seq:010d}"

    def _enqueue(self, epoch: int, flight: Flight) -> None:
        self.outbox_epochs.append((epoch, flight))

    def flush_outbox(self) -> None:
        """P's transport sends whatever is queued."""
        self.to_s.extend(f for _, f in self.outbox_epochs)
        self.outbox_epochs = []

    def _control(self, queue: list[Flight], action: SendControl, incarnation: bytes) -> None:
        self._serial += 1
        queue.append(Flight(f"control-{self._serial}", "control", control=action.state, incarnation=incarnation))

    # -- S -----------------------------------------------------------------------
    def s_run(self, actions) -> None:
        for action in actions:
            if isinstance(action, Apply):
                commits = [c for m in action.message_ids for c in self.inbox[m].commits]
                assert commits == sorted(commits)
                for commit in commits:
                    if commit > action.skip_through:
                        assert commit not in self.applied, f"double apply of {commit}"
                        self.applied.append(commit)
                self.s_run(self.s.apply_done(self.now, action.log_received))
            elif isinstance(action, DeleteInbound):
                for message_id in action.message_ids:
                    del self.inbox[message_id]
            elif isinstance(action, Quarantine):
                self.quarantined.append(action.message_id)
                self.inbox.pop(action.message_id, None)
            elif isinstance(action, SendControl):
                self._control(self.to_p, action, INCARNATION_S)
            elif isinstance(action, StreamStopped):
                self.stopped.append(action)
            else:  # pragma: no cover
                raise AssertionError(action)

    # -- driving -----------------------------------------------------------------
    def deliver_to_s(self) -> None:
        flights, self.to_s = self.to_s, []
        for flight in flights:
            if flight.kind == "control":
                self.s_run(self.s.control_received(self.now, flight.control, flight.incarnation))
            elif flight.corrupt:
                # As the agent does: a file that fails its checks is set
                # aside with the reason the protocol gives.
                self.s.message_rejected(self.now, flight.message_id, "bad signature")
                self.quarantined.append(flight.message_id)
            else:
                if flight.message_id not in self.inbox:
                    self.inbox[flight.message_id] = flight
                self.s_run(self.s.message_queued(self.now, flight.message_id, flight.header, flight.incarnation))

    def deliver_to_p(self) -> None:
        flights, self.to_p = self.to_p, []
        for flight in flights:
            self.p_run(self.p.control_received(self.now, flight.control, flight.incarnation))

    def cycle(self, *, force_controls: bool = True, heartbeat: float | None = None) -> None:
        """One round of both agents: P sends what is due, S receives, polls and confirms."""
        self.now += 60.0
        self.p_run(self.p.handle_timer(self.now))
        self.p_run(self.p.send_due(self.now, self.log[-1] if self.log else 0))
        self.p_run(self.p.send_controls(self.now, heartbeat=heartbeat, force=force_controls))
        self.flush_outbox()
        self.deliver_to_s()
        self.s_run(self.s.poll(self.now))
        self.s_run(self.s.send_controls(self.now, heartbeat=heartbeat, force=force_controls))
        self.deliver_to_p()

    def check_invariants(self) -> None:
        p, s = self.p.state, self.s.state
        end = self.log[-1] if self.log else 0
        assert p.confirm_sent <= p.log_sent <= p.read_through <= max(end, p.log_send), "I1"
        expected = [c for c in self.log_s if c <= s.log_received]
        assert self.applied == expected, "I2"
        # Rule 8: the log P may truncate holds nothing S still needs.
        assert all(c <= s.log_received for c in self.log_s if c <= p.horizon), "rule 8"

    def quiescent(self) -> bool:
        end = self.log[-1] if self.log else 0
        p, s = self.p.state, self.s.state
        return p.horizon == p.read_through == end and s.log_received == p.log_sent

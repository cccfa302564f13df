"""A pure simulation of two sites, A and B, that both publish and both receive.

Each site has its own log of commits, ONE :class:`PairProtocol` about the
other (as the agent has), a durable inbound queue (``inbox``) and the list
of the peer's commits applied here.  ``run(name)`` is one ``agent run
--once`` of a site (agent/runner.py ``run_once``): the protocol is rebuilt
from the persisted :class:`PairState` and told what is queued (restart, as
``Resumer.tell_queued``), the delivered files are received in name
order (as the folder transport lists them: data -> ``message_queued``,
control -> ``control_received``, corrupt -> ``message_rejected``), then a
poll, then the send phase (``send_due`` for the log end, data packed a few
commits per message, ``send_controls``), then the log is truncated at the
horizon (rule 8) and the outbound queue flushed into the peer's in-flight
list.  ``restart=False`` keeps the protocol objects between runs instead (a
continuous agent: resend timers survive).

Applying a peer's commits appends entries to the local log that hold
nothing for the peer (``echo``: their origin is the peer, rule 5), so
empty sends and ``log_read`` are part of every run.  Virtual time is the
explicit ``now``; there is no randomness.  In-flight files are
``(hold, File)``: a file with ``hold > 0`` skips that many deliveries (a
delayed, hence reordered, file).  Faults are applied by the tests to
``flight``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, fields

from agent.controls import probe_wait
from agent.protocol import (Apply, DeleteInbound, PairProtocol, PairState, PurgeOutbound, Quarantine, SendControl,
                            SendData, Settings, StreamStopped)
from codec.header import Header
from codec.message import ControlState

INCARNATION = {"A": b"A" * 16, "B": b"B" * 16}
OTHER = {"A": "B", "B": "A"}
_FIELDS = tuple(f.name for f in fields(PairState))
_TIMES = ("control_sent_at", "data_sent_at")


@dataclass(frozen=True)
class File:
    name: str
    header: Header | None = None  # data
    commits: tuple[int, ...] = ()
    control: ControlState | None = None
    corrupt: bool = False

    @property
    def is_data(self) -> bool:
        return self.control is None


@dataclass
class Site:
    name: str
    log: list[int] = field(default_factory=list)  # commit offsets of this site's log
    echoes: set[int] = field(default_factory=set)  # entries that hold nothing for the peer
    state: PairState = field(default_factory=PairState)  # persisted, about the peer
    inbox: dict[str, File] = field(default_factory=dict)  # the durable inbound queue
    applied: list[int] = field(default_factory=list)  # the peer's commits applied here, in order
    log_start: int = 0  # rule 8: the entries up to here were truncated
    later: int = 0  # commits made at the first run after something of the peer's was applied
    last_applied: File | None = None  # the data file applied last (a fault may deliver it again)
    protocol: PairProtocol | None = None  # kept between runs only with restart=False

    def for_peer(self) -> list[int]:
        return [c for c in self.log if c not in self.echoes]

    def clone(self) -> "Site":
        assert self.protocol is None, "only a restarting simulation can be copied"
        return Site(self.name, list(self.log), set(self.echoes), self.state, dict(self.inbox), list(self.applied),
                    self.log_start, self.later, self.last_applied)


class Duplex:
    def __init__(self, commits_a: int = 0, commits_b: int = 0, *, per_message: int = 1,
                 settings: Settings | None = None, heartbeat: float | None = None,
                 confirm_timeout: float | None = None, restart: bool = True, echo: bool = True) -> None:
        self.settings = settings or Settings(resend_urgency=0.0)  # batch runs act on requests at once
        self.per_message, self.heartbeat, self.confirm_timeout = per_message, heartbeat, confirm_timeout
        self.restart, self.echo = restart, echo
        self.sites = {"A": Site("A"), "B": Site("B")}
        self.flight: dict[str, list[tuple[int, File]]] = {"A": [], "B": []}  # files on their way TO a site
        self.now = 0.0
        self.sent: list[tuple[float, str, str]] = []  # (now, sender, "data" or the control's reason)
        self.errors: list[str] = []  # sends that failed, as the runner reports them
        self.commit("A", commits_a)
        self.commit("B", commits_b)

    def clone(self) -> "Duplex":
        copy = object.__new__(Duplex)
        copy.__dict__.update(self.__dict__)
        copy.sites = {name: site.clone() for name, site in self.sites.items()}
        copy.flight = {name: list(files) for name, files in self.flight.items()}
        copy.sent, copy.errors = [], list(self.errors)
        return copy

    def commit(self, name: str, count: int = 1, *, echo: bool = False) -> None:
        site = self.sites[name]
        for _ in range(count):
            site.log.append((site.log[-1] if site.log else 0) + 1)
            if echo:
                site.echoes.add(site.log[-1])

    # -- one run of a site ---------------------------------------------------------------
    def run(self, name: str, now: float | None = None) -> list[File]:
        """One ``run --once`` of site ``name``; returns the files it sent."""
        if now is not None:
            self.now = now
        now, site, peer = self.now, self.sites[name], OTHER[name]
        if site.later and site.applied:
            self.commit(name, site.later)
            site.later = 0
        out: list[tuple[int | None, File]] = []
        proto = site.protocol
        if proto is None:
            proto = PairProtocol(peer, site.state, self.settings, log_start=site.log_start)  # PairStore.load
            for message_id in sorted(site.inbox):  # Resumer.tell_queued
                self._do(site, proto, proto.message_queued(now, message_id, site.inbox[message_id].header,
                                                           INCARNATION[peer], queued_earlier=True), out)
        arrived = sorted((f for hold, f in self.flight[name] if hold == 0), key=lambda f: f.name)
        self.flight[name] = [(hold - 1, f) for hold, f in self.flight[name] if hold > 0]
        for file in arrived:
            if file.corrupt:  # set aside before the protocol hears of it (agent.receiving)
                proto.message_rejected(now, file.name, "corrupt")
                actions = []
            elif file.control is not None:
                actions = proto.control_received(now, file.control, INCARNATION[peer])
            else:
                site.inbox.setdefault(file.name, file)
                actions = proto.message_queued(now, file.name, file.header, INCARNATION[peer])
            self._do(site, proto, actions, out)
        self._do(site, proto, proto.poll(now), out)
        self._do(site, proto, proto.send_due(now, site.log[-1] if site.log else 0, site.log_start), out)
        self._do(site, proto, proto.send_controls(now, heartbeat=self.heartbeat,
                                                  confirm_timeout=self.confirm_timeout), out)
        assert proto.applying is None and proto.sending is None
        # A batch run keeps no timer: a resend request still waiting for its
        # urgency would be lost with the process (run --once acts at once).
        assert not self.restart or proto.get_timer() is None, "a resend request is left waiting"
        assert set(proto.pending_ids) == set(site.inbox), "the inbox is the pending messages' durable copy"
        site.state = proto.state
        site.log_start = max(site.log_start, site.state.horizon)  # Agent.run_once: db.truncate_log()
        proto.log_truncated(site.log_start)  # as a continuous agent tells its protocols
        if not self.restart:
            site.protocol = proto
        files = [f for _, f in out]
        self.flight[peer] += [(0, f) for f in files]  # Sender.flush
        return files

    def _do(self, site: Site, proto: PairProtocol, actions: list, out: list[tuple[int | None, File]]) -> None:
        """Carry out actions in order, each one's consequences first (Agent._carry_out)."""
        work = list(actions)
        while work:
            action, more = work.pop(0), []
            if isinstance(action, Apply):
                files = [site.inbox[m] for m in action.message_ids]
                assert all(f.header.resend_count >= proto.state.rereceive_count for f in files), "I3: stale applied"
                commits = [c for f in files for c in f.commits]
                assert commits == sorted(commits)
                for commit in commits:
                    if commit > action.skip_through:
                        assert commit not in site.applied, f"double apply of {commit}"
                        site.applied.append(commit)
                        if self.echo:
                            self.commit(site.name, echo=True)
                site.last_applied = files[-1]
                more = proto.apply_done(self.now, action.log_received)
            elif isinstance(action, (DeleteInbound, Quarantine)):
                for message_id in getattr(action, "message_ids", None) or (action.message_id,):
                    site.inbox.pop(message_id, None)
            elif isinstance(action, SendData):
                more = self._send(site, proto, action, out)
            elif isinstance(action, PurgeOutbound):
                out[:] = [(e, f) for e, f in out if e is None or e >= action.below_resend_count]
            elif isinstance(action, SendControl):
                state = action.state
                digest = hashlib.sha256(repr(state).encode()).hexdigest()[:16]
                name = (f"{site.name}.{OTHER[site.name]}.c.{state.rereceive_count:010d}-{0:019d}-"
                        f"{state.log_received:019d}-{int(state.asks_confirmation):010d}.{digest}")
                out.append((None, File(name, control=state)))
                self.sent.append((self.now, site.name, action.reason))
            else:  # pragma: no cover - no incarnation changes here
                assert not isinstance(action, StreamStopped), action
                raise AssertionError(action)
            work[:0] = more

    def _send(self, site: Site, proto: PairProtocol, send: SendData, out: list) -> list:
        """Pack (start, end] a few commits per message (pairsim._pack); a
        range the truncated log cannot serve fails, as the runner reports it."""
        if send.read_start < site.log_start:
            self.errors.append(f"{site.name}: {send} reads from {send.read_start}, the log starts after "
                               f"{site.log_start}")
            return proto.send_aborted(self.now)
        assert not [c for c in site.for_peer() if send.start < c <= send.read_start], "read_from skips data"
        commits = [c for c in site.for_peer() if send.read_start < c <= send.end]
        chunks = [commits[i:i + self.per_message] for i in range(0, len(commits), self.per_message)]
        prev = send.start
        for index, chunk in enumerate(chunks):
            last = send.end if index == len(chunks) - 1 else chunk[-1]
            header = Header(send.resend_count, prev, last, 0)
            name = f"{site.name}.{OTHER[site.name]}.d.{send.resend_count:010d}-{prev:019d}-{last:019d}-{0:010d}"
            out.append((send.resend_count, File(name, header, tuple(chunk))))
            self.sent.append((self.now, site.name, "data"))
            prev = last
        return proto.send_done(self.now, send.end, empty=not chunks)

    # -- checks ----------------------------------------------------------------------------
    def check_invariants(self) -> None:
        for name, pub in self.sites.items():
            rec, p = self.sites[OTHER[name]], pub.state
            end = pub.log[-1] if pub.log else 0
            assert p.confirm_sent <= p.log_sent <= p.read_through <= end, f"I1 at {name}: {p}"
            assert rec.applied == [c for c in pub.for_peer() if c <= rec.state.log_received], f"I2 {name}->"
            # Rule 8: what the publisher may delete, or deleted, the peer has.
            assert all(c <= rec.state.log_received for c in pub.for_peer()
                       if c <= max(p.horizon, pub.log_start)), f"rule 8 at {name}"

    def confirmed(self, name: str) -> bool:
        """The stream from ``name`` is wholly sent, applied and confirmed."""
        pub, rec = self.sites[name], self.sites[OTHER[name]]
        p, end = pub.state, (pub.log[-1] if pub.log else 0)
        return p.confirm_sent == p.log_sent == rec.state.log_received and p.horizon == p.read_through == end

    def at_rest(self) -> bool:
        """Both streams confirmed, no data in flight, no commit to come."""
        return (all(self.confirmed(name) and not site.later for name, site in self.sites.items())
                and not any(f.is_data for files in self.flight.values() for _, f in files))

    def key(self) -> tuple:
        """Everything the future depends on (the protocols are rebuilt at
        each run, so they hold nothing in memory between runs): the
        persisted states, with times as ages capped where no comparison
        can tell them apart and ``heard_at`` (which no rule reads) left
        out, the inboxes, logs, applied lists and in-flight files."""
        assert self.restart
        parts: list = []
        for name, site in sorted(self.sites.items()):
            state = site.state
            # Every threshold compared with an age: a heartbeat period (at
            # most the heartbeat) or a probe wait (at most the uncapped one).
            cap = self.heartbeat or 0.0
            if state.unconfirmed and self.confirm_timeout is not None:
                cap = max(cap, probe_wait(self.confirm_timeout, state.probes, None))
            values = []
            for field_name in _FIELDS:
                value = getattr(state, field_name)
                if field_name == "heard_at":
                    continue
                if field_name in _TIMES and value is not None:
                    value = min(self.now - value, cap)
                values.append(value)
            parts.append((tuple(values), tuple(sorted(site.inbox)), len(site.log), tuple(sorted(site.echoes)),
                          tuple(site.applied), site.log_start, site.later,
                          site.last_applied and site.last_applied.name))
            parts.append(tuple(sorted((hold, f.name, f.corrupt) for hold, f in self.flight[name])))
        return tuple(parts)

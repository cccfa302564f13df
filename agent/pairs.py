"""The persisted state of each pair of sites, and its one owner.

A pair's protocol state (:class:`~agent.protocol.PairState`) is kept in two
places, written only here:

* the remote-user row in the site database (docs/protocol.md, "Offsets"),
  except ``log_received``, which moves only together with applied data
  (``Site.apply``) and ``log_sent``, which moves only with a send
  recorded (``Site.record_send``): :meth:`Peer.recorded` tells
  the store those happened;
* ``<db>.agent/state/``: the agent's bookkeeping beside the database (the
  most the peer said it sent, gap patience) and the incarnations of the
  peer's copies that were extracted again (agent.pair_files).

Rules of this file:
* Blocking: :meth:`PairStore.load` and :meth:`PairStore.save` read and write
  the database and files; the runner calls them in a worker thread.
* :meth:`PairStore.save` writes only what changed since the last save, and
  :meth:`PairStore.dirty` says, without I/O, whether there is anything.
* It holds no clock: the times it writes are the protocol's, read from the
  agent's clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import Any

from codec.errors import InvalidValue
from codec.keys import Keyring, PublicKeys

from .errors import AgentError
from .pair_files import PairFiles
from .protocol import PairProtocol, PairState, Settings
from .site import Site

# Columns of the remote-user row the protocol owns.
ROW_FIELDS = ("log_send", "log_sent", "confirm_sent", "resend_count", "log_received", "confirm_received",
              "rereceive_count", "peer_incarnation", "log_read", "control_sent_at", "heard_at", "data_sent_at",
              "peer_confirmed", "probes", "confirm_owed", "peer_schema_version")
# Protocol state kept beside the database (agent bookkeeping, not replicated state).
EXTRA_FIELDS = ("peer_log_sent", "gap_polls", "request_patience")
# What identifies one stream of a pair: a change starts a new one.
_STREAM_FIELDS = ("resend_count", "rereceive_count", "peer_incarnation")
_row_values, _file_values = attrgetter(*ROW_FIELDS), attrgetter(*EXTRA_FIELDS, *_STREAM_FIELDS)  # one step a pair


@dataclass(slots=True)
class Peer:
    """One peer of this site: its protocol, keys and where to send to."""

    name: str
    protocol: PairProtocol
    public: PublicKeys | None
    address: str | None
    transport: str | None
    persisted: PairState | None = None
    heartbeat: int | None = None  # seconds; None: the run's --heartbeat
    confirm_timeout: int | None = None  # seconds; None: the run's --confirm-timeout

    def recorded(self, **columns: int) -> None:
        """The database wrote these columns itself: ``log_received`` with an
        apply, ``log_sent`` with a send (so they are persisted already)."""
        if self.persisted is not None:
            self.persisted = self.persisted.evolve(**columns)


def stream_key(row: Any) -> list:
    """What identifies one stream of a pair: its epochs and the peer's incarnation."""
    incarnation = row.peer_incarnation.hex() if row.peer_incarnation else None
    return [row.resend_count, row.rereceive_count, incarnation]


class PairStore:
    """Loads each pair's state into a :class:`Peer` and saves it back."""

    def __init__(self, db: Site, state_directory: Path, keyring: Keyring) -> None:
        self.db = db
        self.files = PairFiles(state_directory)
        self.keyring = keyring
        self._loaded_at: tuple[int, int] | None = None

    def load(self, peers: dict[str, Peer], settings: Settings) -> bool:
        """(Re)build in ``peers`` each peer's protocol from its remote-user row
        when the row changed behind the agent's back (a remote added, removed
        or extracted again while the agent runs); return True when anything
        changed.  Nothing committed since the last load: nothing to look at."""
        marker = self.db.change_marker()
        if marker == self._loaded_at:
            return False
        rows = {remote.name: remote for remote in self.db.remotes()}
        log_start = self.db.log_start()  # a resend acted on before the next send_due must not read below it
        # One query and one listing for every peer, not one each.
        replaced = self.db.all_replaced_incarnations()
        self.files.list()
        gone = [name for name in peers if name not in rows]
        for name in gone:
            del peers[name]
        changed = bool(gone)
        for remote in rows.values():
            peer = peers.get(remote.name)
            if peer is not None and peer.persisted is not None and all(
                    getattr(peer.persisted, field) == getattr(remote, field) for field in _STREAM_FIELDS):
                peer.heartbeat, peer.confirm_timeout = remote.heartbeat, remote.confirm_timeout
                continue
            changed = True
            public = None
            if remote.public_key:
                try:
                    public = PublicKeys.from_line(remote.public_key)
                    self.keyring.add(public, replace=True)
                except InvalidValue as error:
                    raise AgentError(f"remote {remote.name}: bad public key ({error})") from None
            extras = self.files.extras(remote.name, stream_key(remote), EXTRA_FIELDS)
            superseded = self.files.superseded(remote.name, remote.peer_incarnation,
                                               replaced.get(remote.name, frozenset()))
            state = PairState(**dict(zip(ROW_FIELDS, _row_values(remote))), **extras)
            protocol = PairProtocol(remote.name, state, settings, superseded=superseded, log_start=log_start)
            peers[remote.name] = Peer(remote.name, protocol, public, remote.address, remote.transport,
                                      persisted=state, heartbeat=remote.heartbeat,
                                      confirm_timeout=remote.confirm_timeout)
        self._loaded_at = marker
        return changed

    @staticmethod
    def dirty(peer: Peer, *, heard: bool = True) -> bool:
        """Whether the pair's state changed since it was last saved;
        ``heard=False``: other than when the peer was last heard of
        (``heard_at`` tells an operator, the protocol does not read it, so
        a phase saves it once, at its end, not with every file)."""
        state, persisted = peer.protocol.state, peer.persisted
        if state == persisted:
            return False
        if heard or persisted is None:
            return True
        return state.evolve(heard_at=persisted.heard_at) != persisted

    def save(self, peers: list[Peer]) -> None:
        """Write what changed of the pairs' state: the rows' columns in one
        database transaction (a phase saves every pair it changed at once),
        then the bookkeeping files whose fields or stream changed."""
        rows: dict[str, dict[str, Any]] = {}
        files: list[tuple[Peer, dict[str, Any]]] = []
        # A message of the peer arrived while its stream runs: its errors in
        # force (a transport error, a stopped stream) are over (docs/cli.md).
        heard: list[str] = []
        for peer in peers:
            state, before = peer.protocol.state, peer.persisted
            if state == before:
                continue
            if state.heard_at is not None and (before is None or before.heard_at != state.heard_at) \
                    and peer.protocol.stopped is None:
                heard.append(peer.name)
            olds = (None,) * len(ROW_FIELDS) if before is None else _row_values(before)
            changes = {name: value for name, value, old in zip(ROW_FIELDS, _row_values(state), olds)
                       if before is None or value != old}
            changes.pop("log_received", None)  # moves only together with applied data
            if changes:
                rows[peer.name] = changes
            if before is None or _file_values(before) != _file_values(state):
                extras: dict[str, Any] = {name: getattr(state, name) for name in EXTRA_FIELDS}
                extras["stream"] = stream_key(state)
                files.append((peer, extras))
        self.db.update_remotes(rows, heard=heard)
        for peer, extras in files:
            self.files.save_extras(peer.name, extras)
        for peer in peers:
            peer.persisted = peer.protocol.state

"""The persisted state of each pair of sites, and its one owner.

A pair's protocol state (:class:`~agent.protocol.PairState`) is kept in two
places, written only here:

* the remote-user row in the site database (docs/protocol.md, "Offsets"),
  except ``log_received``, which moves only together with applied data
  (``SiteDatabase.apply``) and ``log_sent``, which moves only with a send
  recorded (``SiteDatabase.record_send``): :meth:`PairStore.applied` and
  :meth:`PairStore.sent` tell the store those happened;
* ``<db>.agent/state/PEER.json``: the agent's bookkeeping beside the
  database (the most the peer said it sent, gap patience), tagged with the
  stream it belongs to, and ``PEER.incarnations.json``: the incarnations of
  the peer's copies that were extracted again.

Rules of this file:
* Blocking: :meth:`PairStore.load` and :meth:`PairStore.save` read and write
  the database and files; the runner calls them in a worker thread.
* :meth:`PairStore.save` writes only what changed since the last save, and
  :meth:`PairStore.dirty` says, without I/O, whether there is anything.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from codec.atomic import write_file_atomically
from codec.errors import InvalidValue
from codec.keys import Keyring, PublicKeys

from .errors import AgentError
from .protocol import PairProtocol, PairState, Settings
from .site import SiteDatabase

# Columns of the remote-user row the protocol owns.
ROW_FIELDS = ("log_send", "log_sent", "confirm_sent", "resend_count", "log_received", "confirm_received",
              "rereceive_count", "peer_incarnation", "log_read", "control_sent_at", "heard_at", "data_sent_at",
              "peer_confirmed", "probes", "confirm_owed")
# Protocol state kept beside the database (agent bookkeeping, not replicated state).
EXTRA_FIELDS = ("peer_log_sent", "gap_polls", "request_patience")
# What identifies one stream of a pair: a change starts a new one.
_STREAM_FIELDS = ("resend_count", "rereceive_count", "peer_incarnation")


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


def stream_key(row: Any) -> list:
    """What identifies one stream of a pair: its epochs and the peer's incarnation."""
    incarnation = row.peer_incarnation.hex() if row.peer_incarnation else None
    return [row.resend_count, row.rereceive_count, incarnation]


class PairStore:
    """Loads each pair's state into a :class:`Peer` and saves it back."""

    def __init__(self, db: SiteDatabase, state_directory: Path, keyring: Keyring) -> None:
        self.db = db
        self.directory = state_directory
        self.keyring = keyring
        self._replaced: dict[str, frozenset[bytes]] = {}
        self._files: set[str] = set()
        self._loaded_at: tuple[int, int] | None = None

    def load(self, peers: dict[str, Peer], settings: Settings) -> bool:
        """(Re)build in ``peers`` each peer's protocol from its remote-user
        row when the row changed behind the agent's back (a remote added,
        removed or extracted again while the agent runs); return True when
        anything changed.  Nothing committed to the database since the last
        load (a batch run's first refresh, right after opening): nothing to
        look at."""
        marker = self.db.change_marker()
        if marker == self._loaded_at:
            return False
        rows = {remote.name: remote for remote in self.db.remotes()}
        log_start = self.db.log_start()  # a resend acted on before the next send_due must not read below it
        # One query and one listing for every peer, not one each.
        self._replaced = self.db.all_replaced_incarnations()
        try:
            self._files = set(os.listdir(self.directory))
        except FileNotFoundError:
            self._files = set()
        changed = False
        for name in list(peers):
            if name not in rows:
                del peers[name]
                changed = True
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
            extras = self._load_extras(remote.name, stream_key(remote))
            superseded = self._superseded(remote.name, remote.peer_incarnation)
            state = PairState(**{name: getattr(remote, name) for name in ROW_FIELDS}, **extras)
            protocol = PairProtocol(remote.name, state, settings, superseded=superseded, log_start=log_start)
            peers[remote.name] = Peer(remote.name, protocol, public, remote.address, remote.transport,
                                      persisted=state, heartbeat=remote.heartbeat,
                                      confirm_timeout=remote.confirm_timeout)
        self._loaded_at = marker
        return changed

    # -- saving --------------------------------------------------------------------------

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
        return replace(state, heard_at=persisted.heard_at) != persisted

    def save(self, peer: Peer) -> None:
        """Write what changed of the pair's state: the row's columns, and
        the bookkeeping file when its fields or the stream changed."""
        self.save_many([peer])

    def save_many(self, peers: list[Peer]) -> None:
        """:meth:`save` for several pairs: the rows in one database
        transaction (a phase saves every pair it changed at once), then the
        bookkeeping files that changed."""
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
            changes = {name: getattr(state, name) for name in ROW_FIELDS
                       if before is None or getattr(before, name) != getattr(state, name)}
            changes.pop("log_received", None)  # moves only together with applied data
            if changes:
                rows[peer.name] = changes
            if before is None or any(getattr(before, name) != getattr(state, name)
                                     for name in EXTRA_FIELDS + _STREAM_FIELDS):
                extras: dict[str, Any] = {name: getattr(state, name) for name in EXTRA_FIELDS}
                extras["stream"] = stream_key(state)
                files.append((peer, extras))
        self.db.update_remotes(rows, heard=heard)
        for peer, extras in files:
            write_file_atomically(self._extras_path(peer.name), json.dumps(extras).encode())
        for peer in peers:
            peer.persisted = peer.protocol.state

    @staticmethod
    def applied(peer: Peer, log_received: int) -> None:
        """The database committed an apply that set ``log_received``."""
        if peer.persisted is not None:
            peer.persisted = replace(peer.persisted, log_received=log_received)

    @staticmethod
    def sent(peer: Peer, log_sent: int) -> None:
        """The database recorded a send that set ``log_sent``."""
        if peer.persisted is not None:
            peer.persisted = replace(peer.persisted, log_sent=log_sent)

    # -- the files beside the database --------------------------------------------------------

    def _extras_path(self, peer: str) -> Path:
        return self.directory / f"{peer}.json"

    def _load_extras(self, peer: str, stream: list) -> dict[str, int]:
        """The bookkeeping kept beside the database, if it belongs to the
        stream the remote-user row describes now (an extraction starts a new
        stream, and then the old bookkeeping is forgotten)."""
        if f"{peer}.json" not in self._files:
            return {}
        try:
            data = json.loads(self._extras_path(peer).read_text())
            if data.get("stream") != stream:
                return {}
            return {name: int(data.get(name, 0)) for name in EXTRA_FIELDS}
        except (OSError, ValueError, AttributeError):
            return {}

    def _superseded(self, peer: str, current: bytes | None) -> frozenset[bytes]:
        """Incarnations ``peer`` had before it was extracted again.

        Extraction records the copy it replaces in the database; the agent
        folder also keeps the ones it has seen replaced in the remote-user
        row (extractions made before the database recorded them).
        """
        replaced = self._replaced.get(peer, frozenset())
        name = f"{peer}.incarnations.json"
        if name not in self._files and current is None:
            return replaced  # nothing seen, nothing to remember (most peers of a new fleet)
        path = self.directory / name
        try:
            if name not in self._files:
                raise FileNotFoundError(path)
            known = json.loads(path.read_text())
            seen = [bytes.fromhex(value) for value in known.get("seen", [])]
            last = bytes.fromhex(known["current"]) if known.get("current") else None
        except FileNotFoundError:
            known, seen, last = None, [], None
        except (OSError, ValueError, AttributeError, TypeError):
            known, seen, last = {}, [], None
        if last is not None and last != current and last not in seen:
            seen.append(last)
        record = {"current": current.hex() if current else None, "seen": [value.hex() for value in seen]}
        # Written when it says something new: a run's start costs no write per peer.
        if (current is not None or seen) and record != known:
            write_file_atomically(path, json.dumps(record).encode())
        return frozenset(value for value in (*seen, *replaced) if value != current)

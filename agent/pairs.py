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

from collections.abc import Collection
from operator import attrgetter
from pathlib import Path
from typing import Any

from codec.keys import Keyring

from .pair_files import PairFiles
from .peers import EXTRA_FIELDS, ROW_FIELDS, STREAM_FIELDS, Peer, build_peer, row_values, stream_key
from .protocol import Settings
from .site import Site

__all__ = ["PairStore", "Peer", "ROW_FIELDS"]
_file_values = attrgetter(*EXTRA_FIELDS, *STREAM_FIELDS)  # one step a pair


class PairStore:
    """Loads each pair's state into a :class:`Peer` and saves it back."""

    def __init__(self, db: Site, state_directory: Path, keyring: Keyring) -> None:
        self.db = db
        self.files = PairFiles(state_directory)
        self.keyring = keyring
        self._loaded_at: tuple[int, int] | None = None
        self.polling: set[str] = set()  # the pairs with a PEER.poll file (PairState.awaits_poll when saved)
        self.loads = 0  # pairs built, ever (a batch run builds only those with work)

    def load(self, peers: dict[str, Peer], settings: Settings) -> bool:
        """(Re)build in ``peers`` each peer's protocol from its remote-user row
        when the row changed behind the agent's back (a remote added, removed
        or extracted again while the agent runs); return True when anything
        changed.  Nothing committed since the last load: nothing to look at."""
        marker = self.db.change_marker()
        if marker == self._loaded_at:
            return False
        rows = {remote.name: remote for remote in self.db.remotes()}
        # One query and one listing for every peer, not one each.
        self.files.list()
        self.polling = {name for name in self.files.polling() if name in rows}
        gone = [name for name in peers if name not in rows]
        for name in gone:
            del peers[name]
        changed = bool(gone)
        for remote in list(rows.values()):
            peer = peers.get(remote.name)
            if peer is not None and peer.persisted is not None and all(
                    getattr(peer.persisted, field) == getattr(remote, field) for field in STREAM_FIELDS):
                peer.heartbeat, peer.confirm_timeout = remote.heartbeat, remote.confirm_timeout
                del rows[remote.name]
        changed = self._build(peers, rows.values(), settings) or changed
        self._loaded_at = marker
        return changed

    def load_named(self, peers: dict[str, Peer], names: Collection[str], settings: Settings) -> list[str]:
        """Build in ``peers`` the peers named that are not there yet (a batch
        run's pairs with work, agent.working_set), reading their rows and
        files alone; return the names built (a name that is no remote: none)."""
        wanted = [name for name in dict.fromkeys(names) if name not in peers]
        if not wanted:
            return []
        self.files.unlist()
        rows = self.db.remotes(wanted)
        self._build(peers, rows, settings)
        return [remote.name for remote in rows]

    def _build(self, peers: dict[str, Peer], rows: Collection[Any], settings: Settings) -> bool:
        if not rows:
            return False
        log_start = self.db.log_start()  # a resend acted on before the next send_due must not read below it
        replaced = self.db.all_replaced_incarnations()
        for remote in rows:
            peers[remote.name] = build_peer(remote, settings, log_start=log_start,
                                            replaced=replaced.get(remote.name, frozenset()), files=self.files,
                                            keyring=self.keyring)
        self.loads += len(rows)
        return True

    def dirty(self, peer: Peer, *, heard: bool = True) -> bool:
        """Whether the pair's state changed since it was last saved;
        ``heard=False``: other than when the peer was last heard of
        (``heard_at`` tells an operator, the protocol does not read it, so
        a phase saves it once, at its end, not with every file)."""
        state, persisted = peer.protocol.state, peer.persisted
        if state.awaits_poll != (peer.name in self.polling):
            return True
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
        polls = {peer.name: peer.protocol.state.awaits_poll for peer in peers
                 if peer.protocol.state.awaits_poll != (peer.name in self.polling)}
        self._mark_polls(polls, True)  # made before the state that needs it, removed after
        for peer in peers:
            state, before = peer.protocol.state, peer.persisted
            if state == before:
                continue
            if state.heard_at is not None and (before is None or before.heard_at != state.heard_at) \
                    and peer.protocol.stopped is None:
                heard.append(peer.name)
            olds = (None,) * len(ROW_FIELDS) if before is None else row_values(before)
            changes = {name: value for name, value, old in zip(ROW_FIELDS, row_values(state), olds)
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
        self._mark_polls(polls, False)
        for peer in peers:
            peer.persisted = peer.protocol.state

    def _mark_polls(self, polls: dict[str, bool], on: bool) -> None:
        for name, polling in polls.items():
            if polling == on:
                self.files.set_polling(name, polling)
                (self.polling.add if polling else self.polling.discard)(name)

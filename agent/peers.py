"""One peer of this site as the agent holds it (:class:`Peer`), and how it
is made from its remote-user row and the files beside the database.

Rules of this file:
* :func:`build_peer` is blocking (it reads the pair's files); agent.pairs,
  the one owner of a pair's state, is its one caller.
* A peer's public key is added to the agent's keyring when the peer is
  made: a peer not made (a batch run makes only the pairs with work,
  agent.working_set) needs none.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from codec.errors import InvalidValue
from codec.keys import Keyring, PublicKeys

from .errors import AgentError
from .pair_files import PairFiles
from .protocol import PairProtocol, PairState, Settings

# Columns of the remote-user row the protocol owns.
ROW_FIELDS = ("log_send", "log_sent", "confirm_sent", "resend_count", "log_received", "confirm_received",
              "rereceive_count", "peer_incarnation", "log_read", "control_sent_at", "heard_at", "data_sent_at",
              "peer_confirmed", "probes", "confirm_owed", "peer_schema_version")
# Protocol state kept beside the database (agent bookkeeping, not replicated state).
EXTRA_FIELDS = ("peer_log_sent", "gap_polls", "request_patience")
# What identifies one stream of a pair: a change starts a new one.
STREAM_FIELDS = ("resend_count", "rereceive_count", "peer_incarnation")
row_values = attrgetter(*ROW_FIELDS)


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


def build_peer(remote: Any, settings: Settings, *, log_start: int, replaced: frozenset[bytes], files: PairFiles,
               keyring: Keyring) -> Peer:
    """The peer of a remote-user row, its protocol's state read from the row
    and the pair's files; its public key added to ``keyring``."""
    public = None
    if remote.public_key:
        try:
            public = PublicKeys.from_line(remote.public_key)
            keyring.add(public, replace=True)
        except InvalidValue as error:
            raise AgentError(f"remote {remote.name}: bad public key ({error})") from None
    extras = files.extras(remote.name, stream_key(remote), EXTRA_FIELDS)
    superseded = files.superseded(remote.name, remote.peer_incarnation, replaced)
    state = PairState(**dict(zip(ROW_FIELDS, row_values(remote))), **extras)
    protocol = PairProtocol(remote.name, state, settings, superseded=superseded, log_start=log_start)
    return Peer(remote.name, protocol, public, remote.address, remote.transport, persisted=state,
                heartbeat=remote.heartbeat, confirm_timeout=remote.confirm_timeout)

"""Whether a batch may be applied: the peer's incarnation, the offsets, and
the order of its transactions.  Both backends (the SQLite driver and the
PostgreSQL one) call these before they write anything.

Rules of this file:
* Pure: the peer's row of the remote-user table and the batch's numbers
  in, a value or one of the site's errors out; no database.
* ``log_received`` never goes back; a peer's incarnation, once recorded,
  never changes (``IncarnationMismatch``: its offsets cannot be trusted).
* Transactions at or below ``skip_through`` (default: the recorded
  ``log_received``) were applied before and are skipped; a batch whose
  transactions are out of order or lie beyond the new ``log_received`` is
  refused whole (``ApplyRefused``), nothing applied.
"""

from __future__ import annotations

from ..errors import ApplyRefused, IncarnationMismatch, InvalidSetting
from ..remote_rules import RemoteUser


def skip_bound(peer: str, remote: RemoteUser, log_received: object, messages: object,
               peer_incarnation: object, skip_through: object) -> int:
    """Check a batch from ``peer`` (whose row is ``remote``) before it is
    applied; return the commit offset at or below which its transactions
    are skipped."""
    if peer_incarnation is not None:
        if type(peer_incarnation) is not bytes or len(peer_incarnation) != 16:
            raise InvalidSetting("a peer incarnation id is 16 bytes")
        if remote.peer_incarnation is not None and remote.peer_incarnation != peer_incarnation:
            raise IncarnationMismatch(
                f"peer {peer!r} now has incarnation {peer_incarnation.hex()} but {remote.peer_incarnation.hex()} "
                "is recorded: its database was rebuilt or restored, so its offsets cannot be trusted; "
                "extract the remote again (or reset the pair) before exchanging messages")
    if type(log_received) is not int or log_received < remote.log_received:
        raise ApplyRefused(f"log_received for {peer!r} would go back from {remote.log_received} to "
                           f"{log_received!r}; nothing applied")
    if type(messages) is not int or messages < 0:
        raise InvalidSetting(f"message count must be a non-negative integer, got {messages!r}")
    if skip_through is None:
        return remote.log_received
    if type(skip_through) is not int or not 0 <= skip_through <= remote.log_received:
        raise ApplyRefused(f"skip_through {skip_through!r} for {peer!r} must be an offset from 0 to the recorded "
                           f"log_received {remote.log_received}; nothing applied")
    return skip_through


def applies(peer: str, commit: int, previous: int, skip_through: int, log_received: int) -> bool:
    """Whether the transaction ``commit`` of ``peer``'s batch is applied
    (False: it was, before; a confirmation was lost); ``previous`` is the
    commit of the last one applied (``skip_through`` before the first)."""
    if commit <= skip_through:
        return False
    if commit <= previous:
        raise ApplyRefused(f"transaction {commit} from {peer!r} follows {previous}: out of order; "
                           "nothing applied")
    if commit > log_received:
        raise ApplyRefused(f"transaction {commit} from {peer!r} lies beyond the new log_received "
                           f"{log_received}; nothing applied")
    return True

"""The remote-user methods of :class:`agent.site.postgres.site.PostgresSite`:
each one transaction over remotes.py's rules (SiteDatabase's signatures,
values and errors).

Rules of this file:
* A method here is a thin hop: it opens the site's transaction, names what
  is being done for the error line, and calls remotes.py; no rule lives
  here.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, time
from typing import Any, Callable

import psycopg

from ..clock import utc_now
from ..due import DueQuery, PairsDue
from ..identity import SiteIdentity
from ..remote_rules import NewRemote, RemoteFilter, RemoteUser, plain_values
from . import read_positions
from . import remotes as remote_rows
from .log import log_end


class RemoteUsers:
    """The remote-user table's methods of a PostgreSQL site."""

    _identity: SiteIdentity

    def _transaction(self, doing: str, *, snapshot: bool = False) -> AbstractContextManager[psycopg.Connection]:
        raise NotImplementedError

    def add_remote(self, name: str, *, address: str | None = None, transport: str | None = None,
                   public_key: str | None = None, send_every: int | None = None,
                   send_at: time | str | None = None, start: int | None = None,
                   peer_incarnation: bytes | None = None, now: datetime | None = None) -> RemoteUser:
        """Add a peer.  Its stream starts at ``start`` (default: the log end):
        it is assumed to hold everything up to there."""
        with self._transaction(f"adding remote {name!r}") as conn:
            return remote_rows.add_remote(conn, self._identity, name, address=address, transport=transport,
                                      public_key=public_key, send_every=send_every, send_at=send_at, start=start,
                                      peer_incarnation=peer_incarnation, now=now or utc_now())

    def add_remotes(self, remotes: Sequence[NewRemote], *, now: datetime | None = None,
                    progress: Callable[[int], None] | None = None) -> int:
        """Add a fleet of peers with their subscriptions in one transaction:
        all of them, or none when one is refused (RemoteRejected names its
        index).  Each stream starts at the log end.  Returns the number of
        subscriptions stored; ``progress(n)`` is called as chunks of ``n``
        rows are written."""
        with self._transaction(f"adding {len(remotes)} remotes") as conn:
            return remote_rows.add_remotes(conn, self._identity, remotes, now=now or utc_now(), progress=progress)

    def remove_remote(self, name: str) -> None:
        """Remove a peer, its subscriptions and its transport options."""
        with self._transaction(f"removing remote {name!r}") as conn:
            remote_rows.remove_remote(conn, name)

    def remote(self, name: str) -> RemoteUser:
        with self._transaction(f"reading remote {name!r}") as conn:
            return remote_rows.get_remote(conn, name)

    def remotes(self, names: Iterable[str] | None = None) -> tuple[RemoteUser, ...]:
        with self._transaction("listing remotes") as conn:
            return remote_rows.list_remotes(conn, names)

    def pairs_due(self, query: DueQuery) -> PairsDue:
        with self._transaction("finding the pairs with something due") as conn:
            return remote_rows.pairs_due(conn, query)

    def remote_names(self) -> tuple[str, ...]:
        with self._transaction("listing the remotes' names") as conn:
            return remote_rows.list_remote_names(conn)

    def remote_transports(self) -> tuple[str | None, ...]:
        with self._transaction("listing the remotes' transports") as conn:
            return remote_rows.list_transports(conn)

    def iter_remotes(self, which: RemoteFilter = RemoteFilter(), *, chunk: int = 1000) -> Iterator[RemoteUser]:
        with self._transaction("listing remotes", snapshot=True) as conn:
            yield from remote_rows.iter_remotes(conn, which, chunk=chunk)

    def iter_remote_values(self, which: RemoteFilter = RemoteFilter(), *, chunk: int = 1000) -> Iterator[tuple]:
        with self._transaction("listing remotes", snapshot=True) as conn:
            yield from map(plain_values, remote_rows.iter_remotes(conn, which, chunk=chunk))

    def counts(self) -> dict[str, int]:
        """Rows of the remote-user, conflict and apply-error tables, counted
        (not read) in one snapshot: ``remotes``, ``conflicts``, ``apply_errors``."""
        with self._transaction("counting remotes, conflicts and apply errors") as conn:
            return remote_rows.counts(conn)

    def all_replaced_incarnations(self) -> dict[str, frozenset[bytes]]:
        """:meth:`replaced_incarnations` of every remote that has any, in one query."""
        with self._transaction("reading the replaced copies") as conn:
            return remote_rows.all_replaced_incarnations(conn)

    def replaced_incarnations(self, name: str) -> frozenset[bytes]:
        """Incarnation ids of ``name``'s copies that a new extraction replaced."""
        with self._transaction(f"reading the replaced copies of {name!r}") as conn:
            return remote_rows.replaced_incarnations(conn, name)

    def update_remote(self, name: str, /, **changes: Any) -> RemoteUser:
        """Change columns of one remote-user row in a short transaction,
        e.g. ``update_remote("r1", log_sent=120, resend_count=2)``."""
        with self._transaction(f"updating remote {name!r}") as conn:
            return remote_rows.update_remote(conn, name, changes)

    def update_remotes(self, changes: dict[str, dict[str, Any]], *, heard: Collection[str] = ()) -> None:
        """:meth:`update_remote` for several rows, in one transaction, and
        :meth:`record_heard` for ``heard`` in the same one."""
        if not changes and not heard:
            return
        with self._transaction(f"updating {len(changes)} remotes") as conn:
            remote_rows.update_remotes(conn, changes)
            remote_rows.record_heard(conn, heard)

    def move_reads(self, end: int, *, leave: Collection[str], join: Collection[str]) -> None:
        """A send phase's moves of the read positions (agent.site.interface)."""
        with self._transaction(f"moving the read positions to {end}") as conn:
            read_positions.move_reads(conn, end, log_end(conn), leave, join)

    def record_sends(self, sends: Sequence[tuple[str, int, int]], *, now: datetime | None = None) -> None:
        """:meth:`record_send` for several ``(name, log_sent, messages)``, in one transaction."""
        if not sends:
            return
        with self._transaction(f"recording {len(sends)} sends") as conn:
            for name, log_sent, messages in sends:
                remote_rows.record_send(conn, name, log_sent, messages, now or utc_now())

    def record_send(self, name: str, *, log_sent: int, messages: int = 1, now: datetime | None = None) -> RemoteUser:
        """Set log_sent after messages went to the outbound queue, counting them."""
        with self._transaction(f"recording a send to {name!r}") as conn:
            return remote_rows.record_send(conn, name, log_sent, messages, now or utc_now())

    def record_delivered(self, counts: Mapping[str, int], *, now: datetime | None = None) -> None:
        """Count the messages each peer's transport accepted (``send_count``,
        ``last_sent_at``), in one transaction."""
        if not counts:
            return
        with self._transaction(f"counting messages sent to {len(counts)} peers") as conn:
            for name, messages in counts.items():
                remote_rows.record_delivered(conn, name, messages, now or utc_now())

    def record_transport_error(self, name: str, message: str | None, *, now: datetime | None = None) -> RemoteUser:
        """Remember a transport error with ``name``, in force until a send to
        or a receive from it succeeds, and count it (None clears the one in
        force; the count stays)."""
        with self._transaction(f"recording an error for {name!r}") as conn:
            return remote_rows.record_error(conn, name, message, now or utc_now())

    def record_stream_stopped(self, name: str, message: str, *, now: datetime | None = None) -> RemoteUser:
        """Remember that the stream with ``name`` stopped, in force until a
        message of the peer arrives while its stream runs again; counted as
        an error."""
        with self._transaction(f"recording the stopped stream of {name!r}") as conn:
            return remote_rows.record_stream_stopped(conn, name, message, now or utc_now())

    def record_heard(self, names: Collection[str]) -> None:
        """A message of each peer of ``names`` arrived while its stream runs:
        its transport error and stopped stream in force are over."""
        if names:
            with self._transaction(f"clearing the errors of {len(names)} peers") as conn:
                remote_rows.record_heard(conn, names)

"""The site as the agent sees it: one interface, two backends.

Rules of this file:
* :class:`Site` is everything the agent, the CLI, extraction, the chaos
  suite and the Spark export may call on a site.  Nothing outside
  ``agent/site/`` names a backend's class; they take a ``Site`` and get
  one from :mod:`agent.site.locate` (``open_site`` / ``init_site``).
* A SQLite file (:class:`agent.site.database.SiteDatabase`) is one backend,
  a PostgreSQL database named by a libpq URI (``agent.site.postgres``) the
  other.  Each implements every method here with the same values and
  errors; ``tests/site/test_interface.py`` fails when a backend's public
  methods drift from this list or their signatures from these.
* The meaning of each method is written once, on the SQLite backend's
  method of the same name (agent/site/database.py); the lines here say
  what a caller may rely on whatever the backend.
"""

from __future__ import annotations

import contextlib
import os
from datetime import datetime, time
from pathlib import Path
from typing import Any, Callable, Collection, Iterable, Iterator, Mapping, Protocol, Sequence

from codec.ops import Transaction

from .apply import ApplyErrorRecord, ApplyResult, ConflictHook, ConflictRecord, Resolution
from .capture import Shape
from .publications import Article, Publication, Subscription, Value
from .reading import LoggedOperation
from .remotes import NewRemote, RemoteFilter, RemoteUser
from .resubscribe import SubscriptionChange
from .schema import SiteIdentity
from .selection import FANOUT_HOLD


class Site(Protocol):
    """An open site.  Every method is synchronous and safe to call from
    worker threads; each is one short transaction of its own, except the
    log readers, which read chunk by chunk."""

    path: str
    """Where the site is, as the user named it: a file name, or a URI
    (which holds no password: one is refused)."""

    @property
    def home(self) -> Path:
        """The agent's own folder for this site (keys, spool, state):
        ``<file>.agent`` beside a SQLite file, the folder given at
        ``agent init URI --home DIR`` for PostgreSQL."""

    @property
    def identity(self) -> SiteIdentity: ...

    def agent_lock(self) -> contextlib.AbstractContextManager[None]:
        """Held by the agent while it runs: one agent per site.  A SQLite
        site needs nothing more than its spool's lock beside the file; a
        PostgreSQL site holds an advisory lock in the database, which two
        hosts share."""

    def close(self) -> None: ...

    def __enter__(self) -> Site: ...

    def __exit__(self, *exc_info: object) -> None: ...

    # --- publications and subscriptions --------------------------------------------

    def create_publication(self, name: str, articles: Iterable[Article | str] = (), *,
                           now: datetime | None = None) -> Publication: ...

    def add_article(self, publication: str, table: str, *, columns: Iterable[str] | None = None,
                    subscribe_by: str | None = None, follows: str | None = None,
                    follow_columns: Iterable[str] | None = None) -> Article: ...

    def remove_article(self, table: str) -> None: ...

    def drop_publication(self, name: str) -> None: ...

    def declared_type(self, table: str, column: str) -> str | None:
        """The type a SQLite copy of ``table.column`` declares, from which a
        value typed on the command line takes its type (None: no such
        column): the column's own declaration on SQLite, the types table's
        on PostgreSQL (docs/postgres.md, "Types")."""

    def missing_tables(self) -> tuple[str, ...]: ...

    def publications(self) -> tuple[Publication, ...]: ...

    def subscribe(self, remote: str, publication: str, value: Value = None, *,
                  now: datetime | None = None) -> SubscriptionChange: ...

    def unsubscribe(self, remote: str, publication: str, value: Value = None, *,
                    now: datetime | None = None) -> SubscriptionChange: ...

    def subscriptions(self, remote: str | None = None) -> tuple[Subscription, ...]: ...

    # --- the log ----------------------------------------------------------------------

    def scan(self) -> int:
        """Give every finished change captured since the last scan its commit
        offset; return the log end.  Offsets at or below it never change."""

    def log_end(self) -> int: ...

    def change_marker(self) -> tuple[int, int]:
        """Equal markers: nothing was committed between the two reads."""

    def log_start(self) -> int: ...

    def read_log(self, subscriber: str, after: int, until: int | None = None) -> Iterator[Transaction]: ...

    def read_log_ops(self, subscriber: str, after: int, until: int | None = None) -> Iterator[LoggedOperation]: ...

    def read_logs(self, reads: Iterable[tuple[str, int, int | None]], *, hold: int = FANOUT_HOLD,
                  piece: int | None = None, runs: bool = False) -> Iterator[tuple[int, Transaction]]: ...

    def selection_rows(self, subscribers: Iterable[str]) -> tuple[list[Shape], list[tuple], list[tuple]]: ...

    def check_log_range(self, after: int, until: int) -> None: ...

    def read_capture(self, after: int, until: int, *, value_columns: int
                     ) -> Iterator[tuple[int, str, list[tuple], dict[int, str]]]: ...

    def truncate_log(self) -> int: ...

    # --- remote users ---------------------------------------------------------------

    def add_remote(self, name: str, *, address: str | None = None, transport: str | None = None,
                   public_key: str | None = None, send_every: int | None = None,
                   send_at: time | str | None = None, start: int | None = None,
                   peer_incarnation: bytes | None = None, now: datetime | None = None) -> RemoteUser: ...

    def add_remotes(self, remotes: Sequence[NewRemote], *, now: datetime | None = None,
                    progress: Callable[[int], None] | None = None) -> int: ...

    def remove_remote(self, name: str) -> None: ...

    def remote(self, name: str) -> RemoteUser: ...

    def remotes(self) -> tuple[RemoteUser, ...]: ...

    def remote_transports(self) -> tuple[str | None, ...]: ...

    def iter_remotes(self, which: RemoteFilter = RemoteFilter(), *, chunk: int = 1000) -> Iterator[RemoteUser]: ...

    def counts(self) -> dict[str, int]: ...

    def all_replaced_incarnations(self) -> dict[str, frozenset[bytes]]: ...

    def replaced_incarnations(self, name: str) -> frozenset[bytes]: ...

    def update_remote(self, name: str, /, **changes: Any) -> RemoteUser: ...

    def transport_options(self, peer: str | None = None) -> dict[str, str]: ...

    def all_transport_options(self) -> dict[str, dict[str, str]]: ...

    def set_transport(self, *, address: str | None = None, reply_address: str | None = None,
                      transport: str | None = None, options: Mapping[str, str | None] | None = None,
                      peer: str | None = None, inbox: str | None = None) -> None: ...

    def update_remotes(self, changes: dict[str, dict[str, Any]], *, heard: Collection[str] = ()) -> None: ...

    def record_sends(self, sends: Sequence[tuple[str, int, int]], *, now: datetime | None = None) -> None: ...

    def record_send(self, name: str, *, log_sent: int, messages: int = 1,
                    now: datetime | None = None) -> RemoteUser: ...

    def record_delivered(self, counts: Mapping[str, int], *, now: datetime | None = None) -> None: ...

    def record_transport_error(self, name: str, message: str | None, *,
                               now: datetime | None = None) -> RemoteUser: ...

    def record_stream_stopped(self, name: str, message: str, *, now: datetime | None = None) -> RemoteUser: ...

    def record_heard(self, names: Collection[str]) -> None: ...

    # --- apply ------------------------------------------------------------------------

    def apply(self, peer: str, transactions: Iterable[Transaction], *, log_received: int, messages: int = 1,
              peer_incarnation: bytes | None = None, now: datetime | None = None,
              skip_through: int | None = None) -> ApplyResult:
        """Apply ``transactions`` and set ``peer``'s log_received in one
        database transaction: all of it, or nothing."""

    def set_conflict_policy(self, table: str, policy: Resolution | str | None) -> None: ...

    def set_conflict_hook(self, table: str | None, hook: ConflictHook | None) -> None: ...

    def conflicts(self, after_id: int = 0) -> tuple[ConflictRecord, ...]: ...

    def apply_errors(self, after_id: int = 0) -> tuple[ApplyErrorRecord, ...]: ...

    def open_apply_errors(self) -> dict[str, int]: ...

    def acknowledge_apply_errors(self, peer: str, *, through: int | None = None,
                                 now: datetime | None = None) -> int: ...

    # --- extraction ------------------------------------------------------------------

    def extract(self, remote: str, path: str | os.PathLike[str], *, keys: Any = None,
                now: datetime | None = None, options: Mapping[str, str] | None = None) -> Any:
        """Create the SQLite database of ``remote`` at ``path`` from one
        consistent point of this site."""

"""The site as the agent sees it: one interface, two backends.

Rules of this file:
* :class:`Site` is everything the agent, the CLI, extraction, the chaos
  suite and the Spark export may call on a site.  Nothing outside
  ``agent/site/`` names a backend's class; they take a ``Site`` and get
  one from :mod:`agent.site.locate` (``open_site`` / ``init_site``).
* A SQLite file (:class:`agent.site.sqlite.database.SiteDatabase`) is one backend,
  a PostgreSQL database named by a libpq URI (``agent.site.postgres``) the
  other.  Each implements every method here with the same values and
  errors; ``tests/site/test_interface.py`` fails when a backend's public
  methods drift from this list or their signatures from these.
* The meaning of each method is written once: here, what a caller may
  rely on whatever the backend; on a backend's method, only what is its
  own (agent/site/sqlite/database.py documents the rest of the log readers and
  apply, where SQLite's way is the reference).
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
from .due import DueQuery, PairsDue
from .change_rows import SchemaChangeResult
from .extraction import ExtractResult, Extraction
from .identity import SiteIdentity
from .publication_rules import Article, Publication, Subscription, SubscriptionChange, Value
from .reading import LoggedOperation
from .fanout import FANOUT_HOLD
from .remote_rules import NewRemote, RemoteFilter, RemoteUser


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
                           now: datetime | None = None) -> Publication:
        """Create a publication of ``articles`` (Article values or table
        names) and start capturing their tables."""

    def add_article(self, publication: str, table: str, *, columns: Iterable[str] | None = None,
                    subscribe_by: str | None = None, follows: str | None = None,
                    follow_columns: Iterable[str] | None = None, now: datetime | None = None) -> Article:
        """Publish ``table`` in ``publication``; the remotes already extracted
        that subscribe to it get the table and its rows through their
        streams (docs/site-database.md, "Schema changes")."""

    def remove_article(self, table: str, publication: str | None = None, *,
                       now: datetime | None = None) -> tuple[str, ...]:
        """Stop publishing ``table`` in ``publication`` (None: in every
        publication that holds it); its capture triggers are dropped with
        its last article.  At the consolidated, the extracted remotes
        subscribed to those publications get a change that removes the
        article there too, through their streams; returns them, sorted
        (docs/site-database.md, "Removing an article")."""

    def drop_publication(self, name: str, *, now: datetime | None = None) -> tuple[str, ...]:
        """Drop publication ``name``: its articles, as :meth:`remove_article`
        removes them (returns the remotes they reach), and its subscriptions."""

    def declared_type(self, table: str, column: str) -> str | None:
        """The type a SQLite copy of ``table.column`` declares, from which a
        value typed on the command line takes its type (None: no such
        column): the column's own declaration on SQLite, the types table's
        on PostgreSQL (docs/postgres.md, "Types")."""

    def missing_tables(self) -> tuple[str, ...]:
        """Published tables that are no longer in the database (an
        application renamed or dropped them); see docs/site-database.md."""

    def publications(self) -> tuple[Publication, ...]: ...

    def subscribe(self, remote: str, publication: str, value: Value = None, *,
                  now: datetime | None = None) -> SubscriptionChange:
        """Subscribe ``remote`` to ``publication`` with ``value``; an extracted remote gets the rows that
        enter its subset through its stream (docs/site-database.md, "Changing a remote's subscriptions")."""

    def unsubscribe(self, remote: str, publication: str, value: Value = None, *,
                    now: datetime | None = None) -> SubscriptionChange:
        """End one subscription (InvalidSetting if there is none such); an
        extracted remote gets DELETEs of the rows that leave its subset."""

    def subscriptions(self, remote: str | None = None) -> tuple[Subscription, ...]: ...

    def apply_schema(self, scripts: Iterable[str], *, unchecked: bool = False, now: datetime | None = None,
                     lock_timeout: float | None = None) -> SchemaChangeResult:
        """Run the SQL of ``scripts`` at the consolidated as one schema change
        that reaches the remotes holding its tables in order with the data
        (docs/site-database.md, "Schema changes"); SchemaRefused, and
        nothing changed, for what it may not do, or when a lock it needs is
        not granted within ``lock_timeout`` seconds (None: the backend's
        default, LOCK_TIMEOUT; 0: no limit)."""

    def passthrough(self, scripts: Iterable[str], remotes: Iterable[str], *, now: datetime | None = None) -> int:
        """Send the data statements of ``scripts`` to ``remotes`` only, in
        order with the data, to run there as their own writes
        (docs/site-database.md, "Passthrough"); their commit offset here.
        SchemaRefused, and nothing sent, for what passthrough may not do."""

    def schema_version(self) -> int | None:
        """The site's schema version (docs/protocol.md, "Schema versions"):
        the commit offset of the last schema change made here (the
        consolidated) or applied here (a remote: its offset in the
        consolidated's log); None: none."""

    # --- the log ----------------------------------------------------------------------

    def scan(self) -> int:
        """Give every finished change captured since the last scan its commit
        offset; return the log end.  Offsets at or below it never change."""

    def log_end(self) -> int:
        """The commit offset of the last log transaction (0 when empty)."""

    def change_marker(self) -> tuple[int, int]:
        """Equal markers: nothing was committed between the two reads."""

    def log_start(self) -> int:
        """The truncation point: the log holds the entries after it."""

    def read_log(self, subscriber: str, after: int, until: int | None = None) -> Iterator[Transaction]: ...

    def read_log_ops(self, subscriber: str, after: int, until: int | None = None) -> Iterator[LoggedOperation]: ...

    def read_logs(self, reads: Iterable[tuple[str, int, int | None]], *, hold: int = FANOUT_HOLD,
                  piece: int | None = None, runs: bool = False) -> Iterator[tuple[int, Transaction]]: ...

    def selection_rows(self, subscribers: Iterable[str]) -> tuple[list[Shape], list[tuple], list[tuple]]: ...

    def table_renames(self) -> dict[str, str]:
        """Each name a published table had before a schema change renamed it
        (lowered) and the table's name now (change_rows.table_renames): what
        a reader made elsewhere (the Spark job) needs besides selection_rows."""

    def removed_articles(self) -> list[tuple]:
        """The articles removed since the log's truncation point: ``(table,
        publication, columns JSON, subscribe_by, until)``, each holding for
        the log transactions before ``until`` (None: every one logged),
        the commit offset of its removal (selection.plan_from_rows)."""

    def check_log_range(self, after: int, until: int) -> None: ...

    def concerned_reads(self, reads: Sequence[tuple[str, int, int]]) -> list[int]:
        """The indexes of ``reads`` ``(subscriber, after, until)`` (ranges
        checked) whose read can yield anything: a superset (agent.site.concern)."""

    def read_capture(self, after: int, until: int, *, value_columns: int
                     ) -> Iterator[tuple[int, str, list[tuple], dict[int, str]]]: ...

    def log_applied(self, commit: int) -> int | None:
        """For the log transaction ``commit`` of rows an apply wrote back to
        its origin, the origin's log offset the apply had reached (None: any
        other log transaction): what its origin's reader adds to it."""

    def truncate_log(self) -> int:
        """Delete log entries at or below the smallest confirm_sent of all
        peers; return the truncation point."""

    # --- remote users ---------------------------------------------------------------

    def add_remote(self, name: str, *, address: str | None = None, transport: str | None = None,
                   public_key: str | None = None, send_every: int | None = None,
                   send_at: time | str | None = None, start: int | None = None,
                   peer_incarnation: bytes | None = None, now: datetime | None = None) -> RemoteUser:
        """Add a peer.  Its stream starts at ``start`` (default: the log end):
        it is assumed to hold everything up to there."""

    def add_remotes(self, remotes: Sequence[NewRemote], *, now: datetime | None = None,
                    progress: Callable[[int], None] | None = None) -> int:
        """Add a fleet of peers with their subscriptions in one transaction:
        all of them, or none when one is refused (:class:`RemoteRejected`
        names its index).  Each stream starts at the log end.  Returns the
        number of subscriptions stored; ``progress(n)`` is called as chunks
        of ``n`` rows are written."""

    def remove_remote(self, name: str) -> None:
        """Remove a peer and its subscriptions (the log it held back may then
        be truncated)."""

    def remote(self, name: str) -> RemoteUser: ...

    def remotes(self, names: Iterable[str] | None = None) -> tuple[RemoteUser, ...]:
        """Every row of the remote-user table (for ``agent status``); with
        ``names``, the rows of those remotes (a name that is none: no row)."""

    def pairs_due(self, query: DueQuery) -> PairsDue:
        """The pairs that may have something due at a batch run (agent.site.due):
        a superset of those the agent's core finds owe a control message, and
        every pair with a read due, with its read positions."""

    def remote_names(self) -> tuple[str, ...]:
        """The remotes' names, in order (a fleet's names without reading its rows)."""

    def remote_transports(self) -> tuple[str | None, ...]:
        """The distinct transports named in the remote-user table (None:
        a remote that names none)."""

    def iter_remotes(self, which: RemoteFilter = RemoteFilter(), *, chunk: int = 1000) -> Iterator[RemoteUser]:
        """The rows of the remote-user table that ``which`` selects, by name,
        read ``chunk`` at a time from one snapshot (a fleet of ten thousand
        peers: rows are not all held at once).  The snapshot and this
        object's lock are held until the iterator is exhausted or closed."""

    def iter_remote_values(self, which: RemoteFilter = RemoteFilter(), *, chunk: int = 1000
                           ) -> Iterator[tuple[str | int | float | None, ...]]:
        """The rows :meth:`iter_remotes` reads, each a tuple of plain values
        (text, numbers, None) in the order of remote_rules.COLUMNS, as
        remote_rules.plain_values makes them: times as ISO 8601 text in UTC,
        incarnation ids in UUID form, flags as 0 or 1.  For a reader that
        prints every row rather than acting on it (``agent status --json``
        at 100,000 peers): no RemoteUser is made, no time parsed."""

    def counts(self) -> dict[str, int]:
        """Rows of the remote-user, conflict and apply-error tables, counted
        (not read) in one snapshot: ``remotes``, ``conflicts``,
        ``apply_errors``."""

    def all_replaced_incarnations(self) -> dict[str, frozenset[bytes]]:
        """:meth:`replaced_incarnations` of every remote that has any, in one query."""

    def replaced_incarnations(self, name: str) -> frozenset[bytes]:
        """Incarnation ids of ``name``'s copies that a new extraction replaced
        (at the consolidated): their files still in the message system are
        late mail from a database that no longer exists."""

    def update_remote(self, name: str, /, **changes: Any) -> RemoteUser:
        """Change columns of one remote-user row in a short transaction,
        e.g. ``update_remote("r1", log_sent=120, resend_count=2)``."""

    def transport_options(self, peer: str | None = None) -> dict[str, str]:
        """The stored options of the site's own transport, or of the transport to ``peer``."""

    def all_transport_options(self) -> dict[str, dict[str, str]]:
        """Every scope's options: ``""`` the site's own, then one entry per peer that has some."""

    def set_transport(self, *, address: str | None = None, reply_address: str | None = None,
                      transport: str | None = None, options: Mapping[str, str | None] | None = None,
                      peer: str | None = None, inbox: str | None = None) -> None:
        """Change the site's own inbox, reply address, transport and options
        (``peer=None``), or a peer's stored options and own inbox; in one
        transaction.  An option given as None is removed; ``""`` for
        ``reply_address`` or ``inbox`` clears it."""

    def update_remotes(self, changes: dict[str, dict[str, Any]], *, heard: Collection[str] = ()) -> None:
        """:meth:`update_remote` for several rows, in one transaction: the
        agent saves every pair a phase changed at once.  ``heard``: the
        peers a message of arrived while their stream runs, whose errors in
        force are over (:meth:`record_heard`), in the same transaction."""

    def move_reads(self, end: int, *, leave: Collection[str], join: Collection[str]) -> None:
        """A batch run's send phase's moves of the read positions, in one
        transaction (docs/protocol.md, "The common read position"): the
        pairs of ``leave`` that follow the common read position (the range
        concerns them, or the run built them) leave it at its value of now;
        the pairs of ``join`` (the range holds nothing for them; none
        follows it) move to ``end`` and follow it; the common position
        moves to ``end``, the log end, and with it every other follower."""

    def record_sends(self, sends: Sequence[tuple[str, int, int]], *, now: datetime | None = None) -> None:
        """:meth:`record_send` for several ``(name, log_sent, messages)``, in
        one transaction: a send phase records its sends at once."""

    def record_send(self, name: str, *, log_sent: int, messages: int = 1,
                    now: datetime | None = None) -> RemoteUser:
        """Set log_sent after messages went to the outbound queue, counting them."""

    def record_delivered(self, counts: Mapping[str, int], *, now: datetime | None = None) -> None:
        """Count the messages each peer's transport accepted (``send_count``, ``last_sent_at``), in one transaction."""

    def record_transport_error(self, name: str, message: str | None, *,
                               now: datetime | None = None) -> RemoteUser:
        """Remember a transport error with ``name``, in force until a send to
        or a receive from it succeeds, and count it (None clears the one in
        force; the count stays)."""

    def record_stream_stopped(self, name: str, message: str, *, now: datetime | None = None) -> RemoteUser:
        """Remember that the stream with ``name`` stopped (``message`` says
        why and what to do), in force until a message of the peer arrives
        while its stream runs again; counted as an error."""

    def record_heard(self, names: Collection[str]) -> None:
        """A message of each peer of ``names`` arrived while its stream runs:
        its transport error and stopped stream in force are over."""

    def count_run(self, marker_generation: int, marker_incarnation: bytes | None) -> tuple[int, bytes, bytes | None]:
        """Count one agent run (agent/restore.py): given the count and
        incarnation the agent's folder holds, return the new count, the
        site's incarnation, and the incarnation it had when the database
        was put back from an older copy (the folder's count is ahead of
        the database's), in which case the site now has a new one; else
        None.  A site the agent cannot write is one line naming it."""

    # --- apply ------------------------------------------------------------------------

    def apply(self, peer: str, transactions: Iterable[Transaction], *, log_received: int, messages: int = 1,
              peer_incarnation: bytes | None = None, now: datetime | None = None,
              skip_through: int | None = None) -> ApplyResult:
        """Apply ``transactions`` and set ``peer``'s log_received in one
        database transaction: all of it, or nothing.  A
        :class:`~agent.site.apply.MessageChain` in their place: its
        messages, each as an apply of its own, in one transaction
        (``log_received`` is the last one's, ``messages`` not used)."""

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

    def extract_many(self, extractions: Sequence[Extraction], *, now: datetime | None = None
                     ) -> Iterator[ExtractResult]:
        """Extract each of ``extractions`` (as :meth:`extract`, each file
        whole), yielding each result once the remote's file has its name; a
        failure stops there, the remotes before it extracted.  A PostgreSQL
        consolidated reads each table once for all of them, at one point
        (agent/site/sqlite/extract_many.py); a SQLite one extracts them in turn."""

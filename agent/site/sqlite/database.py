"""The SQLite backend of the site interface: one object per open site database.

Rules of this file:
* It implements agent/site/interface.py's ``Site``, where its methods'
  meaning is written; the agent, the CLI and the tools hold it as a
  ``Site``.  It is synchronous; the asyncio
  agent calls it from a worker thread (``asyncio.to_thread``).  One
  :class:`SiteDatabase` serialises its own calls with a lock, so handing it
  to several threads is safe, but two threads gain nothing.
* Every method is one short transaction of its own (or none), except the
  log readers, which fetch chunk by chunk.
* Other processes may use the same file at the same time (applications,
  another agent command); SQLite's WAL mode and write lock arbitrate.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from pathlib import Path
from datetime import datetime, time
from functools import partial
from typing import Any, Callable, Collection, Iterable, Iterator, Mapping, Sequence

from codec.ops import Transaction

from ..apply import ApplyErrorRecord, ApplyResult, ConflictHook, ConflictRecord, MessageChain, Resolution, set_hook
from ..apply.chain import apply_chain
from ..capture import Shape
from ..change_rows import SchemaChangeResult
from ..clock import utc_now
from ..due import DueQuery, PairsDue
from ..errors import InvalidSetting, SchemaConflict, SiteError
from ..extraction import ExtractResult, Extraction
from ..identity import Role, SiteIdentity
from ..publication_rules import Article, Publication, Subscription, SubscriptionChange, Value
from ..reading import (LoggedOperation, concerned_indexes, read_fanout, read_operations, read_transactions,
                       resolve_range, worth_a_look)
from ..remote_rules import NewRemote, RemoteFilter, RemoteUser
from ..fanout import FANOUT_HOLD
from ..settings import SITE_SCOPE
from ._db import DEFAULT_BUSY_TIMEOUT, format_time, read_transaction, sqlite_errors, sqlite_home, write_transaction
from .agent_runs import count_run_locked
from .apply import Applier, list_apply_errors, list_conflicts, set_policy_locked
from .apply.schema import record_conflict
from .capture import ShapeCache, all_shapes, declared_type, refresh_changed_tables
from .changes import apply_schema_locked, passthrough_locked, schema_version, send_new_article_locked, unpublish_locked
from .extract import Consolidated, extract_remote
from .log import SqliteLog, applied_of, cut_locked, iter_capture_returned, log_end, truncate_locked, truncated_through
from .publications import add_article_locked, create_publication_locked, list_publications, list_subscriptions, missing_tables
from .read_positions import move_reads_locked
from .remotes import (acknowledge_apply_errors_locked, add_remote_locked, add_remotes_locked, all_replaced_incarnations,
                      count_rows, get_remote, iter_remote_values_locked, iter_remotes_locked, list_remote_names,
                      list_remotes, open_apply_errors, pairs_due,
                      record_delivered_locked, record_error_locked, record_heard_locked, record_send_locked,
                      record_stream_stopped_locked, remove_remote_locked, replaced_incarnations, update_remote_locked,
                      update_remotes_locked)
from .resubscribe import change_locked
from .schema import SecretStore, init_database, open_database, read_identity
from .selection import (SubscriberReader, concern_rows, export_rows, reader_rows, removed_articles, renames,
                        subscriber_reader)
from .settings import read_all_options, read_options, set_transport_locked


class SiteDatabase:
    """An open site database.  Make one with :meth:`init` or :meth:`open`."""

    def __init__(self, conn: Any, path: str) -> None:
        self._conn = conn
        self.path = path
        self._lock = threading.RLock()
        self._shapes = ShapeCache(conn)
        self._source = SqliteLog(conn, self._lock)  # the log as agent.site.reading reads it
        self._applier = Applier(conn, self._shapes)
        self._schema_seen = -1
        with sqlite_errors(f"reading the identity of {path}"):
            self._identity = read_identity(conn)
            conn.execute(f"PRAGMA foreign_keys = {int(self._identity.role is Role.REMOTE)}")  # a remote's apply checks them

    # --- life cycle -------------------------------------------------------------------

    @classmethod
    def init(cls, path: str | os.PathLike[str], *, name: str, role: Role | str, address: str | None = None,
             transport: str | None = None, public_key: str | None = None, now: datetime | None = None,
             busy_timeout: float = DEFAULT_BUSY_TIMEOUT) -> "SiteDatabase":
        """Turn the SQLite file at ``path`` (existing or new) into a site:
        its own tables, WAL mode, a name, a role and a new incarnation id."""
        conn = init_database(path, name=name, role=role, address=address, transport=transport,
                             public_key=public_key, now=now, busy_timeout=busy_timeout)
        return cls(conn, os.fspath(path))

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
             store_secret: SecretStore | None = None) -> "SiteDatabase":
        """Open an existing site, upgrading an older layout.  A database of
        layout 3 or older that still holds the site's secret key hands it to
        ``store_secret(path, secret)`` before forgetting it; without one it
        is refused (:class:`SecretInDatabase`)."""
        conn = open_database(path, busy_timeout=busy_timeout, store_secret=store_secret)
        return cls(conn, os.fspath(path))

    def close(self) -> None:
        """Close the connection.  Idempotent."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> "SiteDatabase":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def identity(self) -> SiteIdentity:
        return self._identity

    @property
    def home(self) -> Path:
        """The agent's own folder: ``<file>.agent`` beside the file."""
        return sqlite_home(self.path)

    def agent_lock(self) -> contextlib.AbstractContextManager[None]:
        """Nothing to hold: the spool's lock, in the folder beside the file, is the one agent's."""
        return contextlib.nullcontext()

    @property
    def connection(self) -> Any:
        """The underlying sqlite3 connection (tests and tools only)."""
        return self._conn

    def _write(self, doing: str):  # type: ignore[no-untyped-def]
        if self._conn is None:
            raise SiteError(f"site database {self.path} is closed")
        return write_transaction(self._conn, doing)

    def _read(self, doing: str):  # type: ignore[no-untyped-def]
        if self._conn is None:
            raise SiteError(f"site database {self.path} is closed")
        return read_transaction(self._conn, doing)

    def _refresh_identity(self) -> None:
        self._identity = read_identity(self._conn)

    # --- publications and subscriptions --------------------------------------------

    def create_publication(self, name: str, articles: Iterable[Article | str] = (), *,
                           now: datetime | None = None) -> Publication:
        with self._lock, self._write(f"creating publication {name!r}"):
            create_publication_locked(self._conn, name, articles, now)
            return self._publication(name)

    def add_article(self, publication: str, table: str, *, columns: Iterable[str] | None = None,
                    subscribe_by: str | None = None, follows: str | None = None,
                    follow_columns: Iterable[str] | None = None, now: datetime | None = None) -> Article:
        article = Article(table, None if columns is None else tuple(columns), subscribe_by, follows,
                          None if follow_columns is None else tuple(follow_columns))
        with self._lock, self._write(f"publishing table {table!r}"):  # and sending it (docs/site-database.md)
            added = add_article_locked(self._conn, publication, article)
            send_new_article_locked(self._conn, self._identity, publication, added.table, format_time(now or utc_now()))
            return added

    def remove_article(self, table: str, publication: str | None = None, *,
                       now: datetime | None = None) -> tuple[str, ...]:
        with self._lock, self._write(f"unpublishing table {table!r}"):  # and telling the remotes
            return unpublish_locked(self._conn, self._identity, format_time(now or utc_now()), table, publication)

    def drop_publication(self, name: str, *, now: datetime | None = None) -> tuple[str, ...]:
        with self._lock, self._write(f"dropping publication {name!r}"):
            return unpublish_locked(self._conn, self._identity, format_time(now or utc_now()), None, name)

    def declared_type(self, table: str, column: str) -> str | None:
        """The type ``table.column`` declares (None: no such column)."""
        with self._lock, self._read(f"reading the columns of {table!r}"):
            return declared_type(self._conn, table, column)

    def missing_tables(self) -> tuple[str, ...]:
        with self._lock, self._read("listing published tables"):
            return missing_tables(self._conn)

    def publications(self) -> tuple[Publication, ...]:
        with self._lock, self._read("listing publications"):
            return list_publications(self._conn)

    def _publication(self, name: str) -> Publication:
        return next(p for p in list_publications(self._conn) if p.name == name)

    def subscribe(self, remote: str, publication: str, value: Value = None, *,
                  now: datetime | None = None) -> SubscriptionChange:
        return self._subscription(remote, publication, value, True, now)

    def unsubscribe(self, remote: str, publication: str, value: Value = None, *,
                    now: datetime | None = None) -> SubscriptionChange:
        return self._subscription(remote, publication, value, False, now)

    def _subscription(self, remote: str, publication: str, value: Value, subscribe: bool,
                      now: datetime | None) -> SubscriptionChange:
        with self._lock, self._write(f"changing the subscriptions of {remote!r} to {publication!r}"):
            return change_locked(self._conn, self._identity, self._shapes, remote, publication, value,
                                 subscribe=subscribe, created_at=format_time(now or utc_now()))

    def subscriptions(self, remote: str | None = None) -> tuple[Subscription, ...]:
        with self._lock, self._read("listing subscriptions"):
            return list_subscriptions(self._conn, remote)

    def apply_schema(self, scripts: Iterable[str], *, unchecked: bool = False, now: datetime | None = None,
                     lock_timeout: float | None = None) -> SchemaChangeResult:
        """Run the SQL of ``scripts`` at the consolidated as one schema change that reaches the remotes
        holding its tables in order with the data (docs/site-database.md, "Schema changes");
        SchemaRefused, and nothing changed, for what it may not do.  It waits
        for the database's write lock as every writer of the site does (its
        busy timeout); ``lock_timeout`` is PostgreSQL's (changes.py there):
        SQLite's readers never queue behind a writer that waits."""
        with self._lock, self._write("applying a schema change"):
            return apply_schema_locked(self._conn, self._identity, scripts, unchecked=unchecked,
                                       made_at=format_time(now or utc_now()))

    def passthrough(self, scripts: Iterable[str], remotes: Iterable[str], *, now: datetime | None = None) -> int:
        """Send the data statements of ``scripts`` to ``remotes`` only, in
        order with the data, to run there as their own writes
        (docs/site-database.md, "Passthrough"); their commit offset here.
        SchemaRefused, and nothing sent, for what passthrough may not do."""
        with self._lock, self._write("sending passthrough SQL"):
            return passthrough_locked(self._conn, self._identity, scripts, remotes,
                                      made_at=format_time(now or utc_now()))

    # --- the log ----------------------------------------------------------------------

    def scan(self) -> int:
        """Cut everything captured and committed since the last scan into one
        log transaction (origin: this site); return the log end.

        Runs under the write lock, so no application transaction is in
        progress and none is ever split.  Also re-installs capture for
        published tables whose definition changed (ALTER TABLE).
        """
        with self._lock, self._write("scanning captured changes"):
            self._refresh_capture()
            return cut_locked(self._conn, self._identity.name)

    def _refresh_capture(self) -> None:
        """Re-install capture of tables altered since they were published
        (inside a write transaction; cheap when the schema did not change)."""
        version = self._conn.execute("PRAGMA schema_version").fetchone()[0]
        if version != self._schema_seen:
            refresh_changed_tables(self._conn)
            self._schema_seen = self._conn.execute("PRAGMA schema_version").fetchone()[0]

    def log_end(self) -> int:
        with self._lock, sqlite_errors("reading the log end"):
            return log_end(self._conn)

    def change_marker(self) -> tuple[int, int]:
        """What moves whenever anything is committed to the database: by
        another connection (``PRAGMA data_version``) or by this one (its
        count of changed rows).  Equal markers: nothing changed between."""
        with self._lock, sqlite_errors("reading the database's change marker"):
            [(version,)] = self._conn.execute("PRAGMA data_version").fetchall()
            return version, self._conn.total_changes

    def log_start(self) -> int:
        with self._lock, sqlite_errors("reading the log's truncation point"):
            return truncated_through(self._conn)

    def schema_version(self) -> int | None:
        with self._lock, sqlite_errors("reading the schema version"):
            return schema_version(self._conn)

    def read_log(self, subscriber: str, after: int, until: int | None = None) -> Iterator[Transaction]:
        """The log transactions in ``(after, until]`` as ``subscriber`` sees
        them, in commit order, read in chunks.

        ``until`` defaults to the log end when the call is made; pass the
        value of :meth:`log_end` to know where the read stopped.  Transactions
        with nothing for the subscriber are left out.  A single log
        transaction is held in memory whole; :meth:`read_log_ops` streams
        operation by operation.
        """
        reader, until = self._reader(subscriber, after, until)
        return read_transactions(self._source, reader, after, until)

    def read_log_ops(self, subscriber: str, after: int, until: int | None = None) -> Iterator[LoggedOperation]:
        """Like :meth:`read_log`, one ``(commit, origin, operation)`` at a time."""
        reader, until = self._reader(subscriber, after, until)
        return read_operations(self._source, reader, after, until)

    def read_logs(self, reads: Iterable[tuple[str, int, int | None]], *, hold: int = FANOUT_HOLD,
                  piece: int | None = None, runs: bool = False) -> Iterator[tuple[int, Transaction]]:
        """:meth:`read_log` for several subscribers in one pass over the log: ``reads`` are ``(subscriber,
        after, until)``; yields ``(index, transaction)``, ``index`` into ``reads``, for each subscriber exactly
        what ``read_log(subscriber, after, until)`` yields, in commit order (those of one log transaction
        together).  Every range is checked first (raising as :meth:`read_log` does); each capture row is
        read once and offered only to the subscribers it can concern.  Memory holds one chunk of capture
        rows and at most ``hold`` operations of one log transaction (one that selects more is read for each
        subscriber in turn).  With ``piece``, a log transaction read for one subscriber that selects more
        than about ``piece`` operations comes in pieces (``codec.ops.PartialTransaction``, then a plain
        ``Transaction``: docs/message-format.md, "Large transactions").  With ``runs``, INSERTs and
        DELETEs come bundled in runs (codec.ops.Run, what a packer writes)."""
        reads = list(reads)
        names = [subscriber for subscriber, _, _ in reads]
        with self._lock, self._read(f"preparing to read the log for {len(reads)} subscribers"):
            rows = reader_rows(self._conn, self._identity, names)
            resolved: dict[tuple[int, int | None], int] = {}  # most reads share their range
            ranges = []
            for _, after, until in reads:
                if (after, until) not in resolved:
                    resolved[after, until] = resolve_range(self._source, after, until)
                ranges.append((after, resolved[after, until]))
        readers = rows.readers(self._identity, self._shapes, names, runs=runs)
        return read_fanout(self._source, readers, ranges, hold=hold, piece=piece)

    def concerned_reads(self, reads: Sequence[tuple[str, int, int]]) -> list[int]:
        """The indexes of ``reads`` ``(subscriber, after, until)`` whose read
        can yield anything, or whose range the log cannot serve: a superset,
        found from one look at the ranges' capture rows (agent.site.concern),
        so that a send phase makes readers only for those."""
        names = [name for name, _, _ in reads]
        if not worth_a_look(self._identity, len(names)):
            return list(range(len(names)))
        with self._lock, self._read(f"finding what the log holds for {len(reads)} subscribers"):
            return concerned_indexes(self._source, self._shapes, concern_rows(self._conn), names,
                                     [(after, until) for _, after, until in reads])

    def _reader(self, subscriber: str, after: int, until: int | None) -> tuple[SubscriberReader, int]:
        with self._lock, self._read(f"preparing to read the log for {subscriber!r}"):
            reader = subscriber_reader(self._conn, self._identity, self._shapes, subscriber)
            return reader, resolve_range(self._source, after, until)

    # --- batch export (docs/spark.md) ------------------------------------------------

    def selection_rows(self, subscribers: Iterable[str]) -> tuple[list[Shape], list[tuple], list[tuple]]:
        """What a batch export carries to select for ``subscribers``: every shape, the article rows (table,
        publication, columns JSON, subscribe_by or route.ROUTE) and the subscribers' subscription rows (remote,
        publication, value, since, until), ended ones included.  Raises for an unknown remote."""
        with self._lock, self._read("reading publications for a batch export"):
            articles, subscriptions = export_rows(self._conn, self._identity, list(subscribers))
            return all_shapes(self._conn), articles, subscriptions

    def table_renames(self) -> dict[str, str]:
        """The changes made here (the consolidated) or applied (a remote), in order."""
        with self._lock, self._read("reading the table renames"):
            return renames(self._conn)

    def removed_articles(self) -> list[tuple]:
        with self._lock, self._read("reading the removed articles"):
            return removed_articles(self._conn)

    def check_log_range(self, after: int, until: int) -> None:
        """Raise as :meth:`read_log` would for the range ``(after, until]``."""
        with self._lock, self._read("checking a log range"):
            resolve_range(self._source, after, until)

    def read_capture(self, after: int, until: int, *, value_columns: int
                     ) -> Iterator[tuple[int, str, list[tuple], dict[int, str]]]:
        """Every capture row of the log transactions in ``(after, until]``, unselected: ``(commit, origin,
        rows, returned)`` chunk by chunk in seq order, rows as :func:`iter_capture` gives them (the first
        ``value_columns`` value columns), ``returned`` the listed columns of the chunk's rows written back
        to their origin.  Both bounds must be commit boundaries (:meth:`check_log_range`)."""
        return iter_capture_returned(self._conn, after, until, value_columns=value_columns, lock=self._lock)

    def log_applied(self, commit: int) -> int | None:
        """For the log transaction ``commit`` of rows an apply wrote back to
        its origin, the origin's log offset the apply had reached (None: any
        other); a batch export carries it (docs/spark.md)."""
        with self._lock:
            return applied_of(self._conn, commit)

    def truncate_log(self) -> int:
        with self._lock, self._write("truncating the log"):
            return truncate_locked(self._conn)

    # --- remote users ---------------------------------------------------------------

    def add_remote(self, name: str, *, address: str | None = None, transport: str | None = None,
                   public_key: str | None = None, send_every: int | None = None,
                   send_at: time | str | None = None, start: int | None = None,
                   peer_incarnation: bytes | None = None, now: datetime | None = None) -> RemoteUser:
        with self._lock, self._write(f"adding remote {name!r}"):
            return add_remote_locked(self._conn, self._identity, name, address=address, transport=transport,
                                     public_key=public_key, send_every=send_every, send_at=send_at, start=start,
                                     peer_incarnation=peer_incarnation, now=now)

    def add_remotes(self, remotes: Sequence[NewRemote], *, now: datetime | None = None,
                    progress: Callable[[int], None] | None = None) -> int:
        with self._lock, self._write(f"adding {len(remotes)} remotes"):
            return add_remotes_locked(self._conn, self._identity, remotes, now=now, progress=progress)

    def remove_remote(self, name: str) -> None:
        with self._lock, self._write(f"removing remote {name!r}"):
            remove_remote_locked(self._conn, name)

    def remote(self, name: str) -> RemoteUser:
        with self._lock, self._read(f"reading remote {name!r}"):
            return get_remote(self._conn, name)

    def remotes(self, names: Iterable[str] | None = None) -> tuple[RemoteUser, ...]:
        with self._lock, self._read("listing remotes"):
            return list_remotes(self._conn, names)

    def pairs_due(self, query: DueQuery) -> PairsDue:
        with self._lock, self._read("finding the pairs with something due"):
            return pairs_due(self._conn, query)

    def remote_names(self) -> tuple[str, ...]:
        with self._lock, self._read("listing the remotes' names"):
            return list_remote_names(self._conn)

    def remote_transports(self) -> tuple[str | None, ...]:
        with self._lock, self._read("listing the remotes' transports"):
            return tuple(name for (name,) in self._conn.execute(
                "SELECT DISTINCT transport FROM fieldsync_remote ORDER BY transport"))

    def iter_remotes(self, which: RemoteFilter = RemoteFilter(), *, chunk: int = 1000) -> Iterator[RemoteUser]:
        with self._lock, self._read("listing remotes"):
            yield from iter_remotes_locked(self._conn, which, chunk=chunk)

    def iter_remote_values(self, which: RemoteFilter = RemoteFilter(), *, chunk: int = 1000) -> Iterator[tuple]:
        with self._lock, self._read("listing remotes"):
            yield from iter_remote_values_locked(self._conn, which, chunk=chunk)

    def counts(self) -> dict[str, int]:
        with self._lock, self._read("counting remotes, conflicts and apply errors"):
            return count_rows(self._conn)

    def all_replaced_incarnations(self) -> dict[str, frozenset[bytes]]:
        with self._lock, self._read("reading the replaced copies"):
            return all_replaced_incarnations(self._conn)

    def replaced_incarnations(self, name: str) -> frozenset[bytes]:
        with self._lock, self._read(f"reading the replaced copies of {name!r}"):
            return replaced_incarnations(self._conn, name)

    def update_remote(self, name: str, /, **changes: Any) -> RemoteUser:
        with self._lock, self._write(f"updating remote {name!r}"):
            return update_remote_locked(self._conn, name, changes)

    # --- transport settings stored with the site (agent/site/sqlite/settings.py) ----

    def transport_options(self, peer: str | None = None) -> dict[str, str]:
        with self._lock, self._read("reading transport options"):
            return read_options(self._conn, SITE_SCOPE if peer is None else peer)

    def all_transport_options(self) -> dict[str, dict[str, str]]:
        with self._lock, self._read("reading transport options"):
            return read_all_options(self._conn)

    def set_transport(self, *, address: str | None = None, reply_address: str | None = None,
                      transport: str | None = None, options: Mapping[str, str | None] | None = None,
                      peer: str | None = None, inbox: str | None = None) -> None:
        with self._lock, self._write("storing transport settings"):
            set_transport_locked(self._conn, address=address, reply_address=reply_address, transport=transport,
                                 options=options, peer=peer, inbox=inbox)
        self._refresh_identity()

    def update_remotes(self, changes: dict[str, dict[str, Any]], *, heard: Collection[str] = ()) -> None:
        if not changes and not heard:
            return
        with self._lock, self._write(f"updating {len(changes)} remotes"):
            update_remotes_locked(self._conn, changes)
            record_heard_locked(self._conn, heard)

    def move_reads(self, end: int, *, leave: Collection[str], join: Collection[str]) -> None:
        with self._lock, self._write(f"moving the read positions to {end}"):
            move_reads_locked(self._conn, end, log_end(self._conn), leave, join)

    def record_sends(self, sends: Sequence[tuple[str, int, int]], *, now: datetime | None = None) -> None:
        if not sends:
            return
        with self._lock, self._write(f"recording {len(sends)} sends"):
            for name, log_sent, messages in sends:
                record_send_locked(self._conn, name, log_sent, messages, now)

    def record_send(self, name: str, *, log_sent: int, messages: int = 1, now: datetime | None = None) -> RemoteUser:
        with self._lock, self._write(f"recording a send to {name!r}"):
            return record_send_locked(self._conn, name, log_sent, messages, now)

    def record_delivered(self, counts: Mapping[str, int], *, now: datetime | None = None) -> None:
        if not counts:
            return
        with self._lock, self._write(f"counting messages sent to {len(counts)} peers"):
            for name, messages in counts.items():
                record_delivered_locked(self._conn, name, messages, now)

    def record_transport_error(self, name: str, message: str | None, *, now: datetime | None = None) -> RemoteUser:
        with self._lock, self._write(f"recording an error for {name!r}"):
            return record_error_locked(self._conn, name, message, now)

    def record_stream_stopped(self, name: str, message: str, *, now: datetime | None = None) -> RemoteUser:
        with self._lock, self._write(f"recording the stopped stream of {name!r}"):
            return record_stream_stopped_locked(self._conn, name, message, now)

    def record_heard(self, names: Collection[str]) -> None:
        if names:
            with self._lock, self._write(f"clearing the errors of {len(names)} peers"):
                record_heard_locked(self._conn, names)

    def count_run(self, marker_generation: int, marker_incarnation: bytes | None) -> tuple[int, bytes, bytes | None]:
        with self._lock:
            try:
                with self._write("counting this agent run"):
                    counted = count_run_locked(self._conn, self._identity, marker_generation, marker_incarnation)
            except SiteError as error:
                if isinstance(error.__cause__, sqlite3.Error) and "readonly" in str(error.__cause__):
                    # The file or its folder: the agent writes at every run.
                    raise SiteError(f"{self.path}: the agent cannot write to the site database ({error.__cause__}); "
                                    "it needs the file and its folder writable") from None
                raise
            self._refresh_identity()
        return counted

    # --- apply ------------------------------------------------------------------------

    def apply(self, peer: str, transactions: Iterable[Transaction], *, log_received: int, messages: int = 1,
              peer_incarnation: bytes | None = None, now: datetime | None = None,
              skip_through: int | None = None) -> ApplyResult:
        """Apply ``transactions`` from ``peer`` and set its ``log_received``,
        all in one SQLite transaction.

        Transactions with a commit at or below ``skip_through`` are skipped;
        None (the default) means the recorded log_received, which is what
        keeps a transaction from being applied twice.  The protocol passes
        its ``Apply.skip_through``: the same value, except under its
        test-only ``unsafe_without_duplicate_rule`` setting, where it is the
        message's ``prev`` and overlapping transactions are applied again
        (the fault suite's proof that it notices).  A value beyond the
        recorded log_received is refused (it would skip transactions never
        applied)."""
        try:
            with self._lock, self._write(f"applying transactions from {peer!r}"):
                self._refresh_capture()
                if isinstance(transactions, MessageChain):
                    return apply_chain(partial(self._applier.apply_locked, self._identity, peer), transactions,
                                       skip_through=skip_through, peer_incarnation=peer_incarnation, now=now)
                return self._applier.apply_locked(self._identity, peer, transactions, log_received,
                                                  messages=messages, peer_incarnation=peer_incarnation, now=now,
                                                  skip_through=skip_through)
        except SchemaConflict as conflict:  # all of it rolled back; recorded on its own, the stream waits
            with self._lock, self._write(f"recording the schema conflict with {peer!r}"):
                record_conflict(self._conn, peer, conflict, format_time(now or utc_now()))
            raise

    def set_conflict_policy(self, table: str, policy: Resolution | str | None) -> None:
        """Per-table conflict policy at the consolidated (None: the default,
        incoming wins)."""
        with self._lock, self._write(f"setting the conflict policy of {table!r}"):
            set_policy_locked(self._conn, table, policy)

    def set_conflict_hook(self, table: str | None, hook: ConflictHook | None) -> None:
        """A Python callable deciding conflicts on ``table`` (None: every
        table without its own hook).  It returns a Resolution or a dict of
        column values to write (a merge).  Hooks live in this object only."""
        with self._lock:
            set_hook(self._applier.hooks, table, hook)

    def conflicts(self, after_id: int = 0) -> tuple[ConflictRecord, ...]:
        with self._lock, self._read("listing conflicts"):
            return list_conflicts(self._conn, after_id)

    def apply_errors(self, after_id: int = 0) -> tuple[ApplyErrorRecord, ...]:
        with self._lock, self._read("listing apply errors"):
            return list_apply_errors(self._conn, after_id)

    def open_apply_errors(self) -> dict[str, int]:
        """The apply errors not yet acknowledged, counted by peer."""
        with self._lock, self._read("counting the apply errors not acknowledged"):
            return open_apply_errors(self._conn)

    def acknowledge_apply_errors(self, peer: str, *, through: int | None = None,
                                 now: datetime | None = None) -> int:
        """Acknowledge the apply errors of ``peer``'s messages (up to the id
        ``through``, when given): they stop counting as an error in force
        and stay in the table as history.  Returns how many were stamped."""
        with self._lock, self._write(f"acknowledging the apply errors of {peer!r}"):
            return acknowledge_apply_errors_locked(self._conn, peer, now, through)

    # --- extraction ------------------------------------------------------------------

    def extract(self, remote: str, path: str | os.PathLike[str], *, keys: Any = None,
                now: datetime | None = None, options: Mapping[str, str] | None = None):  # type: ignore[no-untyped-def]
        """Create the remote database of ``remote`` at ``path``; see
        :func:`agent.site.sqlite.extract.extract_remote`."""
        consolidated = Consolidated(self._conn, self._lock, self._identity, self.path)
        return extract_remote(consolidated, remote, path, keys=keys, now=now, options=options)

    def extract_many(self, extractions: Sequence[Extraction], *, now: datetime | None = None
                     ) -> Iterator[ExtractResult]:
        """Each of ``extractions`` in turn, at a point of its own: each copy
        reads its remote's rows through the SUBSCRIBE BY column's index."""
        for extraction in extractions:
            yield self.extract(extraction.remote, extraction.path, keys=extraction.keys, now=now,
                               options=extraction.options)


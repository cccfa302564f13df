"""A consolidated site in a PostgreSQL database: the PostgreSQL backend of
the site interface (agent/site/interface.py).

Rules of this file:
* :class:`PostgresSite` offers SiteDatabase's methods for the site's
  identity, publications, subscriptions, remotes, transport settings, log
  bookkeeping, reading the log for subscribers, extraction and apply with
  the same signatures, values and errors; the rules live in the modules it
  calls (identity.py, catalogue.py, subscriptions.py, remotes.py,
  settings.py, log.py, reading.py, extract.py, apply/), each over
  agent.site's pure rules, and reading is agent.site.reading's over
  log.PgLog.  The remote-user table's methods are in its base class
  (remote_users.py).
* One connection, in autocommit mode; every method is one explicit
  transaction (or one statement), under this object's lock, so handing it
  to several threads is safe.  PostgreSQL's errors leave as the site's
  (connect.translate): one line naming the database and what was being
  done.
* Times recorded are the caller's ``now`` (agent.site.clock).
* Apply (apply/): a peer's message and its ``log_received`` in one
  transaction on the site's connection, with SQLite's rules; conflict
  hooks live in this object, as in SiteDatabase.
* The agent holds its lock (lock.py) through :meth:`PostgresSite.agent_lock` while it runs."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

from codec.ops import Transaction

from ..apply import ApplyErrorRecord, ApplyResult, ConflictHook, ConflictRecord, Resolution, set_hook
from ..capture import Shape
from ..change_rows import SchemaChangeResult
from .. import points
from ..clock import utc_now
from ..errors import SiteError
from ..extraction import ExtractResult, Extraction
from ..identity import Role, SiteIdentity
from ..publication_rules import Article, Publication, Subscription, SubscriptionChange, Value
from ..reading import (LoggedOperation, concerned_indexes, read_fanout, read_operations, read_transactions,
                       resolve_range, worth_a_look)
from ..fanout import FANOUT_HOLD
from ..selection import SubscriberReader
from ..settings import SITE_SCOPE
from ..sqlite.extract import extract_remote
from ..sqlite.extract_many import extract_remotes
from . import catalogue, reading, remotes as remote_rows, resubscribe, settings, subscriptions as subscription_rows
from .agent_runs import count_run
from .apply import PgApplier, records
from .article_drops import article_drops_to, send_article_drops_in
from .capture import describe_table
from .changes import apply_schema_in, change_offset, schema_version
from .new_tables import finish_sends, send_new_table_in
from .passthrough import passthrough_in
from .connect import connect, translate
from .extract import PgConsolidated
from .extract_many import PgFleetSource
from .identity import init_identity, read_identity, set_site_transport
from .lock import AgentLock
from .remote_users import RemoteUsers
from .log import PgLog, cut, log_end, truncate_log, truncated_through
from .schema import check_layout
from .typemap import KINDS
from .uri import PgTarget, parse_uri

# What moves whenever a transaction ends anywhere in the cluster: the first
# transaction id not yet finished (xmax, which only grows) and how many below
# it still run (a list that only shrinks while xmax stays).
_MARKER = ("SELECT pg_catalog.pg_snapshot_xmax(s)::text::bigint, (SELECT count(*) FROM"
           " pg_catalog.pg_snapshot_xip(s)) FROM pg_catalog.pg_current_snapshot() AS s")


def _target(target: PgTarget | str) -> PgTarget:
    return target if isinstance(target, PgTarget) else parse_uri(target)


class PostgresSite(RemoteUsers):
    """An open PostgreSQL site.  Make one with :meth:`init` or :meth:`open`."""

    def __init__(self, conn: psycopg.Connection, target: PgTarget) -> None:
        self._conn: psycopg.Connection | None = conn
        self.target = target
        self.path = target.uri  # as the user named it (it holds no password: uri.py refuses one)
        self._lock = threading.RLock()
        self._source = PgLog(conn, target, self._lock, {})  # the log as agent.site.reading reads it
        self._applier = PgApplier(target)
        try:
            self._identity, self._home = read_identity(conn, target)
        except psycopg.Error as error:
            raise translate(error, target, "reading the site's identity") from None

    # --- life cycle -------------------------------------------------------------------

    @classmethod
    def init(cls, target: PgTarget | str, *, name: str, role: Role | str, home: str | os.PathLike[str],
             address: str | None = None, transport: str | None = None, public_key: str | None = None,
             now: datetime | None = None) -> "PostgresSite":
        """Turn the database at ``target`` into a consolidated site: the
        ``fieldsync`` schema, a name and a new incarnation id, and ``home``,
        the agent's own folder (absolute; made 0700 when missing)."""
        target = _target(target)
        conn = connect(target)
        try:
            init_identity(conn, target, name=name, role=role, home=home, address=address, transport=transport,
                          public_key=public_key, now=now)
            return cls(conn, target)
        except BaseException:
            conn.close()
            raise

    @classmethod
    def open(cls, target: PgTarget | str) -> "PostgresSite":
        """Open an existing site, upgrading an older layout."""
        target = _target(target)
        conn = connect(target)
        try:
            check_layout(conn, target)
            return cls(conn, target)
        except BaseException:
            conn.close()
            raise

    def close(self) -> None:
        """Close the connection.  Idempotent."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> "PostgresSite":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def identity(self) -> SiteIdentity:
        return self._identity

    @property
    def home(self) -> Path:
        """The agent's own folder, given to :meth:`init` (an absolute path on
        the agent's host): its key, queues and state live there."""
        return self._home

    def agent_lock(self) -> contextlib.AbstractContextManager[None]:
        """The advisory lock of the one agent of this database (lock.py), held
        on a connection of its own while the agent runs, wherever it runs."""
        return AgentLock(self.target)

    @property
    def connection(self) -> psycopg.Connection:
        """The underlying connection (tests and tools only)."""
        return self._live()

    def _live(self) -> psycopg.Connection:
        if self._conn is None:
            raise SiteError(f"the site at {self.target.where} is closed")
        return self._conn

    @contextmanager
    def _transaction(self, doing: str, *, snapshot: bool = False) -> Iterator[psycopg.Connection]:
        """One transaction (REPEATABLE READ with ``snapshot``: every read in
        it sees one snapshot), under the lock; PostgreSQL's errors as the site's."""
        with self._lock:
            conn = self._live()
            try:
                with conn.transaction():
                    if snapshot:
                        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                    yield conn
            except psycopg.Error as error:
                raise translate(error, self.target, doing) from None

    def count_run(self, marker_generation: int, marker_incarnation: bytes | None) -> tuple[int, bytes, bytes | None]:
        with self._transaction("counting this agent run") as conn:
            counted = count_run(conn, self._identity, marker_generation, marker_incarnation)
        self._refresh_identity()
        return counted

    def _refresh_identity(self) -> None:
        with self._transaction("reading the site's identity") as conn:
            self._identity, self._home = read_identity(conn, self.target)

    # --- publications and subscriptions --------------------------------------------

    def create_publication(self, name: str, articles: Iterable[Article | str] = (), *,
                           now: datetime | None = None) -> Publication:
        """Create a publication of ``articles`` (Article values or table
        names) and start capturing their tables."""
        with self._transaction(f"creating publication {name!r}") as conn:
            catalogue.create_publication(conn, self.target, name, articles, now or utc_now())
            return next(item for item in catalogue.list_publications(conn) if item.name == name)

    def add_article(self, publication: str, table: str, *, columns: Iterable[str] | None = None,
                    subscribe_by: str | None = None, follows: str | None = None,
                    follow_columns: Iterable[str] | None = None, now: datetime | None = None) -> Article:
        article = Article(table, None if columns is None else tuple(columns), subscribe_by, follows,
                          None if follow_columns is None else tuple(follow_columns))
        with self._lock:
            with self._transaction(f"publishing table {table!r}") as conn:
                made = catalogue.add_article(conn, self.target, publication, article)
                layout = describe_table(conn, made.table).layout
                sent = send_new_table_in(conn, self._identity.name, publication, layout.schema, layout.table,
                                         now or utc_now())
            if sent:
                self._finish_sends()
            return made

    def remove_article(self, table: str, publication: str | None = None, *,
                       now: datetime | None = None) -> tuple[str, ...]:
        """Stop publishing ``table`` in ``publication`` (None: in every one); its capture goes with its last."""
        with self._transaction(f"unpublishing table {table!r}") as conn:  # and telling the remotes
            held = {row[:2]: row for row in reading.article_rows(conn)}  # as they are before they go
            removed = catalogue.remove_article(conn, self.target, table, publication)
            to = article_drops_to(conn, [held for _, held in removed])  # its subscriptions stay
            return send_article_drops_in(conn, self._identity.name, [held[pair] for pair in removed], to,
                                         now or utc_now())

    def drop_publication(self, name: str, *, now: datetime | None = None) -> tuple[str, ...]:
        with self._transaction(f"dropping publication {name!r}") as conn:
            to = article_drops_to(conn, [name])
            held = {row[:2]: row for row in reading.article_rows(conn)}  # as they are before they go
            removed = catalogue.drop_publication(conn, self.target, name)
            return send_article_drops_in(conn, self._identity.name, [held[pair] for pair in removed], to,
                                         now or utc_now(), dropped=name)

    def declared_type(self, table: str, column: str) -> str | None:
        """What a SQLite copy of ``table.column`` declares, by the types table
        (None: no such column; a type outside the table raises)."""
        with self._transaction(f"reading the columns of {table!r}") as conn:
            layout = describe_table(conn, table).layout
        found = [kind for name, kind in zip(layout.columns, layout.kinds) if name.lower() == column.lower()]
        return KINDS[found[0]].sqlite_type if found else None

    def missing_tables(self) -> tuple[str, ...]:
        """Published tables that are no longer in the database (an
        application renamed or dropped them)."""
        with self._transaction("listing published tables") as conn:
            return catalogue.missing_tables(conn)

    def publications(self) -> tuple[Publication, ...]:
        with self._transaction("listing publications", snapshot=True) as conn:
            return catalogue.list_publications(conn)

    def subscribe(self, remote: str, publication: str, value: Value = None, *,
                  now: datetime | None = None) -> SubscriptionChange:
        """Subscribe ``remote`` to ``publication`` with ``value`` (once the
        remote is extracted, its new rows go through its stream: resubscribe.py)."""
        return self._subscription(remote, publication, value, True, now)

    def unsubscribe(self, remote: str, publication: str, value: Value = None, *,
                    now: datetime | None = None) -> SubscriptionChange:
        """End one subscription (InvalidSetting if there is none such)."""
        return self._subscription(remote, publication, value, False, now)

    def _subscription(self, remote: str, publication: str, value: Value, subscribe: bool,
                      now: datetime | None) -> SubscriptionChange:
        doing = f"changing the subscriptions of {remote!r} to {publication!r}"
        with self._lock:
            with self._transaction(doing) as conn:
                change = subscription_rows.change_subscription(conn, self._identity, remote, publication, value,
                                                               subscribe=subscribe, now=now or utc_now())
                if change is not None:
                    return change
                tables = resubscribe.publication_tables(conn, publication)
            # Extracted: the rows that enter or leave its subset go through its stream.
            with self._transaction(doing) as conn:
                change, txid = resubscribe.change_in(conn, self._identity, remote, publication, value,
                                                     subscribe=subscribe, now=now or utc_now(), tables=tables)
            if txid is None:
                return change
            points.reached("resubscribe.before-cut")
            self.scan()  # the rows' log transaction, and the end of a subscription they end
            with self._transaction("reading the subscription change's offset") as conn:
                return dataclasses.replace(change, offset=resubscribe.offset_of(conn, txid))

    def subscriptions(self, remote: str | None = None) -> tuple[Subscription, ...]:
        with self._transaction("listing subscriptions") as conn:
            return subscription_rows.list_subscriptions(conn, remote)

    # --- schema changes ---------------------------------------------------------------

    def apply_schema(self, scripts: Iterable[str], *, unchecked: bool = False, now: datetime | None = None,
                     lock_timeout: float | None = None) -> SchemaChangeResult:
        """Run the SQL of ``scripts`` as one schema change that reaches the
        remotes holding its tables in order with the data (changes.py:
        adding columns to published tables); SchemaRefused, and nothing
        changed, for what it may not do.  The log is cut right after, so
        the change has its offset."""
        with self._lock:
            self._finish_sends()  # a table published since extraction has its rows sent before it changes
            with self._transaction("applying a schema change") as conn:
                result, txid = apply_schema_in(conn, self.target, self._identity.name, scripts, unchecked=unchecked,
                                               made_at=now or utc_now(), lock_timeout=lock_timeout)
            if txid is None:
                return result
            self.scan()
            with self._transaction("reading the schema change's offset") as conn:
                offset = change_offset(conn, txid)
        return dataclasses.replace(result, offsets=() if offset is None else (offset,))

    def passthrough(self, scripts: Iterable[str], remotes: Iterable[str], *, now: datetime | None = None) -> int:
        """Send the data statements of ``scripts`` to ``remotes`` only, in
        order with the data, to run there as their own writes
        (passthrough.py); their commit offset here.  SchemaRefused, and
        nothing sent, for what passthrough may not do.  The log is cut right
        after, so the change has its offset."""
        with self._lock:
            with self._transaction("sending passthrough SQL") as conn:
                txid = passthrough_in(conn, self._identity.name, scripts, remotes, made_at=now or utc_now())
            self.scan()
            with self._transaction("reading the passthrough's offset") as conn:
                offset = change_offset(conn, txid)
        assert offset is not None, "the cut after a passthrough gives it its offset"
        return offset

    def schema_version(self) -> int | None:
        """The offset of the last schema change made here (None: none)."""
        with self._transaction("reading the site's schema version") as conn:
            return schema_version(conn)

    # --- the log ----------------------------------------------------------------------

    def scan(self) -> int:
        """Give commit offsets to every transaction that finished since the
        last scan (log.cut: in commit order, origin this site for the
        applications' writes); return the log end."""
        with self._lock:
            self._finish_sends()
            self._recapture()
            return cut(self._live(), self.target, self._identity.name).log_end

    def _recapture(self) -> None:
        """The capture of published tables altered by hand, made again (catalogue.recapture_altered)."""
        try:
            catalogue.recapture_altered(self._live(), self.target)
        except psycopg.Error as error:
            raise translate(error, self.target, "checking the published tables against their capture") from None

    def _finish_sends(self) -> None:
        """The rows of the tables published since their remotes' extraction (new_tables.py)."""
        try:
            finish_sends(self._live())
        except psycopg.Error as error:
            raise translate(error, self.target, "sending the rows of a table published since extraction") from None

    def log_end(self) -> int:
        """The commit offset of the last log transaction (0 when empty)."""
        with self._transaction("reading the log end") as conn:
            return log_end(conn)

    def change_marker(self) -> tuple[int, int]:
        """What moves whenever a transaction commits (in this database, or
        another of its cluster: a false alarm costs a look): the snapshot's
        xmax and how many transactions below it still run.  Equal markers:
        nothing committed between."""
        with self._transaction("reading the database's change marker") as conn:
            xmax, running = conn.execute(_MARKER).fetchone()
            return xmax, running

    def log_start(self) -> int:
        """The truncation point: the log holds the entries after it."""
        with self._transaction("reading the log's truncation point") as conn:
            return truncated_through(conn)

    def read_log(self, subscriber: str, after: int, until: int | None = None) -> Iterator[Transaction]:
        """The log transactions in ``(after, until]`` as ``subscriber`` sees
        them, in commit order (SiteDatabase.read_log)."""
        reader, until = self._reader(subscriber, after, until)
        return read_transactions(self._source, reader, after, until)

    def read_log_ops(self, subscriber: str, after: int, until: int | None = None) -> Iterator[LoggedOperation]:
        """Like :meth:`read_log`, one ``(commit, origin, operation)`` at a time."""
        reader, until = self._reader(subscriber, after, until)
        return read_operations(self._source, reader, after, until)

    def read_logs(self, reads: Iterable[tuple[str, int, int | None]], *, hold: int = FANOUT_HOLD,
                  piece: int | None = None, runs: bool = False) -> Iterator[tuple[int, Transaction]]:
        """:meth:`read_log` for several subscribers in one pass over the log
        (SiteDatabase.read_logs: ``hold``, ``piece`` and ``runs`` alike);
        every range is checked before anything is read."""
        reads = list(reads)
        names = [name for name, _, _ in reads]
        with self._transaction(f"preparing to read the log for {len(reads)} subscribers", snapshot=True) as conn:
            rows = reading.reader_rows(conn, self._identity, names)
            resolved: dict[tuple[int, int | None], int] = {}  # most reads share their range
            for _, after, until in reads:
                if (after, until) not in resolved:
                    resolved[after, until] = resolve_range(self._source, after, until)
        ranges = [(after, resolved[after, until]) for _, after, until in reads]
        readers = rows.readers(self._identity, self._source, names, runs=runs)
        return read_fanout(self._source, readers, ranges, hold=hold, piece=piece)

    def concerned_reads(self, reads: Sequence[tuple[str, int, int]]) -> list[int]:
        """The indexes of ``reads`` ``(subscriber, after, until)`` that can
        yield anything, or whose range the log cannot serve
        (SiteDatabase.concerned_reads)."""
        names = [name for name, _, _ in reads]
        if not worth_a_look(self._identity, len(names)):
            return list(range(len(names)))
        with self._transaction(f"finding what the log holds for {len(reads)} subscribers", snapshot=True) as conn:
            return concerned_indexes(self._source, self._source, reading.concern_rows(conn), names,
                                     [(after, until) for _, after, until in reads])

    def _reader(self, subscriber: str, after: int, until: int | None) -> tuple[SubscriberReader, int]:
        with self._transaction(f"preparing to read the log for {subscriber!r}", snapshot=True) as conn:
            [reader] = reading.readers(conn, self._identity, self._source, [subscriber])
            return reader, resolve_range(self._source, after, until)

    def selection_rows(self, subscribers: Iterable[str]) -> tuple[list[Shape], list[tuple], list[tuple]]:
        """A batch export's selection rows (SiteDatabase.selection_rows); raises for an unknown remote."""
        with self._transaction("reading publications for a batch export", snapshot=True) as conn:
            return reading.selection_rows(conn, self._identity, list(subscribers))

    def table_renames(self) -> dict[str, str]:
        """Each name a published table had before a rename (lowered) and its
        name now (change_rows.table_renames)."""
        with self._transaction("reading the table renames") as conn:
            return reading.table_renames(conn)

    def removed_articles(self) -> list[tuple]:
        with self._transaction("reading the removed articles") as conn:
            return reading.removed_articles(conn)

    def check_log_range(self, after: int, until: int) -> None:
        """Raise as :meth:`read_log` would for the range ``(after, until]``."""
        with self._transaction("checking a log range", snapshot=True):
            resolve_range(self._source, after, until)

    def read_capture(self, after: int, until: int, *, value_columns: int
                     ) -> Iterator[tuple[int, str, list[tuple], dict[int, str]]]:
        """Every capture row of the log transactions in ``(after, until]``,
        unselected (SiteDatabase.read_capture), with the listed columns of
        the chunk's rows written back to their origin."""
        for commit, origin, rows in self._source.iter_capture(after, until, value_columns=value_columns):
            flagged = [row[0] for row in rows if row[3]]
            returned: dict[int, str] = {}
            if flagged:
                with self._transaction("reading the rows written back") as conn:
                    returned = dict(conn.execute("SELECT seq, columns::text FROM fieldsync.returned"
                                                 " WHERE seq = ANY(%s)", (flagged,)).fetchall())
            yield commit, origin, rows, returned

    def log_applied(self, commit: int) -> int | None:
        return self._source.applied(commit)

    def truncate_log(self) -> int:
        """Delete the log entries every remote is past (the smallest horizon,
        agent.site.remote_rules.horizon); return the truncation point.  With no
        remotes nothing is deleted."""
        with self._transaction("truncating the log") as conn:
            conn.execute("LOCK TABLE fieldsync.remote IN SHARE MODE")  # no row moves meanwhile
            floor = truncated_through(conn)
            bound = remote_rows.lowest_horizon(conn)
            if bound is None or bound <= floor:
                return floor
            through = truncate_log(conn, self.target, bound)
            subscription_rows.forget_before(conn, through)
            return through

    # --- extraction ------------------------------------------------------------------

    def extract(self, remote: str, path: str | os.PathLike[str], *, keys: Any = None,
                now: datetime | None = None, options: Mapping[str, str] | None = None):  # type: ignore[no-untyped-def]
        """Create the SQLite database of ``remote`` at ``path`` from one
        consistent point of this site (agent.site.sqlite.extract.extract_remote,
        with postgres/extract.py's rows and tables)."""
        source = PgConsolidated(self._live(), self._lock, self._identity, self.target, {})
        return extract_remote(source, remote, path, keys=keys, now=now, options=options)

    def extract_many(self, extractions: Sequence[Extraction], *, now: datetime | None = None
                     ) -> Iterator[ExtractResult]:
        """Every remote of ``extractions`` at one point, each published table
        read once for all of them (postgres/extract_many.py)."""
        source = PgFleetSource(self._live(), self._lock, self._identity, self.target, {})
        return extract_remotes(source, extractions, now=now)

    # --- transport settings stored with the site ------------------------------------

    def transport_options(self, peer: str | None = None) -> dict[str, str]:
        """The stored options of the site's own transport, or of the transport to ``peer``."""
        with self._transaction("reading transport options") as conn:
            return settings.read_options(conn, SITE_SCOPE if peer is None else peer)

    def all_transport_options(self) -> dict[str, dict[str, str]]:
        """Every scope's options: ``""`` the site's own, then one entry per peer that has some."""
        with self._transaction("reading transport options") as conn:
            return settings.read_all_options(conn)

    def set_transport(self, *, address: str | None = None, reply_address: str | None = None,
                      transport: str | None = None, options: Mapping[str, str | None] | None = None,
                      peer: str | None = None, inbox: str | None = None) -> None:
        """As the interface says (agent/site/interface.py), in one transaction."""
        with self._transaction("storing transport settings") as conn:
            if peer is None:
                set_site_transport(conn, address=address, reply_address=reply_address, transport=transport)
            else:
                remote_rows.get_remote(conn, peer)
                if inbox is not None:
                    remote_rows.update_remote(conn, peer, {"inbox": inbox or None})
            settings.write_options(conn, SITE_SCOPE if peer is None else peer, options or {})
        self._refresh_identity()

    # --- apply ------------------------------------------------------------------------

    def apply(self, peer: str, transactions: Iterable[Transaction], *, log_received: int, messages: int = 1,
              peer_incarnation: bytes | None = None, now: datetime | None = None,
              skip_through: int | None = None) -> ApplyResult:
        """Apply ``transactions`` from ``peer`` and set its ``log_received``,
        all in one PostgreSQL transaction (apply/driver.py), with the SQLite
        site's rules: transactions at or below ``skip_through`` (None: the
        recorded log_received) are skipped; a deadlock with the
        applications' writes tries the whole transaction again."""
        with self._lock:
            conn = self._live()
            try:
                return self._applier.apply(conn, self._identity, peer, transactions, log_received=log_received,
                                           messages=messages, peer_incarnation=peer_incarnation, now=now,
                                           skip_through=skip_through)
            except psycopg.Error as error:
                raise translate(error, self.target, f"applying transactions from {peer!r}") from None

    def set_conflict_policy(self, table: str, policy: Resolution | str | None) -> None:
        """Per-table conflict policy (None: the default, incoming wins)."""
        with self._transaction(f"setting the conflict policy of {table!r}") as conn:
            records.set_policy(conn, table, policy)

    def set_conflict_hook(self, table: str | None, hook: ConflictHook | None) -> None:
        """A Python callable deciding conflicts on ``table`` (None: every
        table without its own hook).  It returns a Resolution or a dict of
        column values to write (a merge).  Hooks live in this object only;
        one may be called again for the same conflict when a deadlock makes
        the message's transaction run again."""
        with self._lock:
            set_hook(self._applier.hooks, table, hook)

    def conflicts(self, after_id: int = 0) -> tuple[ConflictRecord, ...]:
        with self._transaction("listing conflicts") as conn:
            return records.list_conflicts(conn, after_id)

    def apply_errors(self, after_id: int = 0) -> tuple[ApplyErrorRecord, ...]:
        with self._transaction("listing apply errors") as conn:
            return records.list_apply_errors(conn, after_id)

    def open_apply_errors(self) -> dict[str, int]:
        """The apply errors not yet acknowledged, counted by peer."""
        with self._transaction("counting the apply errors not acknowledged") as conn:
            return records.open_apply_errors(conn)

    def acknowledge_apply_errors(self, peer: str, *, through: int | None = None,
                                 now: datetime | None = None) -> int:
        """Acknowledge the apply errors of ``peer``'s messages (up to the id ``through``, when given): they
        stop counting as an error in force and stay in the table as history.  Returns how many were stamped."""
        with self._transaction(f"acknowledging the apply errors of {peer!r}") as conn:
            return records.acknowledge_apply_errors(conn, peer, now or utc_now(), through)

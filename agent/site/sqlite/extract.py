"""Extraction (SQL Remote's dbxtract): build a remote's database from the
consolidated.

Rules of this file:
* The remote starts at one consistent point E of the consolidated's log:
  under the consolidated's write lock, everything captured is cut into the
  log (E = log end), the remote's row is set to ``log_sent = confirm_sent =
  E``, and a second connection opens the read snapshot the rows are copied
  from, before the lock is released.  The snapshot then holds exactly the
  changes at or below E; everything after E reaches the remote through the
  log.  Applications wait only for that short step, not for the copy.
  The remote's row is changed to start there only at the end, in the
  transaction that gives the finished file its name (see the next rule).
* Both directions start a new epoch (``resend_count`` / ``rereceive_count``
  one higher than before), so messages of an earlier incarnation of this
  remote still queued somewhere are stale on arrival and deleted.
* The remote file is built under a temporary name and named when complete,
  in the same transaction that switches the consolidated's row of the
  remote over to it (new keys, epochs, offsets): an extraction that fails
  or is interrupted anywhere leaves no half-made remote and the
  consolidated exactly as it was, so the remote's current copy goes on
  working.
* The remote's file holds no secret (docs/site-database.md): its secret key
  is written by the agent, beside the file, before the file gets its name
  (agent.admin.extract_site).
* The consolidated is an :class:`ExtractionSource`: a SQLite site
  (:class:`Consolidated`, here) or a PostgreSQL one
  (agent.site.postgres.extract).  Only the tables' definitions, the copy
  of the rows at E and the remote's row differ; the remote's file, its
  rules and the switch-over's checks (:class:`SwitchOver`) are this file's.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Callable, ContextManager, Mapping, Protocol

from codec.fsutil import DirectoryFlushUnsupported, claim_temporary, fsync_directory, link_new, remove_database_file

from .. import points
from ..capture import ROUTE
from ..clock import utc_now
from ..errors import ExtractionError, InvalidSetting, WrongRole
from ..extraction import COPY_CHUNK, PREFILTER_VALUES, ExtractResult, KeySource, RemoteKeys, SwitchOver
from ..identity import Role, SiteIdentity
from ..publication_rules import Article
from ..remote_rules import RemoteUser
from ..settings import SITE_SCOPE
from ._db import format_time, quote_ident, read_transaction, translate, write_transaction
from .read_positions import leaving
from .capture import TableInfo, refresh_changed_tables, table_info
from .foreign_keys import ForeignKey, foreign_keys, remote_definition
from .log import cut_locked, truncated_through
from .publications import create_publication_locked
from .remotes import get_remote, record_replaced_locked
from .extract_union import copy_union_rows, optional_columns, union_plan
from .route import ARTICLE_ROWS, Follow, follows, record_follow
from .schema import SCHEMA_ROWS, init_database, read_identity
from .settings import write_options

class ExtractionSource(Protocol):
    """The consolidated side of an extraction."""

    @property
    def identity(self) -> SiteIdentity: ...

    def plan(self, remote: str) -> tuple[RemoteUser, list[TablePlan], list[tuple[str, list[str]]]]:
        """The remote's row, the tables it gets, and each one's CREATE TABLE
        and CREATE INDEX statements at the remote (SQLite's)."""

    def copy_rows(self, copy: sqlite3.Connection, remote: str, plans: list[TablePlan]
                  ) -> tuple[int, dict[str, int], RemoteUser]:
        """Fix the extraction point E and copy the subscribed rows as they
        are at E into ``copy`` (its tables made); return E, the rows copied
        per table and the remote's row as it was at E."""

    def switch_over(self, change: SwitchOver, name_copy: Callable[[], None]) -> None:
        """In one transaction: ``change.check`` the remote's row and the
        truncation point, write ``change.columns`` to the row, remember the
        copy it replaces, and call ``name_copy``; commit only if it returns."""


@dataclass(frozen=True, slots=True)
class Consolidated:
    """A SQLite consolidated as extraction uses it (its ExtractionSource;
    ``SiteDatabase.extract`` hands it over): its connection, the lock that
    serialises every use of that connection, its identity and its file."""

    connection: sqlite3.Connection
    lock: ContextManager[object]
    identity: SiteIdentity
    path: str

    def plan(self, remote: str) -> tuple[RemoteUser, list[TablePlan], list[tuple[str, list[str]]]]:
        conn = self.connection
        with self.lock, read_transaction(conn, f"planning the extraction of {remote!r}"):
            row = get_remote(conn, remote)
            plans = _plans(conn, remote)
            return row, plans, [(_table_sql(conn, plan, plans), _index_sql(conn, plan)) for plan in plans]

    def copy_rows(self, copy: sqlite3.Connection, remote: str, plans: list[TablePlan]
                  ) -> tuple[int, dict[str, int], RemoteUser]:
        return _copy(self, copy, remote, plans)

    def switch_over(self, change: SwitchOver, name_copy: Callable[[], None]) -> None:
        conn = self.connection
        with self.lock, write_transaction(conn, f"switching {change.remote!r} over to its new copy"):
            current = get_remote(conn, change.remote)
            change.check(current, truncated_through(conn))
            columns = change.columns
            conn.execute(f"UPDATE fieldsync_remote SET {', '.join(f'{name} = ?' for name in columns)}"
                         f"{leaving(columns)} WHERE name = ?", (*columns.values(), change.remote))
            record_replaced_locked(conn, change.remote, current.peer_incarnation)
            name_copy()


@dataclass(frozen=True, slots=True)
class TablePlan:
    info: TableInfo
    publication: str
    columns: tuple[str, ...]            # published columns, table order
    subscribe_by: str | None
    values: frozenset | None            # None: every row
    subset: bool                        # a column subset of the table
    follow: Follow | None = None        # the rows follow their parent (subscribe_by is ROUTE)
    # The table's articles, when the remote gets it through several (the
    # plan's columns are then all of theirs: agent/site/sqlite/extract_union.py).
    parts: tuple["TablePlan", ...] = ()


def _resolve_keys(keys: KeySource, remote: str) -> RemoteKeys:
    if callable(keys):
        keys = keys(remote)
    if keys is None:
        return RemoteKeys()
    if isinstance(keys, RemoteKeys):
        return keys
    raise InvalidSetting(f"remote keys must be RemoteKeys or a callable returning them, got {type(keys).__name__}")


def _plans(conn: sqlite3.Connection, remote: str) -> list[TablePlan]:
    values: dict[str, set] = {}
    for publication, value in conn.execute("SELECT publication, value FROM fieldsync_subscription WHERE remote = ?"
                                           " AND until IS NULL", (remote,)):
        bucket = values.setdefault(publication, set())
        if value is not None:
            bucket.add(value)
    plans: dict[str, list[TablePlan]] = {}
    chains = follows(conn)
    for table, publication, columns, subscribe_by in conn.execute(
            ARTICLE_ROWS + " ORDER BY rowid").fetchall():
        if publication not in values:
            continue
        info = table_info(conn, table)
        published = info.columns if columns is None else tuple(
            column for column in info.columns if column in set(json.loads(columns)) | set(info.key_columns))
        plans.setdefault(info.name.lower(), []).append(TablePlan(
            info, publication, published, subscribe_by, frozenset(values[publication]) if subscribe_by else None,
            published != info.columns, chains.get(info.name.lower()) if subscribe_by == ROUTE else None))
    return [found[0] if len(found) == 1 else union_plan(found) for found in plans.values()]


def _table_sql(conn: sqlite3.Connection, plan: TablePlan, plans: list[TablePlan]) -> str:
    return published_table_sql(conn, plan.info, plan.columns, _kept_keys(conn, plan, plans), optional_columns(plan))


def published_table_sql(conn: sqlite3.Connection, info: TableInfo, columns: tuple[str, ...],
                        keep: Callable[[ForeignKey], bool] = lambda key: False,
                        optional: frozenset[str] = frozenset()) -> str:
    """The CREATE TABLE of ``info``'s table as a remote holds it: its own
    text when every column is published, else rebuilt from ``columns``;
    with the foreign keys ``keep`` keeps (by default none: a table sent
    later by ``publication add`` names no parent the remote may lack).
    The ``optional`` columns, which some of the remote's rows are not
    published with, lose their NOT NULL."""
    if columns == info.columns and not optional:
        return remote_definition(info.sql, keep)
    # Rebuild the definition from the published columns; table constraints
    # other than the key and the foreign keys kept (CHECK, UNIQUE) are not carried.
    definitions = []
    for _cid, name, declared, notnull, default, _pk, hidden in conn.execute(
            f"PRAGMA table_xinfo({quote_ident(info.name)})"):
        if hidden or name not in columns:
            continue
        text = quote_ident(name) + (f" {declared}" if declared else "")
        if notnull and name not in optional:
            text += " NOT NULL"
        if default is not None:
            text += f" DEFAULT ({default})"
        definitions.append(text)
    definitions.append(f"PRIMARY KEY ({', '.join(quote_ident(c) for c in info.key_columns)})")
    definitions += [f"FOREIGN KEY ({', '.join(quote_ident(column) for column in key.columns)}) {key.clause}"
                    for key in foreign_keys(info.sql) if keep(key)]
    return (f"CREATE TABLE {quote_ident(info.name)} ({', '.join(definitions)})"
            + (" WITHOUT ROWID" if info.without_rowid else ""))


def _kept_keys(conn: sqlite3.Connection, plan: TablePlan, plans: list[TablePlan]) -> Callable[[ForeignKey], bool]:
    """Which foreign keys of ``plan``'s table the remote's copy keeps: those
    whose columns it gets, to a table it gets, whose referenced columns it
    gets and holds unique (else SQLite could not check them there)."""
    tables = {other.info.name.lower(): other for other in plans}
    published = {column.lower() for column in plan.columns}

    def keep(key: ForeignKey) -> bool:
        parent = tables.get(key.parent.lower())
        if parent is None or not {column.lower() for column in key.columns} <= published:
            return False
        referenced = frozenset(column.lower() for column in (key.parent_columns or parent.info.key_columns))
        return len(referenced) == len(key.columns) and referenced in _unique_keys(conn, parent)
    return keep


def _unique_keys(conn: sqlite3.Connection, plan: TablePlan) -> set[frozenset[str]]:
    """The sets of columns the remote's copy of ``plan``'s table holds
    unique: its primary key, a UNIQUE constraint of a table copied whole,
    a unique index it gets (not a partial one, which no key can reference)."""
    published = {column.lower() for column in plan.columns}
    keys = {frozenset(column.lower() for column in plan.info.key_columns)}
    for _seq, name, unique, origin, partial in conn.execute(f"PRAGMA index_list({quote_ident(plan.info.name)})"):
        if not unique or partial or (origin == "u" and plan.subset):  # a rebuilt copy has no UNIQUE constraint
            continue
        columns = [row[2] for row in conn.execute(f"PRAGMA index_info({quote_ident(name)})")]
        if None not in columns and {column.lower() for column in columns} <= published:
            keys.add(frozenset(column.lower() for column in columns))
    return keys


def _index_sql(conn: sqlite3.Connection, plan: TablePlan) -> list[str]:
    statements = []
    for name, sql in conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = ?"
                                  " AND sql IS NOT NULL", (plan.info.name,)).fetchall():
        if plan.subset:
            used = [row[2] for row in conn.execute(f"PRAGMA index_xinfo({quote_ident(name)})") if row[5]]
            if any(column is None or column not in plan.columns for column in used):
                continue  # the index needs a column the remote does not have
        statements.append(sql)
    return statements


def _publish(temporary: Path, target: Path) -> None:
    """Give the finished file its name, never replacing a file that
    appeared there meanwhile."""
    try:
        link_new(temporary, target)
    except FileExistsError:
        raise ExtractionError(f"{target} appeared while extracting; the copy was discarded, extract again") from None


def _flush_name(target: Path) -> None:
    """Make ``target``'s new name survive a power cut."""
    try:
        fsync_directory(target.parent)
    except OSError as error:
        advice = ("extract to a folder on a local disk" if isinstance(error, DirectoryFlushUnsupported)
                  else "check the disk and extract again")
        raise ExtractionError(f"cannot flush the folder {target.parent} after naming {target.name} "
                              f"({error.strerror or error}); nothing was changed: {advice}") from None


def extract_remote(site: ExtractionSource, remote: str, path: str | os.PathLike[str], *, keys: KeySource = None,
                   now: datetime | None = None, options: Mapping[str, str] | None = None) -> ExtractResult:
    """Create the database of ``remote`` at ``path`` from the consolidated
    ``site``: the published schema of its subscribed tables, its rows, its
    identity (new incarnation, role remote) and the remote-user rows of both
    sides, all taken at one consistent log offset while applications go on
    writing.  ``remote`` must have been added (with its subscriptions).

    Extracting a remote again replaces its stream: the consolidated forgets
    what the previous copy had sent and confirmed.  The copy's inbox is the
    remote row's ``inbox`` (else its address), its reply address the row's
    address where the two differ, and ``options`` its own transport options.
    """
    target = check_target(site, path)
    planned = site.plan(remote)
    return build_copy(site, remote, target, planned, lambda copy: site.copy_rows(copy, remote, planned[1]),
                      keys=keys, now=now, options=options)


def check_target(site: ExtractionSource, path: str | os.PathLike[str]) -> Path:
    """``path`` as a new remote's file, refused when ``site`` is no
    consolidated or the file cannot be made there."""
    identity = site.identity
    if identity.role is not Role.CONSOLIDATED:
        raise WrongRole(f"site {identity.name!r} is a remote; extract remotes from the consolidated")
    target = Path(path)
    if any(os.path.lexists(f"{target}{suffix}") for suffix in ("", "-wal", "-shm")):  # a dangling link too
        raise ExtractionError(f"{target} exists already; remove it or choose another path")
    if not target.parent.is_dir():
        raise ExtractionError(f"directory {target.parent} does not exist")
    return target


Planned = tuple[RemoteUser, list["TablePlan"], list[tuple[str, list[str]]]]  # what ExtractionSource.plan returns
CopyRows = Callable[[sqlite3.Connection], tuple[int, dict[str, int], RemoteUser]]


def build_copy(site: ExtractionSource, remote: str, target: Path, planned: Planned, copy_rows: CopyRows, *,
               keys: KeySource = None, now: datetime | None = None,
               options: Mapping[str, str] | None = None) -> ExtractResult:
    """Make ``remote``'s file at ``target`` as :func:`extract_remote` says,
    its rows copied by ``copy_rows`` (as ExtractionSource.copy_rows does),
    and switch the consolidated's row over to it."""
    identity = site.identity
    row, plans, table_sql = planned
    material = _resolve_keys(keys, remote)
    stamp = format_time(now or utc_now())
    try:
        # Made empty first (SQLite takes an empty file as a new database): a
        # folder the agent cannot write in is named, not the temporary file.
        # The mode is the one SQLite gives a database it creates (0644 less
        # the umask), as for `agent init`: the copy holds no secret, and the
        # remote's applications must be able to open it.  Claimed while it
        # is made, so that a copy a killed extraction left is removed by the
        # next extraction of the same target (codec.fsutil.claim_temporary).
        path, removed, claim = claim_temporary(target, 0o644)
    except OSError as error:
        raise ExtractionError(f"cannot create {target}: the folder {target.parent} takes no new file "
                              f"({error.strerror or error})") from None
    temporary = Path(path)
    try:
        try:
            copy = init_database(temporary, name=remote, role=Role.REMOTE, address=row.inbox or row.address,
                                 transport=row.transport, public_key=material.public_key or row.public_key, now=now)
            try:
                # Where the remote reads (its inbox) and where hq sends to it
                # (its reply address) differ on email; options are its own.
                copy.execute("UPDATE fieldsync_site SET reply_address = ? WHERE id = 1",
                             (row.address if row.inbox else None,))
                write_options(copy, SITE_SCOPE, dict(options or {}))
                incarnation = read_identity(copy).incarnation
                with write_transaction(copy, f"creating the tables of {remote!r}"):
                    for create_table, _indexes in table_sql:
                        copy.execute(create_table)
                offset, counts, before = copy_rows(copy)
                epochs = (before.resend_count + 1, before.rereceive_count + 1)
                _finish_remote(copy, identity, row, plans, table_sql, offset, epochs, stamp)
                copy.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                copy.close()
            if Path(f"{temporary}-wal").exists() and Path(f"{temporary}-wal").stat().st_size:
                raise ExtractionError(f"{temporary}: SQLite left an unmerged WAL file; the copy is incomplete")
            descriptor = os.open(temporary, os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
            _remove_sidecars(temporary)
            points.reached("extract.copy-made")
            _switch_over(site, SwitchOver(identity.name, remote, before, offset, incarnation, material.public_key),
                         temporary, target)
        except sqlite3.Error as error:
            remove_database_file(temporary)
            raise ExtractionError(f"extracting {remote!r} to {target} failed: {translate(error, 'copying')}"
                                  ) from error
        except BaseException:
            remove_database_file(temporary)
            raise
        return ExtractResult(remote, str(target), offset, incarnation, counts, tuple(removed))
    finally:
        os.close(claim)  # after SQLite closed the file (the copy is renamed or removed)


def _remove_sidecars(path: Path) -> None:
    for suffix in ("-wal", "-shm"):
        try:
            os.remove(f"{path}{suffix}")
        except FileNotFoundError:
            pass


def _copy(site: Consolidated, copy: sqlite3.Connection, remote: str, plans: list[TablePlan]
          ) -> tuple[int, dict[str, int], RemoteUser]:
    """Pin the snapshot at the log offset E and copy the subscribed rows;
    return E, the row counts, and the remote's row as it was at E."""
    copy.execute("ATTACH DATABASE ? AS source", (site.path,))
    try:
        conn = site.connection
        with site.lock, write_transaction(conn, f"fixing the extraction point of {remote!r}"):
            refresh_changed_tables(conn)
            offset = cut_locked(conn, site.identity.name)
            before = get_remote(conn, remote)
            # The snapshot starts now, while no one else can commit: it holds
            # exactly what was committed up to ``offset``.
            copy.execute("BEGIN")
            copy.execute("SELECT count(*) FROM source.fieldsync_log").fetchone()
        # The copy's schema is the consolidated's at E: so is its schema
        # version (docs/protocol.md, "Schema versions"), recorded as a change
        # with no steps that came with the extraction.
        copy.execute("INSERT INTO main.fieldsync_schema_change (commit_offset, peer, steps, made_at)"
                     " SELECT commit_offset, ?, '[]', made_at FROM source.fieldsync_schema_change"
                     f" WHERE peer IS NULL AND {SCHEMA_ROWS} ORDER BY commit_offset DESC LIMIT 1",
                     (site.identity.name,))
        counts: dict[str, int] = {}
        for plan in plans:
            counts[plan.info.name] = copy_union_rows(copy, plan) if plan.parts else _copy_rows(copy, plan)
        copy.execute("COMMIT")
    except BaseException:
        # Interrupted (Ctrl-C) or failed mid-copy: the copy is thrown away,
        # and detaching under a statement still open would only replace
        # what happened with "database source is locked".
        with contextlib.suppress(sqlite3.Error):
            if copy.in_transaction:
                copy.execute("ROLLBACK")
            copy.execute("DETACH DATABASE source")
        raise
    copy.execute("DETACH DATABASE source")
    return offset, counts, before


def _switch_over(site: ExtractionSource, change: SwitchOver, temporary: Path, target: Path) -> None:
    """In one transaction of the consolidated: start the remote's row at
    the extraction point with the new copy's keys, incarnation and epochs,
    and give the finished copy its name.  The row changes only if the file
    is in place and its name flushed, and the file stays only if the row
    changed."""
    published = False

    def name_copy() -> None:
        nonlocal published
        _publish(temporary, target)
        published = True
        _flush_name(target)  # before the row commits: a name that may vanish is no copy

    try:
        site.switch_over(change, name_copy)
    except BaseException:
        if published:  # named, but the row could not be switched over to it
            remove_database_file(target)
        raise


def _copy_rows(copy: sqlite3.Connection, plan: TablePlan) -> int:
    names = ", ".join(quote_ident(column) for column in plan.columns)
    insert = (f"INSERT INTO main.{quote_ident(plan.info.name)} ({names})"
              f" VALUES ({', '.join('?' * len(plan.columns))})")
    selected = [quote_ident(column) for column in plan.columns]
    position = None
    if plan.values is not None:
        if plan.subscribe_by == ROUTE:  # the rows follow their parent: read each one's route alongside
            follow = plan.follow
            assert follow is not None
            selected.append(follow.route([f"source.{quote_ident(plan.info.name)}.{quote_ident(c)}"
                                          for c in follow.columns], schema="source."))
            position = len(plan.columns)
        elif plan.subscribe_by in plan.columns:
            position = plan.columns.index(plan.subscribe_by)  # type: ignore[arg-type]
        else:  # the filter column is not published: read it alongside, then drop it
            selected.append(quote_ident(plan.subscribe_by))  # type: ignore[arg-type]
            position = len(plan.columns)
    query = f"SELECT {', '.join(selected)} FROM source.{quote_ident(plan.info.name)}"
    parameters: tuple = ()
    if plan.values is not None and len(plan.values) <= PREFILTER_VALUES and plan.subscribe_by != ROUTE:
        # SQLite's IN selects a superset of the rows the test below keeps
        # (it converts by the column's affinity, so '7' meets 7), and uses
        # an index on the column: a remote's share of a large table is read
        # without reading every other remote's rows.
        query += f" WHERE {quote_ident(plan.subscribe_by)} IN ({', '.join('?' * len(plan.values))})"  # type: ignore[arg-type]
        parameters = tuple(plan.values)
    source = copy.execute(query, parameters)
    width = len(plan.columns)
    values = plan.values
    writer = copy.cursor()
    total = 0
    while True:
        rows = source.fetchmany(COPY_CHUNK)
        if not rows:
            return total
        if position is not None:
            # The same test the log reader applies (Python equality), so the
            # copy and the stream agree on which rows are the remote's.
            rows = [row[:width] for row in rows if row[position] in values]  # type: ignore[operator]
        writer.executemany(insert, rows)
        total += len(rows)


def _create_index(copy: sqlite3.Connection, plan: TablePlan, statement: str) -> None:
    """Create one of the consolidated's indexes of ``plan``'s table on the
    copy.  On a table whose columns are not all published, a partial index
    whose WHERE names a column the remote does not have is left out, as an
    index on such a column is (``_index_sql``)."""
    if not plan.subset:
        copy.execute(statement)
        return
    create_index_where_possible(copy, statement)


def create_index_where_possible(conn: sqlite3.Connection, statement: str) -> None:
    """Run ``statement``, a CREATE INDEX of the consolidated's, inside a
    write transaction; an index that names a column this database does not
    have (in its WHERE too) is left out."""
    conn.execute("SAVEPOINT fieldsync_index")
    try:
        conn.execute(statement)
    except sqlite3.OperationalError as error:
        if "no such column" not in str(error):
            raise
        conn.execute("ROLLBACK TO fieldsync_index")
    conn.execute("RELEASE fieldsync_index")


def _finish_remote(copy: sqlite3.Connection, consolidated, row, plans: list[TablePlan],  # type: ignore[no-untyped-def]
                   table_sql: list[tuple[str, list[str]]], offset: int, epochs: tuple[int, int], stamp: str) -> None:
    """Indexes, publications (so the remote captures its own changes) and
    the remote's row for its consolidated."""
    with write_transaction(copy, f"finishing the remote database of {row.name!r}"):
        for plan, (_create_table, indexes) in zip(plans, table_sql):
            for statement in indexes:
                _create_index(copy, plan, statement)
        articles: dict[str, list[Article]] = {}
        for plan in plans:
            for part in plan.parts or (plan,):
                subscribe_by = part.subscribe_by if part.subscribe_by in part.columns else None
                articles.setdefault(part.publication, []).append(Article(plan.info.name, None, subscribe_by))
        for publication, items in articles.items():
            create_publication_locked(copy, publication, items, None)
        # The remote's rows that follow a parent live and die with it there
        # (route.apply_triggers), when it gets the key that says which.
        tables = {plan.info.name.lower(): plan for plan in plans}
        for plan in plans:
            follow = plan.follow
            parent = tables.get(follow.parent.lower()) if follow is not None else None
            if (follow is not None and parent is not None and set(follow.columns) <= set(plan.columns)
                    and set(follow.parent_columns) <= set(parent.columns)):
                record_follow(copy, follow)
        resend_count, rereceive_count = epochs
        copy.execute(
            "INSERT INTO fieldsync_remote (name, log_send, log_sent, confirm_sent, resend_count, log_received,"
            " confirm_received, rereceive_count, transport, address, public_key, send_every, send_at,"
            " peer_incarnation, created_at) VALUES (?, 0, 0, 0, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (consolidated.name, rereceive_count, offset, offset, resend_count, consolidated.transport,
             consolidated.send_address, consolidated.public_key, row.send_every,
             None if row.send_at is None else row.send_at.isoformat(), consolidated.incarnation, stamp))



"""A schema change from the consolidated, applied at a remote in order with
the data, and the record of one that does not apply (docs/site-database.md,
"Schema changes").

Rules of this file:
* A change runs inside the apply's write transaction, between the
  transactions logged before it and those after it.  Anything that goes
  wrong is a :class:`SchemaConflict`, which rolls the whole message back;
  :func:`record_conflict` then records it once, in a transaction of its
  own, and the stream waits before the change.
* Statements are built from the steps: identifiers quoted; the SQL text a
  step carries (a column definition, a CREATE TABLE, a CREATE INDEX) is the
  consolidated SQLite's own.
* After the steps, each table is compared with the shape the change gives
  it; then capture and the catalogue are made again, and the change is
  recorded in ``fieldsync_schema_change`` (the remote's schema version).
"""

from __future__ import annotations

import json
import sqlite3

from codec.changes import DROP_ARTICLE, PASSTHROUGH, RENAME_TABLE, SchemaChange

from ... import points
from ...errors import PublicationError, SchemaConflict, SchemaRefused
from ...publication_rules import Article
from .._db import parse_time, quote_ident
from ..capture import drop_capture, refresh_changed_tables
from ..changes import data_only
from ..ddl import actions, read_schema
from ..extract import create_index_where_possible
from ..publications import add_article_locked, create_publication_locked, remove_article_locked
from .statements import Statements

_ALTERS = ("add_column", "rename_column", "drop_column")
# Steps whose table's capture triggers go before they run and are made again
# after (a renamed table's would keep their old names and capture twice).
_RECAPTURED = (*_ALTERS, RENAME_TABLE)


class SchemaSteps:
    """Applies schema changes on the apply path's connection."""

    def __init__(self, conn: sqlite3.Connection, statements: Statements) -> None:
        self._conn = conn
        self._statements = statements

    def apply(self, peer: str, commit: int, change: SchemaChange, now: str, *, own: str) -> None:
        """Run ``change`` (from ``peer``, at its ``commit``) here, at site
        ``own``; SchemaConflict when it does not apply."""
        conn = self._conn
        where = f"the schema change at {commit} from {peer}"
        if any(step[0] == PASSTHROUGH for step in change.steps):
            self._passthrough(peer, commit, change, now, own)
            return
        for table in {step[1] for step in change.steps if step[0] in _RECAPTURED}:
            drop_capture(conn, table)  # SQLite refuses to drop a column a trigger names; made again below
        for step in change.steps:
            try:
                self._step(step, change, now)
            except (sqlite3.Error, PublicationError) as error:
                raise SchemaConflict(f"{where} does not apply here: {_text(step)}: {error}", commit=commit,
                                     table=step[1]) from None
        tables = read_schema(conn).tables
        for table, columns, key in change.shapes:
            held = tables.get(table.lower())
            if held is None or held.stored != columns or held.key != key:
                found = "no such table" if held is None else f"columns ({', '.join(held.stored)})"
                raise SchemaConflict(f"{where} does not apply here: after it, {table} must have the columns "
                                     f"({', '.join(columns)}) and key ({', '.join(key)}), but it has {found}: its "
                                     "schema was changed here; make it the consolidated's, and the stream goes on",
                                     commit=commit, table=table)
        refresh_changed_tables(conn)
        points.reached("apply.in-change")
        conn.execute("INSERT OR REPLACE INTO fieldsync_schema_change (commit_offset, peer, steps, made_at)"
                     " VALUES (?, ?, ?, ?)", (commit, peer, json.dumps([list(step) for step in change.steps]), now))
        self._statements.refresh()

    def _passthrough(self, peer: str, commit: int, change: SchemaChange, now: str, own: str) -> None:
        """Run the passthrough statements of ``change`` as this site's own
        writes: its capture records them, and they travel back as its own
        changes (docs/site-database.md, "Passthrough")."""
        conn = self._conn
        where = f"the passthrough SQL at {commit} from {peer}"
        marked = conn.execute("SELECT 1 FROM fieldsync_applying").fetchone() is not None
        if marked:
            conn.execute("DELETE FROM fieldsync_applying")  # captured as this site's own
        try:
            for number, step in enumerate(change.steps, 1):
                statement = step[2]
                if step[0] != PASSTHROUGH or step[1] != own:
                    raise SchemaConflict(f"{where} does not apply here: its step {number} is for "
                                         f"{step[1]!r}, not {own!r}, or is no passthrough", commit=commit)
                try:
                    data_only(actions(conn, statement), f"statement {number}")
                    conn.execute(statement).fetchall()
                except (sqlite3.Error, SchemaRefused) as error:
                    raise SchemaConflict(f"{where} does not apply here: statement {number} "
                                         f"({' '.join(statement.split())[:60]}): {error}", commit=commit) from None
        finally:
            if marked:
                conn.execute("INSERT INTO fieldsync_applying (id) VALUES (1)")
        points.reached("apply.in-change")
        conn.execute("INSERT OR REPLACE INTO fieldsync_schema_change (commit_offset, peer, steps, statements, made_at)"
                     " VALUES (?, ?, ?, ?, ?)", (commit, peer, json.dumps([list(step) for step in change.steps]),
                                                json.dumps([step[2] for step in change.steps]), now))

    def _step(self, step: tuple, change: SchemaChange, now: str) -> None:
        conn = self._conn
        verb, table = step[0], quote_ident(step[1])
        if verb == "add_column":
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {step[3]}")
        elif verb == "rename_column":
            conn.execute(f"ALTER TABLE {table} RENAME COLUMN {quote_ident(step[2])} TO {quote_ident(step[3])}")
        elif verb == "drop_column":
            conn.execute(f"ALTER TABLE {table} DROP COLUMN {quote_ident(step[2])}")
        elif verb == RENAME_TABLE:
            conn.execute(f"ALTER TABLE {table} RENAME TO {quote_ident(step[2])}")
            conn.execute("UPDATE fieldsync_article SET table_name = ? WHERE table_name = ?", (step[2], step[1]))
        elif verb == "drop_index":
            conn.execute(f"DROP INDEX IF EXISTS {quote_ident(step[2])}")
        elif verb == "create_index":
            if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = ? COLLATE NOCASE",
                            (step[2],)).fetchone() is None:
                create_index_where_possible(conn, step[3])  # as extraction makes the consolidated's indexes
        elif verb == DROP_ARTICLE:
            # Its article goes, and its capture with its last one; the table
            # and its rows stay (docs/site-database.md, "Removing an article").
            if conn.execute("SELECT 1 FROM fieldsync_article WHERE table_name = ? AND publication = ?",
                            (step[1], step[2])).fetchone() is not None:
                remove_article_locked(conn, step[1], step[2])
        else:
            self._create_table(step, now)

    def _create_table(self, step: tuple, now: str) -> None:
        """The table (kept when it exists: the shapes are checked after),
        published in its publication so this site captures its changes."""
        conn = self._conn
        _, table, sql, publication, subscribe_by = step
        if table.lower() not in read_schema(conn).tables:
            conn.execute(sql)
        if conn.execute("SELECT 1 FROM fieldsync_article WHERE table_name = ?", (table,)).fetchone() is not None:
            return
        if conn.execute("SELECT 1 FROM fieldsync_publication WHERE name = ?", (publication,)).fetchone() is None:
            create_publication_locked(conn, publication, (), parse_time(now))
        columns = {column.lower() for column in read_schema(conn).tables[table.lower()].stored}
        add_article_locked(conn, publication, Article(table, None, subscribe_by if subscribe_by is not None
                                                      and subscribe_by.lower() in columns else None))


def _text(step: tuple) -> str:
    verb, table = step[0], step[1]
    return f"{verb.replace('_', ' ')} {table}" + (f".{step[2]}" if verb in _ALTERS else
                                                   f" ({step[2]})" if verb.endswith("index") else
                                                   f" to {step[2]}" if verb == RENAME_TABLE else
                                                   f" from {step[2]}" if verb == DROP_ARTICLE else "")


def record_conflict(conn: sqlite3.Connection, peer: str, conflict: SchemaConflict, now: str) -> None:
    """Record a schema change that did not apply as an apply error, once
    while it is in force (each poll tries the message again)."""
    if conn.execute("SELECT 1 FROM fieldsync_apply_error WHERE peer = ? AND peer_commit = ? AND problem = ?"
                    " AND acknowledged_at IS NULL", (peer, conflict.commit, str(conflict))).fetchone() is None:
        conn.execute("INSERT INTO fieldsync_apply_error (at, peer, peer_commit, table_name, problem)"
                     " VALUES (?, ?, ?, ?, ?)", (now, peer, conflict.commit, conflict.table, str(conflict)))

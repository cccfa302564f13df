"""Conflicts at a SQLite consolidated, and the rows that go back to the
origin: the SQL around the decisions of agent/site/apply/conflicts.py.

Rules of this file:
* An UPDATE is conditional on its before-image (``col IS ?``, SQLite's
  equality); a mismatch is a conflict, recorded in ``fieldsync_conflict``
  and resolved by the table's policy or a hook (conflicts.decide), and the
  resulting row goes back to the origin.
* What goes back to the origin is written once the whole batch is applied
  (:meth:`Conflicts.write_returns`, conflicts.planned_returns), each row
  only to the origin: a capture row flagged FLAG_RETURN_TO_ORIGIN and its
  ``fieldsync_returned`` row.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime
from typing import Callable, Iterable, Sequence

from ...apply.batch import AnyFilter, Batch, ConflictHook, Filter, key_after, peer_filters
from ...apply.conflicts import (ConflictRecord, check_policy, conflict_record, decide, planned_returns, resolution_name,
                                resolved)
from ...capture import FLAG_RETURN_TO_ORIGIN, Shape
from ...values import pack
from ..capture import table_info, write_capture_row
from ..route import Follow
from .followers import descendants
from .statements import SqliteTable, Statements


class Conflicts:
    """Resolving conflicts, and writing what goes back to the origin."""

    def __init__(self, conn: sqlite3.Connection, statements: Statements,
                 hooks: dict[str | None, ConflictHook]) -> None:
        self._conn = conn
        self._statements = statements
        self._hooks = hooks  # lower-case table (None: every other) -> hook; the adapter keeps it

    def resolve(self, table: SqliteTable, op: tuple, local: dict, batch: Batch) -> None:
        """An UPDATE ``op`` found row ``local`` other than its before-image:
        resolve it (hook, policy), record it, and send the result back."""
        conn = self._conn
        key = op[2]
        decision, written = decide(self._hooks, table, op, local, batch)
        if written:
            # Captured as usual (origin: the peer), so every other subscriber
            # gets the result; the origin gets it from write_returns.
            conn.execute(self._statements.update_sql(table, tuple(written), ()), (*written.values(), *key))
        final_key = key_after(table.key_columns, key, written)
        result = self._statements.select(table, final_key)
        conn.execute(
            "INSERT INTO fieldsync_conflict (at, peer, peer_commit, table_name, key, local_row, incoming_before,"
            " incoming_after, resolution, result_row) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (batch.now, batch.peer, batch.commit, table.name, pack(key), pack(local), pack(op[3]), pack(op[4]),
             resolution_name(decision), None if result is None else pack(result)))
        resolved(batch, table, op, local, written, final_key, result)

    def filters(self, peer: str) -> dict[str, Filter | AnyFilter]:
        """``peer``'s subset of each filtered table (lower-case table ->
        Filter): by SUBSCRIBE BY column, or for a table that follows its
        parent by the route of its foreign key (agent/site/sqlite/route.py); what
        decides which rows leave its subset."""
        values: dict[str, set] = {}
        for publication, value in self._conn.execute(
                "SELECT publication, value FROM fieldsync_subscription WHERE remote = ? AND until IS NULL", (peer,)):
            bucket = values.setdefault(publication, set())
            if value is not None:
                bucket.add(value)

        def parts() -> Iterable[tuple[str, str, Filter | None]]:
            for table, publication, column, follows in self._conn.execute(
                    "SELECT table_name, publication, subscribe_by, follows FROM fieldsync_article ORDER BY rowid"
                    ).fetchall():
                subset = frozenset(values.get(publication, ()))
                follow = self._statements.follows.get(table.lower()) if follows is not None else None
                if column is None and follows is None:
                    yield table, publication, None  # every row
                elif follow is None:
                    yield table, publication, Filter((column,), subset)
                else:
                    yield table, publication, Filter(follow.columns, subset, self._route_of(follow))
        return peer_filters(parts(), values)

    def _route_of(self, follow: Follow) -> Callable[[Sequence], object]:
        """The route of a row of ``follow.table`` from its foreign key values."""
        sql = self._statements.cached(("route", follow.table),
                                      lambda: f"SELECT {follow.route(['?'] * len(follow.columns))}")
        conn = self._conn

        def route(values: Sequence) -> object:
            try:
                return conn.execute(sql, list(values)).fetchone()[0]
            except (OverflowError, sqlite3.InterfaceError, sqlite3.ProgrammingError):
                return None  # a value no parent can hold (the operation is refused as malformed)
        return route

    def write_returns(self, batch: Batch) -> None:
        """Capture what goes back to the batch's origin, each row only to it
        (:func:`planned_returns`, once the whole batch is applied)."""
        conn, statements = self._conn, self._statements
        under = (lambda table, row: descendants(conn, statements, table, row)) if statements.follows else None
        for shape, kind, values, columns in planned_returns(batch, statements.select, under):
            self._write_return(shape, kind, values, columns)

    def _write_return(self, shape: Shape, kind: int, values: list, columns: Iterable[str] = ()) -> None:
        """Write one capture row for the batch's origin only.  Each gets a
        fieldsync_returned row (the columns an UPDATE sends back), which is
        also how Unconfirmed.any_unconfirmed finds them without a scan."""
        seq = write_capture_row(self._conn, shape, kind, FLAG_RETURN_TO_ORIGIN, values)
        self._conn.execute("INSERT INTO fieldsync_returned (seq, columns) VALUES (?, ?)",
                           (seq, json.dumps(sorted(columns))))


def list_conflicts(conn: sqlite3.Connection, after_id: int = 0) -> tuple[ConflictRecord, ...]:
    rows = conn.execute("SELECT id, at, peer, peer_commit, table_name, key, local_row, incoming_before,"
                        " incoming_after, resolution, result_row FROM fieldsync_conflict WHERE id > ? ORDER BY id",
                        (after_id,)).fetchall()
    return tuple(conflict_record(row, datetime.fromisoformat(row[1])) for row in rows)


def set_policy_locked(conn: sqlite3.Connection, table: str, policy: object) -> None:
    """Set (None: clear) the conflict policy of ``table``, inside a write transaction."""
    info = table_info(conn, table)
    if policy is None:
        conn.execute("DELETE FROM fieldsync_conflict_policy WHERE table_name = ?", (info.name,))
    else:
        conn.execute("INSERT OR REPLACE INTO fieldsync_conflict_policy (table_name, policy) VALUES (?, ?)",
                     (info.name, check_policy(policy).value))

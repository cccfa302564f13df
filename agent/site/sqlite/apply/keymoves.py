"""Key moves at a SQLite site: what reads or writes SQLite around the
decisions of agent/site/apply/keymoves.py.

Rules of this file:
* At the consolidated, an UPDATE or DELETE of a key it no longer holds
  follows its own captured key changes, looked up through the capture
  table's key indexes (:meth:`KeyMoves.moved_key`).
* At a remote, an UPDATE onto a key it holds drops its own row there and
  applies the move, in a savepoint (:meth:`KeyMoves.take_key`).
"""

from __future__ import annotations

import sqlite3

from ...apply.batch import Batch, key_after
from ...apply.keymoves import follow_moves, refused_move
from ...capture import FLAG_RETURN_TO_ORIGIN, KIND_UPDATE
from ..capture import KeyIndex, ShapeCache, key_indexes
from .statements import SqliteTable, Statements


class KeyMoves:
    """Following and refusing changes of a row's key."""

    def __init__(self, conn: sqlite3.Connection, shapes: ShapeCache, statements: Statements) -> None:
        self._conn = conn
        self._shapes = shapes
        self._statements = statements

    def refused_move(self, table: SqliteTable, key: tuple, after: dict, batch: Batch) -> None:
        """At the consolidated: the peer gave row ``key`` a new key that a
        row here holds (:func:`refused_move`)."""
        refused_move(batch, table, key, after, self._statements.select)

    def take_key(self, table: SqliteTable, sql: str, params: tuple, key: tuple, after: dict) -> bool:
        """At a remote: the consolidated gives row ``key`` a new key, which
        this site holds.  The consolidated's log reaches it in order, so
        that row is this site's own doing (it inserted that key, or moved a
        row there) that the consolidated had not applied when it moved its
        row there; it keeps its row and refuses this site's (an INSERT of an
        existing key, sent back whole).  So this site drops its row and
        applies the move.  Whether it did: not when the UPDATE does not
        change the key or still fails (another constraint), which leaves
        everything as it was."""
        moved = key_after(table.key_columns, key, after)
        if moved == key:
            return False
        conn = self._conn
        conn.execute("SAVEPOINT fieldsync_take_key")
        try:
            conn.execute(self._statements.delete_sql(table), moved)
            conn.execute(sql, params)
        except sqlite3.IntegrityError:
            conn.execute("ROLLBACK TO fieldsync_take_key")
            return False
        finally:
            conn.execute("RELEASE fieldsync_take_key")
        return True

    def moved_key(self, table: SqliteTable, key: tuple) -> tuple | None:
        """The key this consolidated gave the row that had ``key`` (a row it
        no longer holds; :func:`follow_moves` over the capture table's key
        indexes)."""
        statements = self._statements

        def last_change(key: tuple) -> tuple[int, tuple] | None:
            last = None
            for shape_id in statements.table_shapes(table):
                index = key_indexes(self._shapes.get(shape_id))[0]
                if len(index.columns) != len(key):
                    continue
                sql = statements.cached(("last change", index.name), lambda: _last_change_sql(index))
                row = self._conn.execute(sql, (*key, FLAG_RETURN_TO_ORIGIN)).fetchone()
                if row is not None and (last is None or row[0] > last[0]):
                    last = row
            if last is None or last[2] != KIND_UPDATE:
                return None if last is None else (last[2], key)
            shape = self._shapes.get(last[1])
            width = len(shape.columns)
            return last[2], tuple(last[4 + width + position] for position in shape.key_positions)

        try:
            return follow_moves(table, key, last_change, statements.select)
        except OverflowError:  # an integer beyond 64 bits, which no row holds
            return None



def _last_change_sql(index: KeyIndex) -> str:
    """The last captured change of a key through ``index``, not one written
    back to an origin."""
    match = " AND ".join(f"{column} IS ?" for column in index.columns)
    return (f"SELECT * FROM fieldsync_capture INDEXED BY {index.name} WHERE {index.where} AND {match}"
            " AND (flags IS NULL OR flags & ? = 0) ORDER BY seq DESC LIMIT 1")

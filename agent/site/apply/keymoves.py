"""Key moves: operations on a row whose key one side changed.

Rules of this file:
* At the consolidated, an UPDATE or DELETE of a key it no longer holds
  follows its own captured key changes (:meth:`KeyMoves.moved_key`, at
  most ``MOVES_FOLLOWED``) and applies where the row is now.
* An UPDATE onto a key the other side holds: the consolidated refuses it
  and sends both rows back whole (:meth:`KeyMoves.refused_move`); a remote
  drops its own row there and applies the move (:meth:`KeyMoves.take_key`).
* What only notes a batch's rows (:func:`origin_changes`,
  :func:`readdressed`) and the decisions (:func:`refused_move`,
  :func:`follow_moves`, given a way to read a row and a key's last
  change) are plain functions both backends call (the PostgreSQL
  consolidated too); what reads or writes SQLite is a method of
  :class:`KeyMoves`, given the connection, the shapes and the statements.
"""

from __future__ import annotations

import sqlite3
from typing import Callable

from codec.ops import OpKind

from ..capture import FLAG_RETURN_TO_ORIGIN, KIND_UPDATE, KeyIndex, ShapeCache, key_indexes
from .batch import MOVES_FOLLOWED, Batch, Table, key_after, send_back, touch, watch
from .statements import Statements


def origin_changes(table: Table, op: tuple, batch: Batch) -> None:
    """The peer changes again a row that goes back to it (an earlier
    operation of the batch conflicted): the row it will hold when the
    row goes back has that change too, and the row written back must
    carry it as its before-image, or a pending change of the peer's
    equal to the older value would be taken for one the row was written
    with (rule 2)."""
    name_key = (table.name, op[2])
    pending = batch.returns.get(name_key)
    if pending is None or op[1] == OpKind.DELETE:
        return
    pending.origin_row.update(op[4])
    moved = key_after(table.key_columns, op[2], op[4]) if op[1] == OpKind.UPDATE else op[2]
    if moved != op[2] and (table.name, moved) not in batch.returns:
        batch.returns[(table.name, moved)] = batch.returns.pop(name_key)


def readdressed(table: Table, op: tuple, batch: Batch) -> None:
    """Note an operation applied under the key the row has now, for the
    rules that look at the rows a batch touched."""
    if batch.filters and table.name.lower() in batch.filters:
        touch(batch, table, [op])
    if batch.watched is not None:
        watch(batch, table, [op])


class KeyMoves:
    """Following and refusing changes of a row's key."""

    def __init__(self, conn: sqlite3.Connection, shapes: ShapeCache, statements: Statements) -> None:
        self._conn = conn
        self._shapes = shapes
        self._statements = statements

    def refused_move(self, table: Table, key: tuple, after: dict, batch: Batch) -> None:
        """At the consolidated: the peer gave row ``key`` a new key that a
        row here holds (:func:`refused_move`)."""
        refused_move(batch, table, key, after, self._statements.select)

    def take_key(self, table: Table, sql: str, params: tuple, key: tuple, after: dict) -> bool:
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

    def moved_key(self, table: Table, key: tuple) -> tuple | None:
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


def refused_move(batch: Batch, table: Table, key: tuple, after: dict,
                 select: Callable[[Table, tuple], dict | None]) -> None:
    """At the consolidated: the peer gave row ``key`` a new key that a row
    here holds (this site moved or inserted one there meanwhile); the
    UPDATE fails.  The peer drops its row there when it applies this
    site's change (KeyMoves.take_key), or holds it until then: both rows go
    back whole, the one under the old key as an INSERT (the peer moved it
    away).  ``select(table, key)`` reads a row here."""
    moved = key_after(table.key_columns, key, after)
    if moved == key:
        return
    old, new = select(table, key), select(table, moved)
    if old is None or new is None:
        return  # another constraint refused it
    columns = set(table.columns)
    send_back(batch, table, key, old, columns)
    batch.entered.add((table.name, key))
    send_back(batch, table, moved, {**old, **after}, columns)


def follow_moves(table: Table, key: tuple, last_change: Callable[[tuple], tuple[int, tuple] | None],
                 select: Callable[[Table, tuple], dict | None]) -> tuple | None:
    """The key this consolidated gave the row that had ``key`` (a row it no
    longer holds): its last captured change of that key, when an UPDATE
    that changed it, followed through further changes of the key to one
    that holds a row (at most ``MOVES_FOLLOWED``).  ``last_change(key)`` is
    the kind of the last captured change of ``key`` not written back to an
    origin and, for an UPDATE, the key it gave the row (None: no change
    captured); ``select(table, key)`` reads a row here.  None when the row
    was deleted, or the change is no longer captured (truncated)."""
    seen = {key}
    for _ in range(MOVES_FOLLOWED):
        last = last_change(key)
        if last is None or last[0] != KIND_UPDATE:
            return None
        moved = last[1]
        if moved in seen:
            return None
        if select(table, moved) is not None:
            return moved
        seen.add(moved)
        key = moved
    return None


def _last_change_sql(index: KeyIndex) -> str:
    """The last captured change of a key through ``index``, not one written
    back to an origin."""
    match = " AND ".join(f"{column} IS ?" for column in index.columns)
    return (f"SELECT * FROM fieldsync_capture INDEXED BY {index.name} WHERE {index.where} AND {match}"
            " AND (flags IS NULL OR flags & ? = 0) ORDER BY seq DESC LIMIT 1")

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
  change) are plain functions both backends call; what reads or writes
  SQLite is agent/site/sqlite/apply/keymoves.py's, the PostgreSQL
  consolidated's is agent/site/postgres/apply's.
"""

from __future__ import annotations

from typing import Callable

from codec.ops import OpKind

from ..capture import KIND_UPDATE
from .batch import Batch, MOVES_FOLLOWED, Table, key_after, send_back, touch, watch


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

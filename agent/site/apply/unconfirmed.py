"""The unconfirmed rule's decisions (docs/site-database.md "Concurrent
changes"), for both backends.

Rules of this file:
* At the consolidated, a row the batch changed also goes back to the origin
  when the log holds operations on it that the origin receives and has not
  confirmed: they may reach the origin after its change.
* Plain decisions (:func:`send_back_received`), given how to find the
  changes of some keys, what one becomes for the peer, and how to read a
  row: agent/site/sqlite/apply/unconfirmed.py and the PostgreSQL
  consolidated (agent/site/postgres/apply) look the changes up in their
  own capture tables.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from codec.ops import OpKind, Operation

from .batch import Batch, Table, send_back


def send_back_received(batch: Batch, rows_of_keys: Callable[[Table, set[tuple]], Iterable[tuple]],
                       operation: Callable[[Any], Operation | None],
                       select: Callable[[Table, tuple], dict | None],
                       lost_with_parent: Callable[[], None] | None = None) -> None:
    """The unconfirmed rule's decisions (Unconfirmed.send_back), for both
    backends.  ``rows_of_keys(table, keys)`` yields, in the order they were
    written, ``(seq, old key, new key, row)`` for the captured changes the
    peer has not confirmed whose old key or, for an UPDATE, new key is one
    of ``keys`` (the new key is the old one but for an UPDATE of the key);
    ``operation(row)`` is what such a change becomes for the peer (None:
    it does not receive it); ``select(table, key)`` reads a row as it is
    after the batch.  Records in ``batch.received`` the kind and image of
    the last such operation per row, as the peer sees it, and sends the
    rows concerned back (batch.send_back).  ``lost_with_parent()``, where
    rows follow their parent, records those that went with a parent at the
    peer before the rows are sent back (Unconfirmed._lost_with_parent)."""
    watched = batch.watched
    assert watched is not None
    received = batch.received
    holds = batch.holds
    absent = {name_key for name_key, held in holds.items() if not held}
    since: dict[tuple[str, tuple], int] = {}  # keys brought in by a move: operations after it
    by_table: dict[str, tuple[Table, set[tuple]]] = {}
    for (name, key), (table, _values) in watched.items():
        by_table.setdefault(name, (table, set()))[1].add(key)
    while by_table:
        brought: dict[str, tuple[Table, set[tuple]]] = {}
        for name, (table, keys) in by_table.items():
            for seq, old_key, new_key, row in rows_of_keys(table, keys):
                hits = [key for key in {old_key, new_key} if key in keys and seq > since.get((name, key), 0)]
                if not hits:
                    continue
                op = operation(row)
                if op is None:
                    continue  # the peer does not receive it: its own, or outside its subset
                image = op[4] if op[4] is not None else op[3]
                moves = op[1] == OpKind.UPDATE and old_key != new_key
                for key in hits:
                    kind = op[1]
                    if moves:
                        kind = OpKind.DELETE if key == old_key else OpKind.INSERT
                    if (name, key) in absent:
                        if kind == OpKind.INSERT:
                            absent.discard((name, key))
                        else:
                            kind = OpKind.DELETE  # it misses there
                    received[(name, key)] = (kind, image)
                if moves and old_key in hits and new_key not in keys:
                    # A move of a row the batch touched: the new key, and what follows it there.
                    values = watched[(name, old_key)][1]
                    watched[(name, new_key)] = (table, {column: value for column, value in values.items()
                                                        if column not in table.key_columns})
                    since[(name, new_key)] = seq
                    if (name, old_key) in absent:
                        absent.add((name, new_key))
                        received[(name, new_key)] = (OpKind.DELETE, image)
                    else:
                        received[(name, new_key)] = (OpKind.INSERT, image)
                    brought.setdefault(name, (table, set()))[1].add(new_key)
        by_table = brought
    if lost_with_parent is not None:
        lost_with_parent()
    whole = set()
    for (name, old_key), new_key in batch.moved.items():
        if (name, old_key) in received and holds.get((name, new_key)):
            whole.add((name, new_key))
            if (name, new_key) not in received:
                received[(name, new_key)] = (OpKind.UPDATE, dict(watched[(name, new_key)][1]))
    for name_key in received:
        table, values = watched[name_key]
        result = select(table, name_key[1])
        if result is not None:
            columns = set(table.columns) if name_key in whole or not values else set(values)
            send_back(batch, table, name_key[1], {**result, **values}, columns)

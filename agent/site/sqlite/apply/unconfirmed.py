"""The unconfirmed rule (docs/site-database.md "Concurrent changes").

Rules of this file:
* At the consolidated, a row the batch changed also goes back to the origin
  when the log holds operations on it that the origin receives and has not
  confirmed: they may reach the origin after its change.
* They are looked up by key in the capture table's key indexes, never by
  reading that part of the log: the cost follows the rows the batch
  touched, whatever the length of the unconfirmed range.
* The decisions (:func:`send_back_received`) are a plain function both
  backends call (the PostgreSQL consolidated too), given how to find the
  changes of some keys, what one becomes for the peer, and how to read a
  row.  :class:`Unconfirmed` does SQLite's part, given the connection,
  the shapes and the statements; it keeps, per peer, a stretch of the log
  found to hold only the peer's own transactions.
"""

from __future__ import annotations

import sqlite3
from typing import Iterator

from codec.ops import OpKind, Operation

from ...apply.batch import Batch
from ...apply.unconfirmed import send_back_received
from ...capture import KIND_UPDATE
from ...identity import SiteIdentity
from ...values import value_problem
from ..capture import KeyIndex, ShapeCache, key_indexes
from ..selection import SubscriberReader, subscriber_reader
from .followers import ancestors
from .statements import SqliteTable, Statements

# Keys the unconfirmed rule looks up per statement (see _rows_of_keys).
_PROBE_CHUNK = 200


class Unconfirmed:
    """The unconfirmed rule: whether a batch needs it, and what it sends back."""

    def __init__(self, conn: sqlite3.Connection, shapes: ShapeCache, statements: Statements) -> None:
        self._conn = conn
        self._shapes = shapes
        self._statements = statements
        # Per peer, a stretch (after, until] of the log that holds only the
        # peer's own transactions and no row written back to it (see
        # any_unconfirmed).
        self._own_runs: dict[str, tuple[int, int]] = {}

    def any_unconfirmed(self, peer: str, confirmed: int, end: int) -> bool:
        """Whether the log holds, in ``(confirmed, end]``, operations ``peer``
        may receive: of another origin, or written back to it.  A stretch
        found to hold only the peer's own transactions is remembered, so a
        remote whose own transactions pile up unconfirmed (it receives
        nothing) does not have them read again at every batch."""
        if end <= confirmed:
            return False
        start = confirmed
        known = self._own_runs.get(peer)
        if known is not None and known[0] <= confirmed <= known[1] <= end:
            start = known[1]
        conn = self._conn
        if conn.execute("SELECT 1 FROM fieldsync_log WHERE commit_offset > ? AND commit_offset <= ? AND origin != ?"
                        " LIMIT 1", (start, end, peer)).fetchone():
            return True
        # Every transaction there is the peer's: any row written back in it is for the peer.
        if conn.execute("SELECT 1 FROM fieldsync_returned WHERE seq > ? AND seq <= ? LIMIT 1",
                        (start, end)).fetchone():
            return True
        # Committed log rows never change (this apply has written none yet
        # but a cut of local changes, whose origin is this site).
        self._own_runs[peer] = (confirmed, end)
        return False

    def send_back(self, identity: SiteIdentity, batch: Batch, confirmed: int, end: int) -> None:
        """The unconfirmed rule.  A row the batch changed may end up different
        at the peer when the log holds, in ``(confirmed, end]``, operations on
        it that the peer receives: they may reach the peer after its change.
        Such a row's state after the batch goes back to the peer, after them
        (written by Conflicts.write_returns).  Records in ``batch.received`` the kind
        and image of the last such operation per row, as the peer sees it.

        Keys make two more cases.  Where the peer holds no row under a key
        after its batch (it deleted the row or gave it another key), an
        operation on that key misses at the peer: it counts as a DELETE
        there unless it is an INSERT.  And an operation that gives a row the
        batch touched another key (old -> new) brings the new key in: the
        peer holds the row there when it held it under the old key
        (otherwise it missed the move and lacks the row), so the new key's
        operations after the move are looked up as well.  Last, a row whose
        key the batch changed, while operations on its old key reach the
        peer and miss it there, goes back whole under its new key.

        Costs lookups by key for the rows the batch touched and the
        operations on them, whatever the length of ``(confirmed, end]``."""
        peer_ops = _PeerOperations(self._conn, identity, self._shapes, batch.peer)

        def rows_of_keys(table: SqliteTable, keys: set[tuple]) -> Iterator[tuple[int, tuple, tuple, tuple]]:
            for row in self._rows_of_keys(table, keys, confirmed, end):
                shape = self._shapes.get(row[1])
                width = len(shape.columns)
                old_key = tuple(row[4 + i] for i in shape.key_positions)
                new_key = (tuple(row[4 + width + i] for i in shape.key_positions) if row[2] == KIND_UPDATE
                           else old_key)
                yield row[0], old_key, new_key, row

        lost = ((lambda: self._lost_with_parent(batch, confirmed, end, peer_ops)) if self._statements.follows
                else None)
        send_back_received(batch, rows_of_keys, lambda row: peer_ops.operation(row, end), self._statements.select,
                           lost)

    def _lost_with_parent(self, batch: Batch, confirmed: int, end: int, peer_ops: "_PeerOperations") -> None:
        """Rows that follow their parent: a row the batch touched goes back
        whole (as if deleted there) when the log holds, in ``(confirmed,
        end]``, an operation the peer receives that takes one of its parents
        away there or brings it there (a DELETE or an INSERT: a move out of
        its subset or into it), as the row is now or as the peer wrote it.
        Taken away: the row went with that parent at the peer
        (route.apply_triggers), whatever came after it.  Brought: the parent
        was not there before, so the peer wrote the row before the parent
        left it (after it came back, the peer's change would come with a
        confirmation of the operation that brought it), and the row went
        with it then."""
        statements = self._statements
        above: dict[str, tuple[SqliteTable, dict[tuple, set[tuple[str, tuple]]]]] = {}
        for name_key, (table, values) in batch.watched.items():  # type: ignore[union-attr]
            if table.name.lower() not in statements.follows or name_key in batch.received:
                continue
            row = statements.select(table, name_key[1])
            if row is None:
                continue
            for image in (row, {**row, **values}):
                for parent, key in ancestors(self._conn, statements, table, image):
                    above.setdefault(parent.name, (parent, {}))[1].setdefault(key, set()).add(name_key)
        for parent, keys in above.values():
            for row in self._rows_of_keys(parent, set(keys), confirmed, end):
                shape = self._shapes.get(row[1])
                key = tuple(row[4 + i] for i in shape.key_positions)
                if key not in keys:
                    continue  # a row given this key by an UPDATE: it arrives, not leaves
                op = peer_ops.operation(row, end)
                if op is None or not (op[1] != OpKind.UPDATE
                                      or op[4] and not op[4].keys().isdisjoint(parent.key_columns)):
                    continue
                for child in keys.pop(key):
                    if child not in batch.received:
                        batch.received[child] = (OpKind.DELETE, dict(batch.watched[child][1]))  # type: ignore[index]

    def _rows_of_keys(self, table: SqliteTable, keys: set[tuple], after: int, until: int) -> list[tuple]:
        """Capture rows of ``table`` in ``(after, until]`` whose old key or, for
        an UPDATE that changed it, new key is one of ``keys`` (SQLite's
        ``IS``: NULL matches NULL, 1 matches 1.0), in seq order.  Found
        through the key indexes of the table's shapes (capture.key_indexes),
        so the cost follows the keys and their rows, not the range."""
        found: dict[int, tuple] = {}
        for shape_id in self._statements.table_shapes(table):
            for index in key_indexes(self._shapes.get(shape_id)):
                # A key of another length than the shape's matches none of its rows.
                probes = [key for key in keys if len(key) == len(index.columns)]
                for start in range(0, len(probes), _PROBE_CHUNK):
                    probe = probes[start:start + _PROBE_CHUNK]
                    try:
                        rows = self._probe(index, probe, after, until)
                    except OverflowError:  # an integer beyond 64 bits, which no row holds
                        rows = self._probe(index, [key for key in probe if all(value_problem(part) is None
                                                                               for part in key)], after, until)
                    found.update((row[0], row) for row in rows)
        return [found[seq] for seq in sorted(found)]

    def _probe(self, index: KeyIndex, keys: list[tuple], after: int, until: int) -> list[tuple]:
        """Capture rows in ``(after, until]`` that ``index`` holds under one of
        ``keys`` (each as long as the index)."""
        if not keys:
            return []
        sql = self._statements.cached(("probe", index.name, len(keys)), lambda: _probe_sql(index, len(keys)))
        return self._conn.execute(sql, (*(part for key in keys for part in key), after, until)).fetchall()


class _PeerOperations:
    """What capture rows become for ``peer``, read in seq order: each row's
    log transaction (kept while the rows stay in it) and the operation the
    peer receives, if any."""

    def __init__(self, conn: sqlite3.Connection, identity: SiteIdentity, shapes: ShapeCache, peer: str) -> None:
        self._conn = conn
        self._identity = identity
        self._shapes = shapes
        self._peer = peer
        self._reader: SubscriberReader | None = None
        self._transaction = (1, 0, "")  # of the last row looked at: (first seq, commit, origin)

    def operation(self, row: tuple, end: int) -> Operation | None:
        """The operation capture ``row`` becomes for the peer (None: none, or
        its log transaction lies beyond ``end``)."""
        seq = row[0]
        transaction = self._transaction
        if not transaction[0] <= seq <= transaction[1]:
            found = self._conn.execute("SELECT first_seq, commit_offset, origin FROM fieldsync_log"
                                       " WHERE commit_offset >= ? ORDER BY commit_offset LIMIT 1", (seq,)).fetchone()
            if found is None or found[1] > end:
                return None
            transaction = self._transaction = found
        if self._reader is None:
            self._reader = subscriber_reader(self._conn, self._identity, self._shapes, self._peer)
        self._reader.at(transaction[1])
        return self._reader.operation(transaction[2], row)


def _probe_sql(index: KeyIndex, count: int) -> str:
    """Capture rows in ``(?, ?]`` that ``index`` holds under one of ``count``
    keys, bound first."""
    probe = ", ".join(f"k{position}" for position in range(len(index.columns)))
    values = ", ".join([f"({', '.join('?' * len(index.columns))})"] * count)
    match = " AND ".join(f"{column} IS k{position}" for position, column in enumerate(index.columns))
    # INDEXED BY: a plan without the index would read the whole range.
    return (f"WITH probe ({probe}) AS (VALUES {values}) SELECT fieldsync_capture.* FROM probe,"
            f" fieldsync_capture INDEXED BY {index.name} WHERE {index.where} AND {match}"
            " AND seq > ? AND seq <= ?")

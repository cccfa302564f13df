"""Rows that follow their parent, on the apply path (docs/site-database.md,
"Rows that follow their parent"): what goes with a parent when one site
moves it while another changes the rows under it.

Rules of this file:
* At the consolidated, a row sent back whole to a batch's origin takes the
  rows under it along, whole, at any depth (:func:`descendants`): the
  origin lost them with it, or never had them under it.  A row the parent
  check refused to insert goes back as a DELETE: the origin may have given
  it another parent before the DELETE of its own reached it.  A row the
  batch changed goes back whole when the log holds, unconfirmed, an
  operation that takes one of its parents (:func:`ancestors`) away from the
  origin or brings it there (Unconfirmed.send_back): it went with that
  parent there.  So does a row whose change the parent check refused while
  this site keeps it (:meth:`Followers.refused`): the origin holds it under
  a parent that is gone here, and loses it with that parent.
* At a remote, a row the consolidated changes to name a parent this remote
  does not hold leaves it (:meth:`Followers.refused`), as a row goes with
  its parent when the parent is deleted (route.apply_triggers): the
  consolidated routes it by a parent that is not this remote's.
* At a remote, its rows with changes of its own the consolidated has not
  confirmed that went along with a parent the consolidated deleted or
  moved away (recorded as they went, route.apply_triggers) come back as
  they went when the consolidated sends the parent again
  (:meth:`Followers.restore`), unless a DELETE of the consolidated took
  them since: the consolidated applies those changes after the parent came
  back, finds the rows in this remote's subset and sends nothing back.
* The cost follows the parents inserted and the records of rows that went
  with a parent; nothing is read for a site without follow articles.
"""

from __future__ import annotations

import sqlite3
from typing import Iterable, Iterator

from codec.ops import OpKind

from ...apply.batch import Batch, send_back
from ...capture import FLAG_WITH_PARENT, KIND_DELETE
from .._db import quote_ident
from ..capture import ShapeCache, write_capture_row
from ..route import Follow, parent_missing
from .statements import SqliteTable, Statements


def children(statements: Statements, table: str) -> list[Follow]:
    """The follows whose parent is ``table`` (any case)."""
    lowered = table.lower()
    return [follow for follow in statements.follows.values() if follow.parent.lower() == lowered]


def descendants(conn: sqlite3.Connection, statements: Statements, table: SqliteTable,
                row: dict) -> Iterator[tuple[SqliteTable, dict]]:
    """The rows under ``row`` of ``table`` at any depth, parents first."""
    level = [(table, row)]
    while level:
        deeper = []
        for parent, values in level:
            for follow in children(statements, parent.name):
                child = statements.table(follow.table)
                if child is None:
                    continue
                sql = statements.cached(("children", follow.table), lambda: (
                    f"SELECT {', '.join(quote_ident(column) for column in child.columns)} FROM {child.quoted}"
                    " WHERE " + " AND ".join(f"{quote_ident(column)} = ?" for column in follow.columns)))
                for found in conn.execute(sql, [values.get(column) for column in follow.parent_columns]):
                    deeper.append((child, dict(zip(child.columns, found))))
        yield from deeper
        level = deeper


def ancestors(conn: sqlite3.Connection, statements: Statements, table: SqliteTable,
              image: dict) -> Iterator[tuple[SqliteTable, tuple]]:
    """The rows above a row of ``table`` with the values ``image``, nearest
    first, as (table, key); a parent this site no longer holds ends the
    walk (its key, when its foreign key names the parent's key)."""
    follow = statements.follows.get(table.name.lower())
    for _ in range(len(statements.follows)):
        if follow is None:
            return
        parent = statements.table(follow.parent)
        values = [image.get(column) for column in follow.columns]
        if parent is None or any(value is None for value in values):
            return
        sql = statements.cached(("parent", follow.table), lambda: (
            f"SELECT {', '.join(quote_ident(column) for column in parent.columns)} FROM {parent.quoted}"
            " WHERE " + " AND ".join(f"{quote_ident(column)} = ?" for column in follow.parent_columns)))
        found = conn.execute(sql, values).fetchone()
        if found is None:
            if tuple(column.lower() for column in follow.parent_columns) == tuple(
                    column.lower() for column in parent.key_columns):
                yield parent, tuple(values)
            return
        image = dict(zip(parent.columns, found))
        yield parent, tuple(image[column] for column in parent.key_columns)
        follow = statements.follows.get(parent.name.lower())


class Followers:
    """The rules above, for the driver."""

    def __init__(self, conn: sqlite3.Connection, shapes: ShapeCache, statements: Statements) -> None:
        self._conn = conn
        self._shapes = shapes
        self._statements = statements
        self._parents: tuple[dict, frozenset[str]] = ({}, frozenset())

    @property
    def parents(self) -> frozenset[str]:
        """The tables rows follow (lower-case names)."""
        follows = self._statements.follows
        if self._parents[0] is not follows:
            self._parents = (follows, frozenset(follow.parent.lower() for follow in follows.values()))
        return self._parents[1]

    def refused(self, batch: Batch, table: SqliteTable, op: tuple, consolidated: bool) -> bool:
        """``op`` is still refused by a foreign key (or the parent check) at
        the end of its transaction; True when that is no error (the row
        left this remote)."""
        if consolidated and op[1] == OpKind.INSERT and type(op[4]) is dict \
                and table.name.lower() in self._statements.follows:
            # The origin holds a row this site does not: a DELETE goes back
            # (Conflicts.write_returns), in case it gave the row another parent.
            batch.stranded[(table.name, op[2])] = (table, {**op[4], **dict(zip(table.key_columns, op[2]))})
            return False
        if op[1] != OpKind.UPDATE or type(op[4]) is not dict:
            return False
        follow = self._statements.follows.get(table.name.lower())
        if follow is None or not any(column in op[4] for column in follow.columns):
            return False
        local = self._statements.select(table, op[2])
        if local is None:
            return False
        if consolidated:
            send_back(batch, table, op[2], dict(local), set(table.columns))
            batch.entered.add((table.name, op[2]))
            return False
        if not parent_missing(self._conn, follow, {**local, **op[4]}):
            return False
        self._conn.execute(self._statements.delete_sql(table), op[2])  # its own rows go with it
        batch.applied += 1
        return True

    def went_with_parent(self, batch: Batch, table: SqliteTable, op: tuple) -> bool:
        """At a remote, the consolidated's DELETE ``op`` found no row: True
        (applied) when the row went with its parent (it follows one this
        remote does not hold); recorded, so that :meth:`restore` does not
        bring it back."""
        follow = self._statements.follows.get(table.name.lower())
        if follow is None or type(op[3]) is not dict or not parent_missing(self._conn, follow, op[3]):
            return False
        if table.shape is not None:
            image = {**op[3], **dict(zip(table.key_columns, op[2]))}
            write_capture_row(self._conn, table.shape, KIND_DELETE, None,
                              [image.get(column) for column in table.shape.columns])
        batch.applied += 1
        return True

    def note_inserts(self, batch: Batch, table: SqliteTable, images: Iterable[dict]) -> None:
        """At a remote: rows of ``table`` (their after-images) went in; if
        rows follow it, their parents may have come back."""
        if not any(batch.pending.get(name) for name in self._statements.follows):
            return  # no row of this remote's own follows a parent: none can come back
        followers = children(self._statements, table.name)
        for image in images:
            for follow in followers:
                batch.parents_back.add((follow.table.lower(), tuple(image.get(column)
                                                                    for column in follow.parent_columns)))

    def restore(self, batch: Batch) -> None:
        """At a remote, after a transaction that inserted parents: rows of
        its own pending changes that went along with them come back, as they
        went, and the rows that went with those (see the rules)."""
        back, batch.parents_back = batch.parents_back, set()
        gone = self._gone(batch)
        statements = self._statements
        # (lower-case table, parent key) -> the seq after which a row that
        # went under that parent comes back with it (None: only pending rows).
        wanted: dict[tuple[str, tuple], int | None] = dict.fromkeys(back)
        while wanted and gone:
            restored: list[tuple[SqliteTable, dict, int]] = []
            for name_parent, after in wanted.items():
                for key, (seq, image, pending) in gone.get(name_parent, {}).items():
                    if (not pending if after is None else seq < after):
                        continue
                    table = statements.table(name_parent[0])
                    follow = statements.follows.get(name_parent[0])
                    if table is None or follow is None or statements.select(table, key) is not None \
                            or self._deleted(table, key, seq) or parent_missing(self._conn, follow, image):
                        continue
                    values = {column: value for column, value in image.items() if column in table.column_set}
                    try:
                        self._conn.execute(statements.insert_sql(table, tuple(values), ignore=False),
                                           tuple(values.values()))
                    except sqlite3.IntegrityError as error:
                        statements.error(batch, (table.name, OpKind.INSERT, key, None, values),
                                         f"constraint failed: {error} (a row that went with its parent, put "
                                         "back when the parent came back)")
                        continue
                    restored.append((table, values, seq))
            wanted = {(follow.table.lower(), tuple(values.get(column) for column in follow.parent_columns)): seq
                      for table, values, seq in restored for follow in children(statements, table.name)}

    def _gone(self, batch: Batch) -> dict[tuple[str, tuple], dict[tuple, tuple[int, dict, bool]]]:
        """The rows that went with a parent (capture rows flagged
        FLAG_WITH_PARENT) since this remote's oldest pending change, as they
        went, by (lower-case table, parent key) and key, with whether the
        row has pending changes of this remote's from before it went.  Read
        once a batch, then only the records written since; nothing when no
        pending row follows a parent."""
        conn, follows = self._conn, self._statements.follows
        if batch.followers is None:
            oldest = min((own.seq for name in follows for own in batch.pending.get(name, {}).values()), default=None)
            batch.followers = [oldest, {}, {}]
        start, found, latest = batch.followers
        if start is None:
            return found
        end = conn.execute("SELECT max(seq) FROM fieldsync_capture").fetchone()[0] or start
        for row in conn.execute("SELECT * FROM fieldsync_capture WHERE seq > ? AND seq <= ? AND flags & ?"
                                " ORDER BY seq", (start, end, FLAG_WITH_PARENT)):
            shape = self._shapes.get(row[1])
            follow = follows.get(shape.table.lower())
            if follow is None:
                continue
            image = dict(zip(shape.columns, row[4:4 + len(shape.columns)]))
            key = tuple(image.get(column) for column in shape.key_columns)
            own = batch.pending.get(shape.table.lower(), {}).get(key)
            pending = own is not None and not own.deleted and own.moved_to is None and own.seq < row[0]
            parent = tuple(image.get(column) for column in follow.columns)
            earlier = latest.get((shape.table.lower(), key))
            if earlier is not None:  # it went again, maybe under another parent
                found[earlier].pop(key, None)
            found.setdefault((shape.table.lower(), parent), {})[key] = (row[0], image, pending)
            latest[(shape.table.lower(), key)] = (shape.table.lower(), parent)
        batch.followers[0] = end
        return found

    def _deleted(self, table: SqliteTable, key: tuple, since: int) -> bool:
        """Whether a DELETE of the consolidated took row ``key`` away after
        ``since`` (pending.py records the DELETEs of pending rows)."""
        for shape_id in self._statements.table_shapes(table):
            shape = self._shapes.get(shape_id)
            match = " AND ".join(f"v{position} IS ?" for position in shape.key_positions)
            if self._conn.execute(f"SELECT 1 FROM fieldsync_capture WHERE seq > ? AND shape = ? AND kind = ?"
                                  f" AND (flags IS NULL OR flags & ? = 0) AND {match} LIMIT 1",
                                  (since, shape_id, KIND_DELETE, FLAG_WITH_PARENT, *key)).fetchone():
                return True
        return False


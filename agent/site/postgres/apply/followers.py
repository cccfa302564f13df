"""Rows that follow their parent, as the apply path at a PostgreSQL
consolidated meets them (docs/site-database.md, "Rows that follow their
parent": the mirror rules of agent/site/sqlite/apply/followers.py).

Rules of this file:
* A remote's change of a child whose parent this site lacks is refused by
  the table's foreign key (set aside to the end of its transaction first,
  batch.settle), and recorded as an apply error.  So that the origin ends
  holding what this site holds: a refused INSERT goes back to it as a
  DELETE (it may have given the row another parent since), a refused
  UPDATE of its foreign key, of a row this site keeps, goes back whole.
  Here, unlike at a SQLite consolidated (its keys off), the keys also
  refuse a remote's DELETE of a parent under which this site holds rows
  the remote did not know of (it gave the parent a child meanwhile): the
  parent goes back whole, with the rows under it.
* A row that goes back whole to the origin takes the rows under it, at any
  depth, parents first (conflicts.planned_returns' ``under``): the origin
  lost them with it, or never had them under it.
* A row the batch touched goes back whole when an operation the origin has
  not confirmed takes one of its parents away there or brings it there
  (:meth:`PgFollowers.lost_with_parent`): it went with that parent there.
* Functions here run inside the apply's transaction.
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator

import psycopg
from psycopg import sql

from codec.ops import OpKind, Operation

from ...apply.batch import Batch, send_back
from .. import route
from ..capture import shown_table
from .tables import PgTable, Tables


class PgFollowers:
    """The follow articles of the site, as one batch's apply sees them."""

    def __init__(self, conn: psycopg.Connection, tables: Tables) -> None:
        self._conn = conn
        self._tables = tables
        followed = route.follows(conn)
        self.finders = route.finders(conn) if followed else {}  # by (schema, table): how a row finds its route
        # By lower-case child: its foreign key columns; by lower-case parent: its children.
        self._columns: dict[str, tuple[str, ...]] = {}
        self._children: dict[str, list[tuple[str, tuple[str, ...], tuple[str, ...]]]] = {}
        self._parents: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {}  # by lower-case child
        for (schema, table), (parent, columns, parent_columns) in followed.items():
            child = shown_table(schema, table)
            self._columns[child.lower()] = columns
            self._children.setdefault(parent.lower(), []).append((child, columns, parent_columns))
            self._parents[child.lower()] = (parent, columns, parent_columns)

    def finder(self, table: PgTable) -> route.RouteFinder | None:
        """How a row of ``table`` finds its route (None: it follows no parent)."""
        layout = table.pg_shape.layout
        return self.finders.get((layout.schema, layout.table))

    def refused(self, batch: Batch, error: Callable[[tuple, str], None]) -> Callable[[tuple, str], None]:
        """``error`` (what records an operation still refused at the end of
        its transaction), noting first what goes back to the origin."""
        def record(op: tuple, problem: str) -> None:
            table = self._tables.table(op[0])
            if table is not None and op[1] == OpKind.DELETE and table.name.lower() in self._children:
                # The origin deleted a parent this site keeps, with rows under it
                # that the origin did not know of: it comes back whole, with them.
                found = table.lock(self._conn, op[2])
                if found is not None:
                    send_back(batch, table, op[2], dict(found[0]), set(table.columns))
                    batch.entered.add((table.name, op[2]))
            elif table is not None and table.name.lower() in self._columns and type(op[4]) is dict:
                if op[1] == OpKind.INSERT:
                    batch.stranded[(table.name, op[2])] = (table, {**op[4], **dict(zip(table.key_columns, op[2]))})
                elif op[1] == OpKind.UPDATE and any(column in op[4] for column in self._columns[table.name.lower()]):
                    found = table.lock(self._conn, op[2])
                    if found is not None:
                        send_back(batch, table, op[2], dict(found[0]), set(table.columns))
                        batch.entered.add((table.name, op[2]))
            error(op, problem)
        return record

    def lost_with_parent(self, batch: Batch, changes: Callable[[PgTable, set[tuple]], Iterable[tuple]],
                         operation: Callable[[tuple], Operation | None],
                         select: Callable[[PgTable, tuple], dict | None]) -> Callable[[], None] | None:
        """The unconfirmed rule's part for rows that follow their parent
        (agent.site.apply.unconfirmed.send_back_received's
        ``lost_with_parent``; SQLite's Unconfirmed._lost_with_parent): a row
        the batch touched goes back whole (as if deleted at the peer) when
        the changes the peer has not confirmed (``changes``, as
        lookups.rows_of_keys gives them) hold an operation it receives
        (``operation``) that takes one of the row's parents away there or
        brings it there, as the row is now or as the peer wrote it: the row
        went with that parent at the peer.  None: no table follows a parent."""
        if not self._columns:
            return None

        def lost() -> None:
            above: dict[str, tuple[PgTable, dict[tuple, set[tuple[str, tuple]]]]] = {}
            for name_key, (table, values) in (batch.watched or {}).items():
                if table.name.lower() not in self._columns or name_key in batch.received:
                    continue
                row = select(table, name_key[1])
                if row is None:
                    continue
                for image in (row, {**row, **values}):
                    for parent, key in self._ancestors(table, image):
                        above.setdefault(parent.name, (parent, {}))[1].setdefault(key, set()).add(name_key)
            for parent, keys in above.values():
                for _seq, old_key, _new_key, change in changes(parent, set(keys)):
                    if old_key not in keys:
                        continue  # a row given this key by an UPDATE: it arrives, not leaves
                    op = operation(change)
                    if op is None or not (op[1] != OpKind.UPDATE
                                          or op[4] and not op[4].keys().isdisjoint(parent.key_columns)):
                        continue
                    watched = batch.watched or {}
                    for child in keys.pop(old_key):
                        if child not in batch.received:
                            batch.received[child] = (OpKind.DELETE, dict(watched[child][1]))
        return lost

    def _ancestors(self, table: PgTable, image: dict) -> Iterator[tuple[PgTable, tuple]]:
        """The rows above a row of ``table`` with the values ``image``,
        nearest first, as (table, key); a parent this site no longer holds
        ends the walk (its key, when its foreign key names the parent's key)."""
        found = self._parents.get(table.name.lower())
        for _ in range(len(self._parents)):
            if found is None:
                return
            name, columns, parent_columns = found
            parent = self._tables.table(name)
            values = [image.get(column) for column in columns]
            if parent is None or any(value is None for value in values):
                return
            rows = self._rows(parent, parent_columns, values)
            if not rows:
                if tuple(parent_columns) == tuple(parent.key_columns):
                    yield parent, tuple(values)
                return
            image = rows[0]
            yield parent, tuple(image[column] for column in parent.key_columns)
            found = self._parents.get(parent.name.lower())

    def _rows(self, table: PgTable, columns: tuple[str, ...], values: list) -> list[dict]:
        """The rows of ``table`` whose ``columns`` hold ``values`` (as they travel)."""
        images = sql.SQL(", ").join(sql.SQL(table.kinds[column].capture).format(sql.Identifier(column))
                                    for column in table.columns)
        query = sql.SQL("SELECT ARRAY[{}] FROM {} WHERE {}").format(
            images, table.identifier, sql.SQL(" AND ").join(
                sql.SQL("{} = %s::{}").format(sql.Identifier(column), table.casts[column]) for column in columns))
        return [dict(zip(table.columns, table.pg_shape.load(texts)))
                for (texts,) in self._conn.execute(query, table.params(columns, values))]

    def under(self, table: PgTable, row: dict) -> Iterator[tuple[PgTable, dict]]:
        """The rows under ``row`` of ``table`` at any depth, parents first."""
        level = [(table, row)]
        while level:
            deeper = []
            for parent, values in level:
                for name, columns, parent_columns in self._children.get(parent.name.lower(), ()):
                    child = self._tables.table(name)
                    if child is not None:
                        deeper += [(child, found) for found in self._rows(
                            child, columns, [values.get(column) for column in parent_columns])]
            yield from deeper
            level = deeper

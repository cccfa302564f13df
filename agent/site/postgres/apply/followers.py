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
* A row that goes back whole to the origin takes the rows under it, at any
  depth, parents first (conflicts.planned_returns' ``under``): the origin
  lost them with it, or never had them under it.
* Functions here run inside the apply's transaction.
"""

from __future__ import annotations

from typing import Callable, Iterator

import psycopg
from psycopg import sql

from codec.ops import OpKind

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
        for (schema, table), (parent, columns, parent_columns) in followed.items():
            child = shown_table(schema, table)
            self._columns[child.lower()] = columns
            self._children.setdefault(parent.lower(), []).append((child, columns, parent_columns))

    def finder(self, table: PgTable) -> route.RouteFinder | None:
        """How a row of ``table`` finds its route (None: it follows no parent)."""
        layout = table.pg_shape.layout
        return self.finders.get((layout.schema, layout.table))

    def refused(self, batch: Batch, error: Callable[[tuple, str], None]) -> Callable[[tuple, str], None]:
        """``error`` (what records an operation still refused at the end of
        its transaction), noting first what goes back to the origin."""
        def record(op: tuple, problem: str) -> None:
            table = self._tables.table(op[0])
            if table is not None and table.name.lower() in self._columns and type(op[4]) is dict:
                if op[1] == OpKind.INSERT:
                    batch.stranded[(table.name, op[2])] = (table, {**op[4], **dict(zip(table.key_columns, op[2]))})
                elif op[1] == OpKind.UPDATE and any(column in op[4] for column in self._columns[table.name.lower()]):
                    found = table.lock(self._conn, op[2])
                    if found is not None:
                        send_back(batch, table, op[2], dict(found[0]), set(table.columns))
                        batch.entered.add((table.name, op[2]))
            error(op, problem)
        return record

    def under(self, table: PgTable, row: dict) -> Iterator[tuple[PgTable, dict]]:
        """The rows under ``row`` of ``table`` at any depth, parents first."""
        level = [(table, row)]
        while level:
            deeper = []
            for parent, values in level:
                for name, columns, parent_columns in self._children.get(parent.name.lower(), ()):
                    child = self._tables.table(name)
                    if child is None:
                        continue
                    images = sql.SQL(", ").join(sql.SQL(child.kinds[column].capture).format(sql.Identifier(column))
                                                for column in child.columns)
                    query = sql.SQL("SELECT ARRAY[{}] FROM {} WHERE {}").format(
                        images, child.identifier, sql.SQL(" AND ").join(
                            sql.SQL("{} = %s::{}").format(sql.Identifier(column), child.casts[column])
                            for column in columns))
                    params = child.params(columns, [values.get(column) for column in parent_columns])
                    for (texts,) in self._conn.execute(query, params):
                        deeper.append((child, dict(zip(child.columns, child.pg_shape.load(texts)))))
            yield from deeper
            level = deeper

"""The rows a batch sends back to its origin at a PostgreSQL consolidated,
and the origin's subset that decides some of them.

Rules of this file:
* What goes back is decided as on SQLite (agent.site.apply.conflicts
  .planned_returns: conflicts, INSERTs of a held key, key moves, rows that
  leave or enter the origin's subset, the unconfirmed rule); this file
  writes it.  A row that follows its parent is in the subset by its
  route, and a row written back carries its routes (route.py).
* A row written back is a capture row of the apply's own transaction,
  flagged FLAG_RETURN_TO_ORIGIN, with the origin's name as its origin
  (the session's ``fieldsync.origin``): it lands in the origin's log
  transaction, after the batch's own rows, and a reader gives it to the
  origin alone (agent.site.selection.SubscriberReader).  Its
  ``fieldsync.returned`` row names the peer and, for an UPDATE, the
  columns that go back.
* Values become capture text through the columns' own capture expressions
  (tables.PgTable), as the triggers write them.  A value of the origin's
  that this site's type cannot hold (its change was an apply error) goes
  as NULL: the row written back still carries this site's values.
"""

from __future__ import annotations

import json
from typing import Iterable

import psycopg

from ...apply.batch import AnyFilter, Filter, peer_filters
from ...capture import FLAG_RETURN_TO_ORIGIN
from .. import route
from ..capture import shown_table
from ..subscriptions import VALUE_COLUMNS, stored_value
from ..errors import ValueNotConvertible
from .lookups import value_texts
from .tables import PgTable


def filters(conn: psycopg.Connection, peer: str, finders: dict[tuple[str, str], route.RouteFinder]
            ) -> dict[str, Filter | AnyFilter]:
    """``peer``'s subset of each table published with a SUBSCRIBE BY column
    or following its parent (lower-case table -> Filter; ``finders``:
    route.finders): what decides which rows leave it.  A table in several
    of the peer's publications: the rows any of them keeps (AnyFilter);
    none, when one of them keeps every row."""
    values: dict[str, set] = {}
    for publication, *value in conn.execute(f"SELECT publication, {VALUE_COLUMNS} FROM fieldsync.subscription"
                                            " WHERE remote = %s AND until IS NULL", (peer,)):
        bucket = values.setdefault(publication, set())
        held = stored_value(*value)
        if held is not None:
            bucket.add(held)

    def parts() -> Iterable[tuple[str, str, Filter | None]]:
        for schema, table, publication, column, follows in conn.execute(
                "SELECT table_schema, table_name, publication, subscribe_by, follows FROM fieldsync.article"
                " ORDER BY table_schema, table_name, publication").fetchall():
            subset = frozenset(values.get(publication, ()))
            shown = shown_table(schema, table)
            if follows is not None:
                finder = finders.get((schema, table))
                if finder is not None:  # none: a missing table (catalogue.missing_tables), nothing of it applied
                    yield shown, publication, Filter(finder.columns, subset, finder.value)
            else:
                yield shown, publication, None if column is None else Filter((column,), subset)
    return peer_filters(parts(), values)


def write_return(conn: psycopg.Connection, table: PgTable, peer: str, kind: int, values: list,
                 columns: Iterable[str], finder: route.RouteFinder | None = None) -> None:
    """Write one capture row of ``table``'s shape for ``peer`` only:
    ``values`` in the shape's columns (twice for an UPDATE: as the peer
    holds the row, then as it is here); ``finder``: the table follows its
    parent, and the row carries its routes."""
    names = table.pg_shape.layout.columns
    images = len(values) // len(names)
    params: list = []
    for index, value in enumerate(values):
        try:
            params.extend(table.params((names[index % len(names)],), (value,)))
        except ValueNotConvertible:
            params.append(None)
    try:
        with conn.transaction():
            txid, seq = conn.execute(table.capture_row_sql(images),
                                     (kind, FLAG_RETURN_TO_ORIGIN, *params)).fetchone()
    except (psycopg.DataError, psycopg.IntegrityError):  # a value of the origin's this site cannot hold
        texts: list[str | None] = []
        for index, column in enumerate(names):
            texts.extend(value_texts(conn, table, column, values[index::len(names)]))
        ordered = [texts[column * images + image] for image in range(images) for column in range(len(names))]
        txid, seq = conn.execute("INSERT INTO fieldsync.capture (shape, kind, flags, v) VALUES (%s, %s, %s, %s)"
                                 " RETURNING txid, seq",
                                 (table.pg_shape.id, kind, FLAG_RETURN_TO_ORIGIN, ordered)).fetchone()
    if finder is not None:  # its routes after the widest image, as the triggers write them (route.py)
        width = len(names)
        routes = [finder.text([values[image * width + names.index(column)] for column in finder.columns])
                  for image in range(images)]
        conn.execute("UPDATE fieldsync.capture SET v = v || pg_catalog.array_fill(NULL::pg_catalog.text,"
                     " ARRAY[%s]) || %s::pg_catalog.text[] WHERE txid = %s AND seq = %s",
                     (width * (2 - images), routes, txid, seq))
    conn.execute("INSERT INTO fieldsync.returned (seq, txid, peer, columns) VALUES (%s, %s, %s, %s)",
                 (seq, txid, peer, json.dumps(sorted(columns))))

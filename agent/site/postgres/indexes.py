"""The indexes a SQLite remote's copy of a PostgreSQL consolidated's tables
gets (docs/postgres.md, "Extraction").

Rules of this file:
* An index is carried as a SQLite consolidated's copy carries its own
  (agent/site/sqlite/extract.py), where SQLite makes it with the same
  meaning: a B-tree index on plain columns, each ascending or descending,
  every one published to the remote.  So the remote's applications read
  their share of a table as fast as the consolidated's read the whole.
* ``UNIQUE`` goes with it: a subset of unique rows is unique, and the
  copy's values (the log's, typemap.py) differ wherever the consolidated's
  do.  A unique index of a ``DEFERRABLE`` constraint does not (the
  consolidated lets duplicates stand until its commit, the remote would
  refuse them at the statement), nor one ``NULLS NOT DISTINCT``, which
  SQLite cannot say.
* Left out, whole: the key's index (the copy's ``PRIMARY KEY`` is its
  own), an index on an expression or with a ``WHERE``, another access
  method (hash, GIN, GiST, BRIN), and one not yet valid (``CREATE INDEX
  CONCURRENTLY`` still running).  ``INCLUDE`` columns are left out of the
  copy's index, which keeps the key columns.
* Named as at the consolidated; one of a table outside ``public`` as
  ``schema.name`` (the remote's indexes share one name space, as its
  tables' shown names do).  A name SQLite or fieldsync keeps for its own
  (``sqlite_``, ``fieldsync``) is left out.
* Read from ``pg_index`` in the extraction's snapshot, once for all the
  remote's tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import psycopg

from ..sqlite._db import quote_ident
from .capture import shown_table

# Every index but the key's on a table; the key columns (not INCLUDE's) in
# order, with the DESC bit of each (indoption & 1), and 0 where an
# expression stands.
_INDEXES = """
SELECT n.nspname, t.relname, i.relname, x.indisunique,
       ARRAY(SELECT x.indkey[k.n] FROM generate_series(0, x.indnkeyatts - 1) AS k(n) ORDER BY k.n),
       ARRAY(SELECT a.attname::text FROM generate_series(0, x.indnkeyatts - 1) AS k(n)
               JOIN pg_catalog.pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = x.indkey[k.n] ORDER BY k.n),
       ARRAY(SELECT (x.indoption[k.n] & 1) = 1 FROM generate_series(0, x.indnkeyatts - 1) AS k(n) ORDER BY k.n),
       am.amname = 'btree' AND x.indexprs IS NULL AND x.indpred IS NULL AND x.indisvalid AND x.indisready
         AND NOT COALESCE((to_jsonb(x) ->> 'indnullsnotdistinct')::boolean, false)
         AND NOT COALESCE(c.condeferrable, false)
  FROM pg_catalog.pg_index x
  JOIN pg_catalog.pg_class i ON i.oid = x.indexrelid
  JOIN pg_catalog.pg_am am ON am.oid = i.relam
  JOIN pg_catalog.pg_class t ON t.oid = x.indrelid
  JOIN pg_catalog.pg_namespace n ON n.oid = t.relnamespace
  LEFT JOIN pg_catalog.pg_constraint c ON c.conindid = x.indexrelid AND c.contype IN ('u', 'x')
 WHERE NOT x.indisprimary AND t.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema',
                                                                         'fieldsync')
   AND (%(table)s::oid IS NULL OR x.indrelid = %(table)s::oid)
   AND (%(index)s::oid IS NULL OR x.indexrelid = %(index)s::oid)
 ORDER BY n.nspname, t.relname, i.relname
"""

_KEPT_NAMES = ("sqlite_", "fieldsync")


@dataclass(frozen=True, slots=True)
class PgIndex:
    """One index of a consolidated's table SQLite can make alike, by shown
    names (see the rules above)."""

    name: str  # as the remote names it
    table: str
    columns: tuple[str, ...]
    descending: tuple[bool, ...]
    unique: bool

    def sql(self) -> str:
        """The CREATE INDEX of it at a SQLite remote."""
        columns = ", ".join(quote_ident(column) + (" DESC" if descending else "")
                            for column, descending in zip(self.columns, self.descending))
        return (f"CREATE {'UNIQUE ' if self.unique else ''}INDEX {quote_ident(self.name)} "
                f"ON {quote_ident(self.table)} ({columns})")


def indexes(conn: psycopg.Connection, *, table: int | None = None, index: int | None = None
            ) -> dict[str, list[PgIndex]]:
    """Every index of the database a remote's copy can have (of the table
    whose oid is ``table``, or the index whose oid is ``index``, when
    given), by the shown name of its table."""
    found: dict[str, list[PgIndex]] = {}
    for schema, table_name, name, unique, numbers, columns, descending, alike in conn.execute(
            _INDEXES, {"table": table, "index": index}):
        shown_name = remote_name(schema, name)
        if not alike or 0 in numbers or len(columns) != len(numbers) or shown_name is None:
            continue
        shown = shown_table(schema, table_name)
        found.setdefault(shown, []).append(PgIndex(shown_name, shown, tuple(columns), tuple(descending), unique))
    return found


def remote_name(schema: str, name: str) -> str | None:
    """What a remote names the index ``name`` of a table in ``schema``
    (None: a name SQLite or fieldsync keeps for its own, never carried)."""
    shown = shown_table(schema, name)
    return None if shown.lower().startswith(_KEPT_NAMES) else shown


def kept_indexes(found: Sequence[PgIndex], columns: Sequence[str]) -> list[PgIndex]:
    """Those of ``found`` (one table's) a remote's copy of the table,
    published with ``columns``, gets."""
    published = set(columns)
    return [index for index in found if set(index.columns) <= published]

"""The foreign keys a SQLite remote's copy of a PostgreSQL consolidated's
tables keeps (docs/postgres.md, "Extraction").

Rules of this file:
* A key is kept as a SQLite remote's copy made from a SQLite consolidated
  keeps one (agent/site/sqlite/extract.py): its columns are published to
  the remote, its parent table is copied to the remote, and the columns it
  references are the parent's key there (the copy's only unique columns).
  Its ``ON DELETE`` and ``ON UPDATE`` actions go with it, so that a
  remote's application changes its rows as the consolidated's does (a line
  goes with its order ``ON DELETE CASCADE`` at both); ``DEFERRABLE`` does
  not, as a remote checks each key at the statement that writes it.
* A key whose action is ``SET DEFAULT`` is not kept: the copy carries no
  default, so the remote would set NULL where the consolidated sets its
  default.
* Read from ``pg_constraint`` in the extraction's snapshot, once for all
  the remote's tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import psycopg

from .capture import shown_table

# pg_constraint's action letters, as SQLite writes them (d, SET DEFAULT: not kept).
ACTIONS = {"a": "NO ACTION", "r": "RESTRICT", "c": "CASCADE", "n": "SET NULL"}

_KEYS = """
SELECT cn.nspname, cl.relname, pn.nspname, pl.relname, con.confupdtype, con.confdeltype,
       ARRAY(SELECT a.attname::text FROM unnest(con.conkey) WITH ORDINALITY AS k(attnum, n)
               JOIN pg_catalog.pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = k.attnum ORDER BY k.n),
       ARRAY(SELECT a.attname::text FROM unnest(con.confkey) WITH ORDINALITY AS k(attnum, n)
               JOIN pg_catalog.pg_attribute a ON a.attrelid = con.confrelid AND a.attnum = k.attnum ORDER BY k.n)
  FROM pg_catalog.pg_constraint con
  JOIN pg_catalog.pg_class cl ON cl.oid = con.conrelid
  JOIN pg_catalog.pg_namespace cn ON cn.oid = cl.relnamespace
  JOIN pg_catalog.pg_class pl ON pl.oid = con.confrelid
  JOIN pg_catalog.pg_namespace pn ON pn.oid = pl.relnamespace
 WHERE con.contype = 'f'
 ORDER BY cn.nspname, cl.relname, con.conname
"""


@dataclass(frozen=True, slots=True)
class PgForeignKey:
    """One foreign key of a consolidated's table, by shown names."""

    table: str
    columns: tuple[str, ...]
    parent: str
    parent_columns: tuple[str, ...]
    on_update: str  # a pg_constraint action letter
    on_delete: str


def foreign_keys(conn: psycopg.Connection) -> dict[str, list[PgForeignKey]]:
    """Every foreign key of the database, by the shown name of its table."""
    found: dict[str, list[PgForeignKey]] = {}
    for schema, table, parent_schema, parent, on_update, on_delete, columns, parent_columns in conn.execute(_KEYS):
        shown = shown_table(schema, table)
        found.setdefault(shown, []).append(PgForeignKey(shown, tuple(columns), shown_table(parent_schema, parent),
                                                        tuple(parent_columns), on_update, on_delete))
    return found


def kept_keys(keys: Sequence[PgForeignKey], columns: Sequence[str],
              parents: Mapping[str, Sequence[str]]) -> list[PgForeignKey]:
    """Those of ``keys`` a remote's copy of their table, published with
    ``columns``, keeps (see the rules above); ``parents``: the key columns
    of each table the remote gets, by shown name."""
    return [key for key in keys
            if key.parent in parents and set(key.columns) <= set(columns)
            and sorted(key.parent_columns) == sorted(parents[key.parent])
            and key.on_update in ACTIONS and key.on_delete in ACTIONS]

"""The ``fieldsync`` schema: capture, log and shape tables of a PostgreSQL site.

Rules of this file:
* Everything fieldsync keeps in the database lives in the schema
  ``fieldsync``, owned by the agent's role; applications need no grant on
  it (the capture triggers write as that role: capture.py).
* The capture table holds one row per row change, in the logical form of a
  SQLite site's capture rows (``seq, shape, kind, flags`` and the values,
  here one ``text[]`` ``v``: the old or inserted row, then an UPDATE's new
  row, each as typemap.py's capture text), plus the writing transaction
  (``txid``, ``pg_current_xact_id()``) and ``origin`` (the session setting
  ``fieldsync.origin``: NULL for the site's own applications, a peer's name
  for the agent's applies).  ``txid``, ``seq`` and ``origin`` are column
  defaults, so a trigger names none of them.
* ``seq`` comes from a sequence with CACHE 1: values are handed out in the
  order of the calls, across sessions (log.py's argument needs it).
* The log (``log``, ``log_txn``, ``cut``) is written by log.py only;
  see docs/postgres.md for why its order is commit order.
* Functions here open their own transaction.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from .connect import translate
from .uri import PgTarget

SCHEMA = "fieldsync"
SCHEMA_VERSION = 1

_TABLES = """
CREATE SCHEMA fieldsync;

CREATE TABLE fieldsync.site (
    id integer PRIMARY KEY CHECK (id = 1),
    schema_version integer NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- CACHE 1 (the default, written out): nextval() hands values out in the
-- order it is called, whichever session calls it.
CREATE SEQUENCE fieldsync.capture_seq CACHE 1 NO CYCLE;

CREATE TABLE fieldsync.capture (
    txid xid8 NOT NULL DEFAULT pg_catalog.pg_current_xact_id(),
    seq bigint NOT NULL DEFAULT pg_catalog.nextval('fieldsync.capture_seq'),
    origin text DEFAULT NULLIF(pg_catalog.current_setting('fieldsync.origin', true), ''),
    shape integer NOT NULL,
    kind smallint NOT NULL CHECK (kind IN (1, 2, 3)),
    flags smallint NOT NULL DEFAULT 0,
    v text[] NOT NULL,
    PRIMARY KEY (txid, seq)
);

CREATE TABLE fieldsync.shape (
    id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    table_schema text NOT NULL,
    table_name text NOT NULL,
    columns jsonb NOT NULL,
    key_columns jsonb NOT NULL,
    kinds jsonb NOT NULL,
    declared jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- One row per log transaction: its commit offset and origin.
CREATE TABLE fieldsync.log (
    commit_offset bigint PRIMARY KEY CHECK (commit_offset > 0),
    origin text NOT NULL
);

-- The writing transactions of each log transaction, in replay order: the
-- capture rows of (txid, origin) belong to commit_offset.
CREATE TABLE fieldsync.log_txn (
    commit_offset bigint NOT NULL,
    position integer NOT NULL,
    txid xid8 NOT NULL,
    origin text,
    PRIMARY KEY (commit_offset, position)
);

-- The last cut: its snapshot (the next cut takes the transactions that
-- finished after it), the log end and the truncation point.
CREATE TABLE fieldsync.cut (
    id integer PRIMARY KEY CHECK (id = 1),
    snapshot pg_snapshot NOT NULL,
    log_end bigint NOT NULL,
    truncated_through bigint NOT NULL,
    cut_at timestamptz NOT NULL
);

-- Refuses TRUNCATE of a published table: it fires no row trigger, so the
-- remotes would keep rows the consolidated no longer has.
CREATE FUNCTION fieldsync.refuse_truncate() RETURNS trigger LANGUAGE plpgsql AS $body$
BEGIN
    RAISE EXCEPTION 'fieldsync: TRUNCATE of published table %.% is refused', TG_TABLE_SCHEMA, TG_TABLE_NAME
        USING ERRCODE = 'feature_not_supported',
              HINT = 'TRUNCATE fires no row trigger, so the remotes would keep the rows; DELETE them instead, '
                     'or remove the table from its publication first';
END
$body$;
"""


def schema_installed(conn: psycopg.Connection) -> bool:
    found = conn.execute("SELECT to_regclass('fieldsync.site') IS NOT NULL").fetchone()
    return bool(found and found[0])


def install_schema(conn: psycopg.Connection, target: PgTarget) -> None:
    """Create the ``fieldsync`` schema in one transaction; a database that
    has it already is left as it is."""
    try:
        with conn.transaction():
            if schema_installed(conn):
                return
            conn.execute(_TABLES)
            conn.execute("INSERT INTO fieldsync.site (id, schema_version) VALUES (1, %s)", (SCHEMA_VERSION,))
            # The first cut's snapshot: no transaction visible in it can have
            # written a capture row, since the capture table did not exist.
            conn.execute("INSERT INTO fieldsync.cut (id, snapshot, log_end, truncated_through, cut_at)"
                         " VALUES (1, pg_current_snapshot(), 0, 0, now())")
    except psycopg.Error as error:
        raise translate(error, target, "creating the fieldsync schema") from None


def drop_schema(conn: psycopg.Connection, target: PgTarget) -> None:
    """Remove the schema and everything in it, the capture triggers of the
    published tables included (they depend on its functions)."""
    try:
        with conn.transaction():
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))
    except psycopg.Error as error:
        raise translate(error, target, "dropping the fieldsync schema") from None

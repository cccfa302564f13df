"""A seed's consolidated in a PostgreSQL database (``agent chaos
--consolidated URI``): emptied and made again for every seed, written to
as an application would, and read as its rows travel.

Rules of this file:
* The database is the suite's own: every seed drops the ``fieldsync``
  schema and the workload's tables (``SCHEMA``, the arrival journal) and
  makes them again, so nothing of an earlier seed is left (offsets,
  incarnations, capture rows, keys).  A database holding any other table,
  view or sequence outside PostgreSQL's own schemas is refused before
  anything is dropped: the suite never empties a database it did not fill.
* The workload's tables are those of the SQLite world in PostgreSQL's
  types (``bigint``, ``text``, ``double precision``, ``bytea``), the
  follow chain's with the same keys and actions (chain.py); each
  travels as the types table says (agent/site/postgres/typemap.py), and a
  remote's copy declares what that table declares.
* Reads are what the checks compare with the remotes' SQLite rows: each
  column turned into its capture text and loaded with the types table,
  i.e. the value as it travels and a remote stores it.
* Writes use the SQLite world's statements (``?`` placeholders), on a
  connection of their own, as an application (no origin: the site's own
  changes); one may stay open while the agent runs (OpenTransaction).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from psycopg import sql

from ..admin import init_site
from ..site.postgres.capture import describe_table
from ..site.postgres.connect import connect
from ..site.postgres.typemap import KINDS, loader
from ..site.postgres.uri import parse_uri, redact
from . import chain as follow_chain
from .world import PRODUCTS, ChaosWorldError, publish_and_extract, site_names

TABLES = ("customer", "product", "ledger")
PG_SCHEMA = [
    "CREATE TABLE customer (id bigint PRIMARY KEY, region text NOT NULL, name text, balance double precision,"
    " scan bytea)",
    "CREATE TABLE product (sku text PRIMARY KEY, title text, price double precision)",
    "CREATE TABLE ledger (entry text PRIMARY KEY, site text NOT NULL, amount bigint NOT NULL)",
]
# The arrival journal (I2), never published: an AFTER INSERT trigger named
# after the capture triggers (``0fieldsync_...``), so those fire first.
PG_ARRIVALS = [
    "CREATE TABLE chaos_arrival (n bigserial PRIMARY KEY, entry text NOT NULL)",
    "CREATE FUNCTION chaos_arrival_journal() RETURNS trigger LANGUAGE plpgsql AS"
    " $$BEGIN INSERT INTO chaos_arrival (entry) VALUES (NEW.entry); RETURN NULL; END$$",
    "CREATE TRIGGER chaos_arrival_journal AFTER INSERT ON ledger FOR EACH ROW EXECUTE FUNCTION chaos_arrival_journal()",
]
# The tables a seed's schema changes make (schema_changes.py): note1, note2, ...
NOTES = "note"
# What the suite makes in the database (relations outside PostgreSQL's schemas).
_MADE = (*TABLES, *follow_chain.TABLES, "chaos_arrival")  # the tables a seed makes
_OURS = {*(("public", table) for table in (*_MADE, "chaos_arrival_n_seq"))}
_FOREIGN = """
SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE c.relkind IN ('r', 'v', 'm', 'S', 'f', 'p')
   AND n.nspname NOT IN ('pg_catalog', 'information_schema', 'fieldsync') AND n.nspname NOT LIKE 'pg\\_%'
 ORDER BY 1, 2
"""


def empty_database(uri: str) -> None:
    """Drop what an earlier seed made in ``uri``'s database, after checking
    it holds nothing else (ChaosWorldError names what it holds)."""
    target = parse_uri(uri)
    conn = connect(target)
    try:
        with conn.transaction():
            found = conn.execute(_FOREIGN).fetchall()
            notes = [name for schema, name in found if schema == "public" and name.startswith(NOTES)]
            foreign = [f"{schema}.{name}" for schema, name in found
                       if (schema, name) not in _OURS and name not in notes]
            if foreign:
                shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
                raise ChaosWorldError(
                    f"agent chaos empties the database {redact(uri)} for every seed, but it holds {shown}, which "
                    "the suite did not make: give --consolidated a database of its own (CREATE DATABASE chaos)")
            conn.execute("DROP SCHEMA IF EXISTS fieldsync CASCADE")
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(
                sql.SQL(", ").join(map(sql.Identifier, (*_MADE, *notes)))))
            conn.execute("DROP FUNCTION IF EXISTS chaos_arrival_journal()")
    finally:
        conn.close()


def make_pg_sites(uri: str, root: Path, remotes: int, *, chain: bool = False) -> None:
    """The seed's consolidated ``hq`` in ``uri``'s database (its agent's
    folder ``root/hq.agent``; ``chain``: with the follow chain, its rows
    made) and its remotes extracted from it as SQLite files in ``root``."""
    empty_database(uri)
    conn = connect(uri)
    try:
        with conn.transaction():
            for statement in (*PG_SCHEMA, *PG_ARRIVALS, *(follow_chain.PG_SCHEMA if chain else ())):
                conn.execute(statement)
            conn.cursor().executemany("INSERT INTO product VALUES (%s, %s, 1.0)", [(sku, sku) for sku in PRODUCTS])
            for statement, values in follow_chain.populate(site_names(remotes)) if chain else ():
                conn.execute(statement.replace("?", "%s"), values)
    finally:
        conn.close()
    with init_site(uri, name="hq", role="consolidated", address="inbox/hq", transport="folder",
                   home=root / "hq.agent") as hq:
        publish_and_extract(hq, root, remotes, chain=chain)


def pg_rows(uri: str, table: str, columns: Iterable[str] | None = None, where: str | None = None,
            values: tuple = ()) -> list[tuple]:
    """``table``'s rows (``columns``, default all; ``where`` a condition with
    ``?`` placeholders) as they travel, in a stable order."""
    conn = connect(uri)
    try:
        with conn.transaction():
            layout = describe_table(conn, table).layout
            chosen = tuple(columns) if columns is not None else layout.columns
            kinds = tuple(KINDS[layout.kinds[layout.columns.index(column)]] for column in chosen)
            expressions = sql.SQL(", ").join(
                sql.SQL(kind.capture).format(sql.Identifier(column))
                for kind, column in zip(kinds, chosen))
            query = sql.SQL("SELECT {} FROM {}").format(expressions, sql.Identifier(table))
            if where:
                query = sql.SQL("{} WHERE {}").format(query, sql.SQL(where.replace("?", "%s")))
            load = loader(kinds)
            return sorted((load(list(row)) for row in conn.execute(query, values)), key=repr)
    finally:
        conn.close()


def pg_write(uri: str, statements: Iterable[tuple[str, tuple]]) -> None:
    """Run ``statements`` (``?`` placeholders) in one transaction, as an application."""
    conn = connect(uri)
    try:
        with conn.transaction():
            for statement, values in statements:
                conn.execute(statement.replace("?", "%s"), values)
    finally:
        conn.close()


class OpenTransaction:
    """An application's transaction begun (its statements run, ``?``
    placeholders) and not yet committed: :meth:`commit` ends it."""

    def __init__(self, uri: str, statements: Iterable[tuple[str, tuple]]) -> None:
        self._conn = connect(uri, autocommit=False)
        try:
            for statement, values in statements:
                self._conn.execute(statement.replace("?", "%s"), values)
        except BaseException:
            self._conn.close()
            raise

    def commit(self) -> None:
        try:
            self._conn.commit()
        finally:
            self._conn.close()


def pg_arrivals(uri: str) -> list[str]:
    """The arrival journal, in the order the entries arrived."""
    conn = connect(uri)
    try:
        return [entry for (entry,) in conn.execute("SELECT entry FROM chaos_arrival ORDER BY n")]
    finally:
        conn.close()


def pg_columns(uri: str, table: str) -> tuple[str, ...]:
    """``table``'s columns in the database at ``uri``, in order (none: no such table)."""
    conn = connect(uri)
    try:
        return tuple(name for (name,) in conn.execute(
            "SELECT a.attname FROM pg_catalog.pg_attribute a WHERE a.attrelid = pg_catalog.to_regclass(%s)"
            " AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum", (table,)))
    finally:
        conn.close()


def pg_tables(uri: str, prefix: str) -> list[str]:
    """The tables of ``uri``'s database (schema ``public``) whose name starts with ``prefix``."""
    conn = connect(uri)
    try:
        return [name for (name,) in conn.execute(
            "SELECT c.relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'public' AND c.relkind = 'r' AND starts_with(c.relname, %s) ORDER BY 1", (prefix,))]
    finally:
        conn.close()

"""Passthrough SQL from a PostgreSQL consolidated (docs/site-database.md,
"Passthrough"; docs/postgres.md, "Schema changes"): data statements sent
to named remotes only, to run at their SQLite copies as their own writes,
in order with the data.

Rules of this file:
* Nothing runs at the consolidated: the statements are SQLite's, for the
  remotes' copies.  Each is checked as a SQLite consolidated checks one
  (agent.site.sqlite.changes.data_only: it reads and writes the
  application's rows, nothing else), prepared (``EXPLAIN``: nothing runs)
  against an in-memory SQLite database that holds every published table as
  extraction makes it at a remote, with all its published columns.  A
  statement that names a table or column no remote could have is refused
  here; one a named remote lacks (it does not receive that table) fails
  in its apply, as from a SQLite consolidated.
* One change of passthrough steps, alone in its log transaction (the cut
  gives a writing transaction with a kind-4 row one of its own, log.cut_in),
  written as every change is (changes.write_change).  It is no schema
  change: the schema version does not move (schema.CHANGE_ROWS).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterable

import psycopg

from ..sqlite.changes import passthrough_steps
from .capture import load_shapes
from .changes import write_change
from .extract import remote_table_sql


def passthrough_in(conn: psycopg.Connection, site: str, scripts: Iterable[str], remotes: Iterable[str], *,
                   made_at: object) -> str:
    """Write the passthrough change of ``scripts`` for ``remotes`` inside the
    caller's transaction; return its writing transaction's id, which the
    cut gives its offset by.  SchemaRefused (nothing written) for a
    statement that is no data statement, or a name that is no remote."""
    with contextlib.closing(sqlite3.connect(":memory:")) as check:
        _published_tables(conn, check)
        steps, statements = passthrough_steps(
            check, scripts, remotes, site,
            lambda remote: conn.execute("SELECT 1 FROM fieldsync.remote WHERE name = %s", (remote,)).fetchone()
            is not None, " (the statements run at the remotes' SQLite copies, which hold the published tables and"
                         " columns)")
    return write_change(conn, site, steps, {}, steps, statements, made_at)


def _published_tables(conn: psycopg.Connection, check: sqlite3.Connection) -> None:
    """Make in ``check`` every published table as a remote's copy has it."""
    shapes = load_shapes(conn)
    made: set[str] = set()
    for (shape_id,) in conn.execute("SELECT DISTINCT shape FROM fieldsync.article ORDER BY shape"):
        layout = shapes[shape_id].layout
        if layout.shown.lower() not in made:
            check.execute(remote_table_sql(shapes[shape_id], layout.columns))
            made.add(layout.shown.lower())

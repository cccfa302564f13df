"""The common read position of a PostgreSQL site's remote-user rows
(``fieldsync.site.common_read``, ``fieldsync.remote.follows_common``): the
rules of agent/site/sqlite/read_positions.py in PostgreSQL's words
(GREATEST for SQLite's scalar max), tests/site/both holding both to them.

Rules of this file, beside those:
* :func:`move_reads` locks the site row (``FOR UPDATE``) before it reads
  the common position, so two send phases never move it at once; a
  concurrent change of a row that leaves it reads the committed position,
  so a row leaves at most where a move put it, never beyond.
* Functions here run inside the caller's transaction.
"""

from __future__ import annotations

from typing import Collection

import psycopg
from psycopg import sql

from ..errors import InvariantViolation
from ..remote_rules import POSITION_COLUMNS, READ_COLUMNS

COMMON_SQL = "(SELECT common_read FROM fieldsync.site WHERE id = 1)"


def effective(column: str, table: str = "") -> str:
    """``log_send`` or ``log_read`` of a remote-user row as the agent reads
    it; ``table``: the alias the statement gives fieldsync.remote."""
    prefix = f"{table}." if table else ""
    return f"(CASE WHEN {prefix}follows_common THEN GREATEST({prefix}{column}, {COMMON_SQL}) ELSE {prefix}{column} END)"


def selected(column: str) -> sql.Composable:
    """``column`` of fieldsync.remote as a SELECT list names it."""
    if column in READ_COLUMNS:
        return sql.SQL(effective(column) + " AS ") + sql.Identifier(column)
    return sql.Identifier(column)


def leaving(columns: Collection[str], table: str = "") -> sql.Composable:
    """What a statement writing ``columns`` of rows assigns besides (with a
    leading comma), so that a follower it writes a position of leaves the
    common position with its values of the moment; nothing when it writes
    none.  ``table``: the alias of the row written."""
    if not POSITION_COLUMNS & set(columns):
        return sql.SQL("")
    kept = [f"{column} = {effective(column, table)}" for column in READ_COLUMNS if column not in columns]
    return sql.SQL(", " + ", ".join([*kept, "follows_common = false"]))


def move_reads(conn: psycopg.Connection, end: int, log_end: int, leave: Collection[str],
               join: Collection[str]) -> None:
    """agent/site/sqlite/read_positions.py's ``move_reads_locked``."""
    common = conn.execute("SELECT common_read FROM fieldsync.site WHERE id = 1 FOR UPDATE").fetchone()[0]
    if type(end) is not int or not common <= end <= log_end:
        raise InvariantViolation(f"the common read position cannot move from {common} to {end!r} (log end "
                                 f"{log_end})")
    if leave:
        conn.execute(f"UPDATE fieldsync.remote SET log_send = {effective('log_send')}, log_read ="
                     f" {effective('log_read')}, follows_common = false WHERE follows_common AND name = ANY(%s)",
                     (list(leave),))
    if join:
        conn.execute("UPDATE fieldsync.remote SET log_send = %s, log_read = %s, follows_common = true"
                     " WHERE name = ANY(%s) AND log_sent <= %s", (end, end, list(join), end))
    if end > common:
        conn.execute("UPDATE fieldsync.site SET common_read = %s WHERE id = 1", (end,))

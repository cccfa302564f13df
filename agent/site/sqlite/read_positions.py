"""The common read position of a SQLite site's remote-user rows: where a
send phase moves the read positions of the pairs its new range holds
nothing for with one write of the site row, not one of every such row
(docs/protocol.md, "The common read position").

Rules of this file:
* A row with ``follows_common`` set reads ``log_send`` and ``log_read`` as
  at least ``fieldsync_site.common_read`` (:data:`EFFECTIVE`): every read of
  those columns goes through these expressions, so the rest of the agent
  sees the values a move of each row would have written.
* A row leaves the common position (``follows_common`` cleared, its
  values of the moment written to its own columns) in the statement that
  writes any of ``log_send``, ``log_read`` or ``log_sent`` to it
  (:func:`leaving`): its protocol's own moves, a resend setting its
  positions back, an extraction's new start.  So a follower's ``log_sent``
  is never past the common position, and a row set back is never read
  forward.
* :func:`move_reads_locked` is the send phase's one write, in one
  transaction: the followers the range concerns (or that the run built)
  leave first, the other pairs the range holds nothing for join at the
  log end, and the common position moves there.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Collection

from ..errors import InvariantViolation
from ..remote_rules import POSITION_COLUMNS, READ_COLUMNS

COMMON_SQL = "(SELECT common_read FROM fieldsync_site WHERE id = 1)"
#: ``log_send`` and ``log_read`` of a remote-user row as the agent reads them.
EFFECTIVE = {column: f"(CASE WHEN follows_common THEN max({column}, {COMMON_SQL}) ELSE {column} END)"
             for column in READ_COLUMNS}


def selected(column: str) -> str:
    """``column`` of fieldsync_remote as a SELECT list names it."""
    expression = EFFECTIVE.get(column)
    return column if expression is None else f"{expression} AS {column}"


def leaving(columns: Collection[str]) -> str:
    """What a statement writing ``columns`` of rows assigns besides (with a
    leading comma), so that a follower it writes a position of leaves the
    common position with its values of the moment; '' when it writes
    none."""
    if not POSITION_COLUMNS & set(columns):
        return ""
    kept = [f"{column} = {expression}" for column, expression in EFFECTIVE.items() if column not in columns]
    return ", " + ", ".join([*kept, "follows_common = 0"])


def common_read(conn: sqlite3.Connection) -> int:
    return conn.execute("SELECT common_read FROM fieldsync_site WHERE id = 1").fetchone()[0]


def move_reads_locked(conn: sqlite3.Connection, end: int, log_end: int, leave: Collection[str],
                      join: Collection[str]) -> None:
    """A send phase's moves to ``end`` (the caller holds the write lock;
    ``log_end``: the log's end, read in its transaction): the followers in
    ``leave`` leave the common position at its value of now, the rows of
    ``join`` move to ``end`` and follow it, and the common position moves
    to ``end``.  Raises InvariantViolation when ``end`` is behind it or
    beyond the log end."""
    common = common_read(conn)
    if type(end) is not int or not common <= end <= log_end:
        raise InvariantViolation(f"the common read position cannot move from {common} to {end!r} (log end "
                                 f"{log_end})")
    if leave:
        conn.execute(f"UPDATE fieldsync_remote SET log_send = {EFFECTIVE['log_send']}, log_read ="
                     f" {EFFECTIVE['log_read']}, follows_common = 0 WHERE follows_common AND name IN"
                     " (SELECT value FROM json_each(?))", (json.dumps(list(leave)),))
    if join:
        conn.execute("UPDATE fieldsync_remote SET log_send = ?, log_read = ?, follows_common = 1 WHERE name IN"
                     " (SELECT value FROM json_each(?)) AND log_sent <= ?", (end, end, json.dumps(list(join)), end))
    if end > common:
        conn.execute("UPDATE fieldsync_site SET common_read = ? WHERE id = 1", (end,))

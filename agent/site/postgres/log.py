"""The log of a PostgreSQL site: cutting finished transactions into log
transactions in commit order, reading them back, truncating them.

Rules of this file:
* Many sessions write at once, so the order capture rows are written in
  (``seq``) is not the order their transactions commit in.  A cut (PgQ's
  ticker) takes a snapshot ``S`` and gives commit offsets to exactly the
  transactions that are visible in ``S`` and were not in the previous
  cut's snapshot: each has finished, and every transaction still running
  at ``S`` gets a larger offset at a later cut.  A transaction is in
  exactly one cut; offsets at or below the log end never change.
  docs/postgres.md, "Commit order", has the whole argument.
* Within one cut, transactions are ordered by their last ``seq``: if one
  wrote a row after another had written it, it waited for that one's
  commit, so its last ``seq`` is larger.  Consecutive transactions of one
  origin make one log transaction; a log transaction never mixes origins.
* The cut runs in one REPEATABLE READ transaction whose first statement
  takes its snapshot, after ``LOCK ... fieldsync.cut``: cuts are one at a
  time, and the snapshot they record is the one they read with.
* Nothing is kept per cut but the last snapshot; the capture rows, their
  log transactions and their writing transactions go at truncation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Mapping

import psycopg

from ..errors import LogOffsetError, LogTruncated
from .capture import PgShape, load_shapes
from .connect import translate
from .uri import PgTarget

READ_CHUNK = 1000

# The transactions that finished between the previous cut's snapshot and
# this one's: those running then (its xip list) and those that started
# after it (txid >= its xmax), that are visible now.  Two index scans.
_FINISHED = """
SELECT txid::text, origin, max(seq) AS last FROM (
    SELECT txid, origin, seq FROM fieldsync.capture
     WHERE txid = ANY (ARRAY(SELECT pg_snapshot_xip(%(previous)s::pg_snapshot)))
    UNION ALL
    SELECT txid, origin, seq FROM fieldsync.capture
     WHERE txid >= pg_snapshot_xmax(%(previous)s::pg_snapshot) AND txid < pg_snapshot_xmax(%(now)s::pg_snapshot)
) AS batch
WHERE pg_visible_in_snapshot(txid, %(now)s::pg_snapshot)
GROUP BY txid, origin
ORDER BY last
"""

_READ = """
SELECT t.commit_offset, l.origin, c.seq, c.shape, c.kind, c.flags, c.v
  FROM fieldsync.log_txn t
  JOIN fieldsync.log l ON l.commit_offset = t.commit_offset
  JOIN fieldsync.capture c ON c.txid = t.txid AND c.origin IS NOT DISTINCT FROM t.origin
 WHERE t.commit_offset > %s AND t.commit_offset <= %s
 ORDER BY t.commit_offset, t.position, c.seq
"""


@dataclass(frozen=True, slots=True)
class Cut:
    """What one cut did: the log end after it, how many writing
    transactions it took and how many log transactions they made."""

    log_end: int
    transactions: int
    log_transactions: int


def cut(conn: psycopg.Connection, target: PgTarget, origin: str) -> Cut:
    """Give commit offsets to every transaction that finished since the
    last cut; ``origin`` names the site's own (the applications') writes."""
    try:
        with conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            # Before the first query, so the snapshot is taken once the lock is held.
            conn.execute("LOCK TABLE fieldsync.cut IN EXCLUSIVE MODE")
            found = conn.execute("SELECT pg_current_snapshot()::text, snapshot::text, log_end"
                                 " FROM fieldsync.cut WHERE id = 1").fetchone()
            assert found is not None, "fieldsync.cut has its row from install_schema on"
            now, previous, end = found
            finished = conn.execute(_FINISHED, {"previous": previous, "now": now}).fetchall()
            log_rows: list[tuple[int, str]] = []
            member_rows: list[tuple[int, int, str, str | None]] = []
            last_origin: object = object()  # no writer's origin: the first transaction starts a log transaction
            position = 0
            for txid, writer_origin, _last in finished:
                if writer_origin != last_origin:
                    end += 1
                    log_rows.append((end, writer_origin or origin))
                    last_origin, position = writer_origin, 0
                member_rows.append((end, position, txid, writer_origin))
                position += 1
            with conn.cursor() as cursor:
                if log_rows:
                    with cursor.copy("COPY fieldsync.log (commit_offset, origin) FROM STDIN") as copy:
                        for row in log_rows:
                            copy.write_row(row)
                    with cursor.copy("COPY fieldsync.log_txn (commit_offset, position, txid, origin)"
                                     " FROM STDIN") as copy:
                        for member in member_rows:
                            copy.write_row(member)
                cursor.execute("UPDATE fieldsync.cut SET snapshot = %s::pg_snapshot, log_end = %s, cut_at = now()"
                               " WHERE id = 1", (now, end))
            return Cut(end, len(member_rows), len(log_rows))
    except psycopg.Error as error:
        raise translate(error, target, "cutting the log") from None


def log_end(conn: psycopg.Connection) -> int:
    """The commit offset of the last log transaction (0 for an empty log);
    it never goes back, truncation included."""
    found = conn.execute("SELECT log_end FROM fieldsync.cut WHERE id = 1").fetchone()
    return found[0] if found else 0


def truncated_through(conn: psycopg.Connection) -> int:
    found = conn.execute("SELECT truncated_through FROM fieldsync.cut WHERE id = 1").fetchone()
    return found[0] if found else 0


def check_boundary(conn: psycopg.Connection, offset: int, what: str) -> None:
    """Raise unless ``offset`` is 0, the truncation point or a commit offset."""
    if type(offset) is not int or offset < 0:
        raise LogOffsetError(f"{what} must be a non-negative integer log offset, got {offset!r}")
    floor, logged = conn.execute("SELECT truncated_through, EXISTS (SELECT 1 FROM fieldsync.log"
                                 " WHERE commit_offset = %s) FROM fieldsync.cut WHERE id = 1", (offset,)).fetchone()
    if offset < floor:
        raise LogTruncated(f"{what} {offset} lies before the log's truncation point {floor}: those entries "
                           "were confirmed by every peer and deleted; the peer needs a new extraction")
    if offset != floor and not logged:
        raise LogOffsetError(f"{what} {offset} is not a commit offset of this log")


def iter_capture(conn: psycopg.Connection, after: int, until: int, *, shapes: Mapping[int, PgShape] | None = None,
                 chunk: int = READ_CHUNK) -> Iterator[tuple[int, str, list[tuple]]]:
    """Yield ``(commit_offset, origin, rows)`` for the log transactions in
    ``(after, until]`` in log order, at most ``chunk`` rows at a time (a
    large log transaction comes in consecutive pieces).  A row is a SQLite
    site's capture row: ``(seq, shape, kind, flags, v0, v1, ...)`` with the
    values as they travel (typemap.py), so agent.site.view reads it as it
    is.  The rows are read through a server-side cursor in one read
    transaction; offsets up to ``until`` never change, so nothing is missed."""
    known: dict[int, PgShape] = dict(shapes) if shapes is not None else load_shapes(conn)
    with conn.transaction(), conn.cursor(name="fieldsync_read_log") as cursor:
        cursor.itersize = chunk
        cursor.execute(_READ, (after, until))
        commit, origin, rows = 0, "", []
        for offset, log_origin, seq, shape_id, kind, flags, texts in cursor:
            if offset != commit or len(rows) >= chunk:
                if rows:
                    yield commit, origin, rows
                commit, origin, rows = offset, log_origin, []
            shape = known.get(shape_id)
            if shape is None:
                known.update(load_shapes(conn))
                shape = known[shape_id]
            rows.append((seq, shape_id, kind, flags, *shape.load(texts)))
        if rows:
            yield commit, origin, rows


def truncate_log(conn: psycopg.Connection, target: PgTarget, through: int) -> int:
    """Delete the log transactions at or below ``through`` with their
    capture rows; return the truncation point.  Capture rows of
    transactions no cut has taken yet stay."""
    try:
        with conn.transaction():
            end = log_end(conn)
            if through > end:
                raise LogOffsetError(f"cannot truncate through {through}: the log ends at {end}")
            conn.execute("DELETE FROM fieldsync.capture c USING fieldsync.log_txn t WHERE t.commit_offset <= %s"
                         " AND c.txid = t.txid AND c.origin IS NOT DISTINCT FROM t.origin", (through,))
            conn.execute("DELETE FROM fieldsync.log_txn WHERE commit_offset <= %s", (through,))
            conn.execute("DELETE FROM fieldsync.log WHERE commit_offset <= %s", (through,))
            found = conn.execute("UPDATE fieldsync.cut SET truncated_through = greatest(truncated_through, %s)"
                                 " WHERE id = 1 RETURNING truncated_through", (through,)).fetchone()
            assert found is not None
            return found[0]
    except psycopg.Error as error:
        raise translate(error, target, "truncating the log") from None

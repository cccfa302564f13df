"""The site's transaction log: turning captured rows into log transactions,
reading them back in commit order, and truncating what every peer confirmed.

Rules of this file:
* A log transaction is a run of capture rows ``[first_seq, commit_offset]``;
  its commit offset is the seq of its last capture row, so offsets are
  strictly increasing integers > 0 and tell the log's order directly.
* Log transactions are only ever cut while the write lock is held
  (``BEGIN IMMEDIATE``): then no application transaction is half-way
  through, so everything captured so far is committed and complete, and a
  cut never splits an application transaction.
* Entries at or below ``truncated_through`` are gone; reading from before
  it is an error, never a silent gap.
* Functions whose name ends in ``_locked`` expect the caller to hold a
  write transaction; the readers run each chunk in its own statement.
"""

from __future__ import annotations

import bisect
import logging
import sqlite3
import threading
from contextlib import nullcontext
from dataclasses import dataclass
from operator import itemgetter
from typing import ContextManager, Generator, Iterator

from ..capture import KIND_DELETE, KIND_INSERT
from ..errors import LogOffsetError, LogTruncated
from .read_positions import EFFECTIVE

READ_CHUNK = 1000
log = logging.getLogger("fieldsync.site")
_NOT_UTF8 = "Could not decode to UTF-8"


def _fetch(conn: sqlite3.Connection, sql: str, params: tuple) -> list[tuple]:
    """The capture rows ``sql`` selects.  A TEXT value that is not valid
    UTF-8 (an application stored bytes as text) is read with U+FFFD in
    place of the bad bytes, and said so, instead of stopping every read of
    the log for good: the caller holds the site's lock, so the connection's
    text factory is changed for this one statement only."""
    try:
        return conn.execute(sql, params).fetchall()
    except sqlite3.OperationalError as error:
        if _NOT_UTF8 not in str(error):
            raise
    saved = conn.text_factory
    conn.text_factory = _lenient_text
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.text_factory = saved


def _lenient_text(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        log.warning("a TEXT value in the log is not valid UTF-8 (%r...): it is sent with U+FFFD in place of the "
                    "bad bytes; store such values as BLOB, or fix them at their source", data[:24])
        return data.decode("utf-8", "replace")


def log_end(conn: sqlite3.Connection) -> int:
    """The commit offset of the last log transaction (0 for an empty log)."""
    row = conn.execute("SELECT max(coalesce((SELECT max(commit_offset) FROM fieldsync_log), 0),"
                       " (SELECT truncated_through FROM fieldsync_site WHERE id = 1))").fetchone()
    return row[0] or 0


def truncated_through(conn: sqlite3.Connection) -> int:
    return conn.execute("SELECT truncated_through FROM fieldsync_site WHERE id = 1").fetchone()[0]


def top_seq(conn: sqlite3.Connection) -> int:
    return conn.execute("SELECT max(seq) FROM fieldsync_capture").fetchone()[0] or 0


def cut_locked(conn: sqlite3.Connection, origin: str, end: int | None = None, *, applied: int | None = None) -> int:
    """Group every capture row after the log end into one log transaction
    with ``origin``; return the log end afterwards.  Caller holds the write
    lock.  ``end`` may pass the current log end when the caller knows it.
    ``applied``: the rows are an apply's written back to ``origin``, which
    had applied ``origin``'s log through that offset (:func:`applied_of`)."""
    if end is None:
        end = log_end(conn)
    top = top_seq(conn)
    if top <= end:
        return end
    conn.execute("INSERT INTO fieldsync_log (commit_offset, origin, first_seq, applied) VALUES (?, ?, ?, ?)",
                 (top, origin, end + 1, applied))
    return top


def applied_of(conn: sqlite3.Connection, commit: int) -> int | None:
    """For the log transaction ``commit`` of rows an apply wrote back to its
    origin, the origin's log offset that apply had reached (None: another
    log transaction, or one logged before layout 14)."""
    found = conn.execute("SELECT applied FROM fieldsync_log WHERE commit_offset = ?", (commit,)).fetchone()
    return None if found is None else found[0]


def check_boundary(conn: sqlite3.Connection, offset: int, what: str) -> None:
    """Raise unless ``offset`` is 0, the truncation point or a commit offset."""
    if type(offset) is not int or offset < 0:
        raise LogOffsetError(f"{what} must be a non-negative integer log offset, got {offset!r}")
    floor = truncated_through(conn)
    if offset < floor:
        raise LogTruncated(f"{what} {offset} lies before the log's truncation point {floor}: those entries "
                           "were confirmed by every peer and deleted; the peer needs a new extraction")
    if offset == floor:
        return
    if conn.execute("SELECT 1 FROM fieldsync_log WHERE commit_offset = ?", (offset,)).fetchone() is None:
        raise LogOffsetError(f"{what} {offset} is not a commit offset of this log")


def iter_capture(conn: sqlite3.Connection, after: int, until: int, *, chunk: int | None = None,
                 lock: threading.RLock | None = None, skip_origin: str | None = None,
                 keep_flag: int = 0, value_columns: int | None = None, image_columns: int | None = None
                 ) -> Generator[tuple[int, str, list[tuple]], None, None]:
    """Yield ``(commit_offset, origin, rows)`` for the log transactions in
    ``(after, until]``, in log order: the capture rows of one log
    transaction in seq order, at most ``chunk`` of them at a time (a large
    transaction comes in several consecutive pieces).  A capture row is
    ``(seq, shape, kind, flags, v0, v1, ...)``, with the first
    ``value_columns`` value columns (None: all of them; a reader that knows
    how wide its shapes are saves converting the unused ones).  With
    ``image_columns``, INSERT and DELETE rows, which hold one image, come
    with that many (a reader with no route columns: half its width): each
    column read is a call into SQLite, NULL or not (benchmarks.e2e's 200,000
    capture rows: 0.29 s to 0.25 s of CPU).

    Log transactions whose origin is ``skip_origin`` are left out in SQL,
    except their rows with a flag in ``keep_flag``: a subscriber never gets
    its own changes back (bar the rows written back to it), and at a remote
    most of the log is what the consolidated sent.  Consecutive transactions
    that are read are fetched together, so small transactions cost no query
    each.  Memory holds one chunk of capture rows and one of log rows.  Both
    bounds must be commit boundaries (the caller checks), so transactions
    are never cut.
    """
    if chunk is None:
        chunk = READ_CHUNK
    guard: ContextManager = lock if lock is not None else nullcontext()
    selected = "*" if value_columns is None else _columns(value_columns)
    narrow = None if image_columns is None or value_columns is None or image_columns >= value_columns \
        else _columns(image_columns)
    span: list[tuple[int, str, int]] = []
    for commit, origin, first in _iter_commits(conn, after, until, chunk, guard):
        if origin != skip_origin:
            span.append((commit, origin, first))
            if len(span) < chunk:
                continue
        if span:
            yield from _read_span(conn, selected, span, chunk, guard, narrow)
            span = []
        if origin == skip_origin and keep_flag:
            with guard:
                rows = _fetch(conn, f"SELECT {selected} FROM fieldsync_capture WHERE seq >= ? AND seq <= ?"
                              " AND flags & ? ORDER BY seq", (first, commit, keep_flag))
            if rows:
                yield commit, origin, rows
    if span:
        yield from _read_span(conn, selected, span, chunk, guard, narrow)


def iter_capture_returned(conn: sqlite3.Connection, after: int, until: int, *, value_columns: int,
                          lock: threading.RLock | None = None
                          ) -> Iterator[tuple[int, str, list[tuple], dict[int, str]]]:
    """:func:`iter_capture` of every row (unselected), each chunk with the
    listed columns of its rows written back to their origin, by seq."""
    guard: ContextManager = lock if lock is not None else nullcontext()
    for commit, origin, rows in iter_capture(conn, after, until, lock=lock, value_columns=value_columns):
        returned: dict[int, str] = {}
        if any(row[3] for row in rows):
            with guard:
                returned = dict(conn.execute("SELECT seq, columns FROM fieldsync_returned WHERE seq >= ? AND seq <= ?",
                                             (rows[0][0], rows[-1][0])).fetchall())
        yield commit, origin, rows, returned


def _columns(values: int) -> str:
    return ", ".join(["seq", "shape", "kind", "flags", *(f"v{index}" for index in range(values))])


def _read_span(conn: sqlite3.Connection, selected: str, span: list[tuple[int, str, int]], chunk: int,
               guard: ContextManager, narrow: str | None = None) -> Iterator[tuple[int, str, list[tuple]]]:
    """The capture rows of consecutive log transactions ``span`` (they cover
    one contiguous run of seqs), split by transaction; ``narrow``: the
    columns of INSERT and DELETE rows (:func:`_two_widths`)."""
    position, until = span[0][2] - 1, span[-1][0]
    index = 0
    while position < until:
        with guard:
            if narrow is None:
                rows = _fetch(conn, f"SELECT {selected} FROM fieldsync_capture WHERE seq > ? AND seq <= ?"
                              " ORDER BY seq LIMIT ?", (position, until, chunk))
            else:
                rows = _two_widths(conn, selected, narrow, position, until, chunk)
        if not rows:
            return
        start = 0
        while start < len(rows):
            commit, origin, _first = span[index]
            stop = bisect.bisect_right(rows, commit, lo=start, key=_seq)
            if stop > start:
                yield commit, origin, rows[start:stop] if start or stop < len(rows) else rows
                start = stop
            if start < len(rows):
                index += 1
        position = rows[-1][0]


_seq = itemgetter(0)
_ONE_IMAGE = f"kind IN ({KIND_INSERT}, {KIND_DELETE})"


def _two_widths(conn: sqlite3.Connection, selected: str, narrow: str, position: int, until: int,
                chunk: int) -> list[tuple]:
    """The capture rows after ``position``, up to ``until`` and at most
    ``chunk`` of them, in seq order: INSERT and DELETE rows with the
    ``narrow`` columns, the others with ``selected``.  Both statements read
    one range of seqs, ``chunk`` of them (fewer rows where seqs are missing;
    none at all, the next seq present is looked up)."""
    while True:
        end = min(until, position + chunk)
        one = _fetch(conn, f"SELECT {narrow} FROM fieldsync_capture WHERE seq > ? AND seq <= ? AND {_ONE_IMAGE}"
                     " ORDER BY seq", (position, end))
        other = _fetch(conn, f"SELECT {selected} FROM fieldsync_capture WHERE seq > ? AND seq <= ?"
                       f" AND NOT {_ONE_IMAGE} ORDER BY seq", (position, end))
        if one or other:
            return sorted(one + other, key=_seq) if one and other else one or other
        following = conn.execute("SELECT min(seq) FROM fieldsync_capture WHERE seq > ? AND seq <= ?",
                                 (end, until)).fetchone()[0]
        if following is None:
            return []
        position = following - 1


def _iter_commits(conn: sqlite3.Connection, after: int, until: int, chunk: int,
                  guard: ContextManager) -> Iterator[tuple[int, str, int]]:
    position = after
    while True:
        with guard:
            rows = conn.execute("SELECT commit_offset, origin, first_seq FROM fieldsync_log WHERE commit_offset > ?"
                                " AND commit_offset <= ? ORDER BY commit_offset LIMIT ?",
                                (position, until, chunk)).fetchall()
        if not rows:
            return
        yield from rows
        position = rows[-1][0]


@dataclass(frozen=True, slots=True)
class SqliteLog:
    """A SQLite site's log as agent.site.reading reads it (its
    ``CaptureSource``): the functions above over one connection, each chunk
    read under ``lock``, the lock that serialises every use of it."""

    conn: sqlite3.Connection
    lock: threading.RLock

    def log_end(self) -> int:
        with self.lock:
            return log_end(self.conn)

    def check_boundary(self, offset: int, what: str) -> None:
        with self.lock:
            check_boundary(self.conn, offset, what)

    def iter_capture(self, after: int, until: int, *, skip_origin: str | None = None, keep_flag: int = 0,
                     value_columns: int | None = None, image_columns: int | None = None
                     ) -> Generator[tuple[int, str, list[tuple]], None, None]:
        return iter_capture(self.conn, after, until, lock=self.lock, skip_origin=skip_origin, keep_flag=keep_flag,
                            value_columns=value_columns, image_columns=image_columns)

    def applied(self, commit: int) -> int | None:
        with self.lock:
            return applied_of(self.conn, commit)


#: The horizon of a remote-user row (agent.site.remote_rules.horizon, rule 8
#: of docs/protocol.md) over fieldsync_remote's columns (a test holds them equal).
HORIZON_SQL = (f"(CASE WHEN confirm_sent >= log_sent THEN max({EFFECTIVE['log_read']}, log_sent)"
               " ELSE confirm_sent END)")


def truncate_locked(conn: sqlite3.Connection) -> int:
    """Delete log entries at or below the smallest ``confirm_sent`` of all
    peers; return the truncation point.  Caller holds the write lock.

    With no peers nothing is deleted: a peer added later starts at the log
    end anyway, and deleting would be the one mistake that cannot be undone.
    The capture row with the largest seq and the last log row are kept even
    when confirmed, so seq (and so commit offsets) never go back.
    """
    floor = truncated_through(conn)
    bound = conn.execute(f"SELECT min({HORIZON_SQL}) FROM fieldsync_remote").fetchone()[0]
    if bound is None or bound <= floor:
        return floor
    # Only ever cut at a commit boundary at or below the bound.
    bound = conn.execute("SELECT max(commit_offset) FROM fieldsync_log WHERE commit_offset <= ?",
                         (bound,)).fetchone()[0]
    if bound is None or bound <= floor:
        return floor
    top = top_seq(conn)
    if bound >= top:
        _clear_capture(conn, top)
    else:
        conn.execute("DELETE FROM fieldsync_capture WHERE seq <= ?", (bound,))
    conn.execute("DELETE FROM fieldsync_returned WHERE seq <= ?", (bound,))
    conn.execute("DELETE FROM fieldsync_log WHERE commit_offset <= ?"
                 " AND commit_offset < (SELECT max(commit_offset) FROM fieldsync_log)", (bound,))
    # Subscriptions that ended at or below the bound no longer concern any
    # read (every read starts above it), nor does a start at or below it.
    conn.execute("DELETE FROM fieldsync_subscription WHERE until <= ?", (bound,))
    conn.execute("DELETE FROM fieldsync_removed_article WHERE until <= ?", (bound,))  # likewise
    conn.execute("UPDATE fieldsync_subscription SET since = 0 WHERE since > 0 AND since <= ?", (bound,))
    conn.execute("UPDATE fieldsync_site SET truncated_through = ? WHERE id = 1", (bound,))
    return bound


def _clear_capture(conn: sqlite3.Connection, top: int) -> None:
    """Delete every capture row but the last (seq ``top``), which keeps seq
    from going back.  Every peer confirmed the whole log, the usual case of
    a site whose remotes caught up: a DELETE without WHERE lets SQLite free
    the table's and its indexes' pages whole instead of visiting each row
    and its index entries (200,000 rows: 0.12 s of CPU to 0.015 s).  The
    last row goes through a TEMP table and back as SQLite holds it (its
    values are never converted, so a TEXT value that is not UTF-8 stays
    as it was)."""
    conn.execute(f"CREATE TEMP TABLE fieldsync_capture_kept AS SELECT * FROM main.fieldsync_capture"
                 f" WHERE seq = {int(top)}")
    conn.execute("DELETE FROM main.fieldsync_capture")
    conn.execute("INSERT INTO main.fieldsync_capture SELECT * FROM temp.fieldsync_capture_kept")
    conn.execute("DROP TABLE temp.fieldsync_capture_kept")  # (an error before: the rollback drops it)

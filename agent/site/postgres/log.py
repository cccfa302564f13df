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
  origin make one log transaction; a log transaction never mixes origins,
  and a transaction that made a schema change (changes.py) is one alone,
  whose offset the cut records as the change's; so is one that ended a
  remote's subscription with DELETEs (resubscribe.py), which then holds
  through it.
* The cut runs in one REPEATABLE READ transaction whose first statement
  takes its snapshot, after ``LOCK ... fieldsync.cut``: cuts are one at a
  time, and the snapshot they record is the one they read with.
* Nothing is kept per cut but the last snapshot; the capture rows, their
  log transactions and their writing transactions go at truncation.
* Reading pages by key, one statement a chunk, and keeps no transaction
  open between chunks: the log up to a log end never changes, and the
  site's one connection stays free for its other calls between chunks.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from functools import lru_cache
from itertools import chain
from operator import itemgetter
from typing import Callable, ContextManager, Generator, Iterator, Mapping

import psycopg

from ..capture import Shape
from ..change_rows import SCHEMA_SHAPE
from ..errors import LogOffsetError, LogTruncated
from .capture import PgShape, load_shapes
from .connect import translate
from .typemap import KINDS, converter
from .uri import PgTarget

READ_CHUNK = 1000

# The transactions that finished between the previous cut's snapshot and
# this one's: those running then (its xip list) and those that started
# after it (txid >= its xmax), that are visible now, and whether each made
# a schema change (changes.py: a row of kind 4).  Two index scans.
_FINISHED = """
SELECT txid::text, origin, max(seq) AS last, bool_or(kind = 4) AS change FROM (
    SELECT txid, origin, seq, kind FROM fieldsync.capture
     WHERE txid = ANY (ARRAY(SELECT pg_snapshot_xip(%(previous)s::pg_snapshot)))
    UNION ALL
    SELECT txid, origin, seq, kind FROM fieldsync.capture
     WHERE txid >= pg_snapshot_xmax(%(previous)s::pg_snapshot) AND txid < pg_snapshot_xmax(%(now)s::pg_snapshot)
) AS batch
WHERE pg_visible_in_snapshot(txid, %(now)s::pg_snapshot)
GROUP BY txid, origin
ORDER BY last
"""

# A capture row's values, at most ``width`` of them: the array itself when
# it is no wider (a slice would copy every row's array for nothing).
_VALUES = "CASE WHEN cardinality(c.v) <= %(width)s THEN c.v ELSE c.v[1:%(width)s] END"
# Reading pages by the key (commit_offset, position, seq): log
# transactions in offset order, their writing transactions in replay
# order, each one's rows in seq order.  A page is one statement: the next
# writing transactions after a key (an index range of log_txn, bounded),
# each with its rows (from capture's (txid, seq) index, at most a page of
# them, so the sort is bounded too; a writing transaction none of whose
# rows is taken still comes, as one row without a seq, so the key moves
# past it).  A page asks for one row more than it gives: that row says
# whether the last writing transaction goes on, and the rest of it then
# comes by its own index range (_MEMBER_ROWS, below), with no sort.
_PAGE = """
SELECT t.commit_offset, t.position, l.origin, c.seq, c.shape, c.kind, c.flags, c.v
  FROM (SELECT t.commit_offset, t.position, t.txid, t.origin
          FROM fieldsync.log_txn t JOIN fieldsync.log l ON l.commit_offset = t.commit_offset
         WHERE (t.commit_offset, t.position) > (%(commit)s, %(position)s) AND t.commit_offset <= %(until)s
           AND (l.origin IS DISTINCT FROM %(skip)s OR %(keep)s <> 0)
         ORDER BY t.commit_offset, t.position
         LIMIT %(members)s) AS t
  JOIN fieldsync.log l ON l.commit_offset = t.commit_offset
  LEFT JOIN LATERAL (
       SELECT c.seq, c.shape, c.kind, c.flags, {values} AS v FROM fieldsync.capture c
        WHERE c.txid = t.txid AND c.origin IS NOT DISTINCT FROM t.origin
          AND (l.origin IS DISTINCT FROM %(skip)s OR c.flags & %(keep)s <> 0)
        ORDER BY c.seq
        LIMIT %(limit)s) AS c ON true
 ORDER BY t.commit_offset, t.position, c.seq
 LIMIT %(limit)s
""".format(values=_VALUES)
_MEMBER_KEY = itemgetter(0, 1)  # (commit_offset, position) of a page's row
_MEMBER = "SELECT txid::text, origin FROM fieldsync.log_txn WHERE commit_offset = %s AND position = %s"
# The rest of a writing transaction: applications' rows (no origin) and
# an origin's each have their statement, so that the planner sees which
# rows it reads and takes the index range (IS NOT DISTINCT FROM a
# parameter would look like one row to it: a scan of the whole table and
# a sort, a page at a time).
_MEMBER_ROWS = """
SELECT c.seq, c.shape, c.kind, c.flags, {values} FROM fieldsync.capture c
 WHERE c.txid = %(txid)s::xid8 AND {origin} AND c.seq > %(seq)s
   AND (NOT %(skipped)s OR c.flags & %(keep)s <> 0)
 ORDER BY c.seq
 LIMIT %(limit)s
"""
_APPLICATION_ROWS = _MEMBER_ROWS.format(values=_VALUES, origin="c.origin IS NULL")
_ORIGIN_ROWS = _MEMBER_ROWS.format(values=_VALUES, origin="c.origin = %(origin)s")
# Past every position (integer): the log transaction ``after`` is done with.
_PAST = 2**31 - 1
# As wide as any capture row (PostgreSQL's array slices stop at the end).
_WHOLE = 2**31 - 1


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
            begin_cut(conn)
            return cut_in(conn, origin)
    except psycopg.Error as error:
        raise translate(error, target, "cutting the log") from None


def begin_cut(conn: psycopg.Connection) -> None:
    """The first statements of a transaction that cuts (opened by the
    caller, nothing run in it yet): REPEATABLE READ, and the cut lock taken
    before the first query, so the snapshot is taken once it is held."""
    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    conn.execute("LOCK TABLE fieldsync.cut IN EXCLUSIVE MODE")


def cut_in(conn: psycopg.Connection, origin: str) -> Cut:
    """:func:`cut` inside the caller's transaction, begun by
    :func:`begin_cut`: the transaction's snapshot is the cut's, so what it
    reads is exactly the log up to the new log end (docs/postgres.md,
    "Extraction")."""
    found = conn.execute("SELECT pg_current_snapshot()::text, snapshot::text, log_end"
                         " FROM fieldsync.cut WHERE id = 1").fetchone()
    assert found is not None, "fieldsync.cut has its row from install_schema on"
    now, previous, end = found
    finished = conn.execute(_FINISHED, {"previous": previous, "now": now}).fetchall()
    # Subscriptions ended through a remote's stream whose rows wait for
    # their log transaction (resubscribe.py): almost always none, and
    # not looked for when no transaction finished (an idle cut).
    ending = {txid for (txid,) in conn.execute("SELECT txid::text FROM fieldsync.subscription_change")} \
        if finished else set()
    log_rows: list[tuple[int, str]] = []
    member_rows: list[tuple[int, int, str, str | None]] = []
    last_origin: object = object()  # no writer's origin: the first transaction starts a log transaction
    position = 0
    changes: list[tuple[int, str]] = []
    ended: list[tuple[int, str]] = []
    for txid, writer_origin, _last, change in finished:
        alone = change or txid in ending
        if writer_origin != last_origin or alone:
            end += 1
            log_rows.append((end, writer_origin or origin))
            last_origin, position = writer_origin, 0
        member_rows.append((end, position, txid, writer_origin))
        position += 1
        if alone:  # a log transaction of its own, whatever comes next
            if change:
                changes.append((end, txid))
            if txid in ending:  # a subscription change's DELETEs, or a dropped publication's change
                ended.append((end, txid))
            last_origin = object()
    with conn.cursor() as cursor:
        if log_rows:
            with cursor.copy("COPY fieldsync.log (commit_offset, origin) FROM STDIN") as copy:
                for row in log_rows:
                    copy.write_row(row)
            with cursor.copy("COPY fieldsync.log_txn (commit_offset, position, txid, origin)"
                             " FROM STDIN") as copy:
                for member in member_rows:
                    copy.write_row(member)
        for offset, txid in changes:
            cursor.execute("UPDATE fieldsync.schema_change SET commit_offset = %s WHERE txid = %s::xid8",
                           (offset, txid))
        for offset, txid in ended:  # the subscription holds through its DELETEs' log transaction
            cursor.execute("UPDATE fieldsync.subscription s SET until = %s FROM fieldsync.subscription_change c"
                           " WHERE c.txid = %s::xid8 AND s.id = c.ends", (offset + 1, txid))
            cursor.execute("DELETE FROM fieldsync.subscription_change WHERE txid = %s::xid8", (txid,))
        cursor.execute("UPDATE fieldsync.cut SET snapshot = %s::pg_snapshot, log_end = %s, cut_at = now()"
                       " WHERE id = 1", (now, end))
    return Cut(end, len(member_rows), len(log_rows))


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


def applied_of(conn: psycopg.Connection, commit: int) -> int | None:
    """For the log transaction ``commit`` of rows applies wrote back to its
    origin, the least of the origin's offsets those applies had reached
    (consecutive writing transactions of one origin make one log
    transaction: what each wrote was written with at least that much);
    None for any other."""
    found = conn.execute("SELECT min(a.applied) FROM fieldsync.log_txn t JOIN fieldsync.applied a ON a.txid = t.txid"
                         " WHERE t.commit_offset = %s", (commit,)).fetchone()
    return None if found is None else found[0]


def iter_capture(conn: psycopg.Connection, after: int, until: int, *, shapes: Mapping[int, PgShape] | None = None,
                 chunk: int | None = None, lock: threading.RLock | None = None, skip_origin: str | None = None,
                 keep_flag: int = 0, value_columns: int | None = None
                 ) -> Generator[tuple[int, str, list[tuple]], None, None]:
    """Yield ``(commit_offset, origin, rows)`` for the log transactions in
    ``(after, until]`` in log order, at most ``chunk`` rows at a time
    (READ_CHUNK; a large log transaction comes in consecutive pieces).  A row is a SQLite
    site's capture row: ``(seq, shape, kind, flags, v0, v1, ...)`` with the
    values as they travel (typemap.py), so agent.site.view reads it as it
    is; with ``value_columns``, exactly that many values (cut or filled with
    None, as a SQLite site's capture table is as wide as its widest shape).

    Log transactions whose origin is ``skip_origin`` are left out, but
    their rows with a flag in ``keep_flag`` (agent.site.sqlite.log.iter_capture's
    rule).  Each page is one statement (under ``lock``, the lock of every
    use of ``conn``), paged by key: no transaction stays open between
    pages, and offsets up to ``until`` never change, so nothing is missed
    or read twice.  A writing transaction larger than a page is read on
    by its own key range.  ``shapes``: the shapes known (a dict is given
    the new ones met)."""
    chunk = READ_CHUNK if chunk is None else chunk
    guard: ContextManager = lock if lock is not None else nullcontext()
    known: dict[int, PgShape] = shapes if isinstance(shapes, dict) else dict(shapes or {})
    width = _WHOLE if value_columns is None else value_columns
    made = _Rows(known, value_columns)
    # One row more than a page gives: it shows whether the page's last writing transaction goes on.
    keyed = {"until": until, "width": width, "skip": skip_origin, "keep": keep_flag, "limit": chunk + 1}
    commit, position = after, _PAST  # the key read so far: every writing transaction up to it
    members = 1  # how many writing transactions a page takes: as many as should fill it (below)
    held: list[tuple] = []
    held_commit, held_origin = 0, ""
    while True:
        with guard:
            found = conn.execute(_PAGE, {**keyed, "commit": commit, "position": position, "members": members},
                                 binary=True).fetchall()
            made.know(conn, {row[4] for row in found})
        if not found:
            break
        full = len(found) > chunk
        going_on = full and found[chunk][:2] == found[chunk - 1][:2]
        del found[chunk:]
        last = found[-1]
        taken = len(set(map(_MEMBER_KEY, found)))  # every one comes, with a row without a seq if need be
        # Every writing transaction up to the key is read once the page is
        # given out; it ends the read when the range had fewer left than asked.
        commit, position = last[0], last[1]
        exhausted = not full and taken < members
        # As many as would fill the next page, at this page's rows per writing transaction.
        members = max(1, min(chunk, chunk * taken // len(found)))
        pieces = made.pieces(found)
        if going_on:  # the rest of the page's last writing transaction, a page at a time
            pieces = chain(pieces, ((commit, last[2], rows) for rows in _rest_of_member(
                conn, guard, made, {**keyed, "seq": last[3], "skipped": last[2] == skip_origin}, (commit, position),
                chunk)))
        for offset, origin, rows in pieces:
            if held and offset != held_commit:
                yield held_commit, held_origin, held
                held = []
            held_commit, held_origin = offset, origin
            held += rows
            if len(held) >= chunk:
                yield offset, origin, held[:chunk]
                held = held[chunk:]
        if exhausted:
            break
    if held:
        yield held_commit, held_origin, held


def _rest_of_member(conn: psycopg.Connection, guard: ContextManager, made: "_Rows", keyed: dict,
                    member: tuple[int, int], chunk: int) -> Iterator[list[tuple]]:
    """The rows of the writing transaction at ``member`` (its key in
    log_txn) after ``keyed["seq"]``, a page a statement."""
    with guard:
        txid, origin = conn.execute(_MEMBER, member).fetchone()
    keyed = {**keyed, "txid": txid, "origin": origin}
    statement = _APPLICATION_ROWS if origin is None else _ORIGIN_ROWS
    while True:
        with guard:
            found = conn.execute(statement, keyed, binary=True).fetchall()
            made.know(conn, {capture[1] for capture in found})
        more = len(found) > chunk
        del found[chunk:]
        if found:
            yield made.rows(found)
        if not more:
            return
        keyed = {**keyed, "seq": found[-1][0]}


class _Rows:
    """Capture rows as a SQLite site's, ``(seq, shape, kind, flags,
    *values)``, from the rows a page fetched: the texts converted in the
    lists psycopg made for them (typemap.converter) and, with
    ``value_columns``, exactly that many values.  The log reader's hot
    path: one tuple made per row."""

    def __init__(self, known: dict[int, PgShape], value_columns: int | None) -> None:
        self.known = known
        self.converts: dict[int, Callable[[list], list]] = {}
        # What fills a row of n values to value_columns (the statements cut the longer ones).
        self.padding: dict[int, tuple] = (defaultdict(tuple) if value_columns is None else
                                          {count: (None,) * (value_columns - count)
                                           for count in range(value_columns + 1)})

    def know(self, conn: psycopg.Connection, shape_ids: set[int]) -> None:
        """Have the converters of ``shape_ids`` (shapes never change: a new
        one is loaded once; None, a writing transaction with no row taken,
        is none).  Under the connection's lock."""
        shape_ids.discard(None)
        if shape_ids <= self.converts.keys():
            return
        if SCHEMA_SHAPE in shape_ids:  # a schema change's row: its JSON as it is (agent.site.change_rows)
            self.converts[SCHEMA_SHAPE] = list
            shape_ids.discard(SCHEMA_SHAPE)
        if not shape_ids <= self.known.keys():
            self.known.update(load_shapes(conn))
        for shape_id in shape_ids - self.converts.keys():
            layout = self.known[shape_id].layout
            self.converts[shape_id] = _converter(layout.kinds, layout.route_kind)

    def rows(self, found: list[tuple]) -> list[tuple]:
        """Rows fetched as ``(seq, shape, kind, flags, texts)``."""
        converts, padding = self.converts, self.padding
        rows: list[tuple] = []
        for seq, shape_id, kind, flags, texts in found:
            values = converts[shape_id](texts)
            rows.append((seq, shape_id, kind, flags, *values, *padding[len(values)]))
        return rows

    def pieces(self, found: list[tuple]) -> list[tuple[int, str, list[tuple]]]:
        """A page's rows, fetched as ``(commit_offset, position, origin,
        seq, shape, kind, flags, texts)`` (no seq: a writing transaction
        with no row taken), as ``(commit_offset, origin, rows)`` per log
        transaction."""
        converts, padding = self.converts, self.padding
        pieces: list[tuple[int, str, list[tuple]]] = []
        commit: int | None = None
        rows: list[tuple] = []
        for offset, _place, origin, seq, shape_id, kind, flags, texts in found:
            if seq is None:
                continue
            if offset != commit:
                commit, rows = offset, []
                pieces.append((offset, origin, rows))
            values = converts[shape_id](texts)
            rows.append((seq, shape_id, kind, flags, *values, *padding[len(values)]))
        return pieces


@lru_cache(maxsize=None)
def _converter(kinds: tuple[str, ...], route: str | None) -> Callable[[list], list]:
    return converter(tuple(KINDS[kind] for kind in kinds), None if route is None else KINDS[route])


@dataclass(frozen=True, slots=True)
class PgLog:
    """A PostgreSQL site's log as agent.site.reading reads it (its
    ``CaptureSource``, and the ``Shapes`` its readers find shapes in): the
    functions of this file over the site's connection, each statement under
    ``lock`` (the lock of every use of ``conn``), PostgreSQL's errors as
    the site's."""

    conn: psycopg.Connection
    target: PgTarget
    lock: threading.RLock
    shapes: dict[int, PgShape]  # the shapes met so far (shapes never change)

    def get(self, shape_id: int) -> Shape:
        """The shape ``shape_id`` as agent.site.view knows it."""
        shape = self.shapes.get(shape_id)
        if shape is None:
            with self.lock, self._errors("reading the capture shapes"):
                self.shapes.update(load_shapes(self.conn))
            shape = self.shapes.get(shape_id)
            if shape is None:
                raise LookupError(f"capture shape {shape_id} is missing")
        return shape.shape

    def log_end(self) -> int:
        with self.lock, self._errors("reading the log end"):
            return log_end(self.conn)

    def check_boundary(self, offset: int, what: str) -> None:
        with self.lock, self._errors("reading the log's offsets"):
            check_boundary(self.conn, offset, what)

    def iter_capture(self, after: int, until: int, *, skip_origin: str | None = None, keep_flag: int = 0,
                     value_columns: int | None = None, image_columns: int | None = None
                     ) -> Generator[tuple[int, str, list[tuple]], None, None]:
        # image_columns: every row comes value_columns wide (a row type of its own makes no saving here).
        with self._errors("reading the log"):
            yield from iter_capture(self.conn, after, until, shapes=self.shapes, lock=self.lock,
                                    skip_origin=skip_origin, keep_flag=keep_flag, value_columns=value_columns)

    def applied(self, commit: int) -> int | None:
        with self.lock, self._errors("reading the log"):
            return applied_of(self.conn, commit)

    @contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        try:
            yield
        except psycopg.Error as error:
            raise translate(error, self.target, doing) from None


def truncate_log(conn: psycopg.Connection, target: PgTarget, through: int) -> int:
    """Delete the log transactions at or below ``through`` with their
    capture rows and the rows written back among them
    (``fieldsync.returned``); return the truncation point.  Capture rows of
    transactions no cut has taken yet stay."""
    try:
        with conn.transaction():
            end = log_end(conn)
            if through > end:
                raise LogOffsetError(f"cannot truncate through {through}: the log ends at {end}")
            # The rows written back go first, found from their own (few) rows.
            conn.execute("DELETE FROM fieldsync.applied a USING fieldsync.log_txn t WHERE t.commit_offset <= %s"
                         " AND a.txid = t.txid", (through,))
            conn.execute("DELETE FROM fieldsync.returned r USING fieldsync.capture c, fieldsync.log_txn t"
                         " WHERE t.commit_offset <= %s AND c.txid = t.txid AND c.origin IS NOT DISTINCT FROM t.origin"
                         " AND r.txid = c.txid AND r.seq = c.seq", (through,))
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

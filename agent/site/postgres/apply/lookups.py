"""Finding a row's captured changes by key at a PostgreSQL consolidated, for
the rules that look back (key moves and the unconfirmed rule), and what
such a change becomes for the peer.

Rules of this file:
* Changes are found through each shape's key indexes on the capture table
  (schema.shape_indexes), by the capture text of a key's values, so the
  cost follows the keys looked up, not the length of the log.  A key's
  capture text is computed by PostgreSQL itself (the column's capture
  expression over the value cast to its type), in a savepoint: a value
  the type cannot hold matches no row, and leaves the transaction usable.
* For one row, the order of its changes' ``seq`` is the order they were
  made in (each writer held the row's lock; docs/postgres.md, "Commit
  order"), which is all these rules compare.
* What a peer has not confirmed is every visible change but those in a log
  transaction at or below its ``confirm_sent``: the log's later
  transactions, and the transactions that committed but no cut has taken
  yet (their offsets, when they get them, lie above the log end, below
  this apply's).  This apply's own writes are left out.
* What a change becomes for the peer is the SQLite site's reader's answer
  (agent.site.selection.SubscriberReader over the peer's subscriptions
  and the site's shapes), so both backends decide alike.
"""

from __future__ import annotations

from typing import Iterator

import psycopg
from psycopg import sql

from codec.ops import Operation

from ...capture import FLAG_RETURN_TO_ORIGIN, KIND_UPDATE, Shape
from ...identity import Role
from ...selection import SubscriberReader, plan_from_rows, value_columns_read
from ..capture import load_shapes
from ..errors import ValueNotConvertible
from ..reading import article_rows
from ..subscriptions import VALUE_COLUMNS, stored_value
from .tables import PgTable, Tables

# Keys looked up per statement.
_PROBE_CHUNK = 200
# A change no cut has taken yet is read with the subscriptions of now.
_NOT_CUT = 1 << 62


def key_texts(conn: psycopg.Connection, table: PgTable, keys: list[tuple]) -> list[tuple | None]:
    """The capture texts of ``keys`` (values as they travel), in order;
    None for a key some value of which the column's type cannot hold."""
    columns = [value_texts(conn, table, column, [key[position] for key in keys])
               for position, column in enumerate(table.key_columns)]
    return [None if any(texts[index] is None for texts in columns) else tuple(texts[index] for texts in columns)
            for index in range(len(keys))]


def value_texts(conn: psycopg.Connection, table: PgTable, column: str, values: list) -> list[str | None]:
    """The capture texts of ``values`` for ``column``, in order; None where
    the column's type cannot hold the value (or it is NULL)."""
    params: list = []
    for value in values:
        try:
            params.append(table.params((column,), (value,))[0])
        except ValueNotConvertible:
            params.append(None)
    if table.kinds[column].name == "bytea":  # its capture text is its hex; a text array cannot carry bytes
        return [None if param is None else param.hex() for param in params]
    query = table.capture_texts(column)
    try:
        with conn.transaction():
            return [text for (text,) in conn.execute(query, (params,))]
    except (psycopg.DataError, psycopg.IntegrityError):  # a domain's CHECK refuses one
        pass
    found: list[str | None] = []
    for param in params:  # one at a time: the values the type cannot hold match nothing
        try:
            with conn.transaction():
                found.append(conn.execute(query, ([param],)).fetchone()[0])
        except (psycopg.DataError, psycopg.IntegrityError):
            found.append(None)
    return found


def _shape_ids(conn: psycopg.Connection, table: PgTable) -> list[int]:
    layout = table.pg_shape.layout
    return [shape_id for (shape_id,) in conn.execute(
        "SELECT id FROM fieldsync.shape WHERE table_schema = %s AND table_name = %s ORDER BY id",
        (layout.schema, layout.table))]


def last_change(conn: psycopg.Connection, tables: Tables, table: PgTable, key: tuple) -> tuple[int, tuple] | None:
    """The kind of the last captured change of ``key`` in ``table`` (its
    old row's key, an INSERT's new one) that was not written back to an
    origin, and for an UPDATE the key it gave the row; None: none
    captured (or truncated since)."""
    (texts,) = key_texts(conn, table, [key])
    if texts is None:
        return None
    last = None
    for shape_id in _shape_ids(conn, table):
        shape = tables.shape(conn, shape_id)
        if len(shape.layout.key_columns) != len(key):
            continue
        positions = shape.shape.key_positions
        match = sql.SQL(" AND ").join(sql.SQL("v[{}] = %s").format(sql.Literal(position + 1))
                                      for position in positions)
        found = conn.execute(sql.SQL("SELECT seq, kind, v FROM fieldsync.capture WHERE shape = {} AND {}"
                                     " AND flags & {} = 0 ORDER BY seq DESC LIMIT 1").format(
            sql.Literal(shape_id), match, sql.Literal(FLAG_RETURN_TO_ORIGIN)), texts).fetchone()
        if found is not None and (last is None or found[0] > last[0]):
            last = (found[0], found[1], shape, found[2])
    if last is None:
        return None
    _seq, kind, shape, texts = last
    if kind != KIND_UPDATE:
        return kind, key
    width = len(shape.layout.columns)
    values = shape.load(texts)
    return kind, tuple(values[width + position] for position in shape.shape.key_positions)


def any_unconfirmed(conn: psycopg.Connection, peer: str, confirmed: int) -> bool:
    """Whether this site holds changes ``peer`` may receive and has not
    confirmed (above its ``confirm_sent``): of another origin than the
    peer, or written back to it (those an earlier message of a chain wrote
    back in this transaction included: its rows go back before this
    message's, as an apply of its own would have logged them).  Asked at
    the end of the peer's batch, when every row the batch touched is
    locked by it: any other write of them is committed and seen."""
    snapshot, end = conn.execute("SELECT snapshot::text, log_end FROM fieldsync.cut WHERE id = 1").fetchone()
    found = conn.execute("""
SELECT EXISTS (SELECT 1 FROM fieldsync.log WHERE commit_offset > %(confirmed)s AND commit_offset <= %(end)s
                  AND origin <> %(peer)s)
    OR EXISTS (SELECT 1 FROM fieldsync.returned r WHERE r.peer = %(peer)s
                  AND NOT EXISTS (SELECT 1 FROM fieldsync.log_txn t WHERE t.txid = r.txid AND t.origin = r.peer
                                     AND t.commit_offset <= %(confirmed)s))
    OR EXISTS (SELECT 1 FROM fieldsync.capture
                WHERE txid = ANY (ARRAY(SELECT pg_snapshot_xip(%(snapshot)s::pg_snapshot)))
                  AND txid <> pg_current_xact_id() AND origin IS DISTINCT FROM %(peer)s)
    OR EXISTS (SELECT 1 FROM fieldsync.capture
                WHERE txid >= pg_snapshot_xmax(%(snapshot)s::pg_snapshot) AND txid < pg_current_xact_id()
                  AND origin IS DISTINCT FROM %(peer)s)
    OR EXISTS (SELECT 1 FROM fieldsync.capture
                WHERE txid > pg_current_xact_id() AND origin IS DISTINCT FROM %(peer)s)
""", {"confirmed": confirmed, "end": end, "peer": peer, "snapshot": snapshot}).fetchone()
    return bool(found[0])


def rows_of_keys(conn: psycopg.Connection, tables: Tables, table: PgTable, keys: set[tuple], confirmed: int,
                 site: str, peer: str) -> Iterator[tuple[int, tuple, tuple, tuple]]:
    """The changes of ``table`` the ``peer`` has not confirmed (above
    ``confirmed``) whose old key or, for an UPDATE, new key is one of
    ``keys``, in the order they were made: ``(seq, old key, new key,
    (row, commit, origin))``, the row as a reader takes it (``(seq, shape,
    kind, flags, values...)``), its log transaction's commit offset (None:
    no cut has taken it yet) and origin (``site`` for this site's own)."""
    listed = sorted(keys, key=repr)
    found: dict[int, tuple] = {}
    for shape_id in _shape_ids(conn, table):
        shape = tables.shape(conn, shape_id)
        width, positions = len(shape.layout.columns), shape.shape.key_positions
        probes = [key for key in listed if len(key) == len(positions)]
        for start in range(0, len(probes), _PROBE_CHUNK):
            texts = [text for text in key_texts(conn, table, probes[start:start + _PROBE_CHUNK]) if text is not None]
            if not texts:
                continue
            for row in conn.execute(_probe_sql(shape_id, width, positions, len(texts)),
                                    [*(part for text in texts for part in text), confirmed, peer]):
                seq, kind, flags, values, commit, origin = row
                loaded = shape.load(values)
                old_key = tuple(loaded[position] for position in positions)
                new_key = tuple(loaded[width + position] for position in positions) if kind == KIND_UPDATE \
                    else old_key
                found[seq] = (seq, old_key, new_key, ((seq, shape_id, kind, flags, *loaded), commit,
                                                       origin or site))
    return iter([found[seq] for seq in sorted(found)])


def _probe_sql(shape_id: int, width: int, positions: tuple[int, ...], count: int) -> sql.Composed:
    """Capture rows of one shape under one of ``count`` keys (capture texts,
    bound first; then the peer's confirm_sent, then the peer), old key or
    an UPDATE's new key, not in a log transaction the peer confirmed; of
    this transaction, only rows an earlier message of a chain wrote back to
    the peer (this message's own changes are the peer's, and its rows go
    back after it)."""
    names = sql.SQL(", ").join(sql.Identifier(f"k{index}") for index in range(len(positions)))
    row = sql.SQL("({})").format(sql.SQL(", ").join([sql.Placeholder()] * len(positions)))
    values = sql.SQL(", ").join([row] * count)

    def branch(offset: int, where: str) -> sql.Composed:
        match = sql.SQL(" AND ").join(sql.SQL("c.v[{}] = probe.{}").format(sql.Literal(offset + position + 1),
                                                                           sql.Identifier(f"k{index}"))
                                      for index, position in enumerate(positions))
        return sql.SQL("SELECT c.txid, c.seq FROM probe JOIN fieldsync.capture c ON c.shape = {}{} AND {}").format(
            sql.Literal(shape_id), sql.SQL(where), match)

    return sql.SQL(
        "WITH probe ({}) AS (VALUES {}), hits AS ({} UNION {})"
        " SELECT c.seq, c.kind, c.flags, c.v, t.commit_offset, c.origin FROM hits"
        " JOIN fieldsync.capture c ON c.txid = hits.txid AND c.seq = hits.seq"
        " LEFT JOIN fieldsync.log_txn t ON t.txid = c.txid AND t.origin IS NOT DISTINCT FROM c.origin"
        " WHERE CASE WHEN c.txid <> pg_current_xact_id() THEN t.commit_offset IS NULL OR t.commit_offset > %s"
        " ELSE EXISTS (SELECT 1 FROM fieldsync.returned r WHERE r.txid = c.txid AND r.seq = c.seq AND r.peer = %s)"
        " END").format(
        names, values, branch(0, ""), branch(width, " AND c.kind = 2"))


class _Shapes:
    """The site's shapes as a reader takes them (``get(shape_id)``)."""

    def __init__(self, conn: psycopg.Connection, tables: Tables) -> None:
        self._conn = conn
        self._tables = tables

    def get(self, shape_id: int) -> Shape:
        return self._tables.shape(self._conn, shape_id).shape


class PeerReader:
    """What a captured change becomes for one peer: the SQLite site's
    reader (agent.site.selection) over the peer's subscriptions."""

    def __init__(self, conn: psycopg.Connection, tables: Tables, peer: str) -> None:
        articles = article_rows(conn)
        subscriptions = [(publication, stored_value(*values), since, until)
                         for publication, *values, since, until in conn.execute(
                             f"SELECT publication, {VALUE_COLUMNS}, since, until FROM fieldsync.subscription"
                             " WHERE remote = %s ORDER BY id", (peer,))]
        plan = plan_from_rows(peer, Role.CONSOLIDATED, articles, subscriptions)
        shapes = _Shapes(conn, tables)
        every = [shape.shape for shape in load_shapes(conn).values()]
        self._reader = SubscriberReader(plan, shapes, self._returned_columns, value_columns_read(every, plan))
        self._conn = conn

    def _returned_columns(self, seq: int) -> str | None:
        found = self._conn.execute("SELECT columns::text FROM fieldsync.returned WHERE seq = %s", (seq,)).fetchone()
        return None if found is None else found[0]

    def extend(self, commit: int, origin: str, rows: list[tuple], ops: list) -> None:
        """Append to ``ops`` what the rows of the log transaction ``commit``
        of ``origin`` (as log.iter_capture reads them) become for the peer."""
        self._reader.at(commit)
        self._reader.extend(origin, rows, ops)

    def operation(self, change: tuple) -> Operation | None:
        """``change`` (a row of :func:`rows_of_keys`) as the peer receives
        it (None: it does not: its own, or outside its subset)."""
        row, commit, origin = change
        self._reader.at(_NOT_CUT if commit is None else commit)
        return self._reader.operation(origin, row)

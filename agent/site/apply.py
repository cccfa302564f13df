"""Applying a peer's transactions.

Rules of this file:
* One call applies a batch and sets the peer's ``log_received`` in one
  SQLite write transaction: a crash anywhere leaves all of it or none of it.
* Local changes committed before the batch are first cut into their own log
  transaction; then each applied transaction is cut into a log transaction
  whose origin is the peer.  A log transaction never mixes origins, and
  the capture triggers see applied rows like any other write.
* A bad operation never stops the batch: INSERT of an existing key,
  UPDATE/DELETE of a missing row, a constraint failure, a malformed
  operation or an unknown table/column is recorded in
  ``fieldsync_apply_error`` and the rest goes on.  Only problems with the
  batch as a whole (offsets going backwards, out of order) or with the
  database itself abort it.
* At the consolidated an UPDATE is conditional on its before-image
  (``col IS ?``, SQLite's equality); a mismatch is a conflict, recorded in
  ``fieldsync_conflict`` and resolved by the table's policy or a hook, and
  the resulting row goes back to the origin.  A remote applies what the
  consolidated sends as is.
* Fast path: consecutive operations with the same table, kind and columns
  run as one ``executemany`` inside a savepoint; if any row of it did not
  go as planned, the savepoint is rolled back and the run is replayed one
  operation at a time with the full checks.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any, Callable, Iterable, Mapping

from codec.ops import OpKind, Operation, Transaction

from ._db import format_time, quote_ident, utc_now
from .capture import (
    FLAG_RETURN_TO_ORIGIN,
    KIND_DELETE,
    KIND_UPDATE,
    Shape,
    ShapeCache,
    write_capture_row,
)
from .errors import ApplyRefused, ConflictHookFailed, IncarnationMismatch, InvalidSetting
from .log import cut_locked, top_seq
from .log import log_end as log_end_of
from .remotes import get_remote
from .schema import Role, SiteIdentity
from .values import operation_problem, pack, unpack, value_problem


class Resolution(str, Enum):
    """How a conflict at the consolidated is resolved."""

    INCOMING = "incoming"   # apply the incoming change (the default)
    LOCAL = "local"         # keep the local row; the origin gets it back


@dataclass(frozen=True, slots=True)
class Conflict:
    """What a conflict hook is shown.  ``local_row`` is the whole current row."""

    peer: str
    peer_commit: int
    table: str
    key: tuple
    local_row: Mapping[str, Any]
    incoming: Operation


# A hook returns a Resolution, or a dict of column -> value to write over
# the local row (a merge).
ConflictHook = Callable[[Conflict], "Resolution | dict[str, Any]"]


@dataclass(frozen=True, slots=True)
class ApplyResult:
    peer: str
    log_received: int
    transactions_applied: int
    transactions_skipped: int   # commit <= the log_received already recorded
    operations_applied: int
    conflicts: int
    errors: int
    log_commits: tuple[int, ...]  # local log transactions written for the batch


_VALUE_TYPES = frozenset({type(None), int, float, str, bytes})
_OP_TYPES = frozenset({tuple, Operation})
# Operations per savepoint on the fast path (see _flush).
_INSERT_CHUNK = 500
_CHANGE_CHUNK = 50


class _Table:
    """What the apply path needs to know about a local table."""

    __slots__ = ("name", "quoted", "columns", "column_set", "key_columns", "where_key", "shape", "policy")

    def __init__(self, name: str, columns: tuple[str, ...], key_columns: tuple[str, ...]) -> None:
        self.name = name
        self.quoted = quote_ident(name)
        self.columns = columns
        self.column_set = frozenset(columns)
        self.key_columns = key_columns
        self.where_key = " AND ".join(f"{quote_ident(column)} IS ?" for column in key_columns)
        self.shape: Shape | None = None
        self.policy = Resolution.INCOMING


class _Return:
    """A row to send back to the batch's origin once the batch is applied."""

    __slots__ = ("table", "origin_row", "columns")

    def __init__(self, table: _Table, origin_row: dict, columns: set[str]) -> None:
        self.table = table
        self.origin_row = origin_row   # the row as the origin holds it
        self.columns = columns         # the columns it gets back


class _Batch:
    __slots__ = ("peer", "commit", "now", "applied", "conflicts", "errors", "returns", "filters", "touched")

    def __init__(self, peer: str, now: str) -> None:
        self.peer = peer
        self.commit = 0
        self.now = now
        self.applied = 0
        self.conflicts = 0
        self.errors = 0
        self.returns: dict[tuple[str, tuple], _Return] = {}
        # SUBSCRIBE BY filters of the peer's subscriptions (lower-case table ->
        # (column, values)), and the keys of those tables the batch touched.
        self.filters: dict[str, tuple[str, frozenset]] = {}
        self.touched: dict[tuple[str, tuple], _Table] = {}


class Applier:
    """Applies batches on one connection, caching table metadata and SQL."""

    def __init__(self, conn: sqlite3.Connection, shapes: ShapeCache) -> None:
        self._conn = conn
        self._shapes = shapes
        self._schema_version = -1
        self._tables: dict[str, _Table | None] = {}
        self._sql: dict[tuple, str] = {}
        self._article_shapes: dict[str, int] = {}
        self._policies: dict[str, str] = {}
        self.hooks: dict[str | None, ConflictHook] = {}
        self._site_name = ""

    # --- metadata --------------------------------------------------------------

    def _refresh(self) -> None:
        version = self._conn.execute("PRAGMA schema_version").fetchone()[0]
        if version != self._schema_version:
            self._schema_version = version
            self._tables.clear()
            self._sql.clear()
        shapes = dict(self._conn.execute("SELECT lower(table_name), shape FROM fieldsync_article").fetchall())
        policies = dict(self._conn.execute("SELECT lower(table_name), policy FROM fieldsync_conflict_policy")
                        .fetchall())
        self._article_shapes = shapes
        self._policies = policies
        for lowered, table in self._tables.items():
            if table is not None:
                self._attach(lowered, table)

    def _attach(self, lowered: str, table: _Table) -> None:
        shape_id = self._article_shapes.get(lowered)
        table.shape = None if shape_id is None else self._shapes.get(shape_id)
        table.policy = Resolution(self._policies.get(lowered, Resolution.INCOMING.value))

    def _table(self, name: str) -> _Table | None:
        lowered = name.lower()
        try:
            return self._tables[lowered]
        except KeyError:
            pass
        table = None
        row = self._conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name = ? COLLATE NOCASE",
                                 (name,)).fetchone()
        if row is not None and not lowered.startswith(("fieldsync_", "sqlite_")):
            columns, keyed = [], []
            for _cid, column, _type, _notnull, _default, pk, hidden in self._conn.execute(
                    f"PRAGMA table_xinfo({quote_ident(row[0])})"):
                if not hidden:
                    columns.append(column)
                    if pk:
                        keyed.append((pk, column))
            if keyed:
                table = _Table(row[0], tuple(columns), tuple(column for _, column in sorted(keyed)))
                self._attach(lowered, table)
        self._tables[lowered] = table
        return table

    # --- the batch ------------------------------------------------------------------

    def apply_locked(self, identity: SiteIdentity, peer: str, transactions: Iterable[Transaction],
                     log_received: int, *, messages: int, peer_incarnation: bytes | None,
                     now: datetime | None) -> ApplyResult:
        """Apply ``transactions`` from ``peer``; the caller holds the write
        transaction and commits it when this returns."""
        conn = self._conn
        remote = get_remote(conn, peer)
        if peer_incarnation is not None:
            if type(peer_incarnation) is not bytes or len(peer_incarnation) != 16:
                raise InvalidSetting("a peer incarnation id is 16 bytes")
            if remote.peer_incarnation is not None and remote.peer_incarnation != peer_incarnation:
                raise IncarnationMismatch(
                    f"peer {peer!r} now has incarnation {peer_incarnation.hex()} but {remote.peer_incarnation.hex()} "
                    "is recorded: its database was rebuilt or restored, so its offsets cannot be trusted; "
                    "extract the remote again (or reset the pair) before exchanging messages")
        if type(log_received) is not int or log_received < remote.log_received:
            raise ApplyRefused(f"log_received for {peer!r} would go back from {remote.log_received} to "
                               f"{log_received!r}; nothing applied")
        if type(messages) is not int or messages < 0:
            raise InvalidSetting(f"message count must be a non-negative integer, got {messages!r}")
        self._refresh()
        self._site_name = identity.name
        end = cut_locked(conn, identity.name)
        consolidated = identity.role is Role.CONSOLIDATED
        batch = _Batch(peer, format_time(now or utc_now()))
        if consolidated:
            batch.filters = self._filters(peer)
        applied = skipped = 0
        previous = remote.log_received
        commits: list[int] = []
        for transaction in transactions:
            commit = transaction.commit
            if commit <= remote.log_received:
                skipped += 1  # applied before (a confirmation was lost)
                continue
            if commit <= previous:
                raise ApplyRefused(f"transaction {commit} from {peer!r} follows {previous}: out of order; "
                                   "nothing applied")
            if commit > log_received:
                raise ApplyRefused(f"transaction {commit} from {peer!r} lies beyond the new log_received "
                                   f"{log_received}; nothing applied")
            previous = commit
            batch.commit = commit
            self._apply_operations(transaction.ops, batch, consolidated)
            applied += 1
            top = top_seq(conn)
            if top > end:
                conn.execute("INSERT INTO fieldsync_log (commit_offset, origin, first_seq) VALUES (?, ?, ?)",
                             (top, peer, end + 1))
                commits.append(top)
                end = top
        if batch.returns or batch.touched:
            self._write_returns(batch)
            top = top_seq(conn)
            if top > end:
                conn.execute("INSERT INTO fieldsync_log (commit_offset, origin, first_seq) VALUES (?, ?, ?)",
                             (top, peer, end + 1))
                commits.append(top)
        conn.execute(
            "UPDATE fieldsync_remote SET log_received = ?, receive_count = receive_count + ?, last_received_at = ?,"
            " peer_incarnation = coalesce(peer_incarnation, ?) WHERE name = ?",
            (log_received, messages, batch.now, peer_incarnation, peer))
        return ApplyResult(peer, log_received, applied, skipped, batch.applied, batch.conflicts, batch.errors,
                           tuple(commits))

    def _apply_operations(self, ops: tuple, batch: _Batch, consolidated: bool) -> None:
        # Group consecutive operations of one table, kind and column list into
        # runs, building their statement parameters on the way (this loop is
        # the adapter's hot path).  The checks here are the cheap structural
        # ones (C-level type sets); column names are checked per run against
        # the table, integer ranges by SQLite's binding (an overflow sends the
        # run down the slow path, which checks every operation fully).
        run: list = []
        params: list = []
        signature: tuple | None = None
        plain = _VALUE_TYPES
        for op in ops:
            mine = None
            if type(op) in _OP_TYPES and len(op) == 5:
                table, kind, key, before, after = op
                if type(table) is str and type(key) is tuple and key and type(kind) is int:
                    if kind == 1:  # INSERT
                        if (before is None and type(after) is dict
                                and {*map(type, key), *map(type, after.values())} <= plain):
                            mine = (table, 1, *after)
                            values = tuple(after.values())
                    elif kind == 2:  # UPDATE
                        if (type(before) is dict and type(after) is dict and after
                                and {*map(type, key), *map(type, after.values()),
                                     *map(type, before.values())} <= plain):
                            mine = (table, 2, len(key), *after, None, *before)
                            values = (*after.values(), *key, *before.values())
                    elif kind == 3:  # DELETE
                        if (after is None and type(before) is dict
                                and {*map(type, key), *map(type, before.values())} <= plain):
                            mine = (table, 3, len(key))
                            values = key
            if mine is None:
                self._flush(run, params, signature, batch, consolidated)
                run, params, signature = [], [], None
                self._error(batch, op, f"malformed operation: {operation_problem(op) or 'bad structure'}")
                continue
            if mine != signature:
                self._flush(run, params, signature, batch, consolidated)
                run, params, signature = [], [], mine
            run.append(op)
            params.append(values)
        self._flush(run, params, signature, batch, consolidated)

    # --- runs ---------------------------------------------------------------------

    def _flush(self, run: list, params: list, signature: tuple | None, batch: _Batch, consolidated: bool) -> None:
        if not run:
            return
        first = run[0]
        table = self._table(first[0])
        if table is None:
            for op in run:
                self._error(batch, op, f"no table {op[0]!r} with a primary key at this site")
            return
        kind = first[1]
        if len(first[2]) != len(table.key_columns):
            for op in run:
                self._error(batch, op, f"key has {len(first[2])} values but {table.name} has "
                                       f"{len(table.key_columns)} key columns")
            return
        named = () if kind == OpKind.DELETE else (*first[4], *(first[3] or ()))
        missing = [column for column in named if column not in table.column_set]
        if missing:
            for op in run:
                self._error(batch, op, f"{table.name} has no column {missing[0]!r} at this site")
            return
        if kind == OpKind.INSERT:
            sql = self._insert_sql(table, tuple(first[4]), ignore=True)
        elif kind == OpKind.UPDATE:
            sql = self._update_sql(table, tuple(first[4]), tuple(first[3]))
        else:
            sql = self._delete_sql(table)
        if batch.filters and table.name.lower() in batch.filters:
            self._touch(batch, table, run)
        # A savepoint journals every existing page a statement changes; past
        # SQLite's in-memory spill size (64 KiB) that journal goes to a temp
        # file, which halves UPDATE speed.  Small chunks stay in memory.
        step = _INSERT_CHUNK if kind == OpKind.INSERT else _CHANGE_CHUNK
        for start in range(0, len(run), step):
            chunk = params[start:start + step] if len(run) > step else params
            if self._fast(sql, chunk):
                batch.applied += len(chunk)
                continue
            for op in run[start:start + step]:
                self._one(table, op, batch, consolidated)

    def _fast(self, sql: str, params: list) -> bool:
        conn = self._conn
        conn.execute("SAVEPOINT fieldsync_run")
        try:
            done = conn.executemany(sql, params).rowcount == len(params)
        except (sqlite3.IntegrityError, OverflowError, sqlite3.ProgrammingError):
            # ProgrammingError: a row bound the wrong number of values.
            done = False
        if not done:
            conn.execute("ROLLBACK TO fieldsync_run")
        conn.execute("RELEASE fieldsync_run")
        return done

    # --- one operation, with every check -------------------------------------------

    def _one(self, table: _Table, op: tuple, batch: _Batch, consolidated: bool) -> None:
        problem = operation_problem(op)
        if problem is not None:
            self._error(batch, op, f"malformed operation: {problem}")
            return
        kind = op[1]
        try:
            if kind == OpKind.INSERT:
                self._insert_one(table, op, batch, consolidated)
            elif kind == OpKind.UPDATE:
                self._update_one(table, op, batch, consolidated)
            else:
                if self._conn.execute(self._delete_sql(table), op[2]).rowcount == 0:
                    self._error(batch, op, "DELETE of a missing row")
                else:
                    batch.applied += 1
        except sqlite3.IntegrityError as error:
            self._error(batch, op, f"constraint failed: {error}")

    def _insert_one(self, table: _Table, op: tuple, batch: _Batch, consolidated: bool) -> None:
        after = op[4]
        try:
            self._conn.execute(self._insert_sql(table, tuple(after), ignore=False), tuple(after.values()))
        except sqlite3.IntegrityError as error:
            local = self._select(table, op[2])
            if local is None:  # another constraint than the key refused the row
                self._error(batch, op, f"constraint failed: {error}")
                return
        else:
            batch.applied += 1
            return
        if consolidated:
            # The consolidated keeps its row and sends it back so the origin converges.
            self._error(batch, op, "INSERT of an existing key: the local row was kept and sent back to "
                                   f"{batch.peer}")
            self._send_back(batch, table, op[2], {**local, **after}, set(table.columns))
        else:
            # A remote takes the consolidated's row as is.
            self._conn.execute(self._update_sql(table, tuple(after), ()), (*after.values(), *op[2]))
            self._error(batch, op, "INSERT of an existing key: the row was overwritten with the incoming one")

    def _update_one(self, table: _Table, op: tuple, batch: _Batch, consolidated: bool) -> None:
        conn = self._conn
        key, before, after = op[2], op[3], op[4]
        if conn.execute(self._update_sql(table, tuple(after), tuple(before)),
                        (*after.values(), *key, *before.values())).rowcount:
            batch.applied += 1
            return
        local = self._select(table, key)
        if local is None:
            self._error(batch, op, "UPDATE of a missing row")
            return
        if consolidated:
            self._conflict(table, op, local, batch)
            return
        # A remote applies what the consolidated sends, except a column whose
        # value is the remote's own change that the consolidated had not yet
        # applied when it wrote this operation: the consolidated applies that
        # change after this one and sends the outcome back, so overwriting it
        # here would leave this site with the older value for good.
        differing = {column for column, value in before.items() if not _sqlite_equal(local.get(column), value)}
        kept = self._own_latest(table, key, differing & set(after)) if differing else set()
        written = {column: value for column, value in after.items() if column not in kept}
        if written:
            conn.execute(self._update_sql(table, tuple(written), ()), (*written.values(), *key))
        batch.applied += 1

    def _own_latest(self, table: _Table, key: tuple, columns: set[str]) -> set[str]:
        """Which of ``columns`` of row ``key`` were last changed here by a
        local write (not by an apply), judging by the capture rows still in
        the log.  Only called on the slow path of a remote."""
        if table.shape is None or not columns:
            return set()
        conn = self._conn
        shapes = {row[0]: self._shapes.get(row[0]) for row in conn.execute(
            "SELECT id FROM fieldsync_shape WHERE table_name = ? COLLATE NOCASE", (table.name,))}
        end = log_end_of(conn)
        remaining = set(columns)
        own: set[str] = set()
        cursor = conn.execute(f"SELECT * FROM fieldsync_capture WHERE shape IN ({', '.join('?' * len(shapes))})"
                              " ORDER BY seq DESC", tuple(shapes))
        for row in cursor:
            shape = shapes[row[1]]
            width = len(shape.columns)
            old = row[4:4 + width]
            new = row[4 + width:4 + 2 * width] if row[2] == KIND_UPDATE else old
            positions = shape.key_positions
            if tuple(new[i] for i in positions) != key and tuple(old[i] for i in positions) != key:
                continue
            changed = {column for i, column in enumerate(shape.columns)
                       if row[2] != KIND_UPDATE or not _sqlite_equal(old[i], new[i])} & remaining
            if not changed:
                continue
            local = row[0] > end or conn.execute(
                "SELECT origin FROM fieldsync_log WHERE commit_offset >= ? ORDER BY commit_offset LIMIT 1",
                (row[0],)).fetchone()[0] == self._site_name
            if local:
                own |= changed
            remaining -= changed
            if not remaining:
                break
        cursor.close()
        return own

    def _conflict(self, table: _Table, op: tuple, local: dict, batch: _Batch) -> None:
        conn = self._conn
        key, before, after = op[2], op[3], op[4]
        incoming = tuple.__new__(Operation, op) if not isinstance(op, Operation) else op
        hook = self.hooks.get(table.name.lower(), self.hooks.get(None))
        if hook is not None:
            try:
                decision = hook(Conflict(batch.peer, batch.commit, table.name, key, dict(local), incoming))
            except Exception as error:
                raise ConflictHookFailed(f"conflict hook for {table.name} raised {type(error).__name__}: {error}; "
                                         "the batch was rolled back") from error
        else:
            decision = table.policy
        if isinstance(decision, Resolution):
            written = after if decision is Resolution.INCOMING else {}
        elif isinstance(decision, dict):
            written = decision
            for column, value in decision.items():
                if column not in table.columns or value_problem(value) is not None:
                    raise ConflictHookFailed(f"conflict hook for {table.name} returned a bad value for column "
                                             f"{column!r}; the batch was rolled back")
        else:
            raise ConflictHookFailed(f"conflict hook for {table.name} returned {type(decision).__name__}, not a "
                                     "Resolution or a dict of column values; the batch was rolled back")
        if written:
            # Captured as usual (origin: the peer), so every other subscriber
            # gets the result; the origin gets it from _write_returns.
            conn.execute(self._update_sql(table, tuple(written), ()), (*written.values(), *key))
        final_key = tuple(written.get(column, part) for column, part in zip(table.key_columns, key))
        result = self._select(table, final_key)
        resolution = decision.value if isinstance(decision, Resolution) else "merged"
        conn.execute(
            "INSERT INTO fieldsync_conflict (at, peer, peer_commit, table_name, key, local_row, incoming_before,"
            " incoming_after, resolution, result_row) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (batch.now, batch.peer, batch.commit, table.name, pack(key), pack(local), pack(before), pack(after),
             resolution, None if result is None else pack(result)))
        batch.conflicts += 1
        batch.applied += 1
        if result is not None:
            # The origin holds its change over our old row; it gets back the
            # columns the conflict was about (and any the resolution wrote).
            self._send_back(batch, table, final_key, {**local, **after}, set(after) | set(written))

    def _send_back(self, batch: _Batch, table: _Table, key: tuple, origin_row: dict, columns: set[str]) -> None:
        """Remember to send the final state of ``key`` back to the batch's
        origin.  It is written once the whole batch is applied, so it also
        holds what later operations of the batch did to the row."""
        pending = batch.returns.get((table.name, key))
        if pending is None:
            batch.returns[(table.name, key)] = _Return(table, origin_row, columns)
        else:
            pending.origin_row.update({column: origin_row[column] for column in columns if column in origin_row})
            pending.columns |= columns

    def _filters(self, peer: str) -> dict[str, tuple[str, frozenset]]:
        values: dict[str, set] = {}
        for publication, value in self._conn.execute(
                "SELECT publication, value FROM fieldsync_subscription WHERE remote = ?", (peer,)):
            bucket = values.setdefault(publication, set())
            if value is not None:
                bucket.add(value)
        return {table.lower(): (column, frozenset(values.get(publication, ())))
                for table, publication, column in self._conn.execute(
                    "SELECT table_name, publication, subscribe_by FROM fieldsync_article"
                    " WHERE subscribe_by IS NOT NULL")}

    @staticmethod
    def _touch(batch: _Batch, table: _Table, run: list) -> None:
        """Remember the keys the peer changed in a filtered table (under the
        key the row has afterwards)."""
        key_columns = table.key_columns
        for op in run:
            after = op[4]
            key = op[2]
            if after is not None and any(column in after for column in key_columns):
                key = tuple(after.get(column, part) for column, part in zip(key_columns, key))
            batch.touched[(table.name, key)] = table

    def _write_returns(self, batch: _Batch) -> None:
        """Capture what goes back to the batch's origin, each row only to it:
        the state of conflicting rows after the whole batch (see _send_back),
        and a DELETE for every row the origin changed that now lies outside
        its subset: it holds a copy it must not keep.  Written once per
        batch, so a row that left the subset and came back within the batch
        causes nothing."""
        for (_name, key), pending in batch.returns.items():
            table = pending.table
            shape = table.shape
            if shape is None:
                continue  # the table is not published here: nothing goes anywhere
            result = self._select(table, key)
            if result is None:
                continue  # deleted later in the batch: the origin deleted it too
            values = [pending.origin_row.get(column) for column in shape.columns]
            values += [result.get(column) for column in shape.columns]
            seq = write_capture_row(self._conn, shape, KIND_UPDATE, FLAG_RETURN_TO_ORIGIN, values)
            self._conn.execute("INSERT INTO fieldsync_returned (seq, columns) VALUES (?, ?)",
                               (seq, json.dumps(sorted(pending.columns & set(shape.columns)))))
        for (name, key), table in batch.touched.items():
            shape = table.shape
            if shape is None or (name, key) in batch.returns:
                continue
            row = self._select(table, key)
            column, values = batch.filters[name.lower()]
            if row is None or row.get(column) in values:
                continue
            write_capture_row(self._conn, shape, KIND_DELETE, FLAG_RETURN_TO_ORIGIN,
                              [row.get(c) for c in shape.columns])

    # --- records and SQL ------------------------------------------------------------

    def _select(self, table: _Table, key: tuple) -> dict | None:
        sql = self._sql.get(("select", table.name))
        if sql is None:
            columns = ", ".join(quote_ident(column) for column in table.columns)
            sql = f"SELECT {columns} FROM {table.quoted} WHERE {table.where_key}"
            self._sql[("select", table.name)] = sql
        row = self._conn.execute(sql, key).fetchone()
        return None if row is None else dict(zip(table.columns, row))

    def _error(self, batch: _Batch, op: object, problem: str) -> None:
        batch.errors += 1
        table = kind = key = None
        if isinstance(op, tuple) and len(op) == 5:
            table = op[0] if type(op[0]) is str else None
            kind = op[1] if type(op[1]) is int else None
            key = _packed(op[2])
        self._conn.execute(
            "INSERT INTO fieldsync_apply_error (at, peer, peer_commit, table_name, kind, key, operation, problem)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (batch.now, batch.peer, batch.commit, table, kind, key, _packed(op), problem))

    def _insert_sql(self, table: _Table, columns: tuple[str, ...], ignore: bool) -> str:
        cache_key = ("insert", table.name, columns, ignore)
        sql = self._sql.get(cache_key)
        if sql is None:
            names = ", ".join(quote_ident(column) for column in columns)
            sql = (f"INSERT INTO {table.quoted} ({names}) VALUES ({', '.join('?' * len(columns))})"
                   + (" ON CONFLICT DO NOTHING" if ignore else ""))
            self._sql[cache_key] = sql
        return sql

    def _update_sql(self, table: _Table, after: tuple[str, ...], before: tuple[str, ...]) -> str:
        cache_key = ("update", table.name, after, before)
        sql = self._sql.get(cache_key)
        if sql is None:
            assignments = ", ".join(f"{quote_ident(column)} = ?" for column in after)
            checks = "".join(f" AND {quote_ident(column)} IS ?" for column in before)
            sql = f"UPDATE {table.quoted} SET {assignments} WHERE {table.where_key}{checks}"
            self._sql[cache_key] = sql
        return sql

    def _delete_sql(self, table: _Table) -> str:
        cache_key = ("delete", table.name)
        sql = self._sql.get(cache_key)
        if sql is None:
            sql = f"DELETE FROM {table.quoted} WHERE {table.where_key}"
            self._sql[cache_key] = sql
        return sql


def _sqlite_equal(left: object, right: object) -> bool:
    """Equality as the ``IS`` of the conditional UPDATE sees it: numbers by
    value (1 = 1.0), text and blobs by type and content, NaN as NULL."""
    if isinstance(left, float) and left != left:
        left = None
    if isinstance(right, float) and right != right:
        right = None
    if type(left) in _NUMBERS and type(right) in _NUMBERS:
        return left == right
    return type(left) is type(right) and left == right


_NUMBERS = (int, float)


def _packed(value: object) -> bytes:
    try:
        return pack(value)
    except (TypeError, ValueError, OverflowError):
        return pack(repr(value))


# --- records --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConflictRecord:
    id: int
    at: datetime
    peer: str
    peer_commit: int
    table: str
    key: tuple
    local_row: dict
    incoming_before: dict | None
    incoming_after: dict | None
    resolution: str
    result_row: dict | None


@dataclass(frozen=True, slots=True)
class ApplyErrorRecord:
    id: int
    at: datetime
    peer: str
    peer_commit: int
    table: str | None
    kind: int | None
    key: tuple | None
    operation: object
    problem: str


def list_conflicts(conn: sqlite3.Connection, after_id: int = 0) -> tuple[ConflictRecord, ...]:
    rows = conn.execute("SELECT id, at, peer, peer_commit, table_name, key, local_row, incoming_before,"
                        " incoming_after, resolution, result_row FROM fieldsync_conflict WHERE id > ? ORDER BY id",
                        (after_id,)).fetchall()
    return tuple(
        ConflictRecord(i, datetime.fromisoformat(at), peer, commit, table, tuple(unpack(key)), unpack(local),
                       unpack(before), unpack(after), resolution, unpack(result))
        for i, at, peer, commit, table, key, local, before, after, resolution, result in rows)


def list_apply_errors(conn: sqlite3.Connection, after_id: int = 0) -> tuple[ApplyErrorRecord, ...]:
    rows = conn.execute("SELECT id, at, peer, peer_commit, table_name, kind, key, operation, problem"
                        " FROM fieldsync_apply_error WHERE id > ? ORDER BY id", (after_id,)).fetchall()
    result = []
    for i, at, peer, commit, table, kind, key, operation, problem in rows:
        key_value = unpack(key)
        result.append(ApplyErrorRecord(i, datetime.fromisoformat(at), peer, commit, table, kind,
                                       tuple(key_value) if isinstance(key_value, (list, tuple)) else None,
                                       unpack(operation), problem))
    return tuple(result)


def check_policy(policy: object) -> Resolution:
    try:
        return Resolution(policy)
    except ValueError:
        raise InvalidSetting(f"conflict policy must be 'incoming' or 'local', got {policy!r}") from None

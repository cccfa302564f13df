"""Applying a peer's transactions.

Rules of this file:
* One call applies a batch and sets the peer's ``log_received`` in one
  SQLite write transaction: a crash anywhere leaves all of it or none of it.
* Local changes committed before the batch are first cut into their own log
  transaction; then each applied transaction is cut into a log transaction
  whose origin is the peer.  A log transaction never mixes origins.  At the
  consolidated the capture triggers see applied rows like any other write;
  at a remote they skip them (a row in ``fieldsync_applying`` marks the
  apply's writes; see capture.install_capture).
* A bad operation never stops the batch: INSERT of an existing key,
  UPDATE/DELETE of a missing row, a constraint failure, a malformed
  operation or an unknown table/column is recorded in
  ``fieldsync_apply_error`` and the rest goes on.  Only problems with the
  batch as a whole (offsets going backwards, out of order) or with the
  database itself abort it.
* At the consolidated an UPDATE is conditional on its before-image
  (``col IS ?``, SQLite's equality); a mismatch is a conflict, recorded in
  ``fieldsync_conflict`` and resolved by the table's policy or a hook, and
  the resulting row goes back to the origin.  The row also goes back when
  the log holds operations on it that the origin receives and has not
  confirmed: they may reach the origin after its change (the unconfirmed
  rule, docs/site-database.md "Concurrent changes").  They are looked up
  by key in the capture table's key indexes, never by reading that part
  of the log.
* A remote applies what the consolidated sends as is, except on rows with
  its own changes the consolidated has not confirmed (*pending* rows): there
  it keeps its own values against operations written without them.
* Fast path: consecutive operations with the same table, kind and columns
  run as one ``executemany`` inside a savepoint; if any row of it did not
  go as planned, the savepoint is rolled back and the run is replayed one
  operation at a time with the full checks.
"""

from __future__ import annotations

import json
import math
import sqlite3
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from operator import itemgetter
from typing import Any, Callable, Iterable, Mapping

from codec.ops import OpKind, Operation, Transaction

from ._db import format_time, quote_ident, utc_now
from .capture import (
    FLAG_CONCURRENT_DELETE,
    FLAG_PENDING_MOVE,
    FLAG_RETURN_TO_ORIGIN,
    KIND_DELETE,
    KIND_INSERT,
    KIND_UPDATE,
    KeyIndex,
    Shape,
    ShapeCache,
    key_indexes,
    trigger_names,
    write_capture_row,
)
from .errors import ApplyRefused, ConflictHookFailed, IncarnationMismatch, InvalidSetting
from .log import cut_locked, top_seq
from .publications import SubscriberReader
from .remotes import get_remote
from .schema import Role, SiteIdentity
from .values import operation_problem, pack, unpack, value_problem


# Recorded at a remote when the consolidated gives a row a key it holds (_take_key).
_KEY_TAKEN = "UPDATE onto a key held here: the row there was replaced by the incoming one"


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
    transactions_skipped: int   # commit <= skip_through (by default the log_received already recorded)
    operations_applied: int
    conflicts: int
    errors: int
    log_commits: tuple[int, ...]  # local log transactions written for the batch


_VALUE_TYPES = frozenset({type(None), int, float, str, bytes})
_OP_TYPES = frozenset({tuple, Operation})
# Operations per savepoint on the fast path (see _flush).
_INSERT_CHUNK = 500
_CHANGE_CHUNK = 50
# Keys the unconfirmed rule looks up per statement (see _rows_of_keys).
_PROBE_CHUNK = 200
# Changes of a row's key _moved_key follows, at most.
_MOVES_FOLLOWED = 16


class _Table:
    """What the apply path needs to know about a local table."""

    __slots__ = ("name", "quoted", "columns", "column_set", "key_columns", "where_key", "shape", "policy",
                 "or_ignore")

    def __init__(self, name: str, columns: tuple[str, ...], key_columns: tuple[str, ...], or_ignore: bool) -> None:
        self.name = name
        self.quoted = quote_ident(name)
        self.columns = columns
        self.column_set = frozenset(columns)
        self.key_columns = key_columns
        self.where_key = " AND ".join(f"{quote_ident(column)} IS ?" for column in key_columns)
        self.shape: Shape | None = None
        self.policy = Resolution.INCOMING
        # Whether the fast path may write with OR IGNORE (see _flush): a
        # statement's OR clause also governs the statements of the table's
        # triggers, so only where fieldsync's capture triggers are the only
        # ones (their insert cannot fail).
        self.or_ignore = or_ignore


class _Return:
    """A row to send back to the batch's origin once the batch is applied."""

    __slots__ = ("table", "origin_row", "columns")

    def __init__(self, table: _Table, origin_row: dict, columns: set[str]) -> None:
        self.table = table
        self.origin_row = origin_row   # the row as the origin holds it
        self.columns = columns         # the columns it gets back


class _Own:
    """A remote's own changes to one row that the consolidated has not
    confirmed yet: the last value it wrote to each column (and the capture
    seq of that write), or that it deleted the row.  ``seq`` is the capture
    seq of the last of them."""

    __slots__ = ("values", "seqs", "deleted", "seq", "moved_to")

    def __init__(self, seq: int) -> None:
        self.values: dict[str, Any] = {}
        self.seqs: dict[str, int] = {}
        self.deleted = False
        self.seq = seq
        self.moved_to: tuple | None = None  # the key it gave the row, when that is why it is gone


class _Batch:
    __slots__ = ("peer", "commit", "now", "applied", "conflicts", "errors", "returns", "filters", "touched",
                 "entered", "watched", "received", "moved", "origins", "holds", "stranded", "pending")

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
        # Rows that go back whole, as an INSERT: the peer moved them into its
        # subset from outside it (it may have been sent a DELETE of them that
        # reaches it after its change), or moved them away onto a key this
        # site holds (_refused_move).
        self.entered: set[tuple[str, tuple]] = set()
        # At the consolidated, when the log holds operations the peer has not
        # confirmed: every row the batch touched, with the values the peer
        # wrote to it ((table name, key) -> (table, {column: value})).  None
        # when nothing is unconfirmed, so the hot path does no bookkeeping.
        self.watched: dict[tuple[str, tuple], tuple[_Table, dict]] | None = None
        # Of those rows, the ones the peer receives unconfirmed operations on,
        # with the kind and row image of the last of them as the peer sees it.
        self.received: dict[tuple[str, tuple], tuple[int, dict]] = {}
        # Of the watched rows, those whose key the peer's UPDATEs changed: the
        # key before the batch -> the key after it (and back), and whether the
        # peer holds a row under a key after its batch.
        self.moved: dict[tuple[str, tuple], tuple] = {}
        self.origins: dict[tuple[str, tuple], tuple] = {}
        self.holds: dict[tuple[str, tuple], bool] = {}
        # Rows the peer gave a new key that this site no longer held under
        # the old one: the peer holds them under the new key (-> its image).
        self.stranded: dict[tuple[str, tuple], tuple[_Table, dict]] = {}
        # At a remote: its own pending changes (lower-case table -> key -> _Own).
        self.pending: dict[str, dict[tuple, _Own]] = {}


class Applier:
    """Applies batches on one connection, caching table metadata and SQL."""

    def __init__(self, conn: sqlite3.Connection, shapes: ShapeCache) -> None:
        self._conn = conn
        self._shapes = shapes
        self._schema_version = -1
        self._tables: dict[str, _Table | None] = {}
        self._sql: dict[tuple, str] = {}
        self._shape_ids: dict[str, tuple[int, ...]] = {}
        self._skips_capture = False  # a remote whose triggers skip the apply path's writes
        # _own_changes' last result: (confirmed, end, pending rows).
        self._own_kept: tuple[int, int, dict[str, dict[tuple, _Own]]] | None = None
        # At the consolidated, per peer, a stretch (after, until] of the log
        # that holds only the peer's own transactions and no row written
        # back to it (see _unconfirmed_for).
        self._own_runs: dict[str, tuple[int, int]] = {}
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
            self._shape_ids.clear()
            self._skips_capture = self._conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'fieldsync_applying'").fetchone() is not None
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
                triggers = {name.lower() for (name,) in self._conn.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = ? COLLATE NOCASE",
                    (row[0],))}
                table = _Table(row[0], tuple(columns), tuple(column for _, column in sorted(keyed)),
                               triggers <= {name.lower() for name in trigger_names(row[0])})
                self._attach(lowered, table)
        self._tables[lowered] = table
        return table

    # --- the batch ------------------------------------------------------------------

    def apply_locked(self, identity: SiteIdentity, peer: str, transactions: Iterable[Transaction],
                     log_received: int, *, messages: int, peer_incarnation: bytes | None,
                     now: datetime | None, skip_through: int | None = None) -> ApplyResult:
        """Apply ``transactions`` from ``peer``, skipping those with a commit
        at or below ``skip_through`` (None: the recorded log_received; see
        SiteDatabase.apply); the caller holds the write transaction and
        commits it when this returns."""
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
        if skip_through is None:
            skip_through = remote.log_received
        elif type(skip_through) is not int or not 0 <= skip_through <= remote.log_received:
            raise ApplyRefused(f"skip_through {skip_through!r} for {peer!r} must be an offset from 0 to the recorded "
                               f"log_received {remote.log_received}; nothing applied")
        self._refresh()
        self._site_name = identity.name
        end = cut_locked(conn, identity.name)
        consolidated = identity.role is Role.CONSOLIDATED
        batch = _Batch(peer, format_time(now or utc_now()))
        # Offsets of this site's log that the peer has not confirmed: at the
        # consolidated, operations the peer may receive after the changes in
        # this batch; at a remote, its own changes still pending.
        confirmed, unconfirmed_end = remote.confirm_sent, end
        if consolidated:
            batch.filters = self._filters(peer)
            if self._unconfirmed_for(peer, confirmed, end):
                batch.watched = {}
        else:
            # A copy: _pending_one changes it for the batch (see _moved_pending).
            batch.pending = dict(self._own_changes(confirmed, end))
        # At a remote, the capture triggers skip what is written from here on
        # (see capture.install_capture); the row goes again before the commit.
        marked = not consolidated and self._skips_capture
        if marked:
            conn.execute("INSERT INTO fieldsync_applying (id) VALUES (1)")
        applied = skipped = 0
        previous = skip_through
        commits: list[int] = []
        for transaction in transactions:
            commit = transaction.commit
            if commit <= skip_through:
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
        if batch.watched:
            self._send_back_unconfirmed(identity, batch, confirmed, unconfirmed_end)
        if batch.returns or batch.touched or batch.received or batch.stranded:
            self._write_returns(batch)
            top = top_seq(conn)
            if top > end:
                conn.execute("INSERT INTO fieldsync_log (commit_offset, origin, first_seq) VALUES (?, ?, ?)",
                             (top, peer, end + 1))
                commits.append(top)
        if marked:
            conn.execute("DELETE FROM fieldsync_applying")
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
                            mine = (table, 1, len(key), *after)
                            values = tuple(after.values())
                    elif kind == 2:  # UPDATE
                        if (type(before) is dict and type(after) is dict and after
                                and {*map(type, key), *map(type, after.values()),
                                     *map(type, before.values())} <= plain):
                            if consolidated:
                                mine = (table, 2, len(key), *after, None, *before)
                                values = (*after.values(), *key, *before.values())
                            else:  # a remote writes the values as they come
                                mine = (table, 2, len(key), *after)
                                values = (*after.values(), *key)
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
        # The fast path's INSERT skips a row whose key is taken, and where the
        # table allows it (_Table.or_ignore) its INSERT and UPDATE skip a row
        # that breaks any constraint (OR IGNORE): _run sees the count fall
        # short and replays the chunk, as when the statement raised.  A
        # statement that cannot abort needs no statement journal, which
        # inside the savepoint copies pages each row changes (with the
        # capture table's key indexes, the fast path ran at 40% of its speed).
        if kind == OpKind.INSERT:
            sql = self._insert_sql(table, tuple(first[4]), ignore=True)
        elif kind == OpKind.UPDATE:
            sql = self._update_sql(table, tuple(first[4]), tuple(first[3]) if consolidated else (), ignore=True)
        else:
            sql = self._delete_sql(table)
        if batch.filters and table.name.lower() in batch.filters:
            self._touch(batch, table, run)
        if batch.watched is not None:
            self._watch(batch, table, run)
        pending = batch.pending.get(table.name.lower()) if batch.pending else None
        if pending:
            # Operations on rows with this remote's own pending changes go one
            # by one through _pending_one; the others stay on the fast path.
            fast_run: list = []
            fast_params: list = []
            for op, values in zip(run, params):
                own = pending.get(op[2])
                if own is None:
                    fast_run.append(op)
                    fast_params.append(values)
                    continue
                self._run(table, kind, sql, fast_run, fast_params, batch, consolidated)
                fast_run, fast_params = [], []
                self._pending_one(table, op, own, batch)
            run, params = fast_run, fast_params
        self._run(table, kind, sql, run, params, batch, consolidated)

    def _run(self, table: _Table, kind: int, sql: str, run: list, params: list, batch: _Batch,
             consolidated: bool) -> None:
        # A savepoint journals every existing page a statement changes; past
        # SQLite's in-memory spill size (64 KiB) that journal goes to a temp
        # file, which halves UPDATE speed.  Small chunks stay in memory.
        step = _INSERT_CHUNK if kind == OpKind.INSERT else _CHANGE_CHUNK
        returns = batch.returns
        for start in range(0, len(run), step):
            chunk = params[start:start + step] if len(run) > step else params
            ops = run[start:start + step]
            # A row already going back to the peer takes each later change
            # of the peer's one by one (_one: _origin_changes).
            if not (returns and any((table.name, op[2]) in returns for op in ops)) and self._fast(sql, chunk):
                batch.applied += len(chunk)
                continue
            for op in ops:
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
        if batch.returns:
            self._origin_changes(table, op, batch)
        try:
            if kind == OpKind.INSERT:
                self._insert_one(table, op, batch, consolidated)
            elif kind == OpKind.UPDATE:
                self._update_one(table, op, batch, consolidated)
            elif self._conn.execute(self._delete_sql(table), op[2]).rowcount:
                batch.applied += 1
            else:
                moved = self._moved_key(table, op[2]) if consolidated else None
                if moved is None:
                    self._error(batch, op, "DELETE of a missing row")
                else:
                    self._readdressed(table, (op[0], op[1], moved, op[3], op[4]), batch)
                    self._conn.execute(self._delete_sql(table), moved)
                    batch.applied += 1
        except sqlite3.IntegrityError as error:
            self._error(batch, op, f"constraint failed: {error}")

    @staticmethod
    def _origin_changes(table: _Table, op: tuple, batch: _Batch) -> None:
        """The peer changes again a row that goes back to it (an earlier
        operation of the batch conflicted): the row it will hold when the
        row goes back has that change too, and the row written back must
        carry it as its before-image, or a pending change of the peer's
        equal to the older value would be taken for one the row was written
        with (rule 2)."""
        name_key = (table.name, op[2])
        pending = batch.returns.get(name_key)
        if pending is None or op[1] == OpKind.DELETE:
            return
        pending.origin_row.update(op[4])
        moved = _key_after(table.key_columns, op[2], op[4]) if op[1] == OpKind.UPDATE else op[2]
        if moved != op[2] and (table.name, moved) not in batch.returns:
            batch.returns[(table.name, moved)] = batch.returns.pop(name_key)

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
        elif any(not _same_value(local.get(column), value) for column, value in after.items()):
            # A remote takes the consolidated's row as is.
            self._conn.execute(self._update_sql(table, tuple(after), ()), (*after.values(), *op[2]))
            self._error(batch, op, "INSERT of an existing key: the row was overwritten with the incoming one")
        else:
            batch.applied += 1  # it holds that very row already (a row sent back to it whole)

    def _update_one(self, table: _Table, op: tuple, batch: _Batch, consolidated: bool) -> None:
        conn = self._conn
        key, before, after = op[2], op[3], op[4]
        if consolidated:
            sql = self._update_sql(table, tuple(after), tuple(before))
            params = (*after.values(), *key, *before.values())
        else:
            sql = self._update_sql(table, tuple(after), ())
            params = (*after.values(), *key)
        try:
            count = conn.execute(sql, params).rowcount
        except sqlite3.IntegrityError:
            if consolidated:
                self._refused_move(table, key, after, batch)
                raise
            if not self._take_key(table, sql, params, key, after):
                raise
            self._error(batch, op, _KEY_TAKEN)
            return
        if count:
            batch.applied += 1
            return
        local = self._select(table, key) if consolidated else None
        if local is None and consolidated:
            moved = self._moved_key(table, key)
            if moved is not None:
                # This site gave the row another key before the change arrived: it applies there.
                op = (op[0], op[1], moved, before, after)
                self._readdressed(table, op, batch)
                if conn.execute(sql, (*after.values(), *moved, *before.values())).rowcount:
                    batch.applied += 1
                    return
                local = self._select(table, moved)
                if local is not None and not after.keys().isdisjoint(table.key_columns):
                    # Both gave the row a key: a conflict.  The peer holds the
                    # row under its key, without this site's changes under
                    # the other: the whole result goes back.
                    self._conflict(table, op, local, batch)
                    final = _key_after(table.key_columns, moved, after)
                    if self._select(table, final) is not None:
                        self._send_back(batch, table, final, {**local, **after}, set(table.columns))
                    return
        if local is None:
            self._error(batch, op, "UPDATE of a missing row")
            if consolidated and not after.keys().isdisjoint(table.key_columns):
                moved = _key_after(table.key_columns, key, after)
                if moved != key:
                    batch.stranded[(table.name, moved)] = (
                        table, {**before, **after, **dict(zip(table.key_columns, moved))})
            return
        self._conflict(table, op, local, batch)

    def _refused_move(self, table: _Table, key: tuple, after: dict, batch: _Batch) -> None:
        """At the consolidated: the peer gave row ``key`` a new key that a
        row here holds (this site moved or inserted one there meanwhile); the
        UPDATE fails.  The peer drops its row there when it applies this
        site's change (_take_key), or holds it until then: both rows go back
        whole, the one under the old key as an INSERT (the peer moved it
        away)."""
        moved = _key_after(table.key_columns, key, after)
        if moved == key:
            return
        old, new = self._select(table, key), self._select(table, moved)
        if old is None or new is None:
            return  # another constraint refused it
        columns = set(table.columns)
        self._send_back(batch, table, key, old, columns)
        batch.entered.add((table.name, key))
        self._send_back(batch, table, moved, {**old, **after}, columns)

    def _take_key(self, table: _Table, sql: str, params: tuple, key: tuple, after: dict) -> bool:
        """At a remote: the consolidated gives row ``key`` a new key, which
        this site holds.  The consolidated's log reaches it in order, so
        that row is this site's own doing (it inserted that key, or moved a
        row there) that the consolidated had not applied when it moved its
        row there; it keeps its row and refuses this site's (an INSERT of an
        existing key, sent back whole).  So this site drops its row and
        applies the move.  Whether it did: not when the UPDATE does not
        change the key or still fails (another constraint), which leaves
        everything as it was."""
        moved = _key_after(table.key_columns, key, after)
        if moved == key:
            return False
        conn = self._conn
        conn.execute("SAVEPOINT fieldsync_take_key")
        try:
            conn.execute(self._delete_sql(table), moved)
            conn.execute(sql, params)
        except sqlite3.IntegrityError:
            conn.execute("ROLLBACK TO fieldsync_take_key")
            return False
        finally:
            conn.execute("RELEASE fieldsync_take_key")
        return True

    def _moved_key(self, table: _Table, key: tuple) -> tuple | None:
        """The key this consolidated gave the row that had ``key`` (a row it
        no longer holds): its last captured change of that key, when an
        UPDATE that changed it, followed through further changes of the key
        to one that holds a row.  None when the row was deleted, or the
        change is no longer in the capture table (truncated)."""
        seen = {key}
        for _ in range(_MOVES_FOLLOWED):
            last = None
            for shape_id in self._table_shapes(table):
                index = key_indexes(self._shapes.get(shape_id))[0]
                if len(index.columns) != len(key):
                    continue
                sql = self._sql.get(("last change", index.name))
                if sql is None:
                    match = " AND ".join(f"{column} IS ?" for column in index.columns)
                    sql = self._sql[("last change", index.name)] = (
                        f"SELECT * FROM fieldsync_capture INDEXED BY {index.name} WHERE {index.where} AND {match}"
                        " AND (flags IS NULL OR flags & ? = 0) ORDER BY seq DESC LIMIT 1")
                try:
                    row = self._conn.execute(sql, (*key, FLAG_RETURN_TO_ORIGIN)).fetchone()
                except OverflowError:  # an integer beyond 64 bits, which no row holds
                    return None
                if row is not None and (last is None or row[0] > last[0]):
                    last = row
            if last is None or last[2] != KIND_UPDATE:
                return None
            shape = self._shapes.get(last[1])
            width = len(shape.columns)
            moved = tuple(last[4 + width + position] for position in shape.key_positions)
            if moved in seen:
                return None
            if self._select(table, moved) is not None:
                return moved
            seen.add(moved)
            key = moved
        return None

    def _readdressed(self, table: _Table, op: tuple, batch: _Batch) -> None:
        """Note an operation applied under the key the row has now, for the
        rules that look at the rows a batch touched."""
        if batch.filters and table.name.lower() in batch.filters:
            self._touch(batch, table, [op])
        if batch.watched is not None:
            self._watch(batch, table, [op])

    # --- a remote's own pending changes ---------------------------------------------

    def _own_changes(self, confirmed: int, end: int) -> dict[str, dict[tuple, _Own]]:
        """This remote's own changes in its log after ``confirmed`` (what the
        consolidated has confirmed) up to ``end``, by table and row.  Only log
        transactions of this site are read, and only once while the
        consolidated confirms nothing new: the result is kept and extended by
        the next call (reading a transaction again, after a rolled-back apply
        cut it once more, changes nothing)."""
        conn = self._conn
        kept = self._own_kept
        if kept is not None and kept[0] == confirmed and kept[1] <= end:
            start, pending = kept[1], kept[2]
        else:
            start, pending = confirmed, {}
        spans = conn.execute("SELECT first_seq, commit_offset FROM fieldsync_log WHERE commit_offset > ?"
                             " AND commit_offset <= ? AND origin = ? ORDER BY commit_offset",
                             (start, end, self._site_name)).fetchall()
        self._own_kept = (confirmed, end, pending)
        captured = [row for first, last in spans for row in conn.execute(
            "SELECT * FROM fieldsync_capture WHERE seq >= ? AND seq <= ? ORDER BY seq", (first, last))]
        # The consolidated's changes of the key of pending rows, as applied here.
        moves = conn.execute("SELECT * FROM fieldsync_capture WHERE seq > ? AND seq <= ? AND flags & ? ORDER BY seq",
                             (start, end, FLAG_PENDING_MOVE)).fetchall()
        if moves:
            captured = sorted([*captured, *moves], key=itemgetter(0))
        for row in captured:
            shape = self._shapes.get(row[1])
            rows = pending.setdefault(shape.table.lower(), {})
            columns = shape.columns
            width = len(columns)
            positions = shape.key_positions
            old = row[4:4 + width]
            old_key = tuple(old[i] for i in positions)
            kind = row[2]
            if row[3] and row[3] & FLAG_PENDING_MOVE:
                new = row[4 + width:4 + 2 * width]
                _rekey(rows, old_key, tuple(new[i] for i in positions))
            elif kind == KIND_INSERT:
                own = _own_entry(rows, old_key, row[0])
                own.values = dict(zip(columns, old))
                own.seqs = dict.fromkeys(columns, row[0])
                own.deleted = False
                own.moved_to = None
            elif kind == KIND_DELETE:
                own = _own_entry(rows, old_key, row[0])
                own.values = {}
                own.seqs = {}
                own.deleted = True
                own.moved_to = None
            else:
                new = row[4 + width:4 + 2 * width]
                new_key = tuple(new[i] for i in positions)
                changed = {column: after for column, before, after in zip(columns, old, new)
                           if not (type(before) is type(after) and before == after)}
                if new_key != old_key:
                    # Its values go with it; they are its own where it wrote them.
                    gone = _own_entry(rows, old_key, row[0])
                    moved_values = {column: value for column, value in gone.values.items()
                                    if column not in changed}
                    seqs = {**{column: gone.seqs[column] for column in moved_values},
                            **dict.fromkeys(changed, row[0])}
                    gone.values = {}
                    gone.seqs = {}
                    gone.deleted = True
                    gone.moved_to = new_key
                    own = _own_entry(rows, new_key, row[0])
                    own.values = {**moved_values, **changed}
                    own.seqs = seqs
                    own.moved_to = None
                else:
                    own = _own_entry(rows, old_key, row[0])
                    own.values.update(changed)
                    own.seqs.update(dict.fromkeys(changed, row[0]))
                own.deleted = False
        return pending

    def _pending_one(self, table: _Table, op: tuple, own: _Own, batch: _Batch) -> None:
        """Apply an operation of the consolidated to a row this remote changed
        itself and the consolidated has not confirmed.

        The consolidated applies those changes after every operation it wrote
        without them, and sends the outcome back if they conflict.  So the
        remote keeps a value it wrote and still holds when the operation's
        before-image shows it was written without that value; a DELETE
        written so is marked, and an INSERT of the row that follows gets the
        remote's values; a row the remote deleted stays deleted.  A row in
        this state is not an error when it is missing or present: the
        consolidated settles it.
        """
        problem = operation_problem(op)
        if problem is not None:
            self._error(batch, op, f"malformed operation: {problem}")
            return
        conn = self._conn
        kind, key, before, after = op[1], op[2], op[3], op[4]
        local = self._select(table, key)
        if local is None and kind != OpKind.DELETE and own.moved_to is not None:
            # This site gave the row another key: the UPDATE or INSERT,
            # written before the consolidated applied that, concerns the row
            # there (the consolidated applies the move to the row the INSERT
            # re-created).  Not a DELETE: the consolidated may re-create the
            # row under its old key after it, and apply the move to that row.
            rows = batch.pending[table.name.lower()]
            for _ in range(_MOVES_FOLLOWED):
                if own.moved_to is None or own.moved_to not in rows:
                    break
                key = own.moved_to
                own = rows[key]
                local = self._select(table, key)
                if local is not None:
                    break
        try:
            if kind == OpKind.INSERT:
                if local is not None and key != op[2]:
                    # Re-created under the key this site moved the row away
                    # from: its values, but the key and this site's own.
                    written = {column: value for column, value in after.items()
                               if column in table.column_set and column not in table.key_columns
                               and not (column in own.values and _sqlite_equal(local[column], own.values[column]))}
                    if written:
                        conn.execute(self._update_sql(table, tuple(written), ()), (*written.values(), *key))
                elif local is not None:
                    pass  # its own row: the consolidated settles it (created on both sides, or sent back whole)
                elif not own.deleted:
                    values = dict(after)
                    if own.values:
                        for column in self._deleted_without(table, key, own):
                            if column in table.column_set:
                                values[column] = own.values[column]
                    conn.execute(self._insert_sql(table, tuple(values), ignore=False), tuple(values.values()))
            elif local is None:
                pass  # gone here, by its own DELETE or one written without its change
            elif kind == OpKind.UPDATE:
                held = _held(table, own, local, before, after)
                written = {column: value for column, value in after.items() if column not in held}
                if written:
                    sql, params = self._update_sql(table, tuple(written), ()), (*written.values(), *key)
                    taken = False
                    try:
                        conn.execute(sql, params)
                    except sqlite3.IntegrityError:
                        if not self._take_key(table, sql, params, key, written):
                            raise
                        taken = True
                    moved = _key_after(table.key_columns, key, written)
                    if moved != key:
                        self._moved_pending(table, batch, local, written, key, moved)
                    if taken:
                        self._error(batch, op, _KEY_TAKEN)
                        return
            else:
                concurrent = {column: before[column] for column in own.values
                              if _holds_own(own, local, before, column)}
                conn.execute(self._delete_sql(table), key)
                shape = table.shape
                if shape is not None:
                    self._capture_delete(shape, local, concurrent)
        except sqlite3.IntegrityError as error:
            self._error(batch, op, f"constraint failed: {error}")
            return
        batch.applied += 1

    def _moved_pending(self, table: _Table, batch: _Batch, local: dict, written: dict, key: tuple,
                       moved: tuple) -> None:
        """The consolidated gave a row with this site's pending changes another
        key: they stay pending under it, for the rest of the batch and (by
        the FLAG_PENDING_MOVE row captured here, which _own_changes reads)
        until the consolidated confirms them."""
        shape = table.shape
        if shape is None:
            return
        name = table.name.lower()
        rows = batch.pending[name] = dict(batch.pending[name])  # the cached one stays as the log has it
        _rekey(rows, key, moved)
        values = [local.get(column) for column in shape.columns]
        values += [written.get(column, local.get(column)) for column in shape.columns]
        if self._skips_capture:
            write_capture_row(self._conn, shape, KIND_UPDATE, FLAG_PENDING_MOVE, values)
        else:
            self._conn.execute("UPDATE fieldsync_capture SET flags = ? WHERE seq = (SELECT max(seq) FROM"
                               " fieldsync_capture) AND kind = ? AND shape = ?",
                               (FLAG_PENDING_MOVE, KIND_UPDATE, shape.id))

    def _capture_delete(self, shape: Shape, local: dict, concurrent: dict) -> None:
        """Record a DELETE of a row with pending changes, for _deleted_without.
        When it was written without this site's values (``concurrent``: the
        consolidated's values there), the captured row is marked and its
        unused second half holds the row with those values."""
        conn = self._conn
        marked = bool(concurrent) and all(column in shape.columns for column in concurrent)
        values = [local.get(column) for column in shape.columns]
        if marked:
            values += [concurrent.get(column, local.get(column)) for column in shape.columns]
        if self._skips_capture:  # the trigger did not capture it
            write_capture_row(conn, shape, KIND_DELETE, FLAG_CONCURRENT_DELETE if marked else None, values)
        elif marked:
            width = len(shape.columns)
            assignments = ", ".join(f"v{width + index} = ?" for index in range(width))
            conn.execute(f"UPDATE fieldsync_capture SET flags = ?, {assignments} WHERE seq = (SELECT max(seq)"
                         " FROM fieldsync_capture) AND kind = ? AND shape = ?",
                         (FLAG_CONCURRENT_DELETE, *values[width:], KIND_DELETE, shape.id))

    def _deleted_without(self, table: _Table, key: tuple, own: _Own) -> set[str]:
        """The columns of ``own`` in which the last DELETE of row ``key``
        applied here after ``own.seq`` was written without this site's own
        value (empty unless that DELETE is marked FLAG_CONCURRENT_DELETE):
        those marked, and, as for an UPDATE (_held), every column this site
        wrote in the change they show it was written without or a later one
        and still held when the DELETE came."""
        since = own.seq
        shapes = self._table_shapes(table)
        if not shapes:
            return set()
        cursor = self._conn.execute(
            f"SELECT * FROM fieldsync_capture WHERE seq > ? AND kind = ? AND shape IN ({', '.join('?' * len(shapes))})"
            " ORDER BY seq DESC", (since, KIND_DELETE, *shapes))
        try:
            for row in cursor:
                shape = self._shapes.get(row[1])
                if tuple(row[4 + i] for i in shape.key_positions) != key:
                    continue
                if not (row[3] or 0) & FLAG_CONCURRENT_DELETE:
                    return set()
                width = len(shape.columns)
                deleted = dict(zip(shape.columns, row[4:4 + width]))
                marked = {column for index, column in enumerate(shape.columns)
                          if column in own.values and not _sqlite_equal(row[4 + index], row[4 + width + index])}
                return marked | _written_with(table, own, marked, deleted)
        finally:
            cursor.close()
        return set()

    def _table_shapes(self, table: _Table) -> tuple[int, ...]:
        shapes = self._shape_ids.get(table.name.lower())
        if shapes is None:
            shapes = tuple(row[0] for row in self._conn.execute(
                "SELECT id FROM fieldsync_shape WHERE table_name = ? COLLATE NOCASE ORDER BY id", (table.name,)))
            self._shape_ids[table.name.lower()] = shapes
        return shapes

    # --- the consolidated's operations its peer has not confirmed ---------------------

    def _unconfirmed_for(self, peer: str, confirmed: int, end: int) -> bool:
        """Whether the log holds, in ``(confirmed, end]``, operations ``peer``
        may receive: of another origin, or written back to it.  A stretch
        found to hold only the peer's own transactions is remembered, so a
        remote whose own transactions pile up unconfirmed (it receives
        nothing) does not have them read again at every batch."""
        if end <= confirmed:
            return False
        start = confirmed
        known = self._own_runs.get(peer)
        if known is not None and known[0] <= confirmed <= known[1] <= end:
            start = known[1]
        conn = self._conn
        if conn.execute("SELECT 1 FROM fieldsync_log WHERE commit_offset > ? AND commit_offset <= ? AND origin != ?"
                        " LIMIT 1", (start, end, peer)).fetchone():
            return True
        # Every transaction there is the peer's: any row written back in it is for the peer.
        if conn.execute("SELECT 1 FROM fieldsync_returned WHERE seq > ? AND seq <= ? LIMIT 1",
                        (start, end)).fetchone():
            return True
        # Committed log rows never change (this apply has written none yet
        # but a cut of local changes, whose origin is this site).
        self._own_runs[peer] = (confirmed, end)
        return False

    @staticmethod
    def _watch(batch: _Batch, table: _Table, run: list) -> None:
        """Remember the rows the peer changed and the values it wrote (under
        the key the row has afterwards too, when an UPDATE changed it)."""
        watched = batch.watched
        assert watched is not None
        holds = batch.holds
        name = table.name
        key_columns = table.key_columns
        for op in run:
            key, after = op[2], op[4]
            entry = watched.get((name, key))
            if entry is None:
                entry = watched[(name, key)] = (table, {})
            holds[(name, key)] = after is not None
            if after:
                entry[1].update(after)
                if not after.keys().isdisjoint(key_columns):
                    moved = _key_after(key_columns, key, after)
                    if moved != key:
                        watched.setdefault((name, moved), (table, {}))[1].update(entry[1])
                        # Keyed by the key the row had before the batch.
                        first = batch.origins.pop((name, key), key)
                        batch.origins[(name, moved)] = first
                        batch.moved[(name, first)] = moved
                        holds[(name, key)] = False
                        holds[(name, moved)] = True

    def _send_back_unconfirmed(self, identity: SiteIdentity, batch: _Batch, confirmed: int, end: int) -> None:
        """The unconfirmed rule.  A row the batch changed may end up different
        at the peer when the log holds, in ``(confirmed, end]``, operations on
        it that the peer receives: they may reach the peer after its change.
        Such a row's state after the batch goes back to the peer, after them
        (written by _write_returns).  Records in ``batch.received`` the kind
        and image of the last such operation per row, as the peer sees it.

        Keys make two more cases.  Where the peer holds no row under a key
        after its batch (it deleted the row or gave it another key), an
        operation on that key misses at the peer: it counts as a DELETE
        there unless it is an INSERT.  And an operation that gives a row the
        batch touched another key (old -> new) brings the new key in: the
        peer holds the row there when it held it under the old key
        (otherwise it missed the move and lacks the row), so the new key's
        operations after the move are looked up as well.  Last, a row whose
        key the batch changed, while operations on its old key reach the
        peer and miss it there, goes back whole under its new key.

        Costs lookups by key for the rows the batch touched and the
        operations on them, whatever the length of ``(confirmed, end]``."""
        watched = batch.watched
        assert watched is not None
        reader: SubscriberReader | None = None
        received = batch.received
        holds = batch.holds
        absent = {name_key for name_key, held in holds.items() if not held}
        since: dict[tuple[str, tuple], int] = {}  # keys brought in by a move: operations after it
        transaction = (1, 0, "")  # the log transaction of the last row looked at: (first seq, commit, origin)
        by_table: dict[str, tuple[_Table, set[tuple]]] = {}
        for (name, key), (table, _values) in watched.items():
            by_table.setdefault(name, (table, set()))[1].add(key)
        while by_table:
            brought: dict[str, tuple[_Table, set[tuple]]] = {}
            for name, (table, keys) in by_table.items():
                for row in self._rows_of_keys(table, keys, confirmed, end):
                    seq = row[0]
                    shape = self._shapes.get(row[1])
                    width = len(shape.columns)
                    old_key = tuple(row[4 + i] for i in shape.key_positions)
                    new_key = (tuple(row[4 + width + i] for i in shape.key_positions) if row[2] == KIND_UPDATE
                               else old_key)
                    hits = [key for key in {old_key, new_key} if key in keys and seq > since.get((name, key), 0)]
                    if not hits:
                        continue
                    if not transaction[0] <= seq <= transaction[1]:
                        found = self._conn.execute(
                            "SELECT first_seq, commit_offset, origin FROM fieldsync_log WHERE commit_offset >= ?"
                            " ORDER BY commit_offset LIMIT 1", (seq,)).fetchone()
                        if found is None or found[1] > end:
                            continue
                        transaction = found
                    if reader is None:
                        reader = SubscriberReader.from_database(self._conn, identity, self._shapes, batch.peer)
                    op = reader.operation(transaction[2], row)
                    if op is None:
                        continue  # the peer does not receive it: its own, or outside its subset
                    image = op[4] if op[4] is not None else op[3]
                    moves = op[1] == OpKind.UPDATE and old_key != new_key
                    for key in hits:
                        kind = op[1]
                        if moves:
                            kind = OpKind.DELETE if key == old_key else OpKind.INSERT
                        if (name, key) in absent:
                            if kind == OpKind.INSERT:
                                absent.discard((name, key))
                            else:
                                kind = OpKind.DELETE  # it misses there
                        received[(name, key)] = (kind, image)
                    if moves and old_key in hits and new_key not in keys:
                        # A move of a row the batch touched: the new key, and what follows it there.
                        values = watched[(name, old_key)][1]
                        watched[(name, new_key)] = (table, {column: value for column, value in values.items()
                                                            if column not in table.key_columns})
                        since[(name, new_key)] = seq
                        if (name, old_key) in absent:
                            absent.add((name, new_key))
                            received[(name, new_key)] = (OpKind.DELETE, image)
                        else:
                            received[(name, new_key)] = (OpKind.INSERT, image)
                        brought.setdefault(name, (table, set()))[1].add(new_key)
            by_table = brought
        whole = set()
        for (name, old_key), new_key in batch.moved.items():
            if (name, old_key) in received and holds.get((name, new_key)):
                whole.add((name, new_key))
                if (name, new_key) not in received:
                    received[(name, new_key)] = (OpKind.UPDATE, dict(watched[(name, new_key)][1]))
        for name_key in received:
            table, values = watched[name_key]
            result = self._select(table, name_key[1])
            if result is not None:
                columns = set(table.columns) if name_key in whole or not values else set(values)
                self._send_back(batch, table, name_key[1], {**result, **values}, columns)

    def _rows_of_keys(self, table: _Table, keys: set[tuple], after: int, until: int) -> list[tuple]:
        """Capture rows of ``table`` in ``(after, until]`` whose old key or, for
        an UPDATE that changed it, new key is one of ``keys`` (SQLite's
        ``IS``: NULL matches NULL, 1 matches 1.0), in seq order.  Found
        through the key indexes of the table's shapes (capture.key_indexes),
        so the cost follows the keys and their rows, not the range."""
        found: dict[int, tuple] = {}
        for shape_id in self._table_shapes(table):
            for index in key_indexes(self._shapes.get(shape_id)):
                # A key of another length than the shape's matches none of its rows.
                probes = [key for key in keys if len(key) == len(index.columns)]
                for start in range(0, len(probes), _PROBE_CHUNK):
                    probe = probes[start:start + _PROBE_CHUNK]
                    try:
                        rows = self._probe(index, probe, after, until)
                    except OverflowError:  # an integer beyond 64 bits, which no row holds
                        rows = self._probe(index, [key for key in probe if all(value_problem(part) is None
                                                                               for part in key)], after, until)
                    found.update((row[0], row) for row in rows)
        return [found[seq] for seq in sorted(found)]

    def _probe(self, index: KeyIndex, keys: list[tuple], after: int, until: int) -> list[tuple]:
        """Capture rows in ``(after, until]`` that ``index`` holds under one of
        ``keys`` (each as long as the index)."""
        if not keys:
            return []
        cache_key = ("probe", index.name, len(keys))
        sql = self._sql.get(cache_key)
        if sql is None:
            probe = ", ".join(f"k{position}" for position in range(len(index.columns)))
            values = ", ".join([f"({', '.join('?' * len(index.columns))})"] * len(keys))
            match = " AND ".join(f"{column} IS k{position}" for position, column in enumerate(index.columns))
            # INDEXED BY: a plan without the index would read the whole range.
            sql = (f"WITH probe ({probe}) AS (VALUES {values}) SELECT fieldsync_capture.* FROM probe,"
                   f" fieldsync_capture INDEXED BY {index.name} WHERE {index.where} AND {match}"
                   " AND seq > ? AND seq <= ?")
            self._sql[cache_key] = sql
        return self._conn.execute(sql, (*(part for key in keys for part in key), after, until)).fetchall()

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
        final_key = _key_after(table.key_columns, key, written)
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
        key the row has afterwards), and those its UPDATEs bring into its
        subset from outside it."""
        key_columns = table.key_columns
        filtered_by, values = batch.filters[table.name.lower()]
        for op in run:
            before, after = op[3], op[4]
            key = op[2]
            if after is not None and any(column in after for column in key_columns):
                key = _key_after(key_columns, key, after)
            batch.touched[(table.name, key)] = table
            if (op[1] == OpKind.UPDATE and filtered_by in after and filtered_by in before
                    and before[filtered_by] not in values and after[filtered_by] in values):
                batch.entered.add((table.name, key))

    def _write_returns(self, batch: _Batch) -> None:
        """Capture what goes back to the batch's origin, each row only to it.
        Written once the whole batch is applied, so each holds the row's
        state after the batch, and a row that left the subset and came back
        within the batch causes nothing.  Per row, by what the origin may
        hold when this reaches it:

        * gone here, while an operation on its way gives the row to the
          origin: a DELETE;
        * outside the origin's subset (or gone) here, while the origin may
          hold it (it changed it, and no operation on its way deletes it
          there): a DELETE;
        * in its subset, while the origin may not hold it (an operation on its
          way deletes it there, or the origin moved it into its subset and a
          DELETE sent when it left may still reach it): the whole row;
        * otherwise, for a row of ``batch.returns`` (conflicts, the
          unconfirmed rule; see _send_back): an UPDATE of the listed columns.
        """
        received = batch.received
        for name_key, (table, image) in batch.stranded.items():
            # The peer moved a row this site had deleted (or moved itself,
            # to a key that no longer holds it): it goes at the peer too.
            shape = table.shape
            if shape is not None and name_key not in received and self._select(table, name_key[1]) is None:
                self._write_return(shape, KIND_DELETE, [image.get(column) for column in shape.columns])
        keys = dict.fromkeys([*batch.returns, *batch.entered, *received, *batch.touched])
        for name_key in keys:
            pending = batch.returns.get(name_key)
            if pending is not None:
                table = pending.table
            elif name_key in batch.touched:
                table = batch.touched[name_key]
            else:
                table = batch.watched[name_key][0]  # type: ignore[index]
            shape = table.shape
            if shape is None:
                continue  # the table is not published here: nothing goes anywhere
            key = name_key[1]
            result = self._select(table, key)
            last = received.get(name_key)
            deleted_there = last is not None and last[0] == OpKind.DELETE
            if result is None:
                if last is not None and not deleted_there:
                    image = {**last[1], **dict(zip(table.key_columns, key))}
                    self._write_return(shape, KIND_DELETE, [image.get(column) for column in shape.columns])
                continue  # otherwise the origin deleted it too, or an operation on its way does
            filtered = batch.filters.get(table.name.lower())
            if filtered is not None and result.get(filtered[0]) not in filtered[1]:
                if not deleted_there and (pending is not None or name_key in batch.touched):
                    self._write_return(shape, KIND_DELETE, [result.get(column) for column in shape.columns])
                continue
            if deleted_there or name_key in batch.entered:
                self._write_return(shape, KIND_INSERT, [result.get(column) for column in shape.columns])
            elif pending is not None:
                values = [pending.origin_row.get(column) for column in shape.columns]
                values += [result.get(column) for column in shape.columns]
                self._write_return(shape, KIND_UPDATE, values, pending.columns & set(shape.columns))

    def _write_return(self, shape: Shape, kind: int, values: list, columns: Iterable[str] = ()) -> None:
        """Write one capture row for the batch's origin only.  Each gets a
        fieldsync_returned row (the columns an UPDATE sends back), which is
        also how _unconfirmed_for finds them without a scan."""
        seq = write_capture_row(self._conn, shape, kind, FLAG_RETURN_TO_ORIGIN, values)
        self._conn.execute("INSERT INTO fieldsync_returned (seq, columns) VALUES (?, ?)",
                           (seq, json.dumps(sorted(columns))))

    # --- records and SQL ------------------------------------------------------------

    def _select(self, table: _Table, key: tuple) -> dict | None:
        sql = self._sql.get(("select", table.name))
        if sql is None:
            columns = ", ".join(quote_ident(column) for column in table.columns)
            sql = f"SELECT {columns} FROM {table.quoted} WHERE {table.where_key}"
            self._sql[("select", table.name)] = sql
        try:
            row = self._conn.execute(sql, key).fetchone()
        except OverflowError:  # an integer beyond 64 bits: no row has that key
            return None
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
            sql = (f"INSERT{' OR IGNORE' if ignore and table.or_ignore else ''} INTO {table.quoted} ({names})"
                   f" VALUES ({', '.join('?' * len(columns))})"
                   + (" ON CONFLICT DO NOTHING" if ignore and not table.or_ignore else ""))
            self._sql[cache_key] = sql
        return sql

    def _update_sql(self, table: _Table, after: tuple[str, ...], before: tuple[str, ...],
                    ignore: bool = False) -> str:
        cache_key = ("update", table.name, after, before, ignore)
        sql = self._sql.get(cache_key)
        if sql is None:
            assignments = ", ".join(f"{quote_ident(column)} = ?" for column in after)
            checks = "".join(f" AND {quote_ident(column)} IS ?" for column in before)
            sql = (f"UPDATE{' OR IGNORE' if ignore and table.or_ignore else ''} {table.quoted} SET {assignments}"
                   f" WHERE {table.where_key}{checks}")
            self._sql[cache_key] = sql
        return sql

    def _delete_sql(self, table: _Table) -> str:
        cache_key = ("delete", table.name)
        sql = self._sql.get(cache_key)
        if sql is None:
            sql = f"DELETE FROM {table.quoted} WHERE {table.where_key}"
            self._sql[cache_key] = sql
        return sql


def _own_entry(rows: dict[tuple, _Own], key: tuple, seq: int) -> _Own:
    own = rows.get(key)
    if own is None:
        own = rows[key] = _Own(seq)
    own.seq = seq
    return own


def _key_after(key_columns: tuple[str, ...], key: tuple, values: Mapping[str, Any]) -> tuple:
    """The key a row with ``key`` has once ``values`` (column -> value) are written."""
    return tuple(values.get(column, part) for column, part in zip(key_columns, key))


def _rekey(rows: dict[tuple, _Own], key: tuple, moved: tuple) -> None:
    """Pending changes of the row at ``key`` now belong to the row at ``moved``."""
    own = rows.pop(key, None)
    if own is not None and not own.deleted:
        rows[moved] = own


def _held(table: _Table, own: _Own, local: dict, before: dict, after: dict) -> set[str]:
    """The columns of an UPDATE of the consolidated's in which the remote
    keeps its own pending value.  Those where the before-image shows the
    UPDATE was written without it (_holds_own); and then, since the
    consolidated applies the remote's changes in order, every column the
    remote wrote in that change or a later one and still holds, even where
    the before-image happens to show the same value (the remote wrote a
    column back to an older value: A to B to A)."""
    held = {column for column in after if _holds_own(own, local, before, column)}
    return held | {column for column in _written_with(table, own, held, local) if column in after}


def _written_with(table: _Table, own: _Own, held: set[str], row: dict) -> set[str]:
    """The columns (not of the key) that this remote wrote, pending, in the
    change that set one of ``held`` or a later one, and that ``row`` still
    holds as it wrote them.  The consolidated applies a remote's changes in
    order: an operation written without one of them was written without
    those too."""
    if not held:
        return set()
    cut = min(own.seqs.get(column, own.seq) for column in held)
    return {column for column, value in own.values.items()
            if column in row and column not in table.key_columns and own.seqs.get(column, 0) >= cut
            and _sqlite_equal(row[column], value)}


def _holds_own(own: _Own, local: dict, before: dict | None, column: str) -> bool:
    """Whether the remote still holds its own pending value of ``column`` and
    the incoming operation was written without it (its before-image differs
    there): then the consolidated applies the remote's value after it."""
    if column not in own.values or column not in local or not before or column not in before:
        return False
    value = local[column]
    return _sqlite_equal(value, own.values[column]) and not _sqlite_equal(before[column], value)


def _same_value(left: object, right: object) -> bool:
    """Exactly the same stored value (type and content; -0.0 is not 0.0)."""
    if type(left) is not type(right):
        return False
    if type(left) is float and left == right:
        return math.copysign(1.0, left) == math.copysign(1.0, right)  # type: ignore[arg-type]
    return left == right


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

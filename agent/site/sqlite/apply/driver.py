"""Applying a peer's transactions: the batch driver and its fast path.

Rules of this file:
* One call applies a batch and sets the peer's ``log_received`` in one
  SQLite write transaction: a crash anywhere leaves all of it or none of it.
* Local changes committed before the batch are first cut into their own log
  transaction; then each applied transaction is cut into a log transaction
  whose origin is the peer (through agent.site.sqlite.log).  A log transaction
  never mixes origins.  At the consolidated the capture triggers see
  applied rows like any other write; at a remote they skip them (a row in
  ``fieldsync_applying`` marks the apply's writes; see
  capture.install_capture).
* A bad operation never stops the batch: INSERT of an existing key,
  UPDATE/DELETE of a missing row, a constraint failure, a malformed
  operation or an unknown table/column is recorded in
  ``fieldsync_apply_error`` and the rest goes on.  Only problems with the
  batch as a whole (offsets going backwards, out of order) or with the
  database itself abort it.  An operation a foreign key refuses waits for
  the end of its transaction first (batch.set_aside, _settle): the order
  of parents and children within a transaction does not matter.
* The rules live in their own modules, each an object the driver holds
  and calls (no rule calls the driver): statements (tables, SQL, apply
  errors), key moves, conflicts (and what goes back), unconfirmed,
  pending, followers (rows that follow their parent); batch holds the
  values they share.  A batch goes: check the peer and offsets, refresh
  the statements, cut local changes, set up the batch (the peer's filters
  and the unconfirmed rule at the consolidated, the pending rows at a
  remote), apply each transaction (fast path, else one operation at a time
  through the rules; at a remote, then put back its own rows that went
  with a parent the transaction sent again), send back by the unconfirmed
  rule, write what goes back, record ``log_received``.
* A schema change (codec.changes) is a transaction of its own: at a
  remote, schema.SchemaSteps runs it between the transactions before and
  after it; the consolidated makes changes, it never receives one.  At
  the consolidated, a remote's operations that name columns a change
  renamed or dropped since are reshaped (reshape.Reshape) before they
  are applied.
* Fast path: consecutive operations with the same table, kind and columns
  run as one ``executemany`` inside a savepoint; if any row of it did not
  go as planned, the savepoint is rolled back and the run is replayed one
  operation at a time with the full checks.
"""

from __future__ import annotations

import sqlite3
from datetime import datetime
from itertools import chain
from operator import itemgetter
from typing import Iterable

from codec.changes import PASSTHROUGH
from codec.ops import OpKind, Operation, Run, Transaction, change_of

from ...apply.batch import (ApplyResult, Batch, ConflictHook, KEY_TAKEN, key_after, same_value, send_back, set_aside,
                            settle, strand, touch, touch_rows, watch)
from ...apply.checks import applies, skip_bound
from ...apply.conflicts import kept_local_row
from ...apply.keymoves import origin_changes, readdressed
from ...clock import utc_now
from ...errors import ApplyRefused
from ...identity import Role, SiteIdentity
from ...values import operation_problem
from .._db import format_time
from ..capture import ShapeCache
from ..log import cut_locked
from ..remotes import get_remote
from .conflicts import Conflicts
from .followers import Followers
from .keymoves import KeyMoves
from .pending import Pending
from .reshape import Reshape
from .schema import SchemaSteps
from .statements import SqliteTable, Statements, refused_by_key
from .unconfirmed import Unconfirmed

_VALUE_TYPES = frozenset({type(None), int, float, str, bytes})


_OP_TYPES = frozenset({tuple, Operation})

_KEY = itemgetter(2)
_BEFORE = itemgetter(3)
_AFTER = itemgetter(4)
_values_of = dict.values


class _Operations:
    """The operations of a run, made from its rows only for the slices
    taken (the fast path never takes one)."""

    __slots__ = ("run",)

    def __init__(self, run: Run) -> None:
        self.run = run

    def __len__(self) -> int:
        return len(self.run.rows)

    def __getitem__(self, index: slice) -> list[tuple]:
        return self.run._replace(rows=self.run.rows[index]).operations()


def _plain_values(run: list, params: list, kind: int, consolidated: bool) -> bool:
    """Whether every value of a run's operations (keys and images) is one
    of SQLite's storage classes, checked in C: what the statement binds
    (``params``) and what it does not but the batch's bookkeeping reads."""
    plain = _VALUE_TYPES.issuperset
    if not plain(map(type, chain.from_iterable(params))):
        return False
    if kind == OpKind.INSERT:
        return plain(map(type, chain.from_iterable(map(_KEY, run))))
    if kind == OpKind.DELETE or not consolidated:
        return plain(map(type, chain.from_iterable(map(_values_of, map(_BEFORE, run)))))
    return True


# A run of one statement is flushed at this many operations, so that the
# operations of a transaction read as they are applied are never all held.
_RUN_LIMIT = 5_000
# Operations per savepoint on the fast path (see _flush_checked).
_INSERT_CHUNK = 500


_CHANGE_CHUNK = 50



class Applier:
    """Applies batches on one connection: the driver, holding each rule."""

    def __init__(self, conn: sqlite3.Connection, shapes: ShapeCache) -> None:
        self._conn = conn
        # Conflict hooks by lower-case table (None: every other table); the
        # site adapter sets them, the conflicts rule reads them.
        self.hooks: dict[str | None, ConflictHook] = {}
        self._statements = statements = Statements(conn, shapes)
        self._key_moves = key_moves = KeyMoves(conn, shapes, statements)
        self._conflicts = Conflicts(conn, statements, self.hooks)
        self._unconfirmed = Unconfirmed(conn, shapes, statements)
        self._pending = Pending(conn, shapes, statements, key_moves)
        self._schema = SchemaSteps(conn, statements)
        self._reshape = Reshape(conn)
        self._followers = Followers(conn, shapes, statements)

    def apply_locked(self, identity: SiteIdentity, peer: str, transactions: Iterable[Transaction],
                     log_received: int, *, messages: int, peer_incarnation: bytes | None,
                     now: datetime | None, skip_through: int | None = None) -> ApplyResult:
        """Apply ``transactions`` from ``peer``, skipping those with a commit
        at or below ``skip_through`` (None: the recorded log_received; see
        SiteDatabase.apply); the caller holds the write transaction and
        commits it when this returns.  ``now`` stamps ``last_received_at``,
        the conflicts and the apply errors (None: utc_now(), for a caller
        outside an agent's run; the agent passes its clock's time)."""
        conn = self._conn
        remote = get_remote(conn, peer)
        skip_through = skip_bound(peer, remote, log_received, messages, peer_incarnation, skip_through)
        statements = self._statements
        statements.refresh()
        end = cut_locked(conn, identity.name)
        consolidated = identity.role is Role.CONSOLIDATED
        if consolidated:
            self._reshape.refresh()
        batch = Batch(peer, format_time(now or utc_now()))
        # Offsets of this site's log that the peer has not confirmed: at the
        # consolidated, operations the peer may receive after the changes in
        # this batch; at a remote, its own changes still pending.
        confirmed, unconfirmed_end = remote.confirm_sent, end
        # Before the transactions, what the rules need of the batch: at the
        # consolidated, the peer's subset (conflicts: what goes back) and
        # whether the unconfirmed rule watches the rows; at a remote, its
        # pending rows.
        if consolidated:
            batch.filters = self._conflicts.filters(peer)
            if self._unconfirmed.any_unconfirmed(peer, confirmed, end):
                batch.watched = {}
        else:
            # A copy: Pending.apply_one changes it for the batch (see Pending._moved_pending).
            batch.pending = dict(self._pending.own_changes(identity.name, confirmed, end))
        # At a remote, the capture triggers skip what is written from here on
        # (see capture.install_capture); the row goes again before the commit.
        marked = not consolidated and statements.skips_capture
        if marked:
            conn.execute("INSERT INTO fieldsync_applying (id) VALUES (1)")
        applied = skipped = 0
        previous = skip_through
        commits: list[int] = []
        pending_after = confirmed  # what the pending rows are read after (Pending.confirmed_for)
        for transaction in transactions:
            commit = transaction.commit
            if not applies(peer, commit, previous, skip_through, log_received):
                skipped += 1  # applied before (a confirmation was lost)
                continue
            previous = commit
            batch.commit = commit
            if not consolidated and transaction.applied is not None:
                after = Pending.confirmed_for(transaction, identity.name, pending_after, remote.log_sent)
                if after > pending_after:
                    pending_after = after
                    batch.pending = dict(self._pending.own_changes(identity.name, after, end))
            change = change_of(transaction)
            if change is not None:
                if consolidated:
                    raise ApplyRefused(f"transaction {commit} from {peer!r} is a schema change: a remote makes "
                                       "none; nothing applied")
                self._schema.apply(peer, commit, change, batch.now, own=identity.name)
                if batch.pending:
                    self._pending.renamed(batch.pending, change)
                if change.steps[0][0] == PASSTHROUGH:  # its writes are this site's own changes
                    end = cut_locked(conn, identity.name, end)
                applied += 1
                continue
            ops = transaction.ops
            if consolidated and (self._reshape.renames or self._reshape.removed):  # since the peer logged them
                ops = self._reshape.tables(ops, statements.published)
            self._apply_operations(ops, batch, consolidated)
            if batch.deferred:
                self._settle(batch, consolidated)
            if batch.parents_back:
                self._followers.restore(batch)
            applied += 1
            cut = cut_locked(conn, peer, end)
            if cut > end:
                commits.append(cut)
                end = cut
        # After them: the unconfirmed rule adds its rows to what goes back,
        # then all of it is written, in one more log transaction.
        if batch.watched:
            self._unconfirmed.send_back(identity, batch, confirmed, unconfirmed_end)
        if batch.returns or batch.touched or batch.received or batch.stranded:
            self._conflicts.write_returns(batch)
            # The peer's offset this apply reached goes with the rows written
            # back to it (docs/protocol.md, "What a data message says of the
            # recipient's own changes").
            cut = cut_locked(conn, peer, end, applied=log_received if consolidated else None)
            if cut > end:
                commits.append(cut)
        if marked:
            conn.execute("DELETE FROM fieldsync_applying")
        conn.execute(
            "UPDATE fieldsync_remote SET log_received = ?, receive_count = receive_count + ?, last_received_at = ?,"
            " peer_incarnation = coalesce(peer_incarnation, ?) WHERE name = ?",
            (log_received, messages, batch.now, peer_incarnation, peer))
        return ApplyResult(peer, log_received, applied, skipped, batch.applied, batch.conflicts, batch.errors,
                           tuple(commits))

    def _apply_operations(self, ops: tuple, batch: Batch, consolidated: bool) -> None:
        # Group consecutive operations of one table, kind and column list into
        # runs, building their statement parameters on the way (this loop is
        # the adapter's hot path).  The checks here are the structural ones;
        # the values of a run are checked at once, in C, when it is flushed
        # (_flush), column names per run against the table, integer ranges by
        # SQLite's binding (an overflow sends the run down the slow path,
        # which checks every operation fully).
        run: list = []
        params: list = []
        signature: tuple | None = None
        for op in ops:
            if type(op) is Run:
                self._flush(run, params, batch, consolidated)
                run, params, signature = [], [], None
                self._apply_run(op, batch, consolidated)
                continue
            mine = None
            if type(op) in _OP_TYPES and len(op) == 5:
                table, kind, key, before, after = op
                if type(table) is str and type(key) is tuple and key and type(kind) is int:
                    if kind == 1:  # INSERT
                        if before is None and type(after) is dict:
                            mine = (table, 1, len(key), *after)
                            values = (*after.values(),)
                    elif kind == 2:  # UPDATE
                        if type(before) is dict and type(after) is dict and after:
                            if consolidated:
                                mine = (table, 2, len(key), *after, None, *before)
                                values = (*after.values(), *key, *before.values())
                            else:  # a remote writes the values as they come
                                mine = (table, 2, len(key), *after)
                                values = (*after.values(), *key)
                    elif kind == 3:  # DELETE
                        if after is None and type(before) is dict:
                            mine = (table, 3, len(key))
                            values = key
            if mine is None:
                self._flush(run, params, batch, consolidated)
                run, params, signature = [], [], None
                self._statements.error(batch, op, f"malformed operation: {operation_problem(op) or 'bad structure'}")
                continue
            if mine != signature or len(run) >= _RUN_LIMIT:
                self._flush(run, params, batch, consolidated)
                run, params, signature = [], [], mine
            run.append(op)
            params.append(values)
        self._flush(run, params, batch, consolidated)

    def _settle(self, batch: Batch, consolidated: bool) -> None:
        """What a foreign key set aside, tried again at the end of its
        transaction (batch.settle; a row the transaction deletes after, and
        that is not here, has nothing left to do); at a remote, one still
        refused may have gone with its parent (followers.Followers.refused)."""
        settle(batch, lambda ops: self._apply_operations(ops, batch, consolidated),
               lambda op, problem: self._settled_error(batch, op, problem, consolidated), self._missing)

    def _missing(self, op: tuple) -> bool:
        table = self._statements.table(op[0])
        return table is not None and self._statements.select(table, op[2]) is None

    def _settled_error(self, batch: Batch, op: tuple, problem: str, consolidated: bool) -> None:
        table = self._statements.table(op[0])
        if table is None or not self._followers.refused(batch, table, op, consolidated):
            self._statements.error(batch, op, problem)

    def _apply_run(self, run: Run, batch: Batch, consolidated: bool) -> None:
        """A decoded run (format version 2): its rows are the parameter
        lists of one statement (statements.run_sql), bound as they are once
        every value of them is checked, in C; the keys a filtered table's
        rows end with are kept by position (batch.touch_rows).  Whatever
        needs an operation's images (a row with an error, watched or
        pending rows, rows going back) takes the general path with the
        operations the run stands for."""
        table = self._statements.table(run.table)
        kind = run.kind
        if (table is None or run.key_width != len(table.key_columns) or batch.returns or batch.watched is not None
                or batch.held
                or (kind == OpKind.UPDATE and not run.after)
                or (kind != OpKind.DELETE and not table.column_set.issuperset(run.after + run.before))
                or (batch.pending and batch.pending.get(table.name.lower()))
                or not _VALUE_TYPES.issuperset(map(type, chain.from_iterable(run.rows)))):
            self._apply_operations(run.operations(), batch, consolidated)
            return
        if batch.filters and table.name.lower() in batch.filters:
            touch_rows(batch, table, run)
        if kind == OpKind.INSERT and not consolidated and table.name.lower() in self._followers.parents:
            width = run.key_width
            self._followers.note_inserts(batch, table, (dict(zip(run.after, row[width:])) for row in run.rows))
        rows = run.rows
        if kind == OpKind.DELETE:
            width = run.key_width
            rows = [row[:width] for row in rows]
        self._run(table, kind, self._statements.run_sql(table, run, consolidated), _Operations(run), rows, batch,
                  consolidated, (table, run.after, run.key_width) if kind == OpKind.INSERT else None)

    def _flush(self, run: list, params: list, batch: Batch, consolidated: bool) -> None:
        """Apply a run; first check, in C, that every value of it is a
        SQLite value (a bool or a list is not); when one is not, the run is
        cut around the operations that carry one, which are recorded as
        malformed in their place."""
        if not run:
            return
        if _plain_values(run, params, run[0][1], consolidated):
            self._flush_checked(run, params, batch, consolidated)
            return
        start = 0
        for index, op in enumerate(run):
            problem = operation_problem(op)
            if problem is not None:
                self._flush_checked(run[start:index], params[start:index], batch, consolidated)
                self._statements.error(batch, op, f"malformed operation: {problem}")
                start = index + 1
        self._flush_checked(run[start:], params[start:], batch, consolidated)

    def _flush_checked(self, run: list, params: list, batch: Batch, consolidated: bool) -> None:
        if not run:
            return
        statements = self._statements
        first = run[0]
        table = statements.table(first[0])
        if table is None:
            for op in run:
                statements.error(batch, op, f"no table {op[0]!r} with a primary key at this site")
            return
        kind = first[1]
        if len(first[2]) != len(table.key_columns):
            for op in run:
                statements.error(batch, op, f"key has {len(first[2])} values but {table.name} has "
                                            f"{len(table.key_columns)} key columns")
            return
        named = () if kind == OpKind.DELETE else (*first[4], *(first[3] or ()))
        missing = [column for column in named if column not in table.column_set]
        if missing:
            reshaped = self._reshape.operations(table, run) if consolidated else None
            if reshaped is not None:  # captured in an old shape: in the shape of now
                self._apply_operations(reshaped, batch, consolidated)
                return
            for op in run:
                statements.error(batch, op, f"{table.name} has no column {missing[0]!r} at this site")
            return
        # The fast path's INSERT skips a row whose key is taken, and where the
        # table allows it (SqliteTable.or_ignore) its INSERT and UPDATE skip a row
        # that breaks any constraint (OR IGNORE): _run sees the count fall
        # short and replays the chunk, as when the statement raised.  A
        # statement that cannot abort needs no statement journal, which
        # inside the savepoint copies pages each row changes (with the
        # capture table's key indexes, the fast path ran at 40% of its speed).
        if kind == OpKind.INSERT:
            sql = statements.insert_sql(table, tuple(first[4]), ignore=True)
        elif kind == OpKind.UPDATE:
            sql = statements.update_sql(table, tuple(first[4]), tuple(first[3]) if consolidated else (), ignore=True)
        else:
            sql = statements.delete_sql(table)
        if batch.filters and table.name.lower() in batch.filters:
            touch(batch, table, run)
        if batch.watched is not None:
            watch(batch, table, run)
        if kind == OpKind.INSERT and not consolidated and table.name.lower() in self._followers.parents:
            self._followers.note_inserts(batch, table, (op[4] for op in run))
        pending = batch.pending.get(table.name.lower()) if batch.pending else None
        held = batch.held
        if pending or held:
            # Operations on rows with this remote's own pending changes go one
            # by one through the pending rule, those on rows a foreign key
            # held back wait with them (_settle); the others stay on the fast path.
            fast_run: list = []
            fast_params: list = []
            for op, values in zip(run, params):
                own = pending.get(op[2]) if pending else None
                if own is None and (table.name, op[2]) not in held:
                    fast_run.append(op)
                    fast_params.append(values)
                    continue
                self._run(table, kind, sql, fast_run, fast_params, batch, consolidated)
                fast_run, fast_params = [], []
                if own is None:
                    set_aside(batch, table, op, "held back: an earlier operation of its row was refused")
                else:
                    self._pending.apply_one(table, op, own, batch)
            run, params = fast_run, fast_params
        self._run(table, kind, sql, run, params, batch, consolidated,
                  (table, tuple(first[4]), 0) if kind == OpKind.INSERT else None)

    def _run(self, table: SqliteTable, kind: int, sql: str, run: list, params: list, batch: Batch,
             consolidated: bool, insert: tuple | None = None) -> None:
        # A savepoint journals every existing page a statement changes (in
        # memory: _db.connect sets temp_store); a chunk that fails is
        # replayed one operation at a time, so a chunk of UPDATEs or DELETEs,
        # which conflicts and missing rows send down that path, stays small.
        step = _INSERT_CHUNK if kind == OpKind.INSERT else _CHANGE_CHUNK
        returns = batch.returns
        for start in range(0, len(run), step):
            chunk = params[start:start + step] if len(run) > step else params
            # A row already going back to the peer takes each later change
            # of the peer's one by one (_one: keymoves.origin_changes).  The
            # operations are taken only then (a run's rows make them).
            if not (returns and any((table.name, op[2]) in returns for op in run[start:start + step])) \
                    and self._fast(sql, chunk, insert):
                batch.applied += len(chunk)
                continue
            for op in run[start:start + step]:
                self._one(table, op, batch, consolidated)

    def _fast(self, sql: str, params: list, insert: tuple | None = None) -> bool:
        conn = self._conn
        conn.execute("SAVEPOINT fieldsync_run")
        try:
            done = (self._insert_rows(sql, params, *insert) if insert else conn.executemany(sql, params).rowcount
                    ) == len(params)
        except (sqlite3.IntegrityError, OverflowError, sqlite3.ProgrammingError):
            # ProgrammingError: a row bound the wrong number of values.
            done = False
        if not done:
            conn.execute("ROLLBACK TO fieldsync_run")
        conn.execute("RELEASE fieldsync_run")
        return done

    def _insert_rows(self, sql: str, params: list, table: SqliteTable, columns: tuple[str, ...], skip: int) -> int:
        """``executemany(sql, params)`` of an INSERT, most rows written by
        statements of many rows (statements.insert_rows_sql: a step of
        SQLite and of the binding loop per statement, not per row); the
        rows inserted, as SQLite counts them.  Rows not all of one width
        (a run made by hand) go one by one, where a wrong one is refused."""
        width = skip + len(columns)
        block = self._statements.rows_per_insert(width)
        full = len(params) - len(params) % block if block > 1 and set(map(len, params)) == {width} else 0
        count = 0
        if full:
            many = self._statements.insert_rows_sql(table, columns, skip, block)
            for start in range(0, full, block):
                count += self._conn.execute(many, tuple(chain.from_iterable(params[start:start + block]))).rowcount
        if full < len(params):
            count += self._conn.executemany(sql, params[full:]).rowcount
        return count

    def _one(self, table: SqliteTable, op: tuple, batch: Batch, consolidated: bool) -> None:
        problem = operation_problem(op)
        if problem is not None:
            self._statements.error(batch, op, f"malformed operation: {problem}")
            return
        kind = op[1]
        if batch.returns:
            origin_changes(table, op, batch)
        try:
            if kind == OpKind.INSERT:
                self._insert_one(table, op, batch, consolidated)
            elif kind == OpKind.UPDATE:
                self._update_one(table, op, batch, consolidated)
            elif self._conn.execute(self._statements.delete_sql(table), op[2]).rowcount:
                batch.applied += 1
            else:
                moved = self._key_moves.moved_key(table, op[2]) if consolidated else None
                if not consolidated and self._followers.went_with_parent(batch, table, op):
                    pass  # it left this remote with its parent (route.apply_triggers)
                elif moved is None:
                    self._statements.error(batch, op, "DELETE of a missing row")
                else:
                    readdressed(table, (op[0], op[1], moved, op[3], op[4]), batch)
                    self._conn.execute(self._statements.delete_sql(table), moved)
                    batch.applied += 1
        except sqlite3.IntegrityError as error:
            if refused_by_key(error):
                set_aside(batch, table, op, f"constraint failed: {error}")
            else:
                self._statements.error(batch, op, f"constraint failed: {error}")

    def _insert_one(self, table: SqliteTable, op: tuple, batch: Batch, consolidated: bool) -> None:
        statements = self._statements
        after = op[4]
        try:
            self._conn.execute(statements.insert_sql(table, tuple(after), ignore=False), tuple(after.values()))
        except sqlite3.IntegrityError:
            local = statements.select(table, op[2])
            if local is None:
                raise  # another constraint than the key refused the row
        else:
            batch.applied += 1
            return
        if consolidated:
            # The consolidated keeps its row and sends it back so the origin converges.
            statements.error(batch, op, kept_local_row(batch, table, op, local))
        elif any(not same_value(local.get(column), value) for column, value in after.items()):
            # A remote takes the consolidated's row as is.
            self._conn.execute(statements.update_sql(table, tuple(after), ()), (*after.values(), *op[2]))
            statements.error(batch, op, "INSERT of an existing key: the row was overwritten with the incoming one")
        else:
            batch.applied += 1  # it holds that very row already (a row sent back to it whole)

    def _update_one(self, table: SqliteTable, op: tuple, batch: Batch, consolidated: bool) -> None:
        conn = self._conn
        statements, key_moves = self._statements, self._key_moves
        key, before, after = op[2], op[3], op[4]
        if consolidated:
            sql = statements.update_sql(table, tuple(after), tuple(before))
            params = (*after.values(), *key, *before.values())
        else:
            sql = statements.update_sql(table, tuple(after), ())
            params = (*after.values(), *key)
        try:
            count = conn.execute(sql, params).rowcount
        except sqlite3.IntegrityError as error:
            if refused_by_key(error):
                raise
            if consolidated:
                key_moves.refused_move(table, key, after, batch)
                raise
            if not key_moves.take_key(table, sql, params, key, after):
                raise
            statements.error(batch, op, KEY_TAKEN)
            return
        if count:
            batch.applied += 1
            return
        local = statements.select(table, key) if consolidated else None
        if local is None and consolidated:
            moved = key_moves.moved_key(table, key)
            if moved is not None:
                # This site gave the row another key before the change arrived: it applies there.
                op = (op[0], op[1], moved, before, after)
                readdressed(table, op, batch)
                if conn.execute(sql, (*after.values(), *moved, *before.values())).rowcount:
                    batch.applied += 1
                    return
                local = statements.select(table, moved)
                if local is not None and not after.keys().isdisjoint(table.key_columns):
                    # Both gave the row a key: a conflict.  The peer holds the
                    # row under its key, without this site's changes under
                    # the other: the whole result goes back.
                    self._conflicts.resolve(table, op, local, batch)
                    final = key_after(table.key_columns, moved, after)
                    if statements.select(table, final) is not None:
                        send_back(batch, table, final, {**local, **after}, set(table.columns))
                    return
        if local is None:
            statements.error(batch, op, "UPDATE of a missing row")
            if consolidated:
                strand(batch, table, key, before, after)
            return
        self._conflicts.resolve(table, op, local, batch)

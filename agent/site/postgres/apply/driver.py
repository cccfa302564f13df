"""Applying a peer's transactions into a PostgreSQL consolidated: the batch
driver, its fast path and its retries.

Rules of this file:
* One call applies a message's transactions and sets the peer's
  ``log_received`` (and ``receive_count``, ``last_received_at``) in one
  PostgreSQL transaction: all of it or none of it, whatever kills the
  process or the connection.
* The transaction marks its writes with the peer's name
  (capture.set_origin, transaction-local): the capture triggers record
  them with that origin, so they reach every other remote and not the
  origin; a cut makes them one log transaction of the peer's (log.py).
* The rules are the SQLite consolidated's, through the same functions
  (agent/site/apply: checks, conflicts, keymoves, unconfirmed, batch);
  this file does their SQL.  A batch goes: lock the peer's row and check
  the offsets, read the published tables, apply each transaction (fast
  path, else one operation at a time), settle what a foreign key set
  aside, the unconfirmed rule, write what goes back, record
  ``log_received``.
* A bad operation never stops the batch: each runs in a savepoint, and an
  operation PostgreSQL refuses (a value the column's type cannot hold, a
  constraint, an application trigger's exception) is rolled back to it
  and recorded in ``fieldsync.apply_error``; a foreign key's refusal waits
  for the end of its transaction first (batch.set_aside).  Only problems
  with the batch as a whole (offsets, a broken conflict hook) or the
  database abort it.
* Every row is compared where it is locked: the fast path's UPDATE checks
  the before-image in its WHERE clause (PostgreSQL re-checks it on the
  newest row version after waiting for a writer), the slow path reads the
  row ``SELECT ... FOR UPDATE``, compares, then writes.  Rows read to be
  written back are locked too, so what goes back is what stays.
* A deadlock or serialization failure (SQLSTATE 40P01, 40001) rolls the
  whole transaction back, and it is applied again from the start, at most
  ``ATTEMPTS`` times, pausing a little longer each time; then the apply
  is refused (SiteBusy) and the message waits for the next poll.  A
  transaction whose operations can be read only once (a group of parts
  read from the spool as it is applied) is not tried again here.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime
from typing import Any, Iterable, Iterator, NamedTuple

import psycopg
from psycopg import errors as pg_errors

from codec.ops import OpKind, Run, Transaction

from ...apply.batch import (ApplyResult, Batch, ConflictHook, key_after, send_back, set_aside, settle, strand, touch,
                            watch)
from ...apply.chain import MessageChain, apply_chain
from ...apply.checks import applies, skip_bound
from ...apply.conflicts import decide, kept_local_row, planned_returns, resolution_name, resolved
from ...apply.keymoves import follow_moves, origin_changes, readdressed, refused_move
from ...apply.reshape import reshaped
from ...apply.unconfirmed import send_back_received
from ...clock import in_utc, utc_now
from ...errors import ConflictHookFailed, SiteBusy
from ...identity import SiteIdentity
from ...values import operation_problem
from ..capture import set_origin
from ..errors import ValueNotConvertible
from ..remotes import get_remote
from ..uri import PgTarget
from .runs import ready_run
from .followers import PgFollowers
from .lookups import PeerReader, any_unconfirmed, last_change, rows_of_keys
from .records import record_conflict, record_error
from .returns import filters, write_return
from .tables import PgTable, Tables, first_line, many_params, unconvertible

log = logging.getLogger("fieldsync.site")

# Tries of a message's transaction that deadlocks or fails to serialize, and
# the pause before the second (doubled before each one after).
ATTEMPTS = 5
RETRY_PAUSE = 0.05
# Operations per savepoint on the fast path.
_CHUNK = 500

# A set-based UPDATE or DELETE joins a chunk's rows to its table: the
# fast path wants them written in their order (their capture rows in the
# order of the peer's operations), which a nested loop over them gives;
# the planner may choose a hash or merge join instead, so those are off for
# the statement (transaction-local, back as they were after it).
_NESTED_LOOP = ("SELECT pg_catalog.set_config('enable_hashjoin', 'off', true),"
                " pg_catalog.set_config('enable_mergejoin', 'off', true)")
_JOINS_BACK = ("SELECT pg_catalog.set_config('enable_hashjoin', %s, true),"
               " pg_catalog.set_config('enable_mergejoin', %s, true)")

_RETRIED = (pg_errors.DeadlockDetected, pg_errors.SerializationFailure)
# What PostgreSQL says of one operation it refuses (the others abort the batch).
_REFUSED = (psycopg.IntegrityError, psycopg.DataError, pg_errors.RaiseException)


class PgApplier:
    """Applies batches into one PostgreSQL consolidated."""

    def __init__(self, target: PgTarget) -> None:
        self._target = target
        # Conflict hooks by lower-case table (None: every other), as SiteDatabase keeps them.
        self.hooks: dict[str | None, ConflictHook] = {}
        self._tables = Tables()

    def apply(self, conn: psycopg.Connection, identity: SiteIdentity, peer: str,
              transactions: Iterable[Transaction], *, log_received: int, messages: int,
              peer_incarnation: bytes | None, now: datetime | None, skip_through: int | None) -> ApplyResult:
        """Apply ``transactions`` from ``peer`` (see SiteDatabase.apply) in
        one transaction on ``conn``, tried again after a deadlock; the
        messages of a MessageChain each as a batch of its own, read in full
        first (to be tried again)."""
        if isinstance(transactions, MessageChain):
            messages_read = [(list(message), last) for message, last in transactions.messages]
            replayable = all(isinstance(transaction.ops, (list, tuple))
                             for listed, _last in messages_read for transaction in listed)
        else:
            listed = transactions if isinstance(transactions, (list, tuple)) else list(transactions)
            replayable = all(isinstance(transaction.ops, (list, tuple)) for transaction in listed)
        moment = in_utc(now or utc_now())
        assert moment is not None
        for attempt in range(1, ATTEMPTS + 1):
            try:
                with conn.transaction():
                    if isinstance(transactions, MessageChain):
                        return apply_chain(lambda listed, last, **options: _Batch(
                            conn, self._tables, self.hooks, identity, peer, moment).apply(listed, last, **options),
                            MessageChain(messages_read), skip_through=skip_through,
                            peer_incarnation=peer_incarnation)
                    batch = _Batch(conn, self._tables, self.hooks, identity, peer, moment)
                    return batch.apply(listed, log_received, messages, peer_incarnation, skip_through)
            except _RETRIED as error:
                if not replayable or attempt == ATTEMPTS:
                    tries = f"{attempt} times" if attempt > 1 else "once (its operations are read once)"
                    raise SiteBusy(f"applying transactions from {peer!r} at {self._target.where} met "
                                   f"{first_line(error)} {tries}: applications keep writing the rows it writes; "
                                   "nothing applied, the message is applied again later") from None
                pause = RETRY_PAUSE * 2 ** (attempt - 1)
                log.warning("applying transactions from %s at %s: %s; trying again in %.2f s (attempt %d of %d)",
                            peer, self._target.where, first_line(error), pause, attempt + 1, ATTEMPTS)
                time.sleep(pause)
        raise AssertionError("unreachable")  # the loop returns or raises


class _Replay(Exception):
    """A fast-path chunk did not go as planned: roll it back, then apply it
    one statement an operation (its argument true: every row was written
    once, in another order) or one operation at a time with every check."""


class _Statement(NamedTuple):
    """A fast-path run's statements: ``one`` for one operation, ``many``
    (set-based) for a chunk."""

    kind: int
    one: Any
    many: Any


class _Batch:
    """One try of one batch, inside its transaction."""

    def __init__(self, conn: psycopg.Connection, tables: Tables, hooks: dict[str | None, ConflictHook],
                 identity: SiteIdentity, peer: str, now: datetime) -> None:
        self.conn = conn
        self.tables = tables
        self.hooks = hooks
        self.identity = identity
        self.now = now
        self.batch = Batch(peer, now.isoformat())
        # The join settings as the session has them (_NESTED_LOOP).
        self.joins = conn.execute("SELECT pg_catalog.current_setting('enable_hashjoin'),"
                                  " pg_catalog.current_setting('enable_mergejoin')").fetchone()

    def apply(self, transactions: list, log_received: int, messages: int, peer_incarnation: bytes | None,
              skip_through: int | None) -> ApplyResult:
        conn, batch, peer = self.conn, self.batch, self.batch.peer
        set_origin(conn, peer)
        remote = get_remote(conn, peer, for_update=True)  # one apply of a peer at a time
        skip_through = skip_bound(peer, remote, log_received, messages, peer_incarnation, skip_through)
        self.tables.refresh(conn)
        followers = PgFollowers(conn, self.tables)
        batch.filters = filters(conn, peer, followers.finders)
        # Every row the batch touches is watched: whether the unconfirmed
        # rule needs them is known only once they are all locked (lookups.any_unconfirmed).
        batch.watched = {}
        applied = skipped = 0
        previous = skip_through
        for transaction in transactions:
            commit = transaction.commit
            if not applies(peer, commit, previous, skip_through, log_received):
                skipped += 1  # applied before (a confirmation was lost)
                continue
            previous = batch.commit = commit
            self._operations(transaction.ops)
            if batch.deferred:
                settle(batch, self._operations, followers.refused(batch, self._error))
            applied += 1
        rows = _Rows(conn)
        if batch.watched and any_unconfirmed(conn, peer, remote.confirm_sent):
            reader = PeerReader(conn, self.tables, peer)

            def changes(table: PgTable, keys: set[tuple]) -> Iterator[tuple]:
                return rows_of_keys(conn, self.tables, table, keys, remote.confirm_sent, self.identity.name, peer)
            send_back_received(batch, changes, reader.operation, rows.select,
                               followers.lost_with_parent(batch, changes, reader.operation, rows.select))
        rows.prefetch(batch)
        wrote_back = False
        for shape, kind, values, columns in planned_returns(batch, rows.select, followers.under):
            table = self.tables.table(shape.table)
            assert table is not None, "a row goes back only in a table the batch applied to"
            write_return(conn, table, peer, kind, values, columns, followers.finder(table))
            wrote_back = True
        if wrote_back:  # what this apply reached goes with them (log.applied_of)
            # In a chain the transaction's first message that wrote rows
            # back says it: the least, which holds for every row written back.
            conn.execute("INSERT INTO fieldsync.applied (txid, applied) VALUES (pg_current_xact_id(), %s)"
                         " ON CONFLICT (txid) DO NOTHING", (log_received,))
        conn.execute("UPDATE fieldsync.remote SET log_received = %s, receive_count = receive_count + %s,"
                     " last_received_at = %s, peer_incarnation = coalesce(peer_incarnation, %s) WHERE name = %s",
                     (log_received, messages, self.now, peer_incarnation, peer))
        return ApplyResult(peer, log_received, applied, skipped, batch.applied, batch.conflicts, batch.errors, ())

    # --- runs of operations -----------------------------------------------------------

    def _operations(self, ops: Iterable) -> None:
        """Apply operations in their order: consecutive ones of one table,
        kind and column list as one run (:meth:`_flush`); a malformed one,
        or one this site cannot take, is recorded in its place.  A decoded
        run (codec.ops.Run) goes as it is where it can (:meth:`_run`), else
        as the operations it stands for."""
        run: list = []
        params: list = []
        signature: tuple | None = None
        table: PgTable | None = None
        for item in ops:
            if type(item) is Run:
                self._flush(table, run, params)
                run, params, signature = [], [], None
                made = ready_run(self.tables, item, _CHUNK)
                if made is not None:
                    self._flush(made.table, made.ops, made.params, made.chunks)
                    continue
                each: Iterable = item.operations()
            else:
                each = (item,)
            for op in each:
                found = self._checked(op)
                if found is None:
                    self._flush(table, run, params)
                    run, params, signature = [], [], None
                    continue
                op_table, values, op = found
                mine = (op_table.name, op[1], tuple(op[4] or ()),
                        tuple(op[3] or ()) if op[1] == OpKind.UPDATE else ())
                if mine != signature:
                    self._flush(table, run, params)
                    run, params, signature, table = [], [], mine, op_table
                run.append(op)
                params.append(values)
        self._flush(table, run, params)

    def _checked(self, op: Any) -> tuple[PgTable, list, Any] | None:
        """The table of ``op``, its statement's parameters and the operation
        in the table's shape of now (a remote's row captured before a
        schema change renamed or dropped its columns: agent.site.apply.reshape),
        or None when it is recorded as an apply error instead (or writes
        nothing now)."""
        problem = operation_problem(op)
        if problem is not None:
            self._error(op, f"malformed operation: {problem}")
            return None
        table = self.tables.table(op[0])
        if table is None:
            if not self.tables.removed(op[0]):  # else captured before the remote applied the removal: dropped
                self._error(op, f"no published table {op[0]!r} at this site")
            return None
        kind, key, before, after = op[1], op[2], op[3], op[4]
        if kind != OpKind.DELETE and not after:
            self._error(op, "malformed operation: an INSERT or UPDATE writes no column")
            return None
        if len(key) != len(table.key_columns):
            self._error(op, f"key has {len(key)} values but {table.name} has {len(table.key_columns)} key columns")
            return None
        missing = [column for column in (*(after or ()), *(before or ())) if column not in table.column_set]
        if kind != OpKind.DELETE and missing:
            moves = self.tables.moves(table)
            found = reshaped(moves, table.columns, table.column_set, (op,)) if moves else None
            if found is None:
                self._error(op, f"{table.name} has no column {missing[0]!r} at this site")
                return None
            if not found:
                return None  # an UPDATE of columns dropped since: nothing to write
            op = found[0]
            before, after = op[3], op[4]
        try:
            if kind == OpKind.INSERT:
                return table, table.params(after, after.values()), op
            keyed = table.params(table.key_columns, key)
            if kind == OpKind.DELETE:
                return table, keyed, op
            return table, [*table.params(after, after.values()), *keyed, *table.params(before, before.values())], op
        except ValueNotConvertible as error:
            self._error(op, unconvertible(error))
            return None

    def _flush(self, table: PgTable | None, run: list, params: list, chunks: tuple[str, ...] = ()) -> None:
        """Apply a run of one statement, ``_CHUNK`` operations per savepoint;
        a chunk that does not go as planned is rolled back and its
        operations applied one at a time with every check.  ``chunks``:
        the JSON parameters of the run's chunks, when made already."""
        if not run or table is None:
            return
        batch = self.batch
        if batch.filters and table.name.lower() in batch.filters:
            touch(batch, table, run)
        watch(batch, table, run)
        kind, after, before = run[0][1], tuple(run[0][4] or ()), tuple(run[0][3] or ())
        if kind == OpKind.INSERT:
            one = table.insert_sql(after)
        elif kind == OpKind.UPDATE:
            one = table.update_sql(after, before)
        else:
            one = table.delete_sql()
        statement = _Statement(kind, one, table.many_sql(kind, after, before if kind == OpKind.UPDATE else ()))
        ready: list = []
        ready_params: list = []
        for op, values in zip(run, params):
            if batch.held and (table.name, op[2]) in batch.held:
                # An earlier operation of its row waits for the end of the transaction: so does it.
                self._chunks(table, statement, ready, ready_params)
                ready, ready_params = [], []
                set_aside(batch, table, op, "held back: an earlier operation of its row was refused")
                continue
            ready.append(op)
            ready_params.append(values)
        self._chunks(table, statement, ready, ready_params, chunks if len(ready) == len(run) else ())

    def _chunks(self, table: PgTable, statement: _Statement, run: list, params: list,
                chunks: tuple[str, ...] = ()) -> None:
        batch = self.batch
        for number, start in enumerate(range(0, len(run), _CHUNK)):
            chunk = run[start:start + _CHUNK]
            # A row going back to the peer takes each later change of the
            # peer's one by one (origin_changes).
            if not (batch.returns and any((table.name, op[2]) in batch.returns for op in chunk)) \
                    and self._fast(statement, params[start:start + _CHUNK], chunks[number] if chunks else None):
                batch.applied += len(chunk)
                continue
            for op in chunk:
                self._one(table, op)

    def _fast(self, statement: _Statement, params: list, given: str | None = None) -> bool:
        """Apply a chunk as planned, in a savepoint: by one set-based
        statement (tables.PgTable.many_sql), or, when that wrote its rows
        all but in another order than theirs, one statement per operation
        (pipelined); False, with nothing done, when an operation did not
        write its row (a held key, a missing row, a before-image that
        differs) or PostgreSQL refused one.  ``given``: the chunk's JSON
        parameter, when made already."""
        count = len(params)
        text = many_params(params) if given is None else given
        try:
            with self.conn.transaction(), self.conn.cursor() as cursor:
                if statement.kind == OpKind.INSERT:  # its rows come in their order (a sorted SELECT)
                    cursor.execute(statement.many, (text,))
                    if cursor.rowcount != count:
                        raise _Replay(False)
                    return True
                cursor.execute(_NESTED_LOOP)
                cursor.execute(statement.many, (text,))
                positions = [row[0] for row in cursor.fetchall()]
                written = len(positions) == count and len(set(positions)) == count
                if not written or positions != sorted(positions):
                    raise _Replay(written)
                cursor.execute(_JOINS_BACK, self.joins)
            return True
        except _Replay as replay:
            if not replay.args[0]:
                return False
        except _REFUSED:
            return False
        try:  # each row written once, in another order: the chunk goes by one statement an operation
            with self.conn.transaction(), self.conn.cursor() as cursor:
                cursor.executemany(statement.one, params)
                if cursor.rowcount != count:
                    raise _Replay(False)
        except (_Replay, *_REFUSED):
            return False
        return True

    # --- one operation ------------------------------------------------------------------

    def _one(self, table: PgTable, op: tuple) -> None:
        """One operation with every check, in a savepoint: what PostgreSQL
        refuses is rolled back and recorded."""
        batch = self.batch
        if batch.returns:
            origin_changes(table, op, batch)
        try:
            with self.conn.transaction():
                if op[1] == OpKind.INSERT:
                    self._insert_one(table, op)
                elif op[1] == OpKind.UPDATE:
                    self._update_one(table, op)
                else:
                    self._delete_one(table, op)
        except ValueNotConvertible as error:
            self._error(op, unconvertible(error))
        except pg_errors.ForeignKeyViolation as error:
            set_aside(batch, table, op, f"constraint failed: {first_line(error)}")
        except psycopg.DataError as error:
            self._error(op, unconvertible(error))
        except (psycopg.IntegrityError, pg_errors.RaiseException) as error:
            self._error(op, f"constraint failed: {first_line(error)}")

    def _row(self, table: PgTable, key: tuple) -> dict | None:
        """The row under ``key``, locked (inside an operation's savepoint)."""
        found = table.lock(self.conn, key)
        return None if found is None else found[0]

    def _moved_key(self, table: PgTable, key: tuple) -> tuple | None:
        """Where this site moved the row that had ``key`` (keymoves.follow_moves)."""
        return follow_moves(table, key, lambda moved: last_change(self.conn, self.tables, table, moved), self._row)

    def _insert_one(self, table: PgTable, op: tuple) -> None:
        after = op[4]
        statement = table.insert_sql(tuple(after))
        for _ in range(2):
            if self.conn.execute(statement, table.params(after, after.values())).rowcount:
                self.batch.applied += 1
                return
            local = self._row(table, op[2])
            if local is not None:
                # The consolidated keeps its row and sends it back so the origin converges.
                self._error(op, kept_local_row(self.batch, table, op, local))
                return
            # The row that held the key was deleted meanwhile: try again.
        self._error(op, "INSERT of a key another session keeps taking and deleting: not applied")

    def _update_one(self, table: PgTable, op: tuple) -> None:
        conn, batch = self.conn, self.batch
        key, before, after = op[2], op[3], op[4]
        found = table.lock(conn, key, before)
        if found is None:
            moved = self._moved_key(table, key)
            if moved is not None:
                # This site gave the row another key before the change arrived: it applies there.
                op = (op[0], op[1], moved, before, after)
                readdressed(table, op, batch)
                found = table.lock(conn, moved, before)
                if found is not None and not found[1] and not after.keys().isdisjoint(table.key_columns):
                    # Both gave the row a key: a conflict.  The peer holds the
                    # row under its key, without this site's changes under
                    # the other: the whole result goes back.
                    self._resolve(table, op, found[0])
                    final = key_after(table.key_columns, moved, after)
                    if self._row(table, final) is not None:
                        send_back(batch, table, final, {**found[0], **after}, set(table.columns))
                    return
            if found is None:
                self._error(op, "UPDATE of a missing row")
                strand(batch, table, key, before, after)
                return
        local, matches = found
        if not matches:
            self._resolve(table, op, local)
            return
        try:
            with conn.transaction():
                conn.execute(table.update_sql(tuple(after)), [*table.params(after, after.values()),
                                                              *table.params(table.key_columns, op[2])])
        except psycopg.IntegrityError as error:
            if not isinstance(error, pg_errors.ForeignKeyViolation):
                refused_move(batch, table, op[2], after, self._row)
            raise
        batch.applied += 1

    def _delete_one(self, table: PgTable, op: tuple) -> None:
        conn, batch = self.conn, self.batch
        if conn.execute(table.delete_sql(), table.params(table.key_columns, op[2])).rowcount:
            batch.applied += 1
            return
        moved = self._moved_key(table, op[2])
        if moved is None:
            self._error(op, "DELETE of a missing row")
            return
        readdressed(table, (op[0], op[1], moved, op[3], op[4]), batch)
        conn.execute(table.delete_sql(), table.params(table.key_columns, moved))
        batch.applied += 1

    def _resolve(self, table: PgTable, op: tuple, local: dict) -> None:
        """An UPDATE ``op`` found row ``local`` (locked) other than its
        before-image: resolve it (conflicts.decide), record it, and send the
        result back (conflicts.resolved)."""
        conn, batch = self.conn, self.batch
        key = op[2]
        decision, written = decide(self.hooks, table, op, local, batch)
        if written:
            # Captured as usual (origin: the peer), so every other subscriber
            # gets the result; the origin gets it from planned_returns.
            statement = table.update_sql(tuple(written))
            if isinstance(decision, dict):
                try:
                    with conn.transaction():
                        conn.execute(statement, [*table.params(written, written.values()),
                                                 *table.params(table.key_columns, key)])
                except (ValueNotConvertible, *_REFUSED) as error:
                    raise ConflictHookFailed(f"conflict hook for {table.name} returned a row {table.name} cannot "
                                             f"hold: {first_line(error)}; the batch was rolled back") from None
            else:
                conn.execute(statement, [*table.params(written, written.values()),
                                         *table.params(table.key_columns, key)])
        final_key = key_after(table.key_columns, key, written)
        result = self._row(table, final_key)
        record_conflict(conn, batch, self.now, table.name, op, local, resolution_name(decision), result)
        resolved(batch, table, op, local, written, final_key, result)

    def _error(self, op: object, problem: str) -> None:
        record_error(self.conn, self.batch, self.now, op, problem)


class _Rows:
    """Rows read after the batch's operations, for what goes back: locked,
    read in bulk where it can, each key once."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self._conn = conn
        self._found: dict[tuple[str, tuple], dict | None] = {}

    def prefetch(self, batch: Batch) -> None:
        """Read at once the rows conflicts.planned_returns will read."""
        wanted: dict[str, tuple[PgTable, list[tuple]]] = {}
        for name_key, table in _tables_of(batch):
            if name_key not in self._found:
                wanted.setdefault(name_key[0], (table, []))[1].append(name_key[1])
        for name, (table, keys) in wanted.items():
            for start in range(0, len(keys), _CHUNK):
                chunk = keys[start:start + _CHUNK]
                try:
                    with self._conn.transaction():
                        rows = table.lock_many(self._conn, chunk)
                except (ValueNotConvertible, *_REFUSED):
                    continue  # some key this site's types cannot hold: read one at a time (select)
                for index, key in enumerate(chunk):
                    self._found[(name, key)] = rows.get(index)

    def select(self, table: PgTable, key: tuple) -> dict | None:
        name_key = (table.name, key)
        if name_key not in self._found:
            try:
                with self._conn.transaction():
                    found = table.lock(self._conn, key)
            except (ValueNotConvertible, *_REFUSED):
                found = None  # no row can hold it here
            self._found[name_key] = None if found is None else found[0]
        return self._found[name_key]


def _tables_of(batch: Batch) -> Iterator[tuple[tuple[str, tuple], Any]]:
    """The rows conflicts.planned_returns reads, with their tables."""
    for name_key, (table, _image) in batch.stranded.items():
        yield name_key, table
    for name_key, pending in batch.returns.items():
        yield name_key, pending.table
    for name_key, table in batch.touched.items():
        yield name_key, table
    watched = batch.watched or {}
    for name_key in (*batch.entered, *batch.received):
        if name_key in watched:
            yield name_key, watched[name_key][0]

"""Conflicts at the consolidated, and the rows that go back to the origin.

Rules of this file:
* At the consolidated an UPDATE is conditional on its before-image
  (``col IS ?``, SQLite's equality); a mismatch is a conflict, recorded in
  ``fieldsync_conflict`` and resolved by the table's policy or a hook, and
  the resulting row goes back to the origin.
* What goes back to the origin (conflicts, the unconfirmed rule, key
  moves, rows moved into its subset) is written once the whole batch is
  applied (:meth:`Conflicts.write_returns`), each row only to the origin.
* :class:`Conflicts` is given the connection, the statements and the
  conflict hooks (the site adapter's, read at each conflict).
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from datetime import datetime
from typing import Callable, Iterable, Sequence

from codec.ops import OpKind, Operation

from ..capture import (FLAG_RETURN_TO_ORIGIN, KIND_DELETE, KIND_INSERT, KIND_UPDATE, Shape, table_info,
                       write_capture_row)
from ..errors import ConflictHookFailed, InvalidSetting
from ..values import pack, unpack, value_problem
from ..route import Follow
from .batch import Batch, Conflict, ConflictHook, Filter, Resolution, Table, key_after, send_back
from .statements import Statements


class Conflicts:
    """Resolving conflicts, and writing what goes back to the origin."""

    def __init__(self, conn: sqlite3.Connection, statements: Statements,
                 hooks: dict[str | None, ConflictHook]) -> None:
        self._conn = conn
        self._statements = statements
        self._hooks = hooks  # lower-case table (None: every other) -> hook; the adapter keeps it

    def resolve(self, table: Table, op: tuple, local: dict, batch: Batch) -> None:
        """An UPDATE ``op`` found row ``local`` other than its before-image:
        resolve it (hook, policy), record it, and send the result back."""
        conn = self._conn
        key, before, after = op[2], op[3], op[4]
        incoming = tuple.__new__(Operation, op) if not isinstance(op, Operation) else op
        hook = self._hooks.get(table.name.lower(), self._hooks.get(None))
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
            # gets the result; the origin gets it from write_returns.
            conn.execute(self._statements.update_sql(table, tuple(written), ()), (*written.values(), *key))
        final_key = key_after(table.key_columns, key, written)
        result = self._statements.select(table, final_key)
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
            send_back(batch, table, final_key, {**local, **after}, set(after) | set(written))

    def filters(self, peer: str) -> dict[str, Filter]:
        """``peer``'s subset of each filtered table (lower-case table ->
        Filter): by SUBSCRIBE BY column, or for a table that follows its
        parent by the route of its foreign key (agent/site/route.py); what
        decides which rows leave its subset."""
        values: dict[str, set] = {}
        for publication, value in self._conn.execute(
                "SELECT publication, value FROM fieldsync_subscription WHERE remote = ? AND until IS NULL", (peer,)):
            bucket = values.setdefault(publication, set())
            if value is not None:
                bucket.add(value)
        found = {}
        for table, publication, column in self._conn.execute(
                "SELECT table_name, publication, subscribe_by FROM fieldsync_article"
                " WHERE subscribe_by IS NOT NULL OR follows IS NOT NULL"):
            subset = frozenset(values.get(publication, ()))
            follow = self._statements.follows.get(table.lower())
            if follow is None:
                found[table.lower()] = Filter((column,), subset)
            else:
                found[table.lower()] = Filter(follow.columns, subset, self._route_of(follow))
        return found

    def _route_of(self, follow: Follow) -> Callable[[Sequence], object]:
        """The route of a row of ``follow.table`` from its foreign key values."""
        sql = self._statements.cached(("route", follow.table),
                                      lambda: f"SELECT {follow.route(['?'] * len(follow.columns))}")
        conn = self._conn

        def route(values: Sequence) -> object:
            try:
                return conn.execute(sql, list(values)).fetchone()[0]
            except (OverflowError, sqlite3.InterfaceError, sqlite3.ProgrammingError):
                return None  # a value no parent can hold (the operation is refused as malformed)
        return route

    def write_returns(self, batch: Batch) -> None:
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
          unconfirmed rule; see batch.send_back): an UPDATE of the listed columns.
        """
        received = batch.received
        select = self._statements.select
        routes: dict[str, dict] = {}  # by table: the routes of foreign keys (nothing changes meanwhile)
        for name_key, (table, image) in batch.stranded.items():
            # The peer moved a row this site had deleted (or moved itself,
            # to a key that no longer holds it): it goes at the peer too.
            shape = table.shape
            if shape is not None and name_key not in received and select(table, name_key[1]) is None:
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
            result = select(table, key)
            last = received.get(name_key)
            deleted_there = last is not None and last[0] == OpKind.DELETE
            if result is None:
                if last is not None and not deleted_there:
                    image = {**last[1], **dict(zip(table.key_columns, key))}
                    self._write_return(shape, KIND_DELETE, [image.get(column) for column in shape.columns])
                continue  # otherwise the origin deleted it too, or an operation on its way does
            subset = batch.filters.get(table.name.lower())
            if subset is not None and subset.value(result, routes.setdefault(shape.table, {})) not in subset.values:
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
        also how Unconfirmed.any_unconfirmed finds them without a scan."""
        seq = write_capture_row(self._conn, shape, kind, FLAG_RETURN_TO_ORIGIN, values)
        self._conn.execute("INSERT INTO fieldsync_returned (seq, columns) VALUES (?, ?)",
                           (seq, json.dumps(sorted(columns))))


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


def list_conflicts(conn: sqlite3.Connection, after_id: int = 0) -> tuple[ConflictRecord, ...]:
    rows = conn.execute("SELECT id, at, peer, peer_commit, table_name, key, local_row, incoming_before,"
                        " incoming_after, resolution, result_row FROM fieldsync_conflict WHERE id > ? ORDER BY id",
                        (after_id,)).fetchall()
    return tuple(
        ConflictRecord(i, datetime.fromisoformat(at), peer, commit, table, tuple(unpack(key)), unpack(local),
                       unpack(before), unpack(after), resolution, unpack(result))
        for i, at, peer, commit, table, key, local, before, after, resolution, result in rows)


def check_policy(policy: object) -> Resolution:
    try:
        return Resolution(policy)
    except ValueError:
        raise InvalidSetting(f"conflict policy must be 'incoming' or 'local', got {policy!r}") from None


def set_policy_locked(conn: sqlite3.Connection, table: str, policy: object) -> None:
    """Set (None: clear) the conflict policy of ``table``, inside a write transaction."""
    info = table_info(conn, table)
    if policy is None:
        conn.execute("DELETE FROM fieldsync_conflict_policy WHERE table_name = ?", (info.name,))
    else:
        conn.execute("INSERT OR REPLACE INTO fieldsync_conflict_policy (table_name, policy) VALUES (?, ?)",
                     (info.name, check_policy(policy).value))

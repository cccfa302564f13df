"""Conflicts at the consolidated, and the rows that go back to the origin.

Rules of this file:
* At the consolidated an UPDATE is conditional on its before-image
  (``col IS ?``, SQLite's equality); a mismatch is a conflict, recorded in
  ``fieldsync_conflict`` and resolved by the table's policy or a hook, and
  the resulting row goes back to the origin.
* What goes back to the origin (conflicts, the unconfirmed rule, key
  moves, rows moved into its subset) is written once the whole batch is
  applied (:meth:`Conflicts.write_returns`), each row only to the origin.
* The decisions are plain functions both backends call (the PostgreSQL
  consolidated, agent/site/postgres/apply, too): how a conflict is
  resolved (:func:`decide`, :func:`resolved`), what an INSERT of a held
  key sends back (:func:`kept_local_row`) and what goes back after a
  batch (:func:`planned_returns`); :class:`Conflicts` does SQLite's SQL
  around them, given the connection, the statements and the conflict
  hooks (the site adapter's, read at each conflict).
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from datetime import datetime
from typing import Callable, Iterable, Iterator, Mapping, Sequence

from codec.ops import OpKind, Operation

from ..capture import (FLAG_RETURN_TO_ORIGIN, KIND_DELETE, KIND_INSERT, KIND_UPDATE, Shape, table_info,
                       write_capture_row)
from ..errors import ConflictHookFailed, InvalidSetting
from ..values import pack, unpack, value_problem
from ..route import Follow
from .batch import Batch, Conflict, ConflictHook, Filter, Resolution, Table, key_after, send_back
from .followers import descendants
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
        key = op[2]
        decision, written = decide(self._hooks, table, op, local, batch)
        if written:
            # Captured as usual (origin: the peer), so every other subscriber
            # gets the result; the origin gets it from write_returns.
            conn.execute(self._statements.update_sql(table, tuple(written), ()), (*written.values(), *key))
        final_key = key_after(table.key_columns, key, written)
        result = self._statements.select(table, final_key)
        conn.execute(
            "INSERT INTO fieldsync_conflict (at, peer, peer_commit, table_name, key, local_row, incoming_before,"
            " incoming_after, resolution, result_row) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (batch.now, batch.peer, batch.commit, table.name, pack(key), pack(local), pack(op[3]), pack(op[4]),
             resolution_name(decision), None if result is None else pack(result)))
        resolved(batch, table, op, local, written, final_key, result)

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
        """Capture what goes back to the batch's origin, each row only to it
        (:func:`planned_returns`, once the whole batch is applied)."""
        conn, statements = self._conn, self._statements
        under = (lambda table, row: descendants(conn, statements, table, row)) if statements.follows else None
        for shape, kind, values, columns in planned_returns(batch, statements.select, under):
            self._write_return(shape, kind, values, columns)

    def _write_return(self, shape: Shape, kind: int, values: list, columns: Iterable[str] = ()) -> None:
        """Write one capture row for the batch's origin only.  Each gets a
        fieldsync_returned row (the columns an UPDATE sends back), which is
        also how Unconfirmed.any_unconfirmed finds them without a scan."""
        seq = write_capture_row(self._conn, shape, kind, FLAG_RETURN_TO_ORIGIN, values)
        self._conn.execute("INSERT INTO fieldsync_returned (seq, columns) VALUES (?, ?)",
                           (seq, json.dumps(sorted(columns))))


def decide(hooks: Mapping[str | None, ConflictHook], table: Table, op: tuple, local: dict,
           batch: Batch) -> tuple[Resolution | dict, dict]:
    """How a conflict is resolved: the table's hook (else the hook of every
    table), else its policy; and the values it writes over the local row
    (``{}``: keep it).  A hook that raises or returns anything but a
    Resolution or a dict of this table's columns to SQLite values raises
    ConflictHookFailed, which rolls the whole batch back."""
    incoming = tuple.__new__(Operation, op) if not isinstance(op, Operation) else op
    hook = hooks.get(table.name.lower(), hooks.get(None))
    if hook is None:
        decision: object = table.policy
    else:
        try:
            decision = hook(Conflict(batch.peer, batch.commit, table.name, op[2], dict(local), incoming))
        except Exception as error:
            raise ConflictHookFailed(f"conflict hook for {table.name} raised {type(error).__name__}: {error}; "
                                     "the batch was rolled back") from error
    if isinstance(decision, Resolution):
        return decision, (op[4] if decision is Resolution.INCOMING else {})
    if isinstance(decision, dict):
        for column, value in decision.items():
            if column not in table.columns or value_problem(value) is not None:
                raise ConflictHookFailed(f"conflict hook for {table.name} returned a bad value for column "
                                         f"{column!r}; the batch was rolled back")
        return decision, decision
    raise ConflictHookFailed(f"conflict hook for {table.name} returned {type(decision).__name__}, not a "
                             "Resolution or a dict of column values; the batch was rolled back")


def set_hook(hooks: dict[str | None, ConflictHook], table: str | None, hook: ConflictHook | None) -> None:
    """Set (None: remove) the conflict hook of ``table`` (None: of every
    table without its own) in a site object's ``hooks``."""
    if hook is not None and not callable(hook):
        raise InvalidSetting("a conflict hook must be callable")
    key = None if table is None else table.lower()
    if hook is None:
        hooks.pop(key, None)
    else:
        hooks[key] = hook


def resolution_name(decision: Resolution | dict) -> str:
    """How a conflict record names a resolution (a hook's dict: ``merged``)."""
    return decision.value if isinstance(decision, Resolution) else "merged"


def resolved(batch: Batch, table: Table, op: tuple, local: dict, written: dict, final_key: tuple,
             result: dict | None) -> None:
    """Count a conflict resolved to ``result`` (the row under ``final_key``
    now, None: gone), and send it back to the origin."""
    batch.conflicts += 1
    batch.applied += 1
    if result is not None:
        # The origin holds its change over our old row; it gets back the
        # columns the conflict was about (and any the resolution wrote).
        send_back(batch, table, final_key, {**local, **op[4]}, set(op[4]) | set(written))
        subset = batch.filters.get(table.name.lower())
        if subset is not None and subset.value(local) not in subset.values \
                and subset.value(result) in subset.values:
            # Our row was outside the origin's subset (a DELETE of it went
            # or goes there) and the change brings it in: it goes back whole.
            batch.entered.add((table.name, final_key))


def kept_local_row(batch: Batch, table: Table, op: tuple, local: dict) -> str:
    """An INSERT from the peer of a key the consolidated holds (row
    ``local``): the consolidated keeps its row and sends it back whole so
    the origin converges.  Returns the apply error's problem."""
    send_back(batch, table, op[2], {**local, **op[4]}, set(table.columns))
    return f"INSERT of an existing key: the local row was kept and sent back to {batch.peer}"


def planned_returns(batch: Batch, select: Callable[[Table, tuple], dict | None],
                    under: Callable[[Table, dict], Iterable[tuple[Table, dict]]] | None = None
                    ) -> Iterator[tuple[Shape, int, list, set[str]]]:
    """What goes back to the batch's origin, as ``(shape, kind, values,
    columns)`` capture rows for it only (``values``: the shape's columns,
    twice for an UPDATE: as the origin holds the row, then as it is here;
    ``columns``: those an UPDATE sends back).  ``select(table, key)`` reads
    a row as it is after the batch.  Planned once the whole batch is
    applied, so each holds the row's state after the batch, and a row that
    left the subset and came back within the batch causes nothing.  Per
    row, by what the origin may hold when this reaches it:

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

    A row that goes back whole takes the rows under it (``under(table,
    row)``: the rows that follow it, each ``(table, row)``, parents before
    children; followers.descendants), whole, after it: the origin lost them
    with it, or never had them under it.
    """
    received = batch.received
    routes: dict[str, dict] = {}  # by table: the routes of foreign keys (nothing changes meanwhile)
    for name_key, (table, image) in batch.stranded.items():
        # The peer moved a row this site had deleted (or moved itself,
        # to a key that no longer holds it): it goes at the peer too.
        shape = table.shape
        if shape is not None and name_key not in received and select(table, name_key[1]) is None:
            yield shape, KIND_DELETE, [image.get(column) for column in shape.columns], set()
    keys = dict.fromkeys([*batch.returns, *batch.entered, *received, *batch.touched])
    whole: set[tuple[str, tuple]] = set()  # rows gone back whole, with the rows under them
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
                yield shape, KIND_DELETE, [image.get(column) for column in shape.columns], set()
            continue  # otherwise the origin deleted it too, or an operation on its way does
        subset = batch.filters.get(table.name.lower())
        if subset is not None and subset.value(result, routes.setdefault(shape.table, {})) not in subset.values:
            if not deleted_there and (pending is not None or name_key in batch.touched):
                yield shape, KIND_DELETE, [result.get(column) for column in shape.columns], set()
            continue
        if deleted_there or name_key in batch.entered:
            if name_key in whole:
                continue
            whole.add(name_key)
            yield shape, KIND_INSERT, [result.get(column) for column in shape.columns], set()
            for child, values in under(table, result) if under is not None else ():
                child_key = (child.name, tuple(values[column] for column in child.key_columns))
                if child.shape is not None and child_key not in whole:
                    whole.add(child_key)
                    yield child.shape, KIND_INSERT, [values.get(column) for column in child.shape.columns], set()
        elif pending is not None and name_key not in whole:
            values = [pending.origin_row.get(column) for column in shape.columns]
            values += [result.get(column) for column in shape.columns]
            yield shape, KIND_UPDATE, values, pending.columns & set(shape.columns)


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


def conflict_record(row: tuple, at: datetime) -> ConflictRecord:
    """The record of a row ``(id, at, peer, peer_commit, table_name, key,
    local_row, incoming_before, incoming_after, resolution, result_row)`` of
    either backend's conflict table, its time read by the caller."""
    i, _at, peer, commit, table, key, local, before, after, resolution, result = row
    return ConflictRecord(i, at, peer, commit, table, tuple(unpack(key)), unpack(local), unpack(before),
                          unpack(after), resolution, unpack(result))


def list_conflicts(conn: sqlite3.Connection, after_id: int = 0) -> tuple[ConflictRecord, ...]:
    rows = conn.execute("SELECT id, at, peer, peer_commit, table_name, key, local_row, incoming_before,"
                        " incoming_after, resolution, result_row FROM fieldsync_conflict WHERE id > ? ORDER BY id",
                        (after_id,)).fetchall()
    return tuple(conflict_record(row, datetime.fromisoformat(row[1])) for row in rows)


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

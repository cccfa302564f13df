"""The values one apply works with: the batch being applied, what it knows
of a local table, the rows going back to the origin, and how a row's key
moves.

Rules of this file:
* Plain values and bookkeeping only: no SQL, no connection.  Every other
  module of the apply path builds on this one; it imports none of them.
* A row is named by ``(table name, key)``; the key a row has after an
  UPDATE is :func:`key_after` of the values written.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from operator import itemgetter
from enum import Enum
from typing import Any, Callable, Container, Iterable, Mapping, Protocol, Sequence

from codec.ops import OpKind, Operation, Run

from ..capture import Shape
from ..values import pack

# Recorded at a remote when the consolidated gives a row a key it holds (KeyMoves.take_key).
KEY_TAKEN = "UPDATE onto a key held here: the row there was replaced by the incoming one"


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


# Changes of a row's key KeyMoves.moved_key follows, at most.
MOVES_FOLLOWED = 16


class Table(Protocol):
    """What the rules here read of a local table, whatever the backend: a
    SQLite site's (sqlite/apply/statements.py, SqliteTable) or a PostgreSQL
    consolidated's (postgres/apply/tables.py, PgTable)."""

    name: str
    columns: tuple[str, ...]
    column_set: frozenset[str]
    key_columns: tuple[str, ...]
    shape: Shape | None
    policy: Resolution


class Return:
    """A row to send back to the batch's origin once the batch is applied."""

    __slots__ = ("table", "origin_row", "columns")

    def __init__(self, table: Table, origin_row: dict, columns: set[str]) -> None:
        self.table = table
        self.origin_row = origin_row   # the row as the origin holds it
        self.columns = columns         # the columns it gets back


class Own:
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


class Filter:
    """Which rows of a table lie in the subset of a batch's origin: those
    whose SUBSCRIBE BY column (``columns[0]``) holds one of ``values``, or,
    for a table that follows its parent, whose route does (``route``: the
    values of its foreign key ``columns`` -> the route, looked up here)."""

    __slots__ = ("columns", "values", "route")

    def __init__(self, columns: tuple[str, ...], values: frozenset,
                 route: Callable[[Sequence], Any] | None = None) -> None:
        self.columns = columns
        self.values = values
        self.route = route

    def value(self, row: Mapping[str, Any], routes: dict | None = None) -> Any:
        """What ``row`` (column -> value) is selected by; ``routes`` keeps
        the routes looked up, by foreign key, while no parent changes."""
        if self.route is None:
            return row.get(self.columns[0])
        key = tuple(row.get(column) for column in self.columns)
        if routes is None:
            return self.route(key)
        if key not in routes:
            routes[key] = self.route(key)
        return routes[key]

    def holds(self, row: Mapping[str, Any], routes: dict | None = None) -> bool:
        """Whether ``row`` lies in the subset."""
        return self.value(row, routes) in self.values

    def moves(self, before: Sequence[str], after: Sequence[str]) -> bool:
        """Whether an UPDATE with these before and after columns can move its
        row into the subset (it carries the old and new values of them all)."""
        return all(column in before and column in after for column in self.columns)

    def entered(self, before: Mapping[str, Any], after: Mapping[str, Any]) -> bool:
        """Whether an UPDATE with these images brings its row into the
        subset from outside it."""
        return (self.moves(before, after) and self.value(before) not in self.values
                and self.value(after) in self.values)


class AnyFilter:
    """The subset of a table the batch's origin gets through several
    articles (the table is in several of its publications): the rows any
    of their filters holds (docs/site-database.md, "A table in several
    publications")."""

    __slots__ = ("parts",)

    def __init__(self, parts: Sequence[Filter]) -> None:
        self.parts = tuple(parts)

    def holds(self, row: Mapping[str, Any], routes: dict | None = None) -> bool:
        return any(part.holds(row, routes) for part in self.parts)

    def moves(self, before: Sequence[str], after: Sequence[str]) -> bool:
        return all(part.moves(before, after) for part in self.parts)

    def entered(self, before: Mapping[str, Any], after: Mapping[str, Any]) -> bool:
        return self.moves(before, after) and not self.holds(before) and self.holds(after)


def peer_filters(articles: Iterable[tuple[str, str, Filter | None]], subscribed: Container[str]
                 ) -> dict[str, Filter | AnyFilter]:
    """A peer's subset of each filtered table (lower-case table -> Filter),
    from every article ``(table, publication, its filter for the peer, or
    None: every row)`` and the publications the peer subscribes to: none
    for a table one of them publishes whole; for a table in several of
    them, the rows any of them keeps."""
    filtered: dict[str, list[tuple[bool, Filter]]] = {}
    whole = set()
    for table, publication, part in articles:
        if part is None:
            if publication in subscribed:
                whole.add(table.lower())
            continue
        filtered.setdefault(table.lower(), []).append((publication in subscribed, part))
    found: dict[str, Filter | AnyFilter] = {}
    for table, parts in filtered.items():
        if table in whole:
            continue
        held = [part for kept, part in parts if kept] or [parts[0][1]]
        found[table] = held[0] if len(held) == 1 else AnyFilter(held)
    return found


class Batch:
    __slots__ = ("peer", "commit", "now", "applied", "conflicts", "errors", "returns", "filters", "touched",
                 "entered", "watched", "received", "moved", "origins", "holds", "stranded", "pending", "deferred",
                 "held", "parents_back", "followers")

    def __init__(self, peer: str, now: str) -> None:
        self.peer = peer
        self.commit = 0
        self.now = now
        self.applied = 0
        self.conflicts = 0
        self.errors = 0
        self.returns: dict[tuple[str, tuple], Return] = {}
        # The peer's subset of its filtered tables (lower-case table ->
        # Filter), and the keys of those tables the batch touched.
        self.filters: dict[str, Filter | AnyFilter] = {}
        self.touched: dict[tuple[str, tuple], Table] = {}
        # Rows that go back whole, as an INSERT: the peer moved them into its
        # subset from outside it (it may have been sent a DELETE of them that
        # reaches it after its change), or moved them away onto a key this
        # site holds (KeyMoves.refused_move).
        self.entered: set[tuple[str, tuple]] = set()
        # At the consolidated, when the log holds operations the peer has not
        # confirmed: every row the batch touched, with the values the peer
        # wrote to it ((table name, key) -> (table, {column: value})).  None
        # when nothing is unconfirmed, so the hot path does no bookkeeping.
        self.watched: dict[tuple[str, tuple], tuple[Table, dict]] | None = None
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
        self.stranded: dict[tuple[str, tuple], tuple[Table, dict]] = {}
        # At a remote: its own pending changes (lower-case table -> key -> Own).
        self.pending: dict[str, dict[tuple, Own]] = {}
        # Operations of the transaction being applied that a foreign key
        # refused, with the problem, and the rows they concern: tried again at
        # the end of the transaction (see set_aside).
        self.deferred: list[tuple[tuple, str]] = []
        self.held: set[tuple[str, tuple]] = set()
        # At a remote with rows that follow a parent: the parents the
        # transaction inserted, as (lower-case follower table, parent key),
        # and its own pending rows that follow one (followers.Followers).
        self.parents_back: set[tuple[str, tuple]] = set()
        self.followers: dict | None = None


def set_aside(batch: Batch, table: Table, op: tuple, problem: str) -> None:
    """A foreign key refused ``op`` (its parent comes later in the
    transaction, or rows that reference it go earlier): it is tried again at
    the end of the transaction, and so is every later operation of its row."""
    batch.deferred.append((op, problem))
    batch.held.add((table.name, op[2]))
    if op[1] == OpKind.UPDATE and type(op[4]) is dict:
        batch.held.add((table.name, key_after(table.key_columns, op[2], op[4])))


def deleted_later(deferred: list[tuple[tuple, str]]) -> set[tuple[str, tuple]]:
    """The rows whose last operation still set aside is a DELETE: when such
    a row is not here, nothing of its operations is left to apply (a move
    that gives a remote a row and takes it back in one transaction sends the
    INSERT of a child before its parent's, and its DELETE after)."""
    last: dict[tuple[str, tuple], int] = {}
    for op, _problem in deferred:
        last[(op[0], op[2])] = op[1]
    return {row for row, kind in last.items() if kind == OpKind.DELETE}


def settle(batch: Batch, apply_operations: Callable[[list], None], error: Callable[[tuple, str], None],
           missing: Callable[[tuple], bool] | None = None) -> None:
    """At the end of a transaction, the operations a foreign key refused
    (set_aside) are applied again (``apply_operations``), in their order,
    as long as some of them go in: a child that came before its parent, a
    parent deleted before the rows that reference it.  Those still
    refused then are recorded (``error(op, problem)``), but, given
    ``missing(op)`` (whether the row of ``op`` is not here), for a row the
    transaction deletes after them and that is not here (deleted_later)."""
    while batch.deferred:
        waiting = batch.deferred
        batch.deferred, batch.held = [], set()
        apply_operations([op for op, _ in waiting])
        if len(batch.deferred) == len(waiting):
            gone = deleted_later(batch.deferred) if missing is not None else set()
            for op, problem in batch.deferred:
                if (op[0], op[2]) in gone and missing(op):  # type: ignore[misc]
                    batch.applied += 1  # the transaction deletes the row after: nothing is left to do
                else:
                    error(op, problem)
            batch.deferred, batch.held = [], set()


def strand(batch: Batch, table: Table, key: tuple, before: dict, after: dict) -> None:
    """At the consolidated, an UPDATE of the peer's found no row under
    ``key`` (nor where this site moved it): when it gave the row another
    key, the peer holds the row there, and it goes at the peer too
    (conflicts.planned_returns)."""
    if after.keys().isdisjoint(table.key_columns):
        return
    moved = key_after(table.key_columns, key, after)
    if moved != key:
        batch.stranded[(table.name, moved)] = (table, {**before, **after, **dict(zip(table.key_columns, moved))})


def send_back(batch: Batch, table: Table, key: tuple, origin_row: dict, columns: set[str]) -> None:
    """Remember to send the final state of ``key`` back to the batch's
    origin.  It is written once the whole batch is applied, so it also
    holds what later operations of the batch did to the row."""
    pending = batch.returns.get((table.name, key))
    if pending is None:
        batch.returns[(table.name, key)] = Return(table, origin_row, columns)
    else:
        pending.origin_row.update({column: origin_row[column] for column in columns if column in origin_row})
        pending.columns |= columns


def touch(batch: Batch, table: Table, run: list) -> None:
    """Remember the keys the peer changed in a filtered table (under the
    key the row has afterwards), and those its UPDATEs bring into its
    subset from outside it."""
    key_columns = table.key_columns
    subset = batch.filters[table.name.lower()]
    for op in run:
        before, after = op[3], op[4]
        key = op[2]
        if after is not None and any(column in after for column in key_columns):
            key = key_after(key_columns, key, after)
        batch.touched[(table.name, key)] = table
        if op[1] == OpKind.UPDATE and subset.entered(before, after):
            batch.entered.add((table.name, key))


def touch_rows(batch: Batch, table: Table, run: Run) -> None:
    """:func:`touch` for a run's rows (codec.ops.Run), without the
    operations: the key each row has afterwards, and the rows an UPDATE
    brings into the subset, read by position."""
    width, before, after = run.key_width, run.before, run.after
    positions = [width + len(before) + after.index(column) if column in after else index
                 for index, column in enumerate(table.key_columns)]
    final_key = _tuple_getter(positions)
    name = table.name
    touched = batch.touched
    for row in run.rows:
        touched[(name, final_key(row))] = table
    subset = batch.filters[name.lower()]
    if run.kind == OpKind.UPDATE and subset.moves(before, after):
        checked = width + len(before)
        for row in run.rows:
            if subset.entered(dict(zip(before, row[width:checked])), dict(zip(after, row[checked:]))):
                batch.entered.add((name, final_key(row)))


def _tuple_getter(positions: list[int]) -> Callable[[tuple], tuple]:
    if len(positions) == 1:
        position = positions[0]
        return lambda row: (row[position],)
    return itemgetter(*positions)


def watch(batch: Batch, table: Table, run: list) -> None:
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
                moved = key_after(key_columns, key, after)
                if moved != key:
                    watched.setdefault((name, moved), (table, {}))[1].update(entry[1])
                    # Keyed by the key the row had before the batch.
                    first = batch.origins.pop((name, key), key)
                    batch.origins[(name, moved)] = first
                    batch.moved[(name, first)] = moved
                    holds[(name, key)] = False
                    holds[(name, moved)] = True


def key_after(key_columns: tuple[str, ...], key: tuple, values: Mapping[str, Any]) -> tuple:
    """The key a row with ``key`` has once ``values`` (column -> value) are written."""
    return tuple(values.get(column, part) for column, part in zip(key_columns, key))


def same_value(left: object, right: object) -> bool:
    """Exactly the same stored value (type and content; -0.0 is not 0.0)."""
    if type(left) is not type(right):
        return False
    if type(left) is float and left == right:
        return math.copysign(1.0, left) == math.copysign(1.0, right)  # type: ignore[arg-type]
    return left == right


def packed(value: object) -> bytes:
    try:
        return pack(value)
    except (TypeError, ValueError, OverflowError):
        return pack(repr(value))

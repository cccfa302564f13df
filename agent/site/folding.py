"""Folding a subscriber's operations of one transaction.

Rules of this file:
* Within one transaction, a DELETE and a later INSERT of the same row for
  the same subscriber become one UPDATE of the columns that differ (or
  nothing), at the INSERT's place, when no other operation on that table
  and no DELETE of another lies between them and they are at most
  FOLD_WINDOW operations apart.
* Pure: operations in, operations out; a transaction read in pieces
  (:class:`_Folder`) folds exactly as a whole one.  Operations may come
  bundled in runs (codec.ops.Run, from agent.site.selection): a run counts
  as its rows and is folded on its rows, never taken apart into the
  operations it stands for: a row that folds becomes a run of one UPDATE
  (or nothing), the run it was in is cut around it.
* A DELETE and the INSERT right after it (the subscriber's operations hold
  nothing between) always fold: the fan-out folds them as it hands them
  over (agent.site.fanout, :func:`folded_row`), and what it hands over
  then folds here as the operations it stood for would.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from operator import itemgetter

from codec.ops import OpKind, Operation, Run, Transaction


# A DELETE and an INSERT of the same row further apart than this (in the
# subscriber's operations) are not folded, so that a transaction read in
# pieces folds exactly as a whole one (docs/site-database.md, "Folding").
FOLD_WINDOW = 1_000
# The kind of an operation, and of a run.
_KIND = itemgetter(1)

def make_transaction(commit: int, origin: str, ops: list[Operation]) -> Transaction | None:
    """The transaction a subscriber receives from the operations selected
    for it out of one log transaction, in seq order (None: nothing)."""
    ops = _fold_reinserts(ops)
    return Transaction._trusted(commit, origin, tuple(ops)) if ops else None

def _fold_reinserts(ops: list[Operation]) -> list[Operation]:
    """Within one transaction, a row deleted for the subscriber and inserted
    again (deleted and re-created, or moved out of its subset and back)
    becomes an UPDATE of the columns that differ, at the INSERT's place.

    Besides saving traffic, this keeps a change the subscriber made to that
    row meanwhile: a full-row INSERT would overwrite it at the subscriber,
    while the consolidated, which applies the subscriber's change after,
    keeps it.

    Only when nothing else happened to that table in between: a row the
    transaction changed meanwhile may have taken the deleted row's UNIQUE
    value (or given up the one the INSERT takes), and the UPDATE at either
    place would break the constraint where the transaction did not.  Nor
    was another table's row deleted in between: a row that follows its
    parent goes with it at a remote (route.apply_triggers), so an UPDATE
    after the parent's DELETE would find the row gone where the INSERT
    puts it back.  And only within FOLD_WINDOW operations (see
    :class:`_Folder`)."""
    kinds = list(map(_KIND, ops))  # a run's kind is op[1] too
    if OpKind.DELETE not in kinds:
        return ops  # nothing can fold: runs stay runs
    # What comes before the first DELETE, and after the last INSERT of a
    # row deleted before it, folds into nothing and changes no decision
    # (each compares places from that DELETE on, and distances).
    first = kinds.index(OpKind.DELETE)
    end = _reinserted(ops, kinds, first)
    if end == first:
        return ops
    folder = _Folder()
    folder.add(ops[first:end])
    return [*ops[:first], *folder.take(0), *ops[end:]]

def _reinserted(ops: list, kinds: list[int], first: int) -> int:
    """Where the operations from ``first`` (a DELETE) on that hold every
    INSERT of a row deleted before it end (``first``: none, nothing folds,
    and the operations are what they are); ``kinds`` are theirs."""
    deleted: set[tuple[str, tuple]] = set()
    end = first
    for position in range(first, len(ops)):
        kind = kinds[position]
        if kind == OpKind.UPDATE:
            continue
        op = ops[position]
        if type(op) is Run:
            table, width, rows = op[0], op[2], op[5]
            if kind == OpKind.DELETE:
                if len(rows) == 1:
                    deleted.add((table, rows[0][:width]))
                else:
                    deleted.update([(table, row[:width]) for row in rows])
            elif deleted and _holds_deleted(deleted, table, width, rows):
                end = position + 1
        elif kind == OpKind.DELETE:
            deleted.add((op[0], op[2]))
        elif kind == OpKind.INSERT and (op[0], op[2]) in deleted:
            end = position + 1
    return end


def _holds_deleted(deleted: Collection[tuple[str, tuple]], table: str, width: int, rows: list) -> bool:
    """Whether the key of one of a run's ``rows`` is in ``deleted``."""
    if len(rows) == 1:
        return (table, rows[0][:width]) in deleted
    return any((table, row[:width]) in deleted for row in rows)


def folded_row(table: str, width: int, old: dict, after: tuple[str, ...], row: tuple) -> Run | None:
    """What the DELETE of a row (``old``: its columns and values) and an
    INSERT of it (``row``: key ‖ values of ``after``) fold into: a run of
    one UPDATE of the columns that differ, or None."""
    new = dict(zip(after, row[width:]))
    changed = tuple(column for column in new if not (column in old and _same(old[column], new[column])))
    if not changed:
        return None
    return _new(Run, (table, OpKind.UPDATE, width, changed, changed,
                      [(*row[:width], *[old.get(c) for c in changed], *[new[c] for c in changed])]))


def folded_alike(table: str, width: int, columns: tuple[str, ...], deleted: tuple, row: tuple) -> Run | None:
    """:func:`folded_row` of a DELETE's run row ``deleted`` and an INSERT's
    ``row`` of the same ``columns`` (each key ‖ values), compared place by
    place: in C, but where a zero (0, 0.0 and -0.0 are not the same value)
    or a type that changed asks for :func:`_same`."""
    old, new = deleted[width:], row[width:]
    at = changed_at(range(len(old)), old, new)
    if not at:
        return None
    changed = tuple([columns[place] for place in at])
    return _new(Run, (table, OpKind.UPDATE, width, changed, changed,
                      [(*row[:width], *[old[place] for place in at], *[new[place] for place in at])]))


class _Folder:
    """:func:`_fold_reinserts` for operations handed over a few at a time:
    an operation is given back (:meth:`take`) once FOLD_WINDOW operations
    follow it, when no later INSERT can fold it any more."""

    __slots__ = ("ops", "base", "deleted", "last_change", "last_delete")

    def __init__(self) -> None:
        # One place per operation, in order: an operation, None where one
        # was folded away, or a run in its first place and _MORE in the
        # places of its other rows (a DELETE folded away is cut out of its
        # run: the rows before and after it are placed as runs of their own).
        self.ops: list = []
        self.base = 0  # the index in the transaction of ops[0]
        self.deleted: dict[tuple[str, tuple], int] = {}
        self.last_change: dict[str, int] = {}  # table -> index of its latest op
        self.last_delete = -1  # the index of the latest DELETE, of any table

    def add(self, ops: list) -> None:
        held = self.ops
        if not self.deleted and OpKind.DELETE not in map(_KIND, ops):
            for op in ops:  # nothing to fold: the indexes of later DELETEs are what counts
                _place(held, op)
            return
        deleted, last_change = self.deleted, self.last_change
        for entry in ops:
            if type(entry) is Run:
                if entry[1] == OpKind.UPDATE:  # no row of it folds
                    last_change[entry[0]] = self.base + len(held) + len(entry[5]) - 1
                    _place(held, entry)
                else:
                    self._add_run(entry)
                continue
            index = self.base + len(held)
            previous = last_change.get(entry.table)
            last_change[entry.table] = index
            if entry.kind == OpKind.DELETE:
                deleted[(entry.table, entry.key)] = index
                self.last_delete = index
            elif entry.kind == OpKind.INSERT:
                position = deleted.pop((entry.table, entry.key), None)
                if position is not None and self._folds(position, previous, index):
                    old = self._unplace(position)
                    new = entry.after
                    changed = [column for column in new if not (column in old and _same(old[column], new[column]))]
                    held.append(_operation(entry.table, OpKind.UPDATE, entry.key, {c: old.get(c) for c in changed},
                                           {c: new[c] for c in changed}) if changed else None)
                    continue
            held.append(entry)

    def _add_run(self, run: Run) -> None:
        """:meth:`add` of one run, on its rows: a run is placed whole, or in
        the pieces between the rows of it that fold (each an UPDATE run of
        one row, or nothing)."""
        held, last_change = self.ops, self.last_change
        table, kind, width, before, after, rows = run
        start = self.base + len(held)
        end = start + len(rows) - 1
        deleted = self.deleted
        if kind == OpKind.INSERT and not (deleted and _holds_deleted(deleted, table, width, rows)):
            last_change[table] = end  # no row of it folds
            _place(held, run)
            return
        if kind == OpKind.DELETE:
            if len(rows) == 1:
                deleted[(table, rows[0][:width])] = start
            else:
                for index, row in enumerate(rows, start):
                    deleted[(table, row[:width])] = index
            last_change[table] = self.last_delete = end
            _place(held, run)
            return
        taken = 0  # rows placed
        for index, row in enumerate(rows, start):
            previous = last_change.get(table)
            last_change[table] = index
            key = row[:width]
            position = self.deleted.pop((table, key), None)
            if position is None or not self._folds(position, previous, index):
                continue
            if index - start > taken:
                _place(held, _new(Run, (table, kind, width, before, after, rows[taken:index - start])))
            taken = index - start + 1
            held.append(folded_row(table, width, self._unplace(position), after, row))
        if taken == 0:
            _place(held, run)
        elif taken < len(rows):
            _place(held, _new(Run, (table, kind, width, before, after, rows[taken:])))

    def _folds(self, position: int, previous: int | None, index: int) -> bool:
        """Whether the INSERT at ``index`` folds into the DELETE of its row
        at ``position``, ``previous`` the index of its table's operation before it."""
        return (previous == position and self.last_delete == position and index - position <= FOLD_WINDOW
                and position >= self.base)

    def _unplace(self, position: int) -> dict:
        """Take the DELETE at ``position`` out of its place (a run is cut
        around its row); return its old row."""
        held = self.ops
        at = position - self.base
        op = held[at]
        if type(op) is not Run and op is not _MORE:
            held[at] = None
            return op.before
        first = at
        while held[first] is _MORE:
            first -= 1
        run = held[first]
        table, kind, width, before, after, rows = run
        cut = at - first
        row = rows[cut]
        held[first] = _new(Run, (table, kind, width, before, after, rows[:cut])) if cut else None
        held[at] = None
        if cut + 1 < len(rows):
            held[at + 1] = _new(Run, (table, kind, width, before, after, rows[cut + 1:]))
        return dict(zip(before, row[width:]))

    def take(self, keep: int) -> list:
        """The operations but the last ``keep``, folded, in order (a run the
        line falls inside is cut in two)."""
        held = self.ops
        cut = len(held) - keep
        if cut <= 0:
            return []
        first = cut
        if cut < len(held) and held[cut] is _MORE:
            while held[first] is _MORE:
                first -= 1  # the run placed at first goes on past the cut
        taken = [op for op in held[:first] if op is not None and op is not _MORE]
        if first < cut:
            run = held[first]
            taken.append(run._replace(rows=run.rows[:cut - first]))
            held[cut] = run._replace(rows=run.rows[cut - first:])
        del held[:cut]
        self.base += cut
        if self.deleted:
            self.deleted = {key: index for key, index in self.deleted.items() if index >= self.base}
        return taken


# The places of a run's rows after its first (see _Folder.ops).
_MORE = object()


def _place(held: list, op: object) -> None:
    held.append(op)
    if type(op) is Run and len(op[5]) > 1:
        held.extend([_MORE] * (len(op[5]) - 1))

_new = tuple.__new__


def changed_at(places: Iterable[int], old: Sequence, new: Sequence) -> list[int]:
    """The ``places`` (one for each value of ``old`` and ``new``) where
    the values differ, exactly: compared in C, but with :func:`_same` where
    ``old`` holds a zero (0, 0.0 and -0.0 are equal by ``==``, not the same)."""
    if 0.0 in old:
        return [place for place, a, b in zip(places, old, new) if not _same(a, b)]
    return [place for place, a, b in zip(places, old, new) if a != b or type(a) is not type(b)]


def _same(left: object, right: object) -> bool:
    if type(left) is not type(right):
        return False
    if type(left) is float:
        return left == right and math.copysign(1.0, left) == math.copysign(1.0, right)  # type: ignore[arg-type]
    return left == right

def _operation(table: str, kind: int, key: tuple, before: dict | None, after: dict | None) -> Operation:
    # Built from values SQLite handed back, so already valid: skip the
    # constructor's per-value checks on this hot path.
    return tuple.__new__(Operation, (table, kind, key, before, after))

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
  as its rows; in a transaction that deletes a row and inserts it again,
  runs of INSERTs and DELETEs are taken apart into the operations they
  stand for, runs of UPDATEs keep their places.
"""

from __future__ import annotations

import math

from codec.ops import OpKind, Operation, Run, Transaction


# A DELETE and an INSERT of the same row further apart than this (in the
# subscriber's operations) are not folded, so that a transaction read in
# pieces folds exactly as a whole one (docs/site-database.md, "Folding").
FOLD_WINDOW = 1_000

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
    if not any(op[1] == OpKind.DELETE for op in ops) or not _reinserted(ops):  # a run's kind is op[1] too
        return ops  # nothing can fold: runs stay runs
    folder = _Folder()
    folder.add(ops)
    return folder.take(0)

def _reinserted(ops: list) -> bool:
    """Whether a row deleted in ``ops`` is inserted again after its DELETE
    (else nothing folds, and the operations are what they are)."""
    deleted: set[tuple[str, tuple]] = set()
    for op in ops:
        kind = op[1]
        if type(op) is Run:
            width, table = op.key_width, op.table
            if kind == OpKind.DELETE:
                deleted.update((table, row[:width]) for row in op.rows)
            elif kind == OpKind.INSERT and deleted and any((table, row[:width]) in deleted for row in op.rows):
                return True
        elif kind == OpKind.DELETE:
            deleted.add((op[0], op[2]))
        elif kind == OpKind.INSERT and (op[0], op[2]) in deleted:
            return True
    return False


class _Folder:
    """:func:`_fold_reinserts` for operations handed over a few at a time:
    an operation is given back (:meth:`take`) once FOLD_WINDOW operations
    follow it, when no later INSERT can fold it any more."""

    __slots__ = ("ops", "base", "deleted", "last_change", "last_delete")

    def __init__(self) -> None:
        # One place per operation, in order: an operation, None where one
        # was folded away, or a run in its first place and _MORE in the
        # places of its other rows (a run of UPDATEs is never taken apart:
        # only INSERTs and DELETEs fold).
        self.ops: list = []
        self.base = 0  # the index in the transaction of ops[0]
        self.deleted: dict[tuple[str, tuple], int] = {}
        self.last_change: dict[str, int] = {}  # table -> index of its latest op
        self.last_delete = -1  # the index of the latest DELETE, of any table

    def add(self, ops: list) -> None:
        held = self.ops
        if not self.deleted and not any(op[1] == OpKind.DELETE for op in ops):
            for op in ops:  # nothing to fold: the indexes of later DELETEs are what counts
                _place(held, op)
            return
        deleted, last_change = self.deleted, self.last_change
        for entry in ops:
            if type(entry) is Run and entry.kind == OpKind.UPDATE:
                last_change[entry.table] = self.base + len(held) + len(entry.rows) - 1
                _place(held, entry)
                continue
            for op in (entry.operations() if type(entry) is Run else (entry,)):
                index = self.base + len(held)
                previous = last_change.get(op.table)
                last_change[op.table] = index
                if op.kind == OpKind.DELETE:
                    deleted[(op.table, op.key)] = index
                    self.last_delete = index
                elif op.kind == OpKind.INSERT:
                    position = deleted.pop((op.table, op.key), None)
                    if (position is not None and previous == position and self.last_delete == position
                            and index - position <= FOLD_WINDOW and position >= self.base):
                        old = held[position - self.base].before
                        new = op.after
                        changed = [column for column in new
                                   if not (column in old and _same(old[column], new[column]))]
                        held[position - self.base] = None
                        held.append(_operation(op.table, OpKind.UPDATE, op.key, {c: old.get(c) for c in changed},
                                               {c: new[c] for c in changed}) if changed else None)
                        continue
                held.append(op)

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
    if type(op) is Run and len(op.rows) > 1:
        held.extend([_MORE] * (len(op.rows) - 1))

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

"""Folding a subscriber's operations of one transaction.

Rules of this file:
* Within one transaction, a DELETE and a later INSERT of the same row for
  the same subscriber become one UPDATE of the columns that differ (or
  nothing), at the INSERT's place, when no other operation on that table
  lies between them and they are at most FOLD_WINDOW operations apart.
* Pure: operations in, operations out; a transaction read in pieces
  (:class:`_Folder`) folds exactly as a whole one.  Operations may come
  bundled in runs (codec.ops.Run, from agent.site.selection): a run counts
  as its rows, and where a DELETE asks for folding the runs are taken
  apart into the operations they stand for.
"""

from __future__ import annotations

import math

from codec.ops import OpKind, Operation, Run, Transaction, op_count, operations_of, split_ops


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
    place would break the constraint where the transaction did not.  And
    only within FOLD_WINDOW operations (see :class:`_Folder`)."""
    if not any(op[1] == OpKind.DELETE for op in ops):  # a run's kind is op[1] too
        return ops
    folder = _Folder()
    folder.add(ops)
    return folder.take(0)

class _Folder:
    """:func:`_fold_reinserts` for operations handed over a few at a time:
    an operation is given back (:meth:`take`) once FOLD_WINDOW operations
    follow it, when no later INSERT can fold it any more."""

    __slots__ = ("ops", "base", "deleted", "last_change")

    def __init__(self) -> None:
        self.ops: list[Operation | Run | None] = []
        self.base = 0  # the index in the transaction of the first operation held
        self.deleted: dict[tuple[str, tuple], int] = {}
        self.last_change: dict[str, int] = {}  # table -> index of its latest op

    def add(self, ops: list) -> None:
        if not self.deleted and not any(op[1] == OpKind.DELETE for op in ops):
            self.ops.extend(ops)  # nothing to fold: the indexes of later DELETEs are what counts
            return
        if any(type(op) is Run for op in self.ops):
            self.ops = list(operations_of(self.ops))  # held positions become operations' indexes
        deleted, last_change, held = self.deleted, self.last_change, self.ops
        for op in operations_of(ops):
            index = self.base + len(held)
            previous = last_change.get(op.table)
            last_change[op.table] = index
            if op.kind == OpKind.DELETE:
                deleted[(op.table, op.key)] = index
            elif op.kind == OpKind.INSERT:
                position = deleted.pop((op.table, op.key), None)
                if (position is not None and previous == position and index - position <= FOLD_WINDOW
                        and position >= self.base):
                    old = held[position - self.base].before  # type: ignore[union-attr]
                    new = op.after
                    changed = [column for column in new if not (column in old and _same(old[column], new[column]))]
                    held[position - self.base] = None
                    held.append(_operation(op.table, OpKind.UPDATE, op.key, {c: old.get(c) for c in changed},
                                           {c: new[c] for c in changed}) if changed else None)
                    continue
            held.append(op)

    def take(self, keep: int) -> list:
        """The operations but the last ``keep``, folded, in order."""
        cut = op_count(self.ops) - keep  # a folded-away place (None) counts one
        if cut <= 0:
            return []
        head, self.ops = split_ops(self.ops, cut)
        taken = [op for op in head if op is not None]
        self.base += cut
        if self.deleted:
            self.deleted = {key: index for key, index in self.deleted.items() if index >= self.base}
        return taken

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

"""Replicated operations and transactions: the values message payloads carry.

Rules of this file:
* An operation is a 5-tuple ``(table, kind, key, before, after)``.  It is the
  hot value of the whole system, so it stays a tuple: :class:`Operation` is a
  ``NamedTuple`` subclass that validates on construction (local code builds
  operations with it), the packer serializes it without conversion, and the
  decoder hands back the plain tuples msgpack made (equal to the
  ``Operation`` they came from).  Code that applies decoded operations
  passes each through :func:`check_operation`, which validates it and gives
  the named form.
* Values are the SQLite storage classes and nothing else: ``None``, ``int``
  (signed 64-bit), ``float`` (NaN and infinities included), ``str``, ``bytes``.
* Row images are plain ``dict``\\ s from column name to value.
* On the wire (format version 2) consecutive operations of one table, kind
  and column layout travel as a :class:`Run` of positional rows; the
  agent's apply path takes the runs as decoded (a row is the parameter
  list of its statement), everything else the operations they stand for
  (:meth:`Run.operations`).  :func:`to_runs` makes the runs of operations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from operator import itemgetter
from typing import TYPE_CHECKING, Annotated, Iterable, Iterator, Mapping, NamedTuple, Sequence, Union

from msgspec import Meta

from .changes import SchemaChange
from .errors import InvalidValue

Value = Union[None, int, float, str, bytes]
RowImage = Mapping[str, Value]

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
# Commit offsets and counters travel as unsigned 64-bit numbers in headers;
# keep them in the signed range so SQLite can store them too.
OFFSET_MAX = INT64_MAX


class OpKind:
    """Operation kinds.  Plain ints (not an Enum) so decoded operations need
    no conversion; :data:`OP_KIND_NAMES` gives their names."""

    INSERT = 1
    UPDATE = 2
    DELETE = 3


OP_KIND_NAMES = {OpKind.INSERT: "INSERT", OpKind.UPDATE: "UPDATE", OpKind.DELETE: "DELETE"}


def check_value(value: object, where: str) -> None:
    """Raise InvalidValue unless ``value`` is one of SQLite's storage classes."""
    kind = type(value)
    if value is None or kind is str or kind is bytes or kind is float:
        return
    if kind is int:
        if not INT64_MIN <= value <= INT64_MAX:  # type: ignore[operator]
            raise InvalidValue(f"{where}: integer {value} is outside SQLite's 64-bit range")
        return
    raise InvalidValue(f"{where}: {kind.__name__} is not a SQLite value (None, int, float, str, bytes)")


def check_image(image: object, where: str) -> None:
    if image is None:
        return
    if not isinstance(image, dict):
        raise InvalidValue(f"{where}: row image must be a dict of column -> value, not {type(image).__name__}")
    for column, value in image.items():
        if type(column) is not str or not column:
            raise InvalidValue(f"{where}: column names must be non-empty strings, got {column!r}")
        check_value(value, f"{where}.{column}")


class _OperationFields(NamedTuple):
    table: str
    kind: int  # an OpKind value
    key: tuple
    before: dict | None
    after: dict | None


class Operation(_OperationFields):
    """One row change.

    * INSERT: ``after`` is the full new row, ``before`` is None.
    * UPDATE: ``before`` holds the old values of the columns checked for
      conflicts (at least the changed ones), ``after`` the new values of the
      changed columns.
    * DELETE: ``before`` holds the old row, ``after`` is None.

    ``key`` is the primary-key values in primary-key column order.
    """

    __slots__ = ()

    def __new__(cls, table: str, kind: int, key: tuple, before: dict | None = None,
                after: dict | None = None) -> "Operation":
        if type(table) is not str or not table:
            raise InvalidValue(f"operation table must be a non-empty string, got {table!r}")
        if type(kind) is not int or kind not in OP_KIND_NAMES:
            raise InvalidValue(f"operation on {table}: unknown kind {kind!r}")
        if not isinstance(key, tuple) or not key:
            raise InvalidValue(f"operation on {table}: key must be a non-empty tuple, got {key!r}")
        for position, part in enumerate(key):
            check_value(part, f"{table} key[{position}]")
        check_image(before, f"{table} before")
        check_image(after, f"{table} after")
        if kind == OpKind.INSERT and (after is None or before is not None):
            raise InvalidValue(f"INSERT on {table} needs an after-image and no before-image")
        if kind == OpKind.DELETE and (before is None or after is not None):
            raise InvalidValue(f"DELETE on {table} needs a before-image and no after-image")
        if kind == OpKind.UPDATE and (before is None or after is None):
            raise InvalidValue(f"UPDATE on {table} needs both a before-image and an after-image")
        return tuple.__new__(cls, (table, kind, key, before, after))

    # Convenience constructors used by capture and by tests.
    @classmethod
    def insert(cls, table: str, key: tuple, row: dict) -> "Operation":
        return cls(table, OpKind.INSERT, key, None, row)

    @classmethod
    def update(cls, table: str, key: tuple, old: dict, new: dict) -> "Operation":
        return cls(table, OpKind.UPDATE, key, old, new)

    @classmethod
    def delete(cls, table: str, key: tuple, old: dict) -> "Operation":
        return cls(table, OpKind.DELETE, key, old, None)


class Run(NamedTuple):
    """Consecutive operations of one table and kind with the same key
    width and image columns (docs/message-format.md, version 2).  Each row
    is ``key ‖ before values ‖ after values``; an INSERT has no before
    columns, a DELETE no after columns.  Decoded runs were checked for
    structure (codec.message), not their values.

    The annotations are also the shape msgspec reads a version-2 payload's
    runs in (codec.payloads): each ``Meta`` is a check made there, in C.
    At run time ``rows`` holds msgpack's scalars other than bin only:
    msgspec takes one of str and bytes in a union, so a payload with a
    blob in it is read the other way, which checks it in Python."""

    table: Annotated[str, Meta(min_length=1)]
    kind: Annotated[int, Meta(ge=1, le=3)]
    key_width: Annotated[int, Meta(ge=1)]
    before: tuple[Annotated[str, Meta(min_length=1)], ...]
    after: tuple[Annotated[str, Meta(min_length=1)], ...]
    if TYPE_CHECKING:
        rows: tuple[tuple, ...]
    else:
        rows: Annotated[tuple[tuple[Union[None, bool, int, float, str], ...], ...], Meta(min_length=1)]

    def operations(self) -> list[Operation]:
        """The operations this run stands for (their values unchecked)."""
        table, kind, width, before, after, rows = self
        new = tuple.__new__
        if kind == OpKind.INSERT:
            return [new(Operation, (table, kind, row[:width], None, dict(zip(after, row[width:])))) for row in rows]
        if kind == OpKind.DELETE:
            return [new(Operation, (table, kind, row[:width], dict(zip(before, row[width:])), None)) for row in rows]
        middle = width + len(before)
        return [new(Operation, (table, kind, row[:width], dict(zip(before, row[width:middle])),
                                dict(zip(after, row[middle:])))) for row in rows]


# Rows of one run at most: a reader decodes a run whole, so this bounds
# what it holds of a large transaction's entry (docs/message-format.md).
RUN_ROWS = 1_000


def to_runs(ops: Iterable[tuple]) -> list[Run]:
    """The runs of ``ops`` (Operations or their plain tuples, and runs), in
    order, of at most :data:`RUN_ROWS` rows each: the same runs however the
    operations came bundled, so the bytes of a message depend on its
    operations only.  A run handed in that needs no merging is taken as it
    is (never changed); the others' ``rows`` are new lists.  Raises InvalidValue
    for an operation a run cannot carry (an image that is not a dict, or
    one its kind does not have)."""
    return runs_counted(ops)[0]


def runs_counted(ops: Iterable[tuple]) -> tuple[list[Run], int]:
    """:func:`to_runs` of ``ops``, and how many operations they hold
    (:func:`op_count`): runs taken as they are are counted in the pass
    that checks them."""
    given: Sequence = ops if type(ops) is tuple or type(ops) is list else tuple(ops)
    if given and type(given[0]) is Run:
        count = _rows_taken_as_they_are(given)
        if count:
            return list(given), count
    return _operation_runs(given), op_count(given)


_ROWS = itemgetter(5)
_RUN_ONLY = {Run}
_new = tuple.__new__


def _operation_runs(ops: Sequence[tuple]) -> list[Run]:
    """to_runs of operations (the packer's hot loop); given a run among
    them, :func:`_mixed_runs` starts again."""
    runs: list[Run] = []
    signature = None
    rows: list = []
    for op in ops:
        try:
            table, kind, key, before, after = op
            if kind == OpKind.INSERT and before is None:
                mine: tuple = (table, kind, len(key), (), (*after,))
                row = (*key, *after.values())
            elif kind == OpKind.UPDATE:
                mine = (table, kind, len(key), (*before,), (*after,))
                row = (*key, *before.values(), *after.values())
            elif kind == OpKind.DELETE and after is None:
                mine = (table, kind, len(key), (*before,), ())
                row = (*key, *before.values())
            else:
                raise TypeError
        except (TypeError, ValueError, AttributeError):
            if type(op) is Run:  # six fields: it came here through the ValueError
                return _mixed_runs(ops)
            raise InvalidValue(f"operation {op!r:.80} cannot travel in a run") from None
        if mine == signature and len(rows) < RUN_ROWS:
            rows.append(row)
        else:
            signature = mine
            rows = [row]
            runs.append(_new(Run, (*mine, rows)))
    return runs


def _rows_taken_as_they_are(runs: Sequence[Run]) -> int:
    """The rows of ``runs`` when to_runs of them is the runs themselves,
    as it is of the runs a reader or to_runs made (each a Run of
    1..RUN_ROWS rows, and no two in a row of one head: table, kind and
    columns, which it would merge); else 0.  One run at a time: bulk
    steps (sets of types, maps of lengths and heads) cost more, from a few
    runs to thousands."""
    previous = _NO_RUN
    count = 0
    for run in runs:
        if type(run) is not Run:
            return 0
        rows = len(run[5])
        # The head compared field by field, kind first: most neighbours
        # differ there, and no head is sliced out.
        if not 0 < rows <= RUN_ROWS or (run[1] == previous[1] and run[0] == previous[0] and run[2] == previous[2]
                                         and run[3] == previous[3] and run[4] == previous[4]):
            return 0
        previous = run
        count += rows
    return count


# What the first run is compared with: only a head of nils equals it, and
# then the runs go the long way, which is never wrong (0 only costs time).
_NO_RUN = (None,) * 6


def _mixed_runs(ops: Iterable[tuple]) -> list[Run]:
    """to_runs of operations and runs mixed, or of runs that merge."""
    runs: list[Run] = []
    signature = None
    rows: list = []
    borrowed = False  # runs[-1] is a run handed in (shared, maybe with other packers): never extended
    for op in ops:
        if type(op) is Run:
            mine = op[:5]
            if (mine != signature or len(rows) >= RUN_ROWS) and 0 < len(op.rows) <= RUN_ROWS:
                runs.append(op)  # as it is: the common case, a run the reader made
                signature, rows, borrowed = mine, op.rows, True
                continue
            taken = 0
            while taken < len(op.rows):
                if mine != signature or len(rows) >= RUN_ROWS:
                    signature = mine
                    rows = []
                    runs.append(Run(*mine, rows))  # type: ignore[call-arg]
                elif borrowed:
                    rows = list(rows)
                    runs[-1] = runs[-1]._replace(rows=rows)
                borrowed = False
                more = op.rows[taken:taken + RUN_ROWS - len(rows)]
                rows.extend(more)
                taken += len(more)
            continue
        try:
            table, kind, key, before, after = op
            if kind == OpKind.INSERT and before is None:
                columns: tuple = ((), (*after,))
                row = (*key, *after.values())
            elif kind == OpKind.UPDATE:
                columns = ((*before,), (*after,))
                row = (*key, *before.values(), *after.values())
            elif kind == OpKind.DELETE and after is None:
                columns = ((*before,), ())
                row = (*key, *before.values())
            else:
                raise TypeError
        except (TypeError, ValueError, AttributeError):
            raise InvalidValue(f"operation {op!r:.80} cannot travel in a run") from None
        mine = (table, kind, len(key), *columns)
        if mine != signature or len(rows) >= RUN_ROWS:
            signature = mine
            rows = []
            runs.append(Run(table, kind, len(key), columns[0], columns[1], rows))  # type: ignore[arg-type]
        elif borrowed:
            rows = list(rows)
            runs[-1] = runs[-1]._replace(rows=rows)
        borrowed = False
        rows.append(row)
    return runs


def op_count(ops: Iterable) -> int:
    """How many operations ``ops`` holds, a run counting its rows."""
    if type(ops) is tuple or type(ops) is list:
        if not ops or type(ops[0]) is not Run:
            if Run not in map(type, ops):
                return len(ops)
        elif len(ops) == 1:  # one run: a fan-out's class hands one over most often
            return len(ops[0][5])
        elif set(map(type, ops)) == _RUN_ONLY:
            return sum(map(len, map(_ROWS, ops)))
    return sum(len(op.rows) if type(op) is Run else 1 for op in ops)


def split_ops(ops: list, count: int) -> tuple[list, list]:
    """The first ``count`` operations of ``ops`` and the rest (a run cut
    in two where the line falls inside it)."""
    taken = 0
    for index, op in enumerate(ops):
        size = len(op.rows) if type(op) is Run else 1
        if taken + size > count:
            if type(op) is not Run or taken == count:
                return ops[:index], ops[index:]
            cut = count - taken
            return [*ops[:index], op._replace(rows=op.rows[:cut])], [op._replace(rows=op.rows[cut:]), *ops[index + 1:]]
        taken += size
    return ops, []


def operations_of(ops: Iterable) -> Iterator[tuple]:
    """Operations, with every :class:`Run` among ``ops`` expanded."""
    for op in ops:
        if type(op) is Run:
            yield from op.operations()
        else:
            yield op


def check_operation(fields: tuple) -> Operation:
    """Validate a decoded operation tuple and return it as an Operation.

    Raises InvalidValue naming what is wrong.
    """
    if isinstance(fields, Operation):
        return fields
    if type(fields) is not tuple or len(fields) != 5:
        raise InvalidValue(f"operation must be a 5-tuple (table, kind, key, before, after), got {fields!r:.80}")
    table, kind, key, before, after = fields
    return Operation(table, kind, key, before, after)


@dataclass(frozen=True, slots=True)
class Transaction:
    """One committed transaction of a site's log.

    ``commit`` is its commit offset in the publisher's log (strictly
    increasing along the log); ``origin`` names the site where the change was
    first made.  Built locally, ``ops`` holds :class:`Operation` values; in a
    decoded message it holds the equal plain tuples (see
    :func:`check_operation`).  A transaction that carries a schema change
    holds it alone: ``ops`` is ``(SchemaChange,)`` (:func:`change_of`).
    ``applied``, for a transaction whose origin is its recipient (rows
    written back to it), is the recipient's log offset through which the
    sender had applied the recipient's stream when it wrote the
    transaction; None: not known (docs/message-format.md, version 4).
    """

    commit: int
    origin: str
    ops: tuple[Operation, ...]
    applied: int | None = None

    def __post_init__(self) -> None:
        if type(self.commit) is not int or not 0 < self.commit <= OFFSET_MAX:
            raise InvalidValue(f"transaction commit offset must be an int in 1..{OFFSET_MAX}, got {self.commit!r}")
        if type(self.origin) is not str or not self.origin:
            raise InvalidValue(f"transaction {self.commit}: origin must be a non-empty site name")
        if self.applied is not None and (type(self.applied) is not int or not 0 < self.applied <= OFFSET_MAX):
            raise InvalidValue(f"transaction {self.commit}: applied must be an int in 1..{OFFSET_MAX}, "
                               f"got {self.applied!r}")
        if type(self.ops) is not tuple:
            object.__setattr__(self, "ops", tuple(self.ops))
        if not set(map(type, self.ops)) <= {Operation}:
            if len(self.ops) == 1 and type(self.ops[0]) is SchemaChange:
                return  # a schema change travels alone in its transaction (codec.changes)
            for op in self.ops:
                if not isinstance(op, Operation):
                    raise InvalidValue(f"transaction {self.commit}: ops must be Operation values, "
                                       f"got {type(op).__name__}")

    @classmethod
    def _trusted(cls, commit: int, origin: str, ops: tuple[Operation, ...],
                 applied: int | None = None) -> "Transaction":
        """Build without validation (the decoder has checked the structure)."""
        transaction = object.__new__(cls)
        _set_commit(transaction, commit)
        _set_origin(transaction, origin)
        _set_ops(transaction, ops)
        _set_applied(transaction, applied)
        return transaction

    def with_applied(self, applied: int | None) -> "Transaction":
        """This transaction (of its own class: a piece stays a piece) with ``applied``."""
        if applied is not None and (type(applied) is not int or not 0 < applied <= OFFSET_MAX):
            raise InvalidValue(f"transaction {self.commit}: applied must be an int in 1..{OFFSET_MAX}, "
                               f"got {applied!r}")
        return type(self)._trusted(self.commit, self.origin, self.ops, applied)


# The slots' own setters: what object.__setattr__ calls, without looking
# each name up (a decoder builds a transaction per entry).
_set_commit, _set_origin, _set_ops, _set_applied = (Transaction.__dict__[field].__set__
                                                    for field in ("commit", "origin", "ops", "applied"))


def change_of(transaction: Transaction) -> SchemaChange | None:
    """The schema change ``transaction`` carries, if it is one (a group's
    transaction, whose ``ops`` come as they are read, never is)."""
    ops = transaction.ops
    if type(ops) is tuple and len(ops) == 1 and type(ops[0]) is SchemaChange:
        return ops[0]
    return None


class PartialTransaction(Transaction):
    """A piece of a transaction handed over in pieces (a large log
    transaction read in bounded memory): the pieces of one transaction are
    consecutive, with its commit and origin, all ``PartialTransaction`` but
    the last, a plain :class:`Transaction` (codec.packing)."""

    __slots__ = ()


def values_identical(left: object, right: object) -> bool:
    """Equality that treats NaN as equal to NaN and tells 0.0 from -0.0.

    SQLite keeps both distinctions, so a round trip must too; ``==`` cannot
    check that for floats.
    """
    if isinstance(left, Transaction) and isinstance(right, Transaction):
        return ((left.commit, left.origin, left.applied) == (right.commit, right.origin, right.applied)
                and values_identical(left.ops, right.ops))
    if isinstance(left, tuple) and isinstance(right, tuple):  # Operation vs decoded tuple
        return len(left) == len(right) and all(values_identical(a, b) for a, b in zip(left, right))
    if type(left) is not type(right):
        return False
    if isinstance(left, float):
        if math.isnan(left):
            return math.isnan(right)  # type: ignore[arg-type]
        return left == right and math.copysign(1.0, left) == math.copysign(1.0, right)  # type: ignore[arg-type]
    if isinstance(left, (tuple, list)) and isinstance(right, (tuple, list)):
        return len(left) == len(right) and all(values_identical(a, b) for a, b in zip(left, right))  # type: ignore[arg-type]
    if isinstance(left, dict):
        return left.keys() == right.keys() and all(values_identical(v, right[k]) for k, v in left.items())  # type: ignore[index, union-attr]
    return left == right

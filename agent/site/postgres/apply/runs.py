"""A decoded run (codec.ops.Run) made ready for the apply's fast path.

Rules of this file:
* What a run needs from Python before its set-based statements can go
  (its table, its rows as the statement's parameters, the operations it
  stands for, each chunk's JSON parameter) depends on the run and the
  published tables only, never on what the database answered.
* A :class:`Ready` is values only; a run that cannot go as one (a table
  not published, a key of another width, a column this site lacks, a
  value that is not a SQLite value or that its column's type cannot take)
  is None here and goes operation by operation in the driver, where what
  is wrong is recorded.
* A column is dumped at once (typemap.dump_column), not value by value.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from operator import itemgetter
from typing import Callable, Sequence

from codec.ops import INT64_MAX, INT64_MIN, OpKind, Run

from ..errors import ValueNotConvertible
from ..typemap import dump_column
from .tables import PgTable, Tables, many_params

# The types of SQLite's values (an int also within 64 bits: agent.site.values).
_VALUE_TYPES = frozenset({type(None), int, float, str, bytes})


@dataclass(frozen=True, slots=True)
class Ready:
    """A run made ready: its table, its operations, each one's statement
    parameters, and the JSON parameter (tables.many_params) of each chunk
    of them in turn, ``chunk`` operations a chunk (ready_run)."""

    table: PgTable
    ops: list
    params: list
    chunks: tuple[str, ...]


def ready_run(tables: Tables, run: Run, chunk: int) -> Ready | None:
    """``run`` made ready (see the module's rules), or None when it goes
    one operation at a time."""
    table = tables.table(run.table)
    kind, width, before, after = run.kind, run.key_width, run.before, run.after
    if table is None or width != len(table.key_columns) or not _plain_values(run.rows):
        return None
    if kind != OpKind.DELETE and (not after or not table.column_set.issuperset(after + before)):
        return None
    # A row is key, before, after; the statement takes after, key, before.
    middle = width + len(before)
    if kind == OpKind.INSERT:
        columns, positions = after, range(width, middle + len(after))
    elif kind == OpKind.DELETE:
        columns, positions = table.key_columns, range(width)
    else:
        columns = after + table.key_columns + before
        positions = [*range(middle, middle + len(after)), *range(width), *range(width, middle)]
    try:
        # A value that does not convert sends the run the general way, which names its column.
        dumped = [dump_column(table.kinds[column], values)
                  for column, values in zip(columns, zip(*map(_picker(positions), run.rows)))]
    except ValueNotConvertible:
        return None
    params = list(zip(*dumped))
    chunks = tuple(many_params(params[start:start + chunk]) for start in range(0, len(params), chunk))
    return Ready(table, run.operations(), params, chunks)


def _picker(positions: Sequence[int]) -> Callable[[tuple], tuple]:
    """A function from a run's row to its values at ``positions``, in that order."""
    if len(positions) == 1:
        position = positions[0]
        return lambda row: (row[position],)
    return itemgetter(*positions)


def _plain_values(rows: tuple) -> bool:
    """Whether every value of ``rows`` is a SQLite value (agent.site.values):
    the types at once, then the integers' range."""
    types = set(map(type, chain.from_iterable(rows)))
    if not _VALUE_TYPES.issuperset(types):
        return False
    if int not in types:
        return True
    integers = [value for value in chain.from_iterable(rows) if type(value) is int]
    return INT64_MIN <= min(integers) and max(integers) <= INT64_MAX

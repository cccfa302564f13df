"""Runs made ready for the fast path ahead of the statements that apply
them, on a thread of their own.

Rules of this file:
* What a decoded run (codec.ops.Run) needs from Python before its
  set-based statements can go (its table, its rows as the statement's
  parameters, the operations it stands for, each chunk's JSON parameter)
  depends on the run and the published tables only, never on what the
  database answered.  So one thread makes it while the batch's thread
  waits for PostgreSQL to run the statements before it: the client's work
  and the server's overlap, as they do under psycopg's ``executemany``,
  instead of taking turns.
* It reads ahead at most ``AHEAD`` transactions, each held whole in memory
  already (a list or tuple of operations): a transaction whose operations
  are read once as they are applied (a group of parts from the spool) is
  not read ahead, and the ones after it wait for it.
* The batch's thread alone touches the batch and the connection: a
  :class:`Ready` is values only, and a run that cannot go as one (a table
  not published, a key of another width, a column this site lacks, a
  value that is not a SQLite value or that its column's type cannot take)
  is None here and goes operation by operation there, where what is wrong
  is recorded.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import chain
from operator import itemgetter
from typing import Callable, Iterable, Iterator, Sequence

from codec.ops import INT64_MAX, INT64_MIN, OpKind, Run, Transaction

from ..errors import ValueNotConvertible
from ..typemap import dump_column
from .tables import PgTable, Tables, many_params

# Transactions made ready ahead of the one being applied.
AHEAD = 2
# The types of SQLite's values (an int also within 64 bits: agent.site.values).
_VALUE_TYPES = frozenset({type(None), int, float, str, bytes})


@dataclass(frozen=True, slots=True)
class Ready:
    """A run made ready: its table, its operations, each one's statement
    parameters, and the JSON parameter of each ``chunk`` of them in turn
    (tables.many_params)."""

    table: PgTable
    ops: list
    params: list
    chunk: int
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
    return Ready(table, run.operations(), params, chunk, chunks)


def ready_runs(tables: Tables, ops: Sequence, chunk: int) -> tuple[Ready | None, ...]:
    """:func:`ready_run` of each run among a transaction's ``ops`` (None
    for an operation that is not a run)."""
    return tuple(ready_run(tables, item, chunk) if type(item) is Run else None for item in ops)


def read_ahead(transactions: Iterable[Transaction], tables: Tables,
               chunk: int) -> Iterator[tuple[Transaction, tuple[Ready | None, ...] | None]]:
    """Each transaction with its runs made ready (:func:`ready_runs`), made
    on one thread up to ``AHEAD`` transactions ahead; None for a
    transaction whose operations are read once."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="fieldsync-apply-ahead") as pool:
        window: deque[tuple[Transaction, Future | None]] = deque()
        each = iter(transactions)

        def fill() -> None:
            # Not past a transaction read once: the ones after it wait until it is applied.
            while len(window) < AHEAD and (not window or window[-1][1] is not None):
                transaction = next(each, None)
                if transaction is None:
                    return
                ops = transaction.ops
                made = pool.submit(ready_runs, tables, ops, chunk) if isinstance(ops, (list, tuple)) else None
                window.append((transaction, made))

        fill()
        while window:
            transaction, made = window.popleft()
            if made is not None:
                fill()
            yield transaction, None if made is None else made.result()
            if made is None:
                fill()


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

"""Conflicts at the consolidated, and the rows that go back to the origin.

Rules of this file:
* At the consolidated an UPDATE is conditional on its before-image; a
  mismatch is a conflict, recorded and resolved by the table's policy or a
  hook, and the resulting row goes back to the origin.
* What goes back to the origin (conflicts, the unconfirmed rule, key
  moves, rows moved into its subset) is written once the whole batch is
  applied, each row only to the origin.
* The decisions are plain functions both backends call: how a conflict is
  resolved (:func:`decide`, :func:`resolved`), what an INSERT of a held
  key sends back (:func:`kept_local_row`) and what goes back after a
  batch (:func:`planned_returns`).  Each backend does its SQL around them
  (agent/site/sqlite/apply/conflicts.py, agent/site/postgres/apply).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Callable, Iterable, Iterator, Mapping

from codec.ops import OpKind, Operation

from ..capture import KIND_DELETE, KIND_INSERT, KIND_UPDATE, Shape
from ..errors import ConflictHookFailed, InvalidSetting
from ..values import unpack, value_problem
from .batch import Batch, Conflict, ConflictHook, Resolution, Table, send_back


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
        if subset is not None and not subset.holds(local) and subset.holds(result):
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
        if subset is not None and not subset.holds(result, routes.setdefault(shape.table, {})):
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


def check_policy(policy: object) -> Resolution:
    try:
        return Resolution(policy)
    except ValueError:
        raise InvalidSetting(f"conflict policy must be 'incoming' or 'local', got {policy!r}") from None



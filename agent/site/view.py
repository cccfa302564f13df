"""How one subscriber sees the capture rows of one shape (:class:`View`):
the published columns, the key and the SUBSCRIBE BY value picked out of a
capture row, and the operations (or runs of them) rows become.

Rules of this file:
* Pure: a view sees a shape and an article, then capture rows; nothing
  else.  agent.site.selection builds views and drives them.
* An UPDATE that moves a row into or out of the subset becomes an INSERT of
  the full published row or a DELETE; an UPDATE that changes no published
  column becomes nothing.
"""

from __future__ import annotations

from functools import lru_cache
from operator import itemgetter, ne
from typing import Callable, Iterable

from codec.ops import RUN_ROWS, OpKind, Operation, Run

from .capture import KIND_DELETE, KIND_INSERT, ROUTE, Shape
from .folding import changed_at


class View:
    """How one subscriber sees the capture rows of one shape.

    Everything that depends only on the shape is worked out once: getters
    that pick the published columns and the key out of a whole capture row
    (``(seq, shape, kind, flags, v0, ...)``; the old or inserted row starts
    at ``v0``, an UPDATE's new row at ``v<width>``), and where the SUBSCRIBE
    BY value sits.  Reading converts runs of rows of one shape and kind in
    one comprehension (the log reader's hot path).
    """

    __slots__ = ("table", "width", "names", "positions", "key_positions", "filter_position", "values",
                 "indexes", "old_image", "new_image", "old_key", "new_key", "old_filter", "new_filter", "old_row",
                 "alike", "run_heads", "picks")

    def __init__(self, shape: Shape, columns: tuple[str, ...] | None, subscribe_by: str | None,
                 values: frozenset | None) -> None:
        # What depends only on the shape and the article is made once and
        # shared by every subscriber's view of it (a fleet of thousands
        # sees one table alike, each with its own SUBSCRIBE BY values).
        (self.table, self.width, self.positions, self.names, self.key_positions, self.indexes, self.old_image,
         self.new_image, self.old_key, self.old_row, self.new_key, place, self.picks) = _layout(shape, columns,
                                                                                                 subscribe_by)
        if place is None or values is None:
            self.filter_position = self.old_filter = self.new_filter = None
            self.values = None
        elif place[0] is None:  # the filter column did not exist when these rows were captured
            self.filter_position = self.old_filter = self.new_filter = None
            self.values = frozenset()
        else:
            self.filter_position, self.old_filter, self.new_filter = place
            self.values = values
        # Views alike turn a row into the same operation (agent.site.fanout).
        self.alike = (self.positions, self.filter_position, self.values)
        # The heads of the runs of INSERTs and DELETEs (codec.ops.Run but the rows).
        width = len(self.key_positions)
        self.run_heads = {KIND_INSERT: (self.table, OpKind.INSERT, width, (), self.names),
                          KIND_DELETE: (self.table, OpKind.DELETE, width, self.names, ())}

    def contains(self, row: tuple) -> bool:
        """Whether an image (a slice of the shape's columns, and for a row
        that follows its parent its route after them) is in the subset."""
        if self.filter_position is None:
            return self.values is None
        return row[self.filter_position] in self.values  # type: ignore[operator]

    def holds(self, row: tuple, new: bool = False) -> bool:
        """Whether a capture row's old (or new) row is in the subset."""
        at = self.new_filter if new else self.old_filter
        if at is None:
            return self.values is None
        return row[at] in self.values  # type: ignore[operator]

    def published(self, image: tuple) -> tuple[int, ...]:
        """The columns an image (as :meth:`contains` takes it) is published
        with: none when it lies outside the subset."""
        return self.positions if self.contains(image) else ()

    def positions_for(self, row: tuple, new: bool = False) -> tuple[int, ...]:
        """The columns a capture row's image is published with."""
        return self.positions

    def image(self, row: tuple) -> dict:
        return {name: row[i] for name, i in zip(self.names, self.positions)}

    def key(self, row: tuple) -> tuple:
        return tuple(row[i] for i in self.key_positions)

    def rows(self, kind: int, rows: Iterable[tuple]) -> list[Operation]:
        """The INSERTs or DELETEs capture ``rows`` (all of ``kind``) become."""
        if self.old_filter is None:
            if self.values is not None:
                return []  # filtered by a column these rows do not have: nothing matches
            chosen = rows
        else:
            at, values = self.old_filter, self.values
            chosen = [row for row in rows if row[at] in values]  # type: ignore[operator]
        new, table, names, key, image = tuple.__new__, self.table, self.names, self.old_key, self.old_image
        if kind == KIND_INSERT:
            return [new(Operation, (table, 1, key(row), None, dict(zip(names, image(row))))) for row in chosen]
        return [new(Operation, (table, 3, key(row), dict(zip(names, image(row))), None)) for row in chosen]

    def runs(self, kind: int, rows: Iterable[tuple]) -> list[Run]:
        """:meth:`rows` as runs (codec.ops.Run) of the same operations: a
        row of a run is picked out of the capture row in one step, with no
        map made for it."""
        if self.old_filter is None:
            if self.values is not None:
                return []
            chosen = rows if type(rows) is list else list(rows)
        else:
            at, values = self.old_filter, self.values
            chosen = [row for row in rows if row[at] in values]  # type: ignore[operator]
        return self.subset_runs(kind, chosen) if chosen else []

    def subset_runs(self, kind: int, rows: list[tuple]) -> list[Run]:
        """:meth:`runs` of INSERT or DELETE capture ``rows`` known to be in
        the subset (routed by their value, agent.site.fanout): none is
        looked at again."""
        head, old_row = self.run_heads[kind], self.old_row
        if len(rows) == 1:
            return [_new(Run, (*head, [old_row(rows[0])]))]
        made = list(map(old_row, rows))
        return [_new(Run, (*head, made[start:start + RUN_ROWS])) for start in range(0, len(made), RUN_ROWS)]

    def update(self, row: tuple) -> Operation | None:
        """The operation an UPDATE capture row becomes: an UPDATE of the
        published columns that changed, a DELETE or INSERT when it moves the
        row out of or into the subset, or nothing."""
        if self.old_filter is None:
            was_in = is_in = self.values is None
        else:
            values = self.values
            was_in = row[self.old_filter] in values  # type: ignore[operator]
            is_in = row[self.new_filter] in values  # type: ignore[operator]
        if was_in and is_in:
            old = self.old_image(row)
            new = self.new_image(row)
            changed = self._changed(old, new)
            if not changed:
                return None
            names = self.names
            return tuple.__new__(Operation, (self.table, OpKind.UPDATE, self.old_key(row),
                                             {names[i]: old[i] for i in changed},
                                             {names[i]: new[i] for i in changed}))
        if was_in:
            return tuple.__new__(Operation, (self.table, OpKind.DELETE, self.old_key(row),
                                             dict(zip(self.names, self.old_image(row))), None))
        if is_in:
            return tuple.__new__(Operation, (self.table, OpKind.INSERT, self.new_key(row), None,
                                             dict(zip(self.names, self.new_image(row)))))
        return None

    def _changed(self, old: tuple, new: tuple) -> list[int]:
        """Where the published values differ, exactly (0, 0.0 and -0.0 are
        not the same value)."""
        return changed_at(self.indexes, old, new)

    def update_runs(self, rows: Iterable[tuple]) -> list[Run]:
        """:meth:`update` of consecutive UPDATE capture rows in runs
        (codec.ops.Run): the rows :meth:`update_row` makes, those of one
        head bundled; consecutive runs never share their head (the runs
        codec.ops.to_runs makes of the same operations)."""
        made: list = []
        bundle: list = []
        last: object = None  # the head of the run being filled
        update_row = self.update_row
        for row in rows:
            found = update_row(row)
            if found is None:
                continue
            head, made_row = found
            if (head is not last and head != last) or len(bundle) >= RUN_ROWS:
                bundle = []
                made.append(_new(Run, (*head, bundle)))
                last = head
            bundle.append(made_row)
        return made

    def update_row(self, row: tuple) -> tuple[tuple, tuple] | None:
        """What an UPDATE capture row becomes, as :meth:`update` makes it,
        for a run: ``(head, run row)``, the head a run's table, kind and
        columns (the same object for the same columns), or None.

        The columns that changed come as a flag per published column,
        compared in C; a row holding a zero or a value whose type changed
        is compared exactly (:meth:`_changed`).  Each set of flags has its
        run's head and a getter that picks the run's row (key, old values,
        new values) out of the capture row in one step (:meth:`_pick`)."""
        old_at = self.old_filter
        if old_at is None:
            if self.values is not None:
                return None  # filtered by a column these rows do not have: nothing matches
        else:
            values = self.values
            was_in = row[old_at] in values  # type: ignore[operator]
            is_in = row[self.new_filter] in values  # type: ignore[operator]
            if not (was_in and is_in):
                # Moved out of the subset (a DELETE of the old row), into it
                # (an INSERT of the new one), or neither (nothing).
                if was_in:
                    return self.run_heads[KIND_DELETE], (*self.old_key(row), *self.old_image(row))
                if is_in:
                    return self.run_heads[KIND_INSERT], (*self.new_key(row), *self.new_image(row))
                return None
        return self.kept_row(row)

    def kept_row(self, row: tuple) -> tuple[tuple, tuple] | None:
        """:meth:`update_row` of an UPDATE capture row that the subset holds
        before and after (or of a view without one): the caller knows, as
        the fan-out does of a row routed by a value it did not change."""
        old = self.old_image(row)
        new = self.new_image(row)
        # (Lists of the types: building a tuple by calling tuple() costs more.)
        if 0.0 in old or [*map(type, old)] != [*map(type, new)]:
            changed = self._changed(old, new)
            flags = tuple(index in changed for index in self.indexes)
        else:
            flags = (*map(ne, old, new),)
        found = self.picks.get(flags)
        if found is None:
            found = self._pick(flags)
        head, pick = found
        if pick is None:
            return None  # no published column changed
        return head, pick(row)

    def _pick(self, flags: tuple[bool, ...]) -> tuple:
        """The run's head and the getter of a run's row for UPDATE capture
        rows whose published columns changed where ``flags`` say; kept with
        the layout, shared by the views alike."""
        changed = [index for index, flag in zip(self.indexes, flags) if flag]
        if not changed:
            found: tuple = (None, None)
        else:
            at = [self.positions[index] for index in changed]
            columns = tuple(self.names[index] for index in changed)
            found = ((self.table, OpKind.UPDATE, len(self.key_positions), columns, columns),
                     itemgetter(*(4 + i for i in self.key_positions), *(4 + i for i in at),
                                *(4 + self.width + i for i in at)))
        if len(self.picks) >= _PICKS_KEPT:
            self.picks.clear()
        self.picks[flags] = found
        return found


# Sets of changed columns a layout keeps the getters of (a wide table
# updated every which way makes many; each is cheap to make again).
_PICKS_KEPT = 1024


@lru_cache(maxsize=4096)
def _layout(shape: Shape, columns: tuple[str, ...] | None, subscribe_by: str | None) -> tuple:
    """The part of a :class:`View` that depends only on the shape and the
    article: the published columns, the key, the getters, and where the
    SUBSCRIBE BY value sits (``(position in an image, in the old capture
    row, in the new one)``; ``(None, None, None)``: a column the shape does
    not have; None: no SUBSCRIBE BY)."""
    width = len(shape.columns)
    wanted = set(shape.columns if columns is None else columns) | set(shape.key_columns)
    positions = tuple(i for i, column in enumerate(shape.columns) if column in wanted)
    names = tuple(shape.columns[i] for i in positions)
    key_positions = shape.key_positions
    place: tuple | None
    if subscribe_by is None:
        place = None
    elif subscribe_by == ROUTE:  # the row follows its parent: its route comes after the widest image
        place = (width, 4 + 2 * width, 5 + 2 * width)
    elif subscribe_by in shape.columns:
        at = shape.columns.index(subscribe_by)
        place = (at, 4 + at, 4 + width + at)
    else:
        place = (None, None, None)
    return (shape.table, width, positions, names, key_positions, range(len(positions)),
            _getter([4 + i for i in positions]), _getter([4 + width + i for i in positions]),
            _getter([4 + i for i in key_positions]),
            # key ‖ image of the old (or inserted) row: a run's row (codec.ops.Run)
            itemgetter(*(4 + i for i in (*key_positions, *positions))),
            _getter([4 + width + i for i in key_positions]), place, {})


def _getter(indexes: list[int]) -> Callable[[tuple], tuple]:
    """``itemgetter`` that always returns a tuple (also for one index)."""
    if len(indexes) == 1:
        index = indexes[0]
        return lambda row: (row[index],)
    return itemgetter(*indexes)


_new = tuple.__new__

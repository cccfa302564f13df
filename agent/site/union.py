"""A table a subscriber receives through several articles (the table is in
several of its publications): :class:`UnionView`, how it sees the capture
rows of one shape, and :func:`merge`, the plan entry of those articles.

Rules of this file:
* Each row once: a row goes to the subscriber when any of its articles
  keeps it (the article's own test, agent.site.view.View), with the
  columns of the articles that keep it (key columns always), in table
  order.
* The subscriber's copy of the table has every column any of the articles
  publishes; a row holds NULL in a column it is not published with.  An
  UPDATE is an INSERT of the new row when no article kept the old one, a
  DELETE when none keeps the new one, else an UPDATE of the columns whose
  value as the subscriber holds it changes: a column the row gains (an
  article that did not keep the old row keeps the new one) gets its value,
  one it loses becomes NULL.
* Pure: no database, as agent.site.view.
"""

from __future__ import annotations

from codec.ops import OpKind, Operation

from .capture import ROUTE, Shape
from .folding import _operation, _same
from .view import View

# What a plan names as the SUBSCRIBE BY column of a table the subscriber
# receives through several articles; the plan entry's third item is then
# the articles' ``(columns, subscribe_by, values)``.  No column is called
# this (names hold no NUL).
UNION = "\x00union"

Entry = tuple  # (columns, subscribe_by, values) of a selection plan


def merge(entries: list[Entry]) -> Entry:
    """The plan entry of a table the subscriber receives through the
    articles ``entries``: the one entry when they select alike (articles
    with the same columns and SUBSCRIBE BY column join their values), else
    ``(columns of them all, UNION, entries)``."""
    joined: dict[tuple, Entry] = {}
    for columns, by, values in entries:
        key = (columns, by)
        held = joined.get(key)
        if held is None:
            joined[key] = (columns, by, values)
        elif held[2] is not None:
            joined[key] = (columns, by, None if values is None else held[2] | values)
    parts = list(joined.values())
    if len(parts) == 1:
        return parts[0]
    # An article of every column and every row leaves nothing to the others.
    whole = next((part for part in parts if part[0] is None and part[2] is None), None)
    if whole is not None:
        return whole
    if any(columns is None for columns, _, _ in parts):
        columns = None
    else:
        columns = tuple(dict.fromkeys(column for part in parts for column in part[0]))
    if all(values is None for _, _, values in parts):  # every row, with every column of them all
        return (columns, None, None)
    return (columns, UNION, tuple(sorted(parts, key=lambda part: (repr(part[0]), part[1] or ""))))


def routed(entry: Entry) -> bool:
    """Whether any article of the entry follows its parent."""
    if entry[1] == UNION:
        return any(by == ROUTE for _, by, _ in entry[2])
    return entry[1] == ROUTE


def make_view(shape: Shape, entry: Entry) -> "View | UnionView":
    if entry[1] == UNION:
        return UnionView(shape, entry[2])
    return View(shape, *entry)


class UnionView:
    """How a subscriber sees the capture rows of one shape through several
    articles: the same methods as :class:`View` (a reader, a router and the
    subscription changes use either).  ``values`` is None and there is no
    filter column: a router offers it every row, and it decides."""

    __slots__ = ("parts", "table", "width", "positions", "names", "key_positions", "filter_position",
                 "values", "old_filter", "new_filter", "alike", "_names")

    def __init__(self, shape: Shape, parts: tuple[Entry, ...]) -> None:
        self.parts = tuple(View(shape, *part) for part in parts)
        first = self.parts[0]
        self.table, self.width, self.key_positions = first.table, first.width, first.key_positions
        self.positions = tuple(sorted(set().union(*(part.positions for part in self.parts))))
        self._names = shape.columns
        self.names = tuple(shape.columns[i] for i in self.positions)
        self.filter_position = self.old_filter = self.new_filter = None
        self.values = None
        self.alike = (UNION, tuple(part.alike for part in self.parts))

    def _positions(self, row: tuple, new: bool = False) -> tuple[int, ...]:
        """The columns a capture row's old (or new) row is published with
        (empty: no article keeps it)."""
        held = [part.positions for part in self.parts if part.holds(row, new)]
        if not held:
            return ()
        if len(held) == 1:
            return held[0]
        return tuple(sorted(set().union(*held)))

    def positions_for(self, row: tuple, new: bool = False) -> tuple[int, ...]:
        return self._positions(row, new)

    def published(self, image: tuple) -> tuple[int, ...]:
        held = [part.positions for part in self.parts if part.contains(image)]
        return tuple(sorted(set().union(*held))) if held else ()

    def contains(self, row: tuple) -> bool:
        return any(part.contains(row) for part in self.parts)

    def holds(self, row: tuple, new: bool = False) -> bool:
        return any(part.holds(row, new) for part in self.parts)

    def image(self, row: tuple) -> dict:
        return {self._names[i]: row[i] for i in self.positions}

    def key(self, row: tuple) -> tuple:
        return tuple(row[i] for i in self.key_positions)

    def _image(self, row: tuple, positions: tuple[int, ...], new: bool = False) -> dict:
        """The row as the subscriber holds it: every column of :attr:`names`,
        NULL where the row is not published with it."""
        start = 4 + self.width if new else 4
        kept = set(positions)
        return {self._names[i]: row[start + i] if i in kept else None for i in self.positions}

    def _key(self, row: tuple, new: bool = False) -> tuple:
        start = 4 + self.width if new else 4
        return tuple(row[start + i] for i in self.key_positions)

    def rows(self, kind: int, rows) -> list[Operation]:  # type: ignore[no-untyped-def]
        made = []
        for row in rows:
            positions = self._positions(row)
            if not positions:
                continue
            image = self._image(row, positions)
            if kind == OpKind.INSERT:
                made.append(_operation(self.table, OpKind.INSERT, self._key(row), None, image))
            else:
                made.append(_operation(self.table, OpKind.DELETE, self._key(row), image, None))
        return made

    def runs(self, kind: int, rows) -> list:  # type: ignore[no-untyped-def]
        """As :meth:`rows` (the rows of one table may differ in the columns
        they are published with, so they stay operations: a packer takes either)."""
        return self.rows(kind, rows)

    def update(self, row: tuple) -> Operation | None:
        was = self._positions(row)
        now = self._positions(row, new=True)
        if not was and not now:
            return None
        if not now:
            return _operation(self.table, OpKind.DELETE, self._key(row), self._image(row, was), None)
        if not was:
            return _operation(self.table, OpKind.INSERT, self._key(row, new=True), None,
                              self._image(row, now, new=True))
        old = self._image(row, was)
        new = self._image(row, now, new=True)
        changed = [name for name in self.names if not _same(old[name], new[name])]
        if not changed:
            return None
        return _operation(self.table, OpKind.UPDATE, self._key(row), {name: old[name] for name in changed},
                          {name: new[name] for name in changed})

    def update_runs(self, rows) -> list:  # type: ignore[no-untyped-def]
        return [op for op in map(self.update, rows) if op is not None]


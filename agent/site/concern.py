"""Which subscribers a log range can concern, found before any reader is
made: a send phase at a consolidated of thousands asks for the same new
range for every remote, and one changed row concerns a few of them.

Rules of this file:
* Pure, as agent.site.selection is: it sees the article rows, the
  subscribers' subscription rows, the shapes and the capture rows of the
  range; a backend reads them (agent.site.sqlite.database,
  agent.site.postgres.site).
* The answer is a superset of the subscribers whose readers select
  anything in the range, by the rule agent.site.fanout's Router routes a
  row by: a row goes to the subscribers of its table's publications that
  take every row, to those whose SUBSCRIBE BY value (or route, for a row
  that follows its parent) is its old or new value, and, written back to
  its origin, to the origin; a schema change's row may concern anyone.
  Subscribers left out would have been given nothing, so readers are made
  only for the others, and the result of a read is unchanged.
* Bounded: past ``limit`` capture rows the answer is "anyone" (None), and
  every subscriber is read for as before; a range that large concerns
  many anyway.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Iterable, Mapping

from .capture import FLAG_RETURN_TO_ORIGIN, KIND_SCHEMA, KIND_UPDATE
from .selection import Shapes, _columns
from .view import View

#: Capture rows looked at before giving up and reading for every subscriber.
CONCERN_ROWS = 2000
#: Fewer subscribers than this are read for without looking first.
CONCERN_MIN_SUBSCRIBERS = 16


def concerned(shapes: Shapes, articles: Iterable[tuple], subscriptions: Mapping[str, Iterable[tuple]],
              subscribers: Iterable[str], chunks: Iterable[tuple[int, str, list[tuple]]], after: int, *,
              renames: Mapping[str, str] = MappingProxyType({}), limit: int = CONCERN_ROWS) -> set[str] | None:
    """Those of ``subscribers`` (their subscription rows in ``subscriptions``:
    ``remote -> [(publication, value, since, until)]``) that the capture rows
    of ``chunks`` (the log transactions after ``after``, ``(commit, origin,
    rows)`` with every value column) can concern; None: any of them.
    ``renames`` maps a table's names before a rename to its name now, as a
    reader finds the article of rows logged under an old name."""
    by_table: dict[str, list[tuple[str, tuple[str, ...] | None, str | None]]] = {}
    for table, publication, columns, subscribe_by in articles:
        by_table.setdefault(table.lower(), []).append((publication, _columns(columns), subscribe_by))
    whole: set[str] = set()  # publications a row concerns every subscriber of
    values: dict[str, set] = {}  # publication -> SUBSCRIBE BY values the rows hold
    origins: set[str] = set()
    views: dict[tuple[int, str], View | None] = {}
    seen = 0
    for _commit, origin, rows in chunks:
        seen += len(rows)
        if seen > limit:
            return None
        for row in rows:
            kind, flags = row[2], row[3]
            if kind == KIND_SCHEMA:
                return None
            if flags and flags & FLAG_RETURN_TO_ORIGIN:
                origins.add(origin)
                continue
            shape = shapes.get(row[1])
            table = shape.table.lower()
            for publication, columns, subscribe_by in by_table.get(renames.get(table, table), ()):
                if subscribe_by is None:
                    whole.add(publication)
                    continue
                view = views.get((row[1], publication), False)
                if view is False:
                    view = views[row[1], publication] = View(shape, columns, subscribe_by, frozenset())
                if view.values is None:  # no filter place: every row, as the reader's view
                    whole.add(publication)
                elif view.old_filter is not None:
                    held = values.setdefault(publication, set())
                    held.add(row[view.old_filter])
                    if kind == KIND_UPDATE:
                        held.add(row[view.new_filter])
    found = set()
    for subscriber in subscribers:
        if subscriber in origins:
            found.add(subscriber)
            continue
        for span in subscriptions.get(subscriber, ()):
            publication, value = span[0], span[1]
            until = span[3] if len(span) > 3 else None
            if until is not None and until <= after:
                continue  # ended before the range: no log transaction of it is read with it
            if publication in whole or value in values.get(publication, ()):
                found.add(subscriber)
                break
    return found

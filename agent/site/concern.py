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
  its origin, to the origin; a schema change's row may concern anyone,
  but one whose steps each name their remotes (passthrough SQL, an
  article removed) concerns those alone (change_rows.addressed).
  Subscribers left out would have been given nothing, so readers are made
  only for the others, and the result of a read is unchanged.
* Bounded: past ``limit`` capture rows the answer is "anyone" (None), and
  every subscriber is read for as before; a range that large concerns
  many anyway.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import Iterable, Mapping

from .capture import FLAG_RETURN_TO_ORIGIN, KIND_SCHEMA, KIND_UPDATE
from .change_rows import addressed
from .selection import Shapes, _columns
from .view import View

#: Capture rows looked at before giving up and reading for every subscriber.
CONCERN_ROWS = 2000
#: Fewer subscribers than this are read for without looking first.
CONCERN_MIN_SUBSCRIBERS = 16


@dataclass(frozen=True, slots=True)
class Concern:
    """What the capture rows of a range can concern: every subscriber of the
    ``whole`` publications, those of a publication in ``values`` whose
    SUBSCRIBE BY value is one of the values held there, the ``origins``
    of rows written back to them, and the remotes changes ``named``."""

    whole: frozenset[str]
    values: Mapping[str, frozenset]
    origins: frozenset[str]
    named: frozenset[str] = frozenset()

    def wanted(self) -> tuple[list[str], list[list]]:
        """What a backend asks its subscription rows for, a superset of the
        rows :func:`concerned_by` can match: the publications all of whose
        rows are wanted (those of ``whole``, and those holding a value a
        JSON query cannot carry exactly), and ``[publication, value]`` pairs."""
        publications = set(self.whole)
        pairs: list[list] = []
        for publication, held in self.values.items():
            if publication in publications:
                continue
            if all(_exact_in_json(value) for value in held):
                pairs.extend([publication, value] for value in held)
            else:
                publications.add(publication)
        return sorted(publications), pairs


def _exact_in_json(value: object) -> bool:
    """Whether ``value`` keeps its type and value through JSON and an SQL comparison."""
    if isinstance(value, str):
        return True
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return -(1 << 63) <= value < (1 << 63)
    return isinstance(value, float) and math.isfinite(value)


def concern(shapes: Shapes, articles: Iterable[tuple], chunks: Iterable[tuple[int, str, list[tuple]]], *,
            renames: Mapping[str, str] = MappingProxyType({}), limit: int = CONCERN_ROWS) -> Concern | None:
    """What the capture rows of ``chunks`` (``(commit, origin, rows)`` with
    every value column) can concern; None: anyone.  ``renames`` maps a
    table's names before a rename to its name now, as a reader finds the
    article of rows logged under an old name."""
    by_table: dict[str, list[tuple[str, tuple[str, ...] | None, str | None]]] = {}
    for table, publication, columns, subscribe_by in articles:
        by_table.setdefault(table.lower(), []).append((publication, _columns(columns), subscribe_by))
    whole: set[str] = set()  # publications a row concerns every subscriber of
    values: dict[str, set] = {}  # publication -> SUBSCRIBE BY values the rows hold
    origins: set[str] = set()
    named: set[str] = set()  # the remotes of changes that name theirs
    views: dict[tuple[int, str], View | None] = {}
    seen = 0
    for _commit, origin, rows in chunks:
        seen += len(rows)
        if seen > limit:
            return None
        for row in rows:
            kind, flags = row[2], row[3]
            if kind == KIND_SCHEMA:
                remotes = addressed(row[4])
                if remotes is None:
                    return None
                named.update(remotes)
                continue
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
    return Concern(frozenset(whole), MappingProxyType({publication: frozenset(held) for publication, held
                                                        in values.items()}), frozenset(origins), frozenset(named))


def concerned_by(found: Concern, subscriptions: Mapping[str, Iterable[tuple]], subscribers: Iterable[str],
                 after: int) -> set[str]:
    """Those of ``subscribers`` (their subscription rows in ``subscriptions``:
    ``remote -> [(publication, value, since, until)]``; the rows
    :meth:`Concern.wanted` names are enough) that ``found`` concerns, for a
    range after ``after``."""
    asked = subscribers if isinstance(subscribers, (set, frozenset)) else set(subscribers)
    result = {name for name in found.origins | found.named if name in asked}
    for subscriber, spans in subscriptions.items():
        if subscriber in result or subscriber not in asked:
            continue
        for span in spans:
            publication, value = span[0], span[1]
            until = span[3] if len(span) > 3 else None
            if until is not None and until <= after:
                continue  # ended before the range: no log transaction of it is read with it
            if publication in found.whole or value in found.values.get(publication, ()):
                result.add(subscriber)
                break
    return result


def concerned(shapes: Shapes, articles: Iterable[tuple], subscriptions: Mapping[str, Iterable[tuple]],
              subscribers: Iterable[str], chunks: Iterable[tuple[int, str, list[tuple]]], after: int, *,
              renames: Mapping[str, str] = MappingProxyType({}), limit: int = CONCERN_ROWS) -> set[str] | None:
    """Those of ``subscribers`` (their subscription rows in ``subscriptions``:
    ``remote -> [(publication, value, since, until)]``) that the capture rows
    of ``chunks`` (the log transactions after ``after``) can concern
    (:func:`concern`, :func:`concerned_by`); None: any of them."""
    found = concern(shapes, articles, chunks, renames=renames, limit=limit)
    return None if found is None else concerned_by(found, subscriptions, subscribers, after)

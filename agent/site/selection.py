"""Selecting what one subscriber receives from capture rows: its reader
(over the subscriber's view of each shape, agent.site.view), and the router
and fan-out that serve many subscribers from one pass over the log.

Rules of this file:
* Reading turns capture rows into :class:`codec.ops.Operation` values (or,
  for a packer, runs of them: ``runs=True``):
  ops whose origin is the subscriber are dropped (no echo), except the rows
  the apply path wrote for that origin (conflict results, DELETEs of rows it
  left outside its subset); an UPDATE that moves a row into or out of the
  subscriber's subset becomes an INSERT of the full published row or a
  DELETE (folding: agent.site.folding).  A schema change's row becomes
  what of the change concerns the subscriber (agent.site.change_rows),
  alone in its transaction.
* Pure row selection: plans, readers, routers and fan-outs see plain data
  (the plan, the shapes, capture rows); a backend reads the rows they are
  made from (agent.site.sqlite.selection, agent.site.postgres.reading).
  Both backends and the Spark batch job select through them.
"""

from __future__ import annotations

import json
from itertools import groupby
from operator import itemgetter
from types import MappingProxyType
from typing import Callable, Collection, Iterable, Mapping, NamedTuple, Protocol

from codec.changes import SchemaChange
from codec.ops import OpKind, Operation

from .capture import FLAG_RETURN_TO_ORIGIN, KIND_DELETE, KIND_INSERT, KIND_SCHEMA, KIND_UPDATE, Shape
from .change_rows import subscriber_change
from .errors import UnknownRemote
from .folding import _operation
from .identity import Role, SiteIdentity
from .union import UnionView, make_view, merge, routed as is_routed
from .view import View


class SelectionPlan(NamedTuple):
    """Everything that decides what one subscriber receives, as plain data:
    ``articles`` maps a lowered table name to ``(columns, subscribe_by,
    values)`` (``values`` None: every row; for a table received through
    several articles, agent.site.union's entry), ``returned_flag`` is the capture
    flag of rows written back to their origin (0 at a remote).  It is what
    a backend reads from its site (agent.site.sqlite.selection) and what a batch
    export writes out, so a reader built anywhere selects alike."""

    subscriber: str
    articles: dict[str, tuple[tuple[str, ...] | None, str | None, frozenset | None]]
    returned_flag: int
    # The articles of earlier subscriptions, for log transactions before a
    # subscription change (docs/site-database.md, "Changing a remote's
    # subscriptions"): ``(until, articles)`` pairs in ascending order; a log
    # transaction whose commit offset is below ``until`` (and not below the
    # pair before) is read with those articles, one at or after the last
    # ``until`` with ``articles``.
    history: tuple[tuple[int, dict], ...] = ()
    # Each name a published table had before a rename (lowered) and its
    # name now (change_rows.table_renames): rows logged under an old name
    # are read with the table's article, in the name they were logged in.
    renames: Mapping[str, str] = MappingProxyType({})

def check_subscribers(identity: SiteIdentity, known: Collection[str], subscribers: Iterable[str]) -> None:
    """Raise UnknownRemote for the first of ``subscribers`` that is not
    ``known`` as a remote of the site."""
    for subscriber in subscribers:
        if subscriber not in known:
            raise _unknown(identity, subscriber)

def _unknown(identity: SiteIdentity, subscriber: str) -> UnknownRemote:
    return UnknownRemote(f"no remote named {subscriber!r} at site {identity.name!r}")

def plan_from_rows(subscriber: str, role: Role, articles: Iterable[tuple], subscriptions: Iterable[tuple],
                   renames: Mapping[str, str] = MappingProxyType({}), removed: Iterable[tuple] = ()
                   ) -> SelectionPlan:
    """The plan from the rows of ``fieldsync_article`` (table, publication,
    columns as JSON or None, subscribe_by) and the subscriber's rows of
    ``fieldsync_subscription``: (publication, value) for subscriptions that
    hold, or (publication, value, since, until) with the commit offsets
    between which each holds (``until`` None: still), which make the plan's
    ``history``; ``renames``, the plan's (change_rows.table_renames);
    ``removed``, the articles removed since the log's truncation point, as
    article rows with the commit offset of their removal last (None: not
    cut yet), each of which holds for the log transactions before it
    (docs/site-database.md, "Removing an article")."""
    articles = list(articles)
    # Only the consolidated writes rows back to an origin; at a remote the
    # subscriber's (the consolidated's) log transactions hold nothing for it.
    returned_flag = FLAG_RETURN_TO_ORIGIN if role is Role.CONSOLIDATED else 0
    if role is Role.REMOTE:
        # The consolidated gets everything a remote publishes.
        found: dict[str, list[tuple]] = {}
        for table, _publication, columns, _subscribe_by in articles:
            found.setdefault(table.lower(), []).append((_columns(columns), None, None))
        return SelectionPlan(subscriber, {table: merge(entries) for table, entries in found.items()}, returned_flag,
                             renames=renames)
    spans = [(row[0], row[1], row[2] if len(row) > 2 else 0, row[3] if len(row) > 3 else None)
             for row in subscriptions]
    ended = sorted(((row[:4], row[4]) for row in removed if row[4] is not None), key=itemgetter(1))
    # A removal not cut yet holds for every log transaction there is.
    articles = _held(articles, [row[:4] for row in removed if row[4] is None])
    current = _articles(articles, [(pub, value) for pub, value, _, until in spans if until is None])
    bounds = sorted({since for _, _, since, _ in spans if since > 0}
                    | {until for _, _, _, until in spans if until is not None} | {until for _, until in ended})
    history = []
    start = 0
    for bound in bounds:
        held = _articles(_held(articles, [row for row, until in ended if start < until]),
                         [(pub, value) for pub, value, since, until in spans
                          if since <= start and (until is None or start < until)])
        if history and history[-1][1] == held:
            history[-1] = (bound, held)  # one span with the one before
        else:
            history.append((bound, held))
        start = bound
    while history and history[-1][1] == current:  # the last spans before the change hold the current plan
        history.pop()
    return SelectionPlan(subscriber, current, returned_flag, tuple(history), renames)

def _held(articles: list[tuple], removed: list[tuple]) -> list[tuple]:
    """The article rows that hold where the ``removed`` ones still do: a
    removed article in place of the one its table and publication have now
    (published again since, perhaps with other columns); of an article
    removed twice, the first of ``removed`` (the earlier removal)."""
    if not removed:
        return articles
    first: dict[tuple[str, str], tuple] = {}
    for row in removed:
        first.setdefault((row[0].lower(), row[1]), row)
    return [row for row in articles if (row[0].lower(), row[1]) not in first] + list(first.values())

def _articles(articles: list[tuple], subscriptions: Iterable[tuple]
              ) -> dict[str, tuple[tuple[str, ...] | None, str | None, frozenset | None]]:
    """What the subscriptions ``(publication, value)`` select: per lowered
    table, ``(columns, subscribe_by, values)`` (``values`` None: every row)."""
    values: dict[str, set] = {}
    for publication, value in subscriptions:
        bucket = values.setdefault(publication, set())
        if value is not None:
            bucket.add(value)
    found: dict[str, list[tuple]] = {}
    for table, publication, columns, subscribe_by in articles:
        if publication not in values:
            continue
        found.setdefault(table.lower(), []).append(
            (_columns(columns), subscribe_by, frozenset(values[publication]) if subscribe_by else None))
    # A table in several of the subscriber's publications: each row once,
    # with the columns of the articles that keep it (agent.site.union).
    return {table: entries[0] if len(entries) == 1 else merge(entries) for table, entries in found.items()}

def _columns(columns: str | tuple | None) -> tuple[str, ...] | None:
    """An article's column list: JSON from an article row, or parsed already (None: every column)."""
    if columns is None or type(columns) is tuple:
        return columns
    return tuple(json.loads(columns))

def value_columns_read(shapes: Iterable[Shape], plan: SelectionPlan) -> int:
    """How many capture value columns a reader of ``plan`` needs: the widest
    shape of a table it receives, old and new row; one at least, where a
    schema change's row holds the change (change_rows), which a subscriber
    that receives no table may get too (a passthrough, an article removed)."""
    routed = {table for table, entry in plan.articles.items() if is_routed(entry)}
    tables = set(plan.articles).union(*(set(articles) for _, articles in plan.history))
    for _, articles in plan.history:
        routed.update(table for table, entry in articles.items() if is_routed(entry))
    # A follow article's rows carry their routes after the widest image.
    renames = plan.renames
    return max((2 * len(shape.columns) + (2 if renames.get(name, name) in routed else 0)
                for shape in shapes for name in (shape.table.lower(),) if renames.get(name, name) in tables),
               default=1)

_SHAPE_KIND_FLAGS = itemgetter(1, 2, 3)

class Shapes(Protocol):
    """Where a reader finds the shape a capture row names: a SQLite site's
    ShapeCache, a batch's ShapeTable, a PostgreSQL site's shapes."""

    def get(self, shape_id: int) -> Shape: ...

class SubscriberReader:
    """Turns capture rows into the operations one subscriber receives.

    Pure: it sees the plan, the shapes (anything with ``get(shape_id)``) and
    ``returned_columns(seq)``, the columns a written-back row lists (None:
    all).  The site database and the Spark batch job both select through it.
    """

    def __init__(self, plan: SelectionPlan, shapes: Shapes,
                 returned_columns: Callable[[int], str | None], value_columns: int, *, runs: bool = False) -> None:
        self.subscriber = plan.subscriber
        # Whether INSERTs and DELETEs come as runs (codec.ops.Run) of the
        # same operations: what a packer takes (it writes runs), not what
        # callers that look at operations are given.
        self.runs = runs
        self.returned_flag = plan.returned_flag
        self.value_columns = value_columns
        # An INSERT or DELETE capture row holds one image, and a route after
        # the widest image only in a routed table (value_columns_read).
        routed = any(map(is_routed, plan.articles.values())) or any(
            is_routed(entry) for _, articles in plan.history for entry in articles.values())
        self.image_columns = None if routed else (value_columns + 1) // 2
        self.returned_columns = returned_columns
        self._shapes = shapes
        self._views: dict[int, View | UnionView | None] = {}
        self._articles = plan.articles
        self._current = plan.articles
        self._history = plan.history
        self._renames = plan.renames

    @classmethod
    def many_from_rows(cls, identity: SiteIdentity, shapes: "Shapes", every_shape: Iterable[Shape],
                       articles: Iterable[tuple], subscriptions: Mapping[str, Iterable[tuple]],
                       subscribers: list[str], returned_columns: Callable[[int], str | None], *,
                       runs: bool = False, renames: Mapping[str, str] = MappingProxyType({}),
                       removed: Iterable[tuple] = ()) -> list["SubscriberReader"]:
        """A reader for each of ``subscribers`` from a site's rows, whatever
        its backend: the article rows (ARTICLE_ROWS' columns), each
        subscriber's subscription rows ``(publication, value, since,
        until)``, every shape (how wide the capture rows are read), the
        site's table renames (change_rows.table_renames) and the articles
        removed since the log's truncation point (plan_from_rows)."""
        # The article columns are parsed once, and the width is worked out
        # once per kind of plan (which tables, which routed), not per subscriber.
        articles = [(table, publication, None if columns is None else tuple(json.loads(columns)), subscribe_by)
                    for table, publication, columns, subscribe_by in articles]
        removed = [(table, publication, None if columns is None else tuple(json.loads(columns)), *rest)
                   for table, publication, columns, *rest in removed]
        every_shape = list(every_shape)
        widths: dict[tuple, int] = {}
        readers = []
        for subscriber in subscribers:
            plan = plan_from_rows(subscriber, identity.role, articles, subscriptions.get(subscriber, ()), renames,
                                  removed)
            kind = (tuple((table, is_routed(entry)) for table, entry in plan.articles.items()),
                    tuple(tuple((table, is_routed(entry)) for table, entry in held.items())
                          for _, held in plan.history))
            width = widths.get(kind)
            if width is None:
                width = widths[kind] = value_columns_read(every_shape, plan)
            readers.append(cls(plan, shapes, returned_columns, width, runs=runs))
        return readers

    def at(self, commit: int) -> bool:
        """Read the log transaction with this commit offset with the
        subscriptions that held at it; True when that changed the plan (the
        views made so far are dropped)."""
        if not self._history:
            return False
        articles = self._current
        for until, earlier in self._history:
            if commit < until:
                articles = earlier
                break
        if articles is self._articles:
            return False
        self._articles = articles
        self._views = {}
        return True

    def view(self, shape_id: int) -> "View | UnionView | None":
        """How the subscriber sees rows of this shape (None: not at all)."""
        return self._view(shape_id)

    def _view(self, shape_id: int) -> "View | UnionView | None":
        try:
            return self._views[shape_id]
        except KeyError:
            pass
        shape = self._shapes.get(shape_id)
        name = shape.table.lower()
        article = self._articles.get(self._renames.get(name, name))  # rows logged before a rename: its article
        view = None if article is None else make_view(shape, article)
        self._views[shape_id] = view
        return view

    def operation(self, origin: str, row: tuple) -> Operation | None:
        """The operation capture ``row`` becomes for the subscriber, if any."""
        ops: list[Operation] = []
        self.extend(origin, (row,), ops)
        return ops[0] if ops else None

    def extend(self, origin: str, rows: Iterable[tuple], ops: list[Operation]) -> None:
        """Append to ``ops`` the operations consecutive capture ``rows`` of one
        log transaction of ``origin`` become for the subscriber.  Its own
        changes are left out (no echo), except the rows written back to it."""
        own = origin == self.subscriber
        for (shape_id, kind, flags), group in groupby(rows, _SHAPE_KIND_FLAGS):
            if kind == KIND_SCHEMA:
                if not own:
                    ops.extend(change for change in map(self._change, group) if change is not None)
                continue
            view = self._view(shape_id)
            if view is None:
                continue
            if flags and flags & FLAG_RETURN_TO_ORIGIN:
                if own:
                    for row in group:
                        op = self._returned(view, origin, row)
                        if op is not None:
                            ops.append(op)
                continue
            if own:
                continue
            if kind == KIND_UPDATE:
                if self.runs:
                    ops.extend(view.update_runs(group))
                    continue
                update = view.update
                for row in group:
                    op = update(row)
                    if op is not None:
                        ops.append(op)
            elif kind == KIND_INSERT or kind == KIND_DELETE:
                ops.extend(view.runs(kind, group) if self.runs else view.rows(kind, group))

    def _change(self, row: tuple) -> SchemaChange | None:
        """What of the schema change in capture ``row`` concerns the subscriber."""
        articles, renames = self._articles, self._renames
        return subscriber_change(row[4] if len(row) > 4 else None,
                                 lambda table: articles.get(renames.get(table, table)), self._shapes.get,
                                 self.subscriber)

    def _returned(self, view: "View | UnionView", origin: str, row: tuple) -> Operation | None:
        """A row a conflict resolution sends back to its origin: the old
        image is the row as the origin holds it, the new image the result.
        The origin gets the listed columns of the result, the whole row if
        it now enters its subset, or a DELETE if it leaves it.  An INSERT
        row (the origin no longer holds the row) carries the result alone."""
        width = view.width
        old = row[4:4 + width]
        names = self._shapes.get(row[1]).columns

        def image(values: tuple, kept: tuple[int, ...]) -> dict:
            # NULL in a column the row is not published with (agent.site.union).
            return {names[i]: values[i] if i in kept else None for i in view.positions}

        # A DELETE's old row as the origin holds it (a row no article keeps: its key).
        gone = view.positions_for(row) or view.key_positions
        if row[2] == KIND_DELETE:
            return _operation(view.table, OpKind.DELETE, view.key(old), image(old, gone), None)
        if row[2] == KIND_INSERT:
            if not view.holds(row):
                return None
            return _operation(view.table, OpKind.INSERT, view.key(old), None, image(old, view.positions_for(row)))
        new = row[4 + width:4 + 2 * width]
        if not view.holds(row, new=True):
            return _operation(view.table, OpKind.DELETE, view.key(old), image(old, gone), None)
        if not view.holds(row):
            return _operation(view.table, OpKind.INSERT, view.key(new), None,
                              image(new, view.positions_for(row, new=True)))
        found = self.returned_columns(row[0])
        held, kept = view.positions_for(row), view.positions_for(row, new=True)
        listed = set(json.loads(found)) if found is not None else {names[i] for i in kept}
        chosen = [i for i in view.positions if (i in held or i in kept) and names[i] in listed]
        if not chosen:
            return None
        before, after = image(old, held), image(new, kept)
        return _operation(view.table, OpKind.UPDATE, view.key(old), {names[i]: before[names[i]] for i in chosen},
                          {names[i]: after[names[i]] for i in chosen})

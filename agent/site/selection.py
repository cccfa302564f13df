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
from itertools import groupby, islice
from operator import itemgetter
from typing import Callable, Collection, Iterable, Mapping, NamedTuple, Protocol

from codec.changes import SchemaChange
from codec.ops import OpKind, Operation, Transaction, op_count

from .capture import FLAG_RETURN_TO_ORIGIN, KIND_DELETE, KIND_INSERT, KIND_SCHEMA, KIND_UPDATE, ROUTE, Shape
from .change_rows import subscriber_change
from .errors import InvalidSetting, UnknownRemote
from .folding import _operation, make_transaction
from .identity import Role, SiteIdentity
from .view import View


class SelectionPlan(NamedTuple):
    """Everything that decides what one subscriber receives, as plain data:
    ``articles`` maps a lowered table name to ``(columns, subscribe_by,
    values)`` (``values`` None: every row), ``returned_flag`` is the capture
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

def check_subscribers(identity: SiteIdentity, known: Collection[str], subscribers: Iterable[str]) -> None:
    """Raise UnknownRemote for the first of ``subscribers`` that is not
    ``known`` as a remote of the site."""
    for subscriber in subscribers:
        if subscriber not in known:
            raise _unknown(identity, subscriber)

def _unknown(identity: SiteIdentity, subscriber: str) -> UnknownRemote:
    return UnknownRemote(f"no remote named {subscriber!r} at site {identity.name!r}")

def plan_from_rows(subscriber: str, role: Role, articles: Iterable[tuple], subscriptions: Iterable[tuple]
                   ) -> SelectionPlan:
    """The plan from the rows of ``fieldsync_article`` (table, publication,
    columns as JSON or None, subscribe_by) and the subscriber's rows of
    ``fieldsync_subscription``: (publication, value) for subscriptions that
    hold, or (publication, value, since, until) with the commit offsets
    between which each holds (``until`` None: still), which make the plan's
    ``history``."""
    articles = list(articles)
    # Only the consolidated writes rows back to an origin; at a remote the
    # subscriber's (the consolidated's) log transactions hold nothing for it.
    returned_flag = FLAG_RETURN_TO_ORIGIN if role is Role.CONSOLIDATED else 0
    if role is Role.REMOTE:
        # The consolidated gets everything a remote publishes.
        return SelectionPlan(subscriber, {table.lower(): (None if columns is None else tuple(json.loads(columns)),
                                                          None, None)
                                          for table, _publication, columns, _subscribe_by in articles}, returned_flag)
    spans = [(row[0], row[1], row[2] if len(row) > 2 else 0, row[3] if len(row) > 3 else None)
             for row in subscriptions]
    current = _articles(articles, [(pub, value) for pub, value, _, until in spans if until is None])
    bounds = sorted({since for _, _, since, _ in spans if since > 0}
                    | {until for _, _, _, until in spans if until is not None})
    history = []
    start = 0
    for bound in bounds:
        held = _articles(articles, [(pub, value) for pub, value, since, until in spans
                                    if since <= start and (until is None or start < until)])
        if history and history[-1][1] == held:
            history[-1] = (bound, held)  # one span with the one before
        else:
            history.append((bound, held))
        start = bound
    while history and history[-1][1] == current:  # the last spans before the change hold the current plan
        history.pop()
    return SelectionPlan(subscriber, current, returned_flag, tuple(history))

def _articles(articles: list[tuple], subscriptions: Iterable[tuple]
              ) -> dict[str, tuple[tuple[str, ...] | None, str | None, frozenset | None]]:
    """What the subscriptions ``(publication, value)`` select: per lowered
    table, ``(columns, subscribe_by, values)`` (``values`` None: every row)."""
    values: dict[str, set] = {}
    for publication, value in subscriptions:
        bucket = values.setdefault(publication, set())
        if value is not None:
            bucket.add(value)
    plan: dict[str, tuple[tuple[str, ...] | None, str | None, frozenset | None]] = {}
    for table, publication, columns, subscribe_by in articles:
        if publication not in values:
            continue
        plan[table.lower()] = (None if columns is None else tuple(json.loads(columns)), subscribe_by,
                               frozenset(values[publication]) if subscribe_by else None)
    return plan

def value_columns_read(shapes: Iterable[Shape], plan: SelectionPlan) -> int:
    """How many capture value columns a reader of ``plan`` needs: the widest
    shape of a table it receives, old and new row."""
    routed = {table for table, (_, by, _) in plan.articles.items() if by == ROUTE}
    tables = set(plan.articles).union(*(set(articles) for _, articles in plan.history))
    for _, articles in plan.history:
        routed.update(table for table, (_, by, _) in articles.items() if by == ROUTE)
    # A follow article's rows carry their routes after the widest image.
    return max((2 * len(shape.columns) + (2 if shape.table.lower() in routed else 0)
                for shape in shapes if shape.table.lower() in tables), default=0)

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
        self.returned_columns = returned_columns
        self._shapes = shapes
        self._views: dict[int, View | None] = {}
        self._articles = plan.articles
        self._current = plan.articles
        self._history = plan.history

    @classmethod
    def many_from_rows(cls, identity: SiteIdentity, shapes: "Shapes", every_shape: Iterable[Shape],
                       articles: Iterable[tuple], subscriptions: Mapping[str, Iterable[tuple]],
                       subscribers: list[str], returned_columns: Callable[[int], str | None], *,
                       runs: bool = False) -> list["SubscriberReader"]:
        """A reader for each of ``subscribers`` from a site's rows, whatever
        its backend: the article rows (ARTICLE_ROWS' columns), each
        subscriber's subscription rows ``(publication, value, since,
        until)``, and every shape (how wide the capture rows are read)."""
        articles, every_shape = list(articles), list(every_shape)
        readers = []
        for subscriber in subscribers:
            plan = plan_from_rows(subscriber, identity.role, articles, subscriptions.get(subscriber, ()))
            readers.append(cls(plan, shapes, returned_columns, value_columns_read(every_shape, plan), runs=runs))
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

    def view(self, shape_id: int) -> "View | None":
        """How the subscriber sees rows of this shape (None: not at all)."""
        return self._view(shape_id)

    def _view(self, shape_id: int) -> View | None:
        try:
            return self._views[shape_id]
        except KeyError:
            pass
        shape = self._shapes.get(shape_id)
        article = self._articles.get(shape.table.lower())
        view = None if article is None else View(shape, *article)
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
        return subscriber_change(row[4] if len(row) > 4 else None, self._articles.get, self._shapes.get)

    def _returned(self, view: View, origin: str, row: tuple) -> Operation | None:
        """A row a conflict resolution sends back to its origin: the old
        image is the row as the origin holds it, the new image the result.
        The origin gets the listed columns of the result, the whole row if
        it now enters its subset, or a DELETE if it leaves it.  An INSERT
        row (the origin no longer holds the row) carries the result alone."""
        width = view.width
        old = row[4:4 + width]
        if row[2] == KIND_DELETE:
            return _operation(view.table, OpKind.DELETE, view.key(old), view.image(old), None)
        if row[2] == KIND_INSERT:
            if not view.holds(row):
                return None
            return _operation(view.table, OpKind.INSERT, view.key(old), None, view.image(old))
        new = row[4 + width:4 + 2 * width]
        if not view.holds(row, new=True):
            return _operation(view.table, OpKind.DELETE, view.key(old), view.image(old), None)
        if not view.holds(row):
            return _operation(view.table, OpKind.INSERT, view.key(new), None, view.image(new))
        found = self.returned_columns(row[0])
        listed = set(json.loads(found)) if found is not None else set(view.names)
        names = self._shapes.get(row[1]).columns
        chosen = [i for i in view.positions if names[i] in listed]
        if not chosen:
            return None
        return _operation(view.table, OpKind.UPDATE, view.key(old), {names[i]: old[i] for i in chosen},
                          {names[i]: new[i] for i in chosen})

class _Route(NamedTuple):
    """Where the capture rows of one shape go, among a Router's readers.

    ``classes`` groups the readers that see the shape alike (same columns,
    same SUBSCRIBE BY column and values): a row becomes the same operation
    for each reader of a class, so it is converted once per class.
    ``every`` are the classes that receive every row; ``by_value`` maps a
    SUBSCRIBE BY value to the classes whose subset holds it, the value at
    ``old_at`` (and, for an UPDATE, ``new_at``) of a capture row.
    """

    classes: tuple[tuple["View", tuple[int, ...]], ...]
    every: tuple[int, ...]
    old_at: int | None
    new_at: int | None
    by_value: dict[object, tuple[int, ...]]

    def numbers(self, kind: int, row: tuple) -> tuple[int, ...]:
        """The classes an ordinary capture ``row`` of this shape can concern."""
        if self.old_at is None:
            return self.every
        old = row[self.old_at]
        numbers = (*self.every, *self.by_value.get(old, ()))
        if kind == KIND_UPDATE and row[self.new_at] != old:  # moved: its new subset's classes too
            moved_to = self.by_value.get(row[self.new_at], ())
            if moved_to:
                numbers = tuple(dict.fromkeys((*numbers, *moved_to)))
        return numbers

class Router:
    """Which of several subscribers' readers a capture row can concern.

    Used where one pass over the log serves many subscribers (the Spark
    batch job, :class:`Fanout` for the agent's own sends): instead of
    offering every row to every reader, a row goes
    to the readers that receive every row of its table, those whose
    SUBSCRIBE BY values hold its old or new value, and, for a row written
    back to its origin, the origin alone.  That is a superset of the readers
    that turn it into an operation; each reader still decides, so the
    result is what each reader alone would select.  The origin of an
    ordinary row is never offered it (no echo).

    Readers that see a shape alike form one class (:class:`_Route`): a
    catalog every subscriber receives is converted once, not once for each.
    """

    def __init__(self, readers: list[SubscriberReader]) -> None:
        self.readers = readers
        self.runs = bool(readers) and readers[0].runs  # a pass serves readers of one form
        self._index = {reader.subscriber: index for index, reader in enumerate(readers)}
        self._routes: dict[int, _Route] = {}

    def route(self, shape_id: int) -> _Route:
        route = self._routes.get(shape_id)
        if route is not None:
            return route
        members: dict[tuple, list[int]] = {}
        views: dict[tuple, View] = {}
        old_at = new_at = None
        for index, reader in enumerate(self.readers):
            view = reader.view(shape_id)
            if view is None:
                continue
            alike = (view.positions, view.filter_position, view.values)
            members.setdefault(alike, []).append(index)
            views.setdefault(alike, view)
            if view.old_filter is not None:  # the same column for every reader of this table
                old_at, new_at = view.old_filter, view.new_filter
        classes = tuple((views[alike], tuple(indexes)) for alike, indexes in members.items())
        every = tuple(number for number, (view, _) in enumerate(classes) if view.values is None)
        by_value: dict[object, list[int]] = {}
        for number, (view, _) in enumerate(classes):
            if view.values is not None and view.old_filter is not None:
                for value in view.values:
                    by_value.setdefault(value, []).append(number)
        route = self._routes[shape_id] = _Route(
            classes, every, old_at, new_at, {value: tuple(numbers) for value, numbers in by_value.items()})
        return route

    def candidates(self, origin: str, row: tuple) -> frozenset[int]:
        """Indexes into ``readers`` of the subscribers ``row`` can concern."""
        return frozenset(index for members in self.classes(origin, row) for index in members)

    def classes(self, origin: str, row: tuple) -> list[tuple[int, ...]]:
        """The readers ``row`` can concern (as :meth:`candidates`), grouped
        into classes whose readers each turn it into the same operation."""
        origin_index = self._index.get(origin)
        flags = row[3]
        if row[2] == KIND_SCHEMA:  # each reader takes what concerns it
            return [tuple(index for index in range(len(self.readers)) if index != origin_index)]
        if flags and flags & FLAG_RETURN_TO_ORIGIN:
            return [] if origin_index is None else [(origin_index,)]
        route = self.route(row[1])
        found = []
        for number in route.numbers(row[2], row):
            members = route.classes[number][1]
            if origin_index in members:  # no echo
                members = tuple(index for index in members if index != origin_index)
            if members:
                found.append(members)
        return found

    def select(self, origin: str, rows: Iterable[tuple], ops: list[list[Operation]]) -> int:
        """Append to ``ops[i]`` the operations consecutive capture ``rows`` of
        one log transaction of ``origin`` become for reader ``i``, as
        ``readers[i].extend`` would; return how many were appended in all.
        A row is converted once for each class of readers it concerns."""
        origin_index = self._index.get(origin)
        added = 0
        for (shape_id, kind, flags), group in groupby(rows, _SHAPE_KIND_FLAGS):
            if flags and flags & FLAG_RETURN_TO_ORIGIN:
                if origin_index is not None:  # written back to its origin: for that reader alone
                    before = len(ops[origin_index])
                    self.readers[origin_index].extend(origin, group, ops[origin_index])
                    added += op_count(islice(ops[origin_index], before, None))
                continue
            if kind == KIND_SCHEMA:  # each reader takes what concerns it (rare: no class, no route)
                rows_of_change = list(group)
                for index, reader in enumerate(self.readers):
                    if index != origin_index:
                        before = len(ops[index])
                        reader.extend(origin, rows_of_change, ops[index])
                        added += len(ops[index]) - before
                continue
            if kind != KIND_UPDATE and kind != KIND_INSERT and kind != KIND_DELETE:
                continue
            route = self.route(shape_id)
            if not route.classes:
                continue
            buckets: dict[int, list[tuple]]
            if route.old_at is None:
                run = list(group)
                buckets = {number: run for number in route.every}
            else:
                buckets = {}
                numbers_of = route.numbers
                for row in group:
                    for number in numbers_of(kind, row):
                        bucket = buckets.get(number)
                        if bucket is None:
                            buckets[number] = [row]
                        else:
                            bucket.append(row)
            for number in sorted(buckets):
                view, members = route.classes[number]
                if origin_index in members:  # no echo
                    members = tuple(index for index in members if index != origin_index)
                    if not members:
                        continue
                bucket = buckets[number]
                if kind == KIND_UPDATE and self.runs:
                    selected = view.update_runs(bucket)
                elif kind == KIND_UPDATE:
                    update_op = view.update
                    selected = [op for op in map(update_op, bucket) if op is not None]
                elif self.runs:
                    selected = view.runs(kind, bucket)
                else:
                    selected = view.rows(kind, bucket)
                if selected:
                    for index in members:
                        ops[index].extend(selected)
                    added += op_count(selected) * len(members)
        return added

# A pass over the log for several subscribers holds at most this many
# selected operations of one log transaction (all subscribers together)
# before it reads that transaction for each subscriber in turn instead.
FANOUT_HOLD = 50_000

class Fanout:
    """One pass over the log for several subscribers, each with its own range.

    Fed the capture rows of the union of the ranges as :func:`iter_capture`
    gives them (unselected: chunks of one log transaction each, in seq
    order), it offers each row to the readers it can concern
    (:class:`Router`) among the subscribers whose range ``(start, end]``
    holds its log transaction, and returns each subscriber's transactions as
    :func:`read_transactions` makes them, once their log transaction is
    complete.  Pure: it holds the operations selected from the current log
    transaction (``held`` of them), nothing from earlier ones.
    """

    def __init__(self, readers: list[SubscriberReader], ranges: list[tuple[int, int]]) -> None:
        if len(readers) != len(ranges):
            raise InvalidSetting(f"{len(readers)} readers for {len(ranges)} ranges")
        if len({reader.subscriber for reader in readers}) != len(readers):
            raise InvalidSetting("a pass over the log reads for each subscriber at most once")
        self.readers = readers
        self.ranges = ranges
        self.held = 0
        self.active: tuple[int, ...] = ()  # the subscribers whose range holds the current log transaction
        self._ops: list[list[Operation]] = [[] for _ in readers]
        self._commit = 0
        self._origin = ""
        self._routers: dict[tuple[int, ...], Router] = {}

    def add(self, commit: int, origin: str, rows: list[tuple]) -> list[tuple[int, Transaction]]:
        """Take the next chunk of capture rows; return ``(index, transaction)``
        for the log transaction before it, if this chunk starts another."""
        finished: list[tuple[int, Transaction]] = []
        if commit != self._commit:
            finished = self._complete()
            self._commit, self._origin = commit, origin
            self.active = tuple(index for index, (start, end) in enumerate(self.ranges) if start < commit <= end)
            # A subscription change: a reader's plan for this log transaction
            # differs from the last one's, so the routes are made again.
            if [self.readers[index].at(commit) for index in self.active].count(True):
                self._routers.clear()
        active = self.active
        if len(active) == 1:
            # One subscriber: its reader takes the whole chunk (it leaves out
            # its own changes itself), as read_transactions does.
            ops = self._ops[active[0]]
            before = len(ops)
            self.readers[active[0]].extend(origin, rows, ops)
            self.held += op_count(islice(ops, before, None))
        elif active:
            self.held += self._router(active).select(origin, rows, [self._ops[index] for index in active])
        return finished

    def finish(self) -> list[tuple[int, Transaction]]:
        """The end of the input: the transactions of the last log transaction."""
        finished = self._complete()
        self._commit, self.active = 0, ()
        return finished

    def drop(self) -> tuple[int, tuple[int, ...]]:
        """Forget what was selected from the current log transaction; return
        its commit offset and the subscribers whose range holds it, for the
        caller to read it for them another way."""
        dropped = (self._commit, self.active)
        for index in self.active:
            self._ops[index] = []
        self._commit, self.active, self.held = 0, (), 0
        return dropped

    def _complete(self) -> list[tuple[int, Transaction]]:
        finished = []
        for index in self.active:
            ops = self._ops[index]
            if ops:
                self._ops[index] = []
                transaction = make_transaction(self._commit, self._origin, ops)
                if transaction is not None:
                    finished.append((index, transaction))
        self.held = 0
        return finished

    def _router(self, active: tuple[int, ...]) -> Router:
        router = self._routers.get(active)
        if router is None:
            router = self._routers[active] = Router([self.readers[index] for index in active])
        return router

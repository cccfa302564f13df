"""Publications, subscriptions, and reading the log for one subscriber.

Rules of this file:
* A publication is a set of *articles*; an article is one table, optionally
  restricted to some columns (the key columns are always included) and
  optionally with a ``SUBSCRIBE BY`` column.  A table belongs to at most one
  publication, so each subscriber sees each table through one article.
* At the consolidated, a remote subscribes to a publication with a value
  (several values make several subscriptions); it receives the rows whose
  SUBSCRIBE BY column equals one of its values (``NULL`` never matches;
  ``7`` and ``7.0`` match, ``'7'`` and ``7`` do not: Python equality on
  SQLite values).  Articles without SUBSCRIBE BY send every row.
* At a remote, the consolidated receives every row of every article: the
  remote's data already is its subset.
* Reading turns capture rows into :class:`codec.ops.Operation` values:
  ops whose origin is the subscriber are dropped (no echo), except the rows
  the apply path wrote for that origin (conflict results, DELETEs of rows it
  left outside its subset); an UPDATE that moves a row into or out of the
  subscriber's subset becomes an INSERT of the full published row or a
  DELETE; within one transaction a DELETE and a re-INSERT of the same row
  fold into an UPDATE, when nothing else changed that table in between.
"""

from __future__ import annotations

import json
import math
import sqlite3
import threading
from dataclasses import dataclass
from datetime import datetime
from itertools import groupby
from operator import itemgetter
from typing import Callable, Iterable, Iterator, NamedTuple

from codec.ops import OpKind, Operation, PartialTransaction, Transaction

from ._db import format_time, parse_time, utc_now
from .capture import (
    FLAG_RETURN_TO_ORIGIN,
    KIND_DELETE,
    KIND_INSERT,
    KIND_UPDATE,
    Shape,
    ShapeCache,
    ShapeTable,
    all_shapes,
    drop_capture,
    install_capture,
    table_info,
)
from .errors import InvalidSetting, LogOffsetError, PublicationError, UnknownPublication, UnknownRemote
from .log import check_boundary, iter_capture, log_end
from .schema import Role, SiteIdentity
from .values import value_problem

Value = None | int | float | str | bytes


@dataclass(frozen=True, slots=True)
class Article:
    """One table of a publication.  ``columns`` None means every column."""

    table: str
    columns: tuple[str, ...] | None = None
    subscribe_by: str | None = None

    def __post_init__(self) -> None:
        if type(self.table) is not str or not self.table:
            raise InvalidSetting(f"article table must be a non-empty string, got {self.table!r}")
        if self.columns is not None:
            if isinstance(self.columns, str) or not all(type(c) is str and c for c in self.columns):
                raise InvalidSetting(f"article columns of {self.table} must be a sequence of column names")
            object.__setattr__(self, "columns", tuple(self.columns))
        if self.subscribe_by is not None and (type(self.subscribe_by) is not str or not self.subscribe_by):
            raise InvalidSetting(f"SUBSCRIBE BY column of {self.table} must be a column name")


@dataclass(frozen=True, slots=True)
class Publication:
    name: str
    articles: tuple[Article, ...]


@dataclass(frozen=True, slots=True)
class Subscription:
    remote: str
    publication: str
    value: Value
    created_at: datetime


class LoggedOperation(NamedTuple):
    """One operation of the log as a subscriber sees it."""

    commit: int
    origin: str
    operation: Operation


def check_publication_name(name: object) -> str:
    if type(name) is not str or not name or len(name) > 128 or not name.isprintable():
        shown = name if type(name) is not str or len(name) <= 40 else name[:40] + "..."
        raise InvalidSetting(f"publication name must be 1-128 printable characters, got {shown!r}")
    return name  # type: ignore[return-value]


def _as_article(item: Article | str) -> Article:
    return item if isinstance(item, Article) else Article(item)


# --- definitions (callers hold a write transaction) ---------------------------


def create_publication_locked(conn: sqlite3.Connection, name: str, articles: Iterable[Article | str],
                              now: datetime | None) -> None:
    check_publication_name(name)
    if conn.execute("SELECT 1 FROM fieldsync_publication WHERE name = ?", (name,)).fetchone():
        raise PublicationError(f"publication {name!r} exists already; add articles to it instead")
    conn.execute("INSERT INTO fieldsync_publication (name, created_at) VALUES (?, ?)",
                 (name, format_time(now or utc_now())))
    for article in articles:
        add_article_locked(conn, name, _as_article(article))


def add_article_locked(conn: sqlite3.Connection, publication: str, article: Article) -> Article:
    if conn.execute("SELECT 1 FROM fieldsync_publication WHERE name = ?", (publication,)).fetchone() is None:
        raise UnknownPublication(f"no publication named {publication!r}; create it first")
    info = table_info(conn, article.table)
    taken = conn.execute("SELECT publication FROM fieldsync_article WHERE table_name = ?", (info.name,)).fetchone()
    if taken:
        raise PublicationError(f"table {info.name!r} is already published in {taken[0]!r}; a table belongs to "
                               "one publication")
    known = {column.lower(): column for column in info.columns}
    columns = None
    if article.columns is not None:
        wanted = set()
        for column in article.columns:
            if column.lower() not in known:
                raise PublicationError(f"table {info.name!r} has no column {column!r} to publish")
            wanted.add(known[column.lower()])
        wanted.update(info.key_columns)
        columns = tuple(column for column in info.columns if column in wanted)
        if columns == info.columns:
            columns = None
    subscribe_by = None
    if article.subscribe_by is not None:
        if article.subscribe_by.lower() not in known:
            raise PublicationError(f"SUBSCRIBE BY column {article.subscribe_by!r} is not a stored column of "
                                   f"{info.name!r}")
        subscribe_by = known[article.subscribe_by.lower()]
    shape = install_capture(conn, info)
    conn.execute("INSERT INTO fieldsync_article (table_name, publication, columns, subscribe_by, shape)"
                 " VALUES (?, ?, ?, ?, ?)",
                 (info.name, publication, None if columns is None else json.dumps(columns), subscribe_by, shape))
    return Article(info.name, columns, subscribe_by)


def remove_article_locked(conn: sqlite3.Connection, table: str) -> None:
    row = conn.execute("SELECT table_name FROM fieldsync_article WHERE table_name = ?", (table,)).fetchone()
    if row is None:
        raise PublicationError(f"table {table!r} is not published")
    drop_capture(conn, row[0])
    conn.execute("DELETE FROM fieldsync_article WHERE table_name = ?", (row[0],))


def drop_publication_locked(conn: sqlite3.Connection, name: str) -> None:
    if conn.execute("SELECT 1 FROM fieldsync_publication WHERE name = ?", (name,)).fetchone() is None:
        raise UnknownPublication(f"no publication named {name!r}")
    for (table,) in conn.execute("SELECT table_name FROM fieldsync_article WHERE publication = ?",
                                 (name,)).fetchall():
        drop_capture(conn, table)
    conn.execute("DELETE FROM fieldsync_article WHERE publication = ?", (name,))
    conn.execute("DELETE FROM fieldsync_subscription WHERE publication = ?", (name,))
    conn.execute("DELETE FROM fieldsync_publication WHERE name = ?", (name,))


def missing_tables(conn: sqlite3.Connection) -> tuple[str, ...]:
    """Published tables the database no longer has (renamed or dropped by
    an application): their article stays until it is removed."""
    return tuple(table for (table,) in conn.execute(
        "SELECT a.table_name FROM fieldsync_article a WHERE NOT EXISTS (SELECT 1 FROM sqlite_master m"
        " WHERE m.type = 'table' AND m.name = a.table_name COLLATE NOCASE) ORDER BY a.table_name"))


def list_publications(conn: sqlite3.Connection) -> tuple[Publication, ...]:
    articles: dict[str, list[Article]] = {}
    for (name,) in conn.execute("SELECT name FROM fieldsync_publication ORDER BY name"):
        articles[name] = []
    for table, publication, columns, subscribe_by in conn.execute(
            "SELECT table_name, publication, columns, subscribe_by FROM fieldsync_article ORDER BY table_name"):
        articles[publication].append(
            Article(table, None if columns is None else tuple(json.loads(columns)), subscribe_by))
    return tuple(Publication(name, tuple(items)) for name, items in articles.items())


def subscribe_locked(conn: sqlite3.Connection, remote: str, publication: str, value: Value,
                     now: datetime | None) -> None:
    if conn.execute("SELECT 1 FROM fieldsync_remote WHERE name = ?", (remote,)).fetchone() is None:
        raise UnknownRemote(f"no remote named {remote!r}; add it before subscribing it")
    if conn.execute("SELECT 1 FROM fieldsync_publication WHERE name = ?", (publication,)).fetchone() is None:
        raise UnknownPublication(f"no publication named {publication!r}")
    problem = value_problem(value)
    if problem is not None:
        raise InvalidSetting(f"subscription value: {problem}")
    if isinstance(value, float) and math.isnan(value):
        raise InvalidSetting("subscription value cannot be NaN (SQLite stores NaN as NULL, which matches nothing)")
    for (existing,) in conn.execute("SELECT value FROM fieldsync_subscription WHERE remote = ? AND publication = ?",
                                    (remote, publication)).fetchall():
        if type(existing) is type(value) and existing == value:
            return  # subscribing twice is harmless
    conn.execute("INSERT INTO fieldsync_subscription (remote, publication, value, created_at) VALUES (?, ?, ?, ?)",
                 (remote, publication, value, format_time(now or utc_now())))


def unsubscribe_locked(conn: sqlite3.Connection, remote: str, publication: str) -> int:
    """Drop every subscription of ``remote`` to ``publication``; return how many."""
    return conn.execute("DELETE FROM fieldsync_subscription WHERE remote = ? AND publication = ?",
                        (remote, publication)).rowcount


def list_subscriptions(conn: sqlite3.Connection, remote: str | None = None) -> tuple[Subscription, ...]:
    query = "SELECT remote, publication, value, created_at FROM fieldsync_subscription"
    params: tuple = ()
    if remote is not None:
        query += " WHERE remote = ?"
        params = (remote,)
    rows = conn.execute(query + " ORDER BY remote, publication, rowid", params).fetchall()
    return tuple(Subscription(r, p, v, parse_time(t)) for r, p, v, t in rows)  # type: ignore[arg-type]


# --- reading the log for a subscriber ------------------------------------------


class _View:
    """How one subscriber sees the capture rows of one shape.

    Everything that depends only on the shape is worked out once: getters
    that pick the published columns and the key out of a whole capture row
    (``(seq, shape, kind, flags, v0, ...)``; the old or inserted row starts
    at ``v0``, an UPDATE's new row at ``v<width>``), and where the SUBSCRIBE
    BY value sits.  Reading converts runs of rows of one shape and kind in
    one comprehension (the log reader's hot path).
    """

    __slots__ = ("table", "width", "names", "positions", "key_positions", "filter_position", "values",
                 "indexes", "old_image", "new_image", "old_key", "new_key", "old_filter", "new_filter")

    def __init__(self, shape: Shape, columns: tuple[str, ...] | None, subscribe_by: str | None,
                 values: frozenset | None) -> None:
        self.table = shape.table
        width = self.width = len(shape.columns)
        wanted = set(shape.columns if columns is None else columns) | set(shape.key_columns)
        self.positions = tuple(i for i, column in enumerate(shape.columns) if column in wanted)
        self.names = tuple(shape.columns[i] for i in self.positions)
        self.key_positions = shape.key_positions
        if subscribe_by is None or values is None:
            self.filter_position = None
            self.values = None
        elif subscribe_by in shape.columns:
            self.filter_position = shape.columns.index(subscribe_by)
            self.values = values
        else:  # the filter column did not exist when these rows were captured
            self.filter_position = None
            self.values = frozenset()
        self.indexes = range(len(self.positions))
        self.old_image = _getter([4 + i for i in self.positions])
        self.new_image = _getter([4 + width + i for i in self.positions])
        self.old_key = _getter([4 + i for i in self.key_positions])
        self.new_key = _getter([4 + width + i for i in self.key_positions])
        self.old_filter = None if self.filter_position is None else 4 + self.filter_position
        self.new_filter = None if self.filter_position is None else 4 + width + self.filter_position

    def contains(self, row: tuple) -> bool:
        """Whether an image (a slice of the shape's columns) is in the subset."""
        if self.filter_position is None:
            return self.values is None
        return row[self.filter_position] in self.values  # type: ignore[operator]

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
            if 0.0 in old:  # a zero (or -0.0) compares equal to 0 and to -0.0: compare exactly
                changed = [index for index, a, b in zip(self.indexes, old, new) if not _same(a, b)]
            else:
                changed = [index for index, a, b in zip(self.indexes, old, new) if a != b or type(a) is not type(b)]
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


def _getter(indexes: list[int]) -> Callable[[tuple], tuple]:
    """``itemgetter`` that always returns a tuple (also for one index)."""
    if len(indexes) == 1:
        index = indexes[0]
        return lambda row: (row[index],)
    return itemgetter(*indexes)


def _same(left: object, right: object) -> bool:
    if type(left) is not type(right):
        return False
    if type(left) is float:
        return left == right and math.copysign(1.0, left) == math.copysign(1.0, right)  # type: ignore[arg-type]
    return left == right


def _operation(table: str, kind: int, key: tuple, before: dict | None, after: dict | None) -> Operation:
    # Built from values SQLite handed back, so already valid: skip the
    # constructor's per-value checks on this hot path.
    return tuple.__new__(Operation, (table, kind, key, before, after))


_SHAPE_KIND_FLAGS = itemgetter(1, 2, 3)


class SelectionPlan(NamedTuple):
    """Everything that decides what one subscriber receives, as plain data:
    ``articles`` maps a lowered table name to ``(columns, subscribe_by,
    values)`` (``values`` None: every row), ``returned_flag`` is the capture
    flag of rows written back to their origin (0 at a remote).  It is what
    :func:`selection_plan` reads from a site database and what a batch
    export writes out, so a reader built anywhere selects alike."""

    subscriber: str
    articles: dict[str, tuple[tuple[str, ...] | None, str | None, frozenset | None]]
    returned_flag: int


def selection_plan(conn: sqlite3.Connection, identity: SiteIdentity, subscriber: str) -> SelectionPlan:
    """What ``subscriber`` receives from this site (raises for an unknown remote)."""
    if conn.execute("SELECT 1 FROM fieldsync_remote WHERE name = ?", (subscriber,)).fetchone() is None:
        raise UnknownRemote(f"no remote named {subscriber!r} at site {identity.name!r}")
    articles = conn.execute("SELECT table_name, publication, columns, subscribe_by FROM fieldsync_article").fetchall()
    subscriptions = conn.execute("SELECT publication, value FROM fieldsync_subscription WHERE remote = ?",
                                 (subscriber,)).fetchall()
    return plan_from_rows(subscriber, identity.role, articles, subscriptions)


def plan_from_rows(subscriber: str, role: Role, articles: Iterable[tuple], subscriptions: Iterable[tuple]
                   ) -> SelectionPlan:
    """The plan from the rows of ``fieldsync_article`` (table, publication,
    columns as JSON or None, subscribe_by) and the subscriber's rows of
    ``fieldsync_subscription`` (publication, value)."""
    plan: dict[str, tuple[tuple[str, ...] | None, str | None, frozenset | None]] = {}
    if role is Role.REMOTE:
        # The consolidated gets everything a remote publishes.
        for table, _publication, columns, _subscribe_by in articles:
            plan[table.lower()] = (None if columns is None else tuple(json.loads(columns)), None, None)
    else:
        values: dict[str, set] = {}
        for publication, value in subscriptions:
            bucket = values.setdefault(publication, set())
            if value is not None:
                bucket.add(value)
        for table, publication, columns, subscribe_by in articles:
            if publication not in values:
                continue
            plan[table.lower()] = (None if columns is None else tuple(json.loads(columns)), subscribe_by,
                                   frozenset(values[publication]) if subscribe_by else None)
    # Only the consolidated writes rows back to an origin; at a remote the
    # subscriber's (the consolidated's) log transactions hold nothing for it.
    returned_flag = FLAG_RETURN_TO_ORIGIN if role is Role.CONSOLIDATED else 0
    return SelectionPlan(subscriber, plan, returned_flag)


def value_columns_read(shapes: Iterable[Shape], plan: SelectionPlan) -> int:
    """How many capture value columns a reader of ``plan`` needs: the widest
    shape of a table it receives, old and new row."""
    return 2 * max((len(shape.columns) for shape in shapes if shape.table.lower() in plan.articles), default=0)


class SubscriberReader:
    """Turns capture rows into the operations one subscriber receives.

    Pure: it sees the plan, the shapes (anything with ``get(shape_id)``) and
    ``returned_columns(seq)``, the columns a written-back row lists (None:
    all).  The site database and the Spark batch job both select through it.
    """

    def __init__(self, plan: SelectionPlan, shapes: "ShapeCache | ShapeTable",
                 returned_columns: Callable[[int], str | None], value_columns: int) -> None:
        self.subscriber = plan.subscriber
        self.returned_flag = plan.returned_flag
        self.value_columns = value_columns
        self.returned_columns = returned_columns
        self._shapes = shapes
        self._views: dict[int, _View | None] = {}
        self._articles = plan.articles

    @classmethod
    def from_database(cls, conn: sqlite3.Connection, identity: SiteIdentity, shapes: ShapeCache,
                      subscriber: str) -> "SubscriberReader":
        plan = selection_plan(conn, identity, subscriber)
        # Capture rows are read only as wide as the widest shape of a table
        # it receives (old and new row), not as wide as the capture table.
        width = value_columns_read(all_shapes(conn), plan)

        def returned_columns(seq: int) -> str | None:
            found = conn.execute("SELECT columns FROM fieldsync_returned WHERE seq = ?", (seq,)).fetchone()
            return None if found is None else found[0]

        return cls(plan, shapes, returned_columns, width)

    @classmethod
    def many_from_database(cls, conn: sqlite3.Connection, identity: SiteIdentity, shapes: ShapeCache,
                           subscribers: list[str]) -> list["SubscriberReader"]:
        """:meth:`from_database` for many subscribers, with one query each
        for the remotes, articles, subscriptions and shapes (a send phase
        at a consolidated of thousands reads for all of them at once)."""
        known = {name for (name,) in conn.execute("SELECT name FROM fieldsync_remote")}
        for subscriber in subscribers:
            if subscriber not in known:
                selection_plan(conn, identity, subscriber)  # raises UnknownRemote
        articles = conn.execute("SELECT table_name, publication, columns, subscribe_by FROM fieldsync_article").fetchall()
        wanted = set(subscribers)
        subscriptions: dict[str, list[tuple]] = {}
        for remote, publication, value in conn.execute("SELECT remote, publication, value FROM fieldsync_subscription"):
            if remote in wanted:
                subscriptions.setdefault(remote, []).append((publication, value))
        every_shape = all_shapes(conn)

        def returned_columns(seq: int) -> str | None:
            found = conn.execute("SELECT columns FROM fieldsync_returned WHERE seq = ?", (seq,)).fetchone()
            return None if found is None else found[0]

        readers = []
        for subscriber in subscribers:
            plan = plan_from_rows(subscriber, identity.role, articles, subscriptions.get(subscriber, ()))
            readers.append(cls(plan, shapes, returned_columns, value_columns_read(every_shape, plan)))
        return readers

    def view(self, shape_id: int) -> "_View | None":
        """How the subscriber sees rows of this shape (None: not at all)."""
        return self._view(shape_id)

    def _view(self, shape_id: int) -> _View | None:
        try:
            return self._views[shape_id]
        except KeyError:
            pass
        shape = self._shapes.get(shape_id)
        article = self._articles.get(shape.table.lower())
        view = None if article is None else _View(shape, *article)
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
                update = view.update
                for row in group:
                    op = update(row)
                    if op is not None:
                        ops.append(op)
            elif kind == KIND_INSERT or kind == KIND_DELETE:
                ops.extend(view.rows(kind, group))

    def _returned(self, view: _View, origin: str, row: tuple) -> Operation | None:
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
            if not view.contains(old):
                return None
            return _operation(view.table, OpKind.INSERT, view.key(old), None, view.image(old))
        new = row[4 + width:4 + 2 * width]
        if not view.contains(new):
            return _operation(view.table, OpKind.DELETE, view.key(old), view.image(old), None)
        if not view.contains(old):
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

    classes: tuple[tuple["_View", tuple[int, ...]], ...]
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
        self._index = {reader.subscriber: index for index, reader in enumerate(readers)}
        self._routes: dict[int, _Route] = {}

    def route(self, shape_id: int) -> _Route:
        route = self._routes.get(shape_id)
        if route is not None:
            return route
        members: dict[tuple, list[int]] = {}
        views: dict[tuple, _View] = {}
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
                    added += len(ops[origin_index]) - before
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
                if kind == KIND_UPDATE:
                    update_op = view.update
                    selected = [op for op in map(update_op, bucket) if op is not None]
                else:
                    selected = view.rows(kind, bucket)
                if selected:
                    for index in members:
                        ops[index].extend(selected)
                    added += len(selected) * len(members)
        return added


def resolve_range(conn: sqlite3.Connection, after: int, until: int | None) -> int:
    check_boundary(conn, after, "start offset")
    end = log_end(conn)
    if until is None:
        until = end
    else:
        if until > end:
            raise LogOffsetError(f"end offset {until} lies beyond the log end {end}")
        check_boundary(conn, until, "end offset")
    if until < after:
        raise LogOffsetError(f"end offset {until} lies before start offset {after}")
    return until


def read_operations(conn: sqlite3.Connection, reader: SubscriberReader, after: int, until: int, *,
                    lock: threading.RLock | None = None) -> Iterator[LoggedOperation]:
    for commit, origin, rows in iter_capture(conn, after, until, lock=lock, skip_origin=reader.subscriber,
                                             keep_flag=reader.returned_flag, value_columns=reader.value_columns):
        ops: list[Operation] = []
        reader.extend(origin, rows, ops)
        for op in ops:
            yield LoggedOperation(commit, origin, op)


def read_transactions(conn: sqlite3.Connection, reader: SubscriberReader, after: int, until: int, *,
                      lock: threading.RLock | None = None, piece: int | None = None) -> Iterator[Transaction]:
    """Group :func:`read_operations` into transactions; a log transaction
    with nothing for the subscriber yields nothing.  With ``piece``, a log
    transaction that selects more operations comes in pieces of about that
    many (``PartialTransaction`` values and a last plain ``Transaction``,
    codec.packing), so none is held whole."""
    ops: list[Operation] = []
    folder: _Folder | None = None
    commit, origin = 0, ""
    for logged_commit, logged_origin, rows in iter_capture(conn, after, until, lock=lock,
                                                           skip_origin=reader.subscriber,
                                                           keep_flag=reader.returned_flag,
                                                           value_columns=reader.value_columns):
        if logged_commit != commit:
            if folder is not None:
                yield _last_piece(commit, origin, folder, ops)
                folder = None
            elif ops:
                yield from _transaction(commit, origin, ops)
            ops = []
            commit, origin = logged_commit, logged_origin
        reader.extend(logged_origin, rows, ops)
        if piece is not None and len(ops) >= piece + FOLD_WINDOW:
            if folder is None:
                folder = _Folder()
            folder.add(ops)
            ops = []
            taken = folder.take(FOLD_WINDOW)
            if taken:
                yield PartialTransaction._trusted(commit, origin, tuple(taken))
    if folder is not None:
        yield _last_piece(commit, origin, folder, ops)
    elif ops:
        yield from _transaction(commit, origin, ops)


def _last_piece(commit: int, origin: str, folder: "_Folder", ops: list[Operation]) -> Transaction:
    """The last piece of a transaction read in pieces (perhaps empty: every
    piece before it was yielded already)."""
    folder.add(ops)
    return Transaction._trusted(commit, origin, tuple(folder.take(0)))


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
        active = self.active
        if len(active) == 1:
            # One subscriber: its reader takes the whole chunk (it leaves out
            # its own changes itself), as read_transactions does.
            ops = self._ops[active[0]]
            before = len(ops)
            self.readers[active[0]].extend(origin, rows, ops)
            self.held += len(ops) - before
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


def read_fanout(conn: sqlite3.Connection, readers: list[SubscriberReader], ranges: list[tuple[int, int]], *,
                lock: threading.RLock | None = None, hold: int = FANOUT_HOLD,
                piece: int | None = None) -> Iterator[tuple[int, Transaction]]:
    """What :func:`read_transactions` yields for each reader over its range
    ``(after, until]`` (commit boundaries the caller checked), from one pass
    over the log: ``(index, transaction)`` pairs, each reader's in commit
    order.

    A log transaction from which more than ``hold`` operations are selected
    (for all readers together) is dropped from the pass and read for each of
    its subscribers in turn, so memory holds what one subscriber's read
    holds plus about ``hold`` operations (the check comes after each chunk
    of capture rows).  A single reader reads as :func:`read_transactions`
    does.  ``piece``: as for :func:`read_transactions`, where a log
    transaction is read for one subscriber.
    """
    if not readers:
        return iter(())
    if len(readers) == 1:
        after, until = ranges[0]
        return ((0, transaction)
                for transaction in read_transactions(conn, readers[0], after, until, lock=lock, piece=piece))
    return _read_fanout(conn, Fanout(readers, ranges), lock, hold, piece)


def _read_fanout(conn: sqlite3.Connection, fanout: Fanout, lock: threading.RLock | None,
                 hold: int, piece: int | None) -> Iterator[tuple[int, Transaction]]:
    readers, ranges = fanout.readers, fanout.ranges
    width = max(reader.value_columns for reader in readers)
    position = min(after for after, _ in ranges)
    until = max(until for _, until in ranges)
    while position < until:
        chunks = iter_capture(conn, position, until, lock=lock, value_columns=width)
        dropped = None
        for commit, origin, rows in chunks:
            yield from fanout.add(commit, origin, rows)
            if fanout.held > hold and len(fanout.active) > 1:
                dropped = fanout.drop()
                break
        if dropped is None:
            yield from fanout.finish()
            return
        chunks.close()
        commit, active = dropped
        for index in active:
            # (commit - 1, commit] holds that one log transaction.
            for transaction in read_transactions(conn, readers[index], commit - 1, commit, lock=lock, piece=piece):
                yield index, transaction
                # Not held while the next subscriber's copy is built: one at a time.
                del transaction
        position = commit


def _transaction(commit: int, origin: str, ops: list[Operation]) -> Iterator[Transaction]:
    transaction = make_transaction(commit, origin, ops)
    if transaction is not None:
        yield transaction


def make_transaction(commit: int, origin: str, ops: list[Operation]) -> Transaction | None:
    """The transaction a subscriber receives from the operations selected
    for it out of one log transaction, in seq order (None: nothing)."""
    ops = _fold_reinserts(ops)
    return Transaction._trusted(commit, origin, tuple(ops)) if ops else None


# A DELETE and an INSERT of the same row further apart than this (in the
# subscriber's operations) are not folded, so that a transaction read in
# pieces folds exactly as a whole one (docs/site-database.md, "Folding").
FOLD_WINDOW = 1_000


def _fold_reinserts(ops: list[Operation]) -> list[Operation]:
    """Within one transaction, a row deleted for the subscriber and inserted
    again (deleted and re-created, or moved out of its subset and back)
    becomes an UPDATE of the columns that differ, at the INSERT's place.

    Besides saving traffic, this keeps a change the subscriber made to that
    row meanwhile: a full-row INSERT would overwrite it at the subscriber,
    while the consolidated, which applies the subscriber's change after,
    keeps it.

    Only when nothing else happened to that table in between: a row the
    transaction changed meanwhile may have taken the deleted row's UNIQUE
    value (or given up the one the INSERT takes), and the UPDATE at either
    place would break the constraint where the transaction did not.  And
    only within FOLD_WINDOW operations (see :class:`_Folder`)."""
    if not any(op[1] == OpKind.DELETE for op in ops):
        return ops
    folder = _Folder()
    folder.add(ops)
    return folder.take(0)


class _Folder:
    """:func:`_fold_reinserts` for operations handed over a few at a time:
    an operation is given back (:meth:`take`) once FOLD_WINDOW operations
    follow it, when no later INSERT can fold it any more."""

    __slots__ = ("ops", "base", "deleted", "last_change")

    def __init__(self) -> None:
        self.ops: list[Operation | None] = []
        self.base = 0  # the index in the transaction of ops[0]
        self.deleted: dict[tuple[str, tuple], int] = {}
        self.last_change: dict[str, int] = {}  # table -> index of its latest op

    def add(self, ops: list[Operation]) -> None:
        if not self.deleted and not any(op[1] == OpKind.DELETE for op in ops):
            self.ops.extend(ops)  # nothing to fold: the indexes of later DELETEs are what counts
            return
        deleted, last_change, held = self.deleted, self.last_change, self.ops
        for op in ops:
            index = self.base + len(held)
            previous = last_change.get(op.table)
            last_change[op.table] = index
            if op.kind == OpKind.DELETE:
                deleted[(op.table, op.key)] = index
            elif op.kind == OpKind.INSERT:
                position = deleted.pop((op.table, op.key), None)
                if (position is not None and previous == position and index - position <= FOLD_WINDOW
                        and position >= self.base):
                    old = held[position - self.base].before  # type: ignore[union-attr]
                    new = op.after
                    changed = [column for column in new if not (column in old and _same(old[column], new[column]))]
                    held[position - self.base] = None
                    held.append(_operation(op.table, OpKind.UPDATE, op.key, {c: old.get(c) for c in changed},
                                           {c: new[c] for c in changed}) if changed else None)
                    continue
            held.append(op)

    def take(self, keep: int) -> list[Operation]:
        """The operations but the last ``keep``, folded, in order."""
        cut = len(self.ops) - keep
        if cut <= 0:
            return []
        taken = [op for op in self.ops[:cut] if op is not None]
        del self.ops[:cut]
        self.base += cut
        if self.deleted:
            self.deleted = {key: index for key, index in self.deleted.items() if index >= self.base}
        return taken

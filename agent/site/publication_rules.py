"""Publications, articles and subscriptions as values, and the rules for
making them, whatever database holds them.

Rules of this file:
* A publication is a set of *articles*; an article is one table, optionally
  restricted to some columns (the key columns are always included) and
  optionally with a ``SUBSCRIBE BY`` column.  A table may be an article of
  several publications (agent.site.union), on both backends.
* A subscription value is a SQLite value (None, an integer, a float, text
  or bytes), never NaN; two values are the same when equal and of one type
  (agent.site.values.same_value): subscribing twice with the same value is
  one subscription.
* Pure: no database.  agent.site.sqlite.publications keeps them in a SQLite site,
  agent.site.postgres.catalogue in a PostgreSQL one; both give the same
  values and raise the same errors with the same lines.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Callable, Iterable, Sequence

from .errors import InvalidSetting, PublicationError
from .values import same_value, value_problem

Value = None | int | float | str | bytes


@dataclass(frozen=True, slots=True)
class Article:
    """One table of a publication.  ``columns`` None means every column."""

    table: str
    columns: tuple[str, ...] | None = None
    subscribe_by: str | None = None
    # The parent table whose subscribers get this table's rows, through the
    # foreign key of ``follow_columns`` (None: the one foreign key to it).
    follows: str | None = None
    follow_columns: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if type(self.table) is not str or not self.table:
            raise InvalidSetting(f"article table must be a non-empty string, got {self.table!r}")
        if self.columns is not None:
            if isinstance(self.columns, str) or not all(type(c) is str and c for c in self.columns):
                raise InvalidSetting(f"article columns of {self.table} must be a sequence of column names")
            object.__setattr__(self, "columns", tuple(self.columns))
        if self.subscribe_by is not None and (type(self.subscribe_by) is not str or not self.subscribe_by):
            raise InvalidSetting(f"SUBSCRIBE BY column of {self.table} must be a column name")
        if self.follows is not None and (type(self.follows) is not str or not self.follows
                                         or self.subscribe_by is not None):
            raise InvalidSetting(f"{self.table} follows a parent table or is subscribed by a column, not both")
        if self.follow_columns is not None:
            if self.follows is None or isinstance(self.follow_columns, str) or not all(
                    type(c) is str and c for c in self.follow_columns):
                raise InvalidSetting(f"the foreign key columns of {self.table} name its columns toward the "
                                     "parent it follows")
            object.__setattr__(self, "follow_columns", tuple(self.follow_columns))


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


@dataclass(frozen=True, slots=True)
class SubscriptionChange:
    """What one subscription change did.  ``offset``: the commit offset of
    the log transaction that carries its rows to the remote (None: none was
    needed); ``matching``: how many rows of the publication's SUBSCRIBE BY
    articles hold the value now (None: the publication has no SUBSCRIBE BY
    article, or no value was given); ``changed``: False when the
    subscription was there already."""

    remote: str
    publication: str
    value: Value
    subscribed: bool
    changed: bool = True
    inserts: int = 0
    deletes: int = 0
    offset: int | None = None
    matching: int | None = None
    streamed: bool = False


def as_article(item: Article | str) -> Article:
    return item if isinstance(item, Article) else Article(item)


def check_publication_name(name: object) -> str:
    if type(name) is not str or not name or len(name) > 128 or not name.isprintable():
        shown = name if type(name) is not str or len(name) <= 40 else name[:40] + "..."
        raise InvalidSetting(f"publication name must be 1-128 printable characters, got {shown!r}")
    return name  # type: ignore[return-value]


def check_subscription_value(value: object) -> None:
    """Refuse a value no subscription can hold: not a SQLite value, or NaN."""
    problem = value_problem(value)
    if problem is not None:
        raise InvalidSetting(f"subscription value: {problem}")
    if isinstance(value, float) and math.isnan(value):
        raise InvalidSetting("subscription value cannot be NaN (SQLite stores NaN as NULL, which matches nothing)")


def published_columns(table: str, columns: Sequence[str], key_columns: Sequence[str],
                      requested: Iterable[str] | None, find: Callable[[str], str | None]) -> tuple[str, ...] | None:
    """The columns an article of ``table`` publishes, in table order, its key
    columns always among them; None for all of them.  ``find`` turns a
    requested name into the table's own spelling of it (None: no such
    column), as the database matches names."""
    if requested is None:
        return None
    wanted = set()
    for column in requested:
        found = find(column)
        if found is None:
            raise PublicationError(f"table {table!r} has no column {column!r} to publish")
        wanted.add(found)
    wanted.update(key_columns)
    chosen = tuple(column for column in columns if column in wanted)
    return None if chosen == tuple(columns) else chosen


def subscribe_by_column(table: str, requested: str | None, find: Callable[[str], str | None]) -> str | None:
    """The table's own spelling of the SUBSCRIBE BY column ``requested``."""
    if requested is None:
        return None
    found = find(requested)
    if found is None:
        raise PublicationError(f"SUBSCRIBE BY column {requested!r} is not a stored column of {table!r}")
    return found


def check_table_articles(table: str, publication: str, follows: str | None,
                         held: Iterable[tuple[str, str | None]]) -> None:
    """Raise unless ``table`` may become an article of ``publication``
    (following ``follows``) beside its articles ``held``, as ``(publication,
    parent or None)``: once in a publication, and following a parent in
    one publication at most (its changes carry one route)."""
    held = list(held)
    if any(other == publication for other, _ in held):
        raise PublicationError(f"table {table!r} is already published in {publication!r}; remove it first to "
                               "publish it there another way")
    following = [other for other, parent in held if parent is not None]
    if follows is not None and following:
        raise PublicationError(f"table {table!r} follows its parent in {following[0]!r} already; a table follows "
                               "a parent in one publication (its changes carry one route)")


def check_followed_once(parent: str, publications: Sequence[str]) -> None:
    """Raise when rows follow ``parent`` in other ``publications`` already
    (its moves carry one route)."""
    if publications:
        raise PublicationError(f"rows follow {parent!r} in {publications[0]!r} already; a table is followed in one "
                               "publication (its moves carry one route)")


def find_subscription(held: Iterable[tuple[object, str, Value]], publication: str, value: Value) -> object | None:
    """The id of the subscription among ``held`` (``(id, publication,
    value)``, one remote's) to ``publication`` with the same value, or None."""
    return next((key for key, other, kept in held if other == publication and same_value(kept, value)), None)


def not_subscribed(remote: str, publication: str, value: Value,
                   held: Iterable[tuple[object, str, Value]]) -> InvalidSetting:
    """The error for ending a subscription ``remote`` does not hold."""
    listed = [f"{pub}={kept!r}" if kept is not None else pub for _, pub, kept in held]
    return InvalidSetting(f"{remote!r} does not subscribe to {publication!r}"
                          + ("" if value is None else f" with {value!r}")
                          + f"; its subscriptions: {', '.join(listed) or 'none'}")


def distinct_subscriptions(subscriptions: Iterable[tuple[str, Value]]) -> list[tuple[str, Value]]:
    """Subscriptions without repeats (subscribing twice is harmless: the
    same publication and the same value, agent.site.values.same_value)."""
    kept: list[tuple[str, Value]] = []
    for publication, value in subscriptions:
        if not any(other == publication and same_value(held, value) for other, held in kept):
            kept.append((publication, value))
    return kept


def parents_first(tables: Sequence[str], parents: Callable[[str], Iterable[str]],
                  fold: Callable[[str], str]) -> list[str]:
    """``tables`` ordered so that a table comes after those its foreign keys
    reference among them (``parents(table)``: the tables it references,
    names compared through ``fold``: SQLite's are case-blind, PostgreSQL's
    shown names exact); tables in a cycle keep their order.  A subscription
    change moves rows in this order (INSERTs) and its reverse (DELETEs), on
    both backends."""
    names = {fold(table): table for table in tables}
    above = {name: {fold(parent) for parent in parents(table)} & set(names) - {name}
             for name, table in names.items()}
    ordered: list[str] = []
    while len(ordered) < len(names):
        placed = set(ordered)
        ready = [name for name in names if name not in placed and above[name] <= placed]
        ordered += ready or [name for name in names if name not in placed]
    return [names[name] for name in ordered]

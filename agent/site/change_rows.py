"""A schema change in the capture table, what of it each subscriber
receives, and what ``agent schema apply`` reports (docs/site-database.md,
"Schema changes").

Rules of this file:
* A change is one capture row of kind ``KIND_SCHEMA`` and shape 0 (no
  shape), alone in its log transaction, whose commit offset is the
  change's.  Its first value column holds JSON: the steps on published
  tables (docs/message-format.md, "Schema changes"), the shape each such
  table has after the change (by its name after it: a renamed table by
  its new name), the columns each index a step makes uses, and for a
  ``drop_article`` step the remotes it goes to (``to``: by publication,
  the extracted remotes subscribed to it when the article was removed,
  which no later row of the site knows any more).
* Pure: a subscriber's change is worked out from that row and its plan
  (the article of each table), as its operations are from other rows: the
  steps on the tables it receives, as its article publishes them, the
  passthrough steps that name it, the ``drop_article`` steps whose
  publication lists it, and the shapes of those tables as it holds them
  (agent.site.view).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Iterable, NamedTuple

from codec.changes import DROP_ARTICLE, MAX_CHANGE_BYTES, PASSTHROUGH, RENAME_TABLE, SchemaChange
from codec.message import CHANGE_VERSION, serialize_transaction
from codec.ops import OFFSET_MAX, Transaction

from .capture import Shape
from .errors import SchemaRefused
from .view import View

# The shape id a schema change's capture row names: no shape has it.
SCHEMA_SHAPE = 0

Article = tuple  # (columns or None, subscribe_by, values), as a selection plan holds it


@dataclass(frozen=True, slots=True)
class SchemaChangeResult:
    """What ``agent schema apply`` did.  ``offsets``: the commit offsets of
    the changes written (one, or one per stretch between data statements
    under ``--unchecked``; none: the statements changed no schema);
    ``steps``: every step (``agent.site.sqlite.ddl.differences``), published table
    or not; ``published``: the published tables of which the remotes that
    hold them receive something; ``subscribers``: the extracted remotes that
    hold those tables."""

    offsets: tuple[int, ...]
    steps: tuple[tuple, ...]
    published: tuple[str, ...]
    subscribers: tuple[str, ...]
    statements: int


def row_value(steps: list[tuple], shapes: dict[str, int], indexes: dict[str, list],
              to: dict[str, list[str]] | None = None) -> str:
    """The first value column of a change's capture row: ``steps`` on
    published tables (their wire form), the shape id of each such table
    after the change (by its name as the steps spell it), the columns of
    each index a step makes (by index name; None for an expression), and
    for ``drop_article`` steps the remotes of each publication they go to."""
    value = {"steps": [list(step) for step in steps], "shapes": shapes, "indexes": indexes}
    if to:
        value["to"] = to
    return json.dumps(value, separators=(",", ":"))


def check_fits(site: str, published: list[tuple], shapes: Iterable[tuple[str, Shape]]) -> None:
    """SchemaRefused unless what one subscriber may get of a change fits
    one message: the ``published`` steps on tables, with the ``shapes``
    ``(table, shape)`` of those tables, or the passthrough steps that name
    it."""
    parts: dict[str | None, list[tuple]] = {}
    for step in published:
        parts.setdefault(step[1] if step[0] == PASSTHROUGH else None, []).append(step)
    full = tuple((table, shape.columns, shape.key_columns) for table, shape in shapes)
    for recipient, part in parts.items():
        size = len(serialize_transaction(Transaction(OFFSET_MAX, site, (SchemaChange(
            tuple(part), () if recipient is not None else full),)), CHANGE_VERSION))
        if size > MAX_CHANGE_BYTES:
            raise SchemaRefused(f"the change is {size} bytes, over the {MAX_CHANGE_BYTES}-byte limit of one change; "
                                "make it in several")


def subscriber_change(value: object, article_of: Callable[[str], Article | None],
                      shape_of: Callable[[int], Shape], subscriber: str | None = None) -> SchemaChange | None:
    """What ``subscriber`` receives of the change whose capture row holds
    ``value``: ``article_of(lowered table)`` is its article of a table
    (None: it does not receive the table), ``shape_of(id)`` a shape; a
    passthrough step goes to the subscriber it names alone.  None when
    nothing of it concerns the subscriber."""
    if type(value) is not str:
        return None
    change, finals, to = _parsed(value)
    kept = []
    views: dict[str, View] = {}
    for step, final in zip(change["steps"], finals):
        verb, table = step[0], step[1]
        if verb == PASSTHROUGH:
            if subscriber is not None and table == subscriber:
                kept.append((tuple(step), None))
            continue
        if verb == DROP_ARTICLE:
            if subscriber is not None and subscriber in to.get(step[2], ()):
                kept.append((tuple(step), None))
            continue
        article = article_of(final.lower())
        if article is None:
            continue
        view = views.get(final.lower())
        if view is None:
            view = views[final.lower()] = View(shape_of(change["shapes"][final]), article[0], None, None)
        if _publishes(verb, step, article[0], view, change["indexes"]):
            kept.append((tuple(step), final))
    if not kept:
        return None
    shapes = []
    for _step, final in kept:
        if final is None:
            continue
        view = views[final.lower()]
        if all(shape[0].lower() != final.lower() for shape in shapes):
            key = tuple(view.names[view.positions.index(position)] for position in view.key_positions)
            shapes.append((final, view.names, key))
    return SchemaChange(tuple(step for step, _final in kept), tuple(shapes))


def addressed(value: object) -> frozenset[str] | None:
    """The only subscribers the change whose capture row holds ``value`` can
    concern, when each of its steps names its own: the remote a passthrough
    step names, the remotes ``to`` lists for a ``drop_article`` step's
    publication.  None: a step on a table, which concerns any subscriber
    of it (agent.site.concern)."""
    if type(value) is not str:
        return None
    change, _finals, to = _parsed(value)
    named: set[str] = set()
    for step in change["steps"]:
        if step[0] == PASSTHROUGH:
            named.add(step[1])
        elif step[0] == DROP_ARTICLE:
            named.update(to.get(step[2], ()))
        else:
            return None
    return frozenset(named)


class DropChange(NamedTuple):
    """What removing articles sends (:func:`drop_change`): the
    ``drop_article`` steps, the remotes of each of their publications
    (``to`` of the change's row), and all those remotes, sorted."""

    steps: list[tuple]
    to: dict[str, list[str]]
    reached: tuple[str, ...]


def drop_change(removed: Iterable[tuple[str, str]], to: dict[str, list[str]],
                renames: dict[str, str]) -> DropChange:
    """The change that sends the articles ``removed`` (``(table,
    publication)``) to the remotes ``to`` lists for their publication (none:
    no step): one step for the table's name now and one for each name it
    had before a rename (``renames``, table_renames'), since a remote that
    was not sent a rename before the removal still holds the table under its
    old name (a name in the history is never given again)."""
    steps = []
    for table, publication in removed:
        if to.get(publication):
            steps.append((DROP_ARTICLE, table, publication))
            steps += [(DROP_ARTICLE, old, publication) for old, now in sorted(renames.items())
                      if now.lower() == table.lower() and old != table.lower()]
    sent = {publication: to[publication] for publication in dict.fromkeys(step[2] for step in steps)}
    return DropChange(steps, sent, tuple(sorted({remote for remotes in sent.values() for remote in remotes})))


@lru_cache(maxsize=16)
def _parsed(value: str) -> tuple[dict, list[str], dict[str, frozenset[str]]]:
    """A change's row value read once for every subscriber that reads it
    (the remotes of a ``drop_article`` may be many): the change, each
    step's table name after it (:func:`names_after`), and the remotes each
    publication's ``drop_article`` steps go to.  Read-only."""
    change = json.loads(value)
    return (change, names_after(change["steps"]),
            {publication: frozenset(remotes) for publication, remotes in change.get("to", {}).items()})


def names_after(steps: list) -> list[str]:
    """For each step, the name its table has once the whole change is made
    (a ``rename_table`` step later in the change renames it)."""
    renamed: dict[str, str] = {}
    finals = []
    for step in reversed(steps):
        if step[0] == RENAME_TABLE:
            finals.append(renamed.get(step[2].lower(), step[2]))
            renamed[step[1].lower()] = finals[-1]
        else:
            finals.append(renamed.get(step[1].lower(), step[1]))
    return finals[::-1]


def table_renames(steps: Iterable[list]) -> dict[str, str]:
    """From a site's schema-change steps in order, each name a table had
    before a ``rename_table`` (lowered) and the table's name now: what maps
    rows logged, or sent by a peer, under an old name to the table's
    article (docs/site-database.md, "Renaming a published table")."""
    renames: dict[str, str] = {}
    for step in steps:
        if step[0] != RENAME_TABLE:
            continue
        old, new = step[1].lower(), step[2]
        for earlier, current in renames.items():
            if current.lower() == old:
                renames[earlier] = new
        renames[old] = new
        renames.pop(new.lower(), None)
    return renames


def _publishes(verb: str, step: list, columns: tuple[str, ...] | None, view: View, indexes: dict) -> bool:
    """Whether the subscriber's article publishes what ``step`` changes.
    A column subset publishes the columns it lists only, which a change
    never adds, renames or drops (changes.py refuses one that would)."""
    if verb in ("add_column", "rename_column", "drop_column"):
        return columns is None
    if verb == "create_index":
        used = indexes.get(step[2], [None])
        return all(column in view.names if column is not None else columns is None for column in used)
    return True  # create_table, rename_table; drop_index of an index it may hold (DROP INDEX IF EXISTS)

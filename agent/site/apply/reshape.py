"""Rows a remote captured in an old shape, in the table's shape of now: the
rule both consolidated backends apply (docs/site-database.md, "Schema
changes"; agent/site/sqlite/apply/reshape.py, agent/site/postgres/apply).

Rules of this file:
* Pure: the consolidated's history of schema-change steps in, operations
  out.  A column an operation names that its table no longer has is
  followed through the renames and drops of its table since: renamed, its
  value goes to the new name; dropped, its value is dropped.  A retired
  name is never given again (``agent schema apply`` refuses it), so such a
  name always means the old column.
* A column added since is not named: an INSERT gives it its default, an
  UPDATE leaves it as it is.  An UPDATE left with nothing to write (it
  wrote dropped columns only) changes nothing.
* A table whose article a ``drop_article`` step removed, and that no
  article publishes now, takes nothing from a remote: what it captured
  before it applied the removal is dropped, as a dropped column's values
  are (docs/site-database.md, "Removing an article").
"""

from __future__ import annotations

from collections.abc import Iterable

from codec.changes import DROP_ARTICLE, RENAME_TABLE
from codec.ops import OpKind

_DROPPED = object()


def column_moves(steps: Iterable[list]) -> dict[str, list[list]]:
    """The ``rename_column`` and ``drop_column`` steps of a history, by the
    table's name now (lowered; a table renamed since takes its old moves)."""
    moves: dict[str, list[list]] = {}
    for step in steps:
        if step[0] in ("rename_column", "drop_column"):
            moves.setdefault(step[1].lower(), []).append(step)
        elif step[0] == RENAME_TABLE and step[1].lower() in moves:
            moves[step[2].lower()] = moves.pop(step[1].lower())
    return moves


def removed_tables(steps: Iterable[list]) -> frozenset[str]:
    """The tables (lowered) a ``drop_article`` step of a history names:
    those whose articles the consolidated removed where remotes held them.
    Whether one is published again now is the caller's to ask."""
    return frozenset(step[1].lower() for step in steps if step[0] == DROP_ARTICLE)


def reshaped(moves: list[list], columns: tuple[str, ...], column_set: frozenset[str] | set[str],
             ops: Iterable[tuple]) -> list | None:
    """``ops`` (operations ``(table, kind, key, before, after)`` of one
    table whose columns are ``columns``, naming columns it no longer has)
    in its shape of now, through the table's ``moves``; None when a name is
    not one its history retired."""
    ops = list(ops)
    names: dict[str, object] = {}
    for op in ops:
        for image in (op[3], op[4]):
            for column in image or ():
                if column not in column_set and column not in names:
                    names[column] = _follow(column, moves, columns)
                    if names[column] is None:
                        return None
    result = []
    for table_name, kind, key, before, after in ops:
        before, after = _image(before, names), _image(after, names)
        if kind == OpKind.UPDATE and not after:
            continue  # it wrote only columns dropped since
        result.append((table_name, kind, key, before, after))
    return result


def column_now(column: str, moves: list[list]) -> str | None:
    """The name ``column`` has after the table's ``moves`` (itself when
    none concerns it); None: dropped."""
    current = column
    for step in moves:
        if step[2].lower() == current.lower():
            if step[0] == "drop_column":
                return None
            current = step[3]
    return current


def _follow(column: str, moves: list[list], columns: tuple[str, ...]) -> object:
    """Where ``column`` went: a column of the table now, _DROPPED, or None."""
    current = column_now(column, moves)
    if current is None:
        return _DROPPED
    return next((name for name in columns if name.lower() == current.lower()), None)


def _image(image: dict | None, names: dict[str, object]) -> dict | None:
    if image is None:
        return None
    result = {}
    for column, value in image.items():
        name = names.get(column, column)
        if name is not _DROPPED:
            result[name] = value  # type: ignore[index]
    return result

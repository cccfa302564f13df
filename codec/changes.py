"""Schema changes in the stream: the value a data message of format
version 3 carries for one (docs/message-format.md, "Schema changes").

Rules of this file:
* A :class:`SchemaChange` is a plain value: the steps a subscriber runs,
  in order, and the shape (published columns, key columns) each table
  they name has afterwards, as the subscriber holds it (a renamed table
  by its new name).  It is checked
  where it is made and where it is decoded (:func:`check_change`).
* A transaction that carries a change carries it alone (its ``ops`` is
  ``(change,)``) and travels alone in its message (codec.packing), in
  version 3 whatever version the rest of the stream is written in.
* No SQL is judged here: the steps hold identifiers and SQL text the
  consolidated wrote; the subscriber builds its statements from them
  (agent/site/apply/schema.py) and checks the shapes it ends with.
"""

from __future__ import annotations

from typing import NamedTuple

from .errors import InvalidValue

# The first element of a change on the wire, where a run has its table's
# name: a reader tells the two apart by its type.
CHANGE_TAG = 0
# A change's serialized entry is at most this many bytes, so it always fits
# one message of the smallest maximum size (10,000 bytes) whole.
MAX_CHANGE_BYTES = 8_192

# verb -> names of its arguments after the table (``subscribe_by`` may be nil).
STEPS: dict[str, tuple[str, ...]] = {
    "add_column": ("column", "definition"),
    "rename_column": ("old", "new"),
    "drop_column": ("column",),
    # The table is called ``new`` from this step on: later steps and the
    # shapes name it so (rows logged before it keep the old name).
    "rename_table": ("new",),
    "create_table": ("sql", "publication", "subscribe_by"),
    "create_index": ("index", "sql"),
    "drop_index": ("index",),
    # Its table slot holds the subscriber's own site name: no table, no shape.
    "passthrough": ("sql",),
    # The table stays as it is: no shape.
    "drop_article": ("publication",),
}
PASSTHROUGH = "passthrough"
DROP_ARTICLE = "drop_article"
# Steps that name no table whose shape the change gives.
_SHAPELESS = frozenset({PASSTHROUGH, DROP_ARTICLE})
RENAME_TABLE = "rename_table"
_OPTIONAL = {("create_table", 4)}  # (verb, position in the step) that may be nil


class SchemaChange(NamedTuple):
    """One schema change as a subscriber receives it.

    ``steps``: ``(verb, table, *arguments)`` tuples, in order (see
    :data:`STEPS`; a ``passthrough`` step names the subscriber, not a
    table).  ``shapes``: ``(table, columns, key_columns)`` of every
    table a step names, as the subscriber holds it after the change (a
    table a ``rename_table`` step renames, by its new name), but those a
    ``drop_article`` step alone names (the table stays as it is)."""

    steps: tuple[tuple, ...]
    shapes: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...]

    def wire(self) -> tuple:
        """The change as msgpack writes it: ``[0, steps, shapes]``."""
        return (CHANGE_TAG, self.steps, self.shapes)

    def tables(self) -> tuple[str, ...]:
        return tuple(shape[0] for shape in self.shapes)


def _name(value: object) -> bool:
    return type(value) is str and value != ""


def check_change(value: object, where: str = "schema change") -> SchemaChange:
    """``value`` (a SchemaChange, or the tuples msgpack decoded from its
    wire form without the tag) as a checked SchemaChange; InvalidValue
    naming what is wrong."""
    try:
        steps, shapes = value  # type: ignore[misc]
    except (TypeError, ValueError):
        raise InvalidValue(f"{where}: must hold steps and shapes") from None
    if type(steps) not in (tuple, list) or not steps:
        raise InvalidValue(f"{where}: has no step")
    if type(shapes) not in (tuple, list):
        raise InvalidValue(f"{where}: shapes must be an array")
    checked_steps = []
    named: dict[str, str] = {}
    for step in steps:
        if type(step) not in (tuple, list) or len(step) < 2 or type(step[0]) is not str or step[0] not in STEPS:
            raise InvalidValue(f"{where}: unknown step {step!r:.60}")
        verb, table, *arguments = step
        if not _name(table) or len(arguments) != len(STEPS[verb]):
            raise InvalidValue(f"{where}: malformed {verb} step")
        for position, argument in enumerate(arguments, 2):
            if not _name(argument) and not (argument is None and (verb, position) in _OPTIONAL):
                raise InvalidValue(f"{where}: malformed {verb} step on {table}")
        if verb == RENAME_TABLE:  # the table it names after the change is the new one
            named.pop(table.lower(), None)
            named[arguments[0].lower()] = arguments[0]
        elif verb not in _SHAPELESS:
            named.setdefault(table.lower(), table)
        checked_steps.append(tuple(step))
    checked_shapes = []
    seen = set()
    for shape in shapes:
        if type(shape) not in (tuple, list) or len(shape) != 3:
            raise InvalidValue(f"{where}: malformed shape")
        table, columns, key = shape
        if (not _name(table) or type(columns) not in (tuple, list) or type(key) not in (tuple, list)
                or not columns or not key or not all(map(_name, columns)) or len(set(columns)) != len(columns)
                or not set(key) <= set(columns) or len(set(key)) != len(key)):
            raise InvalidValue(f"{where}: malformed shape of {table!r:.60}")
        if table.lower() in seen:
            raise InvalidValue(f"{where}: two shapes of {table}")
        seen.add(table.lower())
        checked_shapes.append((table, tuple(columns), tuple(key)))
    if seen != set(named):
        raise InvalidValue(f"{where}: its shapes must name exactly the tables its steps name")
    return SchemaChange(tuple(checked_steps), tuple(checked_shapes))

"""Rows a remote captured in an old shape, applied at the consolidated in
the table's shape of now (docs/site-database.md, "Schema changes").

Rules of this file:
* A column an operation names that its table no longer has is followed
  through the consolidated's history of changes (agent.site.apply.reshape,
  the rule both backends apply): renamed, its value goes to the new name;
  dropped, its value is dropped.  A retired name is never given again
  (agent/site/sqlite/changes.py), so such a name always means the old
  column.
* A table an operation names that was renamed since is followed through
  the same history (agent.site.change_rows.table_renames) to its name of
  now, before anything else looks at the operation; a retired table name
  is never given again either.
* A column added since is not named: an INSERT gives it its default, an
  UPDATE leaves it as it is.  An UPDATE left with nothing to write (it
  wrote dropped columns only) changes nothing.
* An operation on a table whose article was removed where remotes held
  it, and that no article publishes now, is dropped
  (agent.site.apply.reshape.removed_tables).
* Only the consolidated reshapes: a remote applies its consolidated's log
  in order, every row in the shape of its time.
"""

from __future__ import annotations

import sqlite3
from typing import Callable

from codec.ops import Run

from ...apply.reshape import column_moves, removed_tables, reshaped
from ...change_rows import table_renames
from ..changes import history
from .statements import SqliteTable


class Reshape:
    """The consolidated's history of renamed tables, and of renamed and
    dropped columns by table (its name now)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._seen: object = -1
        self._moves: dict[str, list[list]] = {}
        self.renames: dict[str, str] = {}
        self.removed: frozenset[str] = frozenset()

    def refresh(self) -> None:
        """Read the history again when a change was made since (once per batch)."""
        top = self._conn.execute("SELECT max(commit_offset) FROM fieldsync_schema_change WHERE peer IS NULL"
                                 ).fetchone()[0]
        if top != self._seen:
            self._seen = top
            steps = history(self._conn)
            self._moves = column_moves(steps)
            self.renames = table_renames(steps)
            self.removed = removed_tables(steps)

    def tables(self, ops: tuple, published: Callable[[str], bool]) -> tuple:
        """``ops`` (operations and runs) with each table renamed since under
        its name of now (the others as they are), but those of a table
        whose article was removed and that ``published(lowered name)`` says
        no article publishes now: dropped."""
        renames, removed = self.renames, self.removed
        renamed = []
        for op in ops:
            table = op.table if type(op) is Run else op[0] if isinstance(op, tuple) and op else None
            name = renames.get(table.lower()) if type(table) is str else None  # a malformed one stays so
            now = (name or table).lower() if type(table) is str else ""  # "" names no table
            if now in removed and not published(now):
                continue
            if name is None:
                renamed.append(op)
            elif type(op) is Run:
                renamed.append(op._replace(table=name))
            else:
                renamed.append((name, *op[1:]))
        return tuple(renamed)

    def operations(self, table: SqliteTable, ops: list) -> list | None:
        """``ops`` (of ``table``, naming columns it no longer has) in its
        shape of now; None when a name is not one its history retired."""
        moves = self._moves.get(table.name.lower())
        if not moves:
            return None
        return reshaped(moves, table.columns, table.column_set, ops)

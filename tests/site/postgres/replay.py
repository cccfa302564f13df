"""Replaying capture rows onto a copy, for the PostgreSQL capture tests.

The rows go through the SQLite site's own pure reader (agent.site.view),
whole rows and every column, as a subscriber without filters sees them;
the copy is a dict from key to row, and the replay is strict: an INSERT of
a key it holds, an UPDATE or DELETE of a row it lacks, and an UPDATE whose
before-image differs from the row are counted as problems (an apply would
record them), and the operation is applied as far as it can be.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from agent.site.capture import KIND_UPDATE
from agent.site.postgres.capture import PgShape
from agent.site.view import View
from codec.ops import OpKind, Operation


def operations(rows: Iterable[tuple], shapes: Mapping[int, PgShape]) -> list[Operation]:
    """The operations capture rows ``(seq, shape, kind, flags, v...)`` become."""
    views: dict[int, View] = {}
    made: list[Operation] = []
    for row in rows:
        shape_id, kind = row[1], row[2]
        view = views.get(shape_id)
        if view is None:
            view = views[shape_id] = View(shapes[shape_id].shape, None, None, None)
        if kind == KIND_UPDATE:
            op = view.update(row)
            if op is not None:
                made.append(op)
        else:
            made.extend(view.rows(kind, [row]))
    return made


@dataclass
class Copy:
    """A copy of tables, by table name then key (``key_columns`` per table
    where the key is not ``id``)."""

    key_columns: dict[str, tuple[str, ...]] = field(default_factory=dict)
    tables: dict[str, dict[tuple, dict]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def apply(self, ops: Iterable[Operation]) -> None:
        for table, kind, key, before, after in ops:
            rows = self.tables.setdefault(table, {})
            if kind == OpKind.INSERT:
                if key in rows:
                    self.problems.append(f"INSERT of existing {table} {key}")
                rows[key] = dict(after)
            elif kind == OpKind.DELETE:
                if rows.pop(key, None) is None:
                    self.problems.append(f"DELETE of missing {table} {key}")
            else:
                row = rows.get(key)
                if row is None:
                    self.problems.append(f"UPDATE of missing {table} {key}")
                    continue
                if any(row.get(column) != value for column, value in before.items()):
                    self.problems.append(f"UPDATE of {table} {key} whose row differs from its before-image")
                row.update(after)
                new_key = tuple(row[column] for column in self.key_columns.get(table, ("id",)))
                if new_key != key:
                    del rows[key]
                    rows[new_key] = row

    def rows(self, table: str) -> list[tuple]:
        """The table's rows as tuples in column order, sorted."""
        return sorted(tuple(row.values()) for row in self.tables.get(table, {}).values())

"""Capture rows as both backends' logs hold them: their kinds, their flags
and their shapes.

Rules of this file:
* A capture row is ``(seq, shape, kind, flags, v0, v1, ...)``: a whole row
  image for an INSERT (the new row) or a DELETE (the old row), the old row
  then the new row for an UPDATE.  How a backend writes them is its own
  (agent/site/sqlite/capture.py, agent/site/postgres/capture.py); every
  reader (agent.site.view, agent.site.selection) sees them so.
* A *shape* fixes the column order of a table's capture rows.  Capture rows
  name their shape, so rows captured before a schema change stay readable
  after it.  Shapes are never modified or deleted.
* Plain values only: no SQL, no connection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator

KIND_INSERT = 1
KIND_UPDATE = 2
KIND_DELETE = 3
# A schema change (agent/site/change_rows.py): a capture row of shape 0
# (no shape) alone in its log transaction; no trigger writes one.
KIND_SCHEMA = 4

# Capture-row flag, set only at the consolidated (triggers leave flags NULL):
# a row written by the apply path itself, not by a trigger, once a batch from
# a remote is applied.  It goes only to the origin of its log transaction (the
# remote): the state of a row the remote changed, as it is after the batch,
# when a conflict or an operation still on its way to the remote could leave
# the remote with another state (an UPDATE of the columns listed in
# fieldsync_returned, an INSERT of the whole row, or a DELETE), or a DELETE of
# a row the remote changed that now lies outside its subset.  Every such row
# has a fieldsync_returned row, so they can be found without a scan.
FLAG_RETURN_TO_ORIGIN = 1
# Capture-row flag, set only at a remote, on the row captured when it applies
# a DELETE the consolidated wrote without the remote's own pending change to
# that row (see sqlite/apply/pending.py).  The row's second half, unused by a
# DELETE, holds the same row with the consolidated's values in the columns
# where they lacked the remote's own: an INSERT of the same key that follows
# gets the remote's values there, since the consolidated applies them after it.
# Only the remote's apply path reads it (rows of the consolidated's origin
# never leave a remote).
FLAG_CONCURRENT_DELETE = 2
# Capture-row flag, set only at a remote, on the UPDATE captured when it
# applies the consolidated's change of the key of a row with its own pending
# changes: those changes stay pending under the new key (sqlite/apply/pending.py).
# Like FLAG_CONCURRENT_DELETE, only the remote's apply path reads it.
FLAG_PENDING_MOVE = 4
# Capture-row flag, set only at a remote, on the DELETE its apply path
# records of a row that went along with its parent (the TEMP triggers of
# sqlite/route.py, apply_triggers, write it): the row as it went.  A row of
# the remote's own pending changes comes back from it when the consolidated
# sends the parent again (sqlite/apply/followers.py), and an INSERT of the
# consolidated that follows keeps the remote's own values from it
# (sqlite/apply/pending.py).  Like FLAG_CONCURRENT_DELETE, only the remote's
# apply path reads it.
FLAG_WITH_PARENT = 8

# What a selection plan names as the SUBSCRIBE BY column of an article whose
# rows follow their parent (docs/site-database.md, "Rows that follow their
# parent"): no column can be called this (names hold no NUL).  The capture
# rows of such an article hold the old route after the values of the widest
# UPDATE (value column ``2 * width``) and the new route after it.
ROUTE = "\x00route"


@dataclass(frozen=True, slots=True)
class Shape:
    """The column layout of a table's capture rows."""

    id: int
    table: str
    columns: tuple[str, ...]
    key_columns: tuple[str, ...]

    @property
    def key_positions(self) -> tuple[int, ...]:
        return tuple(self.columns.index(column) for column in self.key_columns)


class ShapeTable:
    """Shapes known up front (a batch export carries them), with the same
    ``get`` as a site's shape cache."""

    def __init__(self, shapes: Iterable[Shape]) -> None:
        self._shapes = {shape.id: shape for shape in shapes}

    def get(self, shape_id: int) -> Shape:
        try:
            return self._shapes[shape_id]
        except KeyError:
            raise LookupError(f"capture shape {shape_id} is missing") from None

    def __iter__(self) -> Iterator[Shape]:
        return iter(self._shapes.values())

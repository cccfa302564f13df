"""Which foreign key an article that follows its parent follows: one rule
for both backends (docs/site-database.md, "Rows that follow their parent").

Rules of this file:
* Pure: the backends read a table's foreign keys to the parent
  (agent/site/sqlite/route.py, agent/site/postgres/route.py) and this file
  chooses among them, or refuses with one line naming the table and the
  parent.
"""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

from .errors import PublicationError

Key = TypeVar("Key")


def chosen_key(table: str, parent: str, keys: Sequence[tuple[tuple[str, ...], Key]], named: tuple[str, ...] | None,
               fold: Callable[[str], str]) -> Key:
    """The one of ``keys`` (each the child's columns, and what the backend
    keeps of the key) that ``table`` follows ``parent`` through: the key
    whose columns are ``named`` (compared through ``fold``), or the only
    one; PublicationError when there is none, or more than one and none
    named."""
    candidates = list(keys)
    if named is not None:
        wanted = tuple(map(fold, named))
        candidates = [key for key in candidates if tuple(map(fold, key[0])) == wanted]
        if not candidates:
            raise PublicationError(f"{table!r} has no foreign key ({', '.join(named)}) to {parent!r}")
    if not candidates:
        raise PublicationError(f"{table!r} has no foreign key to {parent!r}; declare one (FOREIGN KEY ... "
                               f"REFERENCES {parent}) to publish it as {table}@->{parent}")
    if len(candidates) > 1:
        raise PublicationError(f"{table!r} has {len(candidates)} foreign keys to {parent!r}; name the one to "
                               f"follow: {table}@COLUMN->{parent}, or {table}@(COL1,COL2)->{parent} for a "
                               "composite key")
    return candidates[0][1]

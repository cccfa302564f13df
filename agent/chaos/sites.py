"""Where a seed's sites are, and reading and writing them whatever their backend.

Rules of this file:
* Every site is a SQLite file ``<root>/<site>.db``, except the
  consolidated ``hq`` when the seed runs with ``--consolidated URI``: then
  it is that PostgreSQL database (pgworld.py).
* Reads give rows as they travel (a PostgreSQL value through the types
  table), so the checks compare a PostgreSQL consolidated's rows with its
  SQLite remotes' as they are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from . import pgworld, world

CONSOLIDATED = "hq"


class Sites:
    """A seed's sites: ``root`` holds their files (and the agents' folders);
    ``consolidated`` is the URI of a PostgreSQL consolidated, or None."""

    def __init__(self, root: Path, consolidated: str | None = None) -> None:
        self.root = root
        self.consolidated = consolidated

    def in_postgres(self, site: str) -> bool:
        return site == CONSOLIDATED and self.consolidated is not None

    def location(self, site: str) -> str | Path:
        """What ``site`` is opened with: its file, or the consolidated's URI."""
        if self.in_postgres(site):
            assert self.consolidated is not None
            return self.consolidated
        return self.root / f"{site}.db"

    def rows(self, site: str, table: str, columns: tuple[str, ...] | None = None, where: str | None = None,
             values: tuple = ()) -> list[tuple]:
        """``table``'s rows at ``site`` as they travel, in a stable order."""
        if self.in_postgres(site):
            assert self.consolidated is not None
            return pgworld.pg_rows(self.consolidated, table, columns, where, values)
        return world.rows(self.root / f"{site}.db", table, columns, where, values)

    def write(self, site: str, statements: Iterable[tuple[str, tuple]]) -> None:
        """One application transaction at ``site`` (``?`` placeholders)."""
        if self.in_postgres(site):
            assert self.consolidated is not None
            pgworld.pg_write(self.consolidated, statements)
        else:
            world.write(self.root / f"{site}.db", statements)

    def begin(self, site: str, statements: Iterable[tuple[str, tuple]]) -> pgworld.OpenTransaction:
        """An application transaction at ``site`` (a PostgreSQL one), left open."""
        assert self.in_postgres(site) and self.consolidated is not None
        return pgworld.OpenTransaction(self.consolidated, statements)

    def columns(self, site: str, table: str) -> tuple[str, ...]:
        """``table``'s columns at ``site``, in order (none: no such table)."""
        if self.in_postgres(site):
            assert self.consolidated is not None
            return pgworld.pg_columns(self.consolidated, table)
        return world.columns(self.root / f"{site}.db", table)

    def tables(self, site: str, prefix: str) -> list[str]:
        """``site``'s tables whose name starts with ``prefix``."""
        if self.in_postgres(site):
            assert self.consolidated is not None
            return pgworld.pg_tables(self.consolidated, prefix)
        return world.tables(self.root / f"{site}.db", prefix)

    def arrivals(self, site: str) -> list[str]:
        """``site``'s arrival journal, in arrival order."""
        if self.in_postgres(site):
            assert self.consolidated is not None
            return pgworld.pg_arrivals(self.consolidated)
        return world.arrivals(self.root / f"{site}.db")

    def remote_rows(self, sites: list[str]) -> dict[str, tuple[dict, int]]:
        """Each site's remote-user rows by peer, and the end of its log."""
        return world.remote_rows({site: self.location(site) for site in sites})

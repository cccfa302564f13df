"""Transport options stored with a PostgreSQL site (``fieldsync.transport_option``).

Rules of this file:
* The rules are both backends' (agent/site/settings.py, whose
  :func:`checked_changes` refuses names that are no option, secrets and
  values that are not one line of text): scope ``""`` holds the site's own
  options, scope ``NAME`` those of the transport to peer ``NAME``.
* Functions here run inside the caller's transaction.
"""

from __future__ import annotations

from collections.abc import Mapping

import psycopg

from ..settings import SITE_SCOPE, checked_changes

__all__ = ["SITE_SCOPE", "forget_scope", "read_all_options", "read_options", "write_options"]


def read_options(conn: psycopg.Connection, scope: str = SITE_SCOPE) -> dict[str, str]:
    """The options stored for ``scope``, by name."""
    return dict(conn.execute("SELECT name, value FROM fieldsync.transport_option WHERE scope = %s"
                             " ORDER BY name COLLATE \"C\"", (scope,)).fetchall())


def read_all_options(conn: psycopg.Connection) -> dict[str, dict[str, str]]:
    """Every scope's options: ``{"": site options, "north": options to peer north, ...}``."""
    scopes: dict[str, dict[str, str]] = {}
    for scope, name, value in conn.execute("SELECT scope, name, value FROM fieldsync.transport_option"
                                           " ORDER BY scope COLLATE \"C\", name COLLATE \"C\""):
        scopes.setdefault(scope, {})[name] = value
    return scopes


def write_options(conn: psycopg.Connection, scope: str, changes: Mapping[str, str | None]) -> None:
    """Store ``changes`` for ``scope`` (settings.checked_changes); a value of None removes the option."""
    removed, stored = checked_changes(changes)
    with conn.cursor() as cursor:
        cursor.executemany("DELETE FROM fieldsync.transport_option WHERE scope = %s AND name = %s",
                           [(scope, name) for name in removed])
        cursor.executemany("INSERT INTO fieldsync.transport_option (scope, name, value) VALUES (%s, %s, %s)"
                           " ON CONFLICT (scope, name) DO UPDATE SET value = excluded.value",
                           [(scope, name, value) for name, value in stored])


def forget_scope(conn: psycopg.Connection, scope: str) -> None:
    conn.execute("DELETE FROM fieldsync.transport_option WHERE scope = %s", (scope,))

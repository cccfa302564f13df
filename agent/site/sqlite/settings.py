"""Transport options stored with a SQLite site (layout 6,
docs/site-database.md), in ``fieldsync_transport_option``.

Rules of this file:
* Every change is checked by agent.site.settings (no secret, one line of
  text) before it is written.
* Scope ``""`` holds the site's own transport options; scope ``NAME`` the
  options of the transport to peer ``NAME``, where they differ.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping

from ..settings import SITE_SCOPE, checked_changes
from .remotes import get_remote, update_remote_locked

def read_options(conn: sqlite3.Connection, scope: str = SITE_SCOPE) -> dict[str, str]:
    """The options stored for ``scope``, by name."""
    return dict(conn.execute("SELECT name, value FROM fieldsync_transport_option WHERE scope = ? ORDER BY name",
                             (scope,)))


def read_all_options(conn: sqlite3.Connection) -> dict[str, dict[str, str]]:
    """Every scope's options: ``{"": site options, "north": options to peer north, ...}``."""
    scopes: dict[str, dict[str, str]] = {}
    for scope, name, value in conn.execute("SELECT scope, name, value FROM fieldsync_transport_option "
                                           "ORDER BY scope, name"):
        scopes.setdefault(scope, {})[name] = value
    return scopes


def write_options(conn: sqlite3.Connection, scope: str, changes: Mapping[str, str | None]) -> None:
    """Store ``changes`` for ``scope`` (in the caller's write transaction); a value of None removes the option."""
    removed, stored = checked_changes(changes)
    conn.executemany("DELETE FROM fieldsync_transport_option WHERE scope = ? AND name = ?",
                     [(scope, name) for name in removed])
    conn.executemany("INSERT INTO fieldsync_transport_option (scope, name, value) VALUES (?, ?, ?) "
                     "ON CONFLICT (scope, name) DO UPDATE SET value = excluded.value",
                     [(scope, name, value) for name, value in stored])


def set_transport_locked(conn: sqlite3.Connection, *, address: str | None, reply_address: str | None,
                         transport: str | None, options: Mapping[str, str | None] | None, peer: str | None,
                         inbox: str | None) -> None:
    """SiteDatabase.set_transport inside the caller's write transaction."""
    if peer is None:
        for column, value in (("address", address), ("reply_address", reply_address), ("transport", transport)):
            if value is not None:
                conn.execute(f"UPDATE fieldsync_site SET {column} = ? WHERE id = 1", (value or None,))
    else:
        get_remote(conn, peer)
        if inbox is not None:
            update_remote_locked(conn, peer, {"inbox": inbox or None})
    write_options(conn, SITE_SCOPE if peer is None else peer, options or {})


def forget_scope(conn: sqlite3.Connection, scope: str) -> None:
    conn.execute("DELETE FROM fieldsync_transport_option WHERE scope = ?", (scope,))

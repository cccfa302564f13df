"""Transport options stored with the site (layout 6, docs/site-database.md).

Rules of this file:
* A value is text, exactly as ``-O NAME=VALUE`` gives it; the transport
  reads it by its constructor's annotation (transports/options.py), so a
  stored option and one given for one run mean the same.
* No secret is ever stored: options that name where a password comes from
  (``password_file``, ``password_env`` ...) are kept, a name that would hold
  a password or passphrase itself is refused.
* Scope ``""`` holds the site's own transport options; scope ``NAME`` the
  options of the transport to peer ``NAME``, where they differ.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Mapping

from .errors import InvalidSetting
from .remotes import get_remote, update_remote_locked

SITE_SCOPE = ""
_NAME = re.compile(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)?")
_SECRET_WORDS = ("password", "passphrase", "secret", "token")


def check_option(name: object, value: object) -> None:
    """Refuse a name that is no option name, a secret, or a value that is not one line of text."""
    if type(name) is not str or not _NAME.fullmatch(name):
        raise InvalidSetting(f"transport option name {name!r} is not a name like smtp_host or sftp.key_file")
    option = name.rpartition(".")[2]
    if any(word in option for word in _SECRET_WORDS) and not option.endswith(("_file", "_env")):
        raise InvalidSetting(f"transport option {name} would hold a secret: store where it comes from instead "
                             f"({option}_file=PATH of a 0600 file, or {option}_env=VARIABLE)")
    if type(value) is not str or any(ord(char) < 32 or ord(char) == 127 for char in value):
        raise InvalidSetting(f"transport option {name} must be one line of text, got {value!r}")


def checked_changes(changes: Mapping[str, str | None]) -> tuple[list[str], list[tuple[str, str]]]:
    """``changes`` to a scope's options, checked: the names to remove (a
    value of None) and the ``(name, value)`` pairs to store."""
    removed = [name for name, value in changes.items() if value is None]
    stored = [(name, value) for name, value in changes.items() if value is not None]
    for name, value in stored:
        check_option(name, value)
    return removed, stored


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

"""Transport options stored with the site (layout 6, docs/site-database.md):
their rules, whatever database holds them.

Rules of this file:
* A value is text, exactly as ``-O NAME=VALUE`` gives it; the transport
  reads it by its constructor's annotation (transports/options.py), so a
  stored option and one given for one run mean the same.
* No secret is ever stored: options that name where a password comes from
  (``password_file``, ``password_env`` ...) are kept, a name that would hold
  a password or passphrase itself is refused.
* Scope ``""`` holds the site's own transport options; scope ``NAME`` the
  options of the transport to peer ``NAME``, where they differ.
* Pure: no database.  agent.site.sqlite.settings keeps them in a SQLite
  site, agent.site.postgres.settings in a PostgreSQL one; both check with
  :func:`checked_changes`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from .errors import InvalidSetting

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

"""Who a PostgreSQL site is, and where its agent keeps its own files.

Rules of this file:
* A PostgreSQL database is only ever a consolidated site: a remote site is
  a SQLite file (its field copy).  ``init`` refuses the role ``remote``
  with one line.
* The identity is one row of ``fieldsync.identity``: name, role,
  incarnation (16 random bytes, new at init), the agent's home folder,
  address, reply address, transport, public key, creation time.  The
  values and their rules are agent.site.identity's, as on SQLite.
* **The home folder.**  A SQLite site's agent keeps its key, queues and
  state beside the database file (``<db>.agent``); a PostgreSQL database
  has no such place, so ``init`` is given one: an absolute path on the
  host the agent runs on, stored in the identity row and read back by
  ``open``.  A relative path is refused (the agent may start from another
  folder), so is one that exists and is not a writable folder, or one that
  cannot be made.  A missing folder is made, with mode 0700 (its parents
  with the default mode), before the identity row is written; it is
  removed again, if still empty, when ``init`` fails after making it.
* Two ``init`` on one database at once: a transaction-level advisory lock
  makes the second wait, then refuse (AlreadyASite).
"""

from __future__ import annotations

import hashlib
import os
from datetime import datetime
from pathlib import Path

import psycopg
from psycopg import sql

from ..clock import in_utc, utc_now
from ..errors import AlreadyASite, InvalidSetting, NotASite, WrongRole
from ..identity import Role, SiteIdentity, check_name, check_role, check_texts, new_incarnation
from .connect import translate
from .schema import check_layout, install_schema, schema_installed
from .uri import PgTarget

HOME_MODE = 0o700
_INIT_LOCK = int.from_bytes(hashlib.sha256(b"fieldsync: one site init at a time").digest()[:8], "big", signed=True)
_IDENTITY = ("SELECT name, role, incarnation, address, transport, public_key, created_at, reply_address, home"
             " FROM fieldsync.identity WHERE id = 1")


def check_home(home: object) -> Path:
    """The agent's home folder as given to ``init``: an absolute path."""
    if not isinstance(home, (str, os.PathLike)) or not os.fspath(home):
        raise InvalidSetting(f"the agent's home folder must be a path, got {home!r}")
    path = Path(home)
    if not path.is_absolute():
        raise InvalidSetting(f"the agent's home folder {os.fspath(home)!r} is a relative path; give an absolute "
                             "one (the agent may start from any folder)")
    return path


def make_home(path: Path) -> bool:
    """Make ``path`` (mode 0700) when missing; refuse one that is not a
    writable folder.  Returns whether it was made."""
    if path.exists() or path.is_symlink():
        if not path.is_dir():
            raise InvalidSetting(f"the agent's home folder {path} exists and is not a folder; give another path")
        if not os.access(path, os.W_OK | os.X_OK):
            raise InvalidSetting(f"the agent's home folder {path} is not writable by this user; give one it may "
                                 "write, or change its owner")
        return False
    try:
        os.makedirs(path, mode=HOME_MODE)
        os.chmod(path, HOME_MODE)  # whatever the umask
    except OSError as error:
        raise InvalidSetting(f"cannot make the agent's home folder {path}: {error.strerror or error}; give a path "
                             "this user may create") from None
    return True


def _has_identity(conn: psycopg.Connection) -> bool:
    """Whether the database is a site already (an identity row)."""
    if not conn.execute("SELECT to_regclass('fieldsync.identity') IS NOT NULL").fetchone()[0]:
        return False
    return conn.execute("SELECT EXISTS (SELECT 1 FROM fieldsync.identity)").fetchone()[0]


def init_identity(conn: psycopg.Connection, target: PgTarget, *, name: str, role: Role | str, home: object,
                  address: str | None, transport: str | None, public_key: str | None,
                  now: datetime | None) -> None:
    """Make the database at ``target`` a consolidated site: the fieldsync
    schema (or its upgrade), the identity row, the home folder."""
    check_name(name, "site name")
    role = check_role(role)
    if role is not Role.CONSOLIDATED:
        raise WrongRole(f"{target.where} cannot be a {role.value} site: a PostgreSQL database is only ever the "
                        "consolidated; a remote site is a SQLite file")
    check_texts("site", address=address, transport=transport, public_key=public_key)
    created = in_utc(now or utc_now())
    path = check_home(home)
    made = False
    try:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_INIT_LOCK,))
            if _has_identity(conn):
                existing = conn.execute("SELECT name FROM fieldsync.identity WHERE id = 1").fetchone()
                raise AlreadyASite(f"{target.where} is already the fieldsync site {existing[0]!r}; open it instead "
                                   "of initialising it again")
            made = make_home(path)
            if schema_installed(conn):
                check_layout(conn, target)
            else:
                install_schema(conn, target)
            conn.execute("INSERT INTO fieldsync.identity (id, name, role, incarnation, home, address, transport,"
                         " public_key, created_at) VALUES (1, %s, %s, %s, %s, %s, %s, %s, %s)",
                         (name, role.value, new_incarnation(), os.fspath(path), address, transport, public_key,
                          created))
    except BaseException as error:
        if made:
            try:
                path.rmdir()  # only when still empty
            except OSError:
                pass
        if isinstance(error, psycopg.Error):
            raise translate(error, target, f"initialising site {name}") from None
        raise


def read_identity(conn: psycopg.Connection, target: PgTarget) -> tuple[SiteIdentity, Path]:
    """The site's identity and its agent's home folder (inside the caller's
    transaction, or autocommit)."""
    row = conn.execute(_IDENTITY).fetchone()
    if row is None:
        raise NotASite(f"{target.where} has the fieldsync schema but no site identity; initialise it with init")
    name, role, incarnation, address, transport, public_key, created_at, reply_address, home = row
    return (SiteIdentity(name, Role(role), bytes(incarnation), address, transport, public_key, in_utc(created_at),
                         reply_address), Path(home))


def set_site_transport(conn: psycopg.Connection, *, address: str | None, reply_address: str | None,
                       transport: str | None) -> None:
    """Change the site's own inbox, reply address and transport (None: keep;
    ``""``: clear), inside the caller's transaction."""
    for column, value in (("address", address), ("reply_address", reply_address), ("transport", transport)):
        if value is not None:
            conn.execute(sql.SQL("UPDATE fieldsync.identity SET {} = %s WHERE id = 1").format(sql.Identifier(column)),
                         (value or None,))

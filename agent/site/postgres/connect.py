"""Connections to a PostgreSQL site, and PostgreSQL's errors as the site's.

Rules of this file:
* One way to connect (:func:`connect`): libpq is given the checked URI and
  finds the password itself, in ~/.pgpass, PGPASSFILE or a service file;
  nothing here reads, holds or prints a password.
* Connections run in autocommit mode; every transaction is opened
  explicitly (``with conn.transaction():``), so it is always clear which
  statements commit together.  One connection per thread.
* psycopg's errors leave this package as the site's (:func:`translate`,
  :func:`connect_error`): one line naming the role, the database and the
  server, and what to do.
"""

from __future__ import annotations

import re

import psycopg
from psycopg import errors as pg_errors

from .errors import (
    AuthenticationFailed,
    MissingPrivilege,
    NotReachable,
    PostgresDatabaseError,
    PostgresSiteError,
    UnsupportedDatabase,
)
from .uri import PgTarget, parse_uri

APPLICATION_NAME = "fieldsync"
CONNECT_TIMEOUT = 10  # seconds, unless the URI says otherwise
# The agent's statements are many short ones whose estimated cost can pass
# jit_above_cost all the same (a page of the log read, log.py: estimated at
# 180,000, run in 2 ms, compiled in 9): JIT is off for its sessions.
SESSION_OPTIONS = "-c jit=off"
MIN_SERVER_VERSION = 130000  # pg_current_snapshot() and xid8; tested with 15
PRIVILEGES_HELP = "docs/postgres.md, \"Privileges\""

# libpq's connection failures, by the words of their first line.
_UNREACHABLE = ("connection refused", "timeout expired", "could not translate host name", "failed to resolve host",
                "no route to host", "network is unreachable", "no such file or directory", "could not connect",
                "server closed the connection", "the database system is")
_NO_PASSWORD = ("no password supplied",)
_BAD_PASSWORD = ("password authentication failed", "authentication failed", "no pg_hba.conf entry")
_PREFIX = re.compile(r'^(?:connection failed: )?(?:connection to server (?:at|on) .*? failed: )?(?:FATAL:\s+)?',
                     re.IGNORECASE)


def _reason(error: psycopg.Error) -> str:
    """libpq's or the server's reason, on one line, without its preamble."""
    text = str(error).strip()
    first = text.splitlines()[0] if text else type(error).__name__
    return _PREFIX.sub("", first).strip() or first


def _role(target: PgTarget) -> str:
    user = target.get("user")
    return f"role {user}" if user else "the default role"


def connect_error(error: psycopg.Error, target: PgTarget) -> PostgresSiteError:
    """The one-line error for a connection that could not be made."""
    reason = _reason(error)
    lowered = reason.lower()
    if "does not exist" in lowered and lowered.startswith("role"):
        return AuthenticationFailed(f"cannot open {target.where}: {reason}; create the role (createuser) or "
                                    "correct the URI's user")
    if "does not exist" in lowered and "database" in lowered:
        return NotReachable(f"cannot open {target.where}: {reason}; create it (createdb) or correct the URI")
    if "permission denied" in lowered:
        return MissingPrivilege(f"{_role(target)} may not connect to {target.where}: {reason}; the database owner "
                                f"grants it with GRANT CONNECT ON DATABASE ({PRIVILEGES_HELP})")
    if any(words in lowered for words in _NO_PASSWORD):
        return AuthenticationFailed(f"no password found for {_role(target)} at {target.where}: add a line for it "
                                    "to ~/.pgpass, or to the file PGPASSFILE or the URI's passfile= names, "
                                    "or to its service file")
    if any(words in lowered for words in _BAD_PASSWORD):
        return AuthenticationFailed(f"{target.where} refused {_role(target)}: {reason}; check the role's line in "
                                    "the password file (~/.pgpass, PGPASSFILE or the service file)")
    if any(words in lowered for words in _UNREACHABLE):
        return NotReachable(f"cannot reach {target.where}: {reason}; check that PostgreSQL runs there and "
                            "accepts TCP connections from this host")
    return NotReachable(f"cannot connect to {target.where}: {reason}")


def translate(error: psycopg.Error, target: PgTarget, doing: str) -> PostgresSiteError:
    """The site's error for ``error``, met while ``doing`` (``"installing
    the fieldsync schema"``)."""
    if isinstance(error, PostgresSiteError):
        return error
    reason = _reason(error)
    if isinstance(error, pg_errors.InsufficientPrivilege):
        return MissingPrivilege(f"{_role(target)} lacks a privilege at {target.where} while {doing}: {reason}; "
                                f"see {PRIVILEGES_HELP} for what the agent's role needs")
    if isinstance(error, psycopg.OperationalError) and error.sqlstate is None:
        return NotReachable(f"lost the connection to {target.where} while {doing}: {reason}")
    translated = PostgresDatabaseError(f"PostgreSQL error at {target.where} while {doing}: {reason}")
    translated.__cause__ = error
    return translated


def connect(target: PgTarget | str, *, autocommit: bool = True) -> psycopg.Connection:
    """A new connection to ``target`` (a checked URI, or one to check), in
    autocommit mode; raise the site's one-line errors when it cannot be made
    or the server cannot hold a site."""
    if isinstance(target, str):
        target = parse_uri(target)
    extra: dict[str, object] = {}
    if target.get("connect_timeout") is None:
        extra["connect_timeout"] = CONNECT_TIMEOUT
    if target.get("application_name") is None:
        extra["application_name"] = APPLICATION_NAME
    extra["options"] = " ".join(filter(None, (SESSION_OPTIONS, target.get("options"))))  # the URI's own win
    try:
        conn = psycopg.connect(target.uri, autocommit=autocommit, **extra)
    except psycopg.Error as error:
        raise connect_error(error, target) from None
    try:
        check_server(conn, target)
    except BaseException:
        conn.close()
        raise
    return conn


def check_server(conn: psycopg.Connection, target: PgTarget) -> None:
    """Refuse a server or database that cannot hold a site."""
    version = conn.info.server_version
    if version < MIN_SERVER_VERSION:
        raise UnsupportedDatabase(f"{target.where} runs PostgreSQL {version // 10000}; fieldsync needs 13 or "
                                  "later (tested with 15)")
    encoding = conn.info.parameter_status("server_encoding")
    if encoding != "UTF8":
        raise UnsupportedDatabase(f"{target.where} has the encoding {encoding}; fieldsync needs a UTF8 database "
                                  "(createdb --encoding=UTF8), as messages carry text as UTF-8")

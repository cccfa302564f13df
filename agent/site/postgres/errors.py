"""The PostgreSQL site's error tree, under the site's (agent.site.errors).

Every failure of :mod:`agent.site.postgres` is one of these; any other
exception escaping it is a bug.  Messages are one line: what went wrong,
with what (the database and server, never a password), and what to do.
"""

from __future__ import annotations

from ..errors import InvalidSetting, SiteDatabaseError, SiteError, UnpublishableTable


class PostgresSiteError(SiteError):
    """Base of every error raised by :mod:`agent.site.postgres`."""


class InvalidUri(PostgresSiteError, InvalidSetting):
    """The text given for a database is not a PostgreSQL URI fieldsync takes."""


class PasswordInUri(InvalidUri):
    """The URI carries a password (in its user part or a ``password=``
    parameter); passwords come from ~/.pgpass, PGPASSFILE or a service file."""


class NotReachable(PostgresSiteError):
    """No connection could be made: the server is down or unreachable, the
    database does not exist, or the server refused the client's address."""


class AuthenticationFailed(PostgresSiteError):
    """The server refused the role's password, or none was found for it."""


class MissingPrivilege(PostgresSiteError):
    """The role lacks a privilege fieldsync needs (CONNECT, CREATE on the
    database or schema, ownership of or rights on a published table)."""


class AgentRunning(PostgresSiteError):
    """Another agent holds the consolidated's advisory lock."""


class UnsupportedDatabase(PostgresSiteError):
    """The server or database cannot hold a fieldsync site (an older
    PostgreSQL, an encoding other than UTF8)."""


class UnsupportedColumnType(PostgresSiteError, UnpublishableTable):
    """A column's type has no place in the types table (an array, range,
    composite or geometric type, ...): the table cannot be published."""


class ValueNotConvertible(PostgresSiteError, ValueError):
    """A value from a SQLite site does not fit the PostgreSQL column it is
    meant for (an apply records it as an apply error)."""


class PostgresDatabaseError(PostgresSiteError, SiteDatabaseError):
    """PostgreSQL reported an error fieldsync does not expect; the original
    error is the ``__cause__``."""

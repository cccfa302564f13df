"""Which PostgreSQL database a site is: libpq URIs, checked before use.

Rules of this file:
* A site on PostgreSQL is named by a libpq URI (``postgresql://`` or
  ``postgres://``): ``postgresql://app@127.0.0.1:5432/sales``,
  ``postgresql:///sales?service=hq``.  libpq itself parses it
  (``PQconninfoParse``, through psycopg), so what is checked here is what
  libpq will connect to.
* A URI that carries a password is refused, whatever else is wrong with it:
  in its user part (``app:secret@``), or as a ``password=`` or
  ``sslpassword=`` parameter.  Passwords come from ~/.pgpass, PGPASSFILE or
  a service file, as for every libpq program; a URI is shown in messages,
  logs and process lists.  No message here ever holds the password.
* Pure: no connection, no file, no environment.
"""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import ProgrammingError
from psycopg.conninfo import conninfo_to_dict

from .errors import InvalidUri, PasswordInUri
from .schemes import is_postgres_uri

# Parameters that carry a secret, never allowed in a URI.
SECRET_PARAMETERS = ("password", "sslpassword")
PASSWORD_HELP = "put it in ~/.pgpass, PGPASSFILE or a service file (docs/postgres.md, \"Passwords\")"


@dataclass(frozen=True, slots=True)
class PgTarget:
    """A checked PostgreSQL URI and what libpq reads from it.

    ``parameters`` are libpq's keywords as the URI gives them (no
    password among them); the fields below are the ones messages name.
    """

    uri: str
    parameters: tuple[tuple[str, str], ...]

    def __post_init__(self) -> None:
        names = {name for name, _ in self.parameters}
        if names & set(SECRET_PARAMETERS):
            raise PasswordInUri(f"a PostgreSQL URI must not carry a password; {PASSWORD_HELP}")

    def get(self, name: str) -> str | None:
        return dict(self.parameters).get(name)

    @property
    def dbname(self) -> str | None:
        return self.get("dbname")

    @property
    def where(self) -> str:
        """``database sales on 127.0.0.1:5432``, as messages name it."""
        database = f"database {self.dbname}" if self.dbname else "the default database"
        host, port, service = self.get("host"), self.get("port"), self.get("service")
        if host:
            place = f"{host}:{port}" if port else host
        elif service:
            place = f"service {service}"
        else:
            place = "the default server"
        if service and host:
            place += f" (service {service})"
        return f"{database} on {place}"


def _password_place(uri: str) -> str | None:
    """Where ``uri`` holds a password (``its user part``, ``a password=
    parameter``), read the way libpq splits a URI; None when it holds none."""
    rest = uri.split("://", 1)[1]
    authority_end = min((rest.index(mark) for mark in "/?" if mark in rest), default=len(rest))
    authority = rest[:authority_end]
    if "@" in authority and ":" in authority.rsplit("@", 1)[0]:
        return "its user part (user:password@)"
    query = rest.split("?", 1)[1] if "?" in rest else ""
    for pair in query.split("&"):
        name = pair.split("=", 1)[0]
        if name in SECRET_PARAMETERS:
            return f"a {name}= parameter"
    return None


def redact(uri: str) -> str:
    """``uri`` without any password in it, to show in a message."""
    if not is_postgres_uri(uri):
        return "(not a PostgreSQL URI)"
    scheme, rest = uri.split("://", 1)
    authority_end = min((rest.index(mark) for mark in "/?" if mark in rest), default=len(rest))
    authority, tail = rest[:authority_end], rest[authority_end:]
    if "@" in authority:
        user, host = authority.rsplit("@", 1)
        authority = f"{user.split(':', 1)[0]}@{host}"
    if "?" in tail:
        path, query = tail.split("?", 1)
        kept = [pair for pair in query.split("&") if pair.split("=", 1)[0] not in SECRET_PARAMETERS]
        tail = path + ("?" + "&".join(kept) if kept else "")
    return f"{scheme}://{authority}{tail}"


def parse_uri(uri: object) -> PgTarget:
    """Check ``uri`` and return what it names; raise PasswordInUri for a URI
    with a password, InvalidUri for anything else libpq would not take."""
    if not is_postgres_uri(uri):
        shown = uri if type(uri) is str and len(uri) <= 60 else f"{type(uri).__name__} value"
        raise InvalidUri(f"not a PostgreSQL URI: {shown!r}; write postgresql://USER@HOST:PORT/DATABASE "
                         "or postgresql:///DATABASE?service=NAME")
    assert isinstance(uri, str)
    place = _password_place(uri)
    if place is not None:
        raise PasswordInUri(f"the PostgreSQL URI {redact(uri)} carries a password in {place}; it would show in "
                            f"process lists and logs: remove it and {PASSWORD_HELP}")
    try:
        parameters = conninfo_to_dict(uri)
    except ProgrammingError as error:  # libpq's own one-line reason (no password left to echo)
        reason = str(error).strip().splitlines()[0] if str(error).strip() else "libpq cannot parse it"
        raise InvalidUri(f"not a valid PostgreSQL URI {uri}: {reason}") from None
    return PgTarget(uri, tuple(sorted((name, str(value)) for name, value in parameters.items())))

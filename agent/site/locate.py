"""Where a site is, and opening it: a SQLite file or a PostgreSQL URI.

Rules of this file:
* A site is named by one text: a libpq URI (``postgresql://...`` or
  ``postgres://...``, see postgres/schemes.py) names a PostgreSQL
  database, anything else a SQLite file.  Everything outside
  ``agent/site/`` opens and makes sites here, and holds them as
  :class:`~agent.site.interface.Site`.
* The agent's own folder (keys, spool, state) of a SQLite site is
  ``<file>.agent`` beside the file, derived from the name alone; a
  PostgreSQL site's is the ``--home`` folder its database records.
* The PostgreSQL backend is imported only when a URI is opened, so a
  SQLite site costs no psycopg import.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .errors import InvalidSetting
from .interface import Site
from .postgres.schemes import is_postgres_uri
from .sqlite._db import sqlite_home
from .sqlite.database import SiteDatabase

Location = str | os.PathLike[str]


def is_uri(location: Location) -> bool:
    """Whether ``location`` names a PostgreSQL database."""
    return is_postgres_uri(location)


def open_site(location: Location, **options: Any) -> Site:
    """Open the site at ``location``.  ``options`` go to the SQLite
    backend (``busy_timeout``, ``store_secret``); a PostgreSQL site takes
    none of them."""
    if is_uri(location):
        from .postgres.site import PostgresSite

        return PostgresSite.open(str(location))
    return SiteDatabase.open(location, **options)


def init_site(location: Location, *, name: str, role: str, home: Location | None = None, **options: Any) -> Site:
    """Make ``location`` a site.  ``home`` is the agent's folder of a
    PostgreSQL site, required there and refused for a SQLite file (whose
    folder is always ``<file>.agent``)."""
    if is_uri(location):
        if home is None:
            raise InvalidSetting(f"a PostgreSQL site needs a folder for the agent's own files: give "
                                 f"`--home DIR` when making the site at {location}")
        from .postgres.site import PostgresSite

        return PostgresSite.init(str(location), name=name, role=role, home=home, **options)
    if home is not None:
        raise InvalidSetting(f"--home is for a PostgreSQL site; the agent's folder of the SQLite site {location} "
                             f"is always {sqlite_home(location)}")
    return SiteDatabase.init(location, name=name, role=role, **options)


def site_home(location: Location) -> Path:
    """The agent's folder of the site at ``location`` (a PostgreSQL site is
    opened to read it)."""
    if not is_uri(location):
        return sqlite_home(location)
    with open_site(location) as site:
        return site.home

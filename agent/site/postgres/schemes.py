"""Which texts name a PostgreSQL database rather than a SQLite file.

Pure and free of psycopg, so telling the two apart costs no import: the
rest of the URI is checked by uri.py, which libpq's own parser backs.
"""

from __future__ import annotations

SCHEMES = ("postgresql://", "postgres://")


def is_postgres_uri(text: object) -> bool:
    """Whether ``text`` names a PostgreSQL database (not a SQLite file)."""
    return type(text) is str and text.startswith(SCHEMES)

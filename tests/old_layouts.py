"""Site databases as an older fieldsync left them, for the upgrade tests."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from agent.site.sqlite.schema import SITE_COLUMNS, SITE_TABLE

# Layout 3's site row: layout 4's, with the secret key text before created_at.
LAYOUT_3_SITE_TABLE = SITE_TABLE.replace("    created_at ", "    secret            BLOB,\n    created_at ", 1)


def back_to_layout_3(database: Path, secret: bytes | None) -> None:
    """Give the site in ``database`` layout 3's site row holding ``secret``,
    updated a few times since, as a running site's row is."""
    conn = sqlite3.connect(database, isolation_level=None)
    try:
        row = conn.execute(f"SELECT {', '.join(SITE_COLUMNS)} FROM fieldsync_site").fetchone()
        conn.execute("DROP TABLE fieldsync_site")
        conn.execute(LAYOUT_3_SITE_TABLE)
        conn.execute("INSERT INTO fieldsync_site VALUES (1, 3, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                     (*row[2:8], secret, *row[8:]))
        for bound in (7, 70_000, 7_000_000_000, row[-1]):  # and back: the site still works
            conn.execute("UPDATE fieldsync_site SET truncated_through = ?", (bound,))
    finally:
        conn.close()


def back_to_layout(database: Path, version: int, *statements: str) -> None:
    """Undo what layouts after ``version`` added to ``database`` with
    ``statements``, and mark it as of that layout."""
    conn = sqlite3.connect(database, isolation_level=None)
    try:
        for statement in statements:
            conn.execute(statement)
        conn.execute("UPDATE fieldsync_site SET schema_version = ?", (version,))
    finally:
        conn.close()

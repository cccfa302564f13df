"""Noticing that a site database was restored from an old copy.

Rules of this file:
* Every agent run counts a *generation*, kept both in the site database and
  in the agent's own folder beside it.  A database whose generation is
  behind the folder's was put back from an older copy: its offsets no longer
  match what its peers saw, so the site takes a new incarnation id.  Its
  peers then stop its stream with a clear error instead of mis-reading
  offsets (SQL Remote's known failure after a restore).
* A database copied elsewhere together with its agent folder cannot be told
  from the original; restore both only together with a new extraction.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from pathlib import Path

from codec.atomic import write_file_atomically

from .errors import AgentError
from .site import Site, SiteError

_TABLE = ("CREATE TABLE IF NOT EXISTS fieldsync_agent_run"
          " (id INTEGER PRIMARY KEY CHECK (id = 1), generation INTEGER NOT NULL)")


def check_restored(db: Site, directory: Path) -> bytes | None:
    """Count this run; return the old incarnation id if the database was
    restored (it then has a new one), else None."""
    marker_path = directory / "state" / "site.json"
    try:
        marker = json.loads(marker_path.read_text())
        marker_generation = int(marker["generation"])
        marker_incarnation = bytes.fromhex(marker["incarnation"])
    except (OSError, ValueError, KeyError, TypeError):
        marker_generation, marker_incarnation = 0, None
    try:
        generation, incarnation, renewed = _count_run(db, marker_generation, marker_incarnation)
    except SiteError as error:
        cause = error.__cause__
        if isinstance(cause, sqlite3.Error) and "readonly" in str(cause):
            # The file or its folder: the agent writes at every run.
            raise AgentError(f"{db.path}: the agent cannot write to the site database ({cause}); "
                             "it needs the file and its folder writable") from None
        raise
    if renewed is not None:
        db._refresh_identity()
    write_file_atomically(marker_path, json.dumps({"incarnation": incarnation.hex(),
                                                   "generation": generation}).encode())
    return renewed


def _count_run(db: Site, marker_generation: int,
               marker_incarnation: bytes | None) -> tuple[int, bytes, bytes | None]:
    with db._write(f"{db.path}: counting this agent run") as conn:
        conn.execute(_TABLE)
        row = conn.execute("SELECT generation FROM fieldsync_agent_run WHERE id = 1").fetchone()
        database_generation = row[0] if row else 0
        renewed = None
        incarnation = db.identity.incarnation
        if marker_incarnation == incarnation and marker_generation > database_generation:
            renewed = incarnation
            incarnation = uuid.uuid4().bytes
            conn.execute("UPDATE fieldsync_site SET incarnation = ? WHERE id = 1", (incarnation,))
        generation = max(database_generation, marker_generation) + 1
        conn.execute("INSERT OR REPLACE INTO fieldsync_agent_run (id, generation) VALUES (1, ?)", (generation,))
    return generation, incarnation, renewed

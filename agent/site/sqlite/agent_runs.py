"""The count of agent runs a SQLite site keeps (agent/restore.py compares it
with the count kept in the agent's folder to notice a database put back
from an older copy).

Rules of this file:
* One row, ``fieldsync_agent_run``, made on first use; written in the
  caller's write transaction, with the incarnation change it may lead to.
"""

from __future__ import annotations

import sqlite3

from ..identity import SiteIdentity, next_generation

_TABLE = ("CREATE TABLE IF NOT EXISTS fieldsync_agent_run"
          " (id INTEGER PRIMARY KEY CHECK (id = 1), generation INTEGER NOT NULL)")


def count_run_locked(conn: sqlite3.Connection, identity: SiteIdentity, marker_generation: int,
                     marker_incarnation: bytes | None) -> tuple[int, bytes, bytes | None]:
    """Count one agent run in the caller's write transaction (see agent.site.identity.next_generation)."""
    conn.execute(_TABLE)
    row = conn.execute("SELECT generation FROM fieldsync_agent_run WHERE id = 1").fetchone()
    generation, incarnation, renewed = next_generation(row[0] if row else 0, identity, marker_generation,
                                                       marker_incarnation)
    if renewed is not None:
        conn.execute("UPDATE fieldsync_site SET incarnation = ? WHERE id = 1", (incarnation,))
    conn.execute("INSERT OR REPLACE INTO fieldsync_agent_run (id, generation) VALUES (1, ?)", (generation,))
    return generation, incarnation, renewed

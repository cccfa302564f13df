"""The count of agent runs a PostgreSQL site keeps: the rule of
agent.site.identity.next_generation, in the ``fieldsync`` schema (a SQLite
site's: agent/site/sqlite/agent_runs.py).

Rules of this file:
* One row, ``fieldsync.agent_run``, made on first use by the agent's role
  (which owns the schema); written in the caller's transaction, with the
  incarnation change it may lead to.
"""

from __future__ import annotations

import psycopg

from ..identity import SiteIdentity, next_generation

_TABLE = ("CREATE TABLE IF NOT EXISTS fieldsync.agent_run"
          " (id integer PRIMARY KEY CHECK (id = 1), generation bigint NOT NULL)")


def count_run(conn: psycopg.Connection, identity: SiteIdentity, marker_generation: int,
              marker_incarnation: bytes | None) -> tuple[int, bytes, bytes | None]:
    """Count one agent run in the caller's transaction."""
    conn.execute(_TABLE)
    row = conn.execute("SELECT generation FROM fieldsync.agent_run WHERE id = 1 FOR UPDATE").fetchone()
    generation, incarnation, renewed = next_generation(row[0] if row else 0, identity, marker_generation,
                                                       marker_incarnation)
    if renewed is not None:
        conn.execute("UPDATE fieldsync.identity SET incarnation = %s", (incarnation,))
    conn.execute("INSERT INTO fieldsync.agent_run (id, generation) VALUES (1, %s)"
                 " ON CONFLICT (id) DO UPDATE SET generation = excluded.generation", (generation,))
    return generation, incarnation, renewed

"""What the metrics read of a PostgreSQL site, in one snapshot.

Rules of this file:
* The same rows, in the same order and form, as the metrics read from a
  SQLite site file (agent/metrics.py, ``read_site``): the site's name, the
  log end, per remote ``(name, log_sent, confirm_sent, log_received,
  created_at, last_received_at, last_sent_at, horizon, heard_at,
  in_error, peer_schema_version)`` with times as ISO 8601 text, conflicts and apply errors
  counted by peer, and the site's schema version (changes.py).
* A connection of its own, read only, one REPEATABLE READ transaction: the
  agent's connection is never used, and nothing is written.
"""

from __future__ import annotations

from datetime import datetime

import psycopg

from ..clock import in_utc
from .changes import schema_version
from .connect import connect, translate
from .log import log_end
from .read_positions import effective
from .remotes import IN_ERROR_SQL
from .uri import PgTarget, parse_uri

# agent/site/sqlite/log.py's HORIZON_SQL in PostgreSQL's words (GREATEST for SQLite's scalar max);
# tests/site/postgres/test_metrics_rows.py holds the two to the one horizon rule.
HORIZON_SQL = (f"(CASE WHEN confirm_sent >= log_sent THEN GREATEST({effective('log_read')}, log_sent)"
               " ELSE confirm_sent END)")

_REMOTES = ("SELECT name, log_sent, confirm_sent, log_received, created_at, last_received_at, last_sent_at,"
            f" {HORIZON_SQL}, heard_at, {IN_ERROR_SQL}, peer_schema_version FROM fieldsync.remote")


def _text(moment: datetime | None) -> str | None:
    utc = in_utc(moment)
    return None if utc is None else utc.isoformat()


def read_metrics_rows(location: str | PgTarget
                      ) -> tuple[str, int, list[tuple], dict[str, int], dict[str, int], int | None]:
    """``(site, log_end, remotes, conflicts, apply_errors, schema_version)`` of the site at ``location``."""
    target = location if isinstance(location, PgTarget) else parse_uri(location)
    conn = connect(target)
    try:
        with conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            (site,) = conn.execute("SELECT name FROM fieldsync.identity").fetchone()
            remotes = [(*row[:4], _text(row[4]), _text(row[5]), _text(row[6]), *row[7:])
                       for row in conn.execute(_REMOTES)]
            conflicts = dict(conn.execute("SELECT peer, count(*) FROM fieldsync.conflict GROUP BY peer").fetchall())
            errors = dict(conn.execute("SELECT peer, count(*) FROM fieldsync.apply_error GROUP BY peer").fetchall())
            end = log_end(conn)
            version = schema_version(conn)
    except psycopg.Error as error:
        raise translate(error, target, "reading metrics") from None
    finally:
        conn.close()
    return site, end, remotes, conflicts, errors, version

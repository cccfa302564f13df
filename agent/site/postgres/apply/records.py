"""What an apply records at a PostgreSQL consolidated, and reading it back:
apply errors, conflicts and the tables' conflict policies.

Rules of this file:
* The records are a SQLite site's (agent/site/apply: ``error_fields``,
  ``conflict_record``, ``apply_error_record``): rows and keys as msgpack,
  so every value a peer sent is kept exactly, NaN and -0.0 included, and
  read back as the same ApplyErrorRecord and ConflictRecord values.
* An apply error not yet acknowledged puts its peer in error (the remote
  table's IN_ERROR_SQL); acknowledging stamps it and keeps it as history.
* A conflict policy is kept per table, by the schema and name it resolves
  to when set (``fieldsync.conflict_policy``; none: incoming wins).
* Functions here run inside the caller's transaction.
"""

from __future__ import annotations

from datetime import datetime

import psycopg

from ...apply.batch import Batch, Resolution
from ...apply.conflicts import ConflictRecord, check_policy, conflict_record
from ...apply.records import ApplyErrorRecord, apply_error_record, error_fields
from ...clock import in_utc
from ...errors import InvalidSetting
from ...values import pack
from ..capture import describe_table


def record_error(conn: psycopg.Connection, batch: Batch, now: datetime, op: object, problem: str) -> None:
    """Record that ``op`` of the batch could not be applied, and why."""
    batch.errors += 1
    conn.execute("INSERT INTO fieldsync.apply_error (at, peer, peer_commit, table_name, kind, key, operation,"
                 " problem) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                 (now, batch.peer, batch.commit, *error_fields(op), problem))


def record_conflict(conn: psycopg.Connection, batch: Batch, now: datetime, table: str, op: tuple, local: dict,
                    resolution: str, result: dict | None) -> None:
    conn.execute("INSERT INTO fieldsync.conflict (at, peer, peer_commit, table_name, key, local_row, incoming_before,"
                 " incoming_after, resolution, result_row) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                 (now, batch.peer, batch.commit, table, pack(op[2]), pack(local), pack(op[3]), pack(op[4]),
                  resolution, None if result is None else pack(result)))


def list_conflicts(conn: psycopg.Connection, after_id: int) -> tuple[ConflictRecord, ...]:
    rows = conn.execute("SELECT id, at, peer, peer_commit, table_name, key, local_row, incoming_before,"
                        " incoming_after, resolution, result_row FROM fieldsync.conflict WHERE id > %s ORDER BY id",
                        (after_id,)).fetchall()
    return tuple(conflict_record(_bytes(row), in_utc(row[1])) for row in rows)


def list_apply_errors(conn: psycopg.Connection, after_id: int) -> tuple[ApplyErrorRecord, ...]:
    rows = conn.execute("SELECT id, at, peer, peer_commit, table_name, kind, key, operation, problem, acknowledged_at"
                        " FROM fieldsync.apply_error WHERE id > %s ORDER BY id", (after_id,)).fetchall()
    return tuple(apply_error_record(_bytes(row), in_utc(row[1]), None if row[9] is None else in_utc(row[9]))
                 for row in rows)


def _bytes(row: tuple) -> tuple:
    """A row with its bytea values (memoryview) as bytes, for msgpack."""
    return tuple(bytes(value) if isinstance(value, memoryview) else value for value in row)


def open_apply_errors(conn: psycopg.Connection) -> dict[str, int]:
    """The apply errors not yet acknowledged, counted by peer."""
    return dict(conn.execute("SELECT peer, count(*) FROM fieldsync.apply_error WHERE acknowledged_at IS NULL"
                             " GROUP BY peer").fetchall())


def acknowledge_apply_errors(conn: psycopg.Connection, peer: str, now: datetime, through: int | None) -> int:
    """Stamp ``peer``'s apply errors not yet acknowledged (those with an id
    up to ``through``, when given); return how many."""
    if through is not None and (type(through) is not int or through < 0):
        raise InvalidSetting(f"through is an apply error id, got {through!r}")
    return conn.execute("UPDATE fieldsync.apply_error SET acknowledged_at = %s WHERE peer = %s"
                        " AND acknowledged_at IS NULL AND id <= %s",
                        (in_utc(now), peer, (1 << 63) - 1 if through is None else through)).rowcount


def set_policy(conn: psycopg.Connection, table: str, policy: Resolution | str | None) -> None:
    """Set (None: clear) the conflict policy of ``table``, as PostgreSQL
    resolves its name now."""
    layout = describe_table(conn, table).layout
    if policy is None:
        conn.execute("DELETE FROM fieldsync.conflict_policy WHERE table_schema = %s AND table_name = %s",
                     (layout.schema, layout.table))
        return
    conn.execute("INSERT INTO fieldsync.conflict_policy (table_schema, table_name, policy) VALUES (%s, %s, %s)"
                 " ON CONFLICT (table_schema, table_name) DO UPDATE SET policy = excluded.policy",
                 (layout.schema, layout.table, check_policy(policy).value))

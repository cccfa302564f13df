"""The records an apply leaves of a bad operation, as both backends read
them back (``fieldsync_apply_error``; agent/site/sqlite/apply/statements.py,
agent/site/postgres/apply/records.py).

Rules of this file:
* Plain values: what a record holds of an operation, malformed or not
  (:func:`error_fields`), and the record read back from a row of either
  backend's table (:func:`apply_error_record`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from ..values import unpack
from .batch import packed


@dataclass(frozen=True, slots=True)
class ApplyErrorRecord:
    id: int
    at: datetime
    peer: str
    peer_commit: int
    table: str | None
    kind: int | None
    key: tuple | None
    operation: object
    problem: str
    acknowledged_at: datetime | None = None  # acknowledged (agent remote ack-errors): history, no longer in force


def error_fields(op: object) -> tuple[str | None, int | None, bytes | None, bytes]:
    """What an apply error records of ``op``, malformed or not: its table,
    kind and key where it has them, and the whole operation (msgpack)."""
    table = kind = key = None
    if isinstance(op, tuple) and len(op) == 5:
        table = op[0] if type(op[0]) is str else None
        kind = op[1] if type(op[1]) is int else None
        key = packed(op[2])
    return table, kind, key, packed(op)


def apply_error_record(row: tuple, at: datetime, acknowledged: datetime | None) -> ApplyErrorRecord:
    """The record of a row ``(id, at, peer, peer_commit, table_name, kind,
    key, operation, problem, acknowledged_at)`` of either backend's apply
    error table, its times read by the caller."""
    key_value = unpack(row[6])
    return ApplyErrorRecord(row[0], at, row[2], row[3], row[4], row[5],
                            tuple(key_value) if isinstance(key_value, (list, tuple)) else None,
                            unpack(row[7]), row[8], acknowledged)

"""Row values: validation of incoming operations and the stored encoding of
row images kept outside the capture table (conflicts, apply errors).

Rules of this file:
* The capture table keeps values in untyped SQLite columns, so it stores
  exactly what the application's row holds; nothing here touches that path.
* Images stored as blobs (conflict and error records) are msgpack with
  ``use_bin_type``: ``str`` and ``bytes`` stay apart, floats are 64-bit
  IEEE (NaN, infinities and -0.0 survive), integers are exact.
"""

from __future__ import annotations

from typing import Any

import msgpack

from codec.ops import INT64_MAX, INT64_MIN, OpKind, Operation

_PLAIN_VALUE_TYPES = (type(None), str, bytes, float)


def pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def unpack(data: bytes | None) -> Any:
    if data is None:
        return None
    return msgpack.unpackb(data, raw=False, use_list=False, strict_map_key=False)


def value_problem(value: object) -> str | None:
    """Why ``value`` is not a SQLite value, or None when it is one."""
    kind = type(value)
    if kind in _PLAIN_VALUE_TYPES:
        return None
    if kind is int:
        if INT64_MIN <= value <= INT64_MAX:  # type: ignore[operator]
            return None
        return f"integer {value} is outside SQLite's 64-bit range"
    return f"{kind.__name__} is not a SQLite value"


def _image_problem(image: object, what: str) -> str | None:
    if type(image) is not dict:
        return f"{what} must be a dict of column -> value"
    for column, value in image.items():
        if type(column) is not str or not column:
            return f"{what} has a column name that is not a non-empty string: {column!r:.40}"
        problem = value_problem(value)
        if problem is not None:
            return f"{what}.{column}: {problem}"
    return None


def operation_problem(op: object) -> str | None:
    """Why ``op`` (an Operation or a decoded 5-tuple) is malformed, or None.

    Decoded messages hand over plain tuples whose values have not been
    checked yet (see codec.ops); this is the check, cheaper than building
    an :class:`Operation` for every one.
    """
    if not isinstance(op, tuple) or len(op) != 5:
        return "operation must be a 5-tuple (table, kind, key, before, after)"
    table, kind, key, before, after = op
    if type(table) is not str or not table:
        return "operation table must be a non-empty string"
    if type(key) is not tuple or not key:
        return "operation key must be a non-empty tuple"
    for part in key:
        problem = value_problem(part)
        if problem is not None:
            return f"key: {problem}"
    if kind == OpKind.INSERT and type(kind) is int:
        if before is not None:
            return "INSERT must not carry a before-image"
        return _image_problem(after, "after")
    if kind == OpKind.UPDATE and type(kind) is int:
        return _image_problem(before, "before") or _image_problem(after, "after")
    if kind == OpKind.DELETE and type(kind) is int:
        if after is not None:
            return "DELETE must not carry an after-image"
        return _image_problem(before, "before")
    return f"unknown operation kind {kind!r:.20}"


def as_operation(op: tuple) -> Operation:
    """The named form of a checked operation tuple (no second validation)."""
    if isinstance(op, Operation):
        return op
    return tuple.__new__(Operation, op)


def same_value(a: object, b: object) -> bool:
    """Subscription values are the same: equal and of one type (``7`` and
    ``'7'`` are different values, so are ``7`` and ``7.0``)."""
    return type(a) is type(b) and a == b

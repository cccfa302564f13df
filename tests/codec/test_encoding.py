"""Entries are written with msgspec's encoder (codec.message.serialize_entry):
byte for byte what msgpack's packer writes, subclasses of the value types
included, and what neither can write refused with one line."""

from __future__ import annotations

import enum
import struct

import msgpack
import pytest

from codec.errors import InvalidValue
from codec.message import APPLIED_VERSION, serialize_entry
from codec.ops import to_runs


class Text(str):
    pass


class Number(int):
    pass


class Real(float):
    pass


class Blob(bytes):
    pass


class Colour(enum.IntEnum):
    RED = 7


NAN_WITH_PAYLOAD = struct.unpack(">d", bytes.fromhex("7ff8000000000abc"))[0]
VALUES = [None, True, False, 0, -1, 127, 128, -33, 2**31, 2**63 - 1, -(2**63), 2**64 - 1, 0.0, -0.0, 1.5,
          float("inf"), float("-inf"), NAN_WITH_PAYLOAD, "", "é" * 40, "x" * 300, "y" * 70_000, b"", b"\x00" * 300,
          bytearray(b"ab"), memoryview(b"cd"), Text("sub"), Number(5), Real(2.5), Blob(b"\x01"), Colour.RED]


@pytest.mark.parametrize("version", [1, 2, APPLIED_VERSION])
def test_an_entry_is_the_bytes_msgpack_writes(version):
    # Plain 5-tuples: Operation refuses what is no SQLite value (a bool, an
    # int over 64 bits), which the encoder writes all the same.
    ops = [("t", 1, (index,), None, {"id": index, "v": value}) for index, value in enumerate(VALUES)]
    ops.append(("t", 2, (0,), {"v": 1}, {"v": Text("two")}))
    ops.append(("t", 3, (1,), {"id": 1, "v": None}, None))
    applied = 9 if version == APPLIED_VERSION else None
    written = serialize_entry(500, "field1", ops, version, applied)
    items = ops if version == 1 else to_runs(ops)
    entry = (500, "field1", items) if applied is None else (500, "field1", applied, items)
    assert written == msgpack.Packer(use_bin_type=True).pack(entry)


@pytest.mark.parametrize("value, problem", [(2**64, "out of range|2\\*\\*64"), (-(2**63) - 1, "out of range|2\\*\\*64"),
                                            (object(), "object"), (1j, "complex")])
def test_a_value_no_entry_can_hold_is_refused_with_one_line(value, problem):
    with pytest.raises(InvalidValue, match=f"transaction 500 cannot be serialized: .*({problem})"):
        serialize_entry(500, "field1", [("t", 1, (1,), None, {"v": value})])

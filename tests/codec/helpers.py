"""Shared builders for codec tests."""

from __future__ import annotations

import struct

import msgpack

from codec import message as wire
from codec.header import Header
from codec.keys import Keyring, SiteKeys
from codec.ops import Operation, Transaction

HQ = SiteKeys.from_seeds("hq", bytes(range(32)), bytes(range(32, 64)))
FIELD = SiteKeys.from_seeds("field1", bytes(range(64, 96)), bytes(range(96, 128)))
OTHER = SiteKeys.from_seeds("field2", bytes(range(128, 160)), bytes(range(160, 192)))
INCARNATION = bytes.fromhex("00112233445566778899aabbccddeeff")
KEYRING = Keyring([HQ.public, OTHER.public])


def sample_transactions(start: int = 100) -> list[Transaction]:
    return [
        Transaction(start + 10, "hq", (
            Operation.insert("customer", (1,), {"id": 1, "name": "Ana", "balance": 12.5, "photo": b"\x00\xff"}),
            Operation.update("customer", (1,), {"balance": 12.5}, {"balance": float("nan")}),
        )),
        Transaction(start + 25, "field2", (
            Operation.delete("orders", (7, "A"), {"id": 7, "line": "A", "note": None}),
        )),
    ]


def craft(*, version: int = 1, kind: int = ord("D"), flags: int = 0, header: Header = Header(0, 0, 1),
          sender: str = "hq", recipient: str = "field1", raw_length: int | None = None,
          stored: bytes | None = None, payload: bytes | None = None, keys: SiteKeys = HQ) -> bytes:
    """A signed message file with arbitrary (possibly wrong) fields."""
    if stored is None:
        payload = msgpack.packb([]) if payload is None else payload
        stored = wire.compress(payload)
        raw_length = len(payload) if raw_length is None else raw_length
    raw_length = 0 if raw_length is None else raw_length
    body = b"".join((
        struct.pack(">4sBBBBQQQI16s", wire.MAGIC, version, kind, flags, 0, header.resend_count, header.prev,
                    header.last, header.seq, INCARNATION),
        bytes((len(sender),)), sender.encode(), bytes((len(recipient),)), recipient.encode(),
        struct.pack(">II", raw_length, len(stored)), stored,
    ))
    return body + keys.signer.sign(body)

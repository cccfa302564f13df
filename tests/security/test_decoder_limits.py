"""A signed peer cannot exhaust the receiver's memory, nor stop a stream
with counters out of the protocol's ranges (docs/security.md, "Messages").

The files here are signed with the peer's real key, as a thief of that key
would sign them; the agent that reads them is the real one, in a process of
its own whose peak RSS is measured.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgpack
import pytest

from agent.quarantine import read_quarantine
from codec.errors import CorruptMessage, MessageTooLarge
from codec.header import Header
from codec.keys import Keyring, SiteKeys
from codec.message import (EXPANSION_FLOOR, MAX_PAYLOAD, ControlState, Message, compress, decode_message,
                           encode_data_message, frame, max_raw_length)
from codec.payloads import reassemble
from codec.names import Kind, MessageName
from codec.ops import Operation, Transaction
from codec.packing import pack_messages
from tests.cli.conftest import World
from tests.security.sites import build_world, epoch_of, keys_of, run_in_process, run_once

INCARNATION = bytes(16)


@pytest.fixture
def world(tmp_path: Path) -> World:
    return build_world(tmp_path)


def put(world: World, kind: Kind, header: Header, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()[:16] if kind is Kind.CONTROL else None
    name = str(MessageName("n1", "hq", kind, header, digest) if digest else MessageName("n1", "hq", kind, header))
    (world.inbox("hq") / name).write_bytes(data)
    return name


def empty_maps(count: int) -> bytes:
    return b"\xdd" + count.to_bytes(4, "big") + b"\x80" * count


def test_a_small_file_of_sixteen_million_empty_maps_is_refused_unopened(world: World) -> None:
    keys, incarnation = keys_of(world.n1)
    epoch = epoch_of(world.hq, "n1")
    payload = empty_maps(MAX_PAYLOAD - 5)
    header = Header(epoch, 0, 1, 0)
    data = frame(Kind.DATA, header, keys=keys, recipient="hq", incarnation=incarnation,
                 raw_length=len(payload), compressed=compress(payload))
    assert len(data) < 2000
    put(world, Kind.DATA, header, data)
    code, peak_mb, errors = run_in_process(world.hq)
    assert code == 0, errors
    assert peak_mb < 200, peak_mb  # 1.38 GB before
    [entry] = read_quarantine(world.root / "hq.db.agent" / "quarantine")
    assert "decompression bomb" in entry.reason


def test_a_group_of_parts_each_declaring_sixteen_mib_is_refused_unopened(world: World) -> None:
    keys, incarnation = keys_of(world.n1)
    epoch = epoch_of(world.hq, "n1")
    chunk = b"\x00" * MAX_PAYLOAD
    compressed = compress(chunk)
    for seq in range(40):
        header = Header(epoch, 0, 5 if seq == 39 else 0, seq)
        put(world, Kind.DATA, header, frame(Kind.DATA, header, keys=keys, recipient="hq", incarnation=incarnation,
                                            raw_length=len(chunk), compressed=compressed, part=True))
    code, peak_mb, errors = run_in_process(world.hq)
    assert code == 0, errors
    assert peak_mb < 200, peak_mb  # 2.0 GB before, growing with the number of parts
    entries = read_quarantine(world.root / "hq.db.agent" / "quarantine")
    assert entries and all("decompression bomb" in entry.reason for entry in entries)


def test_a_control_message_with_counters_past_the_header_range_is_quarantined_and_the_stream_goes_on(
        world: World) -> None:
    keys, incarnation = keys_of(world.n1)
    for counters in ((0, 2**63 - 1, 0, 2**63 - 1), (0, 2**32, 0, 0)):
        payload = msgpack.packb(counters)
        header = Header(2**32 - 1, 0, 0, 0)
        put(world, Kind.CONTROL, header, frame(Kind.CONTROL, header, keys=keys, recipient="hq",
                                               incarnation=incarnation, raw_length=len(payload),
                                               compressed=compress(payload)))
    report = run_once(world.hq)
    assert report.quarantined == 2 and report.ok, report
    reasons = [entry.reason for entry in read_quarantine(world.root / "hq.db.agent" / "quarantine")]
    assert all("0..4294967295" in reason for reason in reasons), reasons
    # hq's stream to n1 goes on: a change made now reaches n1.
    world.execute("hq", "INSERT INTO customer VALUES (901, 'n1', 'after the attack', 'x')")
    report = run_once(world.hq)
    assert report.ok, report
    run_once(world.n1)
    assert world.rows("n1", "SELECT id, name FROM customer WHERE id = 901") == [(901, "after the attack")]


# -- the codec alone ------------------------------------------------------------------------------------------

SENDER = SiteKeys.from_seeds("hq", bytes(range(32)), bytes(range(1, 33)))
RING = Keyring([SENDER.public])


def decode(data: bytes) -> Message:
    return decode_message(data, source="m.fsm", keyring=RING, recipient="field1")


def framed(payload: bytes, compressed: bytes | None = None, header: Header = Header(0, 0, 1, 0),
           part: bool = False, version: int | None = None) -> bytes:
    return frame(Kind.DATA, header, keys=SENDER, recipient="field1", incarnation=INCARNATION,
                 raw_length=len(payload), compressed=compress(payload) if compressed is None else compressed,
                 part=part, version=version)


def test_bytes_after_the_zstd_frame_are_refused() -> None:
    payload = msgpack.packb([[1, "hq", []]])
    assert decode(framed(payload)).transactions  # the same message without them decodes
    with pytest.raises(CorruptMessage, match="after its zstd frame"):
        decode(framed(payload, compress(payload) + b"trailing"))
    with pytest.raises(CorruptMessage, match="after its zstd frame"):
        decode(framed(payload, compress(payload) + compress(b"")))  # a second frame


def test_a_zstd_frame_cut_short_or_garbled_is_refused() -> None:
    """The decoder takes a good frame in one call and reads a refused one
    again as a stream to say why: every fault is still a CorruptMessage."""
    payload = msgpack.packb([[1, "hq", []]] * 50)
    whole = compress(payload)
    with pytest.raises(CorruptMessage, match="cut short"):
        decode(framed(payload, whole[:-4]))
    garbled = whole[:6] + bytes(byte ^ 0xFF for byte in whole[6:])
    with pytest.raises(CorruptMessage):
        decode(framed(payload, garbled))


def test_an_array_longer_than_its_payload_allows_is_refused_before_it_is_built() -> None:
    payload = empty_maps(900_000)  # within the expansion floor, so it reaches the decoder
    assert len(payload) <= EXPANSION_FLOOR
    with pytest.raises(CorruptMessage, match="not valid msgpack"):
        decode(framed(payload, version=1))  # version 1: arrays of at most payload/5 + 16
    nils = b"\xdd" + (len(payload) + 17).to_bytes(4, "big") + b"\xc0" * 64
    with pytest.raises(CorruptMessage, match="not valid msgpack"):
        decode(framed(nils, version=2))  # version 2: at most payload + 16, never more than its bytes


def test_a_version_2_payload_of_empty_maps_is_refused_at_the_first() -> None:
    """A map costs 64 bytes for its one byte; version 2 has none, and the
    first one stops the decoder (max_map_len=0 alone lets empty ones by)."""
    import tracemalloc

    payload = empty_maps(900_000)
    tracemalloc.start()
    try:
        with pytest.raises(CorruptMessage, match="not valid msgpack"):
            decode(framed(payload, version=2))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * len(payload), peak  # not 900,000 dicts (57 MB): the payload's copies at most


def test_a_group_over_its_limit_is_refused_before_it_is_joined(monkeypatch: pytest.MonkeyPatch) -> None:
    import codec.payloads

    monkeypatch.setattr(codec.payloads, "MAX_GROUP_PAYLOAD", 1000)
    parts = [decode(framed(b"\x00" * 600, header=Header(0, 0, 0 if seq == 0 else 5, seq), part=True))
             for seq in range(2)]
    with pytest.raises(MessageTooLarge, match="over the 1000-byte limit"):
        reassemble(parts)


def test_a_group_read_part_by_part_holds_at_most_its_buffer_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """read_group never joins a group: an operation that would need more
    than MAX_GROUP_PAYLOAD bytes buffered is refused while it is read."""
    import codec.payloads

    blob = b"".join(hashlib.sha256(index.to_bytes(2, "big")).digest() for index in range(1536))  # 48 KiB, incompressible
    big = Transaction(1, "hq", (Operation.insert("t", (1,), {"id": 1, "blob": blob}),))
    messages = list(pack_messages([big], keys=SENDER, recipient="field1", incarnation=INCARNATION, resend_count=0,
                                  start=0, max_size=10_000))
    parts = [decode(message.data) for message in messages]
    assert len(parts) > 3
    assert next(codec.payloads.read_group(iter(parts)).ops)[4]["blob"] == blob
    monkeypatch.setattr(codec.payloads, "MAX_GROUP_PAYLOAD", 20_000)
    with pytest.raises(MessageTooLarge, match="over the 20000-byte limit"):
        list(codec.payloads.read_group(iter(parts)).ops)


def test_the_packer_refuses_a_transaction_over_the_group_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    import codec.packing

    monkeypatch.setattr(codec.packing, "MAX_GROUP_PAYLOAD", 10_000)
    big = Transaction(1, "hq", (Operation.insert("t", (1,), {"id": 1, "blob": b"\x00" * 20_000}),))
    with pytest.raises(Exception, match="over the 10000-byte limit of one transaction"):
        list(pack_messages([big], keys=SENDER, recipient="field1", incarnation=INCARNATION, resend_count=0,
                           start=0))


def test_the_packer_keeps_within_the_expansion_limit_and_the_parts_join() -> None:
    """A transaction that compresses far better than the decoder allows is
    split into parts that each keep to it."""
    blob = b"\x00" * (3 * EXPANSION_FLOOR)
    big = Transaction(1, "hq", (Operation.insert("t", (1,), {"id": 1, "blob": blob}),))
    messages = list(pack_messages([big], keys=SENDER, recipient="field1", incarnation=INCARNATION,
                                  resend_count=0, start=0))
    assert len(messages) > 1
    decoded = [decode(message.data) for message in messages]
    for message in decoded:
        assert message.part is not None
    # (decode refuses a part over the limit, so each kept to it)
    assert reassemble(decoded).ops[0][4]["blob"] == blob


def test_a_whole_message_that_expands_too_much_is_refused() -> None:
    payload = msgpack.packb([[1, "hq", [["t", 1, [1], None, {"blob": b"\x00" * (2 * EXPANSION_FLOOR)}]]]])
    compressed = compress(payload)
    assert len(payload) > max_raw_length(len(compressed))
    with pytest.raises(MessageTooLarge, match="decompression bomb"):
        decode(framed(payload))


def test_control_counters_are_checked_where_the_value_is_made() -> None:
    for bad in ((0, 2**32, 0, 0), (0, 0, 0, 2**32), (-1, 0, 0, 0), (2**63, 0, 0, 0)):
        with pytest.raises(Exception):
            ControlState(*bad)
    assert ControlState(2**63 - 1, 2**32 - 1, 2**63 - 1, 2**32 - 1).header().resend_count == 2**32 - 1


def test_an_ordinary_message_still_decodes() -> None:
    transactions = [Transaction(commit, "hq", (Operation.insert("customer", (commit,), {"id": commit}),))
                    for commit in range(1, 50)]
    message = encode_data_message(transactions, Header(0, 0, 49, 0), keys=SENDER, recipient="field1",
                                  incarnation=INCARNATION)
    assert len(decode(message.data).transactions) == 49

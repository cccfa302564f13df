import math

import msgpack
import pytest
import zstandard

from codec import message as wire
from codec.errors import (BadSignature, CorruptMessage, InvalidValue, MessageError, MessageTooLarge, SealError,
                          UnknownSender, UnsupportedVersion, WrongRecipient)
from codec.header import Header
from codec.keys import Keyring
from codec.message import (ControlState, decode_message, encode_control_message, encode_data_message)
from codec.names import Kind, MessageName
from codec.ops import INT64_MAX, INT64_MIN, Operation, Transaction, check_operation, values_identical

from .helpers import FIELD, HQ, INCARNATION, KEYRING, OTHER, craft, sample_transactions


def decode(data, name="m.fsm", **options):
    options.setdefault("keyring", KEYRING)
    options.setdefault("recipient", "field1")
    return decode_message(data, source=name, **options)


def encode(transactions, header=Header(0, 100, 200), **options):
    return encode_data_message(transactions, header, keys=HQ, recipient="field1", incarnation=INCARNATION,
                               **options)


def test_data_round_trip_and_name():
    transactions = sample_transactions()
    encoded = encode(transactions)
    message = decode(encoded.data)
    assert message.kind is Kind.DATA and message.header == Header(0, 100, 200)
    assert (message.sender, message.recipient, message.incarnation) == ("hq", "field1", INCARNATION)
    assert values_identical(message.transactions, tuple(transactions))
    assert MessageName.parse(encoded.name) == MessageName("hq", "field1", Kind.DATA, Header(0, 100, 200))


def test_every_sqlite_value_round_trips_exactly():
    values = [None, 0, 1, -1, INT64_MAX, INT64_MIN, 0.0, -0.0, 1.5, float("inf"), float("-inf"), float("nan"),
              5e-324, "", "plain", "ünïcödé ✓ 𝄞 \x00 nul", "x" * 200_000, b"", b"\x00\x01\xff" * 1000]
    row = {f"c{i}": value for i, value in enumerate(values)}
    transaction = Transaction(150, "hq", (Operation.insert("t", tuple(values[:6]), row),))
    decoded = decode(encode([transaction]).data).transactions[0]
    table, kind, key, before, after = decoded.ops[0]
    assert values_identical(after, row) and values_identical(key, tuple(values[:6]))
    assert math.copysign(1.0, after["c7"]) == -1.0 and math.isnan(after["c11"])
    assert check_operation(decoded.ops[0]) == transaction.ops[0] or math.isnan(after["c11"])


def test_encoding_is_deterministic_including_sealed():
    transactions = sample_transactions()
    assert encode(transactions).data == encode(transactions).data
    sealed = encode(transactions, seal_to=FIELD.public)
    assert sealed.data == encode(transactions, seal_to=FIELD.public).data
    state = ControlState(5, 1, 9, 0)
    first = encode_control_message(state, keys=HQ, recipient="field1", incarnation=INCARNATION)
    assert first == encode_control_message(state, keys=HQ, recipient="field1", incarnation=INCARNATION)


def test_sealed_message_opens_only_for_the_recipient():
    transactions = sample_transactions()
    sealed = encode(transactions, seal_to=FIELD.public)
    assert b"customer" not in sealed.data  # payload is not readable in the file
    message = decode(sealed.data, recipient_keys=FIELD)
    assert message.sealed and values_identical(message.transactions, tuple(transactions))
    with pytest.raises(SealError, match="no sealing key"):
        decode(sealed.data)
    with pytest.raises(SealError, match="does not open"):
        decode(sealed.data, recipient_keys=OTHER)
    with pytest.raises(InvalidValue):
        encode(transactions, seal_to=OTHER.public)  # sealing key of another site


def test_control_message_round_trip():
    state = ControlState(log_received=1234, rereceive_count=2, log_sent=999, resend_count=1)
    encoded = encode_control_message(state, keys=HQ, recipient="field1", incarnation=INCARNATION)
    name = MessageName.parse(encoded.name)
    assert name.kind is Kind.CONTROL and name.digest
    message = decode(encoded.data)
    assert message.control == state and message.kind is Kind.CONTROL and message.transactions is None
    other = encode_control_message(ControlState(1234, 2, 1000, 1), keys=HQ, recipient="field1",
                                   incarnation=INCARNATION)
    assert other.name != encoded.name
    probe = encode_control_message(ControlState(1234, 2, 999, 1, asks_confirmation=True), keys=HQ,
                                   recipient="field1", incarnation=INCARNATION)
    assert probe.header.seq == 1 and MessageName.parse(probe.name).header.seq == 1
    assert decode(probe.data).control == ControlState(1234, 2, 999, 1, asks_confirmation=True)


def test_a_control_message_with_a_schema_version_is_version_3_and_only_then():
    plain = encode_control_message(ControlState(1234, 2, 999, 1), keys=HQ, recipient="field1",
                                   incarnation=INCARNATION)
    assert decode(plain.data).version == 1 and decode(plain.data).control.schema_version is None
    state = ControlState(1234, 2, 999, 1, schema_version=0)
    carrying = encode_control_message(state, keys=HQ, recipient="field1", incarnation=INCARNATION)
    message = decode(carrying.data)
    assert message.version == 3 and message.control == state and message.control.schema_version == 0
    # A version-3 control file of four counters reads as one with no schema version.
    four = decode(craft(kind=ord("C"), version=3, payload=msgpack.packb([1, 2, 3, 4]), header=Header(2, 0, 1)))
    assert four.control == ControlState(1, 2, 3, 4)
    with pytest.raises(InvalidValue, match="schema_version"):
        ControlState(1, 2, 3, 4, schema_version=-5)


def test_transactions_must_lie_in_the_header_range():
    with pytest.raises(InvalidValue):
        encode(sample_transactions(start=100), header=Header(0, 100, 120))
    with pytest.raises(InvalidValue):
        encode(list(reversed(sample_transactions())))
    with pytest.raises(InvalidValue):
        encode(sample_transactions(), header=Header(0, 100, 100, 0))  # a part header


@pytest.mark.parametrize("build, error, text", [
    (lambda: b"", CorruptMessage, "truncated"),
    (lambda: b"FSM", CorruptMessage, "truncated"),
    (lambda: b"PK\x03\x04" + bytes(200), CorruptMessage, "bad magic"),
    (lambda: craft(version=5), UnsupportedVersion, "version 5"),
    (lambda: craft(kind=ord("X")), CorruptMessage, "kind"),
    (lambda: craft(flags=0x80), CorruptMessage, "flags"),
    (lambda: craft(sender="stranger"), UnknownSender, "stranger"),
    (lambda: craft(recipient="field9"), WrongRecipient, "field9"),
    (lambda: craft(keys=OTHER), BadSignature, "signature"),
    (lambda: craft(raw_length=wire.MAX_PAYLOAD + 1), MessageTooLarge, "bomb"),
    (lambda: craft(raw_length=3), CorruptMessage, "declares"),
    (lambda: craft(stored=b"not zstd at all"), CorruptMessage, "zstd"),
    (lambda: craft(payload=b"\xc1"), CorruptMessage, "msgpack"),
    (lambda: craft(payload=msgpack.packb([[5, "hq", []]]), header=Header(0, 10, 20)), CorruptMessage, "outside"),
    (lambda: craft(payload=msgpack.packb([[15, "hq", [[1, 2]]]]), header=Header(0, 10, 20)), CorruptMessage,
     "malformed operation"),
    (lambda: craft(payload=msgpack.packb([["x", "hq", []]]), header=Header(0, 10, 20)), CorruptMessage,
     "malformed"),
    (lambda: craft(payload=msgpack.packb({"a": 1})), CorruptMessage, "array"),
    (lambda: craft(flags=wire.FLAG_PART), CorruptMessage, "part flag"),
    (lambda: craft(kind=ord("C"), payload=msgpack.packb([1, 2])), CorruptMessage, "four counters"),
    (lambda: craft(kind=ord("C"), payload=msgpack.packb([1, 2, -3, 4])), CorruptMessage, "control"),
    (lambda: craft(kind=ord("C"), payload=msgpack.packb([1, 2, 3, 4]), header=Header(2, 0, 1, 2)), CorruptMessage,
     "seq must be 0 or 1"),
    # The schema version: a fifth int, in version 3 only, an offset in 0..2^63-1.
    (lambda: craft(kind=ord("C"), payload=msgpack.packb([1, 2, 3, 4, 5])), CorruptMessage, "four counters$"),
    (lambda: craft(kind=ord("C"), version=2, payload=msgpack.packb([1, 2, 3, 4, 5])), CorruptMessage,
     "four counters$"),
    (lambda: craft(kind=ord("C"), version=3, payload=msgpack.packb([1, 2, 3, 4, 5, 6])), CorruptMessage,
     "perhaps a schema version"),
    (lambda: craft(kind=ord("C"), version=3, payload=msgpack.packb([1, 2, 3, 4, -1])), CorruptMessage,
     "schema_version must be an integer in 0..9223372036854775807, got -1"),
    (lambda: craft(kind=ord("C"), version=3, payload=msgpack.packb([1, 2, 3, 4, 2**63])), CorruptMessage,
     "schema_version must be"),
    (lambda: craft(kind=ord("C"), version=3, payload=msgpack.packb([1, 2, 3, 4, "923400"])), CorruptMessage,
     "schema_version must be"),
    (lambda: craft(kind=ord("C"), version=3, payload=msgpack.packb([1, 2, 3, 4, True])), CorruptMessage,
     "schema_version must be"),
    (lambda: craft(kind=ord("C"), flags=wire.FLAG_PART, header=Header(0, 1, 1)), CorruptMessage, "part"),
    (lambda: craft(flags=wire.FLAG_SEALED, stored=b"short"), CorruptMessage, "sealed payload is too short"),
    (lambda: craft(header=Header(0, 0, 1)).replace(b"hq", b"h\xff", 1), CorruptMessage, "sender name"),
])
def test_bad_files_raise_one_typed_error_naming_the_file(build, error, text):
    with pytest.raises(error, match=text) as raised:
        decode(build(), name="inbox/bad.fsm", recipient_keys=FIELD)
    assert str(raised.value).startswith("inbox/bad.fsm: ")
    assert isinstance(raised.value, MessageError)


def test_decompression_bomb_is_not_expanded():
    bomb = zstandard.ZstdCompressor(level=19).compress(bytes(wire.MAX_PAYLOAD + 1))
    assert len(bomb) < 50_000
    with pytest.raises(MessageTooLarge):
        decode(craft(stored=bomb, raw_length=wire.MAX_PAYLOAD + 1))
    # A frame that lies about its size is caught before it is expanded too.
    with pytest.raises(CorruptMessage, match="declares"):
        decode(craft(stored=bomb, raw_length=1000))


def test_oversized_file_is_refused_before_parsing():
    data = encode(sample_transactions()).data
    with pytest.raises(MessageTooLarge, match="over the 100-byte limit"):
        decode(data, max_file_size=100)


def test_out_of_range_integer_from_a_faulty_peer_is_caught_when_applied():
    payload = msgpack.packb([[15, "hq", [["t", 1, [2**64 - 1], None, {"a": True}]]]])
    message = decode(craft(payload=payload, header=Header(0, 10, 20)))
    with pytest.raises(InvalidValue):
        check_operation(message.transactions[0].ops[0])


def test_unknown_sender_even_with_valid_signature():
    data = encode(sample_transactions()).data
    with pytest.raises(UnknownSender):
        decode(data, keyring=Keyring([OTHER.public]))


def test_check_message_verifies_the_frame_without_opening_the_payload():
    from codec.message import check_message

    good = encode(sample_transactions(), seal_to=FIELD.public)
    checked = check_message(good.data, source="m", keyring=KEYRING, recipient="field1")
    assert checked.header == Header(0, 100, 200) and checked.sealed and checked.transactions is None
    # A signed file whose payload is not a zstd frame passes the frame check
    # but not decoding; a forged one fails both.
    bad_payload = craft(stored=b"not zstd at all")
    assert check_message(bad_payload, source="m", keyring=KEYRING, recipient="field1").kind.value == "d"
    with pytest.raises(CorruptMessage):
        decode(bad_payload)
    with pytest.raises(BadSignature) as forged:
        check_message(craft(keys=OTHER), source="m", keyring=KEYRING, recipient="field1")
    # The rejection names the incarnation the frame claims (to explain it, never to trust it).
    assert forged.value.claimed_incarnation == INCARNATION


def test_each_thread_compresses_with_its_own_zstd_objects():
    """python-zstandard's (de)compressors are not safe for simultaneous use:
    worker threads (and two agents in one process) each get their own, and
    messages made at once in many threads are those made one by one."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from codec.message import zstd_pair

    together_now = threading.Barrier(4)
    pairs = []

    def keep_this_threads_pair():
        together_now.wait()  # four threads alive at once
        pairs.append(zstd_pair())

    threads = [threading.Thread(target=keep_this_threads_pair) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({id(pair[0]) for pair in pairs}) == len({id(pair[1]) for pair in pairs}) == 4
    assert zstd_pair() is zstd_pair()
    transactions = sample_transactions()
    alone = [encode(transactions[: 1 + n % len(transactions)]).data for n in range(40)]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda n: encode(transactions[: 1 + n % len(transactions)]).data, range(40)))
    assert together == alone
    assert all(decode(data).transactions for data in together)

"""A transaction's ``applied`` (docs/message-format.md, version 4): the
recipient's log offset through which the sender had applied the
recipient's stream when it wrote a transaction of the recipient's origin."""

import hashlib

import msgpack
import pytest

from codec.errors import CorruptMessage, InvalidValue
from codec.header import Header
from codec.message import APPLIED_VERSION, decode_message, encode_data_message, serialize_entry
from codec.ops import Operation, PartialTransaction, Transaction, values_identical
from codec.packing import pack_messages
from codec.payloads import read_group, reassemble

from .golden import ADD_PHONE
from .helpers import FIELD, HQ, INCARNATION, KEYRING, craft, sample_transactions


def decode(data: bytes, name: str = "m.fsm"):
    return decode_message(data, source=name, keyring=KEYRING, recipient="field1", recipient_keys=FIELD)


def rows(count: int, start: int = 0) -> tuple:
    # Notes that compress poorly, so that a stream of them takes several messages.
    return tuple(Operation.insert("orders", (key,), {"id": key, "note": hashlib.sha256(b"%d" % key).hexdigest()})
                 for key in range(start, start + count))


def written_back(commit: int, applied: int | None = 77, count: int = 2) -> Transaction:
    return Transaction(commit, "field1", rows(count), applied)


def pack(transactions, **options):
    return list(pack_messages(transactions, keys=HQ, recipient="field1", incarnation=INCARNATION,
                              resend_count=0, start=100, **options))


def test_a_message_holding_a_transaction_with_applied_is_version_4_and_round_trips():
    stream = [*sample_transactions(100)[:1], written_back(120), sample_transactions(100)[1]]
    message = encode_data_message(stream, Header(0, 100, 130), keys=HQ, recipient="field1",
                                  incarnation=INCARNATION)
    decoded = decode(message.data)
    assert decoded.version == APPLIED_VERSION
    assert [transaction.applied for transaction in decoded.transactions] == [None, 77, None]
    assert all(values_identical(left, right) for left, right in zip(stream, decoded.transactions))
    assert decoded.transactions[1].ops == written_back(120).ops


def test_every_other_message_is_written_as_before_byte_for_byte():
    stream = [*sample_transactions(100)[:1], written_back(120, applied=None), sample_transactions(100)[1]]
    without = encode_data_message(stream, Header(0, 100, 130), keys=HQ, recipient="field1",
                                  incarnation=INCARNATION)
    plain = [Transaction(t.commit, t.origin, t.ops) for t in stream]
    assert without.data == encode_data_message(plain, Header(0, 100, 130), keys=HQ, recipient="field1",
                                               incarnation=INCARNATION).data
    assert decode(without.data).version == 2


def test_the_packer_writes_version_4_only_for_the_messages_that_hold_one():
    # Large enough that the stream takes several messages; the cut points do not change.
    filler = [Transaction(100 + index, "hq", rows(60, 1000 * index)) for index in range(1, 8)]
    with_applied = [*filler[:3], written_back(104 + 100, count=3), *filler[3:]]
    with_applied = sorted(with_applied, key=lambda t: t.commit)
    without = [Transaction(t.commit, t.origin, t.ops) for t in with_applied]
    made, plain = pack(with_applied, max_size=10_000), pack(without, max_size=10_000)
    assert [m.name for m in made] == [m.name for m in plain] and len(made) > 2
    versions = [decode(m.data).version for m in made]
    holding = [any(t.applied is not None for t in decode(m.data).transactions) for m in made]
    assert versions == [4 if held else 2 for held in holding] and holding.count(True) == 1
    assert [m.data for m, held in zip(made, holding) if not held] == [
        m.data for m, held in zip(plain, holding) if not held]


def test_a_stream_of_version_1_carries_no_applied():
    made = pack([written_back(120)], version=1)
    [message] = made
    decoded = decode(message.data)
    assert decoded.version == 1 and decoded.transactions[0].applied is None
    assert made[0].data == pack([written_back(120, applied=None)], version=1)[0].data


@pytest.mark.parametrize("pieces", [False, True])
def test_a_group_of_parts_carries_applied_in_every_entry_and_the_reader_has_it_first(pieces):
    big = written_back(500, applied=4242, count=25_000)
    if pieces:  # handed over in pieces (a large log transaction read in bounded memory)
        stream = [PartialTransaction(500, "field1", big.ops[:9_000], 4242),
                  PartialTransaction(500, "field1", big.ops[9_000:18_000], 4242),
                  Transaction(500, "field1", big.ops[18_000:], 4242)]
    else:
        stream = [big]
    made = pack(stream)
    parts = [decode(m.data, m.name) for m in made]
    assert all(part.is_part and part.version == APPLIED_VERSION for part in parts) and len(parts) > 1
    group = read_group(iter(parts))
    assert group.applied == 4242  # known before any operation is decoded
    assert list(group.ops) == list(big.ops)
    assert reassemble(parts).applied == 4242
    assert [m.data for m in made] == [m.data for m in pack([big])]


def payload(*entries) -> bytes:
    return msgpack.packb(list(entries), use_bin_type=True)


RUN = ["orders", 1, 1, [], ["id"], [[1, 1]]]


@pytest.mark.parametrize("applied", [0, -1, 2**63, "77", 7.0, None, True, [77]])
def test_a_malformed_applied_is_refused_with_one_line(applied):
    data = craft(version=4, payload=payload([120, "field1", applied, [RUN]]), header=Header(0, 100, 130))
    with pytest.raises(CorruptMessage) as raised:
        decode(data, "inbox/bad.fsm")
    text = str(raised.value)
    assert text.startswith("inbox/bad.fsm: ") and "\n" not in text
    assert "malformed" in text


@pytest.mark.parametrize("version", [1, 2, 3])
def test_an_older_version_refuses_a_transaction_of_four_elements(version):
    ops = [["orders", 1, [1], None, {"id": 1}]] if version == 1 else [RUN]
    data = craft(version=version, payload=payload([120, "field1", 77, ops]), header=Header(0, 100, 130))
    with pytest.raises(CorruptMessage, match="malformed transaction$"):
        decode(data)


def test_version_4_reads_transactions_of_three_and_four_elements():
    data = craft(version=4, payload=payload([110, "hq", [RUN]], [120, "field1", 9, [RUN]]),
                 header=Header(0, 100, 130))
    assert [(t.origin, t.applied) for t in decode(data).transactions] == [("hq", None), ("field1", 9)]


def test_a_schema_change_carries_no_applied():
    change = [0, [["drop_index", "orders", "orders_note"]], []]
    data = craft(version=4, payload=payload([120, "hq", 9, [change]]), header=Header(0, 100, 130))
    with pytest.raises(CorruptMessage, match="schema change"):
        decode(data)


def test_a_group_whose_entries_disagree_on_applied_is_refused():
    first = serialize_entry(500, "field1", rows(2), APPLIED_VERSION, 9)
    second = serialize_entry(500, "field1", rows(2, 2), APPLIED_VERSION, 10)
    data = [craft(version=4, flags=2, header=Header(0, 100, 100, 0), payload=first),
            craft(version=4, flags=2, header=Header(0, 100, 500, 1), payload=second)]
    group = read_group(iter([decode(part, f"p{index}") for index, part in enumerate(data)]))
    with pytest.raises(CorruptMessage, match="holds another transaction"):
        list(group.ops)


def test_a_transaction_s_applied_is_checked_where_it_is_built():
    with pytest.raises(InvalidValue, match="applied must be an int"):
        Transaction(5, "field1", (), 0)
    with pytest.raises(InvalidValue, match="applied must be an int"):
        written_back(5).with_applied("7")
    piece = PartialTransaction(5, "field1", ()).with_applied(7)
    assert type(piece) is PartialTransaction and piece.applied == 7
    assert written_back(5) != written_back(5, applied=78)
    with pytest.raises(InvalidValue, match="only format version 4"):
        serialize_entry(5, "field1", rows(1), 2, 7)


@pytest.mark.parametrize("version", [3, 4])
def test_a_schema_change_travels_alone_in_its_message_in_version_4_too(version):
    data = craft(version=version, payload=payload([110, "hq", [list(ADD_PHONE.wire())]], [120, "hq", [RUN]]),
                 header=Header(0, 100, 130))
    with pytest.raises(CorruptMessage, match="a schema change travels alone in its message"):
        decode(data)

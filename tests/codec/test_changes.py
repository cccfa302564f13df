"""Schema changes in data messages, format version 3 (codec.changes;
docs/message-format.md, "Schema changes")."""

from __future__ import annotations

import msgpack
import pytest

from codec.changes import MAX_CHANGE_BYTES, SchemaChange, check_change
from codec.errors import CorruptMessage, InvalidValue
from codec.header import Header
from codec.message import decode_message, encode_data_message, serialize_transaction
from codec.ops import Operation, Transaction, change_of
from codec.packing import MessagePacker, PayloadPacker, pack_messages
from codec.payloads import read_group

from .helpers import FIELD, HQ, INCARNATION, KEYRING, craft

ADD = SchemaChange((("add_column", "customer", "phone", '"phone" TEXT'),),
                   (("customer", ("id", "name", "phone"), ("id",)),))


def data(commit: int, key: int = 1) -> Transaction:
    return Transaction(commit, "hq", (Operation.insert("customer", (key,), {"id": key, "name": f"n{key}"}),))


def decode(data_bytes: bytes, name: str = "m.fsm"):
    return decode_message(data_bytes, source=name, keyring=KEYRING, recipient="field1", recipient_keys=FIELD,
                          runs=True)


def entry(commit: int, items: list) -> bytes:
    return msgpack.packb([[commit, "hq", items]], use_bin_type=True)


@pytest.mark.parametrize("value, problem", [
    (((), ADD.shapes), "has no step"),
    (((("truncate_table", "customer"),), ADD.shapes), "unknown step"),
    (((("rename_table", "customer"),), ADD.shapes), "malformed rename_table"),
    (((("rename_table", "customer", "client"),), ADD.shapes), "exactly the tables"),
    (((("add_column", "customer", "phone"),), ADD.shapes), "malformed add_column"),
    (((("add_column", "customer", "", "x"),), ADD.shapes), "malformed add_column"),
    (((("drop_column", "customer", None),), ADD.shapes), "malformed drop_column"),
    ((ADD.steps, ()), "exactly the tables"),
    ((ADD.steps, ADD.shapes + (("visit", ("id",), ("id",)),)), "exactly the tables"),
    ((ADD.steps, (("customer", ("id", "id"), ("id",)),)), "malformed shape"),
    ((ADD.steps, (("customer", ("id", "name"), ("key",)),)), "malformed shape"),
    ((ADD.steps, (("customer", ("id",), ("id",)), ("CUSTOMER", ("id",), ("id",)))), "two shapes"),
    (((("passthrough", "field1"),), ()), "malformed passthrough"),
    (((("passthrough", "field1", ""),), ()), "malformed passthrough"),
    (((("passthrough", "", "DELETE FROM visit"),), ()), "malformed passthrough"),
    (((("passthrough", "field1", "DELETE FROM visit"),), ADD.shapes), "exactly the tables"),
    (((("drop_article", "customer"),), ()), "malformed drop_article"),
    (((("drop_article", "customer", None),), ()), "malformed drop_article"),
    (((("drop_article", "customer", "sales"),), ADD.shapes), "exactly the tables"),
])
def test_a_malformed_change_is_refused_naming_the_problem(value, problem):
    with pytest.raises(InvalidValue, match=problem):
        check_change(value)


def test_a_renamed_table_is_named_by_its_new_name_after_the_step():
    """A rename_table step's shape, and the steps after it, name the table
    by its new name; the old name names no shape."""
    steps = (("add_column", "customer", "phone", '"phone" TEXT'), ("rename_table", "customer", "client"),
             ("drop_column", "client", "phone"))
    change = check_change((steps, (("client", ("id", "name"), ("id",)),)))
    assert change.tables() == ("client",)
    with pytest.raises(InvalidValue, match="exactly the tables"):
        check_change((steps, (("customer", ("id", "name"), ("id",)), ("client", ("id", "name"), ("id",)))))


def test_a_passthrough_step_names_a_site_and_no_table_so_it_has_no_shape():
    change = check_change(((("passthrough", "field1", "UPDATE customer SET name = 'x' WHERE id = 1"),), ()))
    assert change.steps[0][1] == "field1" and change.tables() == ()


def test_a_drop_article_step_leaves_its_table_as_it_is_so_it_has_no_shape():
    change = check_change(((("drop_article", "customer", "sales"), ("add_column", "visit", "at", '"at" TEXT')),
                           (("visit", ("id", "at"), ("id",)),)))
    assert change.tables() == ("visit",)


def test_a_create_table_may_name_no_subscribe_by_column():
    change = check_change(((("create_table", "visit", "CREATE TABLE visit (id INTEGER PRIMARY KEY)", "sales",
                             None),), (("visit", ("id",), ("id",)),)))
    assert change.tables() == ("visit",)


def test_a_transaction_holds_a_change_alone():
    assert change_of(Transaction(5, "hq", (ADD,))) == ADD
    assert change_of(data(5)) is None
    with pytest.raises(InvalidValue):
        Transaction(5, "hq", (ADD, Operation.insert("customer", (1,), {"id": 1})))


@pytest.mark.parametrize("version", [1, 2])
def test_only_version_3_can_carry_a_change(version):
    with pytest.raises(InvalidValue, match="only format version 3"):
        serialize_transaction(Transaction(5, "hq", (ADD,)), version)


def test_a_change_travels_alone_in_its_message():
    with pytest.raises(InvalidValue, match="alone in its message"):
        encode_data_message([data(3), Transaction(5, "hq", (ADD,))], Header(0, 0, 5), keys=HQ, recipient="field1",
                            incarnation=INCARNATION, version=3)


@pytest.mark.parametrize("version", [1, 2])
def test_the_packer_cuts_around_a_change_and_writes_it_in_version_3(version):
    stream = [data(10, 1), data(11, 2), Transaction(20, "hq", (ADD,)), data(30, 3), data(31, 4)]
    files = list(pack_messages(stream, keys=HQ, recipient="field1", incarnation=INCARNATION, resend_count=0,
                               start=0, end=40, version=version))
    decoded = [decode(f.data, f.name) for f in files]
    assert [(str(m.header), m.version) for m in decoded] == [
        ("(0-0000000000-0000000011-0)", version), ("(0-0000000011-0000000020-0)", 3),
        ("(0-0000000020-0000000040-0)", version)]
    assert decoded[1].transactions[0].ops == (ADD,)
    # The data around it is what the same data makes without the change, byte for byte.
    plain = list(pack_messages(stream[:2], keys=HQ, recipient="field1", incarnation=INCARNATION, resend_count=0,
                               start=0, version=version))
    assert plain[0].data == files[0].data


def test_pushed_transactions_make_the_same_files_as_pulled_ones():
    stream = [data(10, 1), Transaction(20, "hq", (ADD,)), Transaction(21, "hq", (ADD,)), data(30, 3)]
    pulled = list(pack_messages(stream, keys=HQ, recipient="field1", incarnation=INCARNATION, resend_count=2,
                                start=0, end=30))
    packer = MessagePacker(keys=HQ, recipient="field1", incarnation=INCARNATION, resend_count=2, start=0, end=30)
    pushed = [message for transaction in stream for message in packer.add(transaction)] + packer.close()
    assert [(m.name, m.data) for m in pushed] == [(m.name, m.data) for m in pulled]
    payloads = PayloadPacker(sender="hq", recipient="field1", resend_count=2, start=0, end=30)
    made = [payload for transaction in stream for payload in payloads.add(transaction)] + payloads.close()
    assert [payload.version for payload in made] == [2, 3, 3, 2]


def test_a_change_over_the_limit_is_refused_by_the_packer():
    big = SchemaChange((("add_column", "customer", "phone", '"phone" TEXT DEFAULT ' + "'" + "x" * MAX_CHANGE_BYTES
                         + "'"),), ADD.shapes)
    with pytest.raises(InvalidValue, match="over the 8192-byte limit"):
        list(pack_messages([Transaction(5, "hq", (big,))], keys=HQ, recipient="field1", incarnation=INCARNATION,
                           resend_count=0, start=0))


RUN = ["customer", 1, 1, [], ["id", "name"], [[1, 1, "a"]]]
WIRE = [0, [list(step) for step in ADD.steps], [["customer", ["id", "name", "phone"], ["id"]]]]


@pytest.mark.parametrize("version, payload, problem", [
    (2, entry(5, [WIRE]), "malformed run"),
    (3, entry(5, [WIRE, RUN]), "malformed schema change"),
    (3, entry(5, [RUN, WIRE]), "malformed run"),
    (3, entry(5, [[1, WIRE[1], WIRE[2]]]), "malformed schema change"),
    (3, entry(5, [[0, [["drop_table", "customer"]], WIRE[2]]]), "unknown step"),
    (3, entry(5, [[0, WIRE[1], []]]), "exactly the tables"),
    (3, msgpack.packb([[4, "hq", [RUN]], [5, "hq", [WIRE]]]), "alone in its message"),
])
def test_the_reader_refuses_a_change_out_of_its_form(version, payload, problem):
    with pytest.raises(CorruptMessage, match=problem):
        decode(craft(version=version, header=Header(0, 0, 9), payload=payload))


def test_a_change_decodes_in_both_forms():
    file = craft(version=3, header=Header(0, 0, 9), payload=entry(5, [WIRE]))
    for runs in (True, False):
        message = decode_message(file, source="m", keyring=KEYRING, recipient="field1", runs=runs)
        assert message.version == 3 and message.transactions[0].ops == (ADD,)


def test_a_change_never_travels_in_parts():
    payload = entry(5, [WIRE])[1:]  # the entry itself, as a group's payload holds it

    class Part:
        header = Header(0, 0, 5, 0)
        version = 3
        part = payload

    group = read_group(iter([Part()]))
    with pytest.raises(CorruptMessage, match="malformed run"):
        list(group.ops)

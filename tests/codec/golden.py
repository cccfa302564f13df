"""Golden message files of every format version.

``python -m tests.codec.golden --write --version N`` made
``fixtures/messages/vN/`` once; the files are never regenerated.  A format
change gets a new version folder, and the tests keep decoding every old
one.  Every folder holds the same content; a control message is written in
version 1 whatever the folder (its bytes did not change in version 2).
Version 3 adds schema changes: ``--schema`` made ``fixtures/messages/schema/``,
a stream in which two of them travel between data messages; passthrough
SQL: ``--passthrough`` made ``fixtures/messages/passthrough/``; a table
renamed: ``--rename-table`` made ``fixtures/messages/rename-table/``; an
article removed: ``--drop-article`` made ``fixtures/messages/drop-article/``; and a
control message's schema version: ``--control-schema`` made
``fixtures/messages/control-schema/``.  Version 4 adds a transaction's
``applied``: ``--written-back`` made ``fixtures/messages/written-back/``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from codec.changes import SchemaChange
from codec.header import Header
from codec.keys import SiteKeys
from codec.message import ControlState, encode_control_message, encode_data_message
from codec.ops import Operation, Transaction
from codec.packing import pack_messages

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "messages"
VERSIONS = (1, 2, 3)
ROOT = FIXTURES / "v1"


def folder(version: int) -> Path:
    return FIXTURES / f"v{version}"
HQ = SiteKeys.from_seeds("hq", bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60"),
                         bytes.fromhex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a"))
FIELD = SiteKeys.from_seeds("field1",
                            bytes.fromhex("4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb"),
                            bytes.fromhex("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb"))
INCARNATION = bytes.fromhex("6669656c6473796e632d676f6c64656e")


def transactions() -> list[Transaction]:
    return [
        Transaction(923_357, "hq", (
            Operation.insert("customer", (1,), {"id": 1, "name": "Ana Silva", "city": "Porto", "balance": 1250.5,
                                                "photo": b"\x89PNG\x00\xff", "note": None}),
            Operation.insert("customer", (2,), {"id": 2, "name": "Hiro Tanaka ✓ 𝄞", "city": "Osaka",
                                                "balance": float("nan"), "photo": b"", "note": "-0.0 next"}),
            Operation.update("customer", (2,), {"balance": float("nan")}, {"balance": -0.0}),
        )),
        Transaction(942_712, "field2", (
            Operation.delete("order_line", (7, "A"), {"order_id": 7, "line": "A", "qty": 9_223_372_036_854_775_807,
                                                      "price": float("-inf")}),
        )),
    ]


def big_transaction() -> Transaction:
    # Deterministic, poorly compressible content so it needs several 10,000-byte parts.
    state = 12345
    ops = []
    for row in range(24):
        chunk = bytearray()
        for _ in range(1500):
            state = (state * 6364136223846793005 + 1442695040888963407) % 2**64
            chunk.append(state >> 56)
        ops.append(Operation.insert("attachment", (row,), {"id": row, "data": bytes(chunk)}))
    return Transaction(1_119_170, "hq", tuple(ops))


def build(version: int) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    single = encode_data_message(transactions(), Header(0, 923_200, 942_712), keys=HQ, recipient="field1",
                                 incarnation=INCARNATION, version=version)
    files[single.name] = single.data
    for part in pack_messages([big_transaction()], keys=HQ, recipient="field1", incarnation=INCARNATION,
                              resend_count=0, start=942_712, max_size=10_000, version=version):
        files[part.name] = part.data
    sealed = encode_data_message(transactions()[:1], Header(1, 923_200, 923_357), keys=HQ, recipient="field1",
                                 incarnation=INCARNATION, seal_to=FIELD.public, version=version)
    files[sealed.name] = sealed.data
    control = encode_control_message(ControlState(log_received=4711, rereceive_count=2, log_sent=942_712,
                                                  resend_count=1), keys=HQ, recipient="field1",
                                     incarnation=INCARNATION)
    files[control.name] = control.data
    return files


def tag(value: object) -> object:
    """JSON form of a SQLite value that keeps every distinction."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError("bool is not a SQLite value")
    if isinstance(value, int):
        return {"int": str(value)}
    if isinstance(value, float):
        if math.isnan(value):
            return {"float": "nan"}
        return {"float": repr(value)}
    if isinstance(value, str):
        return {"text": value}
    if isinstance(value, bytes):
        return {"blob": value.hex()}
    raise TypeError(type(value))


def transaction_json(transaction: Transaction) -> dict:
    return {
        "commit": transaction.commit,
        "origin": transaction.origin,
        "ops": [{"table": t, "kind": k, "key": [tag(v) for v in key],
                 "before": None if b is None else {c: tag(v) for c, v in b.items()},
                 "after": None if a is None else {c: tag(v) for c, v in a.items()}}
                for t, k, key, b, a in transaction.ops],
    }


def expected(version: int) -> dict:
    return {
        "format_version": version,
        "incarnation": INCARNATION.hex(),
        "single": {"header": "(0-0000923200-0000942712-0)",
                   "transactions": [transaction_json(t) for t in transactions()]},
        "multi_part": {"headers_first_last": ["(0-0000942712-0000942712-0)", "(0-0000942712-0001119170-"],
                       "transaction": transaction_json(big_transaction())},
        "sealed": {"header": "(1-0000923200-0000923357-0)",
                   "transactions": [transaction_json(transactions()[0])]},
        "control": {"log_received": 4711, "rereceive_count": 2, "log_sent": 942_712, "resend_count": 1},
    }


def write(version: int, force: bool) -> None:
    _write_folder(folder(version), build(version), expected(version), force)


def _write_folder(root: Path, files: dict[str, bytes], content: dict, force: bool) -> None:
    if root.exists() and any(root.iterdir()) and not force:
        raise SystemExit(f"{root} exists: golden files are never regenerated (make a new version folder)")
    root.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (root / name).write_bytes(data)
    (root / "hq.pub").write_text(HQ.public.to_line() + "\n")
    (root / "field1.pub").write_text(FIELD.public.to_line() + "\n")
    FIELD.save(root / "field1.key")  # throw-away test key, to open the sealed file
    (root / "expected.json").write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n")


# A control message that asks for a confirmation (a probe, header seq 1):
# ``python -m tests.codec.golden --write --probe`` made fixtures/messages/probe/ once.
PROBE = FIXTURES / "probe"
PROBE_STATE = ControlState(log_received=4711, rereceive_count=2, log_sent=942_712, resend_count=1,
                           asks_confirmation=True)


def build_probe() -> dict[str, bytes]:
    probe = encode_control_message(PROBE_STATE, keys=HQ, recipient="field1", incarnation=INCARNATION)
    return {probe.name: probe.data}


def expected_probe() -> dict:
    return {"incarnation": INCARNATION.hex(), "header": "(2-0000000000-0000004711-1)",
            "control": {"log_received": 4711, "rereceive_count": 2, "log_sent": 942_712, "resend_count": 1,
                        "asks_confirmation": True}}


def write_probe(force: bool) -> None:
    _write_control_folder(PROBE, build_probe(), expected_probe(), HQ, force)


def _write_control_folder(root: Path, files: dict[str, bytes], content: dict, sender: SiteKeys,
                          force: bool) -> None:
    """A folder of one control message, its sender's public key and its content."""
    if root.exists() and any(root.iterdir()) and not force:
        raise SystemExit(f"{root} exists: golden files are never regenerated")
    root.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (root / name).write_bytes(data)
    (root / f"{sender.site}.pub").write_text(sender.public.to_line() + "\n")
    (root / "expected.json").write_text(json.dumps(content, indent=2) + "\n")


# Schema changes in a stream (format version 3): ``python -m tests.codec.golden
# --write --schema`` made fixtures/messages/schema/ once.
SCHEMA = FIXTURES / "schema"
ADD_PHONE = SchemaChange(
    (("add_column", "customer", "phone", "\"phone\" TEXT DEFAULT ''"),
     ("rename_column", "customer", "city", "town"),
     ("drop_column", "customer", "note"),
     ("drop_index", "customer", "customer_city"),
     ("create_index", "customer", "customer_town", "CREATE INDEX customer_town ON customer (town)")),
    (("customer", ("id", "name", "town", "balance", "photo", "phone"), ("id",)),))
CREATE_VISIT = SchemaChange(
    (("create_table", "visit", "CREATE TABLE visit (id INTEGER PRIMARY KEY, customer INTEGER NOT NULL, at TEXT)",
      "sales", None),
     ("create_index", "visit", "visit_customer", "CREATE INDEX visit_customer ON visit (customer)")),
    (("visit", ("id", "customer", "at"), ("id",)),))


def schema_stream() -> list[Transaction]:
    """Data in the old shape, a change, data in the new shape, a new table."""
    return [
        transactions()[0],
        Transaction(923_400, "hq", (ADD_PHONE,)),
        Transaction(923_500, "hq", (
            Operation.insert("customer", (3,), {"id": 3, "name": "Ines", "town": "Braga", "balance": 0.0,
                                                "photo": None, "phone": "+351 253 000 000"}),
            Operation.update("customer", (1,), {"town": "Porto"}, {"town": "Lisboa"}),
        )),
        Transaction(923_600, "hq", (CREATE_VISIT,)),
        Transaction(923_650, "hq", (Operation.insert("visit", (1,), {"id": 1, "customer": 3, "at": "2026-03-02"}),)),
    ]


def build_schema() -> dict[str, bytes]:
    files = {message.name: message.data
             for message in pack_messages(schema_stream(), keys=HQ, recipient="field1", incarnation=INCARNATION,
                                          resend_count=0, start=923_200, max_size=10_000, end=923_700)}
    sealed = encode_data_message(schema_stream()[1:2], Header(1, 923_357, 923_400), keys=HQ, recipient="field1",
                                 incarnation=INCARNATION, seal_to=FIELD.public, version=3)
    files[sealed.name] = sealed.data
    return files


def change_json(change: SchemaChange) -> dict:
    return {"steps": [list(step) for step in change.steps],
            "shapes": [[table, list(columns), list(key)] for table, columns, key in change.shapes]}


def expected_schema() -> dict:
    stream = schema_stream()

    def entry(transaction: Transaction) -> dict:
        if len(transaction.ops) == 1 and type(transaction.ops[0]) is SchemaChange:
            return {"commit": transaction.commit, "origin": transaction.origin,
                    "change": change_json(transaction.ops[0])}
        return transaction_json(transaction)

    return {
        "incarnation": INCARNATION.hex(),
        "stream": [
            {"header": "(0-0000923200-0000923357-0)", "version": 2, "transactions": [entry(stream[0])]},
            {"header": "(0-0000923357-0000923400-0)", "version": 3, "transactions": [entry(stream[1])]},
            {"header": "(0-0000923400-0000923500-0)", "version": 2, "transactions": [entry(stream[2])]},
            {"header": "(0-0000923500-0000923600-0)", "version": 3, "transactions": [entry(stream[3])]},
            {"header": "(0-0000923600-0000923700-0)", "version": 2, "transactions": [entry(stream[4])]},
        ],
        "sealed": {"header": "(1-0000923357-0000923400-0)", "version": 3, "transactions": [entry(stream[1])]},
    }


def write_schema(force: bool) -> None:
    _write_folder(SCHEMA, build_schema(), expected_schema(), force)


# Passthrough SQL to one remote (format version 3): ``python -m
# tests.codec.golden --write --passthrough`` made fixtures/messages/passthrough/ once.
PASSTHROUGH = FIXTURES / "passthrough"
FIX_CITY = SchemaChange(
    (("passthrough", "field1", "UPDATE customer SET town = 'Braga' WHERE id = 3"),
     ("passthrough", "field1", "DELETE FROM visit WHERE at < '2026-01-01'")),
    ())


def passthrough_stream() -> list[Transaction]:
    """Data, passthrough SQL for field1, data."""
    return [transactions()[0], Transaction(923_400, "hq", (FIX_CITY,)), schema_stream()[2]]


def build_passthrough() -> dict[str, bytes]:
    return _build_around_change(passthrough_stream())


def expected_passthrough() -> dict:
    return _expected_around_change(passthrough_stream())


def _build_around_change(stream: list[Transaction]) -> dict[str, bytes]:
    """The files of a stream of data, one change at 923,400, data."""
    return {message.name: message.data
            for message in pack_messages(stream, keys=HQ, recipient="field1", incarnation=INCARNATION,
                                         resend_count=0, start=923_200, max_size=10_000, end=923_500)}


def _expected_around_change(stream: list[Transaction]) -> dict:
    change = stream[1].ops[0]
    entries = [{"commit": stream[1].commit, "origin": stream[1].origin, "change": change_json(change)}]
    return {
        "incarnation": INCARNATION.hex(),
        "stream": [
            {"header": "(0-0000923200-0000923357-0)", "version": 2, "transactions": [transaction_json(stream[0])]},
            {"header": "(0-0000923357-0000923400-0)", "version": 3, "transactions": entries},
            {"header": "(0-0000923400-0000923500-0)", "version": 2, "transactions": [transaction_json(stream[2])]},
        ],
    }


def write_passthrough(force: bool) -> None:
    _write_folder(PASSTHROUGH, build_passthrough(), expected_passthrough(), force)


# A published table renamed (format version 3): ``python -m tests.codec.golden
# --write --rename-table`` made fixtures/messages/rename-table/ once.
RENAME = FIXTURES / "rename-table"
RENAME_CUSTOMER = SchemaChange(
    (("rename_table", "customer", "client"),
     ("add_column", "client", "phone", "\"phone\" TEXT")),
    (("client", ("id", "name", "city", "balance", "photo", "note", "phone"), ("id",)),))


def rename_stream() -> list[Transaction]:
    """Data under the old name, the rename, data under the new name."""
    return [transactions()[0], Transaction(923_400, "hq", (RENAME_CUSTOMER,)),
            Transaction(923_500, "hq", (Operation.update("client", (1,), {"city": "Porto", "phone": None},
                                                         {"city": "Braga", "phone": "+351 253 000 000"}),))]


def build_rename() -> dict[str, bytes]:
    return _build_around_change(rename_stream())


def expected_rename() -> dict:
    return _expected_around_change(rename_stream())


def write_rename(force: bool) -> None:
    _write_folder(RENAME, build_rename(), expected_rename(), force)


# An article removed at the consolidated (format version 3): ``python -m
# tests.codec.golden --write --drop-article`` made fixtures/messages/drop-article/
# once.
DROP = FIXTURES / "drop-article"
DROP_CUSTOMER = SchemaChange((("drop_article", "customer", "sales"),), ())


def drop_stream() -> list[Transaction]:
    """Data of the table, its article removed, then data of another table."""
    return [transactions()[0], Transaction(923_400, "hq", (DROP_CUSTOMER,)),
            Transaction(923_500, "hq", (Operation.insert("line", (1, 7), {"order_id": 7, "line_no": 1, "sku": "A"}),))]


def build_drop() -> dict[str, bytes]:
    return _build_around_change(drop_stream())


def expected_drop() -> dict:
    return _expected_around_change(drop_stream())


def write_drop(force: bool) -> None:
    _write_folder(DROP, build_drop(), expected_drop(), force)


# A remote's control message carrying its schema version (format version 3):
# ``python -m tests.codec.golden --write --control-schema`` made
# fixtures/messages/control-schema/ once.
CONTROL_SCHEMA = FIXTURES / "control-schema"
CONTROL_SCHEMA_STATE = ControlState(log_received=923_400, rereceive_count=0, log_sent=17, resend_count=0,
                                    schema_version=923_400)


def build_control_schema() -> dict[str, bytes]:
    control = encode_control_message(CONTROL_SCHEMA_STATE, keys=FIELD, recipient="hq", incarnation=INCARNATION)
    return {control.name: control.data}


def expected_control_schema() -> dict:
    return {"incarnation": INCARNATION.hex(), "header": "(0-0000000000-0000923400-0)", "version": 3,
            "control": {"log_received": 923_400, "rereceive_count": 0, "log_sent": 17, "resend_count": 0,
                        "asks_confirmation": False, "schema_version": 923_400}}


def write_control_schema(force: bool) -> None:
    _write_control_folder(CONTROL_SCHEMA, build_control_schema(), expected_control_schema(), FIELD, force)


# Rows written back to their origin with ``applied`` (format version 4):
# ``python -m tests.codec.golden --write --written-back`` made
# fixtures/messages/written-back/ once.
WRITTEN_BACK = FIXTURES / "written-back"


def written_back_transactions() -> list[Transaction]:
    """A transaction of hq's and one of field1's rows written back to it."""
    return [transactions()[0],
            Transaction(923_400, "field1", (
                Operation.update("customer", (1,), {"city": "Braga"}, {"city": "Porto"}),
                Operation.insert("customer", (4,), {"id": 4, "name": "Rui", "city": "Faro", "balance": 0.0,
                                                    "photo": None, "note": None}),
                Operation.delete("order_line", (9, "B"), {"order_id": 9, "line": "B", "qty": 1, "price": 2.5}),
            ), applied=923_300)]


def big_written_back() -> Transaction:
    big = big_transaction()
    return Transaction(1_119_170, "field1", big.ops, applied=923_400)


def build_written_back() -> dict[str, bytes]:
    single = encode_data_message(written_back_transactions(), Header(0, 923_200, 923_400), keys=HQ,
                                 recipient="field1", incarnation=INCARNATION)
    files = {single.name: single.data}
    for part in pack_messages([big_written_back()], keys=HQ, recipient="field1", incarnation=INCARNATION,
                              resend_count=0, start=942_712, max_size=10_000):
        files[part.name] = part.data
    return files


def written_back_json(transaction: Transaction) -> dict:
    return {**transaction_json(transaction), "applied": transaction.applied}


def expected_written_back() -> dict:
    return {"incarnation": INCARNATION.hex(), "version": 4,
            "single": {"header": "(0-0000923200-0000923400-0)",
                       "transactions": [written_back_json(t) for t in written_back_transactions()]},
            "multi_part": {"headers_first_last": ["(0-0000942712-0000942712-0)", "(0-0000942712-0001119170-"],
                           "transaction": written_back_json(big_written_back())}}


def write_written_back(force: bool) -> None:
    _write_folder(WRITTEN_BACK, build_written_back(), expected_written_back(), force)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--force", action="store_true")
    parser.add_argument("--version", type=int, choices=VERSIONS)
    parser.add_argument("--probe", action="store_true", help="the probe control message")
    parser.add_argument("--schema", action="store_true", help="a stream with schema changes (version 3)")
    parser.add_argument("--control-schema", action="store_true",
                        help="a control message with a schema version (version 3)")
    parser.add_argument("--passthrough", action="store_true", help="passthrough SQL to one remote (version 3)")
    parser.add_argument("--rename-table", action="store_true", help="a published table renamed (version 3)")
    parser.add_argument("--drop-article", action="store_true", help="an article removed (version 3)")
    parser.add_argument("--written-back", action="store_true",
                        help="rows written back to their origin, with applied (version 4)")
    arguments = parser.parse_args()
    if not arguments.write or [arguments.version is not None, arguments.probe, arguments.schema,
                               arguments.control_schema, arguments.passthrough,
                               arguments.rename_table, arguments.drop_article,
                               arguments.written_back].count(True) != 1:
        parser.print_help()
        sys.exit(2)
    if arguments.probe:
        write_probe(arguments.force)
    elif arguments.control_schema:
        write_control_schema(arguments.force)
    elif arguments.schema:
        write_schema(arguments.force)
    elif arguments.passthrough:
        write_passthrough(arguments.force)
    elif arguments.rename_table:
        write_rename(arguments.force)
    elif arguments.drop_article:
        write_drop(arguments.force)
    elif arguments.written_back:
        write_written_back(arguments.force)
    else:
        write(arguments.version, arguments.force)

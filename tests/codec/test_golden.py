"""The golden files of every format version decode forever."""

import json

import pytest

from codec.keys import Keyring, PublicKeys, SiteKeys
from codec.message import decode_message
from codec.payloads import reassemble
from codec.names import Kind, MessageName

from . import golden

ROOT = golden.ROOT
VERSIONS = pytest.mark.parametrize("version", golden.VERSIONS)


def load_keys(root=ROOT):
    keyring = Keyring([PublicKeys.from_line((root / "hq.pub").read_text())])
    # git does not keep file modes, so read the throw-away key without the permission check.
    field = SiteKeys.from_text((root / "field1.key").read_text(), "field1.key")
    assert field.public == PublicKeys.from_line((root / "field1.pub").read_text())
    return keyring, field


def decode_all(root):
    keyring, field = load_keys(root)
    decoded = {}
    for path in sorted(root.glob("*.fsm")):
        decoded[path.name] = decode_message(path.read_bytes(), source=path.name, keyring=keyring,
                                            recipient="field1", recipient_keys=field)
    return decoded


@VERSIONS
def test_golden_files_decode_to_the_expected_content(version):
    root = golden.folder(version)
    expected = json.loads((root / "expected.json").read_text())
    assert expected["format_version"] == version
    decoded = decode_all(root)
    assert {message.version for message in decoded.values() if message.kind is Kind.DATA} == {version}
    assert {message.version for message in decoded.values() if message.kind is Kind.CONTROL} == {1}
    by_kind = {"single": [], "parts": [], "sealed": [], "control": []}
    for name, message in decoded.items():
        assert MessageName.parse(name).header == message.header
        assert message.incarnation.hex() == expected["incarnation"]
        if message.kind is Kind.CONTROL:
            by_kind["control"].append(message)
        elif message.sealed:
            by_kind["sealed"].append(message)
        elif message.is_part:
            by_kind["parts"].append(message)
        else:
            by_kind["single"].append(message)
    [single] = by_kind["single"]
    assert str(single.header) == expected["single"]["header"]
    assert [golden.transaction_json(t) for t in single.transactions] == expected["single"]["transactions"]
    [sealed] = by_kind["sealed"]
    assert str(sealed.header) == expected["sealed"]["header"]
    assert [golden.transaction_json(t) for t in sealed.transactions] == expected["sealed"]["transactions"]
    [control] = by_kind["control"]
    assert {
        "log_received": control.control.log_received, "rereceive_count": control.control.rereceive_count,
        "log_sent": control.control.log_sent, "resend_count": control.control.resend_count,
    } == expected["control"]
    parts = sorted(by_kind["parts"], key=lambda m: m.header)
    assert len(parts) >= 3
    first, last_prefix = expected["multi_part"]["headers_first_last"]
    assert str(parts[0].header) == first and str(parts[-1].header).startswith(last_prefix)
    assert all(p.header.prev == p.header.last for p in parts[:-1])
    assert golden.transaction_json(reassemble(parts)) == expected["multi_part"]["transaction"]


@VERSIONS
def test_expected_json_describes_the_fixture_content(version):
    # Guards the JSON itself against drift from the fixture's source values.
    root = golden.folder(version)
    assert json.loads((root / "expected.json").read_text()) == json.loads(json.dumps(golden.expected(version)))


@VERSIONS
def test_today_encoder_still_writes_each_version_s_files_that_match(version):
    """Same content, same keys: the names match, and the payload bytes under the
    compression match too (serialization is stable).  Compressed bytes may only
    differ if the zstd library changes its output; the files must still decode."""
    check_rebuilt(golden.folder(version), golden.build(version), golden.transaction_json)


def check_rebuilt(root, rebuilt, as_json):
    """The files today's encoder makes have the stored names and headers,
    and decode to the same content (NaN compared through ``as_json``)."""
    keyring, field = load_keys(root)
    assert sorted(rebuilt) == sorted(p.name for p in root.glob("*.fsm"))
    for name, data in rebuilt.items():
        old = (root / name).read_bytes()
        assert data[:60] == old[:60]
        fresh = decode_message(data, source=name, keyring=keyring, recipient="field1", recipient_keys=field)
        stored = decode_message(old, source=name, keyring=keyring, recipient="field1", recipient_keys=field)
        same = fresh.transactions is not None and fresh.version == stored.version and (
            list(map(as_json, fresh.transactions)) == list(map(as_json, stored.transactions)))
        assert fresh == stored or same


@pytest.mark.parametrize("version_folder", sorted(p.name for p in ROOT.parent.iterdir() if p.is_dir()))
def test_every_version_folder_has_expected_content(version_folder):
    folder = ROOT.parent / version_folder
    assert (folder / "expected.json").exists() and list(folder.glob("*.fsm"))


def _control_file(root, expected_content, sender, recipient):
    """The one control message of ``root``, decoded, and its expected.json
    (which must be what the generator says)."""
    expected = json.loads((root / "expected.json").read_text())
    assert expected == json.loads(json.dumps(expected_content))
    keyring = Keyring([PublicKeys.from_line((root / f"{sender}.pub").read_text())])
    [path] = root.glob("*.fsm")
    message = decode_message(path.read_bytes(), source=path.name, keyring=keyring, recipient=recipient)
    assert message.kind is Kind.CONTROL
    assert str(message.header) == expected["header"] == str(MessageName.parse(path.name).header)
    return path, message, expected


def test_the_probe_control_file_decodes_asking_for_a_confirmation():
    path, message, expected = _control_file(golden.PROBE, golden.expected_probe(), "hq", "field1")
    assert message.version == 1
    control = message.control
    assert {"log_received": control.log_received, "rereceive_count": control.rereceive_count,
            "log_sent": control.log_sent, "resend_count": control.resend_count,
            "asks_confirmation": control.asks_confirmation} == expected["control"]
    # Today's encoder writes the same file, byte for byte (a control message has no clock).
    assert golden.build_probe() == {path.name: path.read_bytes()}


def _schema_entry(transaction) -> dict:
    if len(transaction.ops) == 1 and type(transaction.ops[0]) is golden.SchemaChange:
        return {"commit": transaction.commit, "origin": transaction.origin,
                "change": golden.change_json(transaction.ops[0])}
    return golden.transaction_json(transaction)


def test_the_schema_change_stream_decodes_to_the_expected_content():
    root = golden.SCHEMA
    expected = json.loads((root / "expected.json").read_text())
    assert expected == json.loads(json.dumps(golden.expected_schema()))
    decoded = decode_all(root)
    stream = [message for message in decoded.values() if not message.sealed]
    assert [{"header": str(m.header), "version": m.version,
             "transactions": [_schema_entry(t) for t in m.transactions]} for m in stream] == expected["stream"]
    [sealed] = [message for message in decoded.values() if message.sealed]
    assert {"header": str(sealed.header), "version": sealed.version,
            "transactions": [_schema_entry(t) for t in sealed.transactions]} == expected["sealed"]


def test_today_encoder_still_writes_the_schema_change_stream():
    check_rebuilt(golden.SCHEMA, golden.build_schema(), _schema_entry)


def test_the_passthrough_stream_decodes_to_the_expected_content_and_is_written_alike_today():
    """Passthrough SQL (docs/message-format.md, "Schema changes"): steps
    that name the subscriber, no shape, between data messages."""
    change = _check_change_stream(golden.PASSTHROUGH, golden.expected_passthrough(), golden.build_passthrough())
    assert change["shapes"] == [] and {step[0] for step in change["steps"]} == {"passthrough"}


def _check_change_stream(root, content: dict, files: dict[str, bytes]) -> dict:
    """A folder of data, one change, data: it decodes to ``content``, which
    the test code still makes, and today's encoder writes ``files`` alike.
    Returns the change as expected.json holds it."""
    expected = json.loads((root / "expected.json").read_text())
    assert expected == json.loads(json.dumps(content))
    decoded = decode_all(root)
    assert [{"header": str(m.header), "version": m.version,
             "transactions": [_schema_entry(t) for t in m.transactions]} for m in decoded.values()] == expected["stream"]
    check_rebuilt(root, files, _schema_entry)
    return expected["stream"][1]["transactions"][0]["change"]


def test_the_rename_table_stream_decodes_to_the_expected_content_and_is_written_alike_today():
    """A published table renamed (docs/message-format.md, "Schema changes"):
    data under the old name, the rename with a step after it on the new
    name and the table's shape under it, data under the new name."""
    change = _check_change_stream(golden.RENAME, golden.expected_rename(), golden.build_rename())
    assert change["steps"][0] == ["rename_table", "customer", "client"] and change["shapes"][0][0] == "client"


def test_the_drop_article_stream_decodes_to_the_expected_content_and_is_written_alike_today():
    """An article removed at the consolidated (docs/message-format.md,
    "Schema changes"): a change of one ``drop_article`` step and no shape,
    between data."""
    change = _check_change_stream(golden.DROP, golden.expected_drop(), golden.build_drop())
    assert change["steps"] == [["drop_article", "customer", "sales"]] and change["shapes"] == []


def test_a_reader_of_version_2_refuses_only_the_schema_changes(monkeypatch):
    """A site that reads up to version 2 sets the change aside (and asks for
    it again) but reads the data around it: the stream waits at the change
    until that site is upgraded."""
    from codec import message as wire
    from codec.errors import UnsupportedVersion

    monkeypatch.setattr(wire, "VERSIONS", (1, 2))
    keyring, field = load_keys(golden.SCHEMA)
    read, refused = [], []
    for path in sorted(golden.SCHEMA.glob("hq.field1.d.0000000000-*.fsm")):
        try:
            decode_message(path.read_bytes(), source=path.name, keyring=keyring, recipient="field1",
                           recipient_keys=field)
        except UnsupportedVersion:
            refused.append(str(MessageName.parse(path.name).header))
        else:
            read.append(str(MessageName.parse(path.name).header))
    assert refused == ["(0-0000923357-0000923400-0)", "(0-0000923500-0000923600-0)"]
    assert len(read) == 3


def _control_json(control) -> dict:
    return {"log_received": control.log_received, "rereceive_count": control.rereceive_count,
            "log_sent": control.log_sent, "resend_count": control.resend_count,
            "asks_confirmation": control.asks_confirmation, "schema_version": control.schema_version}


def test_the_control_file_with_a_schema_version_decodes_to_it():
    path, message, expected = _control_file(golden.CONTROL_SCHEMA, golden.expected_control_schema(), "field1", "hq")
    assert message.version == expected["version"] == 3
    assert _control_json(message.control) == expected["control"]
    # Today's encoder writes the same file, byte for byte.
    assert golden.build_control_schema() == {path.name: path.read_bytes()}


def test_a_control_file_without_a_schema_version_says_nothing_of_it():
    """The version-1 control file (four counters) reads as before: the
    sender's schema version is unknown (None), not 0."""
    for root in (golden.folder(1), golden.folder(3), golden.PROBE):
        keyring = Keyring([PublicKeys.from_line((root / "hq.pub").read_text())])
        [path] = root.glob("*.c.*.fsm")
        message = decode_message(path.read_bytes(), source=path.name, keyring=keyring, recipient="field1")
        assert message.version == 1 and message.control.schema_version is None


def test_a_reader_of_version_2_refuses_the_control_file_with_a_schema_version(monkeypatch):
    """The compatibility rule (docs/message-format.md): a release that reads
    versions 1 and 2 sets the file aside whole instead of misreading it."""
    from codec import message as wire
    from codec.errors import UnsupportedVersion

    monkeypatch.setattr(wire, "VERSIONS", (1, 2))
    root = golden.CONTROL_SCHEMA
    keyring = Keyring([PublicKeys.from_line((root / "field1.pub").read_text())])
    [path] = root.glob("*.fsm")
    with pytest.raises(UnsupportedVersion):
        decode_message(path.read_bytes(), source=path.name, keyring=keyring, recipient="hq")


def test_the_written_back_files_decode_with_applied_and_are_written_alike_today():
    """Rows written back to their origin (docs/message-format.md, version 4):
    a whole message with one transaction carrying ``applied``, and a group
    of parts of one, every part version 4."""
    root = golden.WRITTEN_BACK
    expected = json.loads((root / "expected.json").read_text())
    assert expected == json.loads(json.dumps(golden.expected_written_back()))
    decoded = decode_all(root)
    assert {message.version for message in decoded.values()} == {expected["version"]} == {4}
    [single] = [message for message in decoded.values() if not message.is_part]
    assert str(single.header) == expected["single"]["header"]
    assert [golden.written_back_json(t) for t in single.transactions] == expected["single"]["transactions"]
    parts = sorted((message for message in decoded.values() if message.is_part), key=lambda m: m.header)
    first, last_prefix = expected["multi_part"]["headers_first_last"]
    assert str(parts[0].header) == first and str(parts[-1].header).startswith(last_prefix)
    assert golden.written_back_json(reassemble(parts)) == expected["multi_part"]["transaction"]
    check_rebuilt(root, golden.build_written_back(), golden.written_back_json)


def test_a_reader_of_versions_1_to_3_refuses_the_written_back_files_whole(monkeypatch):
    """The compatibility rule (docs/message-format.md, version 4): a release
    that reads up to version 3 sets each file aside instead of misreading it."""
    from codec import message as wire
    from codec.errors import UnsupportedVersion

    monkeypatch.setattr(wire, "VERSIONS", (1, 2, 3))
    keyring, field = load_keys(golden.WRITTEN_BACK)
    for path in sorted(golden.WRITTEN_BACK.glob("*.fsm")):
        with pytest.raises(UnsupportedVersion):
            decode_message(path.read_bytes(), source=path.name, keyring=keyring, recipient="field1",
                           recipient_keys=field)

"""agent.site.postgres.typemap: the types table, row by row, in both
directions against a real PostgreSQL and a real SQLite table.

PostgreSQL to SQLite: a value written at PostgreSQL is captured, read back
as it travels, and stored in a SQLite column of the table's declared type;
what SQLite holds is what the table says.  SQLite to PostgreSQL: that
stored value, converted back, is written at PostgreSQL, equals the
original there, and is captured as the same travelling value again.
"""

from __future__ import annotations

import datetime
import math
import sqlite3
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.site.postgres.capture import install_capture
from agent.site.postgres.connect import connect
from agent.site.postgres.errors import UnsupportedColumnType, ValueNotConvertible
from agent.site.postgres.log import cut, iter_capture, log_end
from agent.site.postgres.schema import install_schema
from agent.site.postgres.typemap import (KINDS, BaseType, _civil, _load_float4, column_kind, converter, dump,
                                         dump_column, loader)
from agent.site.postgres.uri import parse_uri

NAN = "NaN"
SAME = object()  # the SQLite column holds the travelling value itself

# (id, PostgreSQL type, SQL literal, the value as it travels, what SQLite stores)
CASES = [
    ("smallint", "smallint", "-32768", -32768, SAME),
    ("integer", "integer", "2147483647", 2147483647, SAME),
    ("bigint-min", "bigint", "-9223372036854775808", -9223372036854775808, SAME),
    ("numeric-wide", "numeric", "12345678901234567890.123456789012", "12345678901234567890.123456789012", SAME),
    ("numeric-scale", "numeric(10,2)", "12.5", "12.50", SAME),
    ("numeric-nan", "numeric", "'NaN'", "NaN", SAME),
    ("numeric-infinity", "numeric", "'-Infinity'", "-Infinity", SAME),
    ("real", "real", "0.1", 0.1, SAME),
    ("real-max", "real", "3.4028235e38", 3.4028235e38, SAME),
    ("real-nan", "real", "'NaN'", NAN, SAME),
    ("double", "double precision", "0.1", 0.1, SAME),
    ("double-subnormal", "double precision", "4.9e-324", 5e-324, SAME),
    ("double-infinity", "double precision", "'-Infinity'", float("-inf"), SAME),
    ("double-nan", "double precision", "'NaN'", NAN, SAME),
    ("double-minus-zero", "double precision", "'-0'", -0.0, 0.0),  # SQLite keeps integral reals as integers
    ("text", "text", "'héllo ☃ \"quoted\", {braced}'", 'héllo ☃ "quoted", {braced}', SAME),
    ("text-empty", "text", "''", "", SAME),
    ("varchar", "varchar(10)", "'abc '", "abc ", SAME),
    ("char", "char(5)", "'ab'", "ab", SAME),  # char(n) without its padding
    ("boolean-true", "boolean", "true", 1, SAME),
    ("boolean-false", "boolean", "false", 0, SAME),
    ("bytea", "bytea", "'\\x00ff10'", b"\x00\xff\x10", SAME),
    ("bytea-empty", "bytea", "''", b"", SAME),
    ("date", "date", "'2024-02-29'", "2024-02-29", SAME),
    ("date-before-2000", "date", "'1969-07-20'", "1969-07-20", SAME),
    ("date-bc", "date", "'0044-03-15 BC'", "-0043-03-15", SAME),
    ("date-far", "date", "'12345-06-07'", "+12345-06-07", SAME),
    ("date-infinity", "date", "'infinity'", "infinity", SAME),
    ("date-minus-infinity", "date", "'-infinity'", "-infinity", SAME),
    ("time", "time", "'23:59:59.999999'", "23:59:59.999999", SAME),
    ("time-24", "time", "'24:00:00'", "24:00:00.000000", SAME),
    ("timestamp", "timestamp", "'2024-05-01 12:30:00.123456'", "2024-05-01T12:30:00.123456", SAME),
    ("timestamp-before-2000", "timestamp", "'1999-12-31 23:59:59.5'", "1999-12-31T23:59:59.500000", SAME),
    ("timestamp-1-bc", "timestamp", "'0001-01-01 00:00:00 BC'", "0000-01-01T00:00:00.000000", SAME),
    ("timestamp-infinity", "timestamp", "'infinity'", "infinity", SAME),
    ("timestamptz", "timestamptz", "'2024-05-01 14:30:00.5+02'", "2024-05-01T12:30:00.500000Z", SAME),
    ("timestamptz-minus-infinity", "timestamptz", "'-infinity'", "-infinity", SAME),
    ("uuid", "uuid", "'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", SAME),
    ("json", "json", "'{\"b\": 1,  \"a\": [1, 2]}'", '{"b": 1,  "a": [1, 2]}', SAME),
    ("jsonb", "jsonb", "'{\"b\": 1,  \"a\": [1, 2]}'", '{"a": [1, 2], "b": 1}', SAME),
    ("enum", "mood", "'happy'", "happy", SAME),
    ("domain", "positive_amount", "7.250", "7.250", SAME),
    ("null", "integer", "NULL", None, SAME),
]


@pytest.fixture(scope="module")
def types_site(postgres):
    """One database for the module: its enum and domain, and the schema."""
    database = postgres.create_database()
    target = parse_uri(postgres.uri(database))
    conn = connect(target)
    install_schema(conn, target)
    conn.execute("CREATE TYPE mood AS ENUM ('sad', 'happy')")
    conn.execute("CREATE DOMAIN positive_amount AS numeric(12,3) CHECK (VALUE > 0)")
    yield conn, target
    conn.close()
    postgres.drop_database(database)


def _captured_rows(conn, target) -> list[tuple]:
    """The capture rows written since the last cut, as they travel."""
    before = log_end(conn)
    end = cut(conn, target, "hq").log_end
    return [row for _, _, chunk in iter_capture(conn, before, end) for row in chunk]


def _captured_value(conn, target) -> object:
    """The travelling value of the one row written since the last cut."""
    [row] = _captured_rows(conn, target)
    return row[5]


def _same(a: object, b: object) -> bool:
    if type(a) is not type(b):
        return False
    if type(a) is float:
        return math.copysign(1, a) == math.copysign(1, b) and (a == b or (math.isnan(a) and math.isnan(b)))
    return a == b


@pytest.mark.parametrize("case", CASES, ids=[case[0] for case in CASES])
def test_each_row_of_the_types_table_round_trips(types_site, case):
    conn, target = types_site
    name, pg_type, literal, travels, stored = case
    table = f"rt_{CASES.index(case)}"
    conn.execute(f"CREATE TABLE {table} (id integer PRIMARY KEY, value {pg_type})")
    shape = install_capture(conn, target, table)
    kind = KINDS[shape.layout.kinds[1]]

    # PostgreSQL -> as it travels -> what SQLite stores.
    conn.execute(f"INSERT INTO {table} VALUES (1, {literal})")
    captured = _captured_value(conn, target)
    assert _same(captured, travels), (captured, travels)
    lite = sqlite3.connect(":memory:")
    lite.execute(f"CREATE TABLE t (id INTEGER PRIMARY KEY, value {kind.sqlite_type})")
    lite.execute("INSERT INTO t VALUES (1, ?)", (captured,))
    [(held,)] = lite.execute("SELECT value FROM t")
    assert _same(held, travels if stored is SAME else stored), (held, stored)

    # SQLite -> PostgreSQL: equal to the original there, and captured alike.
    parameter = dump(kind, "value", held)
    conn.execute(f"INSERT INTO {table} VALUES (2, %s::{shape.layout.declared[1]})", (parameter,))
    [(equal,)] = conn.execute(f"SELECT (SELECT value::text FROM {table} WHERE id = 2)"
                              f" IS NOT DISTINCT FROM ({literal})::{pg_type}::text").fetchall()
    assert equal or stored is not SAME, f"{held!r} came back to PostgreSQL as another value"
    assert _same(_captured_value(conn, target), held)


def test_an_update_s_old_and_new_images_travel_converted_cut_or_filled(types_site):
    """Both images of an UPDATE are converted, a NULL stays NULL, and a
    reader that asks for fewer or more values gets them cut or filled."""
    conn, target = types_site
    conn.execute("CREATE TABLE images (id bigint PRIMARY KEY, label text, amount double precision, day date,"
                 " flag boolean, data bytea, price numeric)")
    install_capture(conn, target, "images")
    conn.execute("INSERT INTO images VALUES (1, 'one', 0.5, '2024-02-29', true, '\\x00ff', 12.50)")
    conn.execute("UPDATE images SET id = 2, label = NULL, amount = -1e300, day = 'infinity', flag = false,"
                 " data = NULL, price = 'NaN'")
    before = log_end(conn)
    old = (1, "one", 0.5, "2024-02-29", 1, b"\x00\xff", "12.50")
    new = (2, None, -1e300, "infinity", 0, None, "NaN")
    end = cut(conn, target, "hq").log_end
    [(_, _, rows)] = iter_capture(conn, before, end)
    assert [row[4:] for row in rows] == [old, old + new]
    assert [type(value) for value in rows[1][4:]] == [type(value) for value in old + new]
    [(_, _, cut_short)] = iter_capture(conn, before, end, value_columns=9)
    assert [row[4:] for row in cut_short] == [old + (None, None), old + new[:2]]
    [(_, _, filled)] = iter_capture(conn, before, end, value_columns=16)
    assert [row[4:] for row in filled] == [old + (None,) * 9, old + new + (None, None)]


def test_conversion_changes_the_list_it_is_given_and_the_loader_a_copy():
    kinds = (KINDS["integer"], KINDS["text"], KINDS["double"])
    half = struct.pack(">d", 0.5).hex()
    texts = ["7", "7", half, "8", None, None]
    assert loader(kinds)(texts) == (7, "7", 0.5, 8, None, None)
    assert texts == ["7", "7", half, "8", None, None]
    convert = converter(kinds)
    assert convert(texts) is texts and texts == [7, "7", 0.5, 8, None, None]
    assert convert(["7", "7"]) == [7, "7"]  # cut short: what is there
    assert convert(["1", "a", half, "2", "b", half, "extra"]) == [1, "a", 0.5, 2, "b", 0.5]  # two images at most


def test_every_row_of_the_types_table_has_cases():
    kinds_tested = set()
    for _, pg_type, *_ in CASES:
        base = {"mood": "enum", "positive_amount": "numeric"}.get(pg_type)
        kinds_tested.add(base or {"smallint": "integer", "bigint": "integer", "double precision": "double",
                                  "varchar(10)": "text", "char(5)": "text", "numeric(10,2)": "numeric"
                                  }.get(pg_type, pg_type))
    assert set(KINDS) <= kinds_tested


@pytest.mark.parametrize("kind, value", [
    ("integer", "12"), ("integer", 1.5), ("boolean", 2), ("boolean", "true"), ("bytea", "text"),
    ("text", b"bytes"), ("numeric", 1.5), ("double", "0.1"), ("date", 20240101),
])
def test_values_that_do_not_fit_the_column_are_refused_by_name(kind, value):
    with pytest.raises(ValueNotConvertible) as caught:
        dump(KINDS[kind], "amount", value)
    assert "column amount" in str(caught.value) and "\n" not in str(caught.value)


def test_null_converts_to_null_for_every_kind():
    assert all(dump(kind, "c", None) is None for kind in KINDS.values())


@pytest.mark.parametrize("pg_type, why", [
    ("integer[]", "an array"), ("int4range", "a range"), ("int4multirange", "a range"),
    ("point", "a geometric type"), ("polygon", "a geometric type"), ("pair", "a composite type"),
    ("interval", "not in the types table"), ("inet", "not in the types table"),
])
def test_unsupported_types_are_refused_naming_table_and_column(types_site, pg_type, why):
    conn, target = types_site
    table = f"refused_{abs(hash(pg_type)) % 10**6}"
    conn.execute("DO $$ BEGIN CREATE TYPE pair AS (a integer, b text); EXCEPTION WHEN duplicate_object THEN NULL;"
                 " END $$")
    conn.execute(f"CREATE TABLE {table} (id integer PRIMARY KEY, shape_of_it {pg_type})")
    with pytest.raises(UnsupportedColumnType) as caught:
        install_capture(conn, target, table)
    message = str(caught.value)
    assert f"table {table}" in message and "column shape_of_it" in message and why in message
    assert "\n" not in message
    assert conn.execute("SELECT count(*) FROM pg_trigger WHERE tgrelid = %s::regclass AND NOT tgisinternal",
                        (table,)).fetchone() == (0,)


def test_a_composite_type_named_like_a_builtin_is_not_taken_for_it():
    base = BaseType("public", "date", "c", "C", "public.date")
    with pytest.raises(UnsupportedColumnType, match="composite"):
        column_kind("t", "c", base)


def test_civil_dates_match_the_gregorian_calendar():
    epoch = datetime.date(1970, 1, 1)
    for days in range(-719_162, 2_932_897, 997):  # 0001-01-01 .. 9999-12-31
        day = epoch + datetime.timedelta(days=days)
        assert _civil(days) == (day.year, day.month, day.day)


def test_a_real_travels_as_its_shortest_decimal():
    for value in (0.1, 1 / 3, 16777217.0, 1e-45, -2.5e-38, 123456.789):
        bits = struct.pack(">f", value)
        loaded = _load_float4(bits.hex())
        assert struct.pack(">f", loaded) == bits
        assert len(repr(loaded)) <= len(repr(struct.unpack(">f", bits)[0]))


def test_a_session_s_settings_do_not_change_what_is_captured(types_site):
    """DateStyle, TimeZone, extra_float_digits and bytea_output change how a
    session shows values, never the capture text."""
    conn, target = types_site
    conn.execute("CREATE TABLE settings_t (id integer PRIMARY KEY, f float8, ts timestamptz, d date, b bytea)")
    install_capture(conn, target, "settings_t")
    values = "(%s, 0.1, '2024-05-01 12:00:00+00', '2024-05-01', '\\x01')"
    conn.execute(f"INSERT INTO settings_t VALUES {values % 1}")
    with conn.transaction():
        for setting in ("SET LOCAL DateStyle = 'SQL, DMY'", "SET LOCAL TimeZone = 'Asia/Kolkata'",
                        "SET LOCAL extra_float_digits = -3", "SET LOCAL bytea_output = 'escape'"):
            conn.execute(setting)
        conn.execute(f"INSERT INTO settings_t VALUES {values % 2}")
    rows = _captured_rows(conn, target)
    assert [row[5:] for row in rows] == [(0.1, "2024-05-01T12:00:00.000000Z", "2024-05-01", b"\x01")] * 2


def test_numeric_never_goes_through_a_float(types_site):
    conn, target = types_site
    conn.execute("CREATE TABLE money_t (id integer PRIMARY KEY, amount numeric)")
    install_capture(conn, target, "money_t")
    conn.execute("INSERT INTO money_t VALUES (1, 0.1 + 0.2), (2, 1e-40), (3, 9007199254740993)")
    assert [row[5] for row in _captured_rows(conn, target)] == ["0.3", "0.0000000000000000000000000000000000000001", "9007199254740993"]


_SQLITE_VALUES = st.one_of(
    st.none(), st.integers(min_value=-2 ** 63, max_value=2 ** 63 - 1), st.floats(allow_nan=True),
    st.text(max_size=8), st.binary(max_size=8), st.sampled_from([0, 1, -0.0, "NaN", "Infinity", "2024-01-02"]))


def _dumped_one_by_one(kind, values):
    try:
        return [None if value is None else kind.dump(value) for value in values]
    except ValueNotConvertible as error:
        return type(error)


@pytest.mark.parametrize("name", sorted(KINDS))
@given(values=st.one_of(
    st.lists(_SQLITE_VALUES, min_size=1, max_size=6),
    # A column of one type, the case dump_column takes without a call per value.
    st.sampled_from([st.integers(min_value=-2 ** 63, max_value=2 ** 63 - 1), st.floats(), st.text(max_size=8),
                     st.binary(max_size=8)]).flatmap(lambda values: st.lists(values, min_size=1, max_size=6))))
@settings(max_examples=150, deadline=None)
def test_a_column_dumped_at_once_is_each_value_dumped(name, values):
    # The apply's fast path dumps a run's columns at once (dump_column):
    # the same parameters as its values one by one, the same refusal.
    kind = KINDS[name]
    expected = _dumped_one_by_one(kind, values)
    try:
        found = dump_column(kind, tuple(values))
    except ValueNotConvertible as error:
        found = type(error)
    if isinstance(expected, list) and isinstance(found, list):
        # -0.0 == 0.0 and NaN != NaN: compare what a statement is given, its text or bytes.
        assert list(map(repr, found)) == list(map(repr, expected))
    else:
        assert found == expected

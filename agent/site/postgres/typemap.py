"""The types table: what each PostgreSQL column type becomes in a capture
row, what travels in a message, and what a SQLite site stores.

Rules of this file:
* One :class:`Kind` per row of the table in docs/postgres.md, "Types":
  the SQL that turns a column into the text a capture row holds
  (``capture``), the value that text travels as (``load``: a SQLite value,
  None, int, float, str or bytes), the column type a SQLite copy declares
  (``sqlite_type``), and the way back (``dump``: a value from a SQLite
  site to the parameter PostgreSQL casts to the column's type).
* The capture text never depends on a session's settings (DateStyle,
  TimeZone, extra_float_digits, bytea_output): integers, numeric, text,
  uuid, json and enums are their own text; floating point, dates and times
  are the hex of their binary send form, which is the same everywhere.
* Exact: numeric travels as its text, never through a float; a timestamp
  keeps its microseconds; ``infinity`` stays ``infinity``.  A float NaN
  travels as the text ``'NaN'``, since SQLite stores a NaN as NULL.
* A column type outside the table is refused (:func:`column_kind`) with one
  line naming the table, the column and why; nothing is guessed.
* Pure: no connection.  The catalogue queries live in capture.py.
"""

from __future__ import annotations

import math
import re
import struct
from dataclasses import dataclass
from typing import Callable

from .errors import UnsupportedColumnType, ValueNotConvertible

Value = None | int | float | str | bytes

TYPES_HELP = ("fieldsync carries integers, numeric, real and double precision, text, boolean, bytea, date, time, "
              "timestamp, timestamptz, uuid, json, jsonb and enums (docs/postgres.md, \"Types\")")

# -- dates and times: the binary send forms ---------------------------------------

_DAYS_1970_TO_2000 = 10957
_MICROSECONDS_PER_DAY = 86_400_000_000
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
# PostgreSQL keeps infinity as the field's largest value, -infinity as its smallest.
_DATE_INFINITY = 2**31 - 1
_TIME_INFINITY = 2**63 - 1


def _civil(days: int) -> tuple[int, int, int]:
    """(year, month, day) of ``days`` after 1970-01-01 in the proleptic
    Gregorian calendar, for any year (astronomical: 0 is 1 BC).  Howard
    Hinnant's ``civil_from_days``."""
    shifted = days + 719_468
    era = shifted // 146_097
    day_of_era = shifted - era * 146_097
    year_of_era = (day_of_era - day_of_era // 1460 + day_of_era // 36_524 - day_of_era // 146_096) // 365
    day_of_year = day_of_era - (365 * year_of_era + year_of_era // 4 - year_of_era // 100)
    month_index = (5 * day_of_year + 2) // 153
    day = day_of_year - (153 * month_index + 2) // 5 + 1
    month = month_index + 3 if month_index < 10 else month_index - 9
    return year_of_era + era * 400 + (month <= 2), month, day


def _iso_year(year: int) -> str:
    """ISO 8601: four digits for 0000-9999 (0000 is 1 BC), a sign beyond."""
    if 0 <= year <= 9999:
        return f"{year:04d}"
    return f"+{year}" if year > 0 else f"-{-year:04d}"


def _iso_date(days_since_2000: int) -> str:
    year, month, day = _civil(days_since_2000 + _DAYS_1970_TO_2000)
    return f"{_iso_year(year)}-{month:02d}-{day:02d}"


def _iso_time(microseconds: int) -> str:
    seconds, fraction = divmod(microseconds, 1_000_000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    return f"{hour:02d}:{minute:02d}:{second:02d}.{fraction:06d}"


def _infinite(value: int, infinity: int) -> str | None:
    """``'infinity'`` or ``'-infinity'`` when ``value`` is one, else None."""
    if value == infinity:
        return "infinity"
    return "-infinity" if value == -infinity - 1 else None


def _load_date(text: str) -> str:
    days = _INT32.unpack(bytes.fromhex(text))[0]
    return _infinite(days, _DATE_INFINITY) or _iso_date(days)


def _load_time(text: str) -> str:
    return _iso_time(_INT64.unpack(bytes.fromhex(text))[0])


def _timestamp_loader(suffix: str) -> Callable[[str], str]:
    def load(text: str) -> str:
        microseconds = _INT64.unpack(bytes.fromhex(text))[0]
        days, within = divmod(microseconds, _MICROSECONDS_PER_DAY)
        return _infinite(microseconds, _TIME_INFINITY) or f"{_iso_date(days)}T{_iso_time(within)}{suffix}"
    return load


_ISO_YEAR = re.compile(r"^([+-]?)(\d{4,})(-.*)$", re.DOTALL)


def _dump_moment(value: Value) -> str:
    """An ISO 8601 date or timestamp from a SQLite site as PostgreSQL reads
    it: a year before 1 as ``BC`` (ISO's 0000 is 1 BC), no ``+`` on a year
    beyond 9999.  Any other text goes as it is and PostgreSQL judges it."""
    text = _need_text(value, "a date or time")
    found = _ISO_YEAR.match(text)
    if found is None:
        return text
    sign, digits, rest = found.groups()
    year = -int(digits) if sign == "-" else int(digits)
    if year >= 1:
        return f"{year:04d}{rest}"
    return f"{1 - year:04d}{rest} BC"


# -- floating point ---------------------------------------------------------------

_FLOAT4 = struct.Struct(">f")
_FLOAT8 = struct.Struct(">d")


def _travelling_float(value: float) -> float | str:
    return "NaN" if math.isnan(value) else value


def _load_float8(text: str, unpack: Callable[[bytes], tuple] = _FLOAT8.unpack) -> float | str:
    value = unpack(bytes.fromhex(text))[0]
    return value if value == value else "NaN"  # only a NaN differs from itself (_travelling_float)


def _load_float4(text: str) -> float | str:
    """The shortest decimal that reads back as the same ``real`` (what
    PostgreSQL shows for it: 0.1, not 0.10000000149011612), as a float."""
    bits = bytes.fromhex(text)
    value = _FLOAT4.unpack(bits)[0]
    if not math.isfinite(value):
        return _travelling_float(value)
    for digits in range(1, 10):
        candidate = float(f"{value:.{digits}g}")
        try:
            if _FLOAT4.pack(candidate) == bits:
                return candidate
        except OverflowError:  # rounded up past the largest real
            continue
    return value


def _dump_float(value: Value) -> str:
    if type(value) is float:
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return repr(value)
    if type(value) is int:
        return str(value)
    if type(value) is str and value in ("NaN", "Infinity", "-Infinity"):
        return value
    raise ValueNotConvertible(f"expected a number for a floating-point column, got {_shown(value)}")


# -- the others -------------------------------------------------------------------

def _shown(value: Value) -> str:
    if type(value) in (str, bytes) and len(value) > 24:  # type: ignore[arg-type]
        return f"{type(value).__name__} {value[:24]!r}..."  # type: ignore[index]
    return f"{type(value).__name__} {value!r}"


def _need_text(value: Value, what: str) -> str:
    if type(value) is str:
        return value  # type: ignore[return-value]
    raise ValueNotConvertible(f"expected text for {what} column, got {_shown(value)}")


def _load_boolean(text: str) -> int:
    return 1 if text == "true" else 0


def _dump_boolean(value: Value) -> str:
    if type(value) is int and value in (0, 1):
        return "true" if value else "false"
    raise ValueNotConvertible(f"expected 0 or 1 for a boolean column, got {_shown(value)}")


def _dump_integer(value: Value) -> str:
    if type(value) is int:
        return str(value)
    raise ValueNotConvertible(f"expected an integer for an integer column, got {_shown(value)}")


def _dump_numeric(value: Value) -> str:
    if type(value) is int:
        return str(value)
    return _need_text(value, "a numeric")


def _dump_bytea(value: Value) -> bytes:
    if type(value) is bytes:
        return value  # type: ignore[return-value]
    raise ValueNotConvertible(f"expected a BLOB for a bytea column, got {_shown(value)}")


def _text_dumper(what: str) -> Callable[[Value], str]:
    return lambda value: _need_text(value, what)


# -- the table ----------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Kind:
    """One row of the types table."""

    name: str
    capture: str                        # SQL turning column ``{}`` into the capture row's text
    load: Callable[[str], Value]        # capture text -> the value that travels
    dump: Callable[[Value], object]     # a SQLite site's value -> the parameter cast to the column's type
    sqlite_type: str                    # what a SQLite copy declares
    travels: str                        # for the docs


# Capture SQL is schema-qualified: it runs in SECURITY DEFINER functions
# under the caller's search_path (capture.py).
_TEXT = "{}::pg_catalog.text"


def _hex_send(function: str) -> str:
    return f"pg_catalog.encode(pg_catalog.{function}({{}}), 'hex')"


KINDS: dict[str, Kind] = {kind.name: kind for kind in (
    Kind("integer", _TEXT, int, _dump_integer, "INTEGER", "integer"),
    Kind("numeric", _TEXT, str, _dump_numeric, "TEXT", "text, exact ('12.50', 'NaN', 'Infinity')"),
    Kind("real", _hex_send("float4send"), _load_float4, _dump_float, "REAL",
         "float, the shortest decimal of the real; NaN as text 'NaN'"),
    Kind("double", _hex_send("float8send"), _load_float8, _dump_float, "REAL", "float; NaN as text 'NaN'"),
    Kind("text", _TEXT, str, _text_dumper("a text"), "TEXT", "text"),
    Kind("boolean", _TEXT, _load_boolean, _dump_boolean, "INTEGER", "integer 1 or 0"),
    Kind("bytea", "pg_catalog.encode({}, 'hex')", bytes.fromhex, _dump_bytea, "BLOB", "bytes"),
    Kind("date", _hex_send("date_send"), _load_date, _dump_moment, "TEXT", "text 'YYYY-MM-DD', 'infinity'"),
    Kind("time", _hex_send("time_send"), _load_time, _dump_moment, "TEXT", "text 'HH:MM:SS.ffffff'"),
    Kind("timestamp", _hex_send("timestamp_send"), _timestamp_loader(""), _dump_moment, "TEXT",
         "text 'YYYY-MM-DDTHH:MM:SS.ffffff', 'infinity'"),
    Kind("timestamptz", _hex_send("timestamptz_send"), _timestamp_loader("Z"), _dump_moment, "TEXT",
         "text 'YYYY-MM-DDTHH:MM:SS.ffffffZ' (UTC), 'infinity'"),
    Kind("uuid", _TEXT, str, _text_dumper("a uuid"), "TEXT", "text, lower case"),
    Kind("json", _TEXT, str, _text_dumper("a json"), "TEXT", "text, as stored"),
    Kind("jsonb", _TEXT, str, _text_dumper("a jsonb"), "TEXT", "text, PostgreSQL's normal form"),
    Kind("enum", _TEXT, str, _text_dumper("an enum"), "TEXT", "text, the label"),
)}

# Base types (after domains) by name; enums and the string category are
# found by their catalogue entry instead.
_BY_TYPE_NAME = {
    "int2": "integer", "int4": "integer", "int8": "integer", "numeric": "numeric", "float4": "real",
    "float8": "double", "bool": "boolean", "bytea": "bytea", "date": "date", "time": "time",
    "timestamp": "timestamp", "timestamptz": "timestamptz", "uuid": "uuid", "json": "json", "jsonb": "jsonb",
}


@dataclass(frozen=True, slots=True)
class BaseType:
    """A column's type as the catalogue describes it, domains resolved:
    ``pg_type``'s schema, typname, typtype and typcategory of the base
    type, and the column's declared type (``format_type``) to cast incoming
    values to."""

    schema: str
    name: str
    typtype: str
    category: str
    declared: str


def _refusal(base: BaseType) -> str:
    if base.category == "A":
        return "an array"
    if base.typtype in ("r", "m"):
        return "a range"
    if base.typtype == "c":
        return "a composite type"
    if base.category == "G":
        return "a geometric type"
    return "not in the types table"


def column_kind(table: str, column: str, base: BaseType) -> Kind:
    """The row of the types table for ``column``, or UnsupportedColumnType
    naming the table and column."""
    name = _BY_TYPE_NAME.get(base.name) if base.schema == "pg_catalog" else None
    if name is None and base.typtype == "e":
        name = "enum"
    if name is None and base.typtype == "b" and base.category == "S":
        name = "text"  # text, varchar, char(n) (without its padding), name, citext
    if name is None:
        raise UnsupportedColumnType(f"cannot publish table {table}: column {column} has type {base.declared}, "
                                    f"{_refusal(base)}; {TYPES_HELP}")
    return KINDS[name]


def converter(kinds: tuple[Kind, ...], route: Kind | None = None) -> Callable[[list], list]:
    """A function that turns a capture row's texts (one image, or an
    UPDATE's old and new images one after the other; perhaps cut short by a
    reader that takes fewer values) into the values that travel, in the
    list it is given, which it returns; values past two images are dropped,
    but for a follow article's (``route``: the kind of its routes) the two
    routes after them.  Text kinds travel as they are read: only the others
    are converted (the log reader's hot path, which owns the lists it
    converts)."""
    width = len(kinds)
    one = tuple((index, kind.load) for index, kind in enumerate(kinds) if kind.load is not str)
    two = one + tuple((index + width, load) for index, load in one)
    kept, routed = 2 * width, two
    if route is not None:
        kept += 2
        if route.load is not str:
            routed = two + ((2 * width, route.load), (2 * width + 1, route.load))

    def convert(values: list) -> list:
        count = len(values)
        if count == width:
            conversions = one
        elif count == 2 * width:
            conversions = two
        else:  # cut short, or more than two images
            del values[kept:]
            conversions = tuple(conversion for conversion in (one if count <= width else routed)
                                if conversion[0] < count)
        for index, load in conversions:
            text = values[index]
            if text is not None:
                values[index] = load(text)
        return values
    return convert


def loader(kinds: tuple[Kind, ...], route: Kind | None = None) -> Callable[[list], tuple]:
    """:func:`converter` for texts the caller keeps: a function from a
    capture row's texts to the values that travel, as a tuple."""
    convert = converter(kinds, route)
    return lambda texts: tuple(convert(list(texts)))


def dump(kind: Kind, column: str, value: Value) -> object:
    """``value`` from a SQLite site as the parameter for ``column``;
    ValueNotConvertible names the column."""
    if value is None:
        return None
    try:
        return kind.dump(value)
    except ValueNotConvertible as error:
        raise ValueNotConvertible(f"column {column}: {error}") from None


# Kinds whose dump gives a text value back as it is, and those whose dump
# of an int is str() (dump_column).
_TEXT_KINDS = frozenset({"text", "uuid", "json", "jsonb", "enum", "numeric"})
_INTEGER_KINDS = frozenset({"integer", "numeric", "real", "double"})


def dump_column(kind: Kind, values: tuple) -> list:
    """``kind.dump`` of each of a column's ``values`` (None stays None),
    equal to dumping them one by one, but without a Python call per value
    where the column holds one type its dump keeps or turns into its text
    (text, ints, finite floats, bytes): the apply's fast path dumps runs
    of thousands of rows.  Raises ValueNotConvertible as the dump does."""
    types = set(map(type, values))
    name = kind.name
    if len(types) == 1:
        only = next(iter(types))
        if only is str and name in _TEXT_KINDS or only is bytes and name == "bytea":
            return list(values)
        if only is int and name in _INTEGER_KINDS:
            return list(map(str, values))
        if only is float and name in ("real", "double") and all(map(math.isfinite, values)):
            return list(map(repr, values))
    convert = kind.dump
    return [None if value is None else convert(value) for value in values]

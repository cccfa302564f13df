"""Transport options given as text (docs/transports.md, "Options as text").

A command line (``-O timeout=90s``) gives every option as text; the
transport's constructor wants numbers, booleans and paths.
:func:`read_text_options` reads each text value by the annotation of the
parameter it goes to, so one rule serves every transport, built-in or not:

* a parameter that takes ``str`` (or ``os.PathLike``) keeps the text as it
  is: an IMAP user ``1001`` stays the text ``"1001"``; a ``Path`` gets
  ``Path(text)``;
* ``bool``: ``true``/``false``, ``yes``/``no``, ``on``/``off``, ``1``/``0``;
* ``int``: a whole number; ``float``: a finite number; a ``Literal`` or an
  ``Enum``: one of its values (an Enum member also by name);
* :data:`Seconds`, :data:`ByteCount`, :data:`FileMode` (``Annotated``
  markers a transport puts on its parameters): ``90s``/``5m``/``1h``,
  ``48k``/``64m``/``1g``, octal permission bits ``640``/``0o640``;
* a union takes the first of its arms that reads the text (``int | float``);
* no annotation, or one its module cannot resolve (a type imported only for
  type checkers): booleans and numbers as they read, the rest as text;
* anything else cannot be given as text, and says so; nor can a text
  with a control character, whatever the option.

Values that are not text (a program's ``create_transport(..., timeout=5)``)
are passed on untouched; the constructor checks them as always.  A text
that does not read is one :class:`BadTransportOptions` line naming the
transport, the option and the value.
"""

from __future__ import annotations

import enum
import inspect
import math
import os
import re
import sys
import types
import typing
import unicodedata
from dataclasses import dataclass
from pathlib import PurePath
from typing import Annotated, Any, Callable, Mapping

from codec.packing import MIN_MAX_SIZE

from .errors import BadTransportOptions


@dataclass(frozen=True, slots=True)
class TextForm:
    """How an ``Annotated`` parameter is written as text: ``parse`` turns the
    text into the value or raises ValueError; ``wanted`` says what was
    expected, for the error line."""

    parse: Callable[[str], Any]
    wanted: str


_DURATION = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(ms|h|m|s)?\s*")
_DURATION_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, None: 1.0, "ms": 0.001}
_DURATION_RANKS = {"h": 0, "m": 1, "s": 2, "ms": 3, None: 4}
_BYTES = re.compile(r"([0-9]+)(?:([kmg])(?:i?b)?|b)?")
_BYTE_UNITS = {None: 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
_WHOLE = re.compile(r"-?[0-9]+")


def check_size_limit(option: str, value: object) -> int:
    """``value`` as a transport's limit on the size of a file it reads: a
    byte count no smaller than the smallest message (``-l`` takes 10000 and
    up), else a limit that refuses every message file."""
    if type(value) is not int or value < MIN_MAX_SIZE:
        raise BadTransportOptions(f"{option} must be a byte count of at least {MIN_MAX_SIZE} (the smallest message "
                         f"size), got {value!r}")
    return value


def parse_seconds(text: str) -> float:
    """``90``, ``1.5``, ``1e3``, ``90s``, ``250ms``, ``5m``, ``1h`` or
    ``1h30m``, in seconds; finite."""
    compact = text.strip().lower()
    try:
        total = parse_float(compact)
    except ValueError:
        position, total, rank = 0, 0.0, -1
        while position < len(compact):
            match = _DURATION.match(compact, position)
            # Units from the largest down, each once (1h30m, not 30m1h); a bare number stands alone.
            if match is None or _DURATION_RANKS[match.group(2)] <= rank or (match.group(2) is None and position):
                raise ValueError(text) from None
            rank = _DURATION_RANKS[match.group(2)]
            total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
            position = match.end()
        if not compact:
            raise ValueError(text) from None
    if not math.isfinite(total) or total < 0:
        raise ValueError(text)
    return total


def parse_byte_count(text: str) -> int:
    """``50000``, ``48k``, ``64m``, ``1g`` (also ``64MiB``, ``64mb``): powers of 1024."""
    match = _BYTES.fullmatch(text.strip().lower())
    if match is None:
        raise ValueError(text)
    return int(match.group(1)) * _BYTE_UNITS[match.group(2)]


def parse_file_mode(text: str) -> int:
    """Permission bits, always octal as chmod reads them: ``640``, ``0640``, ``0o640``."""
    digits = text.strip().lower()
    digits = digits[2:] if digits.startswith("0o") else digits
    if not digits or not set(digits) <= set("01234567"):
        raise ValueError(text)
    return int(digits, 8)


def parse_bool(text: str) -> bool:
    word = text.strip().lower()
    if word in ("true", "yes", "on", "1"):
        return True
    if word in ("false", "no", "off", "0"):
        return False
    raise ValueError(text)


def parse_int(text: str) -> int:
    """A whole number in ASCII digits, with an optional minus sign."""
    if not _WHOLE.fullmatch(text.strip()):
        raise ValueError(text)
    return int(text.strip())


def parse_float(text: str) -> float:
    """A finite number as Python writes one (``0.05``, ``1e3``) in ASCII
    digits (Python's float() also takes other scripts' digits), no ``_``."""
    if "_" in text or not text.isascii():
        raise ValueError(text)
    value = float(text.strip())
    if not math.isfinite(value):
        raise ValueError(text)
    return value


def guess(text: str) -> object:
    """A value whose parameter says nothing of its type (no annotation, or
    one that cannot be resolved): ``true``/``false`` words become booleans,
    numbers become numbers, the rest stays text."""
    for parse in (parse_int, parse_bool, parse_float):  # "1" is the number 1, not True
        try:
            return parse(text)
        except ValueError:
            pass
    return text


#: A length of time in seconds; as text ``90``, ``90s``, ``5m``, ``1h``.
Seconds = Annotated[float, TextForm(parse_seconds, "a number of seconds such as 30, 90s, 5m or 1h")]
#: A number of bytes; as text ``50000``, ``48k``, ``64m``, ``1g``.
ByteCount = Annotated[int, TextForm(parse_byte_count, "a byte count such as 50000, 48k, 64m or 1g")]
#: Permission bits; as text in octal, ``640`` or ``0o640``.
FileMode = Annotated[int, TextForm(parse_file_mode, "permission bits in octal such as 640 or 0o640")]

_PLAIN_FORMS = {
    bool: TextForm(parse_bool, "true or false"),
    int: TextForm(parse_int, "a whole number"),
    float: TextForm(parse_float, "a finite number"),
}
_KEEP_TEXT = object()
_GUESS = TextForm(guess, "")
_UNRESOLVED = object()
_OTHER_NAMES = "*"  # not an identifier: the key of a ``**options`` parameter's annotation


def _either(forms: list[TextForm]) -> TextForm:
    """The first of ``forms`` that reads the text (``int | float``: ``2``
    is 2, ``1.5`` is 1.5)."""
    def parse(text: str) -> Any:
        for form in forms:
            try:
                return form.parse(text)
            except (ValueError, OverflowError):
                pass
        raise ValueError(text)
    return TextForm(parse, " or ".join(dict.fromkeys(form.wanted for form in forms)))


def _one_of(values: list[Any], by_text: dict[str, Any]) -> TextForm:
    def parse(text: str) -> Any:
        try:
            return by_text[text.strip()]
        except KeyError:
            raise ValueError(text) from None
    return TextForm(parse, "one of " + ", ".join(map(str, values)))


def _form_of(annotation: Any) -> TextForm | object | None:
    """The TextForm for a parameter's annotation, ``_KEEP_TEXT`` if it takes
    text as it is, None if it cannot be written as text."""
    if annotation is inspect.Parameter.empty or annotation is _UNRESOLVED:
        return _GUESS
    if annotation is Any or annotation is object:
        return _KEEP_TEXT
    if typing.get_origin(annotation) is Annotated:
        for extra in annotation.__metadata__:
            if isinstance(extra, TextForm):
                return extra
        annotation = typing.get_args(annotation)[0]
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        forms = [_form_of(arm) for arm in typing.get_args(annotation) if arm is not type(None)]
        if _KEEP_TEXT in forms:
            return _KEEP_TEXT
        readable = [form for form in forms if isinstance(form, TextForm)]
        return None if not readable else readable[0] if len(readable) == 1 else _either(readable)
    if origin is typing.Literal:
        values = list(typing.get_args(annotation))
        return _one_of(values, {str(value): value for value in values})
    if annotation is str or annotation is os.PathLike or origin is os.PathLike:
        return _KEEP_TEXT
    if isinstance(annotation, type):
        if issubclass(annotation, PurePath):
            return TextForm(annotation, "a path")
        if issubclass(annotation, enum.Enum):
            members = list(annotation)
            by_text = {member.name: member for member in members}
            by_text.update({str(member.value): member for member in members})
            return _one_of([member.value for member in members], by_text)
    return _PLAIN_FORMS.get(annotation)


def _annotations(cls: type) -> dict[str, Any]:
    """Each keyword parameter of ``cls`` with its resolved annotation
    (``_UNRESOLVED`` for one that names what its module cannot give, such as
    a type imported only for type checkers)."""
    parameters = {}
    for name, parameter in inspect.signature(cls.__init__).parameters.items():
        if parameter.kind in (parameter.KEYWORD_ONLY, parameter.POSITIONAL_OR_KEYWORD):
            parameters[name] = parameter
        elif parameter.kind is parameter.VAR_KEYWORD:  # **options: its annotation is that of every other name
            parameters[_OTHER_NAMES] = parameter
    try:
        hints = typing.get_type_hints(cls.__init__, include_extras=True)
    except Exception:  # noqa: BLE001 - resolve them one at a time below
        hints = None
    if hints is not None:
        return {name: hints.get(parameter.name, inspect.Parameter.empty) for name, parameter in parameters.items()}
    namespace = vars(sys.modules[cls.__module__]) if cls.__module__ in sys.modules else {}
    names = {}
    for name, parameter in parameters.items():
        annotation = parameter.annotation
        if isinstance(annotation, str):
            try:
                annotation = eval(annotation, dict(namespace))  # noqa: S307 - the class's own annotation text
                if isinstance(annotation, str):
                    annotation = _UNRESOLVED
            except Exception:  # noqa: BLE001
                annotation = _UNRESOLVED
        names[name] = annotation
    return names


def has_control_character(text: str) -> bool:
    """Whether ``text`` holds a control character or a line or paragraph
    separator: what would break a one-line message or a path.  Other
    characters a terminal shows (a no-break space, say) are fine."""
    return any(unicodedata.category(char) in ("Cc", "Zl", "Zp") for char in text)


def read_text_options(cls: type, label: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with each text value read by the annotation of ``cls``'s
    parameter of that name.  Names the class does not take are passed on for
    the caller to refuse."""
    annotations = _annotations(cls)
    read: dict[str, Any] = {}
    for name, value in options.items():
        if isinstance(value, str) and has_control_character(value):
            raise BadTransportOptions(f"transport {label!r}: {name}={value!r} has a control character")
        annotation = annotations.get(name, annotations.get(_OTHER_NAMES))
        if not isinstance(value, str) or annotation is None:
            read[name] = value
            continue
        form = _form_of(annotation)
        if form is _KEEP_TEXT:
            read[name] = value
            continue
        if form is None:
            raise BadTransportOptions(f"transport {label!r}: option {name} cannot be given as text "
                                      f"(got {name}={value!r})")
        assert isinstance(form, TextForm)
        try:
            read[name] = form.parse(value)
        except (ValueError, OverflowError):
            raise BadTransportOptions(f"transport {label!r}: {name}={value!r} is not {form.wanted}") from None
    return read
